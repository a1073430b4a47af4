"""The decode step's first act: the token's embedding row, handed to the first layer's norm.

In the one-row `gemv` step every projection that reads a norm takes its inputs ready (kernels/gemv.
NormedStream); this gives the first layer's q/k/v the same from the embedding instead of a gather whose
reader recomputes the norm in its weight loop (the plan's `embed_kernel` and `handoff` options)."""

from __future__ import annotations

import torch

from specpilot.config.plan import KernelPlan
from specpilot.kernels.dispatch import use_triton
from specpilot.kernels.embed.naive import embed_handoff_naive
from specpilot.kernels.gemv import NormedStream


def applies(tokens: torch.Tensor, table: torch.Tensor, plan: KernelPlan) -> bool:
    """The one-row gemv step's gather goes through here (on the plan's say)."""
    return plan.gemv and tokens.numel() == 1 and use_triton(table, plan) and plan.embed_kernel and plan.handoff


def embed_handoff(tokens: torch.Tensor, table: torch.Tensor, norm_weight: torch.Tensor,
                  plan: KernelPlan) -> NormedStream:
    """tokens: one token id ([1, 1]); table [V, H]. The row table[token] as [1, 1, H], with h * g and the
    float32 sums of squares for the norm of weight g (norm_weight) that reads it."""
    if tokens.numel() != 1:
        raise ValueError(f"embed_handoff takes one token, got {tuple(tokens.shape)}")
    if use_triton(table, plan):
        from specpilot.kernels.embed.triton import embed_handoff_triton

        return embed_handoff_triton(tokens, table, norm_weight, plan)
    return embed_handoff_naive(tokens, table, norm_weight)
