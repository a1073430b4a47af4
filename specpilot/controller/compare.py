"""`specpilot compare`: time two systems on the same requests and decide whether B beats A.

Each side is a system name plus the source tree it runs from (this checkout, another worktree, or a
git commit checked out into a temporary worktree). Each side gets one worker process
(controller/worker.py) whose PYTHONPATH is that tree; the worker reports the hash of the code it
imported and the controller refuses to time a worker whose hash is not the tree's. On one GPU the
workers take turns over blocks of requests in A B B A order (both warmed up and graph-captured before
the first block), so drift hits both alike. On two GPUs A and B run each block at the same time, one
per GPU, and the whole run is repeated with the GPUs swapped; each request's ratio is the geometric
mean of its two pairings, which cancels a difference in speed between the GPUs. Workers run in their
own process groups and are killed as groups on timeout. The controller itself runs from its own
install (the `specpilot` command), never from an agent's worktree: what it imports is not what it
times. That is enforced: a source folder that contains the controller's own files is refused, and the
evidence card records the hash of the controller's code next to the hashes of the two sides.
Two systems of the controller's own install may instead be timed in the caller's process, on the models it
already holds (InProcessWorker: the loop's gate on a GPU, where a worker would load a second copy of the target),
with the worker's own set-up and replies, alternation and statistics. A worker that ends without an answer (a
crash, out of memory, killed, timed out) raises WorkerDied: the measurement failed, the system was not judged.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from specpilot.controller import tamper
from specpilot.controller.gate import (
    CONFIDENCE,
    MIN_PASSES,
    SLOT_DIFF_WARN,
    GainEstimate,
    decide,
    estimate,
    noise_from,
    rate_ratios,
    settled,
    slot_corrected,
)
from specpilot.controller.worker import code_hash
from specpilot.errors import UserError

REPO = Path(__file__).resolve().parents[2]


class WorkerDied(UserError):
    """A timing worker that ended without an answer (a crash, CUDA out of memory, killed, timed out): the
    measurement failed, which says nothing about the system (unlike a refusal on evidence)."""


@dataclass
class Side:
    system: str
    source: Path
    code: str | None = None  # the code hash the tree had when it was checked out (None: hash it when asked)

    @property
    def expected_hash(self) -> str:
        return self.code or code_hash(self.source / "specpilot")


def check_outside(tree: Path) -> None:
    """An explicitly named tree is one an agent may write: the controller's own code must not be in it,
    or the judge would import what it judges."""
    own = Path(__file__).resolve().parent
    if own.is_relative_to(tree.resolve()):
        raise UserError(f"the controller runs from {own}, inside the tree it was asked to time ({tree}); run "
                        "`specpilot compare` from an install outside every tree it times")


@contextmanager
def source_tree(ref: str | None):
    """None: this checkout (a developer timing their own code); a folder: used as is, and refused if the
    controller itself lives in it; anything else: a git commit checked out into a temporary worktree."""
    if ref is None:
        yield REPO
        return
    if Path(ref).is_dir():
        check_outside(Path(ref))
        yield Path(ref).resolve()
        return
    tmp = Path(tempfile.mkdtemp(prefix="specpilot-wt-"))
    done = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tmp), ref],
                          capture_output=True, text=True)
    if done.returncode != 0:
        tmp.rmdir()
        why = (done.stderr.strip().splitlines() or ["git failed"])[-1]
        raise UserError(f"{ref!r} is neither a folder nor a commit of {REPO} ({why})")
    try:
        yield tmp
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tmp)], capture_output=True)


class _Asks:
    """What a worker answers, asked and awaited in one call (the subclasses send and receive)."""

    def run(self, ids: list[str], side: int = 0) -> list[dict]:
        self.send(ids, side)
        return self.receive()

    def outputs(self, ids: list[str], max_new_tokens: int, system: str | None = None) -> list[dict]:
        """Each turn's prompt and tokens (what forcing scores), untimed."""
        self.ask_outputs(ids, max_new_tokens, system)
        return self.receive()


