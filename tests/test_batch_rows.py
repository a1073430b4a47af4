"""`batch_rows=auto` (issue 59: a shared row budget in its uniform form, and "never slower than AR"): each batch step
verifies, for every request alike, the system's rows, a shorter chain, or the anchor alone (no drafting). On the CPU
in float32: whatever the choices, every request's tokens are single-request AR's, greedy and sampled, on a dense and
a hybrid target; the drafter hears of every committed row; the choice rule (speculative/allot.RowsChoice) by
property tests."""

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
from specpilot.speculative.allot import RowsChoice, TreeRowsChoice

VOCAB, CONTEXT, SLOTS = 24, 96, 3
SIZES = (1, 2, 3)


def _costs(chain: bool, full: int, cheapest) -> dict[int, dict[int, float]]:
    """rows -> size -> seconds: `cheapest(size)` names the rows whose step is nearly free at that size."""
    widths = (1, *[w for w in ((4, 8) if chain else (2, 4, 8)) if w < full], full)
    return {w: {n: 1e-4 if cheapest(n) == w else 1.0 for n in SIZES} for w in widths}


SCHEDULES = {  # which step the costs make the choice at each batch size
    "anchor": lambda full: lambda n: 1,
    "full": lambda full: lambda n: full,
    "mixed": lambda full: lambda n: {1: full, 2: 1, 3: 4}[n],  # (a chain of 4; a tree's budget of 4 a request)
}


def _pair(kind: str, seed: int = 11):
    cfg = (tiny_hybrid_config(vocab=VOCAB) if kind == "hybrid" else
           tiny_target_config(vocab=VOCAB, num_layers=2, max_position_embeddings=128, num_kv_heads=4))
    target = random_target(cfg, seed=seed)
    taps = [0, 3] if kind == "hybrid" else [0, 1]
    drafter = random_drafter(tiny_drafter_config(cfg, target_layer_ids=taps, block_size=8, selector_rank=8,
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
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_every_request_gets_single_request_ar_tokens_whatever_the_steps(pair, system, sampled, schedule):
    target, drafter = pair
    reqs, arrivals = _requests(7 if sampled else 5, 6, sampled)
    ar = Engine(target, None, parse_system("ar"), context=CONTEXT)
    alone = [ar.generate([r])[0].tokens for r in reqs]
    name = f"{system}{',' if ':' in system else ':'}batch_rows=auto"
    engine = Engine(target, drafter, parse_system(name), context=CONTEXT, slots=SLOTS)
    chain, full = "tree" not in system, engine.full_rows
    assert set(engine.width_steps()) == ({1, 4} if chain else {1, 2, 4, 8}) and full == (8 if chain else 10)
    got, batcher = _serve(engine, reqs, arrivals, _costs(chain, full, SCHEDULES[schedule](full)))
    assert got == alone
    steps = batcher.rows.steps
    if schedule == "full":
        assert steps[1] == 0 < steps[full]
    else:  # the anchor step ran, and so did full steps (the first, the probes; mixed: a request alone)
        assert steps[1] > 0 and steps[full] > 0
    if schedule == "mixed":
        assert steps[4] > 0  # three requests decoding: the chain of 4, or the trees' 12 likeliest rows


def test_the_drafter_hears_of_every_committed_row_after_anchor_steps(monkeypatch):
    """An anchor step still tells the drafter the rows the last step committed, so a speculative step after it
    drafts from a whole context: the positions given to the drafter's commit cover every committed position."""
    from specpilot.speculative.drafter import DFlash

    target, drafter = _pair("dense")
    told: dict[int, set[int]] = {0: set(), 1: set()}
    real = DFlash.commit

    def commit(self, feats, first, count, rows, tokens=None):
        for slot in range(min(first.shape[0], 2)):
            told[slot].update(range(int(first[slot]), int(first[slot] + count[slot])))
        return real(self, feats, first, count, rows, tokens)

    monkeypatch.setattr(DFlash, "commit", commit)
    engine = Engine(target, drafter, parse_system("stock:batch_rows=auto"), context=CONTEXT, slots=2)
    reqs = [Prompted([3, 1, 4], 24), Prompted([5, 9, 2, 6, 5], 24)]
    costs = {1: {1: 1.0, 2: 1e-3}, 4: {1: 1e-3, 2: 1.0}, 8: {1: 1.0, 2: 1.0}}  # two decoding: anchors; one: 4 rows
    got, batcher = _serve(engine, reqs, [0, 6], costs)
    assert batcher.rows.steps[1] > 0 and batcher.rows.steps[4] > 0 and batcher.rows.steps[8] > 0
    for slot, r in enumerate(reqs):  # got[i] sits at position len(prompt) + i; the prompt's went in by prefill
        first, last = len(r.prompt), len(r.prompt) + len(got[slot])
        missing = sorted(set(range(first, last)) - told[slot])
        # only the final step's rows (at most a block of 8) are never told: no step comes after it
        assert len(missing) <= 8 and missing == list(range(last - len(missing), last)), missing


def test_fixed_is_stock_and_auto_times_every_width_once_an_engine():
    target, drafter = _pair("dense")
    engine = Engine(target, drafter, parse_system("stock"), context=CONTEXT, slots=SLOTS)
    assert engine.width_steps() == {}
    assert Batcher(engine, kinds=(False,)).rows is None
    auto = Engine(target, drafter, parse_system("stock:batch_rows=auto"), context=CONTEXT, slots=SLOTS)
    batcher = Batcher(auto, kinds=(False,))  # the costs timed here, at every captured size
    assert set(batcher.rows.costs) == {1, 4, 8} and all(set(t) == set(SIZES) for t in batcher.rows.costs.values())
    assert min(c for t in batcher.rows.costs.values() for c in t.values()) > 0
    assert Batcher(auto, kinds=(False,)).rows.costs is auto.step_costs[False]  # not timed again
    assert Engine(target, drafter, parse_system("stock:batch_rows=auto"), context=CONTEXT).width_steps() == {}


# ---------------------------------------------------------------------------------------------------------------
# the rule


def _table(values) -> dict[int, dict[int, float]]:
    return {w: dict(zip(SIZES, v, strict=True)) for w, v in values.items()}


tables = st.fixed_dictionaries({w: st.tuples(*[st.floats(1e-4, 1.0)] * 3) for w in (1, 4, 8)}).map(_table)


@settings(max_examples=60, deadline=None)
@given(costs=tables, seen=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 8), st.sampled_from([1, 4, 8])),
                                   max_size=40), size=st.sampled_from(SIZES))
