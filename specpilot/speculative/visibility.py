"""Which cache slots each new row may attend to.

`Visibility` is the compact form every attention path takes: committed slots < cache_len are seen by
all rows; the T new rows sit at slots start..start+T-1 and see each other as `tree` says (None = a
causal chain). `dense()` expands it to a [B, T, L] boolean mask, the reference the kernels are
checked against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Visibility:
    cache_len: torch.Tensor  # [B] int64
    start: torch.Tensor  # [B] int64
    tree: torch.Tensor | None = None  # [T, T] or per sequence [B, T, T] bool: row t sees new row u iff tree[t, u];
    # None = causal
    window: int | None = None  # sliding window: row at position start+t sees slot s iff |start+t-s| < window
    # what an attention path derived from it once, for every layer of the forward to reuse (kernels/attention/live.py)
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    def dense(self, rows: int, length: int) -> torch.Tensor:
        tree = self.tree if self.tree is not None else chain_visibility(rows, device=self.start.device)
        mask = verify_mask(self.cache_len, self.start, tree, length)
        if self.window:
            slots = torch.arange(length, device=self.start.device)
            pos = self.start[:, None, None] + torch.arange(rows, device=self.start.device)[None, :, None]
            mask &= (pos - slots[None, None, :]).abs() < self.window
        return mask


def verify_mask(cache_len: torch.Tensor, start: torch.Tensor, visibility: torch.Tensor,
                length: int) -> torch.Tensor:
    """Rows at slots start..start+N-1 see every committed slot < cache_len, and the new rows that
    visibility [N, N] allows (a chain: lower triangle; a tree: each node's ancestors and itself).
    cache_len, start: [B]; visibility [N, N] or per sequence [B, N, N]. Returns [B, N, length]; built on the
    device without host syncs."""
    n = visibility.shape[-1]
    slots = torch.arange(length, device=start.device)
    rel = slots[None, :] - start[:, None]  # [B, L]
    inside = (rel >= 0) & (rel < n)
    per_seq = visibility if visibility.dim() == 3 else visibility.expand(start.shape[0], n, n)
    tree = per_seq.gather(2, rel.clamp(0, n - 1)[:, None, :].expand(-1, n, -1))  # [B, N, L]
    committed = slots[None, None, :] < cache_len[:, None, None]
    return committed | (tree & inside[:, None, :])


def chain_visibility(n: int, device=None) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()
