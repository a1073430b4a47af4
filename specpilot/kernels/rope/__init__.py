"""Attention prologue: q/k norms, rotary embedding, K/V into the cache."""

from __future__ import annotations

from specpilot.kernels.dispatch import use_triton
from specpilot.kernels.rope.naive import rope_qkv_naive


def rope_qkv(qkv, positions, cos_table, sin_table, q_norm, k_norm, eps, k_cache, v_cache, slots, num_heads,
             num_kv_heads, head_dim, want_q=True, gemv=False):
    """qkv [B, T, (Hq + 2 Hkv) D] -> q [B, T, Hq, D] (or None); writes K/V [B, Hkv, L, D] at slots [B, T].
    gemv: part of the `gemv` option (a one-row step then launches with PDL by default, kernels/dispatch.py)."""
    if use_triton(qkv):
        from specpilot.kernels.rope.triton import rope_qkv_triton

        return rope_qkv_triton(qkv, positions, cos_table, sin_table, q_norm, k_norm, eps, k_cache, v_cache, slots,
                               num_heads, num_kv_heads, head_dim, want_q, gemv=gemv)
    return rope_qkv_naive(qkv, positions, cos_table, sin_table, q_norm, k_norm, eps, k_cache, v_cache, slots,
                          num_heads, num_kv_heads, head_dim, want_q)
