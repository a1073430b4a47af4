"""Whole config sets of the 8B step, from earlier runs, timed in turn in one process (issue 2).

Session 13: every ablate_step.py tuning chose plain tiles and timed its step at 3.83-3.86 ms, every
engine_core.py tuning a shared-memory ring for the output projection at 3.90-3.98, on the same GPUs.
Either the processes differ (the same set times differently in each) or the coordinate descent lands in
different places (some sets are faster wherever they run). This tunes the step as the engine does, then
times that set and every set recorded in the result files named (bench/results/, key for key the same
kernels) in turn, `rounds` times, from one state; then tunes once more, one round, starting from the
fastest set (choice.tune_step's start) and times that too against the fastest and the engine's.

Usage: SPECPILOT_COMMIT=<sha> PYTHONPATH=. python3 bench/gpu/config_sets.py [--model dense-8b] [--out DIR]
       [--sets FILE ...]
"""

from __future__ import annotations

import argparse
import ast
import json
import os

import torch

from bench.gpu.ablate_step import in_turn, medians, next_token
from bench.gpu.engine_core import CONTEXT, MODELS, bandwidth, provenance, step_weight_bytes
from specpilot.fixtures.random_models import random_target
from specpilot.kernels.gemv import choice
from specpilot.runtime.engine import Engine
from specpilot.runtime.graphs import replay_ms
from specpilot.runtime.options import parse_system

AR = parse_system("ar")
POS = CONTEXT // 4
RESULTS = "bench/results/2026-12-01_"
SETS = [RESULTS + f for f in (
    "cluster_paired_de16b83_h200.json", "cluster_paired_de16b83_third_lease_h200.json",
    "engine_core_8b_184fb42_h200.json", "engine_core_8b_de16b83_h200.json",
    "engine_core_8b_de16b83_second_process_h200.json", "placement_f01eb03_h200.json")]
FIELDS = ("configs_chosen", "configs_chosen_in_the_step", "configs")


def recorded_sets(path: str, model: str) -> dict[str, dict]:
    """Every config set in a result file: {label: {key: config}} (engine_core's per-key entries unwrapped)."""
    with open(path) as f:
        data = json.load(f)
    found = {}

    def walk(node, where: str) -> None:
        for k, v in node.items() if isinstance(node, dict) else ():
            if k in FIELDS and isinstance(v, dict) and v:
                found[os.path.basename(path)[11:-5] + where] = {
                    ast.literal_eval(key): c.get("config", c) for key, c in v.items()}
            elif where.split("/")[-1] != "models" or k == model:  # other models' sets are not this one's
                walk(v, f"{where}/{k}")

    walk(data, "")
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dense-8b")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sets", nargs="*", default=SETS)
    args = ap.parse_args()
    report = provenance(f"PYTHONPATH=. python3 bench/gpu/config_sets.py --model {args.model}")
    report["bandwidth"] = bw = bandwidth()
    torch.cuda.empty_cache()
    cfg = MODELS[args.model]
    target = random_target(cfg, seed=0, dtype=torch.bfloat16, device="cuda", rope_length=CONTEXT + 1)
    floor = step_weight_bytes(target) / (bw["copy_tb_s"] * 1e12) * 1e3
    choice.forget()
    eng = Engine(target, None, context=CONTEXT, gemv=True)
    eng.warmup(AR)
    own = dict(choice._CHOSEN)
    sets, skipped = {"this process": own}, {}
    for path in args.sets:
        for label, configs in recorded_sets(path, args.model).items():
            same = next((n for n, c in sets.items() if c == configs), None)
            if set(configs) != set(own):
                skipped[label] = "other kernel keys"
            elif same:
                skipped[label] = f"the same as {same}"
            else:
                sets[label] = configs
    tokens = {}
    for name, configs in sets.items():
        choice._CHOSEN.clear()
        choice._CHOSEN.update(configs)
        tokens[name] = next_token(eng, POS)
    times = in_turn(eng, sets, args.rounds, POS)
    med = medians(times)
    best = min((n for n in med if n != "this process"), key=med.get)
    choice._CHOSEN.clear()
    reset = lambda: eng.pos.fill_(POS)  # noqa: E731
    with torch.inference_mode():
        choice.tune_step(eng._ar_step, lambda step: replay_ms(step, reset), rounds=1, start=sets[best])
    seeded = dict(choice._CHOSEN)
    final = in_turn(eng, {"this process": own, best: sets[best], "seeded from it": seeded}, args.rounds, POS)
    report.update(model=args.model, floor_ms=floor, next_token=tokens, skipped=skipped,
                  sets={n: {repr(k): c for k, c in s.items()} for n, s in sets.items()},
                  ms_by_round=times, median_ms=med, fastest_recorded=best,
                  seeded={repr(k): c for k, c in seeded.items()}, final_ms_by_round=final,
                  final_median_ms=medians(final))
    with open(os.path.join(args.out, "config_sets.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nfloor {floor:.3f} ms; the same next token for every set: {len(set(tokens.values())) == 1}")
    for n, v in sorted(med.items(), key=lambda kv: kv[1]):
        print(f"{v:7.3f} ms {100 * floor / v:5.1f}%  {n}")
    print("then:")
    for n, v in report["final_median_ms"].items():
        print(f"{v:7.3f} ms {100 * floor / v:5.1f}%  {n}")


if __name__ == "__main__":
    main()
