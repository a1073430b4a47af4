"""Phase 0's cost model of a batched step (issue 59): a step of N requests in flight at its floor, beside batched AR's.

Many requests share one read of the weights (the target's, the drafter's, the heads'), while every row's FLOPs,
activations, attention over its own K/V, the drafter's rows and the tree's bookkeeping are per request. So a
speculative step's floor grows with N faster than AR's (R rows a request against one), and past some N its GEMMs
stop being bound by bytes and become bound by FLOPs: there speculation's ceiling over batched AR,
tau x AR's floor / the step's floor, falls towards tau / R. The model says where that happens for the deployment's
shapes at the machine's measured rates; what the loop then measures (BatchEvidence) says how far the engine is from
it.
"""

from __future__ import annotations

import dataclasses

from specpilot.ceiling.floors import Floor, StepShape, drafter_params, floors, layer_params
from specpilot.models.config import DenseConfig, DrafterConfig

COUNTS = (1, 8, 16, 24, 32, 48, 64)


def weight_bytes(target: DenseConfig, drafter: DrafterConfig | None, dtype_bytes: int) -> dict[str, float]:
    """The bytes of each class that a step reads once whatever its rows: the weights (ceiling/floors.floors)."""
    out = {"target_gemm": target.num_layers * layer_params(target) * dtype_bytes,
           "lm_head": target.vocab_size * target.hidden_size * dtype_bytes}
    if drafter is not None:
        out["drafter_gemm"] = sum(drafter_params(drafter).values()) * dtype_bytes
        vocab = getattr(drafter, "draft_vocab", target.vocab_size)  # EAGLE-3's own head is over its draft vocabulary
        out["lm_head"] += vocab * drafter.layer.hidden_size * dtype_bytes
    return out


def batched(single: dict[str, Floor], weights: dict[str, float], n: int) -> dict[str, Floor]:
    """One request's step floors -> those of n requests' step: weights once, everything else n times."""
    return {k: Floor(weights.get(k, 0.0) + n * (f.bytes - weights.get(k, 0.0)), n * f.flops) for k, f in single.items()}


def seconds(fl: dict[str, Floor], bandwidth: float, flop_rate: float) -> float:
    """The step at its floor: each class at the larger of its byte and FLOP times."""
    return sum(f.seconds(bandwidth, flop_rate) for f in fl.values())


def bound(fl: dict[str, Floor], bandwidth: float, flop_rate: float) -> str:
    """What binds the step's weight GEMMs: "bytes" or "flops"."""
    f = fl["target_gemm"]
    return "flops" if f.flops / flop_rate > f.bytes / bandwidth else "bytes"


def batch_model(target: DenseConfig, drafter: DrafterConfig | None, shape: StepShape, tau: float, bandwidth: float,
                flop_rate: float, counts: tuple[int, ...] = COUNTS) -> list[dict]:
    """For each count of requests in flight: batched AR's floor and the system's step floor (shape: one request's
    step, as the ceiling measured it), what binds each, and speculation's ceiling over batched AR there (the
    single-request tau kept: what the rows buy a request does not depend on the others)."""
    b = shape.dtype_bytes
    ar_one = floors(target, None, StepShape(rows=1, context=shape.context, dtype_bytes=b))
    sp_one = floors(target, drafter, shape)
    ar_w, sp_w = weight_bytes(target, None, b), weight_bytes(target, drafter, b)
    rows = []
    for n in counts:
        ar, sp = batched(ar_one, ar_w, n), batched(sp_one, sp_w, n)
        t_ar, t_sp = seconds(ar, bandwidth, flop_rate), seconds(sp, bandwidth, flop_rate)
        rows.append({"in_flight": n, "rows": n * shape.rows, "ar_floor_s": t_ar, "step_floor_s": t_sp,
                     "cost": t_sp / t_ar, "ar_bound": bound(ar, bandwidth, flop_rate),
                     "bound": bound(sp, bandwidth, flop_rate), "speedup_ceiling": tau * t_ar / t_sp})
    return rows


def from_inputs(inputs: dict, system: str, target: DenseConfig, drafter: DrafterConfig | None,
                in_flight: int) -> dict:
    """The model for a system the ceiling measured (its inputs: shape, tau, the machine's rates), at COUNTS up to
    the deployment's concurrency and at it."""
    s = inputs["systems"][system]
    shape = StepShape(**s["shape"])
    counts = tuple(sorted({n for n in COUNTS if n <= max(in_flight, 1)} | {in_flight}))
    rates = inputs["machine"]
    rows = batch_model(target, drafter, shape, inputs["bench"][system]["tau"], rates["bytes_s"], rates["flop_s"],
                       counts)
    at = next(r for r in rows if r["in_flight"] == in_flight)
    return {"in_flight": in_flight, "tau": inputs["bench"][system]["tau"], "shape": dataclasses.asdict(shape),
            "rows": rows, "at": at}
