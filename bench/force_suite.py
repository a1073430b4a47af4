"""The judge against the whole fault suite on one deployment: every `fault=` variant, the lossless variants and a
reference that shares a fault, each through `force` against stock (the reference's and AR's runs made once).

Usage: PYTHONPATH=. python bench/force_suite.py --preset smollm2 [--deployment D.toml] [--limit 2]
       [--max-new-tokens 64] [--lossless-rounds R] [--cases all|faults|none] [--case REF CAND ...]
       [--exact auto|deployment|float32] --out RESULT.json
--case REF CAND (repeatable): also judge CAND against REF on the same requests (their runs shared with the rest).
--workers N: the outputs made by N processes at once (forcing/parallel.py), scored here.
--outputs DIR: the outputs kept there, and reused by a later run of the same code (forcing/outputs.py).
Each case starts on --limit requests per dataset and may double twice toward the power bound (0.1 points).
--at-once: judge each case on those four times as many requests in one round (the last round the doubling would
reach; nothing judged between, so the workers never wait on a judge before the end).
--lossless-rounds R: also judge R lossless variants on R further disjoint request sets (the false-reject sample).
Prints a table last; the JSON (rewritten after every verdict) holds each verdict with its evidence summary.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import time

from specpilot.bench.harness import Runner
from specpilot.datasets import load_requests, round_robin
from specpilot.deployment import load_deployment
from specpilot.forcing.outputs import OutputStore, described
from specpilot.forcing.parallel import pool_for
from specpilot.forcing.run import EXACT_MODES, ExactTargets, force
from specpilot.results import environment, write_json_atomic
from specpilot.runtime.faults import FAULTS
from specpilot.runtime.pair import build_pair

LOSSLESS = ["stock:block_size=2", "stock:block_size=4", "stock:block_size=8", "stock:graphs=false", "stock:gemv=true",
            "stock:tree=best_first,nodes=32", "stock:tree=eagle2,nodes=16", "stock:tree=ddtree,nodes=24",
            "stock:tree=sequoia,nodes=16", "ar"]


def summary(report: dict) -> dict:
    t = report["tests"]
    return {"verdict": report["verdict"], "reason": report["reason"], "exact": report["exact"],
            "delta": report["delta"],
            "noise_max": report["calibration"]["noise"]["max"], "detectable_rate": report["detectable_rate"],
            "power": report["power"], "failed": {k: v["failed"] for k, v in t.items()},
            "p": {k: {q: v[f"{q}_p"] for q in ("mismatch", "events", "margins")} | {"level": v["level"]}
                  for k, v in t.items()},
            "margin_quantiles": {r: s["margin_quantiles"] for r, s in report["systems"].items()},
            "mismatch": {r: s["mismatch_rate"] for r, s in report["systems"].items()},
            "events": {r: s["large_margin_events"] for r, s in report["systems"].items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset")
    ap.add_argument("--deployment")
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--lossless-rounds", type=int, default=0)
    ap.add_argument("--cases", choices=("all", "faults", "none"), default="all",
                    help="judge the fault suite (with the reference that shares a fault) and the lossless variants, "
                         "the faults only, or none (only the lossless rounds)")
    ap.add_argument("--case", nargs=2, action="append", default=[], metavar=("REF", "CAND"),
                    help="a further candidate and its reference (repeatable)")
    ap.add_argument("--exact", choices=EXACT_MODES, default="auto",
                    help="the exact target that scores every token (float32: the FP32-reference mode; auto: float32 "
                         "for a candidate with other kernels than its reference, forcing/run.exact_mode)")
    ap.add_argument("--workers", type=int, default=1, help="processes that make the outputs at once (forcing/parallel)")
    ap.add_argument("--outputs", help="keep the outputs in this folder and reuse those kept there (forcing/outputs)")
    ap.add_argument("--at-once", action="store_true", help="one round on all the requests the doubling may reach")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dep = load_deployment(args.preset, args.deployment)
    target, drafter, tok = build_pair(dep)
    runner = Runner(target, drafter, tok, dep.context)
    exact = ExactTargets(dep)
    start = len([r for name in dep.datasets for r in load_requests(name, dep.split, None, args.limit)])
    pool = round_robin([r for name in dep.datasets for r in load_requests(name, dep.split, None, None)])
    requests, rest = pool[: 4 * start], pool[4 * start :]  # the power bound may double the start twice
    start = len(requests) if args.at_once else start
    reuse: dict = {}
    rows = {}
    cases = [] if args.cases == "none" else [("stock", f"stock:fault={f}") for f in FAULTS if f != "none"] + [
        ("stock:fault=logit_bias", "stock:fault=logit_bias")]  # the last: a reference sharing the flaw
    cases += [("stock", c) for c in LOSSLESS] if args.cases == "all" else []
    cases += [tuple(c) for c in args.case]
    procs = pool_for(args.workers, args.preset, args.deployment, [s for c in cases for s in c] + ["ar"] + (
        LOSSLESS + ["stock"] if args.lossless_rounds else []), pool)
    generate = procs.generate if procs is not None else None
    store = OutputStore(args.outputs, described(dep)) if args.outputs else None
    lossless: list = []
    record = {**environment(), "deployment": dep.name, "dtype": str(dep.torch_dtype()), "exact": args.exact,
              "requests": start, "max_new_tokens": args.max_new_tokens, "workers": args.workers, "cases": rows,
              "lossless_rounds": lossless, "false_rejects": 0}
    with procs or contextlib.nullcontext():
        _judge_all(args, runner, cases, requests, rest, start, reuse, exact, generate, store, record)
    print(f"\n{'case':70s} verdict       mismatch cand/ref/ar        events  detectable")
    for name, r in rows.items():
        m = r["mismatch"]
        print(f"{name:70s} {r['verdict']:12s} {100 * m['candidate']:.2f}/{100 * m['reference']:.2f}/"
              f"{100 * m['ar']:.2f}%  {r['events']['candidate']:4d}  {100 * r['detectable_rate']:.2f} pts")
    if lossless:
        print(f"lossless rounds: {len(lossless)}, false rejects {record['false_rejects']}")


def _judge_all(args, runner, cases, requests, rest, start, reuse, exact, generate, store, record) -> None:
    """Each case, then the lossless rounds, the record rewritten after every verdict."""
    rows, lossless = record["cases"], record["lossless_rounds"]
    for ref, cand in cases:
        t0 = time.perf_counter()

        def partial(report, name=f"{ref} vs {cand}", t0=t0):  # a round's verdict, until the case's own replaces it
            rows[name] = {**summary(report), "round": True, "seconds": time.perf_counter() - t0}
            write_json_atomic(args.out, record)

        mode, scorer = exact.pick(args.exact, ref, cand)
        report = force(runner, ref, cand, requests, args.max_new_tokens, reuse=reuse.setdefault(mode, {}),
                       bound=0.001, start=start, exact=scorer, generate=generate, on_round=partial, store=store)
        rows[f"{ref} vs {cand}"] = {**summary(report), "seconds": time.perf_counter() - t0}
        print(f"{ref:24s} {cand:34s} {rows[f'{ref} vs {cand}']['verdict']}", flush=True)
        write_json_atomic(args.out, record)  # after every case: a run cut short still leaves its verdicts
    for i, cand in zip(range(args.lossless_rounds), itertools.cycle(LOSSLESS), strict=False):
        chunk = rest[i * start : (i + 1) * start]
        if len(chunk) < start:
            break
        _, scorer = exact.pick(args.exact, "stock", cand)
        lossless.append({"candidate": cand, **summary(force(runner, "stock", cand, chunk, args.max_new_tokens,
                                                            exact=scorer, generate=generate, store=store))})
        print(f"round {i + 1}: stock vs {cand:34s} {lossless[-1]['verdict']}", flush=True)
        record["false_rejects"] = sum(r["verdict"] == "reject" for r in lossless)
        write_json_atomic(args.out, record)
    write_json_atomic(args.out, record)


if __name__ == "__main__":
    main()
