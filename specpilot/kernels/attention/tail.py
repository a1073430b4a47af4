"""The decode attention as the tail of the kernel that wrote its inputs (one row, one sequence, causal).

The one-row step's q/k/v + rope kernel (qkv_rope/triton.py) may end with the attention of the new row
instead of handing it to a kernel of its own: that saves a kernel boundary (the attention's launch, its
wait for the whole q/k/v grid, its own drain) per layer. The programs that wrote one KV head's group
(its G query heads, its new K and V row) count their arrivals on a per-group counter; the last SPLITS
of them become the group's attention splits. A split loads the K/V blocks of its share of the
committed slots, which earlier steps wrote, then waits until every program of the group has arrived
(the last one to arrive need not) and reads q and the new slot; a split with no slots (the cache is
short) writes neutral partials at once. With SPLITS > 1 the splits write partials
and the last one to finish merges them, as the split kernel's fused combine does (attention/triton.py).
The slots, split shares and softmax steps are those of `attend_triton` with the same split count.

Waiting is safe: a split waits only for programs of its own launch, at most SPLITS - 1 of them, and
only those still to be scheduled can keep it waiting; the programs already running finish without
waiting, so slots free up for them. Triton's interpreter runs the programs one after another, so there
SPLITS must be 1 (the host enforces it). Each split resets what it counted, so the counters are zeros
again after each launch (a CUDA graph replays it as is).
"""

from __future__ import annotations

import triton
import triton.language as tl

from specpilot.kernels.attention.triton import _merge, _softmax_step


@triton.jit
def _kv_block(base, s0, offs_n, offs_d, D: tl.constexpr, mask):
    """A [BLOCK_N, D] block of one head's cache rows s0.. (L2 only: other programs of this launch may
    have written the new row)."""
    ptrs = base + (s0 + offs_n)[:, None] * D + offs_d[None, :]
    return tl.load(ptrs, mask=mask[:, None], other=0.0, cache_modifier=".cg")


@triton.jit
def _wait_for(count_ptr, arrivals):
    """Spin until the counter reaches `arrivals` (acquire: the counted programs' stores are visible)."""
    seen = tl.atomic_add(count_ptr, 0, sem="acquire")
    while seen < arrivals:
        seen = tl.atomic_add(count_ptr, 0, sem="acquire")


@triton.jit
def _split_range(cache_len_ptr, start_ptr, split, L, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr):
    """This split's slots [s_begin, s_end) of the visible [0, cache_len) + {start}, and where its blocks
    stop being wholly committed (mid): the split kernel's causal decomposition for one row."""
    cache_len = tl.minimum(tl.load(cache_len_ptr).to(tl.int32), L)
    start = tl.load(start_ptr).to(tl.int32)
    hi = tl.maximum(cache_len, tl.minimum(start + 1, L))
    per_split = tl.cdiv(tl.cdiv(hi, BLOCK_N), SPLITS)
    s_begin = split * per_split * BLOCK_N
    s_end = tl.minimum(s_begin + per_split * BLOCK_N, hi)
    mid = tl.minimum(tl.maximum((cache_len // BLOCK_N) * BLOCK_N, s_begin), s_end)
    return s_begin, mid, s_end, cache_len, start


@triton.jit
def row_attention(q_ptr, k_ptr, v_ptr, o_ptr, cache_len_ptr, start_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
                  count_ptr, grp, arrival, L, qk_scale, HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                  ARRIVALS: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Called by every program of the writing kernel once it counted itself (arrival: its 0-based place
    among the ARRIVALS programs of KV head grp); all but the last SPLITS return at once. q [Hq * D] and
    o [Hq * D] hold one row; the caches are [Hkv, L, D]; count_ptr holds 2 * Hkv counters (arrivals,
    then finished splits)."""
    split = arrival - (ARRIVALS - SPLITS)
    if split >= 0:
        BLOCK_M: tl.constexpr = 16 if G <= 16 else G  # tl.dot needs 16 rows
        offs_m = tl.arange(0, BLOCK_M)
        row_ok = offs_m < G
        offs_d = tl.arange(0, D)
        offs_n = tl.arange(0, BLOCK_N)
        s_begin, mid, s_end, cache_len, start = _split_range(cache_len_ptr, start_ptr, split, L, BLOCK_N, SPLITS)
        k_base = k_ptr + grp.to(tl.int64) * L * D
        v_base = v_ptr + grp.to(tl.int64) * L * D
        # The first committed block is requested before the wait: earlier steps wrote it.
        first = s_begin < mid
        every = offs_n < BLOCK_N
        k_first = _kv_block(k_base, s_begin, offs_n, offs_d, D, every & first)
        v_first = _kv_block(v_base, s_begin, offs_n, offs_d, D, every & first)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        rows = grp * G + offs_m
        if s_begin < s_end:  # a split with no slots writes neutral partials without waiting
            if SPLITS > 1:  # (one split: it is the last program to arrive)
                if arrival < ARRIVALS - 1:  # the last program to arrive knows all the others have
                    _wait_for(count_ptr + grp, ARRIVALS)
            q = tl.load(q_ptr + rows[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0,
                        cache_modifier=".cg")
            s_first = s_begin
            if first:
                m_i, l_i, acc = _softmax_step(q, k_first, v_first, 0, qk_scale, m_i, l_i, acc, False, PRECISION)
                s_first = s_begin + BLOCK_N
            for s0 in range(s_first, mid, BLOCK_N):
                k = _kv_block(k_base, s0, offs_n, offs_d, D, every)
                v = _kv_block(v_base, s0, offs_n, offs_d, D, every)
                m_i, l_i, acc = _softmax_step(q, k, v, 0, qk_scale, m_i, l_i, acc, False, PRECISION)
            for s0 in range(mid, s_end, BLOCK_N):  # the last, partly committed block and the new slot
                offs_s = s0 + offs_n
                col_ok = ((offs_s < cache_len) | (offs_s == start)) & (offs_s < s_end)
                k = _kv_block(k_base, s0, offs_n, offs_d, D, col_ok)
                v = _kv_block(v_base, s0, offs_n, offs_d, D, col_ok)
                vis = col_ok[None, :] & row_ok[:, None]
                m_i, l_i, acc = _softmax_step(q, k, v, vis, qk_scale, m_i, l_i, acc, True, PRECISION)
        o_ptrs = o_ptr + rows[:, None] * D + offs_d[None, :]
        if SPLITS == 1:
            o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
            tl.atomic_xchg(count_ptr + grp, 0)  # every program of the group has counted itself
        else:
            part = (grp * SPLITS + split).to(tl.int64) * G + offs_m
            tl.store(part_m_ptr + part, m_i, mask=row_ok)
            tl.store(part_l_ptr + part, l_i, mask=row_ok)
            tl.store(part_acc_ptr + part[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None])
            tl.debug_barrier()  # every thread's partials before the release
            done = tl.atomic_add(count_ptr + HKV + grp, 1, sem="acq_rel")
            if done == SPLITS - 1:  # the other splits are past their wait: both counters can go back to 0
                o = _merge(part_m_ptr, part_l_ptr, part_acc_ptr, grp.to(tl.int64) * SPLITS * G + offs_m, G, row_ok,
                           offs_d, D, SPLITS, BLOCK_M, D)
                tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
                tl.atomic_xchg(count_ptr + HKV + grp, 0)
                tl.atomic_xchg(count_ptr + grp, 0)
