"""Continuous batching (runtime/batch.py) on the CPU in float32: every system's batched greedy output equals its
single-request output token for token, with prompts of different lengths arriving at different steps, prompts
prefilled in chunks beside decoding rows, and more requests than slots (slots are reused)."""

from __future__ import annotations

import json
import random

import pytest

from specpilot.config import parse_system
from specpilot.core.contracts import Prompted
from specpilot.errors import UserError
from specpilot.fixtures.random_models import random_drafter, random_target, tiny_drafter_config, tiny_target_config
from specpilot.runtime.engine import Engine

VOCAB = 24  # few tokens: a random drafter's guesses are accepted now and then, so paths of every length occur
CONTEXT = 96
SYSTEMS = ["ar", "stock", "stock:tree=best_first,nodes=10", "stock:tree=ddtree,nodes=8",
           "stock:tree=eagle2,nodes=8,tree_k=2", "stock:tree=sequoia,nodes=8"]


def tiny_pair(seed: int):
    """A 2-layer target of VOCAB tokens and a block-4 drafter with a selector (random weights)."""
    tcfg = tiny_target_config(vocab=VOCAB, num_layers=2, max_position_embeddings=128, num_kv_heads=4)
    target = random_target(tcfg, seed=seed)
    drafter = random_drafter(tiny_drafter_config(tcfg, target_layer_ids=[0, 1], block_size=4, selector_rank=8,
                                                 selector_top_k=4), seed=seed + 1)
    return target, drafter


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(11)


def _requests(seed: int, n: int) -> tuple[list[Prompted], list[int]]:
    rng = random.Random(seed)
    reqs = [Prompted([rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))], rng.randint(1, 30),
                     (rng.randrange(VOCAB),) if rng.random() < 0.4 else ()) for _ in range(n)]
    return reqs, sorted(rng.randint(0, 12) for _ in range(n))


@pytest.mark.parametrize("system", SYSTEMS)
def test_batched_outputs_equal_single_request_outputs(pair, system):
    target, drafter = pair
    sys_ = parse_system(system)
    reqs, arrivals = _requests(SYSTEMS.index(system), 7)
    single = Engine(target, drafter, sys_, context=CONTEXT)
    alone = [single.generate_one(r.prompt, r.max_new_tokens, r.stop_ids) for r in reqs]
    batch = Engine(target, drafter, sys_, context=CONTEXT, slots=3)
    ran = _count_sizes(batch, sys_.speculative)
    for chunk_run in range(2):  # the second run reuses the engine: nothing of the first leaks into it
        together = batch.generate(reqs, arrivals=arrivals if chunk_run else None)
        for r, a, b in zip(reqs, alone, together, strict=True):
            assert b.tokens == a.tokens, (system, r)
            assert sum(b.accepted) == len(b.tokens) - 1 >= 0
    assert batch.sizes == (1, 2, 3) and ran[3] and ran[1] + ran[2], ran  # the batch's tail ran fewer slots
    if sys_.speculative:  # the drafts were accepted somewhere (not only the bonus tokens)
        assert any(n > 1 for g in together for n in g.accepted), system


def _count_sizes(engine: Engine, spec: bool) -> dict[int, int]:
    """Counts the steps run at each batch size (the steps run eagerly on the CPU: StepGraph calls its fn)."""
    ran = dict.fromkeys(engine.sizes, 0)
    for (n, _), graph in engine.batch_steps(spec).items():
        def counted(fn=graph.fn, n=n):
            ran[n] += 1
            fn()
        graph.fn = counted
    return ran


def test_chunked_prefill_equals_whole_prefill(pair):
    target, drafter = pair
    reqs, _ = _requests(5, 4)
    from specpilot.runtime.batch import run_batch

    engine = Engine(target, drafter, parse_system("stock"), context=CONTEXT, slots=2)
    whole = run_batch(engine, reqs, chunk=256)
    chunked = run_batch(engine, reqs, chunk=3)
    assert [g.tokens for g in whole] == [g.tokens for g in chunked]
    assert [g.accepted for g in whole] == [g.accepted for g in chunked]  # the drafter saw the same context


def test_a_request_that_does_not_fit_is_refused_before_any_work(pair):
    target, drafter = pair
    engine = Engine(target, drafter, parse_system("stock"), context=CONTEXT, slots=2)
    with pytest.raises(UserError, match="does not fit"):
        engine.generate([Prompted([1, 2, 3], 10), Prompted([1] * 90, 10)])
    with pytest.raises(UserError, match="slots"):
        Engine(target, drafter, parse_system("stock"), context=CONTEXT, slots=0)
    with pytest.raises(UserError, match="generate"):  # the one-request stepping is a single slot's
        engine.steps([1, 2, 3], 4)


