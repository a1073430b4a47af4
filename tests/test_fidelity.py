"""Fidelity readings: free-running and teacher-forced agreement of two targets."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.bench.fidelity import forced_agreement, forced_argmax, free_running
from specpilot.config import parse_system
from specpilot.fixtures.random_models import random_target, tiny_target_config
from specpilot.models.twin import widen_target
from specpilot.runtime.engine import Engine
from tests.conftest import prompts

AR = parse_system("ar")


def test_free_running_counts_equal_tokens_and_first_divergence():
    out = free_running([[1, 2, 3, 4], [5, 6], [7, 8]], [[1, 2, 9, 4], [5, 6], [7, 8, 9]])
    assert out["first_divergence"] == [2, None, 2]
    assert abs(out["token_agreement"] - 7 / 9) < 1e-12  # 3 of 4, 2 of 2, 2 of 3


def _greedy(target, batch):
    engine = Engine(target, None, context=96)
    return [engine.generate_one(p, 24, (), "ar").tokens for p in batch]


def test_forced_argmax_reproduces_the_models_own_greedy_output():
    target = random_target(tiny_target_config(vocab=300), seed=3)
    batch = prompts(4, seed=5)
    for prompt, output in zip(batch, _greedy(target, batch), strict=True):
        assert forced_argmax(target, prompt, output) == output


def test_forced_agreement_sees_a_twin_as_equal_and_a_different_model_as_not():
    small = random_target(tiny_target_config(vocab=300), seed=3)
    batch = prompts(4, seed=6)
    outputs = _greedy(small, batch)
    assert forced_agreement(small, widen_target(small, 2), batch, outputs)["token_agreement"] == 1.0
    other = random_target(tiny_target_config(vocab=300), seed=4)
    differ = forced_agreement(small, other, batch, outputs)
    assert differ["tokens"] == sum(len(o) for o in outputs)
    assert differ["token_agreement"] < 0.5
    with torch.no_grad():
        bf16 = random_target(tiny_target_config(vocab=300), seed=3, dtype=torch.bfloat16)
    near = forced_agreement(small, bf16, batch, outputs)["token_agreement"]
    assert near > differ["token_agreement"]


token_lists = st.lists(st.lists(st.integers(0, 5), max_size=12), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(token_lists, st.data())
def test_free_running_properties(a, data):
    b = [data.draw(st.lists(st.integers(0, 5), max_size=12)) for _ in a]
    out = free_running(a, b)
    assert 0.0 <= out["token_agreement"] <= 1.0
    assert free_running(a, a) == {"token_agreement": 1.0, "first_divergence": [None] * len(a)}
    for s, t, first in zip(a, b, out["first_divergence"], strict=True):
        if first is None:
            assert s == t
        else:
            assert s[:first] == t[:first] and (first == min(len(s), len(t)) or s[first] != t[first])
    assert free_running(b, a)["token_agreement"] == out["token_agreement"]
