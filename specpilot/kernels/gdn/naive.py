"""Gated DeltaNet (GDN) references on the CPU: prefill, chain and tree verification, commit, the short conv, and the
exact FP32 -> 3 x BF16 split. The math is described in `specpilot/kernels/gdn/__init__.py`.

Layout (Qwen3.5 / Qwen3-Next): q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv] with Hv a multiple of Hk; g, beta [B, T, Hv];
state [B, Hv, Dk, Dv] float32. Inside, every tensor is moved to [B, Hv, T, ...] (transformers' order) so that the
token loop runs exactly transformers' float32 operations. Outputs are float32 whatever the input dtype: the caller
casts (the gated RMSNorm that follows reads float32 best).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

L2_EPS = 1e-6  # transformers' and FLA's l2norm epsilon


# ---------------------------------------------------------------------------------------------------------------
# shared pieces


def l2norm(x: torch.Tensor, eps: float = L2_EPS) -> torch.Tensor:
    """x / |x| over the last dim, written as transformers writes it (x * rsqrt(sum x^2 + eps)) for bitwise parity."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _heads(x: torch.Tensor, hv: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, T, H, ...] -> [B, Hv, T, ...] in dtype; k heads repeat_interleave'd onto their Hv/Hk value heads."""
    if x.dim() == 4 and x.shape[2] != hv:
        if hv % x.shape[2]:
            raise ValueError(f"{hv} value heads are not a multiple of {x.shape[2]} key heads")
        x = x.repeat_interleave(hv // x.shape[2], dim=2)
    return x.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format)


def _prep_q(q: torch.Tensor, hv: int, normalize: bool, dtype: torch.dtype) -> torch.Tensor:
    q = _heads(q, hv, dtype)
    if normalize:
        q = l2norm(q)
    return q / (q.shape[-1] ** 0.5)  # a division, as transformers' recurrent form (not * D**-0.5: the last bit differs)


def _prep_kv(k, v, g, beta, normalize: bool, dtype: torch.dtype):
    hv = v.shape[2]
    k = _heads(k, hv, dtype)
    if normalize:
        k = l2norm(k)
    return k, _heads(v, hv, dtype), _heads(g, hv, dtype), _heads(beta, hv, dtype)


def _step(s: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, g_t: torch.Tensor,
          b_t: torch.Tensor) -> torch.Tensor:
    """One token of the delta rule, [B, Hv, Dk, Dv] state; the same operations in the same order as transformers."""
    s = s * g_t.exp()[..., None, None]
    kv_mem = (s * k_t.unsqueeze(-1)).sum(dim=-2)
    delta = (v_t - kv_mem) * b_t.unsqueeze(-1)
    return s + k_t.unsqueeze(-1) * delta.unsqueeze(-2)


def _read(s: torch.Tensor, q_t: torch.Tensor) -> torch.Tensor:
    """o = S^T q, [B, Hv, Dv]."""
    return (s * q_t.unsqueeze(-1)).sum(dim=-2)


def _scan(q, k, v, g, beta, s):
    """Token loop over prepared [B, Hv, T, ...] tensors: yields (o_t, S_t) for every t."""
    for t in range(k.shape[2]):
        s = _step(s, k[:, :, t], v[:, :, t], g[:, :, t], beta[:, :, t])
        yield _read(s, q[:, :, t]), s


# ---------------------------------------------------------------------------------------------------------------
# chain: token loop, chunked prefill, per-position snapshots


def recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              state: torch.Tensor, normalize: bool = True,
              dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token: (o [B, T, Hv, Dv], state after the last token [B, Hv, Dk, Dv]), both in dtype (float32).

    Bit-for-bit transformers' `torch_recurrent_gated_delta_rule` (use_qk_l2norm_in_kernel=normalize) with q and k
    repeated onto the value heads. dtype=float64 is the high-precision reference the tree tests use."""
    hv = v.shape[2]
    qh = _prep_q(q, hv, normalize, dtype)
    kh, vh, gh, bh = _prep_kv(k, v, g, beta, normalize, dtype)
    s, outs = state.to(dtype), []
    for o_t, s_t in _scan(qh, kh, vh, gh, bh, s):
        outs.append(o_t)
        s = s_t
    o = torch.stack(outs, dim=2) if outs else vh.new_zeros(vh.shape)
    return o.transpose(1, 2).contiguous(), s


def chain_snapshots(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    state: torch.Tensor, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Stock chain verification: (o [B, T, Hv, Dv], states [B, T, Hv, Dk, Dv]) with states[:, t] the state after row
    t, so committing an accepted prefix of a + 1 rows is `states[:, a]` (no recompute, T states written)."""
    hv = v.shape[2]
    qh = _prep_q(q, hv, normalize, torch.float32)
    kh, vh, gh, bh = _prep_kv(k, v, g, beta, normalize, torch.float32)
    pairs = list(_scan(qh, kh, vh, gh, bh, state.float()))
    o = torch.stack([p[0] for p in pairs], dim=1)  # [B, T, Hv, Dv]
    return o, torch.stack([p[1] for p in pairs], dim=1)


