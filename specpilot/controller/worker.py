"""A timing worker: one process per system, running from that system's source tree.

The controller starts this file as a script (from the controller's own install) with PYTHONPATH set
to the system's worktree, so `specpilot` is imported from there; the worker reports the hash of the
code it actually imported, then serves one JSON command per line on stdin:
  {"run": [request ids], "side": i, "system": name} -> {"rows": [{"id", "tokens", "decode_s", "prefill_s", "steps"}]}
Under regime batch (the deployment's `in_flight` > 1) the ids the worker offers and runs are timing units
(`units`): a closed loop of that many requests in flight, one row each (its tokens all its requests' in order, its
decode_s the loop's wall time, prefills included: the batch's throughput is what is judged).
  {"lockstep": [request ids], "first": 0 or 1} -> {"rows": [A's rows], "rows_b": [B's rows]}
  {"outputs": [request ids], "system": name, "max_new_tokens": n} -> {"rows": [{"id", "prompt", "tokens"}, ...]}
One worker may serve two systems of its tree (the controller's alternating mode); they share the models. A
command names its side by index ("side") or by system name (the first side of that name). Each side has its own
engine: a system named twice (an A/A run) gets a second engine, slot 1, so the A/A run times two engines as an
A/B run does, not one against itself. On a CPU the two answer each request in lockstep, step by step
(bench/harness.run_lockstep).
  {"quit": true}
A system the tree refuses (a UserError: an option it cannot run here) is answered {"refused": why} and the worker
exits; any other end (a crash, out of memory, killed) is the worker's death, which the controller reports as such.
Models are built and graphs captured (warm-up) before the first reply, so no timing includes them; the
first reply also carries the system's complete configuration (every option, the kernel plan and the tuning
table it chose), which the evidence card records.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import json
import sys
from pathlib import Path


def code_hash(package_dir: Path) -> str:
    """sha256 over every file of the package (relative path + bytes, in path order): the Python sources and
    everything they load at run time (the cluster attention's CUDA source, the presets), byte-compiled
    caches excepted."""
    h = hashlib.sha256()
    for path in sorted(p for p in package_dir.rglob("*") if p.is_file()):
        if "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
            continue
        h.update(str(path.relative_to(package_dir)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    import specpilot
    from specpilot.bench.harness import Runner
    from specpilot.config.env import parse
    from specpilot.deployment import load_deployment
    from specpilot.runtime.pair import build_pair

    spec = json.loads(sys.argv[1])
    if spec.get("threads"):  # a fixed set of cores and threads for the whole run (small CPUs)
        import os

        import torch

        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: spec["threads"]])
        torch.set_num_threads(spec["threads"])
    hello = {"code_hash": code_hash(Path(specpilot.__file__).parent), "package": specpilot.__file__}
    dep = load_deployment(spec.get("preset"), spec.get("deployment"))
    if "in_flight" in spec:  # the loop's --in-flight: its deployment served so many at once (not
        import dataclasses  # Deployment.serving: the tree under judgement may predate it)

        n = spec["in_flight"]
        dep = dataclasses.replace(dep, regime="batch" if n > 1 else "single", in_flight=n)
    names = spec.get("systems") or [spec["system"]]
    requests = requests_of(spec)
    speculative = any(parse(name).base == "stock" for name in names)
    target, drafter, tok = build_pair(dep, with_drafter=speculative)
    # under regime batch its engines hold `in_flight` requests (an older tree's deployment and harness: one)
    in_flight = getattr(dep, "in_flight", 1)
    runner = Runner(target, drafter, tok, dep.context, **({"slots": in_flight} if in_flight > 1 else {}))
    sides, configs = prepare(runner, spec, names, requests)
    _reply({**hello, "requests": sorted(units(requests, in_flight)), "in_flight": in_flight,
            "config": configs[names[0]], "configs": configs})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        _reply(serve(cmd, runner, names, sides, requests, spec.get("max_new_tokens")))  # forcing's: per command


def requests_of(spec: dict) -> dict:
    """Request id -> request: given by the controller (a tree under judgement never reads the data files), or read
    from the spec's datasets."""
    from specpilot.datasets import Request, load_requests

    if "requests" in spec:
        return {r["id"]: Request(r["id"], r["dataset"], tuple(r["turns"]), r["split"]) for r in spec["requests"]}
    return {r.id: r for d in spec["datasets"]
            for r in load_requests(d, spec.get("split", "dev"), spec.get("data_dir"), spec.get("limit"))}


def units(requests: dict, slots: int) -> dict[str, list[str]]:
    """What one timed run serves -> the request ids it runs: a request where one is in flight; under regime batch
    (slots > 1) a closed loop of `slots` requests ("batch-000", ...), the datasets taken in turn so that each unit
    mixes them (a last unit may be shorter)."""
    if slots <= 1:
        return {rid: [rid] for rid in requests}
    by_dataset: dict[str, list[str]] = {}
    for rid in sorted(requests):
        by_dataset.setdefault(requests[rid].dataset, []).append(rid)
    order = [rid for tier in itertools.zip_longest(*by_dataset.values()) for rid in tier if rid is not None]
    return {f"batch-{k:03d}": order[i : i + slots] for k, i in enumerate(range(0, len(order), slots))}


def prepare(runner, spec: dict, names: list[str], requests: dict) -> tuple[list, dict]:
    """(each side's system and engine slot, each system's complete configuration), every engine the timing uses
    built and warmed up (graphs captured) first: a worker's set-up, and the controller's when it times this
    install's systems in its own process (controller/compare.InProcessWorker)."""
    from specpilot.bench.harness import run_lockstep
    from specpilot.config.env import parse
    from specpilot.results import system_record

    parsed = {name: parse(name) for name in names}
    sides = [(parsed[name], slot) for name, slot in zip(names, slots(names), strict=True)]
    # forcing's workers time nothing; a batch's engines serve their requests together, never step by step
    lockstep = spec.get("cpu") and len(names) == 2 and spec.get("timing", True) and getattr(runner, "slots", 1) == 1
    if not lockstep:
        check_slots(runner, sides)
    for system, slot in sides:
        if not slot:
            runner.warmup(system)
        elif not lockstep:  # lockstep's warm-up below builds and warms the second engine of an A/A pair
            runner.warmup(system, slot)
    if lockstep:  # the second engine of an A/A pair, and both sides' first steps, warmed like the timed ones
        run_lockstep(runner, sides[0][0], sides[1][0], requests[min(requests)], spec["max_new_tokens"])
    return sides, {name: system_record(runner.engine(s)) for name, s in parsed.items()}


def slots(names: list[str]) -> list[int]:
    """Each side's engine slot: a system named again gets an engine of its own (bench/harness.Runner.engine)."""
    return [names[:i].count(name) for i, name in enumerate(names)]


def check_slots(runner, sides: list) -> None:
    """A tree whose harness keeps one engine per system cannot run a system against itself in one worker."""
    if any(slot for _, slot in sides) and "slot" not in inspect.signature(runner.run).parameters:
        raise SystemExit(f"the harness of this tree runs one engine per system: one worker cannot time "
                         f"{sides[0][0].name} against itself; give each side its own worker (--workers two)")


def serve(cmd: dict, runner, names: list[str], sides: list, requests: dict, max_new_tokens: int | None) -> dict:
    """One command's reply (the module docstring lists them)."""
    from specpilot.bench.harness import run_lockstep

    batched = getattr(runner, "slots", 1) > 1  # an older tree's harness has one slot
    if batched:
        from specpilot.bench.harness import run_closed
    if "lockstep" in cmd:  # {"lockstep": [ids], "first": 0|1} -> {"rows": [rows of A], "rows_b": [rows of B]}
        a_rows, b_rows = [], []
        for rid in cmd["lockstep"]:
            ra, rb = run_lockstep(runner, sides[0][0], sides[1][0], requests[rid], max_new_tokens, cmd.get("first", 0))
            a_rows += [_row(r) for r in ra]
            b_rows += [_row(r) for r in rb]
        return {"rows": a_rows, "rows_b": b_rows}
    system, slot = sides[cmd["side"]] if "side" in cmd else sides[names.index(cmd.get("system") or names[0])]
    engine = {"slot": slot} if slot else {}  # slot 0 as any tree's harness runs it
    if "outputs" in cmd:  # what forcing scores: each turn's prompt and tokens (batched: as the batch made them)
        recs = (run_closed(runner, system, [requests[rid] for rid in cmd["outputs"]], cmd["max_new_tokens"], slot)[0]
                if batched else
                [rec for rid in cmd["outputs"] for rec in runner.run(system, requests[rid], cmd["max_new_tokens"],
                                                                      **engine)])
        return {"rows": [{"id": r.id, "prompt": r.prompt, "tokens": r.tokens} for r in recs]}
    if batched:
        batches = units(requests, runner.slots)
        return {"rows": [_unit_row(uid, *run_closed(runner, system, [requests[rid] for rid in batches[uid]],
                                                    max_new_tokens, slot)) for uid in cmd["run"]]}
    return {"rows": [_row(rec) for rid in cmd["run"]
                     for rec in runner.run(system, requests[rid], max_new_tokens, **engine)]}


def _unit_row(uid: str, records: list, seconds: float) -> dict:
    """A batch unit's row: every output token of its requests (in order) over the closed loop's wall time."""
    return {"id": uid, "tokens": [t for r in records for t in r.tokens], "decode_s": seconds,
            "prefill_s": sum(r.prefill_s for r in records), "steps": sum(len(r.accepted) for r in records)}


def _row(rec) -> dict:
    return {"id": rec.id, "tokens": rec.tokens, "decode_s": rec.decode_s, "prefill_s": rec.prefill_s,
            "steps": len(rec.accepted)}

if __name__ == "__main__":
    from specpilot.errors import UserError

    try:
        main()
    except UserError as exc:  # the tree refuses the system here (an option it cannot run): a refusal, not a death
        _reply({"refused": str(exc)})
