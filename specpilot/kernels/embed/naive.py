"""Reference for kernels/embed: the gather, then h * g and the sum of squares as the streaming GEMV's
hand-over writes them (h * g rounded to h's dtype, squares summed in float32)."""

from __future__ import annotations

import torch

from specpilot.kernels.gemv import NormedStream


def embed_handoff_naive(tokens: torch.Tensor, table: torch.Tensor, norm_weight: torch.Tensor) -> NormedStream:
    h = table[tokens.reshape(-1)].reshape(1, 1, -1)
    scaled = (h.float() * norm_weight.float()).to(h.dtype)
    return NormedStream(h, scaled, h.float().square().sum().reshape(1), norm_weight)
