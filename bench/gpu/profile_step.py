"""Where a decode step's time goes: torch.profiler over eager AR steps of a random-weight model.

Usage: PYTHONPATH=. python bench/gpu/profile_step.py [--model dense-8b] [--rows 1] [--gemv]
Prints the kernels by total CUDA time (and their sum per step: the step's busy time; the graph-replayed
step of engine_core.py minus this is the time between kernels) and writes the table to
$OUT/profile_<model>_<rows>[_gemv].txt. --gemv: few-row projections through the Triton GEMV.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.profiler import ProfilerActivity, profile

from bench.gpu.engine_core import CONTEXT, MODELS
from specpilot.config import KernelPlan
from specpilot.core.contracts import Forward, Visibility
from specpilot.fixtures.random_models import random_target
from specpilot.kernels.tuning.descent import tune_step
from specpilot.kernels.tuning.starts import start_for
from specpilot.models.dense import Mode
from specpilot.runtime.graphs import replay_ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dense-8b")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--gemv", action="store_true", help="few-row projections through the Triton GEMV")
    args = ap.parse_args()
    cfg = MODELS[args.model]
    target = random_target(cfg, seed=0, dtype=torch.bfloat16, device="cuda", rope_length=CONTEXT + 1)
    plan = KernelPlan.stock(gemv=args.gemv)
    cache = target.new_cache(1, CONTEXT)
    start = torch.tensor([512], device="cuda")
    n = args.rows
    tokens = torch.randint(0, cfg.vocab_size, (1, n), device="cuda")
    positions = (start + torch.arange(n, device="cuda"))[None]
    vis = Visibility(cache_len=start, start=start)

    def step():
        target(tokens, Forward(positions, positions, vis), cache, Mode.VERIFY, plan)

    with torch.inference_mode():
        for _ in range(3):
            step()
        if args.gemv:  # the configs the engine would run: chosen by timing the captured step
            tune_step(step, lambda s: replay_ms(s, lambda: None), plan, start=start_for(torch.cuda.get_device_name()))
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
    events = prof.key_averages()
    table = events.table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=90)
    busy_ms = sum(e.self_device_time_total for e in events) / 5 / 1000  # self: each kernel once
    summary = f"kernels busy {busy_ms:.3f} ms per step ({args.model}, {n} rows, gemv={args.gemv})"
    print(table + "\n" + summary)
    name = f"profile_{args.model}_{n}{'_gemv' if args.gemv else ''}.txt"
    with open(os.path.join(os.environ.get("OUT", "."), name), "w") as f:
        f.write(table + "\n" + summary + "\n")


if __name__ == "__main__":
    main()
