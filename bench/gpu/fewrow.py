"""Few-row products on one GPU (issue 30): W12 and BF16 through the tensor-core kernel (kernels/fewrow) against
cuBLAS BF16 (F.linear) and, at one row, our Triton streaming GEMV, on the 13 projection matrices of a
Qwen3.5-27B-class hybrid and the 27B twin's, at 1, 16, 32 and 64 rows.

1. Correctness first, on every shape: the W12 planes decoded by the kernel's routine give the weight's bits
   (escapes aside, which hold theirs); each product at every row count within bf16 rounding of the float32
   reference; a row's result the same bits at 1, 16, 32 and 64 rows (batch invariance), on a second run and
   in every layout of SWEEP.
2. Timing: each product captured in a CUDA graph over rotating weight copies (more than 3x the L2 in all), the
   graph replayed; time per product = replay time / copies, median of REPEATS replays. W12 in its tiled
   layout (w12/format.tile) and, as `w12rows`, with its planes in rows; the layouts and K splits of SWEEP
   beside. TB/s = the bytes the format stores / time, against the read ceiling measured here (torch.sum over
   4 GiB).
3. A table, and JSON under --out.

Usage (repository root): SPECPILOT_COMMIT=<sha> PYTHONPATH=. python bench/gpu/fewrow.py [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F

from specpilot.config.plan import KernelPlan
from specpilot.kernels import fewrow
from specpilot.results import environment
from specpilot.w12.format import untile

ROWS = (1, 16, 32, 64)
# (row tiles, (TILES, AHEAD, X_AHEAD)) timed beside the default (kernels/fewrow.layout_for); the same arithmetic
SWEEP = [(1, (1, 1, 1)), (1, (1, 2, 0)), (1, (2, 1, 0)), (1, (1, 1, 2)), (2, (2, 1, 0)), (4, (2, 1, 0)),
         (8, (2, 1, 0)), (2, (1, 1, 2)), (2, (2, 1, 2)), (4, (1, 1, 2)), (4, (2, 1, 2)), (8, (1, 1, 2)),
         (8, (2, 1, 2))]
REPEATS = 15
L2_MULTIPLE = 3
# (name, in K, out N). Qwen3.5-27B: hidden 5120, 48 GDN layers (16 QK / 48 V heads of 128) and 16 attention
# layers (24 Q / 4 KV heads of 256, output gate), intermediate 17408, vocab 248320 (shared/research/w12-gdn.md).
HYBRID = [("gdn.in_proj_qkv", 5120, 10240), ("gdn.in_proj_z", 5120, 6144), ("gdn.in_proj_a", 5120, 48),
          ("gdn.in_proj_b", 5120, 48), ("gdn.out_proj", 6144, 5120), ("attn.q_gate", 5120, 12288),
          ("attn.k", 5120, 1024), ("attn.v", 5120, 1024), ("attn.o", 6144, 5120), ("mlp.gate", 5120, 17408),
          ("mlp.up", 5120, 17408), ("mlp.down", 17408, 5120), ("lm_head", 5120, 248320)]
# The twin (bench/gpu/shapes.py dense-27b): fused q/k/v, o, fused gate/up, down, head.
TWIN = [("twin.wqkv", 5120, 7168), ("twin.wo", 5120, 5120), ("twin.w13", 5120, 43008), ("twin.w2", 21504, 5120),
        ("twin.lm_head", 5120, 151936)]


def weights_like(n: int, k: int, seed: int) -> torch.Tensor:
    """A trained projection's statistics, roughly: normal with std 0.02, a few outliers and zeros."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, device="cuda", generator=g) * 0.02
    w.view(-1)[torch.randint(0, n * k, (max(1, n * k // 10000),), device="cuda", generator=g)] *= 40
    w.view(-1)[torch.randint(0, n * k, (max(1, n * k // 100000),), device="cuda", generator=g)] = 0
    return w.to(torch.bfloat16)


def read_ceiling() -> float:
    a = torch.empty(1 << 31, dtype=torch.bfloat16, device="cuda").normal_()
    ms = graph_ms(lambda: a.sum(dtype=torch.float32), 1)
    return (1 << 32) / ms / 1e9


def graph_ms(fn, copies: int) -> float:
    """fn() captured once per copy index into one graph (fn takes no argument: the caller rotates), replayed."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / copies)
    return statistics.median(times)


def rotating(make, bytes_each: int, l2: int) -> list:
    return [make(i) for i in range(max(2, math.ceil(L2_MULTIPLE * l2 / bytes_each)))]


def time_impl(call, weights: list) -> float:
    """Median ms of one product, the graph running `call(w)` once for every copy in turn."""
    return graph_ms(lambda: [call(w) for w in weights], len(weights))


def check_shape(name: str, w: torch.Tensor, x: dict, w12: fewrow.FewRowWeight, bf: fewrow.FewRowWeight) -> dict:
    ok_decode = fewrow.check_w12(w12.w12, w, on_device=True)
    worst, invariant, repeat, same = 0.0, True, True, True
    outs = {}
    for fmt, fw in (("w12", w12), ("bf16", bf)):
        for m in ROWS:
            y = fewrow.product(x[m], fw)
            ref = fewrow.reference(x[m], bf)
            scale = ref.float().abs().max().item() or 1.0
            worst = max(worst, (y.float() - ref.float()).abs().max().item() / scale)
            repeat &= torch.equal(y, fewrow.product(x[m], fw))
            same &= all(torch.equal(y, fewrow.product(x[m], fw, layout=lo)) for mt, lo in SWEEP
                        if mt == fewrow.m_tiles(m))
            outs[fmt, m] = y
        invariant &= all(torch.equal(outs[fmt, m], outs[fmt, 64][:m]) for m in ROWS)
    return {"decode_exact": ok_decode, "max_rel_err": worst, "batch_invariant": invariant, "deterministic": repeat,
            "layouts_agree": same, "escapes": w12.w12.escapes, "bits_per_weight": w12.w12.bits_per_weight}


def bench_shape(name: str, k: int, n: int, l2: int, quick: bool) -> dict:
    w = weights_like(n, k, seed=n * 7 + k)
    x64 = torch.randn(max(ROWS), k, device="cuda").to(torch.bfloat16)
    x = {m: x64[:m] for m in ROWS}  # the same first rows at every row count
    w12 = fewrow.encode_checked(w)
    bf = fewrow.FewRowWeight.bf16(w)
    row = {"name": name, "k": k, "n": n, "bf16_bytes": 2 * n * k, "w12_bytes": w12.bytes,
           "check": check_shape(name, w, x, w12, bf)}
    bf_copies = rotating(lambda i: w.clone() if i else w, 2 * n * k, l2)
    w12_copies = rotating(lambda i: fewrow.encode_checked(w) if i else w12, w12.bytes, l2)
    rows_copies = [fewrow.FewRowWeight.of_w12(untile(c.w12)) for c in w12_copies]  # the planes in rows
    fb_copies = [fewrow.FewRowWeight.bf16(c) for c in bf_copies]
    plan = KernelPlan.stock(gemv=True)
    from specpilot.kernels.gemv.triton import gemv_triton

    times = {}
    for m in ROWS if not quick else (1, 32):
        xm = x[m]
        times[f"cublas_{m}"] = time_impl(lambda c, xm=xm: F.linear(xm, c), bf_copies)
        times[f"bf16_{m}"] = time_impl(lambda c, xm=xm: fewrow.product(xm, c), fb_copies)
        times[f"w12_{m}"] = time_impl(lambda c, xm=xm: fewrow.product(xm, c), w12_copies)
        times[f"w12rows_{m}"] = time_impl(lambda c, xm=xm: fewrow.product(xm, c), rows_copies)
        if m == 1:
            times["triton_1"] = time_impl(lambda c, xm=xm: gemv_triton(xm, c, plan=plan), bf_copies)
        for mt, layout in SWEEP:
            if mt != fewrow.m_tiles(m):
                continue
            for fmt, copies in (("w12", w12_copies), ("bf16", fb_copies)):
                times[f"{fmt}_{m}_t{layout[0]}a{layout[1]}x{layout[2]}"] = time_impl(
                    lambda c, xm=xm, lo=layout: fewrow.product(xm, c, layout=lo), copies)
        default = fewrow.split_for(n, k, torch.cuda.get_device_properties(0).multi_processor_count)
        for split in sorted({1, max(1, default // 2), default * 2} - {default}):
            for fmt, copies in (("w12", w12_copies), ("bf16", fb_copies)):
                times[f"{fmt}_{m}_split{split}"] = time_impl(
                    lambda c, xm=xm, sp=split: fewrow.product(xm, c, split=sp), copies)
    row["us"] = {key: 1000 * v for key, v in times.items()}
    del bf_copies, w12_copies, fb_copies, rows_copies
    torch.cuda.empty_cache()
    return row


def table(rows: list, ceiling: float) -> str:
    lines = [f"read ceiling {ceiling:.2f} TB/s; us per product (TB/s of the format's bytes); x = speed-up",
             f"{'shape':18} {'K->N':>13} {'rows':>4} {'cuBLAS':>14} {'Triton':>14} {'BF16 frag':>14} "
             f"{'W12':>14} {'W12/cuBLAS':>10} {'W12/ours':>8}"]
    for r in rows:
        for m in ROWS:
            us = r["us"]
            if f"w12_{m}" not in us:
                continue
            def cell(key, nbytes, us=us):
                return f"{us[key]:7.1f} ({nbytes / us[key] / 1e6:4.2f})" if key in us else " " * 14
            ours = us["triton_1"] if m == 1 else us[f"bf16_{m}"]
            ours = min(ours, us[f"bf16_{m}"])
            best_w12 = us[f"w12_{m}"]
            lines.append(f"{r['name']:18} {r['k']:>6}->{r['n']:<6} {m:>4} {cell(f'cublas_{m}', r['bf16_bytes'])} "
                         f"{cell('triton_1' if m == 1 else 'none', r['bf16_bytes'])} "
                         f"{cell(f'bf16_{m}', r['bf16_bytes'])} {cell(f'w12_{m}', r['w12_bytes'])} "
                         f"{us[f'cublas_{m}'] / best_w12:9.2f}x {ours / best_w12:7.2f}x")
    lines.append("best variant per format (key: fmt_rows[_tTILESaAHEADxX_AHEAD | _splitS]; w12rows: planes in rows)")
    for r in rows:
        for m in ROWS:
            for fmt in ("w12", "bf16"):
                keys = [key for key in r["us"] if key == f"{fmt}_{m}" or key.startswith(f"{fmt}_{m}_")
                        or (fmt == "w12" and key == f"w12rows_{m}")]
                if keys:
                    best = min(keys, key=r["us"].get)
                    lines.append(f"  {r['name']:18} {m:>3} {fmt:5} default {r['us'][f'{fmt}_{m}']:7.1f}  "
                                 f"best {best} {r['us'][best]:7.1f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="three shapes, 1 and 32 rows (a smoke run)")
    ap.add_argument("--shapes", default="", help="comma-separated shape names (default: all)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    shapes = HYBRID + TWIN
    if args.shapes:
        shapes = [s for s in shapes if s[0] in args.shapes.split(",")]
    if args.quick:
        shapes = [s for s in shapes if s[0] in ("attn.k", "mlp.down", "gdn.in_proj_qkv")]
    ceiling = read_ceiling()
    layouts = sorted(set(fewrow.LAYOUT.items()) | set(SWEEP))
    occupancy = {f"{'w12' if w12 else 'bf16'}_m{mt}_t{lo[0]}a{lo[1]}x{lo[2]}":
                 fewrow.blocks_per_sm(0, w12, mt, lo) for w12 in (True, False) for mt, lo in layouts}
    print("blocks per SM:", occupancy, flush=True)
    rows = []
    for name, k, n in shapes:
        rows.append(bench_shape(name, k, n, l2, args.quick))
        c = rows[-1]["check"]
        print(f"{name}: decode exact {c['decode_exact']}, rel err {c['max_rel_err']:.2e}, invariant "
              f"{c['batch_invariant']}, deterministic {c['deterministic']}, layouts agree {c['layouts_agree']}, "
              f"{c['bits_per_weight']:.3f} bits",
              flush=True)
    ok = all(r["check"]["decode_exact"] and r["check"]["batch_invariant"] and r["check"]["deterministic"]
             and r["check"]["layouts_agree"] and r["check"]["max_rel_err"] < 2e-2 for r in rows)
    result = {**environment(), "gpu": torch.cuda.get_device_name(), "read_ceiling_tb_s": ceiling, "rows": list(ROWS),
              "layout": {str(k): v for k, v in fewrow.LAYOUT.items()}, "sweep": SWEEP,
              "l2_bytes": l2, "l2_multiple": L2_MULTIPLE,
              "repeats": REPEATS, "blocks_per_sm": occupancy, "correct": ok, "shapes": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fewrow.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(table(rows, ceiling))
    print("correct:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
