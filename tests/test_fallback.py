"""`batch_fallback=auto` (issue 59's "never slower than AR"): a batch's per-step choice between its speculative step
and an anchor step (each request's anchor verified alone, no drafting). On the CPU in float32: whatever the choices,
every request's tokens are single-request AR's, greedy and sampled, on a dense and a hybrid target; the drafter
hears of every committed row; the choice rule (speculative/allot.Fallback) by property tests."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.config import parse_system
from specpilot.core.contracts import Prompted, Sampling
from specpilot.fixtures.random_models import (
    random_drafter,
    random_target,
    tiny_drafter_config,
    tiny_hybrid_config,
    tiny_target_config,
)
from specpilot.runtime.batch import Batcher
from specpilot.runtime.engine import Engine
from specpilot.speculative.allot import Fallback

VOCAB, CONTEXT, SLOTS = 24, 96, 3
SIZES = (1, 2, 3)
ALWAYS_ANCHOR = ({n: 1.0 for n in SIZES}, {n: 1e-3 for n in SIZES})  # (speculative, anchor) seconds a step
NEVER_ANCHOR = ({n: 1e-3 for n in SIZES}, {n: 1.0 for n in SIZES})
MIXED = ({1: 1e-3, 2: 1.0, 3: 1.0}, {1: 1.0, 2: 1e-3, 3: 1e-3})  # speculate alone, anchors when several decode


def _pair(kind: str, seed: int = 11):
    cfg = (tiny_hybrid_config(vocab=VOCAB) if kind == "hybrid" else
           tiny_target_config(vocab=VOCAB, num_layers=2, max_position_embeddings=128, num_kv_heads=4))
    target = random_target(cfg, seed=seed)
    taps = [0, 3] if kind == "hybrid" else [0, 1]
    drafter = random_drafter(tiny_drafter_config(cfg, target_layer_ids=taps, block_size=4, selector_rank=8,
                                                 selector_top_k=4), seed=seed + 1)
    return target, drafter


@pytest.fixture(scope="module", params=["dense", "hybrid"])
def pair(request):
    return _pair(request.param)


def _requests(seed: int, n: int, sampled: bool) -> tuple[list[Prompted], list[int]]:
    rng = random.Random(seed)
    reqs = [Prompted([rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))], rng.randint(4, 24), (),
                     Sampling(0.9, 0.95, 0, seed * 10 + i) if sampled and i % 2 == 0 else None) for i in range(n)]
    return reqs, sorted(rng.randint(0, 8) for _ in range(n))


def _serve(engine: Engine, reqs: list[Prompted], arrivals: list[int], costs) -> tuple[list[list[int]], Batcher]:
    batcher = Batcher(engine, costs=costs, kinds=tuple(sorted({r.samples for r in reqs})))
    ids = [batcher.submit(r, a) for r, a in zip(reqs, arrivals, strict=True)]
    done = {}
    while batcher.busy:
        done.update((u.rid, u.generation) for u in batcher.step() if u.done)
    return [done[i].tokens for i in ids], batcher


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("system", ["stock", "stock:tree=best_first,nodes=10"])
@pytest.mark.parametrize("costs", [ALWAYS_ANCHOR, NEVER_ANCHOR, MIXED], ids=["anchor", "speculate", "mixed"])
def test_every_request_gets_single_request_ar_tokens_whatever_the_steps(pair, system, sampled, costs):
    target, drafter = pair
    reqs, arrivals = _requests(7 if sampled else 5, 6, sampled)
    ar = Engine(target, None, parse_system("ar"), context=CONTEXT)
    alone = [ar.generate([r])[0].tokens for r in reqs]
    name = f"{system}{',' if ':' in system else ':'}batch_fallback=auto"
    engine = Engine(target, drafter, parse_system(name), context=CONTEXT, slots=SLOTS)
    got, batcher = _serve(engine, reqs, arrivals, costs)
    assert got == alone
    steps = batcher.fallback.steps
    if costs is NEVER_ANCHOR:
        assert steps["anchor"] == 0 < steps["speculative"]
    else:  # anchors ran, and so did speculative steps (the first, the probes; MIXED: a request alone)
        assert steps["anchor"] > 0 and steps["speculative"] > 0


def test_the_drafter_hears_of_every_committed_row_after_anchor_steps(monkeypatch):
    """An anchor step still tells the drafter the rows the last step committed, so a speculative step after it
    drafts from a whole context: the positions given to the drafter's commit cover every committed position."""
    from specpilot.speculative.drafter import DFlash

    target, drafter = _pair("dense")
    told: dict[int, set[int]] = {0: set(), 1: set()}
    real = DFlash.commit

    def commit(self, feats, first, count, rows):
        for slot in range(min(first.shape[0], 2)):
            told[slot].update(range(int(first[slot]), int(first[slot] + count[slot])))
        return real(self, feats, first, count, rows)

    monkeypatch.setattr(DFlash, "commit", commit)
    engine = Engine(target, drafter, parse_system("stock:batch_fallback=auto"), context=CONTEXT, slots=2)
    reqs = [Prompted([3, 1, 4], 20), Prompted([5, 9, 2, 6, 5], 20)]
    costs = ({1: 1e-3, 2: 1.0}, {1: 1.0, 2: 1e-3})
    got, batcher = _serve(engine, reqs, [0, 0], costs)
    assert batcher.fallback.steps["anchor"] > 0
    for slot, r in enumerate(reqs):  # got[i] sits at position len(prompt) + i; the prompt's went in by prefill
        first, last = len(r.prompt), len(r.prompt) + len(got[slot])
        missing = sorted(set(range(first, last)) - told[slot])
        # only the final step's rows (at most a block of 4) are never told: no step comes after it
        assert len(missing) <= 4 and missing == list(range(last - len(missing), last)), missing


