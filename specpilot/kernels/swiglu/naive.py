"""SwiGLU activation reference: silu(gate) * up on the fused [gate | up] projection output."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_mul_naive(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
