"""Reference attention: the dense [B, T, L] mask from `Visibility.dense()` and torch SDPA."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # type hints only: Visibility is the step's type (speculative/, a layer up)
    from specpilot.core.contracts import Visibility


def fold_mask(mask: torch.Tensor, g: int) -> torch.Tensor:
    """[B, T, L] -> [B, 1, g * T, L]: each row's mask for the g query heads folded with it."""
    b, t, length = mask.shape
    return mask[:, None, None].expand(b, 1, g, t, length).reshape(b, 1, g * t, length)


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor | None,
              scale: float) -> torch.Tensor:
    """Masked grouped-query attention over a static cache.

    q [B, T, Hq, D]; k_cache, v_cache [B, Hkv, L, D]; mask [B, T, L] bool (True = visible), or already folded
    ([B, 1, g * T, L], bool or additive), or None (every slot visible). The query heads that share a KV head
    are folded into the row axis, so no K/V copy is made. Returns [B, T, Hq, D].
    """
    b, t, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    qf = q.reshape(b, t, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * t, d)
    m = fold_mask(mask, g) if mask is not None and mask.dim() == 3 else mask
    o = F.scaled_dot_product_attention(qf, k_cache, v_cache, attn_mask=m, scale=scale)
    return o.view(b, hkv, g, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, hq, d)


def attend_naive(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, vis: Visibility,
                 scale: float) -> torch.Tensor:
    """q [B, T, Hq, D]; k_cache, v_cache [B, Hkv, L, D]. Returns [B, T, Hq, D].

    Rows that see no slot at all come out as zeros (as in the kernel), not NaN."""
    t, length = q.shape[1], k_cache.shape[2]
    mask = vis.dense(t, length)
    out = attention(q, k_cache, v_cache, mask, scale)
    return torch.where(mask.any(-1)[:, :, None, None], out, torch.zeros((), dtype=out.dtype, device=out.device))
