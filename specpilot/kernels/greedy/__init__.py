"""The AR step's last act: the next token is the logits' argmax, and the position moves on by one."""

from __future__ import annotations

import torch

from specpilot.config.plan import KernelPlan
from specpilot.kernels.dispatch import use_triton
from specpilot.kernels.greedy.naive import greedy_advance_naive


def greedy_advance(logits: torch.Tensor, token: torch.Tensor, pos: torch.Tensor, plan: KernelPlan) -> None:
    """token[0] = argmax(logits) (the first index of the maximum, as torch.argmax), pos[0] += 1. logits:
    one row [V]; token, pos: int64 [1]. One launch where the plan's `greedy_kernel` is on (else PyTorch's
    argmax, copy and add: three); launched with PDL in the `gemv` step unless the plan's `pdl` says otherwise
    (its LM head releases it early)."""
    if use_triton(logits, plan) and plan.greedy_kernel:
        from specpilot.kernels.greedy.triton import greedy_advance_triton

        greedy_advance_triton(logits, token, pos, plan)
        return
    greedy_advance_naive(logits, token, pos)
