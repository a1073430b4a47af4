"""Score kept forcing outputs (a `force --outputs` folder, made on any machine) again under another exact target,
and compare two systems as the judge does: is the candidate's mismatch rate, event rate or margin at mismatches
higher than the reference's (forcing/judge.compare, both ways), with the margins' quantiles.

An analysis, not a verdict: the outputs are read by their key files whatever code or machine made them (their keys
go into the result), and the exact target here may differ from the one the verdict used, e.g. a float32 model on
the CPU against outputs judged under the deployment's bf16 on the H200.

Usage: PYTHONPATH=. python bench/force_rescore.py --deployment bench/gpu/smollm2-pair.toml --outputs DIR
       --reference ar --candidate ar:weights=w12 --requests 562 [--max-new-tokens 256] [--device cpu]
       [--dtype float32] [--delta 0.5] [--threads 2] --out RESULT.json
The first --requests requests of the pool force_suite.py draws (every dev request, datasets round robin)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from specpilot.datasets import load_requests, round_robin
from specpilot.deployment import load_deployment
from specpilot.forcing.judge import compare, tally
from specpilot.forcing.outputs import read_kept
from specpilot.forcing.score import score_output
from specpilot.results import environment, write_json_atomic
from specpilot.runtime.pair import build_pair


def kept(folder: Path, system: str, max_new: int) -> tuple[dict, dict]:
    """(the file's key, request -> turns) of the one kept file of this system and budget."""
    found = [p for p in folder.glob("*.key.json")
             if (k := json.loads(p.read_text()))["system"] == system and k["max_new_tokens"] == max_new]
    if len(found) != 1:
        raise SystemExit(f"{len(found)} kept files for {system} at {max_new} tokens in {folder}")
    return json.loads(found[0].read_text()), read_kept(found[0].with_name(found[0].name.replace(".key.json", ".jsonl")))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deployment", required=True)
    ap.add_argument("--outputs", required=True)
    ap.add_argument("--reference", required=True)
    ap.add_argument("--candidate", required=True)
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--delta", type=float, default=0.5, help="events: margins above 2 delta (the verdict's delta)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dep = dataclasses.replace(load_deployment(None, args.deployment), device=args.device, dtype=args.dtype)
    target, _, _ = build_pair(dep)
    pool = round_robin([r for name in dep.datasets for r in load_requests(name, dep.split, None, None)])
    ids = [r.id for r in pool[: args.requests]]
    keys, systems = {}, {}
    for role, system in (("reference", args.reference), ("candidate", args.candidate)):
        keys[role], rows = kept(Path(args.outputs), system, args.max_new_tokens)
        missing = [i for i in ids if i not in rows]
        if missing:
            raise SystemExit(f"{system}: {len(missing)} of the {len(ids)} requests are not kept, e.g. {missing[0]}")
        start, scores = time.time(), []
        for k, rid in enumerate(ids):
            scores += [score_output(target, t.prompt, t.tokens) for t in rows[rid]]
            if k % 50 == 0:
                print(f"{system}: {k}/{len(ids)} requests, {time.time() - start:.0f} s", flush=True)
        systems[role] = tally(system, scores, args.delta)
    ref, cand = systems["reference"], systems["candidate"]
    result = {**environment(), "deployment": dep.name, "exact": f"{args.dtype} on {args.device}",
              "requests": len(ids), "max_new_tokens": args.max_new_tokens, "delta": args.delta, "kept": keys,
              "systems": {role: {k: v for k, v in s.to_json().items() if k not in ("margins", "events")}
                          for role, s in systems.items()},
              "candidate_vs_reference": compare(cand, ref), "reference_vs_candidate": compare(ref, cand)}
    write_json_atomic(args.out, result)
    for role, s in systems.items():
        print(f"{role:10} {s.name:24} mismatch {100 * s.mismatch_rate:.2f}% events {s.large_margin_events} "
              f"margins {s.quantiles()}")
    print("candidate worse than reference: p =", {k: result["candidate_vs_reference"][f"{k}_p"]
                                                  for k in ("mismatch", "events", "margins")})


if __name__ == "__main__":
    main()
