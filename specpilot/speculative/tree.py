"""Draft trees over the drafter's lattice: what each builder proposes, as fixed-size device tensors.

A tree has N rows per sequence: row 0 is the anchor (the root), rows 1.. are draft nodes, each after its
parent (parents[r] < r). A node is a lattice coordinate: its depth d >= 1 (the token d places after the
anchor, lattice depth d - 1) and its index among that depth's top-K candidates, so siblings never share a
token and at most one path of a tree can match the target. Every builder runs on the device with static
shapes and no host sync: it is captured in the step's CUDA graph.

Builders (the `tree` option; `nodes` = N):
  chain       stock: the drafter's own greedy walk (N - 1 drafts at most, no more than the block);
  ddtree      the N - 1 best paths by summed per-position marginal log-probabilities (DDTree);
  best_first  the N - 1 best paths by summed conditional log-probabilities from the lattice's edges
              (the selector's softmax over a parent's K children, times the depth's top-K mass);
  eagle2      EAGLE-2: each depth keeps the best k nodes, each expands its k best children, and the
              N - 1 best of every expanded node are verified;
  sequoia     a static shape from Sequoia's dynamic program over an acceptance-by-rank vector, each node's
              children taken in the order of their conditional scores (speculative/sequoia.py).
"""

from __future__ import annotations

import torch

from specpilot.config.plan import KernelPlan
from specpilot.core.contracts import DraftTree, Lattice
from specpilot.kernels import tree_build

BUILDERS = ("chain", "ddtree", "best_first", "eagle2", "sequoia")


def child_scores(lattice: Lattice, builder: str) -> torch.Tensor:
    """log p(child | parent) [B, D, K_parent, K_child] in float32 (depth 0's parent is the anchor: row 0)."""
    if lattice.exact:  # a drafted tree's own conditionals (every builder reads them as they are)
        return lattice.edge_logp()
    if builder == "ddtree":
        return lattice.logp.float()[:, :, None, :].expand(-1, -1, lattice.width, -1)
    mass = torch.logsumexp(lattice.logp.float(), dim=-1)  # [B, D]: the top-K's share of each depth
    return lattice.edge_logp().float() + mass[:, :, None, None]


def best_paths(lattice: Lattice, scores: torch.Tensor, nodes: int, width: int = 0, fanout: int = 0) -> DraftTree:
    """The root and the N - 1 best lattice paths by summed `scores`, found depth by depth.

    width 0, fanout 0 (best_first, ddtree): each depth's beam keeps the N - 1 - d best nodes (every node of the
    global best set is in it: its ancestors score at least as high) and all of them compete. width k, fanout k
    (eagle2): each depth's best k nodes expand their k best children, all k * k compete. Ties go to the
    shallower node, so a parent always comes before its child: the rows are in score order."""
    b, depth, k, _ = scores.shape
    m = nodes - 1
    fan = fanout or k
    top_s, top_c = scores.topk(fan, dim=-1)  # each parent's best children, best first: [B, D, K, fan]
    s, c = top_s[:, 0, 0], top_c[:, 0, 0]  # depth 0: the anchor's children [B, fan]
    p = torch.zeros_like(c)  # global index of each entry's parent (0: the root)
    pool, offset = [], 1
    for d in range(depth):
        if d:
            prev_s, prev_c, prev_offset = s, c, pool[-1][3]
            if width and prev_s.shape[1] > width:  # eagle2: only the depth's best k expand
                prev_s, keep = prev_s.topk(width, dim=-1)
                prev_c = prev_c.gather(1, keep)
            else:
                keep = torch.arange(prev_s.shape[1], device=s.device).expand(b, -1)
            w = prev_s.shape[1]
            child_s = top_s[:, d].gather(1, prev_c[:, :, None].expand(-1, -1, fan))  # [B, W, fan]
            child_c = top_c[:, d].gather(1, prev_c[:, :, None].expand(-1, -1, fan))
            s = (prev_s[:, :, None] + child_s).reshape(b, w * fan)
            c = child_c.reshape(b, w * fan)
            p = (prev_offset + keep)[:, :, None].expand(-1, -1, fan).reshape(b, w * fan)
        limit = m - d  # a node at lattice depth d has d ancestors among the N - 1: no more can be chosen here
        if limit <= 0:
            break
        if s.shape[1] > limit:
            s, keep = s.topk(limit, dim=-1)
            c, p = c.gather(1, keep), p.gather(1, keep)
        pool.append((s, c, p, offset, d))
        offset += s.shape[1]
    return _select(lattice, pool, nodes)


