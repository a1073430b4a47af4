"""`weights=w12`: a loaded target's projections given their W12 form (the few-row kernel reads it for 1..64
rows; kernels/fewrow). Each matrix is encoded once, on its device, and checked bit for bit with the kernel's
own decode (on the GPU; its PyTorch twin on the CPU) before it is used; a matrix stays BF16 when it does not
pay (past MAX_BITS, w12/inspect.py), the kernel cannot take it (its columns) or its values are not all BF16
(a float32 matrix of BF16 values, as a BF16 checkpoint loaded on the CPU, is encoded) or its W12 form (the one
the kernel reads, tiled or in rows) does not decode to its bits, with the reason. The BF16
tensor stays beside it in this version: prefill's many rows read it, and other systems in the process may too."""

from __future__ import annotations

from collections.abc import Callable

import torch

from specpilot.kernels import fewrow
from specpilot.w12.inspect import MAX_BITS
from specpilot.weights.dense import DenseWeight


def projections(target) -> list[tuple[str, DenseWeight]]:
    """The target's projection weights by name: every layer's, and the LM head (the embedding when tied)."""
    found = [(name, m) for name, m in target.named_modules() if isinstance(m, DenseWeight) and name != "embed"]
    return [*found, ("lm_head", target.head)]


def as_bf16(w: torch.Tensor) -> torch.Tensor | None:
    """w in BF16 when that holds every value exactly (a BF16 checkpoint loaded in float32 on the CPU), else None."""
    if w.dtype == torch.bfloat16:
        return w
    b = w.to(torch.bfloat16)
    return b if w.dtype in (torch.float32, torch.float64) and torch.equal(b.to(w.dtype), w) else None


def attach(target, progress: Callable[[str], None] = lambda s: None) -> dict:
    """Give each projection its W12 form (once: a projection that has one keeps it); the report: per tensor
    what is stored and why, and the bytes of the projections in BF16 and as stored."""
    rows = []
    for name, dw in projections(target):
        entry = {"name": name, "shape": list(dw.weight.shape), "bf16_bytes": 2 * dw.weight.numel()}
        because = None
        if dw.w12 is None:  # a projection that has its form is not converted again
            w = as_bf16(dw.weight.detach())
            because = f"{dw.weight.dtype} values that BF16 does not hold" if w is None else fewrow.fits(w.shape[1])
        if because is None and dw.w12 is None:
            progress(name)
            try:
                few = fewrow.encode_checked(w, dw.bias)
                if few.w12.bits_per_weight > MAX_BITS:
                    because = f"{few.w12.bits_per_weight:.2f} bits per weight"
                else:
                    dw.w12 = few
            except fewrow.DecodeMismatch as exc:  # a fault in the format or the kernel's decode: it stays exact
                because = str(exc)
        if dw.w12 is not None:
            entry.update(stored="w12", bytes=dw.w12.bytes, bits_per_weight=dw.w12.w12.bits_per_weight,
                         escapes=dw.w12.w12.escapes)
        else:
            entry.update(stored="bf16", bytes=entry["bf16_bytes"], bf16_because=because)
        rows.append(entry)
    bf16 = sum(r["bf16_bytes"] for r in rows)
    stored = sum(r["bytes"] for r in rows)
    return {"tensors": rows, "bf16_bytes": bf16, "stored_bytes": stored, "saved": 1 - stored / bf16 if bf16 else 0.0,
            "kept_bf16": {r["name"]: r["bf16_because"] for r in rows if r["stored"] == "bf16"}}