class Worker(_Asks):
    """One timing process from one source tree, serving one system or (alternating mode) both."""

    def __init__(self, side: Side, spec: dict, gpu: str | None, timeout: float, also: str | list[str] | None = None):
        env = {**os.environ, "PYTHONPATH": str(side.source)}
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        if spec.get("cpu"):  # idle OpenMP threads sleep instead of spinning on the cores the other side times on
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        self.side, self.timeout = side, timeout
        self.systems = [side.system] + ([also] if isinstance(also, str) else list(also or []))
        # The worker script is the controller's own; only `specpilot` comes from the side's tree.
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("worker.py")),
                                      json.dumps({**spec, "systems": self.systems})], cwd=side.source, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.hello = self._read()
        if self.hello["code_hash"] != side.expected_hash:
            self.close()
            raise UserError(f"worker for {side.system} imported {self.hello['package']} whose code hash "
                            f"{self.hello['code_hash'][:12]} is not that of {side.source} "
                            f"({side.expected_hash[:12]}): refusing to time it")

    def _read(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise WorkerDied(f"worker for {self.side.system} timed out after {self.timeout:.0f}s")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    err = self.proc.stderr.read().strip().splitlines()
                    raise WorkerDied(f"worker for {self.side.system} died ({_exit(self.proc.wait())}): "
                                     f"{err[-1] if err else 'no output'}")
                reply = json.loads(line)
                if "refused" in reply:  # the tree cannot run the system here (worker.py): a refusal
                    self.close()
                    raise UserError(f"worker for {self.side.system} refused it: {reply['refused']}")
                return reply

    def send(self, ids: list[str], side: int = 0) -> None:
        """side: which of this worker's systems (by position: an A/A run's B is its second engine of A)."""
        self.proc.stdin.write(json.dumps({"run": ids, "side": side, "system": self.systems[side]}) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> list[dict]:
        return self._read()["rows"]

    def ask_outputs(self, ids: list[str], max_new_tokens: int, system: str | None = None) -> None:
        """`outputs` without waiting: `receive` reads the rows (several workers answer at once)."""
        self.proc.stdin.write(json.dumps({"outputs": ids, "system": system or self.side.system,
                                          "max_new_tokens": max_new_tokens}) + "\n")
        self.proc.stdin.flush()

    def lockstep(self, ids: list[str], first: int = 0) -> tuple[list[dict], list[dict]]:
        """Both of this worker's systems on each request, step by step together: (A's rows, B's rows)."""
        self.proc.stdin.write(json.dumps({"lockstep": ids, "first": first}) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        return reply["rows"], reply["rows_b"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the whole group: nothing keeps running
            except ProcessLookupError:
                pass
        self.proc.wait()


def _exit(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit {code}"


class InProcessWorker(_Asks):
    """Worker's interface, answered in this process on the caller's models (`runner`): two systems of this install
    timed on the one copy of the target the caller already holds (a 28B twin is 56 GB: a worker process would load a
    second). The set-up and every reply are the worker's own (worker.prepare, worker.serve): the same engines and
    slots, warm-up and rows; the code hash is that of the `specpilot` this process imported. Engines of other
    systems are dropped first (each holds K/V caches and graphs, ~1 GB apiece on the twin). An exception other than a
    refusal (UserError) is this worker's death (WorkerDied), CUDA out of memory included; the runner's engines are
    dropped and the memory handed back first. There is no timeout: nothing can kill this process's own work."""

    def __init__(self, side: Side, spec: dict, runner, also: str | list[str] | None = None):
        import specpilot
        from specpilot.config.env import parse
        from specpilot.controller.worker import prepare, requests_of, slots, units

        self.side, self.runner, self.max_new_tokens = side, runner, spec.get("max_new_tokens")
        self.systems = [side.system] + ([also] if isinstance(also, str) else list(also or []))
        hello = {"code_hash": code_hash(Path(specpilot.__file__).parent), "package": specpilot.__file__}
        if hello["code_hash"] != side.expected_hash:
            raise UserError(f"this process imported {hello['package']} whose code hash {hello['code_hash'][:12]} "
                            f"is not that of {side.source} ({side.expected_hash[:12]}): refusing to time it here")
        self.requests = requests_of(spec)
        runner.keep([(parse(n), slot) for n, slot in zip(self.systems, slots(self.systems), strict=True)])
        self.sides, configs = self._guard(lambda: prepare(runner, spec, self.systems, self.requests))
        self.hello = {**hello, "requests": sorted(units(self.requests, runner.slots)), "in_flight": runner.slots,
                      "config": configs[self.systems[0]], "configs": configs}
        self._reply: dict | None = None

    def _guard(self, work: Callable):
        import torch

        from specpilot.bench.harness import free_gpu

        try:
            return work()
        except UserError:
            raise
        except Exception as exc:  # whatever a worker process would have died of
            oom = isinstance(exc, torch.OutOfMemoryError)
            why = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
        self.runner.keep([])  # outside the handler: its traceback no longer holds the failed attempt's tensors
        free_gpu()
        what = "ran out of GPU memory" if oom else "failed"
        raise WorkerDied(f"in-process timing of {' vs '.join(self.systems)} {what}: {why}")

    def _serve(self, cmd: dict) -> dict:
        from specpilot.controller.worker import serve

        return self._guard(lambda: serve(cmd, self.runner, self.systems, self.sides, self.requests,
                                         self.max_new_tokens))

    def send(self, ids: list[str], side: int = 0) -> None:
        self._reply = self._serve({"run": ids, "side": side, "system": self.systems[side]})

    def receive(self) -> list[dict]:
        reply, self._reply = self._reply, None
        return reply["rows"]

    def ask_outputs(self, ids: list[str], max_new_tokens: int, system: str | None = None) -> None:
        self._reply = self._serve({"outputs": ids, "system": system or self.side.system,
                                   "max_new_tokens": max_new_tokens})

    def lockstep(self, ids: list[str], first: int = 0) -> tuple[list[dict], list[dict]]:
        reply = self._serve({"lockstep": ids, "first": first})
        return reply["rows"], reply["rows_b"]

    def close(self) -> None:
        """The engines stay with the runner (its own limit evicts them)."""


@contextmanager
def two_workers(a: Side, b: Side, spec: dict, gpu_a: str | None, gpu_b: str | None, timeout: float):
    """A's and B's workers, both killed (as process groups) however the block exits. On a CPU each gets its share
    of the cores, as forcing's pool gives its workers: with both on all of them, the A/A noise of two trees on the
    tiny deployment was 31-75% on two cores, and 6% with one thread each (SmolLM2: 1.5% and 0.6%)."""
    if spec.get("cpu") and spec.get("threads"):
        spec = {**spec, "threads": max(1, spec["threads"] // 2)}
    with ExitStack() as stack:
        wa = Worker(a, spec, gpu_a, timeout)
        stack.callback(wa.close)
        wb = Worker(b, spec, gpu_b, timeout)
        stack.callback(wb.close)
        yield wa, wb


def interleaved(a: Callable[[list[str]], list[dict]], b: Callable[[list[str]], list[dict]], ids: list[str],
                block: int, reps: int = 1) -> tuple[list[dict], list[dict]]:
    """Blocks of requests in A B, B A, A B ... order, the whole sequence `reps` times, each pass flipping every
    block's order (a request runs A first as often as B first); rows are tagged with their pass."""
    rows_a, rows_b = [], []
    for rep in range(reps):
        for j, start in enumerate(range(0, len(ids), block)):
            chunk = ids[start : start + block]
            order = ((a, rows_a), (b, rows_b)) if (j + rep) % 2 == 0 else ((b, rows_b), (a, rows_a))
            for run, rows in order:
                rows.extend({**row, "rep": rep} for row in run(chunk))
    return rows_a, rows_b


def lockstep(w: Worker, ids: list[str], reps: int, noise: float | None = None) -> tuple[list[dict], list[dict]]:
    """One worker, both systems answering each request step by step together (CPU), `reps` passes; which side
    steps first flips with every request and pass. With the A/A noise known (an A/B run), the passes stop early
    once the verdict is beyond doubt (gate.settled), never before MIN_PASSES."""
    rows_a, rows_b = [], []
    for rep in range(reps):
        for j, rid in enumerate(ids):
            got_a, got_b = w.lockstep([rid], first=(j + rep) % 2)
            rows_a += [{**r, "rep": rep} for r in got_a]
            rows_b += [{**r, "rep": rep} for r in got_b]
        if noise is not None and MIN_PASSES <= rep + 1 < reps:
            _, ratios, equal = pair_ratios(rows_a, rows_b)
            if settled(ratios, noise, equal):
                break
    return rows_a, rows_b


def side_by_side(a: Worker, b: Worker, ids: list[str], block: int) -> tuple[list[dict], list[dict]]:
    """Both workers (on different GPUs) run each block at the same time."""
    rows_a, rows_b = [], []
    for start in range(0, len(ids), block):
        chunk = ids[start : start + block]
        a.send(chunk)
        b.send(chunk)
        rows_a.extend(a.receive())
        rows_b.extend(b.receive())
    return rows_a, rows_b


def _by_request(rows: list[dict], clock: str = "worker") -> dict[tuple[str, int], tuple[int, float, list[int]]]:
    """(request, pass) -> decode tokens, seconds and output tokens over the request's turns. The seconds are the
    worker's decode time, or with the controller's clock the request's wall time as the controller saw it."""
    out: dict[tuple[str, int], tuple[int, float, list[int]]] = {}
    field = "wall_s" if clock == "controller" else "decode_s"
    for r in rows:
        key = (r["id"].split("#")[0], r.get("rep", 0))
        tokens, seconds, seq = out.get(key, (0, 0.0, []))
        out[key] = (tokens + max(len(r["tokens"]) - 1, 0), seconds + r[field], seq + r["tokens"])
    return out


def clocked(run: Callable[[list[str]], list[dict]]) -> Callable[[list[str]], list[dict]]:
    """A worker's run with the controller's own clock around it: the request's wall time, stamped on its first
    row (a tree under judgement reports its own decode times, and those may be made up)."""
    def go(ids: list[str]) -> list[dict]:
        if len(ids) != 1:
            raise ValueError("the controller's clock times one request at a time")
        t0 = time.perf_counter()
        rows = run(ids)
        wall = time.perf_counter() - t0
        return [{**r, "wall_s": wall if i == 0 else 0.0} for i, r in enumerate(rows)]
    return go


def pair_ratios(rows_a: list[dict], rows_b: list[dict], clock: str = "worker") -> tuple[list[str], list[float], bool]:
    """Each request's rate ratio B/A: with several passes, the median of its passes' ratios, each pass's A and B
    having run back to back (a machine whose speed drifts over seconds, as a shared CPU's does, slows both
    alike). Outputs are equal when every pass of A and of B produced the same tokens."""
    a, b = _by_request(rows_a, clock), _by_request(rows_b, clock)
    seqs = {}
    for (rid, _), (_, _, seq) in [*a.items(), *b.items()]:
        seqs.setdefault(rid, set()).add(tuple(seq))
    ids, ratios = [], []
    for rid in dict.fromkeys(k[0] for k in a):
        both = [(a[k], b[k]) for k in a if k[0] == rid and k in b and a[k][0] and b[k][0]]
        if both:
            per = rate_ratios([x[0] for x, _ in both], [x[1] for x, _ in both], [y[0] for _, y in both],
                              [y[1] for _, y in both])
            ids.append(rid)
            ratios.append(float(np.median(per)))
    return ids, ratios, all(len(v) == 1 for v in seqs.values()) and set(a) == set(b)


def _timing(row: dict) -> dict:
    """A row as the card keeps it: its times and counts, not its tokens (older trees lack steps)."""
    return {**{k: row[k] for k in ("id", "decode_s", "prefill_s", "wall_s", "steps", "rep") if k in row},
            "decode_tokens": max(len(row["tokens"]) - 1, 0)}


def _enough(ids: list[str]) -> None:
    if len(ids) < 3:
        raise UserError(f"only {len(ids)} requests produced decode tokens; the gate needs at least 3 "
                        "(raise --limit or --max-new-tokens)")


def _side(side: Side, hello: dict) -> dict:
    """A side as its worker reported it: the code it imported and the complete configuration it ran (every
    option, the kernel plan and its tuning table; older trees report none)."""
    return {"system": side.system, "source": str(side.source), "code_hash": hello["code_hash"],
            "config": hello.get("config")}


def combine_pairings(first: tuple[list[str], list[float]], second: tuple[list[str], list[float]]
                     ) -> tuple[list[str], list[float]]:
    """Per request, the geometric mean of its ratio with A on GPU 0 / B on GPU 1 and with the GPUs
    swapped: a GPU that is uniformly faster by a factor f scales one ratio by f and the other by 1/f."""
    two = dict(zip(*second, strict=True))
    ids = [i for i in first[0] if i in two]
    one = dict(zip(*first, strict=True))
    return ids, [math.sqrt(one[i] * two[i]) for i in ids]


OnStart = Callable[[dict], None]  # called with side A's hello once its worker is up, before any timing


def measure_paired(a: Side, b: Side, spec: dict, block: int, gpus: list[str], timeout: float,
                   on_start: OnStart | None = None) -> dict:
    """Two GPUs: A and B run the same requests at the same time on different GPUs, then again with the
    GPUs swapped; one pairing's workers are closed before the next starts (a GPU holds one model)."""
    pairings, equal = [], True
    for gpu_a, gpu_b in ((gpus[0], gpus[1]), (gpus[1], gpus[0])):
        with two_workers(a, b, spec, gpu_a, gpu_b, timeout) as (wa, wb):
            if on_start:
                on_start(wa.hello)
            rows_a, rows_b = side_by_side(wa, wb, wa.hello["requests"], block)
        ids, ratios, same = pair_ratios(rows_a, rows_b)
        equal = equal and same
        pairings.append({"gpu_a": gpu_a, "gpu_b": gpu_b, "requests": ids, "ratios": ratios,
                         "side_a": _side(a, wa.hello), "side_b": _side(b, wb.hello),
                         "rows_a": [_timing(r) for r in rows_a], "rows_b": [_timing(r) for r in rows_b]})
    ids, ratios = combine_pairings((pairings[0]["requests"], pairings[0]["ratios"]),
                                   (pairings[1]["requests"], pairings[1]["ratios"]))
    _enough(ids)
    return {"mode": "paired", "a": pairings[0]["side_a"], "b": pairings[0]["side_b"],
            "requests": ids, "ratios": ratios, "outputs_equal": equal, "pairings": pairings}


def measure(a: Side, b: Side, spec: dict, block: int, gpu: str | None, timeout: float, reps: int = 1,
            alternating: bool = False, noise: float | None = None, clock: str = "worker",
            on_start: OnStart | None = None, runner=None) -> dict:
    """One device. Two workers taking turns over blocks of requests (interleaved), or, for two systems of one
    source tree, one worker that alternates between them request by request (alternating: on a small CPU two
    processes disturb each other's timing and caches, one process holds both systems' models in one place).
    clock "controller": two workers, one request at a time, each timed by this process (tamper.py's checks).
    runner (bench/harness.Runner): the alternating worker is this process on those models (InProcessWorker), for
    two systems of this install. spec "one_copy" (two trees on one GPU, which must never hold the target twice):
    A's worker times every request and is closed before B's starts ("one at a time"; its A/A run is timed the same
    way, so the noise holds whatever drifts between the two halves)."""
    if clock == "controller" and alternating:
        raise UserError("the controller's clock times two workers: not the alternating mode")
    if runner is not None and not (alternating and a.source == b.source == REPO):
        raise UserError("in-process timing serves two systems of the controller's own install in the alternating "
                        f"mode; these sides come from {a.source} and {b.source}")
    if alternating:
        if a.source != b.source:
            raise UserError("one worker serves two systems of one source tree only; these sides come from "
                            f"{a.source} and {b.source}")
        w = (Worker(a, spec, gpu, timeout, also=b.system) if runner is None else
             InProcessWorker(a, spec, runner, also=b.system))
        with closing(w):
            hello_a, hello_b = ({**w.hello, "config": w.hello.get("configs", {}).get(s.system)} for s in (a, b))
            if on_start:
                on_start(hello_a)
            served = w.hello.get("in_flight", 1)
            if spec.get("in_flight", served) != served:
                raise UserError(f"the worker serves {served} requests in flight where the timing asked for "
                                f"{spec['in_flight']}")
            if spec.get("cpu") and served == 1:
                rows_a, rows_b = lockstep(w, w.hello["requests"], reps, noise)
            else:
                rows_a, rows_b = interleaved(partial(w.run, side=0), partial(w.run, side=1), w.hello["requests"], 1,
                                             reps)
    elif spec.get("one_copy"):
        rows_a, hello_a = alone(a, spec, gpu, timeout, reps, clock, on_start)
        rows_b, hello_b = alone(b, spec, gpu, timeout, reps, clock)
    else:
        with two_workers(a, b, spec, gpu, gpu, timeout) as (wa, wb):
            if on_start:
                on_start(wa.hello)
            if clock == "controller":
                rows_a, rows_b = interleaved(clocked(wa.run), clocked(wb.run), wa.hello["requests"], 1, reps)
            else:
                rows_a, rows_b = interleaved(wa.run, wb.run, wa.hello["requests"], block, reps)
            hello_a, hello_b = wa.hello, wb.hello
    ids, ratios, equal = pair_ratios(rows_a, rows_b, clock)
    _enough(ids)
    passes = 1 + max((r.get("rep", 0) for r in rows_a), default=0)  # fewer than reps: the verdict settled early
    return {"mode": _mode(spec, alternating), "clock": clock, "reps": reps, "passes": passes,
            "in_process": runner is not None, "a": _side(a, hello_a), "b": _side(b, hello_b), "requests": ids,
            "ratios": ratios,
            "outputs_equal": equal, "rows_a": [_timing(r) for r in rows_a], "rows_b": [_timing(r) for r in rows_b]}


def alone(side: Side, spec: dict, gpu: str | None, timeout: float, reps: int, clock: str,
          on_start: OnStart | None = None) -> tuple[list[dict], dict]:
    """One side's worker by itself: every request, `reps` passes (with the controller's clock, each request timed
    here), then closed, so that the other side's worker finds the device free."""
    with closing(Worker(side, spec, gpu, timeout)) as w:
        if on_start:
            on_start(w.hello)
        run = clocked(w.run) if clock == "controller" else w.run
        rows = [{**row, "rep": rep} for rep in range(reps) for rid in w.hello["requests"] for row in run([rid])]
        return rows, w.hello


def _mode(spec: dict, alternating: bool) -> str:
    if alternating:  # a batch's units (spec "in_flight") run whole, never step by step
        return "lockstep" if spec.get("cpu") and spec.get("in_flight", 1) == 1 else "alternating"
    return "one at a time" if spec.get("one_copy") else "interleaved"


def run_mode(spec: dict, gpus: list[str] | None, alternating: bool) -> str:
    """The mode a compare times in (what an earlier A/A run must share): paired with two GPUs."""
    return "paired" if gpus and len(gpus) >= 2 else _mode(spec, alternating)


class StaleAA(UserError):
    """An earlier A/A run that cannot give this run its noise: another side A, code, deployment or budget."""


SAME_SETUP = ("preset", "deployment_sha256", "max_new_tokens", "threads", "in_flight")


def setup_of(spec: dict) -> dict:
    """What a run's times depend on besides its systems' code and configuration: the deployment (a preset, or a
    file, by the hash of its bytes), the output budget and, on a CPU, the threads each worker had."""
    dep = spec.get("deployment")
    return {"preset": spec.get("preset"), "deployment": dep,
            "deployment_sha256": hashlib.sha256(Path(dep).read_bytes()).hexdigest() if dep else None,
            "max_new_tokens": spec.get("max_new_tokens"), "threads": spec.get("threads"),
            "in_flight": spec.get("in_flight")}


def aa_mismatch(aa: dict, a: Side, spec: dict, mode: str, clock: str, in_process: bool = False) -> str | None:
    """Why an earlier A/A run cannot stand for this run's (None: it can). Its noise is that of one system, code,
    deployment and budget, timed in one mode and clock, in a worker process or in this one; the configuration A
    ran is checked once this run's worker reports it (check_config)."""
    if aa.get("mode") != mode or aa.get("clock", "worker") != clock:
        return (f"it was timed in {aa.get('mode')} mode ({aa.get('clock', 'worker')} clock), this run is {mode} "
                f"({clock} clock): their slots are not comparable")
    if aa.get("in_process", False) != in_process:
        where = {True: "in the controller's process", False: "in a worker process"}
        return f"it was timed {where[aa.get('in_process', False)]}, this run {where[in_process]}"
    side = aa.get("a") or {}
    if side.get("system") != a.system:
        return f"its side A is {side.get('system')!r}, this run's is {a.system!r}"
    if side.get("code_hash") != a.expected_hash:
        return f"its side A ran code {str(side.get('code_hash'))[:12]}, this run's is {a.expected_hash[:12]}"
    if "setup" not in aa:
        return "it records no deployment or max_new_tokens (a card written before they were recorded)"
    now = setup_of(spec)
    differ = [f"{k} {aa['setup'].get(k)!r} (now {now[k]!r})" for k in SAME_SETUP if aa["setup"].get(k) != now[k]]
    return f"its {', '.join(differ)} differ" if differ else None


def _flat(config: dict | None) -> dict:
    """A configuration's settings, one level of nesting spelled out, less the tuning table its warm-up measured
    (every worker tunes its own)."""
    out = {}
    for k, v in (config or {}).items():
        out.update({f"{k}.{j}": w for j, w in v.items()} if isinstance(v, dict) else {k: v})
    out.pop("plan.tuning", None)
    return out


def check_config(aa: dict, hello_a: dict) -> None:
    """An on_start check: side A's worker runs the configuration the earlier A/A run's side A ran."""
    was, now = _flat(aa["a"].get("config")), _flat(hello_a.get("config"))
    differ = [f"{k} {was.get(k)!r} (now {now.get(k)!r})" for k in sorted(was.keys() | now.keys())
              if was.get(k) != now.get(k)]
    if differ:
        raise StaleAA(f"the earlier A/A run cannot stand for this one: its side A {aa['a']['system']} ran another "
                      f"configuration: {', '.join(differ)}")


def compare(a: Side, b: Side, spec: dict, block: int = 4, gpu: str | None = None, timeout: float = 1800,
            noise: float | None = None, gpus: list[str] | None = None, aa: dict | None = None, reps: int = 1,
            alternating: bool = False, clock: str = "worker", remeasure: bool = False, runner=None,
            confidence: float = CONFIDENCE) -> dict:
    """The evidence card: the A/A run (unless a noise figure or an earlier A/A run `aa` is given), the
    A/B run, the verdict, and with an A/A run the gain with the slots' difference divided out.
    With two GPUs (`gpus`), paired runs with the GPUs swapped; otherwise A B B A blocks on `gpu`, or one worker
    alternating request by request (`alternating`); with `reps` passes, each request's ratio is the median of its
    passes' ratios. clock "controller": this process times each request (for a tree under judgement), and the
    card carries tamper.py's checks of B against A. An earlier A/A run that cannot stand for this one (aa_mismatch,
    check_config) is refused (StaleAA), or with `remeasure` replaced by a new one. `runner`: both runs timed in
    this process on those models (measure's InProcessWorker), for two systems of this install on one device; a
    worker that dies (a crash, out of memory, killed, timed out) raises WorkerDied. confidence: of the A/B gain's
    two-sided interval the verdict reads its lower bound from (a sequential gate's looks ask for more; the A/A
    noise is always the 90% interval's)."""
    card = partial(_compare, a, b, spec, block, gpu, timeout, noise, gpus, reps=reps, alternating=alternating,
                   clock=clock, runner=runner, confidence=confidence)
    try:
        return card(aa=aa)
    except StaleAA:
        if not remeasure:
            raise
    return card(aa=None)


def _compare(a: Side, b: Side, spec: dict, block: int, gpu: str | None, timeout: float, noise: float | None,
             gpus: list[str] | None, aa: dict | None, reps: int, alternating: bool, clock: str, runner=None,
             confidence: float = CONFIDENCE) -> dict:
    card: dict = {"block": block, "gpu": gpu, "gpus": gpus, "reps": reps, "clock": clock, "confidence": confidence,
                  "controller": {"path": str(Path(__file__).resolve().parent),
                                 "code_hash": code_hash(Path(__file__).resolve().parent)}}
    mode = run_mode(spec, gpus, alternating)
    paired = mode == "paired"
    if paired and runner is not None:
        raise UserError("in-process timing is one device's: not the paired mode of two GPUs")

    def run(x: Side, y: Side, noise: float | None = None, on_start: OnStart | None = None) -> dict:
        t0 = time.monotonic()
        got = (measure_paired(x, y, spec, block, gpus, timeout, on_start) if paired else
               measure(x, y, spec, block, gpu, timeout, reps, alternating, noise, clock, on_start, runner))
        return {**got, "setup": setup_of(spec), "seconds": time.monotonic() - t0}  # workers' start included

    on_start = None
    if aa is not None:  # an earlier run: checked before any worker starts, its configuration once A's has
        why = aa_mismatch(aa, a, spec, mode, clock, runner is not None)
        if why:
            raise StaleAA(f"the earlier A/A run cannot stand for this one: {why}")
        on_start = partial(check_config, aa)
    elif noise is None:
        aa = run(a, a)
        aa["estimate"] = estimate(aa["ratios"]).to_json()
    if aa is not None:
        card["aa"] = aa
        if noise is None:
            noise = noise_from(GainEstimate(**aa["estimate"]))
    ab = run(a, b, noise, on_start)
    card["ab"] = ab
    card["decision"] = decide(estimate(ab["ratios"], confidence), noise, ab["outputs_equal"])
    if clock == "controller":
        card["tamper"] = tamper.check(ab["rows_a"], ab["rows_b"])
    if aa is not None:
        corrected = slot_corrected(aa["requests"], aa["ratios"], ab["requests"], ab["ratios"])
        card["slots"] = {"mode": aa["mode"], "aa_gain": aa["estimate"]["gain"],
                         "differ": abs(1 - aa["estimate"]["gain"]) > SLOT_DIFF_WARN,
                         "corrected": corrected.to_json() if corrected else None}
    return card
