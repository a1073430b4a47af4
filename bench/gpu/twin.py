"""The deployment-scale twin on one GPU (issue 4): SmolLM2 and its drafter widened in memory.

Needs the staged SmolLM2 under $SPECPILOT_MODELS (bench/gpu/stage_smollm2.py) and a drafter for it
(default: the committed checkpoints/smollm2-dflash).
1. Fidelity: greedy outputs of the twin against SmolLM2 (bf16) on dev requests, free-running (share
   of equal tokens, first divergences) and teacher-forced (per-token argmax agreement along SmolLM2's
   output); the same two readings for SmolLM2 in bf16 against SmolLM2 in float32 say how much of the
   disagreement bf16 rounding alone produces. Stock tau of the widened pair against the small pair's.
2. Cost fidelity: the twin's verify step for 1..192 rows against a random-weight model of its shape.
3. AR on the twin against its weight-pass floor; stock tau and speedup over AR.
4. Last, the fidelity check again in float32 (twin and SmolLM2 free-running, --fp32-tokens per request).
Correctness first, table last, JSON to $OUT/twin.json.

Usage: PYTHONPATH=.:/tmp/site SPECPILOT_MODELS=.models SPECPILOT_DATA_DIR=.stage/data \
       python3 bench/gpu/twin.py [--width 16] [--limit 4] [--max-new 256]
Dry run of the same code here: PYTHONPATH=. python bench/gpu/twin.py --device cpu --width 2 --limit 1 --max-new 16
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
from pathlib import Path

import torch

from bench.gpu.engine_core import bandwidth, step_weight_bytes, verify_ms
from specpilot.bench.fidelity import forced_agreement, free_running
from specpilot.config import parse_system
from specpilot.datasets import load_requests
from specpilot.fixtures.random_models import random_target
from specpilot.models.loading import load_drafter, load_target
from specpilot.models.smollm2 import models_dir
from specpilot.models.tokenizer import HFTokenizer
from specpilot.models.twin import widen_drafter, widen_target
from specpilot.runtime.engine import Engine

AR, STOCK = parse_system("ar"), parse_system("stock")
DATASETS = ("gsm8k", "math500", "humaneval", "mbpp", "mtbench")
ROWS = (1, 16, 32, 64, 128, 192)


def first_turn_prompts(tok, limit: int) -> tuple[list[str], list[list[int]]]:
    pairs = [(d, tok.chat_prompt([{"role": "user", "content": r.turns[0]}]))
             for d in DATASETS for r in load_requests(d, "dev", limit=limit)]
    return [d for d, _ in pairs], [p for _, p in pairs]


def run(engine: Engine, prompts, max_new: int, eos) -> list:
    engine.warmup()
    return [engine.generate_one(p, max_new, eos) for p in prompts]


def tau(gens) -> float:
    per = [sum(g.accepted) / len(g.accepted) for g in gens if g.accepted]
    return sum(per) / len(per)


def speedup(ar, stock) -> float:
    """Geometric mean over requests of per-request decode-rate ratios."""
    ratios = [(a.decode_s / a.decode_tokens) / (s.decode_s / s.decode_tokens)
              for a, s in zip(ar, stock, strict=True) if a.decode_tokens and s.decode_tokens]
    return float(torch.tensor(ratios).log().mean().exp())


def by_dataset(names: list[str], ar, stock) -> dict:
    out = {}
    for d in DATASETS:
        idx = [i for i, n in enumerate(names) if n == d]
        if idx:
            a, s = [ar[i] for i in idx], [stock[i] for i in idx]
            out[d] = {"requests": len(idx), "tau": tau(s), "speedup": speedup(a, s)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--depth", type=int, default=None)
    ap.add_argument("--limit", type=int, default=4, help="dev requests per benchmark")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--drafter", default="checkpoints/smollm2-dflash", help="the small pair's drafter folder")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of every step but the GPU timings "
                    "(e.g. --device cpu --width 2 --limit 1 --max-new 16)")
    ap.add_argument("--fp32-tokens", type=int, default=128, help="last: free-running agreement of the twin and "
                    "SmolLM2 both in float32 over this many tokens per request (0: skip; ~2x the twin's bytes)")
    args = ap.parse_args()
    report = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "commit": os.environ.get("SPECPILOT_COMMIT"), "width": args.width,
              "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu (dry run)",
              "drafter": {"path": args.drafter,
                          **json.loads((Path(args.drafter) / "training.json").read_text())["metrics"]}}
    twin_t, twin_ar = fidelity(report, args)
    if args.device.startswith("cuda"):
        timings(report, twin_t, twin_ar, args.context)
    del twin_t, twin_ar
    write(report)
    if args.fp32_tokens:
        fp32_fidelity(report, args)
        write(report)
    print_table(report)


def write(report: dict) -> None:
    """After each stage, so a later stage running out of time loses only itself."""
    with open(os.path.join(os.environ.get("OUT", "."), "twin.json"), "w") as f:
        json.dump(report, f, indent=1)


def fp32_fidelity(report: dict, args) -> None:
    """The same function in float32, where rounding differences are ~1e-7 and near-ties rarely flip:
    does the widened model reproduce SmolLM2's greedy output free-running?"""
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    folder = models_dir() / "smollm2"
    tok = HFTokenizer(folder)
    _, prompts = first_turn_prompts(tok, args.limit)
    small = load_target(folder, torch.float32, args.device, rope_length=args.context + 1)
    outputs = {}
    for name, model in (("small", small), ("twin", widen_target(small, args.width, args.depth))):
        outputs[name] = [g.tokens for g in run(Engine(model, None, AR, context=args.context), prompts,
                                               args.fp32_tokens, tok.eos_ids)]
        del model
    fid = free_running(outputs["small"], outputs["twin"])
    report["fidelity_fp32"] = {**fid, "max_new_tokens": args.fp32_tokens}
    print(f"[fidelity] float32: twin vs SmolLM2 free-running {100 * fid['token_agreement']:.2f}% tokens equal")


