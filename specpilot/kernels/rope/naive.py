"""Reference for the attention prologue: split the fused q/k/v projection, optional per-head RMSNorm
(Qwen3's q/k norms), rotary embedding (rotate-half convention, rounding as transformers does: cos/sin
cast to the activation dtype), and K/V written into the cache at the rows' slots."""

from __future__ import annotations

import torch

from specpilot.kernels.norm.naive import rms_norm_naive


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D]; cos/sin [B, T, D] gathered at the rows' positions (float32)."""
    cos = cos[:, :, None].to(x.dtype)
    sin = sin[:, :, None].to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def write_rows(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """cache [B, H, L, D] <- rows [B, T, H, D] at slots [B, T]; graph-safe (no host sync)."""
    batch = torch.arange(cache.shape[0], device=cache.device)[:, None].expand_as(slots)
    cache[batch, :, slots] = rows.to(cache.dtype)


def rope_qkv_naive(qkv, positions, cos_table, sin_table, q_norm, k_norm, eps, k_cache, v_cache, slots,
                   num_heads, num_kv_heads, head_dim, want_q=True):
    b, t, _ = qkv.shape
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    q = q.view(b, t, num_heads, head_dim)
    k = k.view(b, t, num_kv_heads, head_dim)
    v = v.view(b, t, num_kv_heads, head_dim)
    if k_norm is not None:
        q = rms_norm_naive(q, q_norm, eps)
        k = rms_norm_naive(k, k_norm, eps)
    cos, sin = cos_table[positions], sin_table[positions]
    write_rows(k_cache, slots, apply_rope(k, cos, sin))
    write_rows(v_cache, slots, v)
    return apply_rope(q, cos, sin) if want_q else None
