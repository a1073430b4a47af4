"""`specpilot w12 inspect`: what a model's weight matrices cost in W12, each one encoded, decoded with the
production routine and compared bit for bit with the weights as stored.

W12 holds BF16 weights exactly. A matrix stored in another dtype (a float32 checkpoint) is encoded as its BF16
rounding: it is bit-exact only when that rounding changes none of its values, and the model is bit-exact only
when no stored weight would change.

A matrix that does not pay stays in its own precision, with the reason: one whose escapes would push it past
MAX_BITS per weight (the escape lists are read beside the planes; past about 2% escapes they cost more than the
planes save and slow every kernel that patches them)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from specpilot.errors import UserError
from specpilot.w12.format import decode, encode

MAX_BITS = 13.0
_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def changed(stored: torch.Tensor, back: torch.Tensor) -> int:
    """How many of `stored`'s values `back` (in the same dtype) does not give bit for bit."""
    ints = _SAME_SIZE_INT[stored.element_size()]
    return int((stored.contiguous().view(ints) != back.contiguous().view(ints)).sum())


def inspect_matrix(name: str, w: torch.Tensor) -> dict:
    w = w.detach()
    dtype = "bf16" if w.dtype == torch.bfloat16 else str(w.dtype).removeprefix("torch.")
    if not w.is_floating_point():
        raise UserError(f"{name} is {dtype}: W12 stores floating-point weights")
    b = w.to(torch.bfloat16)  # what W12 stores: the weights themselves when BF16, else their BF16 rounding
    f = encode(b)
    back = decode(f)
    bits = f.bits_per_weight
    kept = None if bits <= MAX_BITS else f"{bits:.2f} bits per weight (escapes {100 * f.escapes / w.numel():.2f}%)"
    faults, lost = changed(b, back), changed(w, back.to(w.dtype))  # the format's round trip; the stored values
    inexact = None
    if faults:  # the format itself (kept or not): always reported
        inexact = f"{faults:,} weights do not decode to their bf16 bits"
    elif kept is None and lost:  # a matrix kept in its own precision changes nothing
        inexact = f"{dtype}: W12 stores its bf16 rounding ({lost:,} of {w.numel():,} weights change)"
    own = w.numel() * w.element_size()
    return {"name": name, "shape": list(w.shape), "dtype": dtype, "weights": w.numel(), "bits_per_weight": bits,
            "escapes": f.escapes, "escape_rate": f.escapes / w.numel(), "bit_exact": inexact is None,
            "inexact_because": inexact, "stored": "w12" if kept is None else dtype, "kept_because": kept,
            "stored_bytes": own, "bytes": f.bytes if kept is None else own}


def inspect_model(model: torch.nn.Module, progress: Callable[[str], None] = lambda s: None) -> dict:
    """Every 2-D parameter of the model (its projections, embedding and head), once each (a tied head shares the
    embedding's tensor), at the dtype it holds it in."""
    rows, seen = [], set()
    for name, p in model.named_parameters():
        if p.dim() != 2 or id(p) in seen:
            continue
        seen.add(id(p))
        progress(name)
        rows.append(inspect_matrix(name, p))
    weights = sum(r["weights"] for r in rows)
    stored = sum(r["bytes"] for r in rows)
    return {"tensors": rows, "weights": weights, "dtypes": sorted({r["dtype"] for r in rows}),
            "stored_bytes": sum(r["stored_bytes"] for r in rows), "bf16_bytes": 2 * weights, "w12_bytes": stored,
            "bits_per_weight": 8 * stored / weights if weights else None,
            "saved": 1 - stored / (2 * weights) if weights else None,
            "bit_exact": all(r["bit_exact"] for r in rows),
            "not_exact": {r["name"]: r["inexact_because"] for r in rows if not r["bit_exact"]},
            "kept": {r["name"]: r["stored"] for r in rows if r["stored"] != "w12"}}