def test_no_request_sees_another_rows_cache(pair):
    """Every other row of the target's and the drafter's caches poisoned: a request's output does not change."""
    target, drafter = pair
    req = Prompted([3, 4, 5, 6, 7, 8], 20)
    alone = Engine(target, drafter, parse_system("stock"), context=CONTEXT).generate_one(req.prompt, 20)
    engine = Engine(target, drafter, parse_system("stock"), context=CONTEXT, slots=3)
    for cache in (engine.cache, engine.draft.cache):
        for state in cache.layers:
            state.k[1:].fill_(1e4)
            state.v[1:].fill_(-1e4)
    assert engine.generate([req])[0].tokens == alone.tokens


def test_bench_in_flight_reports_throughput_and_matches_single_outputs(tmp_path):
    from tests.test_cli import specpilot

    out = tmp_path / "b.json"
    proc = specpilot("bench", "--preset", "tiny", "-s", "stock", "--limit", "2", "--max-new-tokens", "16",
                     "--in-flight", "3", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["deployment"]["regime"] == "batch" and report["deployment"]["in_flight"] == 3
    for name in ("ar", "stock"):
        b = report["systems"][name]["batch"]
        assert b["in_flight"] == 3 and b["output_tokens_per_s"] > 0 and b["seconds"] > 0
    assert report["systems"]["ar"]["batch"]["speedup_over_batched_ar"] == 1.0
    assert report["systems"]["stock"]["mismatch_vs_ar"] == 0  # batched stock answers as batched AR does
    single = tmp_path / "s.json"
    assert specpilot("bench", "--preset", "tiny", "-s", "stock", "--limit", "2", "--max-new-tokens", "16",
                     "--json", str(single)).returncode == 0
    alone = json.loads(single.read_text())
    tokens = lambda r: [row["tokens"] for row in r["systems"]["stock"]["requests"]]  # noqa: E731
    assert tokens(report) == tokens(alone)


def test_in_flight_below_one_is_one_line(tmp_path):
    from tests.test_cli import assert_one_line_error, specpilot

    assert_one_line_error(specpilot("bench", "--preset", "tiny", "--in-flight", "0"), "--in-flight")
    bad = tmp_path / "d.toml"
    bad.write_text('regime = "single"\nin_flight = 4\n[target]\nrandom = {}\n')
    assert_one_line_error(specpilot("bench", "--deployment", str(bad)), "in_flight")


def test_an_online_batcher_takes_requests_between_steps_and_gives_up_a_cancelled_one_at_once(pair):
    target, drafter = pair
    from specpilot.runtime.batch import Batcher

    reqs, _ = _requests(3, 5)
    single = Engine(target, drafter, parse_system("stock"), context=CONTEXT)
    alone = [single.generate_one(r.prompt, r.max_new_tokens, r.stop_ids).tokens for r in reqs]
    batcher = Batcher(Engine(target, drafter, parse_system("stock"), context=CONTEXT, slots=2), kinds=(False,))
    victim = batcher.submit(Prompted([5, 6, 7], 60))
    ids, streams, done, slots = {batcher.submit(reqs[0]): 0}, {}, {}, set()
    for k in range(400):
        slots.update((rid, slot) for slot, rid in enumerate(batcher.sched.holder) if rid is not None)
        if k == 3:
            victim_slot = batcher.sched.requests[victim].slot
            batcher.cancel(victim)
            assert victim not in batcher.sched.requests  # nothing of it is kept
        if 1 <= k <= 4:  # the rest arrive one a step, into a full batch
            ids[batcher.submit(reqs[k])] = k
        if not batcher.busy:
            break
        for u in batcher.step():
            assert not (u.rid == victim and k >= 3)  # nothing more for a request given up
            streams.setdefault(u.rid, []).extend(u.tokens)
            if u.done:
                done[u.rid] = u.generation
    assert not batcher.busy and victim not in done
    for rid, i in ids.items():
        assert done[rid].tokens == streams[rid] == alone[i], i  # the stream is the answer, as it is alone
    assert any((rid, victim_slot) in slots for rid in ids if ids[rid] > 0)  # its slot was taken again
    assert not batcher.sched.requests  # a long-running batcher keeps no record of what it served
    with pytest.raises(UserError, match="greedy requests only"):
        from specpilot.core.contracts import Sampling

        batcher.submit(Prompted([1], 4, (), Sampling(1.0, 1.0, 0, 1)))