def _block(q, k, v, g_acc, beta, s, seen):
    """The WY/UT form over one block of rows, [B, Hv, N, ...] prepared tensors.

    seen [B|1, 1, N, N] bool: row i reads row j (j is i or an ancestor of i: a causal block is the lower triangle);
    g_acc [B, Hv, N]: the log decay summed along each row's path from the block's start (G). Returns
    (o [B, Hv, N, Dv], u [B, Hv, N, Dv]) with u_j what row j writes: S_j = e^{g_j} S_parent + k_j u_j^T."""
    n = k.shape[2]
    strict = seen & ~torch.eye(n, dtype=torch.bool, device=k.device)
    # e^{G_i - G_j} where i reads j; -inf first elsewhere, so an unrelated pair (G_i - G_j may be > 0) cannot overflow
    decay = (g_acc.unsqueeze(-1) - g_acc.unsqueeze(-2)).masked_fill(~seen, float("-inf")).exp()
    # (I + A) u = beta v - beta e^G K S0, A[i, j] = beta_i e^{G_i - G_j} k_i.k_j over strict ancestors j
    a = (k @ k.transpose(-1, -2)) * decay * beta.unsqueeze(-1) * strict
    v_beta = v * beta.unsqueeze(-1)
    k_beta_decayed = k * (beta * g_acc.exp()).unsqueeze(-1)
    u0 = torch.linalg.solve_triangular(a, v_beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(a, k_beta_decayed, upper=False, unitriangular=True)
    u = u0 - w @ s
    o = (q @ s) * g_acc.exp().unsqueeze(-1) + ((q @ k.transpose(-1, -2)) * decay) @ u
    return o, u


def chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            state: torch.Tensor, chunk: int = 64, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill in chunks of `chunk` rows (the last one may be shorter; no padding): (o [B, T, Hv, Dv], new state).

    Per chunk, the causal WY/UT block (_block) from the state entering it, then
    S <- e^{G_last} S + K^T (e^{G_last - G} u). Equals `recurrent` up to float32 rounding."""
    hv = v.shape[2]
    qh = _prep_q(q, hv, normalize, torch.float32)
    kh, vh, gh, bh = _prep_kv(k, v, g, beta, normalize, torch.float32)
    s, outs = state.float(), []
    for start in range(0, kh.shape[2], chunk):
        rows = slice(start, start + chunk)
        n = kh[:, :, rows].shape[2]
        causal = torch.ones(n, n, dtype=torch.bool, device=kh.device).tril()
        g_acc = gh[:, :, rows].cumsum(dim=-1)
        o, u = _block(qh[:, :, rows], kh[:, :, rows], vh[:, :, rows], g_acc, bh[:, :, rows], s, causal)
        outs.append(o)
        tail = (g_acc[..., -1:] - g_acc).exp().unsqueeze(-1)  # decay from each row to the chunk's end
        s = s * g_acc[..., -1].exp()[..., None, None] + kh[:, :, rows].transpose(-1, -2) @ (u * tail)
    o = torch.cat(outs, dim=2) if outs else vh.new_zeros(vh.shape)
    return o.transpose(1, 2).contiguous(), s


# ---------------------------------------------------------------------------------------------------------------
# trees


def check_parents(parents: torch.Tensor) -> None:
    """parents [B, N] int: row 0 is the root (its entry, -1 or 0, is ignored); 0 <= parents[:, n] < n for n > 0.
    Values are checked on the CPU only: on a GPU the check is a host sync in every GDN layer of every step, and
    illegal inside a captured one (it broke the hybrid's first CUDA-graph capture, 2026-12-06); the engine's parents
    come from the tree builders, whose output the tree tests check."""
    if parents.dim() != 2:
        raise ValueError(f"parents must be [B, N], got {tuple(parents.shape)}")
    if parents.device.type != "cpu":
        return
    rest = parents[:, 1:]
    upper = torch.arange(1, parents.shape[1], device=parents.device)
    if bool(((rest < 0) | (rest >= upper)).any()):
        raise ValueError("parents[:, n] must lie in [0, n) for n > 0 (nodes in topological order)")


def once(memo: dict | None, key, make):
    """memo[key], made by make() the first time (always made when memo is None): what the layers of one forward
    share (Forward.derived)."""
    if memo is None:
        return make()
    if key not in memo:
        memo[key] = make()
    return memo[key]


def chain_parents(batch: int, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[B, N]: a chain as a tree, parents[:, n] = n - 1 (the root's -1)."""
    return (torch.arange(n, device=device) - 1).expand(batch, n).contiguous()


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    """[B, N, N] bool: seen[b, i, j] iff j is i or an ancestor of i (lower triangular: parents precede children)."""
    check_parents(parents)
    parents = parents.long()
    b, n = parents.shape
    seen = torch.eye(n, dtype=torch.bool, device=parents.device).expand(b, n, n).clone()
    rows = torch.arange(b, device=parents.device)
    for i in range(1, n):  # the parent's row is final already (parent < i)
        seen[:, i] |= seen[rows, parents[:, i]]
    return seen


def _path_decay(g: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """G [B, Hv, N]: G_n = G_parent + g_n (G_root = g_root), the log decay summed along the root..n path."""
    acc = torch.empty_like(g)
    acc[:, :, 0] = g[:, :, 0]
    idx = parents.long().unsqueeze(1).expand(-1, g.shape[1], -1)
    for i in range(1, g.shape[2]):
        acc[:, :, i] = acc.gather(2, idx[:, :, i:i + 1]).squeeze(2) + g[:, :, i]
    return acc


def tree(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
         state: torch.Tensor, parents: torch.Tensor, normalize: bool = True,
         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Tree verification in one pass, no per-node state: o [B, N, Hv, Dv], rows [B, N] in topological order.

    Node n's output is what the recurrence gives running from `state` along root..n. The causal WY block with the
    causal mask replaced by the ancestor mask and the cumsum of g by the path sum; the kernel does it as one block
    of N <= 64 rows (this reference accepts any N). dtype=float64 shows the algorithm exact to rounding."""
    hv = v.shape[2]
    qh = _prep_q(q, hv, normalize, dtype)
    kh, vh, gh, bh = _prep_kv(k, v, g, beta, normalize, dtype)
    seen = ancestors(parents).unsqueeze(1)  # [B, 1, N, N], shared by the heads
    o, _ = _block(qh, kh, vh, _path_decay(gh, parents), bh, state.to(dtype), seen)
    return o.transpose(1, 2).contiguous()


def root_path(parents_row: torch.Tensor, n: int) -> list[int]:
    """Node indices root..n, root first, of one sequence's tree (parents_row [N])."""
    path = [n]
    while path[-1] != 0:
        path.append(int(parents_row[path[-1]]))
    return path[::-1]


def tree_by_paths(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                  state: torch.Tensor, parents: torch.Tensor, normalize: bool = True,
                  dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The tree's definition, slowly: o [B, N, Hv, Dv], node n's row the last output of `recurrent` (in dtype) over
    its root..n path from `state`."""
    check_parents(parents)
    b, n = parents.shape
    out = torch.empty(b, n, v.shape[2], v.shape[3], dtype=dtype)
    for i in range(b):
        for j in range(n):
            p = root_path(parents[i], j)
            o, _ = recurrent(q[i:i + 1, p], k[i:i + 1, p], v[i:i + 1, p], g[i:i + 1, p], beta[i:i + 1, p],
                             state[i:i + 1], normalize, dtype)
            out[i, j] = o[0, -1]
    return out


def tree_snapshots(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   state: torch.Tensor, parents: torch.Tensor,
                   normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree verification as stock's chain does it, a state per node (`hybrid_tree=snapshot`): (o [B, N, Hv, Dv],
    states [B, N, Hv, Dk, Dv]), node n's state one delta-rule step from its parent's (the root's from `state`), in
    topological order; the commit of a path is the state of its last node. N states of memory, where the tree form
    (`tree`, with `commit`) keeps none."""
    check_parents(parents)
    hv = v.shape[2]
    qh = _prep_q(q, hv, normalize, torch.float32)
    kh, vh, gh, bh = _prep_kv(k, v, g, beta, normalize, torch.float32)
    rows = torch.arange(parents.shape[0], device=parents.device)
    states, outs = [], []
    for n in range(parents.shape[1]):
        parent = parents[:, n].clamp(min=0)
        before = state.float() if n == 0 else torch.stack(states, 1)[rows, parent]
        s = _step(before, kh[:, :, n], vh[:, :, n], gh[:, :, n], bh[:, :, n])
        states.append(s)
        outs.append(_read(s, qh[:, :, n]))
    return torch.stack(outs, 1), torch.stack(states, 1)


def _gather_rows(x: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
    """x [B, N, ...] -> [B, P, ...]: the rows path [B, P] names."""
    idx = path.reshape(*path.shape, *([1] * (x.dim() - 2))).expand(*path.shape, *x.shape[2:])
    return x.gather(1, idx)


def commit(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
           path: torch.Tensor, accepted: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """The state after the accepted path, [B, Hv, Dk, Dv] float32.

    path [B, P] holds the verified rows' node indices in order, root first; accepted [B] the accepted drafts, so
    rows path[b, :accepted[b] + 1] are kept (entries past them are ignored and may be anything, e.g. -1). Re-runs
    the float32 token loop over exactly those rows from `state`: the same operations as `recurrent` over those
    tokens, so the same bits. A shorter sequence keeps its state through torch.where, which copies, not computes."""
    safe = path.clamp(0, k.shape[1] - 1)
    kh, vh, gh, bh = _prep_kv(*(_gather_rows(x, safe) for x in (k, v, g, beta)), normalize, torch.float32)
    s = state.float()
    for t in range(path.shape[1]):
        keep = (accepted >= t).reshape(-1, 1, 1, 1)
        s = torch.where(keep, _step(s, kh[:, :, t], vh[:, :, t], gh[:, :, t], bh[:, :, t]), s)
    return s


# ---------------------------------------------------------------------------------------------------------------
# the short causal conv (kernel K = 4) over the q, k, v channels


def _window_rows(conv_state: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """[B, N, K] indices into cat(conv_state rows, x rows): each node's K inputs oldest first, ending at itself.

    In that joined sequence the conv state's K - 1 inputs come first (the last one just before the root); a node's
    predecessor is its parent, the root's is the last conv-state input, a conv-state input's the one before it."""
    check_parents(parents)
    parents = parents.long()
    b, n = parents.shape
    held = conv_state.shape[-1]
    if held < 1:
        raise ValueError("the conv state must hold K - 1 >= 1 inputs")
    before = (torch.arange(held, device=parents.device) - 1).clamp(min=0).expand(b, held)
    root = torch.full((b, 1), held - 1, dtype=parents.dtype, device=parents.device)
    prev = torch.cat([before, root, held + parents[:, 1:]], dim=1)  # [B, K - 1 + N]
    idx = (held + torch.arange(n, device=parents.device)).expand(b, n)
    cols = [idx]
    for _ in range(held):  # walk K - 1 steps up; never past the first conv-state input
        idx = prev.gather(1, idx)
        cols.append(idx)
    return torch.stack(cols[::-1], dim=-1)


def conv_tree(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, parents: torch.Tensor,
              memo: dict | None = None) -> torch.Tensor:
    """Depthwise causal conv1d + SiLU over a tree: y [B, N, C] in x's dtype (math in float32).

    x [B, N, C] the rows' inputs, weight [C, K], conv_state [B, C, K - 1] the last committed inputs (oldest first);
    memo: the forward's shared dict (the windows' rows are made once for its layers).
    Node n's window is its ancestor path, then the conv state for the positions before the root."""
    b, n, c = x.shape
    rows = once(memo, ("conv_windows", conv_state.shape[-1]), lambda: _window_rows(conv_state, parents))  # [B, N, K]
    joined = torch.cat([conv_state.transpose(1, 2).float(), x.float()], dim=1)  # [B, K - 1 + N, C]
    win = _gather_rows(joined, rows.reshape(b, -1)).reshape(b, n, -1, c)  # [B, N, K, C]
    y = (win * weight.float().t()).sum(dim=2)
    return F.silu(y).to(x.dtype)


def conv_chain(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
               memo: dict | None = None) -> torch.Tensor:
    """The chain case of conv_tree (parents n - 1): transformers' causal_conv1d_update token by token."""
    return conv_tree(x, weight, conv_state, chain_parents(x.shape[0], x.shape[1], x.device), memo)


def conv_state_after(x: torch.Tensor, conv_state: torch.Tensor, path: torch.Tensor,
                     accepted: torch.Tensor, memo: dict | None = None) -> torch.Tensor:
    """[B, C, K - 1] in conv_state's dtype: the last K - 1 inputs along the accepted path path[b, :accepted[b] + 1],
    older ones from the old conv state where the path is shorter than K - 1. memo: the commit's shared dict."""
    held = conv_state.shape[-1]
    rows_at = once(memo, ("conv_path", x.shape[1]), lambda: path.clamp(0, x.shape[1] - 1))
    rows = _gather_rows(x, rows_at).transpose(1, 2).to(conv_state.dtype)  # [B, C, P]
    joined = torch.cat([conv_state, rows], dim=2)  # path row t sits at held + t
    # the K - 1 ending at row accepted
    first = once(memo, ("conv_kept", held), lambda: (accepted + 1).reshape(-1, 1) + torch.arange(held, device=x.device))
    return joined.gather(2, first.unsqueeze(1).expand(-1, joined.shape[1], -1))


# ---------------------------------------------------------------------------------------------------------------
# FP32 -> 3 x BF16


TOP_HALF = -65536  # 0xFFFF0000 as int32: a float32 word's sign, exponent and top 7 fraction bits, i.e. a bf16


def _top_bf16(x: torch.Tensor) -> torch.Tensor:
    """x float32 truncated toward zero to its top 8 significant bits; exactly a bf16 (the word's upper half)."""
    return (x.view(torch.int32) & TOP_HALF).view(torch.float32)


def split3(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 x -> (hi, mid, lo) bf16 with hi + mid + lo == x exactly for every finite x with |x| >= 2^-110 (and 0).

    hi and mid are truncations (the top half of the float32 word), not round-to-nearest: a truncation is always an
    exact bf16 and never rounds up to inf, where RN(x) overflows for |x| >= 2^128 - 2^119. Why it is exact: x has
    24 significant bits on the grid ulp(x) = 2^(e - 23); hi takes the top 8, r1 = x - hi holds the other 16 on the
    same grid (exact in float32); mid takes r1's top 8; lo = r1 - mid has at most 8 bits, all on x's grid.
    lo is then a bf16 when its grid is on bf16's (bf16 subnormals are multiples of 2^-133): e - 23 >= -133, i.e.
    |x| >= 2^-110. Below, only lo rounds (to nearest): |x - (hi + mid + lo)| <= 2^-134, half a bf16 subnormal.
    Parts carry x's sign; -0.0 joins to +0.0."""
    x = x.float()
    hi = _top_bf16(x)
    r1 = x - hi  # exact: 16 bits on x's grid
    mid = _top_bf16(r1)
    lo = r1 - mid  # exact in float32: at most 8 bits on x's grid
    return hi.to(torch.bfloat16), mid.to(torch.bfloat16), lo.to(torch.bfloat16)


def join3(hi: torch.Tensor, mid: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """float32 (hi + mid) + lo: exact for split3's parts (hi + mid is x with its low bits cleared, a float32)."""
    return (hi.float() + mid.float()) + lo.float()
