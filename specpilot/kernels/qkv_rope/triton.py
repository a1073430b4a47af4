"""One-row q/k/v projection with rotary embedding and the K/V cache write in its epilogue.

The grid is laid out so that rotary pairs meet in one program: program p of head h owns PAIRS
rows h*D + i and their partners h*D + D/2 + i (i in its slice of the first half), streams both sets of
weight rows like the streaming GEMV (gemv/triton.py: first tile before the PDL wait, one-pass norm),
rounds the projection to the dtype, and then, by the head's kind, rotates and stores q, rotates and
writes k into the cache slot, or writes v. Rounding after the projection mirrors the rope reference.
The norm's inputs may come handed over (kernels/gemv.NormedStream).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from specpilot.kernels.attention.tail import row_attention
from specpilot.kernels.attention.triton import LOG2E, attention_counters
from specpilot.kernels.dispatch import pdl_on
from specpilot.kernels.gemv import epilogue_early, kv_eviction, norm_input, weight_eviction
from specpilot.kernels.gemv.choice import CANDIDATES, step_config
from specpilot.kernels.gemv.triton import _stream_open, _stream_rest, ahead_fits, launch_config, parts_args, pre_clamped
from specpilot.kernels.qkv_rope import PAIRS
from specpilot.kernels.rope.triton import _round
from specpilot.kernels.trace import opening, stamp
from specpilot.kernels.trace import slot as trace_slot


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
def _qkv_rope_program(x_ptr, nw_ptr, w_ptr, b_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, q_out, k_cache, v_cache,
                      rec, parts_ptr, n_parts, K, L, eps, HQ: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr,
                      PAIRS: tl.constexpr, HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, USE_GDC: tl.constexpr,
                      BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PRE: tl.constexpr, TRACE: tl.constexpr,
                      NPARTS: tl.constexpr, AHEAD: tl.constexpr, EARLY: tl.constexpr, EVICT: tl.constexpr,
                      KV_EVICT: tl.constexpr, EPI_EARLY: tl.constexpr):
    """This program's rotary pairs: projected, rotated, stored (see the module docstring). EVICT, KV_EVICT: the
    L2 eviction policies of the weight loads and of the K/V cache writes (kernels/gemv.l2_hints). EPI_EARLY:
    the epilogue's inputs (bias, position and its rotary cos / sin) are requested right after
    the PDL wait, before the weight loop (gemv/triton._stream_kernel)."""
    dtype: tl.constexpr = q_out.dtype.element_ty
    D: tl.constexpr = 2 * HALF
    pid = tl.program_id(0)
    head = pid // (HALF // PAIRS)
    i = (pid % (HALF // PAIRS)) * PAIRS + tl.arange(0, PAIRS)  # positions in the first half of the head
    rows_a = head * D + i
    full = i < HALF  # all true: heads divide evenly
    a_ptrs = w_ptr + rows_a[:, None].to(tl.int64) * K
    wp, wp2 = _stream_open(a_ptrs, a_ptrs + HALF * K, full, K, True, USE_GDC, BLOCK_K, True, EVEN_K, PRE, rec,
                           TRACE, EARLY, EVICT)
    if EPI_EARLY:
        bias_a, bias_b, cos1, sin1 = _rope_inputs(b_ptr, rows_a, HALF, pos_ptr, cos_ptr, sin_ptr, i, D, HAS_BIAS,
                                                  head < HQ + HKV, dtype)
    a, b = _stream_rest(wp, wp2, x_ptr, nw_ptr, a_ptrs, a_ptrs + HALF * K, full, K, eps, HAS_NORM, True, USE_GDC,
                        PAIRS, BLOCK_K, True, EVEN_K, PRE, rec, TRACE, parts_ptr, n_parts, NPARTS, AHEAD, EARLY, EVICT)
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


@triton.jit
def _qkv_rope_kernel(x_ptr, nw_ptr, w_ptr, b_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, q_out, k_cache, v_cache,
                     trace_ptr, parts_ptr, n_parts, K, L, eps, HQ: tl.constexpr, HKV: tl.constexpr,
                     HALF: tl.constexpr, PAIRS: tl.constexpr, HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr,
                     USE_GDC: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PRE: tl.constexpr = 1,
                     TRACE: tl.constexpr = False, NPARTS: tl.constexpr = 0, AHEAD: tl.constexpr = False,
                     EARLY: tl.constexpr = False, EVICT: tl.constexpr = "", KV_EVICT: tl.constexpr = "",
                     EPI_EARLY: tl.constexpr = False):
    rec = trace_ptr + tl.program_id(0) * 5  # this block's record (kernels/trace.py) when TRACE
    if TRACE:
        opening(rec)
    _qkv_rope_program(x_ptr, nw_ptr, w_ptr, b_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, q_out, k_cache, v_cache, rec,
                      parts_ptr, n_parts, K, L, eps, HQ, HKV, HALF, PAIRS, HAS_NORM, HAS_BIAS, USE_GDC, BLOCK_K, EVEN_K,
                      PRE, TRACE, NPARTS, AHEAD, EARLY, EVICT, KV_EVICT, EPI_EARLY)
    if TRACE:
        stamp(rec, 3)  # END


@triton.jit
def _qkv_attend_kernel(x_ptr, nw_ptr, w_ptr, b_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, q_out, k_cache, v_cache,
                       trace_ptr, parts_ptr, n_parts, K, L, eps, o_ptr, cache_len_ptr, start_ptr, part_m_ptr,
                       part_l_ptr, part_acc_ptr, count_ptr, qk_scale, HQ: tl.constexpr, HKV: tl.constexpr,
                       HALF: tl.constexpr, PAIRS: tl.constexpr, HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr,
                       USE_GDC: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PRE: tl.constexpr = 1,
                       TRACE: tl.constexpr = False, NPARTS: tl.constexpr = 0, AHEAD: tl.constexpr = False,
                       EARLY: tl.constexpr = False, SPLITS: tl.constexpr = 1, BLOCK_N: tl.constexpr = 64,
                       PRECISION: tl.constexpr = "tf32", EVICT: tl.constexpr = "", KV_EVICT: tl.constexpr = "",
                       EPI_EARLY: tl.constexpr = False):
    """_qkv_rope_kernel, then the new row's attention by the last programs of each KV head's group
    (attention/tail.py): o [Hq * D]."""
    rec = trace_ptr + tl.program_id(0) * 5
    if TRACE:
        opening(rec)
    _qkv_rope_program(x_ptr, nw_ptr, w_ptr, b_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, q_out, k_cache, v_cache, rec,
                      parts_ptr, n_parts, K, L, eps, HQ, HKV, HALF, PAIRS, HAS_NORM, HAS_BIAS, USE_GDC, BLOCK_K, EVEN_K,
                      PRE, TRACE, NPARTS, AHEAD, EARLY, EVICT, KV_EVICT, EPI_EARLY)
    G: tl.constexpr = HQ // HKV
    head = tl.program_id(0) // (HALF // PAIRS)
    grp = tl.where(head < HQ, head // G, tl.where(head < HQ + HKV, head - HQ, head - HQ - HKV))
    tl.debug_barrier()  # every thread's q / K / V stores before the release
    arrival = tl.atomic_add(count_ptr + grp, 1, sem="acq_rel")
    row_attention(q_out, k_cache, v_cache, o_ptr, cache_len_ptr, start_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
                  count_ptr, grp, arrival, L, qk_scale, HKV, G, 2 * HALF, (G + 2) * (HALF // PAIRS), SPLITS, BLOCK_N,
                  PRECISION)
    if TRACE:
        stamp(rec, 3)  # END


_CONFIGS = [triton.Config({"BLOCK_K": c["BLOCK_K"]}, num_warps=c["num_warps"], num_stages=c["num_stages"])
            for c in CANDIDATES["qkv_rope"] if c["PAIRS"] == PAIRS and c["PRE"] == 1]  # the grid's PAIRS
_EVEN = triton.heuristics({"EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0})
_PLAIN = _EVEN(_qkv_rope_kernel)
_TUNED = triton.autotune(configs=_CONFIGS, key=["K", "HQ", "HKV", "HALF", "HAS_NORM", "PAIRS", "NPARTS"])(_PLAIN)
_ATTEND = _EVEN(_qkv_attend_kernel)
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def qkv_rope_triton(x, weight, bias, norm_weight, eps, positions, cos_table, sin_table, k_cache, v_cache, slots,
                    num_heads, num_kv_heads, head_dim, tune: bool = True, pairs: int = PAIRS, attention=None):
    """x: a tensor, or a NormedStream whose hand-over replaces the norm prologue when norm_weight is its
    norm's. pairs: rotary pairs per program where no config was chosen in the step (a chosen config
    names its own). Returns q [1, 1, Hq, D].

    attention (vis, scale): returns (out, attended) instead. Where the step tuning chose ATTN (a split count)
    for this kernel's key and `tail_splits` admits it, the kernel ends with the new row's attention
    (attention/tail.py) and out is its output [1, 1, Hq, D] (attended True); else out is q."""
    hidden = weight.shape[1]
    x, sumsq = norm_input(x, norm_weight)
    handed = sumsq is not None
    if x.numel() != hidden or k_cache.shape[0] != 1 or not k_cache.is_contiguous() or not v_cache.is_contiguous():
        raise ValueError("the fused q/k/v + rope kernel takes one row of one sequence and contiguous caches")
    half = head_dim // 2
    chosen = step_config(("qkv_rope", hidden, num_heads, num_kv_heads, half, norm_weight is not None,
                          bias is not None, handed))
    counters, splits = None, 0
    if attention is not None:
        # Allocated at the first eager call, chosen or not: a graph captured later cannot allocate them.
        counters = attention_counters(x.device)
        splits = tail_splits(chosen, attention[0], num_heads // num_kv_heads, head_dim)
    q = torch.empty(1, 1, num_heads, head_dim, dtype=k_cache.dtype, device=x.device)
    pdl = pdl_on(x, default=True)
    has_norm = norm_weight is not None and not handed
    parts, nparts = parts_args(sumsq, x)
    args = (x.reshape(-1), norm_weight if has_norm else x, weight,
            bias if bias is not None else weight, positions.reshape(-1), slots.reshape(-1), cos_table, sin_table,
            q, k_cache, v_cache, q, *parts, hidden, k_cache.shape[2], eps)
    meta = dict(HQ=num_heads, HKV=num_kv_heads, HALF=half, HAS_NORM=has_norm, HAS_BIAS=bias is not None,
                USE_GDC=pdl, NPARTS=nparts, EVICT=weight_eviction(), KV_EVICT=kv_eviction(), EPI_EARLY=epilogue_early(),
                **({"launch_pdl": True} if pdl else {}))
    if chosen is not None:
        pairs = chosen["PAIRS"]
    if half % pairs:
        raise ValueError(f"head_dim {head_dim}: half of it is not a multiple of {pairs} rotary pairs")
    grid = ((num_heads + 2 * num_kv_heads) * (half // pairs),)
    if chosen is not None:
        rec, traced = trace_slot("qkv_rope", grid[0], q)
        args = args[:11] + (rec,) + args[12:]
        config = {k: v for k, v in launch_config(pre_clamped(chosen, hidden)).items() if k != "ATTN"}
        ahead = ahead_fits(2 * pairs, chosen, has_norm)
        if counters is not None and splits:
            return _attend(args, meta, config, ahead, traced, grid, q, counters, splits, *attention), True
        _PLAIN[grid](*args, **meta, TRACE=traced, **config, AHEAD=ahead)
    elif tune and not _INTERPRET:
        _TUNED[grid](*args, **meta, PAIRS=pairs)
    else:
        fixed = {"BLOCK_K": 128, "num_warps": 4}
        _PLAIN[grid](*args, **meta, PAIRS=pairs, **fixed, AHEAD=ahead_fits(2 * pairs, fixed, has_norm))
    return q if attention is None else (q, False)


def tail_splits(chosen: dict | None, vis, group: int, head_dim: int) -> int:
    """The split count of the attention at the kernel's tail: the chosen config's ATTN where the tail
    applies (one causal row of one sequence, no window, at most 16 query heads a KV head, head_dim a power
    of two), else 0. At most the programs of a KV head's group (G + 2 heads of head_dim / 2 / PAIRS
    programs each), which become its splits. Triton's interpreter runs the programs one after another, so
    there the splits, which wait for the group's last program, are cut to 1 (attention/tail.py)."""
    splits = (chosen or {}).get("ATTN", 0)
    fits = (vis.tree is None and not vis.window and tuple(vis.cache_len.shape) == (1,) and group <= 16
            and 16 <= head_dim <= 256 and head_dim & (head_dim - 1) == 0)
    if not splits or not fits:
        return 0
    return 1 if _INTERPRET else min(splits, (group + 2) * (head_dim // 2 // chosen["PAIRS"]))


def _attend(args, meta, config, ahead, traced, grid, q, counters, splits, vis, scale):
    """Launch the q/k/v + rope kernel with the attention tail; returns the attention's output."""
    num_heads, head_dim = q.shape[2], q.shape[3]
    o = torch.empty_like(q)
    rows = splits * num_heads
    part_m = torch.empty(rows, dtype=torch.float32, device=q.device) if splits > 1 else o
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(rows * head_dim, dtype=torch.float32, device=q.device) if splits > 1 else o
    tail = (o, vis.cache_len, vis.start, part_m, part_l, part_acc, counters, float(scale) * LOG2E)
    _ATTEND[grid](*args, *tail, **meta, TRACE=traced, **config, AHEAD=ahead, SPLITS=splits,
                  BLOCK_N=128 if head_dim <= 64 else 64, PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    return o
