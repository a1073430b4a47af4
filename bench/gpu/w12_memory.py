"""W12's memory on the GPU (issue 30): each system in a process of its own (w12_dense=drop refuses to
share a target), the device memory the allocator holds after the model loads, after the engine is built (W12 forms
made, dense copies kept or dropped) and at its peak over the requests; prefill and decode times from the engine's
own clock after a warm-up (every prompt prefilled once untimed); the tokens of every system compared with the
first's and with the one before (W12 with its copies dropped against kept: the same kernels, the same tokens).

Usage: PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data \\
       python3 bench/gpu/w12_memory.py [--preset smollm2-twin] [--limit 1] [--max-new 128] --out DIR
(one process per system: `--one SYSTEM --json FILE` is what each runs). Dry run here on the CPU:
       PYTHONPATH=. python bench/gpu/w12_memory.py --preset smollm2 --limit 1 --max-new 8 --out /tmp/m
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script

SYSTEMS = ("ar", "ar:weights=w12", "ar:weights=w12,w12_dense=drop")
DATASETS = ("gsm8k", "math500", "humaneval", "mbpp", "mtbench")


def allocated(device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


def one(preset: str, system: str, limit: int, max_new: int) -> dict:
    """One system, measured in this process."""
    from specpilot.config import parse_system
    from specpilot.datasets import load_requests
    from specpilot.deployment import load_deployment
    from specpilot.results import system_record
    from specpilot.runtime.engine import Engine
    from specpilot.runtime.pair import build_pair

    dep = load_deployment(preset=preset)
    target, _, tok = build_pair(dep, with_drafter=False)
    device = target.device
    loaded = allocated(device)
    t0 = time.perf_counter()
    engine = Engine(target, None, parse_system(system), context=dep.context)
    build_s = time.perf_counter() - t0
    built = allocated(device)
    engine.warmup()
    requests = [r for d in DATASETS for r in load_requests(d, "dev", limit=limit)]
    prompts = [tok.chat_prompt([{"role": "user", "content": r.turns[0]}]) for r in requests]
    for p in prompts:  # untimed: the first prefill of each length compiles kernels (JIT, cached on disk after)
        engine.generate_one(p, 2, tok.eos_ids)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    runs = []
    for r, prompt in zip(requests, prompts, strict=True):
        g = engine.generate_one(prompt, max_new, tok.eos_ids)
        runs.append({"id": r.id, "prompt_tokens": len(prompt), "tokens": g.tokens, "prefill_s": g.prefill_s,
                     "decode_s": g.decode_s})
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    steps = sum(max(len(x["tokens"]) - 1, 0) for x in runs)
    return {"system": system, "record": system_record(engine), "allocated_after_load": loaded,
            "allocated_after_engine": built, "peak_during_requests": peak, "engine_build_s": build_s,
            "prefill_ms_mean": 1e3 * sum(x["prefill_s"] for x in runs) / len(runs),
            "decode_ms_per_token": 1e3 * sum(x["decode_s"] for x in runs) / max(steps, 1), "requests": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="smollm2-twin")
    ap.add_argument("--limit", type=int, default=1, help="dev requests of each benchmark")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--systems", default=";".join(SYSTEMS), help="';'-separated")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--one")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.one:
        a.json.write_text(json.dumps(one(a.preset, a.one, a.limit, a.max_new)))
        return
    a.out.mkdir(parents=True, exist_ok=True)
    results = []
    for i, system in enumerate(a.systems.split(";")):
        path = a.out / f"w12_memory_{i}.part.json"
        cmd = [sys.executable, __file__, "--preset", a.preset, "--limit", str(a.limit), "--max-new", str(a.max_new),
               "--one", system, "--json", str(path)]
        rc = subprocess.run(cmd).returncode
        results.append(json.loads(path.read_text()) if rc == 0 else {"system": system, "error": f"exit {rc}"})
        path.unlink(missing_ok=True)
    for i, r in enumerate(results):  # against the first system (AR on BF16) and the one before (drop vs keep)
        for key, other in (("tokens_equal_first", results[0]), ("tokens_equal_previous", results[max(i - 1, 0)])):
            if "requests" in r and "requests" in other:
                r[key] = sum(x["tokens"] == y["tokens"] for x, y in zip(r["requests"], other["requests"], strict=True))
    head = {}
    if torch.cuda.is_available():
        from bench.gpu.engine_core import provenance

        head = provenance(" ".join(["python3", *sys.argv]))
    (a.out / "w12_memory.json").write_text(json.dumps({**head, "preset": a.preset, "limit": a.limit,
                                                       "max_new": a.max_new, "results": results}, indent=1))
    gb = lambda b: "-" if b is None else f"{b / 1e9:.2f}"  # noqa: E731
    print(f"{'system':34} {'load GB':>8} {'engine GB':>9} {'peak GB':>8} {'prefill ms':>10} {'ms/tok':>7} "
          "equal: first, previous")
    for r in results:
        if "error" in r:
            print(f"{r['system']:34} {r['error']}")
            continue
        print(f"{r['system']:34} {gb(r['allocated_after_load']):>8} {gb(r['allocated_after_engine']):>9} "
              f"{gb(r['peak_during_requests']):>8} {r['prefill_ms_mean']:>10.1f} {r['decode_ms_per_token']:>7.2f} "
              f"{r.get('tokens_equal_first', '-')}, {r.get('tokens_equal_previous', '-')} of {len(r['requests'])}")


if __name__ == "__main__":
    main()
