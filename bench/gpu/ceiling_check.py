"""Checks of one ceiling report (bench/gpu/ceiling.sh), then its short table.

Usage: python bench/gpu/ceiling_check.py CEILING.json INPUTS.json
Checks: the profile claims its kernels (unattributed device time under 5% of the attributed); every kernel class
of a speculative step has time (attention, GEMMs, heads, drafter, tree); the chain replayed at stock's rows gives
stock's live tau of the timed run (to 0.005: both runs produce the same greedy outputs). Exits 1 if one fails;
prints the factors, weight shares and the cost model's checks either way.
"""

from __future__ import annotations

import json
import sys

NEEDED = ("target_gemm", "drafter_gemm", "lm_head", "attention", "drafter_other", "tree")


def checks(report: dict, inputs: dict) -> list[str]:
    bad = []
    for name, s in inputs["systems"].items():
        prof = s["profile"]
        if prof.get("unlinked_s", 0.0) > 0.05 * prof["seconds_per_step"]:
            top = ", ".join(f"{k[:60]} {1e6 * v:.1f} us" for k, v in list(prof.get("unlinked_kernels", {}).items())[:5])
            bad.append(f"{name}: {1e6 * prof['unlinked_s']:.1f} us/step of kernels no region claimed ({top})")
        empty = [c for c in NEEDED if prof["classes"].get(c, 0.0) <= 0]
        if empty:
            bad.append(f"{name}: no kernel time in {', '.join(empty)}")
    stock = report["systems"].get("stock")
    if stock is not None:
        points = {p["nodes"]: p["tau"] for p in stock["predicted"]["nodes"]["points"]}
        live = inputs["systems"]["stock"]
        replayed = points.get(live["rows"])
        recorded = stock["factors"]["tau"]["tau"]
        print(f"stock: replayed chain tau {replayed} (timed run's live tau {recorded:.4f})")
        if replayed is None or abs(replayed - recorded) > 0.005:  # the same greedy outputs: the same steps
            bad.append("stock: the chain replayed at its own rows is not the live tau")
    return bad


def main() -> None:
    report = json.load(open(sys.argv[1]))
    inputs = json.load(open(sys.argv[2]))
    bad = checks(report, inputs)
    print("system                          S      tau_f  kernel overhd lattice  ceiling target   weights  check")
    for name, s in report["systems"].items():
        f = s["factors"]
        check = s["cost_model"]["this_run"] or {}
        print(f"{name[:30]:30s} {s['speedup']:.3f}  {f['tau']['value']:.2f}  {f['kernel']['value']:.2f}  "
              f"{f['overhead']['value']:.2f}  {f['lattice']['value'] or 0:.2f}  {s['ceiling']:7.2f}  "
              f"{s['target']:8s} {s['predicted']['weight_share']:.0%}  "
              f"{check.get('predicted', 0):.3f}/{check.get('measured') or 0:.3f}")
        for row in s["cost_model"].get("sweep", []):
            print(f"   sweep {row['system'][:40]:40s} predicted {row['predicted']:.3f} measured "
                  f"{row['measured']:.3f} ({100 * row['error']:+.1f}%)")
    for line in bad:
        print("CHECK FAILED:", line)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
