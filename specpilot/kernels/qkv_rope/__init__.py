"""The attention prologue of a one-row decode step in one launch: the q/k/v projection (with the norm
before it), rotary embedding, K/V into the cache. Part of the `gemv` option; models with per-head q/k
norms (Qwen3) keep the separate rope kernel, which needs a whole head's statistics."""

from __future__ import annotations

from specpilot.config.plan import KernelPlan
from specpilot.kernels.gemv import gemv_applies, stream_of

PAIRS = 8  # rotary pairs per program by default (2 x 8 weight rows, each row's partner half a head
# away); the step tuning may choose 4 (kernels/tuning/candidates.py), which any head this admits divides


def qkv_rope_applies(x, plan: KernelPlan, qk_norm: bool, head_dim: int) -> bool:
    h = stream_of(x)
    rows = h.numel() // h.shape[-1]
    return rows == 1 and not qk_norm and (head_dim // 2) % PAIRS == 0 and gemv_applies(x, plan)


def qkv_rope(x, weight, bias, norm_weight, eps, positions, cos_table, sin_table, k_cache, v_cache, slots,
             num_heads, num_kv_heads, head_dim, *, plan: KernelPlan, tune: bool = True):
    """x [1, 1, H] (or a NormedStream of it) -> q [1, 1, Hq, D]; writes the row's K/V [1, Hkv, L, D] at its
    slot (qkv_rope/triton.py)."""
    from specpilot.kernels.qkv_rope.triton import qkv_rope_triton

    return qkv_rope_triton(x, weight, bias, norm_weight, eps, positions, cos_table, sin_table, k_cache, v_cache,
                           slots, num_heads, num_kv_heads, head_dim, plan=plan, tune=tune)
