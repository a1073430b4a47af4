"""Projections of the target, optionally fused with the norm before them, SwiGLU's activation and the
residual add after them. cuBLAS (with the separate norm / activation kernels) by default; with
`enabled`, few-row products go through the weight-streaming Triton GEMV that fuses them all."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specpilot.kernels.dispatch import env_switch, use_triton
from specpilot.kernels.norm import rms_norm
from specpilot.kernels.swiglu import silu_mul

MAX_ROWS = 4  # beyond a few rows the product is no longer a pure weight stream: cuBLAS does it


@dataclass(frozen=True)
class NormedStream:
    """One row of the residual stream as the streaming GEMV that added to it wrote it, with what the norm
    after it needs (`norm_weight` g): h * g (rounded to h's dtype, like the reference's normed value) and
    h's sums of squares in float32, one per block of the writer. The projection that reads
    rms_norm(h) * g then streams its weights against a ready vector and scales by rstd at the end, no
    norm work in its weight loop (where, recomputed by every block, it cost the 8B step 0.15-0.31 ms:
    BENCHMARKS.md). Anything else reads `stream`."""

    stream: torch.Tensor
    scaled: torch.Tensor
    sumsq: torch.Tensor
    norm_weight: torch.Tensor


def stream_of(x):
    """The tensor itself, or a NormedStream's stream."""
    return x.stream if isinstance(x, NormedStream) else x


def norm_input(x, norm_weight: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What a projection normed by norm_weight reads: (h * g, the sums of squares) when x is a NormedStream
    for that very norm, else (the stream, None): the projection then norms in its loop, if at all."""
    if isinstance(x, NormedStream) and norm_weight is x.norm_weight:
        return x.scaled, x.sumsq
    return stream_of(x), None


def handoff_on() -> bool:
    """Whether residual-writing one-row GEMVs hand the next norm its inputs (NormedStream); default on,
    SPECPILOT_NORM_HANDOFF=0 turns it off (each normed projection then recomputes the norm in its loop)."""
    return env_switch("SPECPILOT_NORM_HANDOFF")


def ahead_on() -> bool:
    """Whether the one-row kernels' weight loop requests each step's tiles one step ahead (and the first
    ones before it waits on x: gemv/triton._stream_open); default on, SPECPILOT_GEMV_AHEAD=0 turns it off.
    It changes when loads are issued, never what is computed."""
    return env_switch("SPECPILOT_GEMV_AHEAD")


def epilogue_early() -> bool:
    """Whether the one-row kernels request their epilogue's inputs (bias, residual, the next norm's weight;
    q/k/v + rope's position and its cos / sin, but not the cache slot, whose register made ptxas spill at 4
    warps) right after the PDL wait, before the weight loop, instead of after it, where their round trip
    adds to the kernel's end; default on,
    SPECPILOT_EPILOGUE_EARLY=0 turns it off. It changes when loads are issued, not the arithmetic (a GPU
    build may round an ulp differently where ptxas fuses a multiply and an add: tests/test_kernels.py).
    On the H200 8B it made the step 0.010-0.013 ms faster, paired
    (bench/results/2026-12-01_epilogue_paired_58fd9bd_h200.json)."""
    return env_switch("SPECPILOT_EPILOGUE_EARLY")


L2_HINTS = ("off", "weights", "weights_kv")


def l2_hints() -> str:
    """What the one-row step's loads tell the L2 to keep (SPECPILOT_L2_HINTS, default `weights`):
    `weights`: the weights stream evict-first, so that what every step reads again (the K/V cache, norm
    and rope tables, the activations) is not pushed out by the gigabytes of weights streamed between two
    reads of it (the 8B's layer reads its 1-2 MB of K/V after 15 GB of other layers' weights went by);
    `weights_kv`: also the K/V cache's writes and loads evict-last. Hints only: the arithmetic is the same
    (and on the H200 the hinted builds gave the same bits). Copies that Triton 3.6 turns into cp.async carry
    no hint (it drops it): the shared-memory ring's (gemv/staged.py) and the decode attention's pipelined
    K/V loads (its first block, loaded before its wait, keeps the hint).
    On the H200 8B, `weights` made the step 0.017 ms faster, paired; `weights_kv` 0.008
    (bench/results/2026-12-01_l2_paired_7ad93f5_h200.json)."""
    mode = os.environ.get("SPECPILOT_L2_HINTS", "").strip() or "weights"
    if mode not in L2_HINTS:
        raise ValueError(f"SPECPILOT_L2_HINTS={mode!r}: expected one of {', '.join(L2_HINTS)}")
    return mode


def weight_eviction() -> str:
    """The eviction policy of the one-row kernels' weight loads ('' or 'evict_first': l2_hints)."""
    return "" if l2_hints() == "off" else "evict_first"


def kv_eviction() -> str:
    """The eviction policy of the one-row step's K/V cache loads and writes ('' or 'evict_last': l2_hints)."""
    return "evict_last" if l2_hints() == "weights_kv" else ""


def gemv_applies(x, enabled: bool) -> bool:
    x = stream_of(x)
    return enabled and x.numel() // x.shape[-1] <= MAX_ROWS and use_triton(x)


def project(x, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
            norm_weight: torch.Tensor | None = None, eps: float = 0.0, residual=None,
            gate_up: bool = False, gemv: bool = False, next_norm: torch.Tensor | None = None):
    """[residual +] act(rms_norm?(x) W^T + b), act = silu(gate) * up when gate_up (W = [gate; up]).
    x and residual may be NormedStreams. next_norm: the weight of the norm that will read the result; a
    one-row streaming GEMV then returns a NormedStream for it (see there), anything else a tensor."""
    if gemv_applies(x, gemv):
        from specpilot.kernels.gemv.triton import gemv_triton

        return gemv_triton(x, weight, bias, norm_weight=norm_weight, eps=eps, residual=stream_of(residual),
                           gate_up=gate_up, next_norm=next_norm)
    x, residual = stream_of(x), stream_of(residual)
    h = rms_norm(x, norm_weight, eps) if norm_weight is not None else x
    y = F.linear(h, weight, bias)
    if gate_up:
        y = silu_mul(y)
    return y if residual is None else residual + y
