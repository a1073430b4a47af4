"""References for the few-row matrix products of decode steps: y = x W^T (+ b), and SwiGLU's
gate/up product fused with its activation."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specpilot.kernels.swiglu.naive import silu_mul_naive


def linear_naive(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def gate_up_silu_naive(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """weight [2I, H] holds gate rows then up rows; returns silu(x gate^T) * (x up^T), [.., I]."""
    return silu_mul_naive(F.linear(x, weight, bias))
