"""Reference for the fused attention prologue: the projection, then the rope/KV reference."""

from __future__ import annotations

from specpilot.kernels.gemv.naive import gemv_naive
from specpilot.kernels.rope.naive import rope_qkv_naive


def qkv_rope_naive(x, weight, bias, norm_weight, eps, positions, cos_table, sin_table, k_cache, v_cache, slots,
                   num_heads, num_kv_heads, head_dim):
    qkv = gemv_naive(x, weight, bias, norm_weight=norm_weight, eps=eps)
    return rope_qkv_naive(qkv, positions, cos_table, sin_table, None, None, eps, k_cache, v_cache, slots,
                          num_heads, num_kv_heads, head_dim)
