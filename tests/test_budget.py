"""`batch_budget` (issue 59's shared row budget, speculative/budget.py): path scores, the allotment of a batch's rows
to the likeliest nodes of all requests' trees, the packed rows, and the engine: every request's tokens are single-
request AR's (float32 on the CPU, dense and hybrid, greedy and sampled), whatever the budget."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_trees import lattices

from specpilot.config import parse_system
from specpilot.core.contracts import Prompted, Sampling
from specpilot.errors import UserError
from specpilot.fixtures.random_models import (
    random_drafter,
    random_target,
    tiny_drafter_config,
    tiny_hybrid_config,
    tiny_target_config,
)
from specpilot.runtime.engine import Engine
from specpilot.speculative.allot import _merged
from specpilot.speculative.budget import allot_rows, chain_scores, expected_tokens, packed_rows, path_scores
from specpilot.speculative.tree import TreeBuilder, child_scores, max_nodes


@settings(max_examples=60, deadline=None)
@given(lattice=lattices(), builder=st.sampled_from(["best_first", "ddtree"]), data=st.data())
def test_path_scores_sum_each_paths_child_scores_and_fall_in_row_order(lattice, builder, data):
    most = max_nodes(builder, lattice.depth, lattice.width, 4)
    if most < 2:
        return
    n = data.draw(st.integers(2, min(most, 12)))
    tree = TreeBuilder(builder, n, lattice.depth, lattice.width)(lattice)
    scores = child_scores(lattice, builder)
    got = path_scores(tree, scores)
    for b in range(tree.parents.shape[0]):
        for r in range(n):
            total, row = 0.0, r
            while row:  # up the path, each edge's score from its parent's candidate (the root's: 0)
                parent, depth = int(tree.parents[b, row]), int(tree.depth[b, row])
                total += float(scores[b, depth - 1, int(tree.cand[b, parent]), int(tree.cand[b, row])])
                row = parent
            assert math.isclose(float(got[b, r]), total, rel_tol=1e-5, abs_tol=1e-5)
        assert all(float(got[b, r]) >= float(got[b, r + 1]) - 1e-5 for r in range(1, n - 1))  # score order


@settings(max_examples=40, deadline=None)
@given(lattice=lattices())
def test_a_chains_path_scores_sum_its_child_scores_down_the_drafters_own_walk(lattice):
    picks = lattice.greedy_picks()
    got = chain_scores(lattice, picks)
    scores = child_scores(lattice, "best_first")
    assert got.shape == (picks.shape[0], lattice.depth + 1) and bool((got[:, 0] == 0).all())
    for b in range(picks.shape[0]):
        total, parent = 0.0, 0
        for d in range(lattice.depth):
            total += float(scores[b, d, parent, int(picks[b, d])])
            parent = int(picks[b, d])
            assert math.isclose(float(got[b, d + 1]), total, rel_tol=1e-5, abs_tol=1e-5)
    assert bool((got[:, 1:] <= got[:, :-1] + 1e-6).all())  # a longer prefix is never likelier: rows in score order
    drafts = lattice.tokens.gather(2, picks[..., None])[..., 0]
    assert torch.equal(drafts, lattice.greedy_chain())  # the chain it scores is stock's


@st.composite
def score_tables(draw):
    b, n = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    rows = [sorted(draw(st.lists(st.floats(-20, 0, allow_nan=False), min_size=n - 1, max_size=n - 1)),
                   reverse=True) for _ in range(b)]
    return torch.tensor([[0.0] + r for r in rows])


@settings(max_examples=80, deadline=None)
@given(scores=score_tables(), data=st.data())
def test_the_budget_goes_to_the_roots_then_the_likeliest_nodes_as_prefixes(scores, data):
    b, n = scores.shape
    budget = data.draw(st.integers(b, b * n))
    counts = allot_rows(scores, budget)
    assert int(counts.sum()) == budget and bool((counts >= 1).all()) and bool((counts <= n).all())
    chosen = [float(scores[r, i]) for r in range(b) for i in range(1, int(counts[r]))]
    left = [float(scores[r, i]) for r in range(b) for i in range(int(counts[r]), n)]
    assert not chosen or not left or min(chosen) >= max(left)  # nothing left out beats what was chosen
    # the same shares as allot's reference merge by probability, where no two scores tie
    probs = [[math.exp(x) for x in row[1:]] for row in scores.tolist()]
    if len({x for row in probs for x in row}) == sum(len(r) for r in probs):
        want = [1] * b
        for _, r, _ in _merged(probs, budget - b):
            want[r] += 1
        assert counts.tolist() == want
    valid, packed = packed_rows(counts, n, budget)
    assert valid.sum(1).tolist() == counts.tolist() and valid[:, 0].all()
    assert packed.tolist() == valid.reshape(-1).nonzero()[:, 0].tolist()


@settings(max_examples=60, deadline=None)
@given(scores=score_tables(), data=st.data())
def test_a_budgets_expected_tokens_are_a_token_a_live_request_and_its_chosen_nodes_probabilities(scores, data):
    b, n = scores.shape
    live = torch.tensor(data.draw(st.lists(st.integers(0, 1), min_size=b, max_size=b)))
    offers = tuple(sorted(data.draw(st.lists(st.integers(b, b * n), min_size=1, max_size=4))))
    got = expected_tokens(scores, offers, live).tolist()
    # by hand: every live request's nodes (below the roots), the likeliest first, the first t - b of them
    probs = sorted((math.exp(float(scores[r, i])) for r in range(b) if live[r] for i in range(1, n)), reverse=True)
    for t, e in zip(offers, got, strict=True):
        assert math.isclose(e, int(live.sum()) + sum(probs[: t - b]), rel_tol=1e-5, abs_tol=1e-5)
    assert got == sorted(got)  # more rows never expect fewer tokens
    with pytest.raises(ValueError):
        expected_tokens(scores, (b - 1,))


def test_parked_requests_keep_their_root_alone():
    scores = torch.tensor([[0.0, -0.1, -0.2, -0.3], [0.0, -5.0, -6.0, -7.0]])
    assert allot_rows(scores, 4, torch.tensor([0, 1])).tolist() == [1, 3]  # the likelier request is parked
    assert allot_rows(scores, 4).tolist() == [3, 1]
    with pytest.raises(ValueError):
        allot_rows(scores, 1)


# ---------------------------------------------------------------------------------------------------------------
# the engine

VOCAB, CONTEXT = 24, 96


def _pair(kind: str):
    cfg = (tiny_hybrid_config(vocab=VOCAB) if kind == "hybrid" else
           tiny_target_config(vocab=VOCAB, num_layers=2, max_position_embeddings=128, num_kv_heads=4))
    target = random_target(cfg, seed=13)
    drafter = random_drafter(tiny_drafter_config(cfg, target_layer_ids=[0, 3] if kind == "hybrid" else [0, 1],
                                                 block_size=6, selector_rank=8, selector_top_k=4), seed=14)
    return target, drafter


@pytest.fixture(scope="module", params=["dense", "hybrid"])
def pair(request):
    return _pair(request.param)


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("system", ["stock:tree=best_first,nodes=10,batch_budget=1",
                                    "stock:tree=best_first,nodes=10,batch_budget=14",
                                    "stock:tree=ddtree,nodes=8,batch_budget=9",
                                    "stock:batch_budget=8", "stock:batch_budget=1",
                                    "stock:tree=best_first,nodes=10,batch_budget=4,hybrid_tree=recompute"])
def test_every_request_gets_single_request_ar_tokens_under_a_budget(pair, system, sampled):
    target, drafter = pair
    rng = random.Random(len(system) + sampled)
    reqs = [Prompted([rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))], rng.randint(4, 24), (),
                     Sampling(0.9, 0.95, 0, 40 + i) if sampled and i % 2 else None) for i in range(6)]
    arrivals = sorted(rng.randint(0, 6) for _ in reqs)
    ar = Engine(target, None, parse_system("ar"), context=CONTEXT)
    alone = [ar.generate([r])[0].tokens for r in reqs]
    engine = Engine(target, drafter, parse_system(system), context=CONTEXT, slots=3)
    together = engine.generate(reqs, arrivals=arrivals)
    assert [g.tokens for g in together] == alone
    drafts = sum(sum(g.accepted) - len(g.accepted) for g in together)
    if system.endswith("batch_budget=1"):  # a root a request at every batch size: no draft is ever verified
        assert drafts == 0


@pytest.mark.parametrize("system, needle", [
    ("stock:tree=eagle2,nodes=8,batch_budget=8", "needs stock's chain, tree=best_first"),
    ("stock:tree=sequoia,nodes=8,batch_budget=8", "needs stock's chain, tree=best_first"),
    ("stock:tree=best_first,nodes=8,batch_budget=8,batch_rows=auto", "choose one"),
])
def test_a_budget_the_engine_cannot_share_is_refused(system, needle):
    target, drafter = _pair("dense")
    with pytest.raises(UserError, match=needle):
        Engine(target, drafter, parse_system(system), context=CONTEXT, slots=2)
