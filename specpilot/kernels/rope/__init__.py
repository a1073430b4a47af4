"""Attention prologue: q/k norms, rotary embedding, K/V into the cache."""

from __future__ import annotations

from specpilot.config.plan import KernelPlan
from specpilot.kernels.dispatch import use_triton
from specpilot.kernels.rope.naive import rope_qkv_naive


def rope_qkv(qkv, positions, cos_table, sin_table, q_norm, k_norm, eps, k_cache, v_cache, slots, num_heads,
             num_kv_heads, head_dim, plan: KernelPlan, want_q=True):
    """qkv [B, T, (Hq + 2 Hkv) D] -> q [B, T, Hq, D] (or None); writes K/V [B, Hkv, L, D] at slots [B, T].
    Under the plan's `gemv` a one-row step launches with PDL by default (kernels/dispatch.py)."""
    if use_triton(qkv, plan):
        from specpilot.kernels.rope.triton import rope_qkv_triton

        return rope_qkv_triton(qkv, positions, cos_table, sin_table, q_norm, k_norm, eps, k_cache, v_cache, slots,
                               num_heads, num_kv_heads, head_dim, want_q, plan)
    return rope_qkv_naive(qkv, positions, cos_table, sin_table, q_norm, k_norm, eps, k_cache, v_cache, slots,
                          num_heads, num_kv_heads, head_dim, want_q)