def fidelity(report: dict, args):
    """Correctness first: the small pair and the twin side by side, and the bf16-vs-float32 yardstick."""
    dev, dt, ctx = args.device, torch.bfloat16, args.context
    folder = models_dir() / "smollm2"
    tok = HFTokenizer(folder)
    small_t = load_target(folder, dt, dev, rope_length=ctx + 1)
    small_d = load_drafter(Path(args.drafter), dt, dev, rope_length=ctx + 1)
    twin_t, twin_d = widen_target(small_t, args.width, args.depth), widen_drafter(small_d, args.width, args.depth)
    print(f"[twin] {sum(p.numel() for p in twin_t.parameters()) / 1e9:.2f}B params "
          f"(hidden {twin_t.cfg.hidden_size}, MLP {twin_t.cfg.intermediate_size}, {twin_t.cfg.num_heads} heads)")
    names, prompts = first_turn_prompts(tok, args.limit)

    def gens(target, drafter, system):
        return run(Engine(target, drafter, system, context=ctx), prompts, args.max_new, tok.eos_ids)

    small_ar, small_st = gens(small_t, None, AR), gens(small_t, small_d, STOCK)
    twin_ar, twin_st = gens(twin_t, None, AR), gens(twin_t, twin_d, STOCK)
    outputs = [g.tokens for g in small_ar]
    fid = {**free_running(outputs, [g.tokens for g in twin_ar]),
           "forced": forced_agreement(small_t, twin_t, prompts, outputs)}
    exact_t = load_target(folder, torch.float32, dev, rope_length=ctx + 1)
    exact_out = [g.tokens for g in gens(exact_t, None, AR)]
    noise = {**free_running(exact_out, outputs), "forced": forced_agreement(exact_t, small_t, prompts, exact_out)}
    report.update(requests=len(prompts), fidelity=fid, bf16_vs_fp32_small=noise, small_stock_tau=tau(small_st),
                  twin_stock_tau=tau(twin_st), stock_speedup_geomean=speedup(twin_ar, twin_st),
                  twin_by_dataset=by_dataset(names, twin_ar, twin_st),
                  small_by_dataset=by_dataset(names, small_ar, small_st))
    print(f"[fidelity] twin vs SmolLM2 (bf16): free-running {100 * fid['token_agreement']:.2f}% tokens equal, "
          f"teacher-forced {100 * fid['forced']['token_agreement']:.2f}%; SmolLM2 bf16 vs float32: free-running "
          f"{100 * noise['token_agreement']:.2f}%, teacher-forced {100 * noise['forced']['token_agreement']:.2f}%")
    print(f"[fidelity] stock tau small {report['small_stock_tau']:.3f} twin {report['twin_stock_tau']:.3f}")
    return twin_t, twin_ar


def timings(report: dict, twin_t, twin_ar, context: int) -> None:
    """AR against the weight-pass floor; verify cost of the twin against a random model of its shape."""
    bw = bandwidth()
    ar_ms = [1000 * g.decode_s / g.decode_tokens for g in twin_ar if g.decode_tokens]
    floor = step_weight_bytes(twin_t) / (bw["copy_tb_s"] * 1e12) * 1e3
    report.update(bandwidth=bw, twin_ar_ms_per_token=sum(ar_ms) / len(ar_ms), floor_ms=floor)
    report["verify_ms_twin"] = {n: verify_ms(twin_t, n, context) for n in ROWS}
    shadow = random_target(twin_t.cfg, seed=0, dtype=torch.bfloat16, device="cuda", rope_length=context + 1)
    report["verify_ms_random_same_shape"] = {n: verify_ms(shadow, n, context) for n in ROWS}


def print_table(report: dict) -> None:
    if "twin_ar_ms_per_token" in report:
        ar, floor = report["twin_ar_ms_per_token"], report["floor_ms"]
        print(f"\ntwin AR {ar:.3f} ms/token, floor {floor:.3f} ms ({100 * floor / ar:.1f}%)")
    print(f"stock speedup on the twin {report['stock_speedup_geomean']:.2f}x")
    print("dataset     twin tau  twin speedup  small tau  small speedup")
    for d, t in report["twin_by_dataset"].items():
        sm = report["small_by_dataset"][d]
        print(f"{d:10s}  {t['tau']:8.3f}  {t['speedup']:11.2f}x  {sm['tau']:9.3f}  {sm['speedup']:12.2f}x")
    if "verify_ms_twin" not in report:
        return
    print("rows   twin ms   random ms   diff %")
    for n in ROWS:
        a, b = report["verify_ms_twin"][n], report["verify_ms_random_same_shape"][n]
        print(f"{n:4d}  {a:8.3f}  {b:9.3f}  {100 * (a - b) / b:+6.2f}")


if __name__ == "__main__":
    main()
