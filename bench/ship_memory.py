"""Write the memory entries the engine ships: mechanisms that are already options, each with the measured
evidence on file (bench/results) and the commit it was measured on. Reuse of these is never a discovery
(provenance.agent = "shipped"); a loop that starts from them re-tunes and re-tests them.

Usage: PYTHONPATH=. python bench/ship_memory.py [--dir memory]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specpilot.memory.entry import Entry
from specpilot.memory.faithful import resolve, tree_of
from specpilot.memory.store import Store

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"

# (title, direction, sweep file, system as the sweep names it, forcing file or None, the baseline it is set
# against in the sweep)
SHIPPED = [
    ("best-first draft tree, 32 nodes (the pair)", "tau", "2026-12-03_trees_pair_sweep_4eb8239_h200.json",
     "stock:nodes=32,tree=best_first", "2026-12-03_force_tree_best_first_bf18272_h200.json", "stock"),
    ("best-first draft tree, 48 nodes (the twin)", "tau", "2026-12-03_trees_twin_sweep_4eb8239_h200.json",
     "stock:nodes=48,tree=best_first", None, "stock"),
    ("W12 target weights in the few-row kernel (the twin, AR)", "weights",
     "2026-12-04_twin_w12_trees_8a5deb8_h200.json", "ar:weights=w12", None, "ar"),
    ("BF16 target projections in the few-row kernel (the twin, AR)", "kernels",
     "2026-12-04_twin_w12_trees_8a5deb8_h200.json", "ar:fewrow=true", None, "ar"),
    ("two-level verification over W12's 8-bit view (the pair, CPU)", "tau", "2026-12-04_tlv_pair_25a6fc8_cpu.json",
     "stock:verify=tlv,weights=w12", None, "stock"),
    ("two-level verification of best-first trees, W12 (the twin)", "tau",
     "2026-12-04_twin_w12_trees_8a5deb8_h200.json", "stock:nodes=48,tree=best_first,verify=tlv,weights=w12", None,
     "stock:nodes=48,tree=best_first"),
]


def fingerprint(record: dict) -> dict:
    dep = record["deployment"]
    twin = "twin" in dep["name"]
    return {"gpu": record["device"], "target": "smollm2-135m" + ("-x16" if twin else ""),
            "drafter": "smollm2-dflash" + ("-x16" if twin else ""), "regime": dep["regime"],
            "dtype": dep["dtype"].removeprefix("torch.")}


def shipped_entry(title: str, direction: str, sweep: str, system: str, forcing: str | None,
                  baseline: str) -> Entry:
    record = json.loads((RESULTS / sweep).read_text())
    base = resolve(REPO, record["commit"])
    measured, against = record["systems"][system], record["systems"][baseline]
    bench = {"file": f"bench/results/{sweep}", "requests": measured["n_requests"], "tau": measured["tau"],
             "speedup_vs_ar": measured["speedup_vs_ar"], f"{baseline}_tau": against["tau"],
             f"{baseline}_speedup_vs_ar": against["speedup_vs_ar"]}
    if "w12" in measured.get("config", {}):
        bench.update(w12_memory(measured["config"]["w12"]))
    evidence = {"fingerprint": fingerprint(record), "bench": bench, "controller": None, "forcing": None}
    if forcing:
        verdict = json.loads((RESULTS / forcing).read_text())
        evidence["forcing"] = {"file": f"bench/results/{forcing}", "verdict": verdict["verdict"],
                               "reason": verdict["reason"]}
    options = dict(kv.split("=") for kv in system.split(":", 1)[1].split(","))
    return _shipped(title, direction, base, system, {k: v for k, v in options.items() if k == "nodes"}, evidence)


def _shipped(title: str, direction: str, base: str, system: str, tuned: dict, evidence: dict) -> Entry:
    return Entry(title=title, base_commit=base, tree=tree_of(REPO, base), registry={"system": system, "tuned": tuned},
                 evidence=evidence,
                 provenance={"round": None, "direction": direction, "agent": "shipped", "parents": [],
                             "reused": False, "cost": None})


def w12_memory(w12: dict) -> dict:
    """What a W12 record says of memory. Records before session 36 called 1 - forms / BF16 `saved` while the BF16
    copies stayed loaded beside the forms: saved only where they were dropped (w12_dense=drop)."""
    dropped = w12.get("dense_copy", "kept").startswith("dropped")
    forms = w12.get("w12_bytes", w12.get("stored_bytes"))
    return {"w12_forms_vs_bf16": 1 - forms / w12["bf16_bytes"], "w12_dense": "dropped" if dropped else "kept",
            "w12_saved": w12["saved"] if dropped else None}


# the dropped copies' entry: a w12_memory.py result (each system in its own process; AR on BF16 first)
DROPPED = ("W12 target weights with the BF16 copies dropped (the twin, AR)", "weights",
           "2026-12-06_w12_memory_1ec735b_h100.json", "smollm2-twin", "ar:weights=w12,w12_dense=drop", "ar")


def dropped_entry(title: str, direction: str, file: str, preset: str, system: str, baseline: str) -> Entry:
    record = json.loads((RESULTS / file).read_text())
    runs = {r["system"]: r for r in record["runs"][preset]["results"]}
    measured, against = runs[system], runs[baseline]
    base = resolve(REPO, record["commit"])
    bench = {"file": f"bench/results/{file}", "requests": len(measured["requests"]),
             "speedup_vs_ar": against["decode_ms_per_token"] / measured["decode_ms_per_token"],
             "device_bytes": measured["allocated_after_engine"], f"{baseline}_device_bytes":
             against["allocated_after_engine"], "peak_bytes": measured["peak_during_requests"],
             f"{baseline}_peak_bytes": against["peak_during_requests"],
             "prefill_ms": measured["prefill_ms_mean"], f"{baseline}_prefill_ms": against["prefill_ms_mean"],
             **w12_memory(measured["record"]["w12"])}
    fingerprint = {"gpu": record["gpu"], "target": "smollm2-135m-x16", "drafter": None, "regime": "single",
                   "dtype": "bfloat16"}
    return _shipped(title, direction, base, system, {},
                    {"fingerprint": fingerprint, "bench": bench, "controller": None, "forcing": None})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=str(REPO / "memory"))
    args = ap.parse_args()
    store = Store(Path(args.dir), REPO)
    for spec in SHIPPED:
        print(store.add(shipped_entry(*spec)), spec[0])
    print(store.add(dropped_entry(*DROPPED)), DROPPED[0])


if __name__ == "__main__":
    main()
