"""`weights=w12`: a loaded target's projections given their W12 form (the few-row kernel reads it for 1..64
rows; kernels/fewrow). Each matrix is encoded once, on its device, and the form the kernel will read (tiled or in
rows) is checked bit for bit with the kernel's own decode (on the GPU; its PyTorch twin on the CPU) before it is
used. A matrix keeps only its dense form, with the reason, when it does not pay (past MAX_BITS, w12/inspect.py),
the kernel cannot take it (its columns), its values are not all BF16 (a float32 matrix of BF16 values, as a BF16
checkpoint loaded on the CPU, is encoded) or its W12 form does not decode to its bits. The dense tensor stays
beside every W12 form in this version (prefill's many rows read it, and other systems in the process may too):
the report counts the bytes held, dense copies included, and calls none of them saved."""

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
    what is stored and why, and the bytes of the projections in BF16 and as held."""
    rows = []
    for name, dw in projections(target):
        because = None if dw.w12 is not None else _convert(name, dw, progress)
        rows.append(_entry(name, dw, because))
    return memory(rows)


def _convert(name: str, dw: DenseWeight, progress: Callable[[str], None]) -> str | None:
    """Give dw its checked W12 form; None when it has one, else why it stays in its own precision."""
    w = as_bf16(dw.weight.detach())
    if w is None:
        return f"{str(dw.weight.dtype).removeprefix('torch.')} values that BF16 does not hold"
    if fewrow.fits(w.shape[1]):
        return fewrow.fits(w.shape[1])
    progress(name)
    try:
        few = fewrow.encode_checked(w, dw.bias)
    except fewrow.DecodeMismatch as exc:  # a fault in the format or the kernel's decode: this tensor stays exact
        return str(exc)
    if few.w12.bits_per_weight > MAX_BITS:
        return f"{few.w12.bits_per_weight:.2f} bits per weight"
    dw.w12 = few
    return None


def _entry(name: str, dw: DenseWeight, because: str | None) -> dict:
    w = dw.weight
    entry = {"name": name, "shape": list(w.shape), "bf16_bytes": 2 * w.numel(),
             "dense_bytes": w.numel() * w.element_size()}  # the dense copy every projection keeps
    if dw.w12 is None:
        return {**entry, "stored": "bf16", "w12_bytes": 0, "bf16_because": because}
    return {**entry, "stored": "w12", "w12_bytes": dw.w12.bytes, "bits_per_weight": dw.w12.w12.bits_per_weight,
            "escapes": dw.w12.w12.escapes}


def memory(rows: list[dict]) -> dict:
    """The projections' bytes: in BF16, of the W12 forms, and held (the W12 forms and every dense copy, which
    this version keeps). Nothing is `saved` (None) while the dense copies stay: the W12 forms add to the memory."""
    bf16 = sum(r["bf16_bytes"] for r in rows)
    w12 = sum(r["w12_bytes"] for r in rows)
    return {"tensors": rows, "bf16_bytes": bf16, "w12_bytes": w12,
            "held_bytes": sum(r["dense_bytes"] for r in rows) + w12, "dense_copy": "kept (prefill reads it)",
            "saved": None, "kept_bf16": {r["name"]: r["bf16_because"] for r in rows if r["stored"] == "bf16"}}


def off_kernel(target, plan, kept: dict[str, str]) -> dict[str, str]:
    """The target's projections whose 1..64-row products the plan sends to the few-row kernel but that take the
    dense path (DenseWeight.fewrow_weight's choice), with why: {name: reason}."""
    out = {}
    for name, dw in projections(target):
        if plan.weights == "w12" and dw.w12 is not None:
            continue
        why = kept.get(name) if plan.weights == "w12" else None
        if plan.fewrow:
            bf16 = dw.weight.dtype == torch.bfloat16
            dense = fewrow.fits(dw.shape[1]) if bf16 else f"{str(dw.weight.dtype).removeprefix('torch.')} weights"
            if dense is None:
                continue
            why = why or dense
        out[name] = why or "no W12 form"
    return out