def _select(lattice: Lattice, pool: list, nodes: int) -> DraftTree:
    """Root + the best N - 1 pool entries, in score order (stable: the shallower first on ties)."""
    b, dev = lattice.anchor.shape[0], lattice.anchor.device
    zero = torch.zeros(b, 1, device=dev)
    scores = torch.cat([torch.full_like(zero, float("inf"))] + [s for s, _, _, _, _ in pool], 1)  # the root first
    cands = torch.cat([zero.long()] + [c for _, c, _, _, _ in pool], 1)
    parents = torch.cat([zero.long()] + [p for _, _, p, _, _ in pool], 1)
    depths = torch.cat([zero.long()] + [torch.full_like(c, d + 1) for _, c, _, _, d in pool], 1)
    total = scores.shape[1]
    if nodes > total:
        raise ValueError(f"the lattice holds {total} nodes at most here, {nodes} asked")
    _, order = scores.sort(dim=1, descending=True, stable=True)
    sel = order[:, :nodes]  # [B, N]; sel[:, 0] == 0
    row_of = torch.zeros(b, total, dtype=torch.int64, device=dev)
    row_of.scatter_(1, sel, torch.arange(nodes, device=dev).expand(b, -1))
    parent_rows = row_of.gather(1, parents.gather(1, sel))
    depth = depths.gather(1, sel)
    cand = cands.gather(1, sel)
    return DraftTree(parents=parent_rows, depth=depth, cand=cand, tokens=_tokens(lattice, depth, cand))


