"""The float32 check's coverage (forcing/logic.py) on a real model: each candidate judged as the loop's gate judges
it, on the gate's requests alone and then covering at least COVER tokens past them (more dev requests of 256
tokens). The float32 check computes the same function on a CPU as on a GPU (the deployment's model in float32, on
the PyTorch references), so the CPU decides what it would see there.

    PYTHONPATH=. python bench/logic_coverage.py --preset smollm2 --cover 2048 --out FILE [CANDIDATE ...]

Default candidates: stock:fault=topk_truncate (lossy: the vocabulary's last eighth never chosen) and
stock:tree=best_first,nodes=32 (lossless). Writes FILE (JSON: date, commit, machine, command, each verdict with
its tokens, what it sees and the seconds it took) after each candidate.
"""

from __future__ import annotations

import argparse
import sys
import time

from specpilot.datasets import load_requests
from specpilot.deployment import load_deployment
from specpilot.forcing.logic import LogicCheck
from specpilot.results import environment, write_json_atomic

POOL = 12  # dev requests per dataset the coverage may use (the loop's forcing pool)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smollm2")
    ap.add_argument("--cover", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=64, help="the gate's own requests' output budget")
    ap.add_argument("--out", required=True)
    ap.add_argument("candidates", nargs="*", default=["stock:fault=topk_truncate", "stock:tree=best_first,nodes=32"])
    a = ap.parse_args()
    dep = load_deployment(a.preset)
    gate = [r for d in dep.datasets for r in load_requests(d, "dev", None, 1)]  # the loop's default: one each
    pool = gate + [r for d in dep.datasets for r in load_requests(d, "dev", None, POOL) if r not in gate]
    doc = {**environment(), "command": " ".join(["python", *sys.argv]), "preset": a.preset, "cover": a.cover,
           "gate_requests": [r.id for r in gate], "tokens": a.tokens, "rows": []}
    for cover in (0, a.cover):
        check = LogicCheck(dep, pool=pool, cover=cover)
        for cand in a.candidates:
            t0 = time.monotonic()
            out = check.check(cand, gate, a.tokens)
            row = {"candidate": cand, "cover": cover, "verdict": out["verdict"], "reason": out.get("reason"),
                   "tokens": out.get("tokens"), "sees": out.get("sees"), "parting": out.get("parting"),
                   "seconds": time.monotonic() - t0}
            doc["rows"].append(row)
            write_json_atomic(a.out, doc)
            print(f"cover {cover}: {cand}: {out['verdict']} ({row['seconds']:.0f} s) {out.get('reason', '')[:160]}",
                  flush=True)


if __name__ == "__main__":
    main()
