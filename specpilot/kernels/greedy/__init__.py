"""The AR step's last act: the next token is the logits' argmax, and the position moves on by one."""

from __future__ import annotations

import torch

from specpilot.kernels.dispatch import env_switch, use_triton
from specpilot.kernels.greedy.naive import greedy_advance_naive


def kernel_on() -> bool:
    """SPECPILOT_GREEDY_KERNEL=0 keeps PyTorch's argmax, copy and add (three launches) on CUDA too."""
    return env_switch("SPECPILOT_GREEDY_KERNEL")


def greedy_advance(logits: torch.Tensor, token: torch.Tensor, pos: torch.Tensor, pdl_default: bool = False) -> None:
    """token[0] = argmax(logits) (the first index of the maximum, as torch.argmax), pos[0] += 1. logits:
    one row [V]; token, pos: int64 [1]. pdl_default: launch with programmatic dependent launch unless
    SPECPILOT_PDL says otherwise (the one-row `gemv` step, whose LM head releases it early)."""
    if use_triton(logits) and kernel_on():
        from specpilot.kernels.greedy.triton import greedy_advance_triton

        greedy_advance_triton(logits, token, pos, pdl_default)
        return
    greedy_advance_naive(logits, token, pos)
