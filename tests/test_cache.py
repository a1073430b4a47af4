"""Per-layer caches: states made from the config's layer types, and commit of an accepted path."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.errors import UserError
from specpilot.fixtures.random_models import random_target, tiny_target_config
from specpilot.models.cache import AttentionState, Cache


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_commit_moves_the_accepted_path_behind_the_committed_slots(data):
    batch = data.draw(st.integers(1, 3))
    rows = data.draw(st.integers(1, 6))
    length = 24
    state = AttentionState(batch, length, 2, 4, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    state.k.copy_(torch.randn(state.k.shape, generator=gen))
    state.v.copy_(torch.randn(state.v.shape, generator=gen))
    before_k, before_v = state.k.clone(), state.v.clone()
    start = torch.tensor([data.draw(st.integers(0, length - rows)) for _ in range(batch)])
    # each sequence's path: distinct verified rows, root first (a tree's accepted root path)
    paths = [[0] + sorted(data.draw(st.sets(st.integers(1, rows - 1), max_size=rows - 1))) if rows > 1 else [0]
             for _ in range(batch)]
    width = max(len(p) for p in paths)
    path = torch.tensor([p + [p[-1]] * (width - len(p)) for p in paths])  # padded with the last row
    state.commit(path, torch.tensor([len(p) - 1 for p in paths]), start)
    for b, p in enumerate(paths):
        s = int(start[b])
        for i, row in enumerate(p):
            assert torch.equal(state.k[b, :, s + i], before_k[b, :, s + row])
            assert torch.equal(state.v[b, :, s + i], before_v[b, :, s + row])
        assert torch.equal(state.k[b, :, :s], before_k[b, :, :s])  # committed slots untouched
        assert torch.equal(state.k[b, :, s + width:], before_k[b, :, s + width:])  # and every slot past the path
    after = state.k.clone()
    state.commit(path, torch.zeros(batch, dtype=torch.int64), start, in_place=True)  # a chain's: nothing moves
    assert torch.equal(state.k, after)


def test_chain_commit_changes_nothing():
    state = AttentionState(1, 8, 1, 2, torch.float32, "cpu")
    state.k.normal_()
    k = state.k.clone()
    path, accepted = torch.arange(4)[None], torch.tensor([3])
    state.commit(path, accepted, torch.tensor([3]), in_place=True)
    assert torch.equal(state.k, k)
    state.commit(path, accepted, torch.tensor([3]))  # the identity path moves nothing either
    assert torch.equal(state.k, k)


def test_caches_are_per_layer_states_from_the_config():
    target = random_target(tiny_target_config(vocab=64, num_layers=3), seed=0)
    cache = target.new_cache(2, 16)
    assert isinstance(cache, Cache) and len(cache) == 3
    assert all(isinstance(s, AttentionState) and s.k.shape == (2, 2, 16, 16) for s in cache.layers)
    assert len({s.k.data_ptr() for s in cache.layers}) == 3  # each layer its own slots
    assert all(s.k.is_contiguous() for s in cache.layers)
    apart = target.new_cache(2, 16, stacked=False)  # separate tensors (drafter training's autograd)
    assert len({s._k.data_ptr() for s in apart.layers}) == 3 and cache[1]._k is cache[0]._k  # one tensor
    view = cache.rows(1, 2)
    view[0].k.fill_(1.0)
    assert bool((cache[0].k[1] == 1).all()) and bool((cache[0].k[0] == 0).all())
    assert target.cfg.kinds == ["attention"] * 3
    fresh = target.new_cache(2, 16)
    with torch.enable_grad():  # writes into one layer's view, then another's, with gradients on (forcing's)
        x = torch.randn(2, 2, 1, 16, requires_grad=True)
        for state in fresh.layers:
            state.k[:, :, 3:4] = x * 2
        assert fresh[2].k.grad_fn is not None and torch.equal(fresh[0].k[:, :, 3:4], x.detach() * 2)


def test_unknown_layer_types_are_refused():
    cfg = tiny_target_config(vocab=64, num_layers=2, layer_types=["attention", "gated_deltanet"])
    with pytest.raises(UserError, match="gated_deltanet"):
        cfg.validate()
    with pytest.raises(UserError, match="2 layers"):
        tiny_target_config(vocab=64, num_layers=2, layer_types=["attention"]).validate()
