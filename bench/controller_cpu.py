"""The controller on this CPU: repeated A/A runs (noise) and a known slowdown that must be refused every time.

Each run is one `compare` of stock against stock with `pad_us` set to the given fraction of stock's own decode
step (measured first, in the run's worker setting): the card's A/A run gives the noise, its A/B run the verdict.
Usage: PYTHONPATH=. python bench/controller_cpu.py --preset tiny --runs 5 --slowdown 0.05 --out FILE
"""

from __future__ import annotations

import argparse
import time

from specpilot.bench.harness import Runner
from specpilot.config.env import parse
from specpilot.controller.compare import REPO, Side, compare
from specpilot.datasets import load_requests
from specpilot.deployment import load_deployment
from specpilot.results import environment, write_json_atomic
from specpilot.runtime.pair import build_pair

REPS = 5  # passes per compare, as `specpilot compare` defaults to on a CPU


def step_ms(preset: str, limit: int, tokens: int) -> float:
    """Stock's decode time per step over the requests (one pass, after a warm-up)."""
    dep = load_deployment(preset)
    runner = Runner(*build_pair(dep), dep.context)
    stock = parse("stock")
    requests = [r for d in dep.datasets for r in load_requests(d, "dev", None, limit)]
    runner.run(stock, requests[0], tokens)
    recs = [rec for r in requests for rec in runner.run(stock, r, tokens)]
    return 1000 * sum(r.decode_s for r in recs) / sum(len(r.accepted) for r in recs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--slowdown", type=float, default=0.05)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dep = load_deployment(args.preset)
    limit = args.limit or dep.limit
    tokens = args.max_new_tokens or dep.max_new_tokens
    import os

    spec = {"preset": args.preset, "datasets": dep.datasets, "split": "dev", "limit": limit,
            "max_new_tokens": tokens, "cpu": True, "threads": len(os.sched_getaffinity(0))}
    step = step_ms(args.preset, limit, tokens)
    pad = round(1000 * step * args.slowdown, 1)
    runs = []
    for k in range(args.runs):
        t0 = time.time()
        card = compare(Side("stock", REPO), Side(f"stock:pad_us={pad}", REPO), spec, reps=REPS, alternating=True)
        d, aa = card["decision"], card["aa"]["estimate"]
        runs.append({"aa_gain": aa["gain"], "aa_lower": aa["lower"], "aa_upper": aa["upper"], "noise": d["noise"],
                     "gain": d["gain"], "lower": d["lower"], "upper": d["upper"], "bar": d["bar"],
                     "verdict": d["verdict"], "reason": d["reason"], "seconds": time.time() - t0})
        print(f"run {k + 1}: noise {d['noise']:.4f}, A/A gain {aa['gain']:.4f}; pad {pad} us: gain {d['gain']:.4f} "
              f"({d['lower']:.4f} .. {d['upper']:.4f}) -> {d['verdict']}", flush=True)
        write_json_atomic(args.out, {**environment(), "preset": args.preset, "spec": spec, "reps": REPS,
                                     "mode": "alternating (lockstep)", "stock_step_ms": step, "pad_us": pad,
                                     "slowdown": args.slowdown, "runs": runs})
    worst = max(r["noise"] for r in runs)
    refused = sum(r["verdict"] == "reject" for r in runs)
    print(f"{args.preset}: noise at most {worst:.4f} over {len(runs)} A/A runs; the {args.slowdown:.0%} pad "
          f"refused {refused} of {len(runs)} times")


if __name__ == "__main__":
    main()
