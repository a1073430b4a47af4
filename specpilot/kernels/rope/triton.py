"""The attention prologue in one launch: per (row, head) program, optional per-head RMSNorm, rotary
embedding, and the K/V store into the cache slot. Rounding mirrors the reference step by step
(normalised value, weight product, each rotary product and their sum are rounded to the dtype)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specpilot.config.plan import KernelPlan
from specpilot.kernels.dispatch import pdl_on


@triton.jit
def _round(x, dtype: tl.constexpr):
    return x.to(dtype).to(tl.float32)


@triton.jit
def _norm_rope(src, cos1, sin1, w_ptr, eps, HALF: tl.constexpr, HAS_NORM: tl.constexpr, dtype: tl.constexpr):
    i = tl.arange(0, HALF)
    a = tl.load(src + i).to(tl.float32)
    b = tl.load(src + HALF + i).to(tl.float32)
    if HAS_NORM:
        rstd = tl.rsqrt((tl.sum(a * a, axis=0) + tl.sum(b * b, axis=0)) / (2 * HALF) + eps)
        a = _round(tl.load(w_ptr + i).to(tl.float32) * _round(a * rstd, dtype), dtype)
        b = _round(tl.load(w_ptr + HALF + i).to(tl.float32) * _round(b * rstd, dtype), dtype)
    first = _round(_round(a * cos1, dtype) + _round(-b * sin1, dtype), dtype)
    second = _round(_round(b * cos1, dtype) + _round(a * sin1, dtype), dtype)
    return first, second


@triton.jit
def _rope_qkv_kernel(qkv_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr, q_out, k_cache, v_cache,
                     eps, T, L, HQ: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr,
                     HEAD_OFFSET: tl.constexpr, HAS_NORM: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:  # everything here reads the previous kernel's output: wait first (see dispatch.pdl_on)
        tl.extra.cuda.gdc_launch_dependents()  # the next kernel's blocks may launch now (they wait too)
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)  # b * T + t
    head = tl.program_id(1) + HEAD_OFFSET  # 0..HQ-1: query heads; HQ..HQ+HKV-1: key/value heads
    D: tl.constexpr = 2 * HALF
    dtype: tl.constexpr = q_out.dtype.element_ty
    pos = tl.load(pos_ptr + row)
    i = tl.arange(0, HALF)
    cos1 = tl.load(cos_ptr + pos * D + i).to(dtype).to(tl.float32)
    sin1 = tl.load(sin_ptr + pos * D + i).to(dtype).to(tl.float32)
    base = qkv_ptr + row * (HQ + 2 * HKV) * D
    if head < HQ:
        first, second = _norm_rope(base + head * D, cos1, sin1, qn_ptr, eps, HALF, HAS_NORM, dtype)
        dst = q_out + (row * HQ + head) * D
        tl.store(dst + i, first.to(dtype))
        tl.store(dst + HALF + i, second.to(dtype))
    else:
        j = head - HQ
        b_idx = row // T
        slot = tl.load(slot_ptr + row)
        off = ((b_idx * HKV + j) * L + slot) * D
        first, second = _norm_rope(base + (HQ + j) * D, cos1, sin1, kn_ptr, eps, HALF, HAS_NORM, dtype)
        tl.store(k_cache + off + i, first.to(dtype))
        tl.store(k_cache + off + HALF + i, second.to(dtype))
        v = tl.load(base + (HQ + HKV + j) * D + tl.arange(0, D))
        tl.store(v_cache + off + tl.arange(0, D), v)


def rope_qkv_triton(qkv, positions, cos_table, sin_table, q_norm, k_norm, eps, k_cache, v_cache, slots,
                    num_heads, num_kv_heads, head_dim, want_q, plan: KernelPlan):
    b, t, _ = qkv.shape
    qkv = qkv.contiguous()
    q_out = torch.empty(b, t, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    norm = k_norm is not None
    pdl = pdl_on(qkv, plan, default=plan.gemv and b * t == 1)  # as in attention/triton.py: the one-row gemv step only
    heads = num_heads + num_kv_heads if want_q else num_kv_heads
    _rope_qkv_kernel[(b * t, heads)](
        qkv, positions.contiguous(), slots.contiguous(), cos_table, sin_table, q_norm if norm else qkv,
        k_norm if norm else qkv, q_out, k_cache, v_cache, eps, t, k_cache.shape[2], HQ=num_heads,
        HKV=num_kv_heads, HALF=head_dim // 2, HEAD_OFFSET=0 if want_q else num_heads, HAS_NORM=norm,
        USE_GDC=pdl, num_warps=1 if head_dim <= 128 else 2, **({"launch_pdl": True} if pdl else {}))
    return q_out if want_q else None
