"""Split-K (flash-decoding) Triton attention for the decode / verify / draft steps.

Semantics are those of `Visibility.dense(T, L)`: row t of batch b sees slot s iff
    s < cache_len[b]  or  (start[b] <= s < start[b] + T  and  tree[t, s - start[b]])
(tree None = causal chain: s - start[b] <= t), and with a window also |start[b] + t - s| < window.

Decomposition
-------------
Rows. The G = Hq / Hkv query heads that share one KV head are folded with the T new rows into one
row axis of length M = T * G (row m is token t = m // G, query head h * G + m % G). A program takes
a tile of BLOCK_M of these rows (padded to >= 16 for tl.dot), so every K/V block it loads serves all
the query heads of its KV head at once.

Slots. Each program computes, from the device tensors cache_len / start (never read on the host),
the slots its rows can see, and its split's share of them:
  * committed slots [0, cache_len) (with a window only those near the tile's positions); blocks
    that every row sees are walked without any mask (the bulk of the work);
  * causal (tree None): the new slots start .. start + t_hi of the tile's last token join that range
    on the same BLOCK_N grid (one range, cut into NUM_SPLITS chunks of whole blocks), the causal test
    being arithmetic;
  * tree: the new slots not already committed are walked in blocks aligned to start, so the tree
    tile is a plain 2D load (an unaligned [BLOCK_M, BLOCK_N] gather spilled registers); the splits
    share the committed blocks and these blocks evenly.
Nothing past max(cache_len, start + T) is read, nor the gap cache_len <= s < start. Each step is an
online softmax (exp2, fp32 statistics and accumulator). Splits with nothing to do write neutral
partials (max = -inf, sum = 0, acc = 0), so the work tracks the real sequence length while the grid
depends only on shapes (CUDA-graph capturable).

Combine. With NUM_SPLITS == 1 the program normalises and writes the output directly. Otherwise it
writes (max, sum, acc) to fp32 scratch [B * Hkv, NUM_SPLITS, M(, D)] and `_combine_kernel` (a block
of up to 16 folded rows x a head_dim block per program) merges the splits:
out = sum_i 2^(m_i - m) acc_i / sum_i 2^(m_i - m) l_i. Rows that see nothing come out as zeros.
With fuse_combine (the `gemv` option) there is no second launch: each split bumps its row tile's
arrival counter after writing its partials, and the split that arrives last merges them.

Grid: (B * Hkv * row_tiles, NUM_SPLITS), NUM_SPLITS chosen so that one to two waves of the SMs are
busy (see `_config`; tuned on an H200 for B=1, Hq=32, Hkv=8, D=128, T=1/16/64, L=1k..32k).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from specpilot.config.options import ATTENTION_ABLATIONS
from specpilot.config.plan import KernelPlan
from specpilot.kernels.dispatch import fix_triton_interpreter, pdl_on
from specpilot.kernels.gemv import kv_eviction

if TYPE_CHECKING:  # type hints only: Visibility is the step's type (speculative/, a layer up)
    from specpilot.core.contracts import Visibility

fix_triton_interpreter()

LOG2E = 1.4426950408889634
MAX_SPLITS = 64
COMBINE_PROGRAMS = 128  # the combine kernel cuts head_dim until it has about this many programs
DEFAULT_SMS = 132  # H200; used when the tensors are not on a CUDA device (interpreter tests)


@triton.jit
def _softmax_step(q, k, v, vis, qk_scale, m_i, l_i, acc, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """Fold one block of slots into the online softmax (base-2 exponent). vis [BLOCK_M, BLOCK_N] is
    ignored when MASKED is False (every row sees every slot of the block)."""
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    if MASKED:
        qk = tl.where(vis, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen nothing yet
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _in_window(offs_t, offs_s, start, window):
    """[BLOCK_M, BLOCK_N] bool: |start + t - s| < window."""
    dist = start + offs_t[:, None] - offs_s[None, :]
    return (dist < window) & (dist > -window)


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, cache_len_ptr, start_ptr, tree_ptr,
    out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, count_ptr,
    sq_b, sq_t, sq_h, sq_d,
    sk_b, sk_h, sk_l,
    sv_b, sv_h, sv_l,
    so_b, so_t, so_h, tree_sb,
    T, L, window, qk_scale, row_tiles,
    HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, PRECISION: tl.constexpr, USE_GDC: tl.constexpr,
    FUSE_COMBINE: tl.constexpr, PRELOAD: tl.constexpr = False,
    LATE: tl.constexpr = False, KV_EVICT: tl.constexpr = "", ABLATE: tl.constexpr = 0,
):
    """Program (b * Hkv * row_tiles + h * row_tiles + tile, split): one tile of folded rows against
    this split's share of the visible slots (see the module docstring). PRELOAD (PDL, causal, no
    window): the split's first block of committed slots is loaded before the PDL wait. Those slots, and
    cache_len / start, were written at least two kernels earlier, complete before the kernel just before
    this one passed its own wait and released this one; only q and the new rows need the wait. KV_EVICT: the
    K/V loads' L2 eviction policy (kernels/gemv.kv_eviction). ABLATE: a timing-only diagnostic (`ablation`)."""
    if USE_GDC:  # q and the new cache rows come from the previous kernel: wait for it (see dispatch.pdl_on)
        # The next kernel may start now: it streams weights only until its own wait. LATE: only once the
        # previous kernel is done, so that those weights stream while this one runs, not beside that one.
        if not LATE:
            tl.extra.cuda.gdc_launch_dependents()
        if not PRELOAD:
            tl.extra.cuda.gdc_wait()
            if LATE:
                tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    split = tl.program_id(1)
    tile = pid % row_tiles
    bh = pid // row_tiles
    h = bh % HKV
    b = bh // HKV
    M = T * G

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < M
    offs_t = offs_m // G
    offs_g = offs_m % G
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    t_lo = (tile * BLOCK_M) // G
    t_hi = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // G, T - 1)

    cache_len = tl.minimum(tl.load(cache_len_ptr + b).to(tl.int32), L)
    start = tl.load(start_ptr + b).to(tl.int32)

    q_base = q_ptr + b.to(tl.int64) * sq_b + (h * G).to(tl.int64) * sq_h
    q_ptrs = q_base + offs_t[:, None] * sq_t + offs_g[:, None] * sq_h + offs_d[None, :] * sq_d
    k_base = k_ptr + b.to(tl.int64) * sk_b + h.to(tl.int64) * sk_h
    v_base = v_ptr + b.to(tl.int64) * sv_b + h.to(tl.int64) * sv_h

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    # Slot ranges. Committed slots [lo, hi_c); with a window only those near the tile's positions.
    hi_c = cache_len
    lo = cache_len * 0
    if HAS_WINDOW:
        hi_c = tl.minimum(hi_c, start + t_hi + window)
        lo = tl.maximum(lo, start + t_lo - window + 1)
    lo = (lo // BLOCK_N) * BLOCK_N
    n_c = tl.cdiv(tl.maximum(hi_c - lo, 0), BLOCK_N)
    if CAUSAL:
        # The new slots join the committed range (one range of blocks on the BLOCK_N grid; the
        # causal test is arithmetic), and there is no separate tree walk.
        hi = tl.maximum(hi_c, tl.minimum(start + t_hi + 1, L))
        if HAS_WINDOW:
            hi = tl.minimum(hi, start + t_hi + window)
        per_split = tl.cdiv(tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_N), NUM_SPLITS)
        s_begin = lo + split * per_split * BLOCK_N
        s_end = tl.minimum(s_begin + per_split * BLOCK_N, hi)
        j_begin = 0
        j_end = 0
        new_cols = 0
    else:
        # Committed blocks 0..n_c-1, then the blocks of new slots start + j * BLOCK_N + (0..BLOCK_N-1),
        # j < n_new, aligned to start so that the tree tile is a plain 2D load: the splits share these
        # n_c + n_new blocks evenly.
        new_cols = tl.minimum(T, L - start)
        n_new = tl.cdiv(tl.maximum(new_cols, 0), BLOCK_N)
        per_split = tl.cdiv(n_c + n_new, NUM_SPLITS)
        v_begin = split * per_split
        v_end = v_begin + per_split
        s_begin = lo + tl.minimum(v_begin, n_c) * BLOCK_N
        s_end = tl.minimum(lo + tl.minimum(v_end, n_c) * BLOCK_N, hi_c)
        j_begin = tl.maximum(v_begin, n_c) - n_c
        j_end = tl.minimum(v_end, n_c + n_new) - n_c
    # Whole blocks of committed slots (no window) are seen by every row: no mask.
    if HAS_WINDOW:
        mid = s_begin
    else:
        mid = tl.minimum(tl.maximum((hi_c // BLOCK_N) * BLOCK_N, s_begin), s_end)

    if ABLATE == 4:  # no_kv: no slots (timing only)
        s_end = s_begin
        mid = s_begin
    s_first = s_begin
    if PRELOAD:
        first = s_begin < mid
        offs_s = s_begin + offs_n
        k_first = tl.load(k_base + offs_s[:, None] * sk_l + offs_d[None, :], mask=first, other=0.0,
                          eviction_policy=KV_EVICT)
        v_first = tl.load(v_base + offs_s[:, None] * sv_l + offs_d[None, :], mask=first, other=0.0,
                          eviction_policy=KV_EVICT)
        if USE_GDC:
            tl.extra.cuda.gdc_wait()
            if LATE:
                tl.extra.cuda.gdc_launch_dependents()
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    if PRELOAD:
        if first:
            m_i, l_i, acc = _softmax_step(q, k_first, v_first, 0, qk_scale, m_i, l_i, acc, False, PRECISION)
            s_first = s_begin + BLOCK_N
    for s0 in range(s_first, mid, BLOCK_N):
        offs_s = s0 + offs_n
        k = tl.load(k_base + offs_s[:, None] * sk_l + offs_d[None, :], eviction_policy=KV_EVICT)
        v = tl.load(v_base + offs_s[:, None] * sv_l + offs_d[None, :], eviction_policy=KV_EVICT)
        m_i, l_i, acc = _softmax_step(q, k, v, 0, qk_scale, m_i, l_i, acc, False, PRECISION)
    for s0 in range(mid, s_end, BLOCK_N):
        offs_s = s0 + offs_n
        committed = offs_s < hi_c
        vis = committed[None, :] & row_ok[:, None]
        col_ok = committed
        if CAUSAL:
            rel = offs_s - start
            new = (rel >= 0) & (rel < T) & (offs_s < L)  # slots that are new rows
            col_ok = col_ok | new
            vis = vis | (new[None, :] & (rel[None, :] <= offs_t[:, None]) & row_ok[:, None])
        col_ok = col_ok & (offs_s < s_end)
        if HAS_WINDOW:
            vis = vis & _in_window(offs_t, offs_s, start, window)
        k = tl.load(k_base + offs_s[:, None] * sk_l + offs_d[None, :], mask=col_ok[:, None], other=0.0,
                    eviction_policy=KV_EVICT)
        v = tl.load(v_base + offs_s[:, None] * sv_l + offs_d[None, :], mask=col_ok[:, None], other=0.0,
                    eviction_policy=KV_EVICT)
        vis = vis & col_ok[None, :]
        m_i, l_i, acc = _softmax_step(q, k, v, vis, qk_scale, m_i, l_i, acc, True, PRECISION)
    for j in range(j_begin, j_end):  # tree only: new slots that are not committed
        rel = j * BLOCK_N + offs_n
        offs_s = start + rel
        col_ok = (rel < new_cols) & (offs_s >= cache_len)
        k = tl.load(k_base + offs_s[:, None] * sk_l + offs_d[None, :], mask=col_ok[:, None], other=0.0,
                    eviction_policy=KV_EVICT)
        v = tl.load(v_base + offs_s[:, None] * sv_l + offs_d[None, :], mask=col_ok[:, None], other=0.0,
                    eviction_policy=KV_EVICT)
        vis = col_ok[None, :] & row_ok[:, None]
        bits = tl.load(tree_ptr + b.to(tl.int64) * tree_sb + offs_t[:, None] * T + rel[None, :], mask=vis, other=0)
        vis = vis & (bits != 0)
        if HAS_WINDOW:
            vis = vis & _in_window(offs_t, offs_s, start, window)
        m_i, l_i, acc = _softmax_step(q, k, v, vis, qk_scale, m_i, l_i, acc, True, PRECISION)

    o_ptrs = (out_ptr + b.to(tl.int64) * so_b + offs_t[:, None] * so_t + (h * G + offs_g)[:, None] * so_h
              + offs_d[None, :])
    if NUM_SPLITS == 1 or ABLATE == 3:  # ABLATE 3, no_partials: each split writes its own (timing only)
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        part = (bh * NUM_SPLITS + split).to(tl.int64) * M + offs_m
        tl.store(part_m_ptr + part, m_i, mask=row_ok)
        tl.store(part_l_ptr + part, l_i, mask=row_ok)
        tl.store(part_acc_ptr + part[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None])
        if FUSE_COMBINE and ABLATE != 2:  # ABLATE 2, no_merge: partials only (timing only)
            # The tile's last split to finish merges all of them: no combine kernel. The barrier orders
            # every thread's partial stores before the counter's release; the acquire orders the merge's
            # loads after the other splits' stores; the last one resets the counter for the next launch.
            if ABLATE == 1:  # relaxed: no ordering (timing only)
                done = tl.atomic_add(count_ptr + pid, 1, sem="relaxed")
            else:
                tl.debug_barrier()
                done = tl.atomic_add(count_ptr + pid, 1, sem="acq_rel")
            if done == NUM_SPLITS - 1:
                o = _merge(part_m_ptr, part_l_ptr, part_acc_ptr, bh.to(tl.int64) * NUM_SPLITS * M + offs_m, M,
                           row_ok, offs_d, D, NUM_SPLITS, BLOCK_M, D)
                tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
                tl.atomic_xchg(count_ptr + pid, 0)


@triton.jit
def _merge(part_m_ptr, part_l_ptr, part_acc_ptr, base, M, row_ok, offs_d, D: tl.constexpr,
           NUM_SPLITS: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Merge the NUM_SPLITS partials of ROWS folded rows (base: their offsets in split 0):
    out = sum_i 2^(m_i - m) acc_i / sum_i 2^(m_i - m) l_i with m = max_i m_i. Loads bypass L1 (.cg):
    in the fused combine other programs wrote these partials during this launch."""
    m_max = tl.full([ROWS], float("-inf"), tl.float32)
    for sp in tl.static_range(NUM_SPLITS):
        m_max = tl.maximum(m_max, tl.load(part_m_ptr + base + sp * M, mask=row_ok, other=float("-inf"),
                                          cache_modifier=".cg"))
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    denom = tl.zeros([ROWS], tl.float32)
    numer = tl.zeros([ROWS, BLOCK_D], tl.float32)
    for sp in tl.static_range(NUM_SPLITS):
        m_sp = tl.load(part_m_ptr + base + sp * M, mask=row_ok, other=float("-inf"), cache_modifier=".cg")
        w = tl.exp2(m_sp - m_max)  # 0: empty
        denom += w * tl.load(part_l_ptr + base + sp * M, mask=row_ok, other=0.0, cache_modifier=".cg")
        acc = tl.load(part_acc_ptr + (base + sp * M)[:, None] * D + offs_d[None, :], mask=row_ok[:, None],
                      other=0.0, cache_modifier=".cg")
        numer += w[:, None] * acc
    return numer / tl.where(denom > 0, denom, 1.0)[:, None]


@triton.jit
def _combine_kernel(
    part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr,
    so_b, so_t, so_h, T,
    HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
    NUM_SPLITS: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, USE_GDC: tl.constexpr,
):
    """Program (b * Hkv + h, row block, head_dim block): merge the NUM_SPLITS partials of ROWS folded
    rows: out = sum_i 2^(m_i - m) acc_i / sum_i 2^(m_i - m) l_i with m = max_i m_i."""
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    bh = tl.program_id(0)
    M = T * G
    offs_m = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    row_ok = offs_m < M
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    o = _merge(part_m_ptr, part_l_ptr, part_acc_ptr, bh.to(tl.int64) * NUM_SPLITS * M + offs_m, M, row_ok, offs_d,
               D, NUM_SPLITS, ROWS, BLOCK_D)
    b = bh // HKV
    h = bh % HKV
    o_ptrs = (out_ptr + b.to(tl.int64) * so_b + (offs_m // G)[:, None] * so_t + (h * G + offs_m % G)[:, None] * so_h
              + offs_d[None, :])
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@dataclass(frozen=True)
class _Config:
    block_m: int
    block_n: int
    row_tiles: int
    num_splits: int
    num_warps: int
    num_stages: int


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_SMS


@functools.cache
def _config(batch: int, hkv: int, rows: int, head_dim: int, length: int, num_sms: int,
            num_splits: int | None) -> _Config:
    """Tiles and split count; rows = T * G (the folded row axis of one KV head)."""
    block_m = min(max(16, triton.next_power_of_2(rows)), 128 if head_dim <= 128 else 64)
    block_n = 128 if head_dim <= 64 and block_m <= 64 else 64
    row_tiles = triton.cdiv(rows, block_m)
    if num_splits is None:
        # Two waves of programs for decode-sized tiles (memory bound), one wave for larger row tiles,
        # where each split's partials (block_m x D fp32, written and read back) cost more; rounded
        # down, since a few programs spilling into an extra wave cost a whole wave. Each split should
        # cover at least max(BLOCK_N, BLOCK_M) slots of the cache.
        base = batch * hkv * row_tiles
        waves = 2 if block_m <= 16 else 1
        by_grid = max(1, waves * num_sms // base)
        by_length = triton.cdiv(length, max(block_n, block_m))
        num_splits = min(by_grid, by_length, MAX_SPLITS)
    num_warps = 8 if block_m * head_dim >= 128 * 128 else 4
    num_stages = 3 if head_dim <= 128 else 2
    return _Config(block_m, block_n, row_tiles, max(1, num_splits), num_warps, num_stages)


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, vis: Visibility) -> None:
    b, t, hq, d = q.shape
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.shape[0] != b or k_cache.shape[3] != d:
        raise ValueError(f"cache shapes {tuple(k_cache.shape)} / {tuple(v_cache.shape)} do not fit q {tuple(q.shape)}")
    if hq % k_cache.shape[1]:
        raise ValueError(f"{hq} query heads are not a multiple of {k_cache.shape[1]} KV heads")
    if d < 16 or d > 256 or d & (d - 1):
        raise ValueError(f"head_dim {d}: the kernel needs a power of two in 16..256")
    if q.dtype != k_cache.dtype or q.dtype != v_cache.dtype:
        raise ValueError(f"dtypes differ: q {q.dtype}, k {k_cache.dtype}, v {v_cache.dtype}")
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("the KV cache's head_dim must be contiguous")
    if vis.tree is not None and tuple(vis.tree.shape) not in ((t, t), (b, t, t)):
        raise ValueError(f"tree {tuple(vis.tree.shape)} does not match {t} rows")
    if vis.cache_len.shape != (b,) or vis.start.shape != (b,):
        raise ValueError("cache_len and start must be [B] tensors")


def ablation(plan: KernelPlan) -> int:
    """The plan's `attn_ablate` diagnostic as the kernel's ABLATE: the one-row step's attention with a piece of
    its work left out, so that the step's time shows what that piece costs. The outputs are then wrong (parse_system
    refuses it outside the timing scripts): `relaxed` bumps the arrival counter without the barrier and the
    release/acquire ordering; `no_merge` writes the partials and nothing else; `no_partials` has every split write
    its own unmerged output; `no_kv` reads no K/V."""
    return ATTENTION_ABLATIONS.index(plan.attn_ablate)


_COUNTERS: dict[torch.device, torch.Tensor] = {}
MAX_FUSED_TILES = 4096  # row tiles (B x Hkv x tiles) one fused-combine launch can count


def _counters(device: torch.device) -> torch.Tensor | None:
    """Arrival counters per row tile for the fused combine: zeros, allocated once per device outside graph
    capture (a graph keeps the pointer), reset by the kernel itself after each use."""
    if device not in _COUNTERS:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        _COUNTERS[device] = torch.zeros(MAX_FUSED_TILES, dtype=torch.int32, device=device)
    return _COUNTERS[device]


def attend_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, vis: Visibility,
                  scale: float, plan: KernelPlan, num_splits: int | None = None) -> torch.Tensor:
    """q [B, T, Hq, D] (any strides); k_cache, v_cache [B, Hkv, L, D]. Returns [B, T, Hq, D], q's dtype.

    No host synchronisation: cache_len / start stay on the device; the grid depends only on shapes.
    num_splits overrides the heuristic split count (for tests and tuning). With the plan's `gemv` the last
    split of each row tile to finish merges the partials (one launch instead of two), and a one-row call
    (the decode step) takes its split count, late release or cluster kernel from the plan's tuning table."""
    _check(q, k_cache, v_cache, vis)
    b, t, hq, d = q.shape
    hkv, length = k_cache.shape[1], k_cache.shape[2]
    g = hq // hkv
    rows = t * g
    fuse_combine = plan.gemv
    step = fuse_combine and t == 1  # the one-row `gemv` decode step
    chosen = None
    if num_splits is None and step:  # its split count is tuned
        chosen = plan.table.config(("attention", b, hkv, g, d, length))
        num_splits = (chosen.get("NUM_SPLITS") or None) if chosen else None
    if chosen and chosen.get("CLUSTER"):  # the splits merged in a thread-block cluster (attention/cluster.py)
        from specpilot.kernels.attention import cluster

        if cluster.eligible(q, k_cache, v_cache, vis, chosen["CLUSTER"]):
            preload = plan.ahead and chosen.get("AHEAD", True)
            return cluster.attend_cluster(q, k_cache, v_cache, vis, scale, chosen["CLUSTER"],
                                          late=bool(chosen.get("LATE")), preload=preload,
                                          pdl=pdl_on(q, plan, default=True))
        num_splits = chosen["CLUSTER"]
    cfg = _config(b, hkv, rows, d, length, _num_sms(q.device), num_splits)

    out = torch.empty(b, t, hq, d, dtype=q.dtype, device=q.device)
    cache_len, start = vis.cache_len.contiguous(), vis.start.contiguous()
    causal = vis.tree is None
    if causal:
        tree = cache_len  # unused pointer
    else:
        tree = vis.tree.contiguous()
        tree = tree.view(torch.uint8) if tree.dtype == torch.bool else tree.to(torch.uint8)
    has_window = bool(vis.window)
    window = int(vis.window) if has_window else 0

    splits = cfg.num_splits
    if splits == 1:
        part_m = part_l = part_acc = out  # unused
    else:
        part_m = torch.empty(b * hkv, splits, rows, dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(b * hkv, splits, rows, d, dtype=torch.float32, device=q.device)

    grid = (b * hkv * cfg.row_tiles, splits)
    counters = _counters(q.device) if fuse_combine and splits > 1 and grid[0] <= MAX_FUSED_TILES else None
    # PDL by default only in the one-row `gemv` step, where every kernel around is PDL-aware: beside
    # cuBLAS's GEMMs (verify rows) early launches only cost (bench/results/2026-11-29_engine_core_17402fe_h200.json).
    pdl = pdl_on(q, plan, default=step)
    launch = {"launch_pdl": True} if pdl else {}
    # The `gemv` decode step's attention loads its first committed block before the PDL wait (without PDL
    # only a peeled loop step: the interpreter tests it so).
    preload = step and causal and not has_window and plan.ahead and (chosen or {}).get("AHEAD", True)
    _split_kernel[grid](
        q, k_cache, v_cache, cache_len, start, tree,
        out, part_m, part_l, part_acc, counters if counters is not None else cache_len,
        *q.stride(),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1), out.stride(2), t * t if tree.dim() == 3 else 0,
        t, length, window, float(scale) * LOG2E, cfg.row_tiles,
        HKV=hkv, G=g, D=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, NUM_SPLITS=splits,
        CAUSAL=causal, HAS_WINDOW=has_window,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", USE_GDC=pdl,
        FUSE_COMBINE=counters is not None, PRELOAD=preload, LATE=bool((chosen or {}).get("LATE")),
        KV_EVICT=kv_eviction(plan) if step else "", ABLATE=ablation(plan) if step else 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **launch,
    )
    if splits > 1 and counters is None:
        # Combine: up to 16 rows per program; head_dim cut in blocks (>= 32) until ~128 programs.
        combine_rows = min(triton.next_power_of_2(rows), 16)
        row_blocks = triton.cdiv(rows, combine_rows)
        block_d = d
        while block_d > 32 and b * hkv * row_blocks * (d // block_d) < COMBINE_PROGRAMS:
            block_d //= 2
        _combine_kernel[(b * hkv, row_blocks, d // block_d)](
            part_m, part_l, part_acc, out,
            out.stride(0), out.stride(1), out.stride(2), t,
            HKV=hkv, G=g, D=d, NUM_SPLITS=splits, ROWS=combine_rows, BLOCK_D=block_d, USE_GDC=pdl, num_warps=4,
            **launch,
        )
    return out
