"""Draft trees: valid shapes, optimal selection, the acceptance walk, the commit, and Sequoia's program.

Random lattices (hypothesis) stand in for the drafter: every builder must return a valid tree (parents before
children, exactly N rows, depth within the lattice, distinct siblings); best_first and ddtree must hold the N - 1
best paths by their scores (checked against every path of the lattice), eagle2 must equal a plain loop of its
rule, and the Sequoia shape must be the best of every tree a brute force enumerates.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.config.options import OPTIONS
from specpilot.core.contracts import DraftTree, Lattice, Proposal, Visibility, verify_mask
from specpilot.models.cache import Cache
from specpilot.speculative import sequoia
from specpilot.speculative.accept import accept_tree
from specpilot.speculative.tree import BUILDERS, TreeBuilder, child_scores, max_nodes


@st.composite
def lattices(draw, selector: bool | None = None):
    b = draw(st.integers(1, 3))
    d = draw(st.integers(1, 4))
    k = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    with_edges = draw(st.booleans()) if selector is None else selector
    gen = torch.Generator().manual_seed(seed)
    vocab = 50
    tokens = torch.stack([torch.stack([torch.randperm(vocab, generator=gen)[:k] for _ in range(d)])
                          for _ in range(b)])
    unary = torch.randn(b, d, k, generator=gen).sort(-1, descending=True).values
    # log-probabilities of a larger vocabulary's top K: below zero, best first
    logp = unary - torch.logsumexp(unary, -1, keepdim=True) - torch.rand(b, d, 1, generator=gen)
    edges = torch.randn(b, d, k, k, generator=gen) * 2 if with_edges else None
    anchor = torch.randint(0, vocab, (b,), generator=gen)
    return Lattice(tokens=tokens, unary=unary, logp=logp, edges=edges, anchor=anchor)


def _check_valid(tree: DraftTree, lattice: Lattice, rows: int) -> None:
    b, n = tree.parents.shape
    assert n == rows
    assert (tree.parents[:, 0] == 0).all() and (tree.depth[:, 0] == 0).all()
    assert torch.equal(tree.tokens[:, 0], lattice.anchor)
    for s in range(b):
        seen = set()
        for r in range(1, n):
            p = int(tree.parents[s, r])
            assert p < r  # parents before children
            d = int(tree.depth[s, r])
            assert d == int(tree.depth[s, p]) + 1 and 1 <= d <= lattice.depth
            c = int(tree.cand[s, r])
            assert (p, c) not in seen  # siblings are distinct candidates, so distinct tokens
            seen.add((p, c))
            assert int(tree.tokens[s, r]) == int(lattice.tokens[s, d - 1, c])


def _all_paths(scores: torch.Tensor, s: int) -> dict[tuple[int, ...], float]:
    """Every lattice path of sequence s (candidate indices by depth) with its summed score."""
    depth, k = scores.shape[1], scores.shape[2]
    out = {}
    for d in range(1, depth + 1):
        for path in itertools.product(range(k), repeat=d):
            total, parent = 0.0, 0
            for i, c in enumerate(path):
                total += float(scores[s, i, parent, c])
                parent = c
            out[path] = total
    return out


def _tree_paths(tree: DraftTree, s: int) -> list[tuple[int, ...]]:
    paths = [()]
    for r in range(1, tree.rows):
        paths.append(paths[int(tree.parents[s, r])] + (int(tree.cand[s, r]),))
    return paths[1:]


def walked(parents):
    """seen[s, r, i]: row i is r or one of its ancestors, found by walking up the parents one row at a time."""
    b, n = parents.shape
    seen = torch.zeros(b, n, n, dtype=torch.bool)
    for s in range(b):
        for r in range(n):
            u = r
            seen[s, r, u] = True
            while u:
                u = int(parents[s, u])
                seen[s, r, u] = True
    return seen


@settings(max_examples=80, deadline=None)
@given(lattices(), st.sampled_from(BUILDERS), st.integers(2, 40), st.integers(1, 4))
def test_every_builder_makes_a_valid_tree(lattice, name, nodes, k):
    most = max_nodes(name, lattice.depth, lattice.width, min(k, lattice.width))
    if nodes > most:  # the chain too: more rows than its block would be run as fewer, unsaid
        with pytest.raises(ValueError):
            TreeBuilder(name, nodes, lattice.depth, lattice.width, k)
        return
    if name == "sequoia":
        try:
            builder = TreeBuilder(name, nodes, lattice.depth, lattice.width, k, (0.5, 0.2, 0.1, 0.05))
        except ValueError:  # more nodes than Sequoia's ranks and depth can place
            assert nodes > max_nodes("best_first", lattice.depth, min(4, lattice.width), 0)
            return
    else:
        builder = TreeBuilder(name, nodes, lattice.depth, lattice.width, k)
    tree = builder(lattice)
    _check_valid(tree, lattice, nodes)
    # against a walk up the parents (sequoia keeps a matrix of its own; the others derive theirs)
    assert torch.equal(tree.ancestors(lattice.depth), walked(tree.parents))
    if name == "chain":
        assert torch.equal(tree.tokens[:, 1:], lattice.greedy_chain()[:, : tree.rows - 1])


@settings(max_examples=80, deadline=None)
@given(lattices(), st.sampled_from(["best_first", "ddtree"]), st.integers(2, 30))
def test_best_paths_hold_the_best_scores(lattice, name, nodes):
    """best_first / ddtree verify the N - 1 best lattice paths by their own scores (no other set scores more)."""
    if nodes > max_nodes(name, lattice.depth, lattice.width, 0):
        return
    scores = child_scores(lattice, name)
    tree = TreeBuilder(name, nodes, lattice.depth, lattice.width)(lattice)
    for s in range(lattice.tokens.shape[0]):
        every = _all_paths(scores, s)
        chosen = sorted((every[p] for p in _tree_paths(tree, s)), reverse=True)
        best = sorted(every.values(), reverse=True)[: nodes - 1]
        assert chosen == pytest.approx(best, abs=1e-4)


def _eagle2_loop(scores: torch.Tensor, s: int, nodes: int, k: int) -> list[float]:
    """EAGLE-2's rule written plainly: each depth's best k expand their k best children; the best N - 1 of all
    expanded nodes are verified."""
    depth = scores.shape[1]
    row0 = scores[s, 0, 0].tolist()
    frontier = sorted(((row0[c], c) for c in range(len(row0))), reverse=True)[:k]
    pool = [v for v, _ in frontier]
    for d in range(1, depth):
        expanded = []
        for value, c in frontier:
            row = scores[s, d, c].tolist()
            for child in sorted(range(len(row)), key=lambda j: -row[j])[:k]:
                expanded.append((value + row[child], child))
        pool += [v for v, _ in expanded]
        frontier = sorted(expanded, reverse=True)[:k]
    return sorted(pool, reverse=True)[: nodes - 1]


@settings(max_examples=60, deadline=None)
@given(lattices(), st.integers(2, 30), st.integers(1, 4))
def test_eagle2_follows_its_rule(lattice, nodes, k):
    k = min(k, lattice.width)
    if nodes > max_nodes("eagle2", lattice.depth, lattice.width, k):
        return
    scores = child_scores(lattice, "eagle2")
    tree = TreeBuilder("eagle2", nodes, lattice.depth, lattice.width, k)(lattice)
    for s in range(lattice.tokens.shape[0]):
        every = _all_paths(scores, s)
        chosen = sorted((every[p] for p in _tree_paths(tree, s)), reverse=True)
        assert chosen == pytest.approx(_eagle2_loop(scores, s, nodes, k), abs=1e-4)


def test_best_first_scores_are_conditional_and_ddtree_marginal():
    gen = torch.Generator().manual_seed(0)
    lattice = Lattice(tokens=torch.arange(12).view(1, 3, 4), unary=torch.zeros(1, 3, 4),
                      logp=torch.log_softmax(torch.randn(1, 3, 4, generator=gen), -1) - 1.0,
                      edges=torch.randn(1, 3, 4, 4, generator=gen), anchor=torch.tensor([99]))
    marginal = child_scores(lattice, "ddtree")
    assert torch.equal(marginal[0, 1, 0], marginal[0, 1, 3])  # every parent alike
    conditional = child_scores(lattice, "best_first")
    assert not torch.allclose(conditional[0, 1, 0], conditional[0, 1, 3])
    # a parent's children share the depth's top-K mass: exp sums to it
    mass = lattice.logp[0, 1].exp().sum()
    assert float(conditional[0, 1, 2].exp().sum()) == pytest.approx(float(mass), rel=1e-5)


def _shapes(nodes: int, depth: int, ranks: int):
    """Every tree of `nodes` rows (root included) with depth <= depth, children using ranks 0..c-1."""
    if nodes == 1:
        yield ()
        return
    if depth == 0:
        return
    # split nodes - 1 among up to `ranks` children, each a subtree
    def splits(left, r):
        if left == 0:
            yield ()
            return
        if r == ranks:
            return
        for m in range(1, left + 1):
            for rest in splits(left - m, r + 1):
                yield (m,) + rest
    for sizes in splits(nodes - 1, 0):
        for subs in itertools.product(*[list(_shapes(m, depth - 1, ranks)) for m in sizes]):
            yield tuple(subs)


def _value(shape, p) -> float:
    return sum(p[r] * (1 + _value(sub, p)) for r, sub in enumerate(shape))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.01, 0.6), min_size=1, max_size=3), st.integers(2, 7), st.integers(1, 3))
def test_sequoia_shape_is_the_best_tree(p, nodes, depth):
    p = sorted(p, reverse=True)
    p = [x / max(1.0, sum(p)) for x in p]
    brute = [_value(s, p) for s in _shapes(nodes, depth, len(p))]
    if not brute:
        with pytest.raises(ValueError):
            sequoia.shape(tuple(p), nodes, depth)
        return
    parents, ranks, depths = sequoia.shape(tuple(p), nodes, depth)
    assert len(parents) == nodes and max(depths) <= depth
    assert all(parents[r] < r and depths[r] == depths[parents[r]] + 1 for r in range(1, nodes))
    assert sequoia.expected(tuple(p), parents, ranks) == pytest.approx(max(brute), abs=1e-9)


def test_sequoia_accept_option_is_checked():
    assert sequoia.parse_accept("0.5/0.2") == (0.5, 0.2)
    assert sequoia.parse_accept("") == sequoia.DEFAULT_ACCEPT
    for bad in ("0.5/x", "0.9/0.3", "-0.1", "nan"):
        with pytest.raises(ValueError):
            sequoia.parse_accept(bad)


@settings(max_examples=60, deadline=None)
@given(lattices(), st.sampled_from(["best_first", "ddtree", "eagle2"]), st.integers(2, 20), st.integers(0, 2**31 - 1))
def test_tree_acceptance_walks_the_targets_argmax(lattice, name, nodes, seed):
    """accept_tree against a plain walk from the root: follow the child whose token is the target's argmax."""
    if nodes > max_nodes(name, lattice.depth, lattice.width, min(4, lattice.width)):
        return
    tree = TreeBuilder(name, nodes, lattice.depth, lattice.width)(lattice)
    b, n = tree.parents.shape
    gen = torch.Generator().manual_seed(seed)
    # argmax at each row: often one of its children's tokens (so paths get accepted), else another token
    predicted = torch.randint(0, 50, (b, n), generator=gen)
    for s in range(b):
        for r in range(n):
            kids = [u for u in range(1, n) if int(tree.parents[s, u]) == r]
            if kids and torch.rand(1, generator=gen) < 0.7:
                predicted[s, r] = tree.tokens[s, kids[int(torch.randint(0, len(kids), (1,), generator=gen))]]
    logits = torch.nn.functional.one_hot(predicted, 60).float()
    start = torch.tensor([5] * b)
    proposal = Proposal(tokens=tree.tokens, positions=start[:, None] + tree.depth,
                        slots=start[:, None] + torch.arange(n),
                        visibility=Visibility(start, start, tree.ancestors(lattice.depth)), parents=tree.parents,
                        index=torch.arange(n), chain=False, path_rows=lattice.depth + 1)
    verdict = accept_tree(proposal, logits.argmax(-1))
    for s in range(b):
        row, path = 0, [0]
        while True:
            nxt = [u for u in range(1, n) if int(tree.parents[s, u]) == row
                   and int(tree.tokens[s, u]) == int(predicted[s, row])]
            if not nxt:
                break
            row = nxt[0]
            path.append(row)
        assert int(verdict.accepted[s]) == len(path) - 1
        assert verdict.path[s, : len(path)].tolist() == path
        assert verdict.tokens[s, : len(path)].tolist() == [int(predicted[s, r]) for r in path]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(2, 12), st.integers(0, 2**31 - 1))
