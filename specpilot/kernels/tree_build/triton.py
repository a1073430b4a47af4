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
    live = offs < N
    out = b * N + offs
    tl.store(parents_ptr + out, par.to(tl.int64), mask=live)
    tl.store(depth_ptr + out, dep.to(tl.int64), mask=live)
    tl.store(cand_ptr + out, cnd.to(tl.int64), mask=live)
    drafted = tl.load(tokens_ptr + b * (D * K) + (dep - 1) * K + cnd, mask=live & (dep > 0), other=0)
    tl.store(tok_ptr + out, tl.where(dep > 0, drafted, tl.load(anchor_ptr + b)), mask=live)
    grid = live[:, None] & live[None, :]
    tl.store(anc_ptr + b * N * N + offs[:, None] * N + offs[None, :], anc.to(tl.int8), mask=grid)


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
