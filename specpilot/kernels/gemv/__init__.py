"""Few-row projections with their fusions (the norm before, SwiGLU's activation and the residual add after):
the weight-streaming Triton GEMV of the `gemv` option (gemv/triton.py; gemv/staged.py for its shared-memory
rings), the reference beside it (gemv/naive.py), and the one-row hand-over to the next norm (NormedStream).
The dense weight format (specpilot/weights/dense.py) decides when a projection goes here."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.config.plan import KernelPlan
from specpilot.kernels.dispatch import use_triton

MAX_ROWS = 4  # beyond a few rows the product is no longer a pure weight stream: cuBLAS does it


@dataclass(frozen=True)
class NormedStream:
    """One row of the residual stream as the streaming GEMV that added to it wrote it, with what the norm
    after it needs (`norm_weight` g): h * g (rounded to h's dtype, like the reference's normed value) and
    h's sums of squares in float32, one per block of the writer. The projection that reads
    rms_norm(h) * g then streams its weights against a ready vector and scales by rstd at the end, no
    norm work in its weight loop (where, recomputed by every block, it cost the 8B step 0.15-0.31 ms:
    bench/HISTORY.md). Anything else reads `stream`."""

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


def weight_eviction(plan: KernelPlan) -> str:
    """The eviction policy of the one-row kernels' weight loads ('' or 'evict_first'). The plan's `l2`:
    `weights`: the weights stream evict-first, so that what every step reads again (the K/V cache, norm
    and rope tables, the activations) is not pushed out by the gigabytes of weights streamed between two
    reads of it (the 8B's layer reads its 1-2 MB of K/V after 15 GB of other layers' weights went by);
    `weights_kv`: also the K/V cache's writes and loads evict-last. Hints only: the arithmetic is the same
    (and on the H200 the hinted builds gave the same bits). Copies that Triton 3.6 turns into cp.async carry
    no hint (it drops it): the shared-memory ring's (gemv/staged.py) and the decode attention's pipelined
    K/V loads (its first block, loaded before its wait, keeps the hint). On the H200 8B, `weights` made the
    step 0.017 ms faster, paired; `weights_kv` 0.008 (bench/results/2026-12-01_l2_paired_7ad93f5_h200.json)."""
    return "" if plan.l2 == "off" else "evict_first"


def kv_eviction(plan: KernelPlan) -> str:
    """The eviction policy of the one-row step's K/V cache loads and writes ('' or 'evict_last')."""
    return "evict_last" if plan.l2 == "weights_kv" else ""


def gemv_applies(x, plan: KernelPlan) -> bool:
    x = stream_of(x)
    return plan.gemv and x.numel() // x.shape[-1] <= MAX_ROWS and use_triton(x, plan)
