"""How much do SmolLM2's greedy outputs move when only the rounding changes (bf16 against float32)?

The yardstick for the twin's fidelity (issue 4): a widened model computes the same function with
different rounding, so its disagreement with SmolLM2 should be of the size bf16 rounding alone causes.
Free-running and teacher-forced agreement (specpilot/bench/fidelity.py), first turns of dev requests.
Runs on the CPU or a GPU: PYTHONPATH=. python bench/precision_noise.py [--limit 4] [--max-new 256] --out F
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess

import torch
from rich.progress import track

from specpilot.bench.fidelity import forced_agreement, free_running
from specpilot.config import parse_system
from specpilot.datasets import load_requests
from specpilot.models.loading import load_target
from specpilot.models.smollm2 import fetch_smollm2
from specpilot.models.tokenizer import HFTokenizer
from specpilot.runtime.engine import Engine

DATASETS = ("gsm8k", "math500", "humaneval", "mbpp", "mtbench")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=4, help="dev requests per benchmark")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    folder = fetch_smollm2()
    tok = HFTokenizer(folder)
    prompts = [tok.chat_prompt([{"role": "user", "content": r.turns[0]}])
               for d in DATASETS for r in load_requests(d, "dev", limit=args.limit)]
    context = max(map(len, prompts)) + args.max_new + 1
    outputs = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        target = load_target(folder, dtype, dev, rope_length=context + 1)
        engine = Engine(target, None, parse_system("ar"), context=context)
        outputs[name] = (target, [engine.generate_one(p, args.max_new, tok.eos_ids).tokens
                                  for p in track(prompts, description=f"greedy {name}")])
    (exact, ref), (rounded, out) = outputs["float32"], outputs["bfloat16"]
    report = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "commit": os.environ.get("SPECPILOT_COMMIT") or subprocess.run(
                  ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
              "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "requests": len(prompts),
              "max_new_tokens": args.max_new, "command": "python bench/precision_noise.py "
              f"--limit {args.limit} --max-new {args.max_new}",
              "free_running": free_running(ref, out), "forced": forced_agreement(exact, rounded, prompts, ref)}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    free = report["free_running"]["token_agreement"]
    print(f"bf16 vs float32 on {len(prompts)} requests: free-running {100 * free:.2f}% tokens equal"
          f", teacher-forced {100 * report['forced']['token_agreement']:.2f}%")


if __name__ == "__main__":
    main()
