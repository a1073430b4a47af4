"""One program per sequence runs the best-first search: every chosen row keeps a pointer to its next-best child
(children sorted once by score, outside), the frontier holds one value per row (its path score plus that child's
score), and each of the N - 1 rounds takes the frontier's maximum (ties to the lowest row, i.e. the earliest),
adds that child as a new row, and offers the chosen row's next child and the new row's first child. The rows
come out in decreasing path score, as the reference orders them. A row's ancestors are its parent's plus itself,
kept as an [N, N] matrix in registers."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specpilot.kernels.dispatch import fix_triton_interpreter

fix_triton_interpreter()


@triton.jit
def _store_rows(b, offs, par, dep, cnd, anc, tokens_ptr, anchor_ptr, parents_ptr, depth_ptr, cand_ptr, tok_ptr,
                anc_ptr, N, D: tl.constexpr, K: tl.constexpr):
    """The rows (parent, depth, candidate, token: the anchor at the root) and the ancestor matrix, [N] / [N, N]."""
    live = offs < N
    out = b * N + offs
    tl.store(parents_ptr + out, par.to(tl.int64), mask=live)
    tl.store(depth_ptr + out, dep.to(tl.int64), mask=live)
    tl.store(cand_ptr + out, cnd.to(tl.int64), mask=live)
    drafted = tl.load(tokens_ptr + b * (D * K) + (dep - 1) * K + cnd, mask=live & (dep > 0), other=0)
    tl.store(tok_ptr + out, tl.where(dep > 0, drafted, tl.load(anchor_ptr + b)), mask=live)
    grid = live[:, None] & live[None, :]
    tl.store(anc_ptr + b * N * N + offs[:, None] * N + offs[None, :], anc.to(tl.int8), mask=grid)


@triton.jit
def _best_first_kernel(top_s_ptr, top_c_ptr, tokens_ptr, anchor_ptr,
                       parents_ptr, depth_ptr, cand_ptr, tok_ptr, anc_ptr,
                       N, D: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    s_base = top_s_ptr + b * (D * K * K)
    c_base = top_c_ptr + b * (D * K * K)
    score = tl.zeros([BLOCK], tl.float32)
    dep = tl.zeros([BLOCK], tl.int32)
    cnd = tl.zeros([BLOCK], tl.int32)
    nxt = tl.zeros([BLOCK], tl.int32)
    par = tl.zeros([BLOCK], tl.int32)
    neg = tl.full([BLOCK], float("-inf"), tl.float32)
    value = tl.where(offs == 0, tl.load(s_base), neg)  # the root's best child
    anc = ((offs[:, None] == offs[None, :]) & (offs[:, None] == 0)).to(tl.int32)
    for t in range(1, N):
        best = tl.max(value, axis=0)
        i = tl.argmax(value, axis=0, tie_break_left=True)
        sel = offs == i
        d_i = tl.sum(tl.where(sel, dep, 0), axis=0)
        c_i = tl.sum(tl.where(sel, cnd, 0), axis=0)
        n_i = tl.sum(tl.where(sel, nxt, 0), axis=0)
        s_i = tl.sum(tl.where(sel, score, 0.0), axis=0)
        row = (d_i * K + c_i) * K  # this row's children, best first
        child = tl.load(c_base + row + n_i).to(tl.int32)
        new = offs == t
        score = tl.where(new, best, score)
        dep = tl.where(new, d_i + 1, dep)
        cnd = tl.where(new, child, cnd)
        par = tl.where(new, i, par)
        nxt = tl.where(sel, n_i + 1, nxt)
        more = n_i + 1 < K
        sibling = tl.load(s_base + row + n_i + 1, mask=more, other=float("-inf"))
        value = tl.where(sel, s_i + sibling, value)
        deeper = d_i + 1 < D
        first = tl.load(s_base + ((d_i + 1) * K + child) * K, mask=deeper, other=float("-inf"))
        value = tl.where(new, best + first, value)
        mine = tl.max(tl.where(sel[:, None], anc, 0), axis=0)  # row i's ancestors
        anc = tl.where(new[:, None], tl.maximum(mine[None, :], (offs[None, :] == t).to(tl.int32)), anc)
    _store_rows(b, offs, par, dep, cnd, anc, tokens_ptr, anchor_ptr, parents_ptr, depth_ptr, cand_ptr, tok_ptr,
                anc_ptr, N, D, K)


def best_first_triton(scores: torch.Tensor, tokens: torch.Tensor, anchor: torch.Tensor, nodes: int):
    b, d, k, _ = scores.shape
    top_s, top_c = scores.float().sort(dim=-1, descending=True, stable=True)
    dev = scores.device
    parents, depth, cand, tok = (torch.empty(b, nodes, dtype=torch.int64, device=dev) for _ in range(4))
    anc = torch.empty(b, nodes, nodes, dtype=torch.bool, device=dev)
    _best_first_kernel[(b,)](top_s.contiguous(), top_c.contiguous(), tokens.contiguous(), anchor.contiguous(),
                             parents, depth, cand, tok, anc.view(torch.int8), nodes, D=d, K=k,
                             BLOCK=max(16, triton.next_power_of_2(nodes)), num_warps=4)
    return parents, depth, cand, tok, anc


@triton.jit
def _eagle2_kernel(top_s_ptr, top_c_ptr, tokens_ptr, anchor_ptr,
                   pool_s_ptr, pool_c_ptr, pool_d_ptr, pool_p_ptr,
                   parents_ptr, depth_ptr, cand_ptr, tok_ptr, anc_ptr,
                   N, D: tl.constexpr, K: tl.constexpr, KEEP: tl.constexpr, KPAD: tl.constexpr, POOL: tl.constexpr,
                   BLOCK: tl.constexpr, BLOCK_P: tl.constexpr):
    """EAGLE-2 in one program per sequence: depth by depth the frontier (the depth's best KEEP nodes) expands its
    KEEP best children each into a pool (in global scratch); then the N - 1 best of the pool, in score order (ties
    to the earlier pool entry: a parent before its child), become the rows."""
    b = tl.program_id(0).to(tl.int64)
    s_base = top_s_ptr + b * (D * K * K)
    c_base = top_c_ptr + b * (D * K * K)
    p_base = b * POOL
    j = tl.arange(0, KPAD)
    ok = j < KEEP
    fr_s = tl.load(s_base + j, mask=ok, other=float("-inf"))  # depth 0: the anchor's best KEEP children
    fr_c = tl.load(c_base + j, mask=ok, other=0).to(tl.int32)
    fr = j
    tl.store(pool_s_ptr + p_base + j, fr_s, mask=ok)
    tl.store(pool_c_ptr + p_base + j, fr_c, mask=ok)
    tl.store(pool_d_ptr + p_base + j, tl.full([KPAD], 1, tl.int32), mask=ok)
    tl.store(pool_p_ptr + p_base + j, tl.full([KPAD], -1, tl.int32), mask=ok)
    flat = tl.arange(0, KPAD * KPAD)
    f_of, r_of = flat // KPAD, flat % KPAD
    valid = (f_of < KEEP) & (r_of < KEEP)
    for d in range(1, D):
        offset = KEEP + (d - 1) * KEEP * KEEP
        # the frontier's entries, spread over the [frontier, rank] grid (a frontier row repeated per rank)
        par_s = tl.sum(tl.where(f_of[:, None] == j[None, :], fr_s[None, :], 0.0), axis=1)
        par_c = tl.sum(tl.where(f_of[:, None] == j[None, :], fr_c[None, :], 0), axis=1)
        par_i = tl.sum(tl.where(f_of[:, None] == j[None, :], fr[None, :], 0), axis=1)
        at = (d * K + par_c) * K + r_of
        cs = tl.load(s_base + at, mask=valid, other=float("-inf")) + par_s
        cc = tl.load(c_base + at, mask=valid, other=0).to(tl.int32)
        slot = offset + f_of * KEEP + r_of
        tl.store(pool_s_ptr + p_base + slot, cs, mask=valid)
        tl.store(pool_c_ptr + p_base + slot, cc, mask=valid)
        tl.store(pool_d_ptr + p_base + slot, tl.zeros([KPAD * KPAD], tl.int32) + d + 1, mask=valid)
        tl.store(pool_p_ptr + p_base + slot, par_i, mask=valid)
        cs = tl.where(valid, cs, float("-inf"))
        for q in tl.static_range(KEEP):  # the next frontier: this depth's best KEEP, best first
            best = tl.max(cs, axis=0)
            a = tl.argmax(cs, axis=0, tie_break_left=True)
            here = flat == a
            fr_s = tl.where(j == q, best, fr_s)
            fr_c = tl.where(j == q, tl.sum(tl.where(here, cc, 0), axis=0), fr_c)
            fr = tl.where(j == q, offset + (a // KPAD) * KEEP + a % KPAD, fr)
            cs = tl.where(here, float("-inf"), cs)
    tl.debug_barrier()  # the pool's stores before its loads, across the program's threads
    offs_p = tl.arange(0, BLOCK_P)
    in_pool = offs_p < POOL
    ps = tl.load(pool_s_ptr + p_base + offs_p, mask=in_pool, other=float("-inf"))
    pc = tl.load(pool_c_ptr + p_base + offs_p, mask=in_pool, other=0)
    pd = tl.load(pool_d_ptr + p_base + offs_p, mask=in_pool, other=0)
    pp = tl.load(pool_p_ptr + p_base + offs_p, mask=in_pool, other=-1)
    row_of = tl.zeros([BLOCK_P], tl.int32)
    offs = tl.arange(0, BLOCK)
    dep = tl.zeros([BLOCK], tl.int32)
    cnd = tl.zeros([BLOCK], tl.int32)
    par = tl.zeros([BLOCK], tl.int32)
    anc = ((offs[:, None] == offs[None, :]) & (offs[:, None] == 0)).to(tl.int32)
    for t in range(1, N):
        i = tl.argmax(ps, axis=0, tie_break_left=True)
        sel = offs_p == i
        parent_pool = tl.sum(tl.where(sel, pp, 0), axis=0)
        parent_row = tl.sum(tl.where(offs_p == parent_pool, row_of, 0), axis=0)  # -1: the root, row 0
        new = offs == t
        dep = tl.where(new, tl.sum(tl.where(sel, pd, 0), axis=0), dep)
        cnd = tl.where(new, tl.sum(tl.where(sel, pc, 0), axis=0), cnd)
        par = tl.where(new, parent_row, par)
        row_of = tl.where(sel, t, row_of)
        ps = tl.where(sel, float("-inf"), ps)
        mine = tl.max(tl.where((offs == parent_row)[:, None], anc, 0), axis=0)
        anc = tl.where(new[:, None], tl.maximum(mine[None, :], (offs[None, :] == t).to(tl.int32)), anc)
    _store_rows(b, offs, par, dep, cnd, anc, tokens_ptr, anchor_ptr, parents_ptr, depth_ptr, cand_ptr, tok_ptr,
                anc_ptr, N, D, K)


def eagle2_triton(scores: torch.Tensor, tokens: torch.Tensor, anchor: torch.Tensor, nodes: int, keep: int):
    b, d, k, _ = scores.shape
    top_s, top_c = scores.float().sort(dim=-1, descending=True, stable=True)
    dev = scores.device
    pool = keep + (d - 1) * keep * keep
    pool_s = torch.empty(b, pool, dtype=torch.float32, device=dev)
    pool_c, pool_d, pool_p = (torch.empty(b, pool, dtype=torch.int32, device=dev) for _ in range(3))
    parents, depth, cand, tok = (torch.empty(b, nodes, dtype=torch.int64, device=dev) for _ in range(4))
    anc = torch.empty(b, nodes, nodes, dtype=torch.bool, device=dev)
    _eagle2_kernel[(b,)](top_s.contiguous(), top_c.contiguous(), tokens.contiguous(), anchor.contiguous(),
                         pool_s, pool_c, pool_d, pool_p, parents, depth, cand, tok, anc.view(torch.int8), nodes,
                         D=d, K=k, KEEP=keep, KPAD=max(2, triton.next_power_of_2(keep)), POOL=pool,
                         BLOCK=max(16, triton.next_power_of_2(nodes)), BLOCK_P=max(16, triton.next_power_of_2(pool)),
                         num_warps=4)
    return parents, depth, cand, tok, anc
