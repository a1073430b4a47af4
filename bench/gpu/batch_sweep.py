"""Issue 56's GPU Must: batched AR, stock and best_first at several requests in flight, on the pair or the twin.

    python3 bench/gpu/batch_sweep.py smollm2 [1,8,16,24,32]      (PRESET, the in-flight counts)
    LIMIT=7 CHECK=4 LIMIT_ONE=2 python3 bench/gpu/batch_sweep.py smollm2-twin 1,8,16,24,32    (35 requests: 32 in
    flight; 10 at one in flight)

Correctness first: at each count past 1, every system's batched outputs are compared token for token with the
same system's single-request outputs on the first CHECK requests (made once; bf16: a mismatch is reported with its
first divergence, not hidden). Then the closed loop of `specpilot bench --in-flight N` (bench/harness.run_batched)
over LIMIT requests per benchmark (5 benchmarks: LIMIT 7 for 32 in flight): each system's output tokens/s and
speedup over batched AR. First (issue 56's Goal), batched AR's step at each count against the weight-and-K/V read
floor (`ar_floor`). The twin serves a shorter context (CONTEXT, default 1024) so that 32 slots of its K/V fit beside
its 56 GB on an 80 GB card, and holds one engine at a time (ENGINES, default 1 for the twin, 3 otherwise: three
24-slot twin engines beside its weights did not fit an H100; an engine made again is warmed before it is timed).
Writes $OUT/batch_sweep_<preset>.json after every count (a timeout keeps what was measured)."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

from specpilot.bench.harness import Runner
from specpilot.bench.run import BenchPlan, bench_report, collect_requests, plan_systems, run_bench
from specpilot.core.contracts import Prompted
from specpilot.deployment import load_deployment
from specpilot.runtime.pair import build_pair

# SYSTEMS="stock|stock:tree=best_first,nodes=32,hybrid_tree=recompute" names others ('|' between systems)
SYSTEMS = os.environ.get("SYSTEMS", "stock|stock:tree=best_first,nodes=32").split("|")
CHECK = int(os.environ.get("CHECK", "8"))  # requests checked batched against alone at each count (the first ones)


def main() -> None:
    preset = sys.argv[1] if len(sys.argv) > 1 else "smollm2"
    counts = [int(c) for c in (sys.argv[2] if len(sys.argv) > 2 else "1,8,16,24,32").split(",")]
    out = Path(os.environ.get("OUT", "/tmp")) / f"batch_sweep_{preset}.json"
    dep = load_deployment(preset, None)
    if dep.twin:
        dep = dataclasses.replace(dep, context=int(os.environ.get("CONTEXT", "1024")))
    limit, max_new = int(os.environ.get("LIMIT", "8")), int(os.environ.get("MAX_NEW", "256"))
    target, drafter, tok = build_pair(dep)
    head = {"date": time.strftime("%Y-%m-%d"), "commit": os.environ.get("SPECPILOT_COMMIT"),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "command": " ".join(["python3", *sys.argv]), "systems": SYSTEMS, "preset": preset, "context": dep.context,
            "limit": limit, "max_new_tokens": max_new, "rows": []}
    head["ar_floor"] = _ar_floor(target, dep.context, [n for n in counts if n > 1])
    out.write_text(json.dumps(head, indent=1))
    alone: dict = {}  # each system's single-request outputs, made once for every count's check
    for n in counts:
        t0 = time.time()
        served = dep.serving(n)
        plan = BenchPlan(served, plan_systems(SYSTEMS), dep.datasets, dep.split, limit, max_new)
        requests = [r for r in collect_requests(plan)
                    if len(tok.chat_prompt([{"role": "user", "content": r.turns[0]}])) + max_new + 64 < dep.context]
        if n == 1:  # one at a time the twin takes ~6 min for 35 requests of 3 systems: LIMIT_ONE a benchmark
            plan = dataclasses.replace(plan, limit=int(os.environ.get("LIMIT_ONE", str(limit))))
            requests = [r for r in collect_requests(plan) if r in requests]
        engines = int(os.environ.get("ENGINES", "1" if dep.twin else "3"))  # (three 24-slot twin engines: 75 GB)
        runner = Runner(target, drafter, tok, dep.context, max_engines=engines, slots=n)
        check = _check(runner, plan, requests[: min(n, CHECK)], max_new, alone) if n > 1 else {}
        summaries = run_bench(plan, runner, requests)
        report = bench_report(plan, summaries)
        row = {"in_flight": n, "requests": len(requests), "seconds": time.time() - t0, "check": check,
               "systems": {name: {"batch": s.get("batch"), "tau": s["tau"], "mismatch_vs_ar": s["mismatch_vs_ar"],
                                  "decode_tokens_per_s": s["decode_tokens_per_s"]} for name, s in summaries.items()},
               "environment": {k: report[k] for k in ("date", "device", "commit", "dirty") if k in report}}
        head["rows"].append(row)
        out.write_text(json.dumps(head, indent=1))
        print(_line(row), flush=True)
        runner.close()
        _free()


def _ar_floor(target, context: int, counts: list[int]) -> dict:
    """Batched AR's captured step at each count (every slot decoding at half the context) against the step's
    weight-and-K/V read floor at the bandwidth measured here (ceiling/floors.ar_batch, ceiling/machine)."""

    from specpilot.ceiling.floors import ar_batch
    from specpilot.ceiling.machine import bandwidth
    from specpilot.config import parse_system
    from specpilot.runtime.engine import Engine
    from specpilot.runtime.graphs import StepGraph, median_ms

    if not counts or target.device.type != "cuda":
        return {}
    engine = Engine(target, None, parse_system("ar"), context=context, slots=max(counts))
    position = context // 2
    bw = bandwidth(target.device)["bytes_s"]
    rows = []
    with torch.inference_mode():
        for n in counts:
            n = min(s for s in engine.sizes if s >= n)
            engine.live.fill_(1)
            engine.pos.fill_(position)
            graph = StepGraph(engine.batch_steps(False)[n, False].fn, use_graph=True)  # greedy
            graph.prepare()
            engine.pos.fill_(position)  # each replay moves every slot one on: 50 replays stay near it
            step_ms = median_ms(graph, 50)
            fl = ar_batch(target.cfg, n, position + 25, target.embed.weight.element_size())
            floor_ms = sum(f.bytes for f in fl.values()) / bw * 1e3
            rows.append({"in_flight": n, "step_ms": step_ms, "floor_ms": floor_ms, "over_floor": step_ms / floor_ms,
                         "bytes": sum(f.bytes for f in fl.values())})
            print(f"batched AR, {n} in flight at position {position}: {step_ms:.3f} ms a step, floor {floor_ms:.3f} ms "
                  f"({step_ms / floor_ms:.2f}x)", flush=True)
            del graph
    del engine
    _free()
    return {"position": position, "bandwidth_bytes_s": bw, "rows": rows}


def _free() -> None:
    """Hand back what dropped engines held: an engine's graphs and closures hold it in reference cycles, so without
    a collection the 32-slot engine of `_ar_floor` stayed and the twin's first count of 16 ran out of memory on an
    H100 (2026-12-06)."""
    gc.collect()
    torch.cuda.empty_cache()


def _check(runner: Runner, plan: BenchPlan, requests, max_new: int, alone: dict) -> dict:
    """Each system's batched outputs against its single-request outputs on `requests` (first turns); `alone`
    keeps the single-request outputs by system and request between calls."""
    from specpilot.runtime.engine import Engine

    eos = tuple(runner.tokenizer.eos_ids)
    asks = [Prompted(runner.tokenizer.chat_prompt([{"role": "user", "content": r.turns[0]}]), max_new, eos)
            for r in requests]
    out = {}
    for system in plan.systems:
        batched = runner.engine(system).generate(asks)
        mine = alone.setdefault(system.name, [])
        if len(mine) < len(asks):
            mine += Engine(runner.target, runner.drafter if system.speculative else None, system,
                           context=runner.context).generate(asks[len(mine):])
            _free()  # the single-request engine, before the next system's batched one
        diverge = [next((i for i, (a, b) in enumerate(zip(x.tokens, y.tokens, strict=False)) if a != b),
                        None if len(x.tokens) == len(y.tokens) else min(len(x.tokens), len(y.tokens)))
                   for x, y in zip(batched, mine[: len(asks)], strict=True)]
        out[system.name] = {"equal": sum(d is None for d in diverge), "of": len(asks),
                            "first_divergence": [d for d in diverge if d is not None]}
    return out


def _line(row: dict) -> str:
    parts = [f"{row['in_flight']:>3} in flight ({row['requests']} requests, {row['seconds']:.0f} s):"]
    for name, s in row["systems"].items():
        b = s["batch"] or {}
        rate = b.get("output_tokens_per_s", s["decode_tokens_per_s"])
        parts.append(f"{name} {rate:.0f} tok/s" + (f" {b['speedup_over_batched_ar']:.2f}x" if b else ""))
    check = "; ".join(f"{k} {v['equal']}/{v['of']} equal" for k, v in row["check"].items())
    return " | ".join(parts) + (f" | check: {check}" if check else "")


if __name__ == "__main__":
    main()
