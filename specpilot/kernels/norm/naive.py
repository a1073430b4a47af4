"""RMSNorm references: statistics in float32, scale in the input dtype (transformers' order)."""

from __future__ import annotations

import torch


def rms_norm_naive(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms_norm_naive(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rms_norm(x + delta)): the residual add fused with the next norm."""
    s = x + delta
    return s, rms_norm_naive(s, weight, eps)
