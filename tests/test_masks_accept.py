"""Property tests of the verification mask, the chain visibility and greedy acceptance."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.core.contracts import Visibility, chain, chain_visibility, verify_mask
from specpilot.speculative.accept import accept_greedy


@st.composite
def mask_inputs(draw):
    batch = draw(st.integers(1, 3))
    n = draw(st.integers(1, 7))
    length = draw(st.integers(1, 24))
    cache_len = draw(st.lists(st.integers(0, length), min_size=batch, max_size=batch))
    start = draw(st.lists(st.integers(0, length), min_size=batch, max_size=batch))
    vis = draw(st.lists(st.lists(st.booleans(), min_size=n, max_size=n), min_size=n, max_size=n))
    return cache_len, start, vis, length


@settings(max_examples=200, deadline=None)
@given(mask_inputs())
def test_verify_mask_matches_definition(args):
    cache_len, start, vis, length = args
    n = len(vis)
    got = verify_mask(torch.tensor(cache_len), torch.tensor(start), torch.tensor(vis), length)
    assert got.shape == (len(start), n, length)
    assert got.dtype == torch.bool
    for b in range(len(start)):
        for t in range(n):
            for s in range(length):
                want = s < cache_len[b] or (start[b] <= s < start[b] + n and vis[t][s - start[b]])
                assert bool(got[b, t, s]) == want, (b, t, s)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 12), st.integers(0, 20), st.integers(0, 20))
def test_verify_mask_with_a_chain_is_causal(n, cache_len, extra):
    """Slots == positions, rows right after the cache: a chain sees exactly the slots <= its position."""
    length = cache_len + n + extra
    c = torch.tensor([cache_len])
    got = verify_mask(c, c, chain_visibility(n), length)[0]
    pos = torch.arange(cache_len, cache_len + n)[:, None]
    assert torch.equal(got, torch.arange(length)[None, :] <= pos)


@settings(max_examples=150, deadline=None)
@given(mask_inputs(), st.booleans(), st.one_of(st.none(), st.integers(1, 10)))
def test_visibility_dense_matches_definition(args, chain, window):
    """Visibility (the compact form) expands to: committed or allowed new rows, within the window."""
    cache_len, start, vis, length = args
    n = len(vis)
    tree = None if chain else torch.tensor(vis)
    got = Visibility(torch.tensor(cache_len), torch.tensor(start), tree=tree, window=window).dense(n, length)
    assert got.shape == (len(start), n, length)
    for b in range(len(start)):
        for t in range(n):
            for s in range(length):
                rel = s - start[b]
                allowed = rel <= t if chain else bool(vis[t][rel]) if 0 <= rel < n else False
                want = s < cache_len[b] or (0 <= rel < n and allowed)
                if window is not None:
                    want = want and abs(start[b] + t - s) < window
                assert bool(got[b, t, s]) == want, (b, t, s)


@given(st.integers(1, 16))
def test_chain_visibility_is_lower_triangular(n):
    v = chain_visibility(n)
    assert v.shape == (n, n) and v.dtype == torch.bool
    for i in range(n):
        for j in range(n):
            assert bool(v[i, j]) == (j <= i)


@st.composite
def accept_inputs(draw):
    d = draw(st.integers(1, 8))
    vocab = draw(st.integers(2, 12))
    predicted = draw(st.lists(st.integers(0, vocab - 1), min_size=d + 1, max_size=d + 1))
    # Drafts: mostly the target's choice, sometimes something else (possibly the same by chance).
    drafts = [p if draw(st.booleans()) or draw(st.booleans()) else draw(st.integers(0, vocab - 1))
              for p in predicted[:-1]]
    seed = draw(st.integers(0, 2**31 - 1))
    return drafts, predicted, vocab, seed


def _reference_accept(drafts: list[int], predicted: list[int]) -> int:
    a = 0
    while a < len(drafts) and drafts[a] == predicted[a]:
        a += 1
    return a


@settings(max_examples=300, deadline=None)
@given(accept_inputs())
def test_accept_greedy_matches_reference(args):
    drafts, predicted, vocab, seed = args
    d = len(drafts)
    logits = torch.randn(d + 1, vocab, generator=torch.Generator().manual_seed(seed))
    logits[torch.arange(d + 1), torch.tensor(predicted)] += 100.0  # a unique argmax per row
    verdict = accept_greedy(_chain(drafts), logits[None])
    a, committed = verdict.accepted[0], verdict.tokens[0]
    assert verdict.accepted.shape == (1,) and a.dtype == torch.int64
    assert int(verdict.bonus[0]) == predicted[int(a)]
    want = _reference_accept(drafts, predicted)
    assert int(a) == want
    assert committed.tolist() == predicted
    # The committed tokens are the accepted drafts followed by the target's bonus token.
    assert committed[: want + 1].tolist() == drafts[:want] + [predicted[want]]
    if drafts == predicted[:-1]:
        assert int(a) == d
    else:
        assert int(a) < d and drafts[want] != predicted[want]


def test_accept_greedy_stops_at_first_mismatch():
    """A later match after a mismatch does not count."""
    predicted = [3, 1, 4, 1, 5]
    logits = torch.nn.functional.one_hot(torch.tensor(predicted), 8).float()
    verdict = accept_greedy(_chain([3, 1, 0, 1]), logits[None])
    assert verdict.accepted.tolist() == [2] and verdict.tokens[0].tolist() == predicted
    assert accept_greedy(_chain([0, 1, 4, 1]), logits[None]).accepted.tolist() == [0]
    assert accept_greedy(_chain([3, 1, 4, 1]), logits[None]).accepted.tolist() == [4]


def test_batched_acceptance_is_per_sequence():
    """[batch, rows]: each sequence's verdict is its own (here a full, an empty and a partial accept)."""
    predicted = torch.tensor([[3, 1, 4, 1, 5], [2, 7, 1, 8, 2], [9, 9, 9, 9, 9]])
    logits = torch.nn.functional.one_hot(predicted, 10).float()
    drafts = torch.tensor([[3, 1, 4, 1], [0, 7, 1, 8], [9, 9, 0, 9]])
    start = torch.tensor([5, 0, 11])
    index = torch.arange(5)
    proposal = chain(torch.tensor([0, 0, 0]), drafts, start, index, (index - 1)[None])
    assert proposal.positions.tolist()[2] == [11, 12, 13, 14, 15] and proposal.slots is proposal.positions
    verdict = accept_greedy(proposal, logits)
    assert verdict.accepted.tolist() == [4, 0, 2]
    assert verdict.bonus.tolist() == [5, 2, 9]
    assert verdict.path.tolist() == [list(range(5))] * 3 and proposal.parents[0].tolist() == [-1, 0, 1, 2, 3]


def _chain(drafts: list[int]):
    index = torch.arange(len(drafts) + 1)
    return chain(torch.tensor([0]), torch.tensor([drafts]), torch.tensor([0]), index, (index - 1)[None])
