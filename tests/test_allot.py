"""The shared row budget and the per-request draft block (speculative/allot.py): the budget respected, every request
progresses (its root row), each request's share a valid best-first prefix, the budget the best rate of all, the
block monotone in the drafter's confidence."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.speculative.allot import allot, chain_survival, draft_block

confidence = st.floats(0.0, 1.0, allow_nan=False)
request = st.lists(confidence, max_size=12).map(lambda c: sorted(c, reverse=True))
requests = st.lists(request, min_size=1, max_size=6)
# a step's cost: a fixed part (the weights' read) and a part per row, both positive
costs = st.tuples(st.floats(0.5, 5.0), st.floats(0.0, 0.5))


def rate(survival, rows, cost) -> float:
    n = len(survival)
    expected = n + sum(sum(p[: k - 1]) for p, k in zip(survival, rows, strict=True))
    return expected / cost(sum(rows))


@settings(max_examples=200, deadline=None)
@given(requests, costs, st.one_of(st.none(), st.integers(0, 40)))
def test_the_budget_is_respected_and_every_request_progresses(survival, cost, extra):
    fixed, per_row = cost
    max_rows = None if extra is None else len(survival) + extra
    out = allot(survival, lambda rows: fixed + per_row * rows, max_rows)
    assert len(out.rows) == len(survival) and all(r >= 1 for r in out.rows)
    assert all(r - 1 <= len(p) for r, p in zip(out.rows, survival, strict=True))
    if max_rows is not None:
        assert sum(out.rows) <= max_rows
    assert out.expected == pytest.approx(rate(survival, out.rows, lambda rows: 1.0))


@settings(max_examples=200, deadline=None)
@given(requests, costs)
def test_the_budget_is_the_best_rate_of_all_and_goes_to_the_likeliest_nodes(survival, cost):
    """Brute force: no other total number of rows, filled with the likeliest nodes, has a better rate; and no
    unchosen node is likelier than a chosen one."""
    fixed, per_row = cost
    step = lambda rows: fixed + per_row * rows  # noqa: E731
    out = allot(survival, step)
    every = sorted((p for probs in survival for p in probs), reverse=True)
    n = len(survival)
    for b in range(len(every) + 1):
        assert (n + sum(every[:b])) / step(n + b) <= out.rate * (1 + 1e-12)
    chosen = [p for probs, r in zip(survival, out.rows, strict=True) for p in probs[: r - 1]]
    left = [p for probs, r in zip(survival, out.rows, strict=True) for p in probs[r - 1:]]
    assert not chosen or not left or min(chosen) >= max(left)


def test_a_free_row_is_always_taken_and_a_dear_one_never():
    survival = [[0.9, 0.5, 0.1], [0.8, 0.05]]
    assert allot(survival, lambda rows: 1.0).rows == (4, 3)  # rows cost nothing: every node
    assert allot(survival, lambda rows: rows).rows == (1, 1)  # each row costs a whole token's worth: roots only
    assert allot(survival, lambda rows: 1.0, max_rows=4).rows == (2, 2)  # the two likeliest beyond the roots


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="no request"):
        allot([], lambda rows: 1.0)
    with pytest.raises(ValueError, match="not increase"):
        allot([[0.2, 0.5]], lambda rows: 1.0)
    with pytest.raises(ValueError, match="below one row per request"):
        allot([[0.5], [0.5]], lambda rows: 1.0, max_rows=1)


@settings(max_examples=200, deadline=None)
@given(st.lists(confidence, min_size=15, max_size=15), st.lists(st.floats(0.0, 0.5), min_size=15, max_size=15))
def test_the_block_grows_with_the_drafters_confidence(conf, lift):
    """A drafter surer at every position never gets a shorter block; the block is one of those offered."""
    surer = [min(1.0, c + d) for c, d in zip(conf, lift, strict=True)]
    a, b = draft_block(conf), draft_block(surer)
    assert a in (8, 12, 16) and b in (8, 12, 16) and b >= a


def test_the_block_follows_the_chains_survival():
    assert chain_survival([0.5, 0.5, 1.0]) == [0.5, 0.25, 0.25]
    assert draft_block([1.0] * 15) == 16  # every draft certain: the longest block
    assert draft_block([0.01] + [1.0] * 14) == 8  # the first draft unlikely: the shortest
    assert draft_block([0.9] * 15, floor=0.4) == 12  # the 8-block's last draft: 0.9^7 = 0.48; the 12's: 0.31
    assert draft_block([0.9] * 15, floor=0.3) == 16  # 0.31 is still likely at this floor
    with pytest.raises(ValueError, match="confidences"):
        draft_block([0.5] * 3)
