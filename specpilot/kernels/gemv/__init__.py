"""Projections of the target, optionally fused with the norm before them, SwiGLU's activation and the
residual add after them. cuBLAS (with the separate norm / activation kernels) by default; with
`enabled`, few-row products go through the weight-streaming Triton GEMV that fuses them all."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specpilot.kernels.dispatch import use_triton
from specpilot.kernels.norm import rms_norm
from specpilot.kernels.swiglu import silu_mul

MAX_ROWS = 4  # beyond a few rows the product is no longer a pure weight stream: cuBLAS does it


def gemv_applies(x: torch.Tensor, enabled: bool) -> bool:
    return enabled and x.numel() // x.shape[-1] <= MAX_ROWS and use_triton(x)


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
            norm_weight: torch.Tensor | None = None, eps: float = 0.0, residual: torch.Tensor | None = None,
            gate_up: bool = False, gemv: bool = False) -> torch.Tensor:
    """[residual +] act(rms_norm?(x) W^T + b), act = silu(gate) * up when gate_up (W = [gate; up])."""
    if gemv_applies(x, gemv):
        from specpilot.kernels.gemv.triton import gemv_triton

        return gemv_triton(x, weight, bias, norm_weight=norm_weight, eps=eps, residual=residual, gate_up=gate_up)
    h = rms_norm(x, norm_weight, eps) if norm_weight is not None else x
    y = F.linear(h, weight, bias)
    if gate_up:
        y = silu_mul(y)
    return y if residual is None else residual + y
