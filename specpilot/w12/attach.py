"""`weights=w12`: a loaded target's projections given their W12 form (the few-row kernel reads it for 1..64
rows; kernels/fewrow). Each matrix is encoded once, on its device, and the form the kernel will read (tiled or in
rows) is checked bit for bit with the kernel's own decode (on the GPU; its PyTorch twin on the CPU) before it is
used. A matrix keeps only its dense form, with the reason, when it does not pay (past MAX_BITS, w12/inspect.py),
the kernel cannot take it (its columns), its values are not all BF16 (a float32 matrix of BF16 values, as a BF16
checkpoint loaded on the CPU, is encoded) or its W12 form does not decode to its bits. By default the dense tensor
stays beside every W12 form (prefill's many rows read it, and other systems in the process may too), and the
report calls nothing saved; attach(drop=True) (the option w12_dense=drop) frees the layers' dense copies, and the
report then counts what is held against BF16."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

import torch

from specpilot.errors import UserError
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


def attach(target, progress: Callable[[str], None] = lambda s: None, drop: bool = False) -> dict:
    """Give each projection its W12 form (once: a projection that has one keeps it); the report: per tensor
    what is stored and why, the bytes of the projections in BF16 and as held, and (on a GPU) how much the
    allocator's count changed. drop (w12_dense=drop): each layer's dense copy is freed as soon as its form is
    checked, so the memory never holds both models; the LM head keeps its own (a tied head is the embedding's
    table, which the embedding gathers from; the drafter reads the head too)."""
    if not drop:
        _check_room(target)
    before = _allocated(target)
    rows = []
    for name, dw in projections(target):
        because = None if dw.w12 is not None else _convert(name, dw, progress)
        if drop and name != "lm_head" and dw.w12 is not None and not dw.dense_dropped:
            dw.drop_dense()
        rows.append(_entry(name, dw, because))
    after = _allocated(target)
    return {**memory(rows), "allocated_change_bytes": None if before is None else after - before}


W12_BYTES = 1.5  # per weight: 12 bits (the format's 12.01-12.02 measured, and the encoder's transient, within ROOM)
ROOM = 1.10


def _free_bytes(target) -> int | None:
    """Free device memory (None on the CPU, whose memory the loop does not budget)."""
    if target.device.type != "cuda":
        return None
    return torch.cuda.mem_get_info(target.device)[0]


def _check_room(target) -> None:
    """Refuse (UserError), before any form is made, W12 forms that would not fit beside the BF16 copies they keep:
    on the twin (56 GB in BF16, 80-GB H100) they need 42 GB more, and a survey that tried would leave the target
    half-converted and the device full."""
    free = _free_bytes(target)
    if free is None:
        return
    need = sum(dw.weight.numel() for _, dw in projections(target) if dw.w12 is None) * W12_BYTES
    if need * ROOM > free:
        raise UserError(f"the W12 forms of this target need about {need / 1e9:.1f} GB beside its BF16 copies and "
                        f"{free / 1e9:.1f} GB are free: run weights=w12 with w12_dense=drop (in a process of its "
                        "own), or on a larger device")


def _allocated(target) -> int | None:
    """The CUDA allocator's count of bytes in tensors (None on the CPU): a freed copy that something else still
    references does not leave it, which the byte counts of the report cannot show."""
    if target.device.type != "cuda":
        return None
    torch.cuda.synchronize(target.device)
    return torch.cuda.memory_allocated(target.device)


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


def claim(target, engine, drops: bool) -> None:
    """Engines on one target agree on its dense copies: one with w12_dense=drop frees copies that any other
    system would read (slowly, decoding each call, which would time it wrongly), so the two never share a
    process. Refused with a UserError naming the other system."""
    users = target.__dict__.setdefault("_dense_users", weakref.WeakKeyDictionary())  # engine -> it drops

    def clash() -> str | None:
        if drops:
            keep = sorted({e.system.name for e, d in users.items() if not d})
            return f"system(s) {', '.join(keep)} read the BF16 copies it would free" if keep else None
        if any(dw.dense_dropped for _, dw in projections(target)):
            return "an earlier system with w12_dense=drop or fp8_dense=drop freed the BF16 copies it reads"
        return None

    why = clash()
    if why and drops:
        gc.collect()  # engines dropped by their owner but still in reference cycles
        why = clash()
    if why:
        raise UserError(f"system {engine.system.name!r}: {why} in this process; run the systems with "
                        "w12_dense=drop in a process of their own (a separate specpilot command)")
    users[engine] = drops


def _entry(name: str, dw: DenseWeight, because: str | None) -> dict:
    rows, cols = dw.shape
    dense = 0 if dw.dense_dropped else dw.weight.numel() * dw.weight.element_size()
    entry = {"name": name, "shape": [rows, cols], "bf16_bytes": 2 * rows * cols, "dense_bytes": dense}
    if dw.w12 is None:
        return {**entry, "stored": "bf16", "w12_bytes": 0, "bf16_because": because}
    return {**entry, "stored": "w12", "w12_bytes": dw.w12.bytes, "bits_per_weight": dw.w12.w12.bits_per_weight,
            "escapes": dw.w12.w12.escapes}


def memory(rows: list[dict]) -> dict:
    """The projections' bytes: in BF16, of the W12 forms, and held (the W12 forms and the dense copies kept).
    While no dense copy was dropped nothing is `saved` (None): the W12 forms add to the memory; once some are,
    `saved` is 1 - held / BF16 (what a dense copy kept beside its W12 form costs counted against it)."""
    bf16 = sum(r["bf16_bytes"] for r in rows)
    w12 = sum(r["w12_bytes"] for r in rows)
    held = sum(r["dense_bytes"] for r in rows) + w12
    dropped = [r["name"] for r in rows if r["stored"] == "w12" and r["dense_bytes"] == 0]
    kept = [r["name"] for r in rows if r["stored"] == "w12" and r["dense_bytes"]]
    copy = "kept (prefill reads it)" if not dropped else (
        f"dropped for {len(dropped)} of {len(dropped) + len(kept)} W12 forms (rows past the few-row kernel decode "
        f"them per call{'; kept: ' + ', '.join(kept) if kept else ''})")
    return {"tensors": rows, "bf16_bytes": bf16, "w12_bytes": w12, "held_bytes": held, "dense_copy": copy,
            "saved": 1 - held / bf16 if dropped and bf16 else None,
            "kept_bf16": {r["name"]: r["bf16_because"] for r in rows if r["stored"] == "bf16"}}


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
