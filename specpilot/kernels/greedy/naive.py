"""Reference for kernels/greedy: PyTorch's argmax, then the position's increment."""

from __future__ import annotations

import torch


def greedy_advance_naive(logits: torch.Tensor, token: torch.Tensor, pos: torch.Tensor) -> None:
    token.copy_(logits.argmax(-1))
    pos.add_(1)