def test_the_rule_picks_the_most_expected_tokens_a_second(costs, seen, size):
    rule = RowsChoice(costs, probe=10**6)
    assert rule.choose([0, 1], size) == 8  # nothing seen: the full rows
    for request, committed, rows in seen:
        rule.saw(request, min(committed, rows), rows)
    reqs = [0, 1, 2, 3][:size]
    rates = {w: sum(rule.expect(r, w) for r in reqs) / costs[w][size] for w in costs}
    got = rule.choose(reqs, size)
    if any(rows > 1 for _, _, rows in seen):
        assert rates[got] == max(rates.values())
    else:  # only anchor steps seen: nothing known of the wider ones, so the full rows still
        assert got == 8
    for w in (4, 8):  # a step of w rows commits 1..w tokens: so do the expectations
        assert all(1 <= e.get(w, 1) <= w for e in rule.expected.values())
    assert all(rule.expect(r, 1) == 1 for r in range(4))


def test_an_expectation_is_learnt_from_steps_at_least_as_wide():
    rule = RowsChoice(_table({1: (1, 1, 1), 4: (1, 1, 1), 8: (1, 1, 1)}), alpha=1.0)
    rule.saw("a", 3, 4)  # a chain of 4 committed 3: a chain of 8 is not known from it
    assert rule.expected["a"] == {4: 3} and rule.overall == {4: 3}
    rule.saw("a", 7, 8)  # a chain of 8 committed 7: a chain of 4 would have committed 4 of them
    assert rule.expected["a"] == {4: 4, 8: 7}


@settings(max_examples=30, deadline=None)
@given(probe=st.integers(1, 8), steps=st.integers(1, 40))
def test_while_narrower_steps_win_every_probe_th_step_is_full(probe, steps):
    rule = RowsChoice(_table({1: (1e-3,) * 3, 8: (1.0,) * 3}), probe=probe)
    rule.saw("r", 1, 8)
    choices = [rule.choose(["r"], 1) for _ in range(steps)]
    assert [i for i, c in enumerate(choices) if c == 8] == [i for i in range(steps) if (i + 1) % probe == 0]
    assert rule.steps == {1: choices.count(1), 8: choices.count(8)}


def test_a_request_forgotten_takes_the_average_and_bad_inputs_are_refused():
    rule = RowsChoice(_table({1: (1, 1, 1), 8: (1, 1, 1)}), alpha=1.0)
    rule.saw("a", 5, 8)
    rule.forget("a")
    assert "a" not in rule.expected and rule.expect("a", 8) == 5
    for bad in [{8: {1: 1.0}}, {1: {1: 1.0}, 8: {2: 1.0}}, {1: {1: 0.0}, 8: {1: 1.0}}, {}]:
        with pytest.raises(ValueError):
            RowsChoice(bad)
    with pytest.raises(ValueError):
        rule.saw("b", 0, 8)


