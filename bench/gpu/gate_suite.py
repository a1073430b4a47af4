"""Issue 55's second Must on one GPU: the loop's gate, as `specpilot loop --preset smollm2` builds it (bf16,
defaults), judges every lossless tree builder promotable, refuses every lossy fault, and rarely refuses a lossless
candidate on requests it has not seen.

    python3 bench/gpu/gate_suite.py builders faults      (about 5 minutes on an H100)
    python3 bench/gpu/gate_suite.py rounds [N]           (N rounds of disjoint dev requests, default 20; FIRST=k
                                                         starts at round k, to finish a run a call's limit cut)

builders  each lossless builder judged whole against stock (float32 check, sequential timing, forcing): its verdict,
          and what the lossless judges alone said (the float32 check, then forcing where the controller promotes)
faults    each lossy `fault=` of runtime/faults.py through the lossless judges alone (the float32 check, then
          forcing as the gate would let it through: forcing_refusal), so that no fault counts as refused only for
          being slower; and the whole judgement beside it
rounds    round k: the gate's requests are the k-th disjoint slice of the dev split (one per dataset, past the
          loop's own), the candidate a lossless builder in turn; a false reject is a refusal by a lossless judge

Correctness first: the float32 check and forcing are the verdicts. Every item's result is written to
$OUT/gate_suite_<part>.json as it comes (a timeout keeps what was judged)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from specpilot.config.options import FAULTS
from specpilot.datasets import load_requests
from specpilot.deployment import load_deployment
from specpilot.loop.gate import forcing_refusal, forcing_summary
from specpilot.loop.main import LoopArgs, build_loop

BUILDERS = ["stock:tree=chain", "stock:tree=ddtree,nodes=32", "stock:tree=eagle2,nodes=32",
            "stock:tree=sequoia,nodes=32", "stock:tree=best_first,nodes=16", "stock:tree=best_first,nodes=32",
            "stock:tree=best_first,nodes=48"]
LOSSY = [f"stock:fault={f}" for f in FAULTS if f != "none"]
ROUND_BUILDERS = BUILDERS[1:]  # chain is stock itself


def lossless(gate, candidate: str, requests=None, tokens=None) -> dict:
    """What the lossless judges alone say: the float32 check, then (where it passes) forcing, let through or not as
    the gate's own rule does (forcing_refusal)."""
    t0 = time.monotonic()
    logic = gate.check_logic(candidate, requests, tokens)
    out = {"logic": {k: logic.get(k) for k in ("verdict", "reason", "requests", "tokens", "equal")}}
    if logic["verdict"] == "reject":
        return {**out, "refused": f"float32 check: {logic['reason']}", "by": "float32 check",
                "seconds": time.monotonic() - t0}
    forcing = forcing_summary(gate.forcing(candidate, requests, tokens))
    refusal = forcing_refusal(forcing, logic, gate.precision(candidate))
    return {**out, "forcing": {k: forcing[k] for k in ("verdict", "reason", "exact", "sees", "detectable_rate",
                                                        "agreement", "mismatch", "tokens")},
            "refused": refusal, "by": "forcing" if refusal else None, "seconds": time.monotonic() - t0}


def whole(gate, candidate: str) -> dict:
    g = gate.judge("stock", candidate)
    c = g.get("controller") or {}
    why = g.get("refused") or g.get("error") or (f"the controller: {c['reason']}" if c.get("verdict") == "reject"
                                                 else None)
    return {"promoted": g["promoted"], "refused": why, "error": g.get("error"),
            "gain": c.get("gain"), "lower": c.get("lower"), "bar": c.get("bar"),
            "looks": len((c.get("sequential") or {}).get("looks", [])) or None,
            "logic": (g.get("logic") or {}).get("verdict"), "forcing": (g.get("forcing") or {}).get("verdict"),
            "seconds": g.get("seconds")}


def main() -> None:
    parts, out = sys.argv[1:], Path(os.environ.get("OUT", "/tmp"))
    rounds = int(parts[parts.index("rounds") + 1]) if "rounds" in parts and parts[-1] != "rounds" else 20
    preset = os.environ.get("PRESET", "smollm2")  # PRESET=tiny: a CPU smoke run of this script
    dep = load_deployment(preset, None)
    limit, tokens = -(-3 // len(dep.datasets)), min(64, dep.max_new_tokens)  # the loop's defaults (cli/loop.py)
    args = LoopArgs(dep, {"preset": preset}, Path(f"/tmp/gate-suite-{time.time():.0f}"), 1, "builtin", limit, tokens)
    loop, _ = build_loop(args, print)
    loop.say = lambda s: print(s, flush=True)
    gate = loop.gate
    first = int(os.environ.get("FIRST", "1"))
    head = {"date": time.strftime("%Y-%m-%d"), "commit": os.environ.get("SPECPILOT_COMMIT") or _commit(),
            "command": " ".join(["python3", *sys.argv]) + (f" (FIRST={first})" if first > 1 else ""),
            "deployment": preset, "gpu": _gpu(), "limit": limit, "max_new_tokens": tokens, "looks": gate.looks,
            "forcing_bound": gate.power_bound, "logic_tokens": gate.logic.cover if gate.logic else None}

    def save(part: str, rows: list) -> None:
        (out / f"gate_suite_{part}.json").write_text(json.dumps({**head, "part": part, "rows": rows}, indent=1))

    for part, candidates in (("builders", BUILDERS), ("faults", LOSSY)):
        if part not in parts:
            continue
        rows = []
        for cand in candidates:
            print(f"{part}: {cand}", flush=True)
            rows.append({"candidate": cand, "lossless": lossless(gate, cand), "whole": whole(gate, cand)})
            save(part, rows)
        print(table(rows, part), flush=True)
    if "rounds" in parts:
        rows = []
        # the loop's own requests come first; each round takes the next `limit` per dataset
        per = {d: load_requests(d, "dev", None, limit * (1 + rounds)) for d in dep.datasets}
        for k in range(first - 1, rounds):
            reqs = [r for d in dep.datasets for r in per[d][limit * (1 + k) : limit * (2 + k)]]
            cand = ROUND_BUILDERS[k % len(ROUND_BUILDERS)]
            print(f"round {k + 1}: {cand} on {[r.id for r in reqs]}", flush=True)
            rows.append({"round": k + 1, "candidate": cand, "requests": [r.id for r in reqs],
                         **lossless(gate, cand, reqs, tokens)})
            save("rounds", rows)
        refused = [r for r in rows if r["refused"]]
        print(f"false rejects: {len(refused)} of {len(rows)} rounds "
              f"({', '.join(str(r['round']) for r in refused) or 'none'})", flush=True)


def table(rows: list, part: str) -> str:
    lines = [f"{part}: candidate | lossless judges | whole gate"]
    for r in rows:
        lo, wh = r["lossless"], r["whole"]
        verdict = f"refused by {lo['by']}" if lo["refused"] else "lets it through"
        gate = "promoted" if wh["promoted"] else f"not promoted ({(wh['refused'] or wh['error'] or '')[:60]})"
        lines.append(f"  {r['candidate']} | {verdict} | {gate}")
    return "\n".join(lines)


def _commit() -> str:
    import subprocess

    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return run.stdout.strip() or "unknown"


def _gpu() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    main()
