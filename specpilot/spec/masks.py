"""Visibility masks for verification over a static cache (True = the row may attend to that slot)."""

from __future__ import annotations

import torch


def verify_mask(cache_len: torch.Tensor, start: torch.Tensor, visibility: torch.Tensor,
                length: int) -> torch.Tensor:
    """Rows at slots start..start+N-1 see every committed slot < cache_len, and the new rows that
    visibility [N, N] allows (a chain: lower triangle; a tree: each node's ancestors and itself).
    cache_len, start: [B]. Returns [B, N, length]; built on the device without host syncs."""
    n = visibility.shape[0]
    slots = torch.arange(length, device=start.device)
    rel = slots[None, :] - start[:, None]  # [B, L]
    inside = (rel >= 0) & (rel < n)
    tree = visibility[:, rel.clamp(0, n - 1)].permute(1, 0, 2)  # [B, N, L]
    committed = slots[None, None, :] < cache_len[:, None, None]
    return committed | (tree & inside[:, None, :])


def chain_visibility(n: int, device=None) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()
