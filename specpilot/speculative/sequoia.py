"""Sequoia's static tree: the shape of N nodes and depth <= D that maximises the expected accepted drafts under
an acceptance-by-rank vector p (p[r]: how often a node's r-th best child is the target's token, given the node
was accepted; measured by `specpilot replay`).

With p non-increasing, a node with c children uses ranks 0..c-1, and the expected accepted drafts of a subtree
of n nodes whose root is accepted, h levels allowed below it, is
    F(n, h) = max over sizes m_0 + ... + m_{c-1} = n - 1 of  sum_r p[r] * (1 + F(m_r, h - 1)),   F(1, h) = 0,
solved as a knapsack over the ranks (Sequoia's dynamic program, without its hardware term: the node budget is
the engine's `nodes` option, tuned by measuring c(N)).
"""

from __future__ import annotations

import functools

import numpy as np

# tree_accept's syntax and default live with the option (config/options.py)
from specpilot.config.options import DEFAULT_ACCEPT as DEFAULT_ACCEPT
from specpilot.config.options import parse_accept as parse_accept


@functools.lru_cache(maxsize=64)
def shape(p: tuple[float, ...], nodes: int, max_depth: int) -> tuple[list[int], list[int], list[int]]:
    """(parents, ranks, depths) of the best tree with `nodes` rows (row 0 the root), rows in depth order."""
    p = tuple(max(x, 1e-12) for x in sorted(p, reverse=True))  # 0 * -inf would be nan
    ranks = len(p)
    # f[h, n]: best subtree of n nodes with h levels below its root; g[r, n]: children ranks r.. sharing n nodes
    f = np.full((max_depth + 1, nodes + 1), -np.inf)
    f[:, 1] = 0.0
    choice = {}
    for h in range(1, max_depth + 1):
        g = np.full((ranks + 1, nodes + 1), -np.inf)
        g[:, 0] = 0.0  # no more children (ranks are used in order: a rank left out ends the node)
        for r in range(ranks - 1, -1, -1):
            for n in range(1, nodes):
                v = p[r] * (1.0 + f[h - 1, 1 : n + 1]) + g[r + 1, n - 1 :: -1]  # child r takes m = 1..n nodes
                m = int(np.argmax(v))
                g[r, n] = v[m]
                choice[h, r, n] = m + 1
        f[h, 2:] = g[0, 1:nodes]
    if not np.isfinite(f[max_depth, nodes]):
        raise ValueError(f"tree=sequoia cannot place {nodes} nodes within depth {max_depth} using {ranks} child ranks "
                         "(tree_accept gives the ranks: give more, or fewer nodes)")
    return _unfold(choice, nodes, max_depth)


def _unfold(choice: dict, nodes: int, max_depth: int) -> tuple[list[int], list[int], list[int]]:
    """Rows of the chosen shape in breadth-first (depth) order."""
    children = {}  # node id -> [(rank, child id)]
    sizes = {0: (nodes, max_depth)}
    queue, next_id = [0], 1
    while queue:
        node = queue.pop(0)
        n, h = sizes[node]
        left, r = n - 1, 0
        children[node] = []
        while left > 0:
            m = choice[h, r, left]
            children[node].append((r, next_id))
            sizes[next_id] = (m, h - 1)
            queue.append(next_id)
            next_id, left, r = next_id + 1, left - m, r + 1
    parents, ranks, depths = [0], [0], [0]
    order, row_of = [0], {0: 0}
    for node in order:  # breadth first: depth order
        for rank, child in children[node]:
            row_of[child] = len(parents)
            parents.append(row_of[node])
            ranks.append(rank)
            depths.append(depths[row_of[node]] + 1)
            order.append(child)
    return parents, ranks, depths


def expected(p: tuple[float, ...], parents: list[int], ranks: list[int]) -> float:
    """Expected accepted drafts of a shape under p (the DP's objective, for tests)."""
    reach = [1.0] + [0.0] * (len(parents) - 1)
    ps = sorted(p, reverse=True)
    for r in range(1, len(parents)):
        reach[r] = reach[parents[r]] * ps[ranks[r]]
    return sum(reach[1:])