def test_off_is_stock_no_anchor_step_is_built():
    target, drafter = _pair("dense")
    engine = Engine(target, drafter, parse_system("stock"), context=CONTEXT, slots=SLOTS)
    assert engine.anchor_steps() == {}
    assert Batcher(engine, kinds=(False,)).fallback is None
    auto = Engine(target, drafter, parse_system("stock:batch_fallback=auto"), context=CONTEXT, slots=SLOTS)
    batcher = Batcher(auto, kinds=(False,))  # the costs timed here, at every captured size
    assert set(batcher.fallback.spec_cost) == set(SIZES) == set(batcher.fallback.anchor_cost)
    assert min(batcher.fallback.anchor_cost.values()) > 0


# ---------------------------------------------------------------------------------------------------------------
# the rule


costs = st.dictionaries(st.sampled_from(SIZES), st.floats(1e-4, 1.0), min_size=3, max_size=3)


@settings(max_examples=60, deadline=None)
@given(spec=costs, anchor=costs, seen=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 16)), max_size=40),
       size=st.sampled_from(SIZES))
def test_the_rule_speculates_when_expected_tokens_a_second_beat_one_token_each(spec, anchor, seen, size):
    rule = Fallback(spec, anchor, probe=10**6)
    assert rule.speculate([0, 1], size)  # nothing seen: speculate
    for request, committed in seen:
        rule.saw(request, committed)
    reqs = [0, 1, 2, 3][:size]
    if not seen:
        assert rule.speculate(reqs, size)
        return
    expected = sum(rule.expected.get(r, rule.overall) for r in reqs)
    assert rule.speculate(reqs, size) == (expected / spec[size] >= len(reqs) / anchor[size])
    assert all(1 <= e <= 16 for e in rule.expected.values()) and 1 <= rule.overall <= 16


@settings(max_examples=30, deadline=None)
@given(probe=st.integers(1, 8), steps=st.integers(1, 40))
def test_while_anchors_win_every_probe_th_step_speculates(probe, steps):
    rule = Fallback({1: 1.0}, {1: 1e-3}, probe=probe)
    rule.saw("r", 1)
    choices = [rule.speculate(["r"], 1) for _ in range(steps)]
    assert [i for i, c in enumerate(choices) if c] == [i for i in range(steps) if (i + 1) % probe == 0]
    assert rule.steps == {"speculative": sum(choices), "anchor": steps - sum(choices)}


def test_a_request_forgotten_takes_the_average_and_bad_inputs_are_refused():
    rule = Fallback({1: 1.0}, {1: 1.0})
    rule.saw("a", 5)
    rule.forget("a")
    assert "a" not in rule.expected and rule.overall == 5
    for bad in [({1: 1.0}, {2: 1.0}), ({1: 0.0}, {1: 1.0}), ({}, {})]:
        with pytest.raises(ValueError):
            Fallback(*bad)
    with pytest.raises(ValueError):
        rule.saw("b", 0)