def test_ancestors_and_per_sequence_masks(b, n, seed):
    gen = torch.Generator().manual_seed(seed)
    parents = torch.zeros(b, n, dtype=torch.int64)
    for s in range(b):
        for r in range(1, n):
            parents[s, r] = int(torch.randint(0, r, (1,), generator=gen))
    depth = torch.zeros(b, n, dtype=torch.int64)
    for r in range(1, n):
        depth[:, r] = depth.gather(1, parents[:, r : r + 1])[:, 0] + 1
    tree = DraftTree(parents=parents, depth=depth, cand=torch.zeros_like(parents), tokens=torch.zeros_like(parents))
    seen = tree.ancestors(int(depth.max()))
    assert torch.equal(seen, walked(parents))
    cache_len = torch.randint(0, 20, (b,), generator=gen)
    start = torch.randint(0, 20, (b,), generator=gen)
    got = verify_mask(cache_len, start, seen, 40)
    for s in range(b):
        assert torch.equal(got[s], verify_mask(cache_len[s : s + 1], start[s : s + 1], seen[s], 40)[0])


@pytest.mark.parametrize("stacked", [True, False])
def test_commit_moves_the_path_into_consecutive_slots(stacked):
    gen = torch.Generator().manual_seed(3)
    cache = Cache.build(["attention"] * 3, 2, 32, 2, 4, torch.float32, "cpu", stacked=stacked)
    for state in cache.layers:
        state.k.copy_(torch.randn(state.k.shape, generator=gen))
        state.v.copy_(torch.randn(state.v.shape, generator=gen))
    before = [(s.k.clone(), s.v.clone()) for s in cache.layers]
    start = torch.tensor([3, 10])
    rows = torch.tensor([[0, 2, 5, 7], [0, 1, 4, 0]])
    cache.commit(rows, torch.tensor([3, 3]), start)
    for (k0, v0), state in zip(before, cache.layers, strict=True):
        for s in range(2):
            for i in range(4):
                src = int(start[s] + rows[s, i])
                assert torch.equal(state.k[s, :, int(start[s]) + i], k0[s, :, src])
                assert torch.equal(state.v[s, :, int(start[s]) + i], v0[s, :, src])
            assert torch.equal(state.k[s, :, : int(start[s])], k0[s, :, : int(start[s])])  # the prefix is untouched


def test_the_tree_option_lists_every_builder():
    assert tuple(OPTIONS["tree"].choices) == BUILDERS
    assert OPTIONS["tree"].default == "chain" and OPTIONS["nodes"].default == 0
