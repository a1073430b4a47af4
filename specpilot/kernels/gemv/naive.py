"""Reference for the decode projections with their optional fusions (see gemv/triton.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specpilot.kernels.norm.naive import rms_norm_naive
from specpilot.kernels.swiglu.naive import silu_mul_naive


def gemv_naive(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
               norm_weight: torch.Tensor | None = None, eps: float = 0.0, residual: torch.Tensor | None = None,
               gate_up: bool = False) -> torch.Tensor:
    h = rms_norm_naive(x, norm_weight, eps) if norm_weight is not None else x
    y = F.linear(h, weight, bias)
    if gate_up:
        y = silu_mul_naive(y)
    return y if residual is None else residual + y
