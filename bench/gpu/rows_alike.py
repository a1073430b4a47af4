"""Does a row's product depend on how many rows run with it? For SmolLM2's projection shapes, one row through
cuBLAS (F.linear, as AR's step runs it) and 16 rows at a time (stock's verify block) against the same row inside a
prefill-sized product (as the exact target scores it), and the same for the few-row kernel (kernels/fewrow, 1 row
vs 64, on BF16 and on W12): the share of outputs that are the same bits, and the largest difference in bf16 ulps.

Why: token forcing scores a system's tokens under the deployment's exact target in prefill. A reference that runs
cuBLAS at one row may share the scorer's arithmetic bit for bit where a kernel with another order cannot, which
would make the kernel's mismatches look larger than the reference's without any loss (issue 30's ar:weights=w12).

Usage (GPU): PYTHONPATH=. python bench/gpu/rows_alike.py [--rows 400] --out RESULT.json
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from specpilot.results import environment, write_json_atomic

SHAPES = {"q": (576, 576), "kv": (128, 576), "gate_up": (3072, 576), "down": (576, 1536), "head": (49152, 576)}


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance between two bf16 tensors in units in the last place (same-sign values)."""
    ia, ib = a.view(torch.int16).int(), b.view(torch.int16).int()
    return int((ia - ib).abs().max())


def alike(one: torch.Tensor, many: torch.Tensor) -> dict:
    return {"same_bits": float((one.view(torch.int16) == many.view(torch.int16)).float().mean()),
            "max_ulps": ulps(one, many)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=400)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from specpilot.kernels import fewrow

    g = torch.Generator(device="cuda").manual_seed(0)
    rows = {}
    for name, (n, k) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).bfloat16()
        x = torch.randn(args.rows, k, device="cuda", generator=g).bfloat16()
        many = F.linear(x, w)
        one = torch.cat([F.linear(x[i : i + 1], w) for i in range(64)])
        block = torch.cat([F.linear(x[i : i + 16], w) for i in range(0, 64, 16)])  # stock's 16-row verify
        row = {"cublas_1_vs_prefill": alike(one, many[:64]), "cublas_16_vs_prefill": alike(block, many[:64])}
        if fewrow.runs() and fewrow.fits(k) is None:
            for form_name, form in (("bf16", fewrow.FewRowWeight.bf16(w)), ("w12", fewrow.encode_checked(w))):
                f1 = torch.cat([fewrow.product(x[i : i + 1], form) for i in range(64)])
                f64 = fewrow.product(x[:64], form)
                row[f"fewrow_{form_name}_1_vs_64"] = alike(f1, f64)
                row[f"fewrow_{form_name}_1_vs_prefill_cublas"] = alike(f1, many[:64])
        rows[name] = row
    write_json_atomic(args.out, {**environment(), "rows": args.rows, "shapes": SHAPES, "results": rows})
    print(f"{'shape':8} {'comparison':34} {'same bits':>9} {'max ulps':>8}")
    for name, row in rows.items():
        for what, r in row.items():
            print(f"{name:8} {what:34} {100 * r['same_bits']:8.2f}% {r['max_ulps']:8d}")


if __name__ == "__main__":
    main()