def test_every_tree_step_writes_what_each_budget_expected_to_commit():
    """The batcher's rule hears, after each tree step, the expectations the device computed from that step's trees:
    one token a live request at least, never fewer for more rows, and what the step that ran was expected to commit
    is near what it committed over a run (a random drafter's probabilities: only the order of magnitude)."""
    target, drafter = _pair("dense")
    engine = Engine(target, drafter, parse_system("stock:tree=best_first,nodes=10,batch_rows=auto"),
                    context=CONTEXT, slots=SLOTS)
    assert engine.offers(2) == (4, 8, 16, 20) and engine.state.expect.shape == (4,)
    heard = []
    real = TreeRowsChoice.told

    def told(self, expected, live, rows, committed):
        heard.append((list(expected), live, rows, committed))
        return real(self, expected, live, rows, committed)

    reqs, arrivals = _requests(3, 6, False)
    costs = _costs(False, 10, lambda n: {1: 10, 2: 2, 3: 8}[n])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TreeRowsChoice, "told", told)
        _serve(engine, reqs, arrivals, costs)
    assert {rows for _, _, rows, _ in heard} >= {2, 8, 10}
    for expected, live, rows, committed in heard:
        assert live <= expected[0] and expected == sorted(expected) and expected[-1] <= live * 10
        assert live <= committed <= live * rows + live  # (a budget's rows, each request's bonus token)


def test_the_tree_rule_reads_the_last_trees_calibrated_by_what_was_committed():
    costs = {1: {1: 1.0, 2: 1.0}, 2: {1: 1.5, 2: 1.5}, 4: {1: 2.2, 2: 2.2}, 10: {1: 4.0, 2: 4.0}}
    rule = TreeRowsChoice(costs, alpha=1.0, probe=10**6, shares=(2, 4, 10))
    assert rule.choose(["a", "b"], 2) == 10  # no tree seen: the full trees
    # two requests; the trees expected 1.6 / 2.8 / 6.0 tokens above the roots at 2 / 4 / 10 rows a request
    rule.told([3.6, 4.8, 8.0], 2, 10, 8)  # the full step committed 6 above the roots: calibration 1
    rates = {w: 2 * rule.expect("a", w) / costs[w][2] for w in costs}
    assert rates == pytest.approx({1: 2.0, 2: 2 * 1.8 / 1.5, 4: 2 * 2.4 / 2.2, 10: 2 * 4.0 / 4.0})
    assert rule.choose(["a", "b"], 2) == 2 and rule.steps[2] == 1
    rule.told([3.6, 4.8, 8.0], 2, 2, 2)  # the budget of 2 committed nothing above the roots: calibration 0
    assert rule.calibration() == 0.0 and rule.expect("a", 2) == rule.expect("a", 10) == 1.0
    assert rule.choose(["a", "b"], 2) == 1  # nothing above the roots expected: the anchor, the cheapest step
    rule.told([3.6, 4.8, 8.0], 2, 10, 8)
    assert rule.calibration() == 1.0 and rule.choose(["a", "b"], 2) == 2
    with pytest.raises(ValueError):
        rule.told([1.0], 2, 10, 2)
    with pytest.raises(ValueError):
        TreeRowsChoice(costs, shares=(2, 10))  # the share of 4 missing


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.lists(st.floats(0, 20), min_size=3, max_size=3), st.integers(1, 4),
                                st.sampled_from([2, 4, 10]), st.integers(0, 40)), min_size=1, max_size=12),
       alpha=st.floats(0.05, 1.0))
def test_a_larger_budget_never_expects_fewer_tokens(steps, alpha):
    """Its nodes include a smaller one's: whatever was committed, the expectations keep the budgets' order."""
    costs = {w: {1: 1.0} for w in (1, 2, 4, 10)}
    rule = TreeRowsChoice(costs, alpha=alpha, shares=(2, 4, 10))
    for extras, live, rows, more in steps:
        expected = [live + x for x in sorted(extras)]
        rule.told(expected, live, rows, live + min(more, live * rows))
        wants = [rule.expect("r", w) for w in (1, 2, 4, 10)]
        assert wants == sorted(wants) and wants[0] == 1.0


def test_two_level_verification_offers_its_full_step_and_the_anchor():
    import torch

    target, drafter = (m.to(torch.bfloat16) for m in _pair("dense"))  # (its 8-bit pass needs BF16 weights' W12 forms)
    engine = Engine(target, drafter, parse_system("stock:verify=tlv,batch_rows=auto"), context=CONTEXT, slots=2)
    assert set(engine.width_steps()) == {1} and engine.full_rows == 16  # both rounds' rows: all a step may commit
