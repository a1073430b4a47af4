"""Projections of decode steps: cuBLAS by default; a weight-streaming Triton GEMV when asked for
(few rows only), with SwiGLU's activation fused into the gate/up product."""

from __future__ import annotations

import torch

from specpilot.kernels.dispatch import use_triton
from specpilot.kernels.gemv.naive import linear_naive
from specpilot.kernels.swiglu import silu_mul

MAX_ROWS = 4  # beyond a few rows the product is no longer a pure weight stream: cuBLAS does it


def gemv_applies(x: torch.Tensor, enabled: bool) -> bool:
    return enabled and x.numel() // x.shape[-1] <= MAX_ROWS and use_triton(x)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           gemv: bool = False) -> torch.Tensor:
    if gemv_applies(x, gemv):
        from specpilot.kernels.gemv.triton import linear_triton

        return linear_triton(x, weight, bias)
    return linear_naive(x, weight, bias)


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 gemv: bool = False) -> torch.Tensor:
    if bias is None and gemv_applies(x, gemv):
        from specpilot.kernels.gemv.triton import gate_up_silu_triton

        return gate_up_silu_triton(x, weight)
    return silu_mul(linear_naive(x, weight, bias))
