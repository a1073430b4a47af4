"""`weights=fp8` at engine build: the target's layer projections given their FP8 forms (weights/fp8.py says what
they are and how their products run), the dense copies kept or freed (fp8_dense), and the bytes held."""

from __future__ import annotations

import torch

from specpilot.errors import UserError
from specpilot.weights.dense import DenseWeight
from specpilot.weights.fp8 import Fp8Weight, scaled_mm_runs


def weight_bytes(dw) -> dict:
    """A DenseWeight's bytes per weight: its dense copy as held (0 once dropped), its FP8 form (q and scales),
    and the two together."""
    n, k = dw.shape
    dense = 0 if dw.dense_dropped else dw.weight.numel() * dw.weight.element_size()
    fp8 = dw.fp8.bytes if dw.fp8 is not None else 0
    return {"dense": dense / (n * k), "fp8": fp8 / (n * k), "held": (dense + fp8) / (n * k)}


def layer_projections(target) -> list:
    """The target's layer projections by name (every DenseWeight but the embedding; the LM head is no module)."""
    return [(name, m) for name, m in target.named_modules() if isinstance(m, DenseWeight) and name != "embed"]


ROOM = 1.10


def attach(target, drop: bool = False) -> dict:
    """Give each layer projection its FP8 form (once: one that has it keeps it); drop (fp8_dense=drop): free each
    dense copy as soon as its form is made, so the memory never holds both models. The report: per tensor its
    shape and bytes, the totals (BF16, FP8, held), bytes per weight held, and which weights take the reference
    on a GPU that runs _scaled_mm (N or K not a multiple of 16)."""
    found = layer_projections(target)
    if not drop and target.device.type == "cuda":
        free = torch.cuda.mem_get_info(target.device)[0]
        need = sum(dw.shape[0] * dw.shape[1] for _, dw in found if dw.fp8 is None)
        if need * ROOM > free:
            raise UserError(f"the FP8 forms of this target need about {need / 1e9:.1f} GB beside its BF16 copies and "
                            f"{free / 1e9:.1f} GB are free: run weights=fp8 with fp8_dense=drop (in a process of its "
                            "own), or on a larger device")
    rows = []
    for name, dw in found:
        if dw.fp8 is None:
            dw.fp8 = Fp8Weight.of(dw.weight)
        if drop and not dw.dense_dropped:
            dw.drop_dense()
        n, k = dw.shape
        dense = 0 if dw.dense_dropped else dw.weight.numel() * dw.weight.element_size()
        rows.append({"name": name, "shape": [n, k], "bf16_bytes": 2 * n * k, "dense_bytes": dense,
                     "fp8_bytes": dw.fp8.bytes, "scaled_mm": dw.fp8.fast})
    bf16 = sum(r["bf16_bytes"] for r in rows)
    fp8 = sum(r["fp8_bytes"] for r in rows)
    held = fp8 + sum(r["dense_bytes"] for r in rows)
    weights = sum(r["shape"][0] * r["shape"][1] for r in rows)
    dropped = rows and all(r["dense_bytes"] == 0 for r in rows)
    return {"tensors": rows, "bf16_bytes": bf16, "fp8_bytes": fp8, "held_bytes": held,
            "held_bytes_per_weight": held / weights if weights else None,
            "dense_copy": "dropped (the layers' FP8 forms replace them)" if dropped else "kept beside the FP8 forms",
            "saved": 1 - held / bf16 if dropped and bf16 else None,
            # where _scaled_mm runs, the weights whose shapes it does not take (None: it runs nowhere here)
            "reference_only": ([r["name"] for r in rows if not r["scaled_mm"]]
                               if scaled_mm_runs(target.device, target.embed.weight.dtype) is None else None)}
