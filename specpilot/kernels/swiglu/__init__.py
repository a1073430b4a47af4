"""SwiGLU's elementwise part."""

from __future__ import annotations

import torch

from specpilot.config.plan import KernelPlan
from specpilot.kernels.dispatch import use_triton
from specpilot.kernels.swiglu.naive import silu_mul_naive


def silu_mul(gate_up: torch.Tensor, plan: KernelPlan) -> torch.Tensor:
    if use_triton(gate_up, plan):
        from specpilot.kernels.swiglu.triton import silu_mul_triton

        return silu_mul_triton(gate_up)
    return silu_mul_naive(gate_up)