def _tokens(lattice: Lattice, depth: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """Each row's token: the anchor at the root, else its lattice candidate."""
    b, d, k = lattice.tokens.shape
    flat = lattice.tokens.reshape(b, d * k)
    drafted = flat.gather(1, ((depth - 1).clamp(min=0) * k + cand))
    return torch.where(depth == 0, lattice.anchor[:, None], drafted)


def chain_tree(lattice: Lattice, nodes: int) -> DraftTree:
    """Stock's greedy walk as a tree of min(N, D + 1) rows."""
    b, dev = lattice.anchor.shape[0], lattice.anchor.device
    n = min(nodes, lattice.depth + 1)
    index = torch.arange(n, device=dev).expand(b, -1)
    cand = torch.cat([torch.zeros_like(index[:, :1]), lattice.greedy_picks()[:, : n - 1]], 1)
    return DraftTree(parents=(index - 1).clamp(min=0), depth=index, cand=cand, tokens=_tokens(lattice, index, cand))


def static_tree(lattice: Lattice, scores: torch.Tensor, levels: list[tuple[int, int, torch.Tensor, torch.Tensor]],
                parents: torch.Tensor, depths: torch.Tensor, seen: torch.Tensor) -> DraftTree:
    """A fixed shape: rows in depth order, row r > 0 its parent's ranks[r]-th best child by `scores`; levels: per
    depth (first row, end row, parent rows, ranks) as device tensors (made once: a captured step copies nothing
    from the host)."""
    b = lattice.anchor.shape[0]
    order = scores.argsort(dim=-1, descending=True, stable=True)  # [B, D, K, K]
    cand = torch.zeros(b, parents.shape[0], dtype=torch.int64, device=scores.device)
    for d, (lo, hi, par, rank) in enumerate(levels, start=1):
        parent_cand = cand[:, par]  # [B, n_d]
        picks = order[:, d - 1].gather(1, parent_cand[:, :, None].expand(-1, -1, order.shape[-1]))
        cand[:, lo:hi] = picks.gather(2, rank.expand(b, -1)[:, :, None])[:, :, 0]
    depth, par_rows = depths.expand(b, -1), parents.expand(b, -1)
    return DraftTree(parents=par_rows, depth=depth, cand=cand, tokens=_tokens(lattice, depth, cand),
                seen=seen.expand(b, -1, -1))


def static_levels(parents: list[int], ranks: list[int], depths: list[int], device) -> tuple:
    """static_tree's index tensors for a shape (parents, ranks, depths; rows in depth order), and its ancestor
    matrix (as fixed as the shape)."""
    n = len(parents)
    seen = torch.eye(n, dtype=torch.bool)
    for r in range(1, n):
        seen[r] |= seen[parents[r]]
    levels = []
    for d in range(1, max(depths) + 1):
        rows = [r for r in range(len(parents)) if depths[r] == d]
        lo, hi = rows[0], rows[-1] + 1  # depth order: one contiguous range
        levels.append((lo, hi, torch.tensor(parents[lo:hi], device=device), torch.tensor(ranks[lo:hi], device=device)))
    return levels, torch.tensor(parents, device=device), torch.tensor(depths, device=device), seen.to(device)


class TreeBuilder:
    """One builder at one node budget, fixed when the engine is built (`tree`, `nodes`, `tree_k`,
    `tree_accept`); called on each step's lattice. depth D and width K: the lattice's."""

    def __init__(self, builder: str, nodes: int, depth: int, width: int, k: int = 4,
                 accept: tuple[float, ...] = (), plan: KernelPlan | None = None):
        """plan: the kernel plan (best_first and ddtree in one Triton launch where it applies); None: the
        PyTorch reference (replay, tests)."""
        if builder not in BUILDERS:
            raise ValueError(f"unknown tree builder {builder!r} (known: {', '.join(BUILDERS)})")
        self.builder, self.depth, self.width, self.k = builder, depth, width, min(k, width)
        self.plan = plan
        most = max_nodes(builder, depth, width, self.k)
        if not 2 <= nodes <= most:  # a chain too: asked more than its block, it would have run less, unsaid
            raise ValueError(f"tree={builder} holds 2..{most} nodes on a lattice of depth {depth} and width "
                             f"{width}, {nodes} asked")
        self.nodes = nodes
        self.shape, self._levels = None, {}
        if builder == "sequoia":
            from specpilot.speculative import sequoia

            self.shape = sequoia.shape(tuple((accept or sequoia.DEFAULT_ACCEPT)[:width]), self.nodes, depth)

    @property
    def rows(self) -> int:
        return self.nodes

    def __call__(self, lattice: Lattice) -> DraftTree:
        if self.builder == "chain":
            return chain_tree(lattice, self.nodes)
        scores = child_scores(lattice, self.builder)
        if self.builder == "sequoia":
            dev = lattice.tokens.device
            if dev not in self._levels:  # the first (eager) call, before any capture
                self._levels[dev] = static_levels(*self.shape, dev)
            return static_tree(lattice, scores, *self._levels[dev])
        if self.builder == "eagle2":
            pool = self.k + (self.depth - 1) * self.k * self.k
            if tree_build.applies(scores, self.nodes, self.plan, pool):
                return DraftTree(*tree_build.eagle2_rows(scores, lattice.tokens, lattice.anchor, self.nodes, self.k))
            return best_paths(lattice, scores, self.nodes, width=self.k, fanout=self.k)
        if tree_build.applies(scores, self.nodes, self.plan):
            return DraftTree(*tree_build.best_first_rows(scores, lattice.tokens, lattice.anchor, self.nodes))
        return best_paths(lattice, scores, self.nodes)


def max_nodes(builder: str, depth: int, width: int, k: int) -> int:
    """The most rows a builder can place on a lattice of this depth and width (the root included)."""
    if builder == "chain":
        return depth + 1
    if builder == "eagle2":
        return 1 + k + (depth - 1) * k * k
    total, level = 1, 1
    for _ in range(depth):
        level *= width
        total += level
        if total > 4096:
            return 4096
    return total
