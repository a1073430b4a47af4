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
the range of slots its rows can see: [lo, hi) with hi = max(cache_len, start + last visible new
row) and, with a window, lo / hi narrowed to the window around the tile's positions. That range is
cut into NUM_SPLITS equal chunks of whole BLOCK_N blocks; program (row tile, split) walks its chunk
with an online softmax (exp2, fp32 statistics and accumulator). Chunks past the range are empty and
write neutral partials (max = -inf, sum = 0, acc = 0), so the work tracks the real sequence length
while the grid depends only on shapes (CUDA-graph capturable).

Combine. With NUM_SPLITS == 1 the program normalises and writes the output directly. Otherwise it
writes (max, sum, acc) to fp32 scratch and `_combine_kernel` (one program per row and query head)
merges the splits: out = sum_i 2^(m_i - m) acc_i / sum_i 2^(m_i - m) l_i. Rows that see nothing
come out as zeros.

Grid: (B * Hkv * row_tiles, NUM_SPLITS), NUM_SPLITS chosen so that about two waves of the SMs are
busy (see `_config`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from specpilot.kernels.dispatch import fix_triton_interpreter
from specpilot.spec.masks import Visibility

fix_triton_interpreter()

LOG2E = 1.4426950408889634
MAX_SPLITS = 64
DEFAULT_SMS = 132  # H200; used when the tensors are not on a CUDA device (interpreter tests)


@triton.jit
def _slot_range(cache_len, start, T, L, window, t_lo, t_hi,
                CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """[lo, hi): the slots that rows t_lo..t_hi of one batch element can possibly see."""
    if CAUSAL:
        new_end = start + t_hi + 1
    else:
        new_end = start + T
    hi = tl.minimum(tl.maximum(cache_len, new_end), L)
    lo = hi * 0
    if HAS_WINDOW:
        hi = tl.minimum(hi, start + t_hi + window)
        lo = tl.maximum(lo, start + t_lo - window + 1)
    return lo, hi


@triton.jit
def _visible(offs_t, offs_s, row_ok, cache_len, start, T, window, tree_ptr,
             CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """[BLOCK_M, BLOCK_N] bool: row (token offs_t) sees slot offs_s."""
    rel = offs_s[None, :] - start  # position of the slot among the new rows
    inside = (rel >= 0) & (rel < T) & row_ok[:, None]
    if CAUSAL:
        new = inside & (rel <= offs_t[:, None])
    else:
        bit = tl.load(tree_ptr + offs_t[:, None] * T + rel, mask=inside, other=0)
        new = inside & (bit != 0)
    vis = (offs_s[None, :] < cache_len) | new
    if HAS_WINDOW:
        dist = start + offs_t[:, None] - offs_s[None, :]
        vis = vis & (dist < window) & (dist > -window)
    return vis


@triton.jit
def _step(q, k_base, v_base, s0, sk_l, sv_l, qk_scale, m_i, l_i, acc,
          offs_t, row_ok, s_end, cache_len, start, T, window, tree_ptr,
          D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
          CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, PRECISION: tl.constexpr):
    """One online-softmax step over slots s0..s0+BLOCK_N-1. MASKED=False: all rows see all of them."""
    offs_s = s0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    k_ptrs = k_base + offs_s[:, None] * sk_l + offs_d[None, :]
    v_ptrs = v_base + offs_s[:, None] * sv_l + offs_d[None, :]
    if MASKED:
        # Slots any row may see: in the chunk, and committed or new (gaps are never loaded).
        col_ok = (offs_s < s_end) & ((offs_s < cache_len) | ((offs_s >= start) & (offs_s < start + T)))
        k = tl.load(k_ptrs, mask=col_ok[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=col_ok[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    if MASKED:
        vis = _visible(offs_t, offs_s, row_ok, cache_len, start, T, window, tree_ptr, CAUSAL, HAS_WINDOW)
        qk = tl.where(vis & col_ok[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen nothing yet
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, cache_len_ptr, start_ptr, tree_ptr,
    out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
    sq_b, sq_t, sq_h, sq_d,
    sk_b, sk_h, sk_l,
    sv_b, sv_h, sv_l,
    so_b, so_t, so_h,
    T, L, window, qk_scale, row_tiles,
    HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, PRECISION: tl.constexpr,
):
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

    cache_len = tl.load(cache_len_ptr + b).to(tl.int32)
    start = tl.load(start_ptr + b).to(tl.int32)
    t_lo = (tile * BLOCK_M) // G
    t_hi = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // G, T - 1)
    lo, hi = _slot_range(cache_len, start, T, L, window, t_lo, t_hi, CAUSAL, HAS_WINDOW)

    # This split's chunk of [lo, hi): whole BLOCK_N blocks, counted from lo rounded down.
    lo = (lo // BLOCK_N) * BLOCK_N
    n_blocks = tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_N)
    per_split = tl.cdiv(n_blocks, NUM_SPLITS)
    s_begin = lo + split * per_split * BLOCK_N
    s_end = tl.minimum(s_begin + per_split * BLOCK_N, hi)

    q_base = q_ptr + b.to(tl.int64) * sq_b + (h * G).to(tl.int64) * sq_h
    q_ptrs = q_base + offs_t[:, None] * sq_t + offs_g[:, None] * sq_h + offs_d[None, :] * sq_d
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    k_base = k_ptr + b.to(tl.int64) * sk_b + h.to(tl.int64) * sk_h
    v_base = v_ptr + b.to(tl.int64) * sv_b + h.to(tl.int64) * sv_h

    # Blocks of committed slots that every row sees need no mask; the rest (new rows, window) do.
    if HAS_WINDOW:
        mid = s_begin
    else:
        mid = tl.minimum(tl.maximum((cache_len // BLOCK_N) * BLOCK_N, s_begin), s_end)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for s0 in range(s_begin, mid, BLOCK_N):
        m_i, l_i, acc = _step(q, k_base, v_base, s0, sk_l, sv_l, qk_scale, m_i, l_i, acc,
                              offs_t, row_ok, s_end, cache_len, start, T, window, tree_ptr,
                              D, BLOCK_N, False, CAUSAL, HAS_WINDOW, PRECISION)
    for s0 in range(mid, s_end, BLOCK_N):
        m_i, l_i, acc = _step(q, k_base, v_base, s0, sk_l, sv_l, qk_scale, m_i, l_i, acc,
                              offs_t, row_ok, s_end, cache_len, start, T, window, tree_ptr,
                              D, BLOCK_N, True, CAUSAL, HAS_WINDOW, PRECISION)

    if NUM_SPLITS == 1:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_ptrs = (out_ptr + b.to(tl.int64) * so_b + offs_t[:, None] * so_t + (h * G + offs_g)[:, None] * so_h
                  + offs_d[None, :])
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        part = (bh * NUM_SPLITS + split).to(tl.int64) * M + offs_m
        tl.store(part_m_ptr + part, m_i, mask=row_ok)
        tl.store(part_l_ptr + part, l_i, mask=row_ok)
        tl.store(part_acc_ptr + part[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None])


@triton.jit
def _combine_kernel(
    part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr,
    so_b, so_t, so_h, T,
    HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
    NUM_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
):
    """One program per (batch, kv head, folded row): merge the NUM_SPLITS partials of that row."""
    pid = tl.program_id(0)
    M = T * G
    m = pid % M
    bh = pid // M
    b = bh // HKV
    h = bh % HKV
    t = m // G
    g = m % G

    offs_sp = tl.arange(0, SPLITS_P2)
    offs_d = tl.arange(0, D)
    sp_ok = offs_sp < NUM_SPLITS
    part = (bh * NUM_SPLITS + offs_sp).to(tl.int64) * M + m
    m_s = tl.load(part_m_ptr + part, mask=sp_ok, other=float("-inf"))
    l_s = tl.load(part_l_ptr + part, mask=sp_ok, other=0.0)
    acc = tl.load(part_acc_ptr + part[:, None] * D + offs_d[None, :], mask=sp_ok[:, None], other=0.0)

    m_max = tl.max(m_s, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m_s - m_max)  # 0 for empty splits
    denom = tl.sum(w * l_s, 0)
    numer = tl.sum(w[:, None] * acc, 0)
    o = numer / tl.where(denom > 0, denom, 1.0)
    o_ptrs = out_ptr + b.to(tl.int64) * so_b + t * so_t + (h * G + g) * so_h + offs_d
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty))


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
        # About two waves of programs, but no more splits than BLOCK_N blocks in the cache.
        base = batch * hkv * row_tiles
        num_splits = min(triton.cdiv(2 * num_sms, base), triton.cdiv(length, block_n), MAX_SPLITS)
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
    if vis.tree is not None and tuple(vis.tree.shape) != (t, t):
        raise ValueError(f"tree {tuple(vis.tree.shape)} does not match {t} rows")
    if vis.cache_len.shape != (b,) or vis.start.shape != (b,):
        raise ValueError("cache_len and start must be [B] tensors")


def attend_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, vis: Visibility,
                  scale: float, num_splits: int | None = None) -> torch.Tensor:
    """q [B, T, Hq, D] (any strides); k_cache, v_cache [B, Hkv, L, D]. Returns [B, T, Hq, D], q's dtype.

    No host synchronisation: cache_len / start stay on the device; the grid depends only on shapes.
    num_splits overrides the heuristic split count (for tests and tuning)."""
    _check(q, k_cache, v_cache, vis)
    b, t, hq, d = q.shape
    hkv, length = k_cache.shape[1], k_cache.shape[2]
    g = hq // hkv
    rows = t * g
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
    _split_kernel[grid](
        q, k_cache, v_cache, cache_len, start, tree,
        out, part_m, part_l, part_acc,
        *q.stride(),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        t, length, window, float(scale) * LOG2E, cfg.row_tiles,
        HKV=hkv, G=g, D=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, NUM_SPLITS=splits,
        CAUSAL=causal, HAS_WINDOW=has_window,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if splits > 1:
        _combine_kernel[(b * hkv * rows,)](
            part_m, part_l, part_acc, out,
            out.stride(0), out.stride(1), out.stride(2), t,
            HKV=hkv, G=g, D=d, NUM_SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits),
            num_warps=4 if d >= 128 else 2,
        )
    return out
