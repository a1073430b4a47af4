"""The engine of two source trees timed in turn on one GPU: does a change leave the speed and the tokens alone?

Issue 23 reshaped the engine (one configuration, the step as a pipeline, per-layer caches, weight objects) and
must leave the AR step (`gemv=true`, 8B and 27B) and the stock step within 1% of the commit before, with the
same tokens. This runs both trees at once, each in its own worker process (its `specpilot` imported from its
tree), holding the same random-weight model (same seed, bf16, CUDA graphs, context 1024):

  1. correctness first: each worker's first generation of every system; the tokens of the two trees must
     be equal, system by system;
  2. the new tree's worker tunes the `gemv` step (kernels/tuning) and the base tree's worker is given the
     same tuning table, so that both run the same kernel configs and only the code differs;
  3. rounds of timing, A B then B A per system, each the median of `--runs` generations of 256 tokens
     (AR: ms per token; stock: ms per step, a draft of 15 tokens by a random 5-layer drafter and a 16-row verify).

A short table is printed last; the JSON goes to $OUT/two_trees_<model>.json. The worker side speaks both
engine APIs: the base tree's (Engine(..., gemv=...), generate(..., system), kernels/gemv/choice._CHOSEN) and
this one's (Engine(target, drafter, system), generate(...), plan.table).

Usage (repository root, the base tree unpacked at .stage/base, e.g. `git archive <commit> specpilot | tar -x -C
.stage/base`): SPECPILOT_COMMIT=<sha> PYTHONPATH=. python3 bench/gpu/two_trees.py --base .stage/base
[--base-commit <sha>] [--models dense-8b,dense-27b] [--rounds 3] [--runs 3] [--systems ar_gemv,ar,stock]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
SYSTEMS = ("ar_gemv", "ar", "stock")  # AR through the streaming GEMV; AR on cuBLAS; stock on cuBLAS
CONTEXT, PROMPT, NEW = 1024, 128, 256


# ----- the worker (runs inside one tree) ----------------------------------------------------------------

def _reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Tree:
    """One tree's engines behind one interface, whichever API the tree has."""

    def __init__(self, model: str, systems: list[str], table: list | None, device: str):
        import torch

        from bench.gpu.shapes import MODELS, drafter_for
        from specpilot.fixtures.random_models import random_drafter, random_target

        self.new = _tree_has("config")
        cfg = MODELS[model]
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        self.target = random_target(cfg, seed=0, dtype=dtype, device=device, rope_length=CONTEXT + 1)
        self.drafter = None
        if "stock" in systems:
            self.drafter = random_drafter(drafter_for(cfg), seed=1, dtype=dtype, device=device,
                                          rope_length=CONTEXT + 1)
        self.prompt = torch.randint(0, cfg.vocab_size - 1, (PROMPT,),
                                    generator=torch.Generator().manual_seed(0)).tolist()
        self.engines = {name: self._engine(name, table) for name in systems}

    def _engine(self, name: str, table: list | None):
        gemv, spec = name == "ar_gemv", name == "stock"
        drafter = self.drafter if spec else None
        if self.new:
            from specpilot.config import parse_system
            from specpilot.runtime.engine import Engine

            engine = Engine(self.target, drafter, parse_system({"ar_gemv": "ar:gemv=true"}.get(name, name)),
                            context=CONTEXT)
            if table and gemv:
                engine.plan.table.chosen.update(_keys(table))
            engine.warmup()
            return engine
        from specpilot.runtime.options import parse_system

        from specpilot.kernels.gemv import choice
        from specpilot.runtime.engine import Engine

        if table and gemv:
            choice._CHOSEN.update(_keys(table))
        engine = Engine(self.target, drafter, context=CONTEXT, gemv=gemv)
        engine.warmup(parse_system("stock" if spec else "ar"))
        return engine

    def table(self) -> list:
        if self.new:
            chosen = self.engines["ar_gemv"].plan.table.chosen if "ar_gemv" in self.engines else {}
        else:
            from specpilot.kernels.gemv import choice

            chosen = choice._CHOSEN
        return [[repr(k), v] for k, v in chosen.items()]

    def profile(self, name: str, steps: int = 5) -> dict:
        """{kernel: [launches, microseconds] per step} of `steps` eager AR steps (the CUDA profiler)."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        engine = self.engines[name]
        if not self.new:  # the base tree switches its shared model's kernels in generate(); do as it does
            from specpilot.models.layers import use_gemv

            use_gemv(self.target, engine.gemv)
        with torch.inference_mode():
            engine.pos.fill_(PROMPT)
            engine._ar_step()
            torch.cuda.synchronize()  # the profile is of GPU kernels: a CUDA run only
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(steps):
                    engine._ar_step()
                torch.cuda.synchronize()
        return {e.key: [e.count / steps, e.self_device_time_total / steps] for e in prof.key_averages()
                if e.self_device_time_total > 0}

    def generate(self, name: str):
        engine = self.engines[name]
        if self.new:  # generate_one since the engine took a list of requests (issue 56); generate(prompt) before
            one = getattr(engine, "generate_one", engine.generate)
            return one(self.prompt, NEW)
        from specpilot.runtime.options import parse_system

        return engine.generate_one(self.prompt, NEW, (), parse_system("stock" if name == "stock" else "ar"))


def _tree_has(subpackage: str) -> bool:
    """Whether the imported tree's specpilot has this subpackage (its folder: an editable install's finder
    would resolve a missing one from another tree)."""
    import specpilot

    return (Path(specpilot.__file__).parent / subpackage).is_dir()


def _keys(table: list) -> dict:
    return {ast.literal_eval(k): v for k, v in table}


def worker(spec: dict) -> None:
    import specpilot

    tree = Tree(spec["model"], spec["systems"], spec.get("table"), spec.get("device", "cuda"))
    first = {name: tree.generate(name).tokens for name in spec["systems"]}
    _reply({"package": specpilot.__file__, "api": "new" if tree.new else "old", "table": tree.table(),
            "tokens": first})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        if "profile" in cmd:
            _reply({"kernels": tree.profile(cmd["profile"])})
            continue
        gens = [tree.generate(cmd["time"]) for _ in range(cmd["runs"])]
        _reply({"ms_per_token": [1000 * g.decode_s / g.decode_tokens for g in gens],
                "ms_per_step": [1000 * g.decode_s / len(g.accepted) for g in gens],
                "tau": [sum(g.accepted) / len(g.accepted) for g in gens],
                "same_tokens": all(g.tokens == first[cmd["time"]] for g in gens)})


# ----- the controller side ----------------------------------------------------------------------------------

class Worker:
    def __init__(self, tree: Path, spec: dict, timeout: float = 540):
        env = {**os.environ, "PYTHONPATH": f"{tree}:{HERE.parents[2]}"}  # the tree's specpilot; bench from here
        self.timeout = timeout
        self.proc = subprocess.Popen([sys.executable, str(HERE), "--worker", json.dumps(spec)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = self._read()
        if not Path(self.hello["package"]).resolve().is_relative_to(tree.resolve()):
            raise SystemExit(f"the worker for {tree} imported {self.hello['package']}")

    def _read(self) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            raise SystemExit("a worker died or timed out (its stderr is above)")
        return json.loads(line)

    def profile(self, name: str) -> dict:
        self.proc.stdin.write(json.dumps({"profile": name}) + "\n")
        self.proc.stdin.flush()
        return self._read()["kernels"]

    def time(self, name: str, runs: int) -> dict:
        self.proc.stdin.write(json.dumps({"time": name, "runs": runs}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


def compare_model(model: str, base: Path, here: Path, systems: list[str], rounds: int, runs: int,
                  device: str, profiled: list[str]) -> dict:
    t0 = time.perf_counter()
    new = Worker(here, {"model": model, "systems": systems, "device": device})
    old = Worker(base, {"model": model, "systems": systems, "table": new.hello["table"], "device": device})
    print(f"[{model}] workers ready in {time.perf_counter() - t0:.0f}s ({len(new.hello['table'])} tuned keys)")
    same = {name: new.hello["tokens"][name] == old.hello["tokens"][name] for name in systems}
    print(f"[{model}] tokens equal between the trees: {same}")
    times: dict = {side: {name: [] for name in systems} for side in ("base", "new")}
    try:
        for r in range(rounds):
            for name in systems:
                order = (("base", old), ("new", new)) if r % 2 == 0 else (("new", new), ("base", old))
                for side, w in order:
                    times[side][name].append(w.time(name, runs))
        kernels = {name: {"base": old.profile(name), "new": new.profile(name)} for name in profiled}
    finally:
        new.close()
        old.close()
    for name, k in kernels.items():
        _print_kernel_diff(model, name, k["base"], k["new"])
    return {"tokens_equal": same, "table": new.hello["table"], "kernels": kernels,
            "api": {"base": old.hello["api"], "new": new.hello["api"]}, "timings": times,
            "summary": _summary(times, systems)}


def _print_kernel_diff(model: str, name: str, base: dict, new: dict) -> None:
    """The kernels whose launches or time per step differ between the trees (> 2 us), and the totals."""
    total = {side: sum(v[1] for v in k.values()) for side, k in (("base", base), ("new", new))}
    print(f"[{model}] {name} kernels per step: base {total['base']:.1f} us, new {total['new']:.1f} us")
    for key in sorted(set(base) | set(new)):
        b, n = base.get(key, [0, 0.0]), new.get(key, [0, 0.0])
        if b[0] != n[0] or abs(b[1] - n[1]) > 2.0:
            print(f"  {key[:90]:90s} launches {b[0]:g} -> {n[0]:g}, us {b[1]:.1f} -> {n[1]:.1f}")


def _summary(times: dict, systems: list[str]) -> dict:
    out = {}
    for name in systems:
        unit = "ms_per_step" if name == "stock" else "ms_per_token"
        med = {side: statistics.median(v for t in times[side][name] for v in t[unit]) for side in ("base", "new")}
        pairs = [n[unit][0] / b[unit][0] for b, n in zip(times["base"][name], times["new"][name], strict=True)]
        out[name] = {"unit": unit, "base": med["base"], "new": med["new"], "new_over_base": med["new"] / med["base"],
                     "per_round_ratio": pairs,
                     "same_tokens_every_run": all(t["same_tokens"] for side in times for t in times[side][name])}
    return out


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the base tree: a folder holding its specpilot/ package")
    ap.add_argument("--base-commit", default=None, help="the commit the base tree was taken from (recorded)")
    ap.add_argument("--models", default="dense-8b")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself (model tiny)")
    ap.add_argument("--profile", default="", help="AR systems whose kernels are profiled in both trees (ar,ar_gemv)")
    args = ap.parse_args()
    import torch

    from bench.gpu.engine_core import bandwidth, gpu_state, provenance

    cuda = args.device == "cuda"
    report = provenance(" ".join(["PYTHONPATH=. python3 bench/gpu/two_trees.py", *sys.argv[1:]])) if cuda else {}
    report["base_commit"] = args.base_commit
    report["bandwidth"] = bw = bandwidth() if cuda else {"copy_tb_s": float("nan")}
    if cuda:
        torch.cuda.empty_cache()
    systems = args.systems.split(",")
    for model in args.models.split(","):
        Path(args.out).mkdir(parents=True, exist_ok=True)
        result = compare_model(model, Path(args.base), HERE.parents[2], systems, args.rounds, args.runs,
                               args.device, [p for p in args.profile.split(",") if p])
        result.update(report, gpu_state_after=gpu_state() if cuda else None, model=model, rounds=args.rounds,
                      runs=args.runs)
        path = Path(args.out) / f"two_trees_{model}.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"\n{model}: copy {bw['copy_tb_s']:.2f} TB/s; median of {args.rounds} rounds x {args.runs} runs")
        print("system    unit          base      new   new/base  tokens equal (first / every run)")
        for name, s in result["summary"].items():
            print(f"{name:9s} {s['unit']:12s} {s['base']:8.3f} {s['new']:8.3f}  {s['new_over_base']:8.4f}  "
                  f"{result['tokens_equal'][name]} / {s['same_tokens_every_run']}")


if __name__ == "__main__":
    main()
