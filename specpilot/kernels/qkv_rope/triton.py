"""One-row q/k/v projection with rotary embedding and the K/V cache write in its epilogue.

The grid is laid out so that rotary pairs meet in one program: program p of head h owns PAIRS
rows h*D + i and their partners h*D + D/2 + i (i in its slice of the first half), streams both sets of
weight rows like the streaming GEMV (gemv/triton.py: first tile before the PDL wait, one-pass norm),
rounds the projection to the dtype, and then, by the head's kind, rotates and stores q, rotates and
writes k into the cache slot, or writes v. Rounding after the projection mirrors the rope reference.
The norm's inputs may come handed over (kernels/gemv.NormedStream).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specpilot.config.plan import KernelPlan
from specpilot.kernels.dispatch import interpreting, pdl_on
from specpilot.kernels.gemv import kv_eviction, norm_input, weight_eviction
from specpilot.kernels.gemv.triton import _stream_open, _stream_rest, ahead_fits, launch_config, parts_args, pre_clamped
from specpilot.kernels.qkv_rope import PAIRS
from specpilot.kernels.rope.triton import _round
from specpilot.kernels.tuning.candidates import QKV_ROPE


@triton.jit
def _rope_inputs(b_ptr, rows_a, HALF: tl.constexpr, pos_ptr, cos_ptr, sin_ptr, i, D: tl.constexpr,
                 HAS_BIAS: tl.constexpr, rotated, dtype: tl.constexpr):
    """A q/k/v + rope program's epilogue inputs: the bias of its two row sets (float32, zeros without) and,
    where `rotated` (a q or k head), cos and sin at the position (in the dtype)."""
    bias_a = tl.zeros(rows_a.shape, dtype=tl.float32)
    bias_b = bias_a
    if HAS_BIAS:
        bias_a = tl.load(b_ptr + rows_a).to(tl.float32)
        bias_b = tl.load(b_ptr + rows_a + HALF).to(tl.float32)
    pos = tl.load(pos_ptr, mask=rotated, other=0).to(tl.int64)
    cos1 = tl.load(cos_ptr + pos * D + i, mask=rotated, other=0.0).to(dtype)  # held in the dtype, used in float32
    sin1 = tl.load(sin_ptr + pos * D + i, mask=rotated, other=0.0).to(dtype)
    return bias_a, bias_b, cos1, sin1


@triton.jit
def _qkv_rope_kernel(x_ptr, nw_ptr, w_ptr, b_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, q_out, k_cache, v_cache,
                     parts_ptr, n_parts, K, L, eps, HQ: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr,
                     PAIRS: tl.constexpr, HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, USE_GDC: tl.constexpr,
                     BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PRE: tl.constexpr = 1, NPARTS: tl.constexpr = 0,
                     AHEAD: tl.constexpr = False, EVICT: tl.constexpr = "", KV_EVICT: tl.constexpr = "",
                     EPI_EARLY: tl.constexpr = False):
    """This program's rotary pairs: projected, rotated, stored (see the module docstring). EVICT, KV_EVICT: the
    L2 eviction policies of the weight loads and of the K/V cache writes (kernels/gemv.weight_eviction).
    EPI_EARLY: the epilogue's inputs (bias, position and its rotary cos / sin) are requested right after
    the PDL wait, before the weight loop (gemv/triton._stream_kernel)."""
    dtype: tl.constexpr = q_out.dtype.element_ty
    D: tl.constexpr = 2 * HALF
    pid = tl.program_id(0)
    head = pid // (HALF // PAIRS)
    i = (pid % (HALF // PAIRS)) * PAIRS + tl.arange(0, PAIRS)  # positions in the first half of the head
    rows_a = head * D + i
    full = i < HALF  # all true: heads divide evenly
    a_ptrs = w_ptr + rows_a[:, None].to(tl.int64) * K
    wp, wp2 = _stream_open(a_ptrs, a_ptrs + HALF * K, full, K, True, USE_GDC, BLOCK_K, True, EVEN_K, PRE, EVICT)
    if EPI_EARLY:
        bias_a, bias_b, cos1, sin1 = _rope_inputs(b_ptr, rows_a, HALF, pos_ptr, cos_ptr, sin_ptr, i, D, HAS_BIAS,
                                                  head < HQ + HKV, dtype)
    a, b = _stream_rest(wp, wp2, x_ptr, nw_ptr, a_ptrs, a_ptrs + HALF * K, full, K, eps, HAS_NORM, True, USE_GDC,
                        PAIRS, BLOCK_K, True, EVEN_K, PRE, parts_ptr, n_parts, NPARTS, AHEAD, EVICT)
    if not EPI_EARLY:
        bias_a, bias_b, cos1, sin1 = _rope_inputs(b_ptr, rows_a, HALF, pos_ptr, cos_ptr, sin_ptr, i, D, HAS_BIAS,
                                                  head < HQ + HKV, dtype)
    if HAS_BIAS:
        a += bias_a
        b += bias_b
    a = _round(a, dtype)
    b = _round(b, dtype)
    slot = tl.load(slot_ptr).to(tl.int64)  # after the loop either way: earlier, ptxas spills at 4 warps
    if head < HQ + HKV:  # q or k: rotate (rotate-half convention; cos/sin cast to the dtype first)
        cos32 = cos1.to(tl.float32)
        sin32 = sin1.to(tl.float32)
        first = _round(_round(a * cos32, dtype) + _round(-b * sin32, dtype), dtype)
        second = _round(_round(b * cos32, dtype) + _round(a * sin32, dtype), dtype)
        if head < HQ:
            tl.store(q_out + head * D + i, first.to(dtype))
            tl.store(q_out + head * D + HALF + i, second.to(dtype))
        else:
            off = ((head - HQ) * L + slot) * D
            tl.store(k_cache + off + i, first.to(dtype), eviction_policy=KV_EVICT)
            tl.store(k_cache + off + HALF + i, second.to(dtype), eviction_policy=KV_EVICT)
    else:
        off = ((head - HQ - HKV) * L + slot) * D
        tl.store(v_cache + off + i, a.to(dtype), eviction_policy=KV_EVICT)
        tl.store(v_cache + off + HALF + i, b.to(dtype), eviction_policy=KV_EVICT)



_CONFIGS = [triton.Config({"BLOCK_K": c["BLOCK_K"]}, num_warps=c["num_warps"], num_stages=c["num_stages"])
            for c in QKV_ROPE if c["PAIRS"] == PAIRS and c["PRE"] == 1]  # the grid's PAIRS
_EVEN = triton.heuristics({"EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0})
_PLAIN = _EVEN(_qkv_rope_kernel)
_TUNED = triton.autotune(configs=_CONFIGS, key=["K", "HQ", "HKV", "HALF", "HAS_NORM", "PAIRS", "NPARTS"])(_PLAIN)


def qkv_rope_triton(x, weight, bias, norm_weight, eps, positions, cos_table, sin_table, k_cache, v_cache, slots,
                    num_heads, num_kv_heads, head_dim, *, plan: KernelPlan, tune: bool = True, pairs: int = PAIRS):
    """x: a tensor, or a NormedStream whose hand-over replaces the norm prologue when norm_weight is its
    norm's. pairs: rotary pairs per program where the plan's table has no config for this key (a chosen
    config names its own). Returns q [1, 1, Hq, D]."""
    hidden = weight.shape[1]
    x, sumsq = norm_input(x, norm_weight)
    handed = sumsq is not None
    if x.numel() != hidden or k_cache.shape[0] != 1 or not k_cache.is_contiguous() or not v_cache.is_contiguous():
        raise ValueError("the fused q/k/v + rope kernel takes one row of one sequence and contiguous caches")
    half = head_dim // 2
    chosen = plan.table.config(("qkv_rope", hidden, num_heads, num_kv_heads, half, norm_weight is not None,
                                bias is not None, handed))
    q = torch.empty(1, 1, num_heads, head_dim, dtype=k_cache.dtype, device=x.device)
    pdl = pdl_on(x, plan, default=True)
    has_norm = norm_weight is not None and not handed
    parts, nparts = parts_args(sumsq, x)
    args = (x.reshape(-1), norm_weight if has_norm else x, weight,
            bias if bias is not None else weight, positions.reshape(-1), slots.reshape(-1), cos_table, sin_table,
            q, k_cache, v_cache, *parts, hidden, k_cache.shape[2], eps)
    meta = dict(HQ=num_heads, HKV=num_kv_heads, HALF=half, HAS_NORM=has_norm, HAS_BIAS=bias is not None,
                USE_GDC=pdl, NPARTS=nparts, EVICT=weight_eviction(plan), KV_EVICT=kv_eviction(plan),
                EPI_EARLY=plan.epilogue_early, **({"launch_pdl": True} if pdl else {}))
    if chosen is not None:
        pairs = chosen["PAIRS"]
    if half % pairs:
        raise ValueError(f"head_dim {head_dim}: half of it is not a multiple of {pairs} rotary pairs")
    grid = ((num_heads + 2 * num_kv_heads) * (half // pairs),)
    if chosen is not None:
        config = launch_config(pre_clamped(chosen, hidden))
        _PLAIN[grid](*args, **meta, **config, AHEAD=ahead_fits(2 * pairs, chosen, has_norm, plan))
    elif tune and not interpreting():
        _TUNED[grid](*args, **meta, PAIRS=pairs)
    else:
        fixed = {"BLOCK_K": 128, "num_warps": 4}
        _PLAIN[grid](*args, **meta, PAIRS=pairs, **fixed, AHEAD=ahead_fits(2 * pairs, fixed, has_norm, plan))
    return q
