"""RMSNorm, alone or fused with the residual add that precedes it."""

from __future__ import annotations

import torch

from specpilot.config.plan import KernelPlan
from specpilot.kernels.dispatch import use_triton
from specpilot.kernels.norm.naive import add_rms_norm_naive, rms_norm_naive


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, plan: KernelPlan) -> torch.Tensor:
    if use_triton(x, plan):
        from specpilot.kernels.norm.triton import rms_norm_triton

        return rms_norm_triton(x, weight, eps)
    return rms_norm_naive(x, weight, eps)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                 plan: KernelPlan) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(x, plan):
        from specpilot.kernels.norm.triton import add_rms_norm_triton

        return add_rms_norm_triton(x, delta, weight, eps)
    return add_rms_norm_naive(x, delta, weight, eps)
