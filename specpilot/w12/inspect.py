"""`specpilot w12 inspect`: what a model's weight matrices cost in W12, each one encoded, decoded with the
production routine and compared bit for bit with its BF16 original.

A matrix that does not pay stays BF16, with the reason: one whose escapes would push it past MAX_BITS per weight
(the escape lists are read beside the planes; past about 2% escapes they cost more than the planes save and slow
every kernel that patches them)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from specpilot.w12.format import decode, encode

MAX_BITS = 13.0


def inspect_matrix(name: str, w: torch.Tensor) -> dict:
    w = w.detach().to(torch.bfloat16)
    f = encode(w)
    exact = torch.equal(decode(f).view(torch.int16), w.view(torch.int16))
    bits = f.bits_per_weight
    kept = None if bits <= MAX_BITS else f"{bits:.2f} bits per weight (escapes {100 * f.escapes / w.numel():.2f}%)"
    return {"name": name, "shape": list(w.shape), "weights": w.numel(), "bits_per_weight": bits,
            "escapes": f.escapes, "escape_rate": f.escapes / w.numel(), "bit_exact": exact,
            "stored": "w12" if kept is None else "bf16", "bf16_because": kept,
            "bytes": f.bytes if kept is None else 2 * w.numel()}


def inspect_model(model: torch.nn.Module, progress: Callable[[str], None] = lambda s: None) -> dict:
    """Every 2-D parameter of the model (its projections, embedding and head), once each (a tied head shares the
    embedding's tensor)."""
    rows, seen = [], set()
    for name, p in model.named_parameters():
        if p.dim() != 2 or id(p) in seen:
            continue
        seen.add(id(p))
        progress(name)
        rows.append(inspect_matrix(name, p))
    weights = sum(r["weights"] for r in rows)
    stored = sum(r["bytes"] for r in rows)
    return {"tensors": rows, "weights": weights, "bf16_bytes": 2 * weights, "w12_bytes": stored,
            "bits_per_weight": 8 * stored / weights if weights else None,
            "saved": 1 - stored / (2 * weights) if weights else None,
            "bit_exact": all(r["bit_exact"] for r in rows),
            "kept_bf16": [r["name"] for r in rows if r["stored"] == "bf16"]}
