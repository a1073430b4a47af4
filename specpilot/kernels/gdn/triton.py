"""Gated DeltaNet decode, chain and tree verification and commit in Triton: the naive.py references' token loop.

Every entry point launches one kernel, `_walk_kernel`: a program walks a sequence of rows from the committed state,
one delta-rule step per row in naive._step's order (S <- e^g S; u = beta (v - S^T k); S <- S + k u^T; o = S^T q),
its state tile in registers in float32. The columns of S never mix under the delta rule, so a program owns a block of BV
columns of one (sequence, value head) with the whole Dk (padded to a power of two, masked) in its [BK, BV] tile.

  recurrent_rows  one walk over rows 0..T-1 (AR decode T = 1, chain verify, short prefill): o of every row, and
                  optionally every row's state (stock's chain snapshots) and the final state.
  tree_rows       one walk per node over its root..n path (built by `tree_paths` in PyTorch): node n's o, and
                  optionally its state (`hybrid_tree=snapshot`); no per-node state is needed otherwise.
  commit_rows     one walk over the accepted path: the committed state. The same kernel and the same step as
                  recurrent_rows, so committing a path gives the bits of decoding its tokens one at a time.

q and k are L2-normalised and q divided by sqrt(Dk) inside the kernel (as naive's _prep_q / _prep_kv), value head h
reading key head h // (Hv / Hk). Outputs are float32. Graph-safe: grids and shapes come from tensor shapes only; a
walk's length is loaded inside the kernel (the loop bound is a device value), and the tree paths are built with a
fixed number of gathers (pointer doubling), so nothing reads device data on the host.

Tiling: BV = min(32, Dv) by default: [128, 32] float32 is 32 registers a thread over 4 warps at Dk = 128, and a
sequence gets Hv * Dv / 32 programs (128 for 32 value heads of 128: about one per H100 SM at B = 1, where a
wider block would leave SMs idle in decode). Not tuned on a GPU yet: `block_v` and
`num_warps` are parameters, and the CPU tests run small blocks (several column blocks, masked tails) under
Triton's interpreter.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from specpilot.kernels.dispatch import fix_triton_interpreter
from specpilot.kernels.gdn.naive import L2_EPS

fix_triton_interpreter()

BLOCK_V = 32  # default columns of S per program (see the module docstring)


@triton.jit
def _walk_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, o_ptr, snap_ptr, fin_ptr, path_ptr, len_ptr,
                 T, W, P, HV, REP, scale, eps,
                 sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sg_b, sg_t, sg_h, sb_b, sb_t, sb_h,
                 DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                 NORMALIZE: tl.constexpr, PATHED: tl.constexpr, EVERY_ROW: tl.constexpr, OUT: tl.constexpr,
                 SNAP: tl.constexpr, FINAL: tl.constexpr):
    """Program (column block, sequence * value head, walk). Unpathed: the walk is rows 0..T-1 and o / snapshots
    land at each row. Pathed: walk w of sequence b is path[b, w, :len[b, w]] and o / snapshots land at index w
    (tree node w) after the walk. FINAL writes the state after the walk to fin [B, Hv, Dk, Dv].

    One kernel for every entry point, so the step is the same code everywhere. It is written inline, not in device
    functions: Triton's interpreter re-patches triton.language on every device-function call (several times slower).
    """
    vb = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    w = tl.program_id(2).to(tl.int64)
    b = bh // HV
    h = bh % HV
    hk = h // REP
    offs_k = tl.arange(0, BK)
    offs_v = vb * BV + tl.arange(0, BV)
    ok_k = offs_k < DK
    ok_v = offs_v < DV
    tile = offs_k[:, None] * DV + offs_v[None, :]
    ok = ok_k[:, None] & ok_v[None, :]
    s = tl.load(s_ptr + bh * DK * DV + tile, mask=ok, other=0.0)
    o = tl.zeros([BV], dtype=tl.float32)
    if PATHED:
        n = tl.load(len_ptr + b * W + w)
    else:
        n = T
    for i in range(0, n):
        if PATHED:  # clamped: a well-formed path never needs it, a bad one must not read out of bounds
            row = tl.minimum(tl.maximum(tl.load(path_ptr + (b * W + w) * P + i), 0), T - 1).to(tl.int64)
        else:
            row = i
        k = tl.load(k_ptr + b * sk_b + row * sk_t + hk * sk_h + offs_k, mask=ok_k, other=0.0).to(tl.float32)
        if NORMALIZE:  # naive.l2norm: x * rsqrt(sum x^2 + eps)
            k = k * tl.math.rsqrt(tl.sum(k * k, axis=0) + eps)
        v = tl.load(v_ptr + b * sv_b + row * sv_t + h * sv_h + offs_v, mask=ok_v, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + b * sg_b + row * sg_t + h * sg_h).to(tl.float32)
        beta = tl.load(beta_ptr + b * sb_b + row * sb_t + h * sb_h).to(tl.float32)
        # the delta rule in naive._step's order (S <- e^g S; u = beta (v - S^T k); S <- S + k u^T)
        s = s * tl.exp(g)
        kv = tl.sum(s * k[:, None], axis=0)
        delta = (v - kv) * beta
        s = s + k[:, None] * delta[None, :]
        if OUT:
            q = tl.load(q_ptr + b * sq_b + row * sq_t + hk * sq_h + offs_k, mask=ok_k, other=0.0).to(tl.float32)
            if NORMALIZE:
                q = q * tl.math.rsqrt(tl.sum(q * q, axis=0) + eps)
            o = tl.sum(s * (q / scale)[:, None], axis=0)
        if EVERY_ROW:
            at = (b * T + row) * HV + h
            if OUT:
                tl.store(o_ptr + at * DV + offs_v, o, mask=ok_v)
            if SNAP:
                tl.store(snap_ptr + at * DK * DV + tile, s, mask=ok)
    if not EVERY_ROW:
        at = (b * W + w) * HV + h
        if OUT:
            tl.store(o_ptr + at * DV + offs_v, o, mask=ok_v)
        if SNAP:
            tl.store(snap_ptr + at * DK * DV + tile, s, mask=ok)
    if FINAL:
        tl.store(fin_ptr + bh * DK * DV + tile, s, mask=ok)


def _rowwise(x: torch.Tensor) -> torch.Tensor:
    """Views are fine (e.g. q, k, v split off the conv's output) as long as the last dim is dense."""
    return x if x.dim() < 4 or x.stride(-1) == 1 else x.contiguous()


def _strides(x: torch.Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def _walk(q, k, v, g, beta, state, *, out: bool, every_row: bool, snap: bool, final: bool, walks: int = 1,
          path=None, lengths=None, normalize: bool = True, block_v: int | None = None, num_warps: int | None = None):
    """Launch _walk_kernel; returns (o, snapshots, final state), None for those not asked for."""
    b, t, hk, dk = k.shape
    hv, dv = v.shape[2], v.shape[3]
    if hv % hk:
        raise ValueError(f"{hv} value heads are not a multiple of {hk} key heads")
    k, v = _rowwise(k), _rowwise(v)
    q = _rowwise(q) if q is not None else k  # commit reads no q: any valid pointer with k's strides
    state = state.float().contiguous()
    dev = k.device
    rows = t if every_row else walks
    o = torch.empty(b, rows, hv, dv, dtype=torch.float32, device=dev) if out else state
    snaps = torch.empty(b, rows, hv, dk, dv, dtype=torch.float32, device=dev) if snap else state
    fin = torch.empty_like(state) if final else state
    pathed = path is not None
    if not pathed:
        path = lengths = state  # unused pointers
    bk = triton.next_power_of_2(dk)
    bv = min(block_v or BLOCK_V, triton.next_power_of_2(dv))
    warps = num_warps or (4 if bk * bv >= 2048 else 1)
    grid = (triton.cdiv(dv, bv), b * hv, walks)
    _walk_kernel[grid](q, k, v, g, beta, state, o, snaps, fin, path, lengths,
                       t, walks, path.shape[-1] if pathed else 0, hv, hv // hk, math.sqrt(dk), L2_EPS,
                       *_strides(q), *_strides(k), *_strides(v), *_strides(g), *_strides(beta),
                       DK=dk, DV=dv, BK=bk, BV=bv, NORMALIZE=normalize, PATHED=pathed, EVERY_ROW=every_row,
                       OUT=out, SNAP=snap, FINAL=final, num_warps=warps)
    return (o if out else None), (snaps if snap else None), (fin if final else None)


def recurrent_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   state: torch.Tensor, normalize: bool = True, snapshots: bool = False, final: bool = True,
                   block_v: int | None = None, num_warps: int | None = None):
    """Token by token over rows 0..T-1 from `state`: o [B, T, Hv, Dv], then (if asked) every row's state
    [B, T, Hv, Dk, Dv] (naive.chain_snapshots), then (if asked) the final state [B, Hv, Dk, Dv] (naive.recurrent).
    Returns o alone when neither is asked for, else a tuple in that order. `state` is read, never written."""
    if k.shape[1] == 0:
        raise ValueError("recurrent_rows needs at least one row")
    o, snaps, fin = _walk(q, k, v, g, beta, state, out=True, every_row=True, snap=snapshots, final=final,
                          normalize=normalize, block_v=block_v, num_warps=num_warps)
    extra = tuple(x for x in (snaps, fin) if x is not None)
    return (o, *extra) if extra else o


def tree_paths(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """parents [B, N] (parents precede children; the root's entry ignored) -> (path [B, N, N] int32, each node's
    root..n path root first, padded with -1; lengths [B, N] int32, depth + 1).

    On the device without a host sync: up[:, n, j] is n's j-th ancestor (0, the root, once past it), built by
    pointer doubling in ceil(log2 N) rounds of gathers, then read backwards from each node's depth."""
    b, n = parents.shape
    par = parents.long().clone()
    par[:, 0] = 0  # the root is its own parent: walking up stays there
    up = torch.arange(n, device=parents.device).expand(b, n).unsqueeze(-1)  # [B, N, m]: up_0..up_{m-1}
    while up.shape[-1] < n:  # a static count of rounds: n is a shape
        m = up.shape[-1]
        jump = par.gather(1, up[:, :, -1])  # up_m = parent of up_{m-1}
        up = torch.cat([up, up.gather(1, jump.unsqueeze(-1).expand(b, n, m))], dim=-1)  # up_{m+j} = up_j(up_m)
    up = up[:, :, :n]
    depth = (up != 0).sum(-1)  # the non-root nodes on the path, i.e. the depth
    back = depth.unsqueeze(-1) - torch.arange(n, device=parents.device)  # path[d] = up_{depth - d}
    path = up.gather(-1, back.clamp(min=0)).masked_fill(back < 0, -1)
    return path.to(torch.int32), (depth + 1).to(torch.int32)


def tree_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              state: torch.Tensor, parents: torch.Tensor, normalize: bool = True, snapshots: bool = False,
              block_v: int | None = None, num_warps: int | None = None, paths=None):
    """Tree verification, rows [B, N] in topological order: o [B, N, Hv, Dv] (naive.tree), node n's the token loop
    along its root..n path from `state`; with snapshots=True (o, states [B, N, Hv, Dk, Dv]) (naive.tree_snapshots).
    A program per (node, head, column block) walks its own path: nothing is shared between nodes. paths: what
    tree_paths(parents) gives, when the caller made it already (once for all the layers of a forward)."""
    path, lengths = tree_paths(parents) if paths is None else paths
    o, snaps, _ = _walk(q, k, v, g, beta, state, out=True, every_row=False, snap=snapshots, final=False,
                        walks=parents.shape[1], path=path, lengths=lengths, normalize=normalize, block_v=block_v,
                        num_warps=num_warps)
    return (o, snaps) if snapshots else o


def commit_path(path: torch.Tensor, accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The commit's one walk a sequence as the kernel reads it: (path [B, 1, P] int32, lengths [B, 1] int32)."""
    lengths = (accepted.reshape(-1, 1) + 1).clamp(0, path.shape[1]).to(torch.int32)
    return path.to(torch.int32).unsqueeze(1).contiguous(), lengths.contiguous()


def commit_rows(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
                path: torch.Tensor, accepted: torch.Tensor, normalize: bool = True, block_v: int | None = None,
                num_warps: int | None = None, walk=None) -> torch.Tensor:
    """The state after rows path[b, :accepted[b] + 1] (root first; entries past them ignored), [B, Hv, Dk, Dv]
    (naive.commit): recurrent_rows's kernel and step, so the bits of decoding those tokens one at a time. walk:
    commit_path(path, accepted), when the caller made it already (once for all the layers of a commit)."""
    walk_path, lengths = commit_path(path, accepted) if walk is None else walk
    _, _, fin = _walk(None, k, v, g, beta, state, out=False, every_row=False, snap=False, final=True,
                      path=walk_path, lengths=lengths, normalize=normalize, block_v=block_v, num_warps=num_warps)
    return fin
