"""Does where the weights lie in GPU memory change the decode step's time? (issue 2)

Session 13 saw engine_core.py processes time the tuned 8B step 0.04-0.11 ms slower than ablate_step.py
processes on the same GPU, and rank the one-row kernels' configs differently. One difference between the
two: ablate_step.py builds the target into the two 4 GiB blocks its bandwidth test left in PyTorch's
cache, engine_core.py after emptying the cache (each parameter its own cudaMalloc). So this builds two
copies of one random 8B target (same seed, same values):
  separate  each parameter its own allocation (what random_target and the checkpoint loader make)
  arena     every parameter a view into one allocation, each at a 2 MiB boundary
and times, in turn (drift hits both alike): cuBLAS AR's captured step; the projections alone in one
graph; the Triton GEMV step with the configs tuned on `separate`, then with those tuned on `arena`.
Correctness first: both copies give the same next tokens.

Usage: SPECPILOT_COMMIT=<sha> PYTHONPATH=. python3 bench/gpu/placement.py [--model dense-8b] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from bench.gpu.ablate_step import next_token, timed_step
from bench.gpu.engine_core import CONTEXT, MODELS, bandwidth, projections_only, provenance, step_weight_bytes
from specpilot.fixtures.random_models import random_target
from specpilot.kernels.gemv import choice
from specpilot.runtime.engine import Engine
from specpilot.runtime.options import parse_system

AR = parse_system("ar")
ALIGN = 1 << 21
POS = CONTEXT // 4


def into_arena(model: torch.nn.Module) -> torch.Tensor:
    """Moves every parameter of `model` into one allocation (2 MiB-aligned views); returns the arena."""
    params = list(model.parameters())
    dtype = params[0].dtype
    step = ALIGN // params[0].element_size()
    offsets, total = [], 0
    for p in params:
        offsets.append(total)
        total += -(-p.numel() // step) * step
    arena = torch.empty(total, dtype=dtype, device=params[0].device)
    with torch.no_grad():
        for p, off in zip(params, offsets, strict=True):
            view = arena[off: off + p.numel()].view(p.shape)
            view.copy_(p)
            p.data = view
    torch.cuda.empty_cache()
    return arena


def in_turn(fns: dict, rounds: int) -> dict:
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(fn())
    return {"rounds_ms": times, "median_ms": {k: statistics.median(v) for k, v in times.items()}}


def gemv_engine(target) -> Engine:
    eng = Engine(target, None, context=CONTEXT, gemv=True)
    eng.warmup(AR)  # tunes unless every key already has a choice
    return eng


def show(label: str, res: dict, floor: float) -> None:
    print(f"[{label}] " + "; ".join(f"{k} {v:.3f} ({100 * floor / v:.1f}%)" for k, v in res["median_ms"].items()),
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dense-8b")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    report = provenance(f"PYTHONPATH=. python3 bench/gpu/placement.py --model {args.model}")
    report["bandwidth"] = bw = bandwidth()
    torch.cuda.empty_cache()  # as engine_core.py: the targets get allocations of their own
    cfg = MODELS[args.model]
    t0 = time.perf_counter()
    sep = random_target(cfg, seed=0, dtype=torch.bfloat16, device="cuda", rope_length=CONTEXT + 1)
    packed = random_target(cfg, seed=0, dtype=torch.bfloat16, device="cuda", rope_length=CONTEXT + 1)
    arena = into_arena(packed)
    floor = step_weight_bytes(sep) / (bw["copy_tb_s"] * 1e12) * 1e3
    same_values = all(torch.equal(a, b) for a, b in zip(sep.parameters(), packed.parameters(), strict=True))
    print(f"[build] two copies in {time.perf_counter() - t0:.1f}s; same values {same_values}; arena "
          f"{arena.numel() * arena.element_size() / 2**30:.2f} GiB at {arena.data_ptr():#x}; floor {floor:.3f} ms",
          flush=True)
    report.update(model=args.model, floor_ms=floor, same_values=same_values, copy_tb_s=bw["copy_tb_s"])
    targets = {"separate": sep, "arena": packed}

    cub = {k: Engine(t, None, context=CONTEXT) for k, t in targets.items()}
    for e in cub.values():
        e.warmup(AR)
    report["cublas_next_token"] = {k: next_token(e, POS) for k, e in cub.items()}
    report["cublas_step"] = res = in_turn({k: (lambda e=e: timed_step(e, POS)) for k, e in cub.items()}, args.rounds)
    show("cuBLAS step", res, floor)
    del cub
    report["projections_only"] = res = in_turn(
        {k: (lambda t=t: projections_only(t, bw)["linear"]["ms"]) for k, t in targets.items()}, 3)
    show("F.linear projections alone", res, floor)

    engines, tunings = {}, {}
    for tuned_on in ("separate", "arena"):
        choice.forget()
        engines[tuned_on] = gemv_engine(targets[tuned_on])
        tunings[tuned_on] = dict(choice._CHOSEN)
        for k, t in targets.items():  # the other copy's engine, captured with the same configs
            if k not in engines:
                engines[k] = gemv_engine(t)
        tokens = {k: next_token(e, POS) for k, e in engines.items()}
        res = in_turn({k: (lambda e=e: timed_step(e, POS)) for k, e in engines.items()}, args.rounds)
        res["next_token"] = tokens
        res["configs"] = {repr(k): c for k, c in tunings[tuned_on].items()}
        report[f"gemv_step_tuned_on_{tuned_on}"] = res
        show(f"GEMV step, configs tuned on {tuned_on}; next tokens {tokens}", res, floor)
        engines.clear()
    with open(os.path.join(args.out, "placement.json"), "w") as f:
        json.dump(report, f, indent=1)
    print("\nplacement   cuBLAS   F.linear  GEMV(tuned sep)  GEMV(tuned arena)   ms; floor "
          f"{floor:.3f}")
    for k in targets:
        print(f"{k:10s} {report['cublas_step']['median_ms'][k]:7.3f} {report['projections_only']['median_ms'][k]:9.3f}"
              f" {report['gemv_step_tuned_on_separate']['median_ms'][k]:15.3f}"
              f" {report['gemv_step_tuned_on_arena']['median_ms'][k]:18.3f}")


if __name__ == "__main__":
    main()
