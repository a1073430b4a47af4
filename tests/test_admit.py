"""Prompt admission (`admit=true`, issue 59's third batching mechanism: speculative/admit.py): a waiting request's
prompt rides in the batch's verify passes, a step's rows at a time, instead of prefill passes of its own. On the CPU
in float32, dense target: every request's tokens are single-request AR's, greedy and sampled, chain and trees, with
requests arriving while others decode, beside the other batching mechanisms (a step carrying chunks is a full one); no
prefill pass runs; on a hybrid target the recurrent states move past each chunk."""

from __future__ import annotations

import random

import pytest
import torch

from specpilot.config import parse_system
from specpilot.core.contracts import Forward, Prompted, Sampling, Visibility, chain
from specpilot.fixtures.random_models import (
    random_drafter,
    random_target,
    tiny_drafter_config,
    tiny_hybrid_config,
    tiny_target_config,
)
from specpilot.runtime import batch
from specpilot.runtime.batch import Batcher
from specpilot.runtime.engine import Engine
from specpilot.speculative.admit import Admission, ride

VOCAB, CONTEXT, SLOTS = 24, 128, 3


def _pair(hybrid: bool = False, seed: int = 21):
    cfg = (tiny_hybrid_config(vocab=VOCAB) if hybrid else
           tiny_target_config(vocab=VOCAB, num_layers=2, max_position_embeddings=160, num_kv_heads=4))
    target = random_target(cfg, seed=seed)
    drafter = random_drafter(tiny_drafter_config(cfg, target_layer_ids=[0, 3] if hybrid else [0, 1], block_size=6,
                                                 selector_rank=8, selector_top_k=4), seed=seed + 1)
    return target, drafter


@pytest.fixture(scope="module")
def pair():
    return _pair()


def _requests(seed: int, sampled: bool) -> tuple[list[Prompted], list[int]]:
    rng = random.Random(seed)  # prompts of 1..30 tokens: up to five chunks of 6 or 10 rows
    reqs = [Prompted([rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))], rng.randint(1, 20), (),
                     Sampling(0.9, 0.95, 0, 70 + i) if sampled and i % 2 else None) for i in range(7)]
    return reqs, sorted(rng.randint(0, 10) for _ in reqs)


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("system", ["stock", "stock:tree=best_first,nodes=10", "stock:tree=eagle2,nodes=8",
                                    "stock:batch_budget=8", "stock:batch_rows=auto",
                                    "stock:tree=best_first,nodes=10,batch_budget=12",
                                    "stock:tree=best_first,nodes=10,batch_rows=auto"])
def test_every_request_gets_single_request_ar_tokens_with_no_prefill_pass(pair, system, sampled, monkeypatch):
    target, drafter = pair
    reqs, arrivals = _requests(len(system) + sampled, sampled)
    ar = Engine(target, None, parse_system("ar"), context=CONTEXT)
    alone = [ar.generate([r])[0].tokens for r in reqs]
    name = f"{system}{',' if ':' in system else ':'}admit=true"
    engine = Engine(target, drafter, parse_system(name), context=CONTEXT, slots=SLOTS)
    assert set(engine.admit_steps()) == {(n, s) for n in (1, 2, 3) for s in (False, True)}

    def no_prefill(*args, **kwargs):
        raise AssertionError("a prefill pass ran: the prompt should ride in a verify pass")

    monkeypatch.setattr(batch, "_prefill", no_prefill)
    batcher = Batcher(engine, kinds=tuple(sorted({r.samples for r in reqs})))
    ids = [batcher.submit(r, a) for r, a in zip(reqs, arrivals, strict=True)]
    done, chunks = {}, 0
    while batcher.busy:
        before = engine.admission.count.clone()
        done.update((u.rid, u.generation) for u in batcher.step() if u.done)
        chunks += int((engine.admission.count != before).any())
    assert [done[i].tokens for i in ids] == alone
    assert chunks > len(reqs)  # prompts longer than a step's rows took several steps each


def test_a_chunks_rows_see_what_a_prefills_rows_see():
    """ride() gives a carrying slot's rows the visibility of consecutive prompt rows from `first` (the cached
    prompt before it, then causally) and leaves the other slots' rows as proposed."""
    b, rows, length = 3, 5, 32
    start = torch.tensor([7, 9, 11])
    proposal = chain(torch.tensor([1, 2, 3]), torch.randint(0, VOCAB, (b, rows - 1)), start, torch.arange(rows),
                     (torch.arange(rows) - 1)[None])
    tree = torch.rand(b, rows, rows) < 0.5  # (a tree's visibility, per sequence)
    proposal.visibility = Visibility(cache_len=start, start=start, tree=tree | torch.eye(rows, dtype=torch.bool))
    proposal.chain = False
    adm = Admission.zeros(b, rows, "cpu")
    prompt = list(range(20))
    adm.set({1: (prompt[4:9], 4, False)})
    got = ride(proposal, adm)
    want = Forward.consecutive(torch.arange(4, 9)[None]).visibility.dense(rows, length)[0]
    assert torch.equal(got.visibility.dense(rows, length)[1], want)
    assert got.tokens[1].tolist() == prompt[4:9] and got.positions[1].tolist() == list(range(4, 9))
    assert got.slots[1].tolist() == list(range(4, 9))
    for other in (0, 2):
        assert torch.equal(got.tokens[other], proposal.tokens[other])
        assert torch.equal(got.visibility.dense(rows, length)[other], proposal.visibility.dense(rows, length)[other])
    with pytest.raises(ValueError):
        adm.set({0: (prompt[:6], 0, False)})  # more tokens than a slot's rows


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("system", ["stock", "stock:tree=best_first,nodes=10",
                                    "stock:tree=best_first,nodes=10,hybrid_tree=recompute",
                                    "stock:tree=best_first,nodes=10,batch_rows=auto"])
def test_on_a_hybrid_each_chunk_moves_the_recurrent_state_past_it(system, sampled, monkeypatch):
    """A Gated DeltaNet layer's state moves past a chunk as the commit of a path of its rows (a block at most), and
    starts afresh at a request's first chunk (its slot may have held another request): AR's tokens still."""
    target, drafter = _pair(hybrid=True)
    reqs, arrivals = _requests(len(system) + sampled + 3, sampled)
    ar = Engine(target, None, parse_system("ar"), context=CONTEXT)
    alone = [ar.generate([r])[0].tokens for r in reqs]
    engine = Engine(target, drafter, parse_system(f"{system}{',' if ':' in system else ':'}admit=true"),
                    context=CONTEXT, slots=SLOTS)
    assert engine.admit_chunk == 6  # the drafter's block (a path's rows), not the tree's 10
    monkeypatch.setattr(batch, "_prefill", lambda *a, **k: pytest.fail("a prefill pass ran"))
    assert [g.tokens for g in engine.generate(reqs, arrivals=arrivals)] == alone


def test_one_request_at_a_time_needs_nothing():
    single = Engine(*_pair(), parse_system("stock:admit=true"), context=CONTEXT)
    assert single.admit_steps() == {} and single.admission is None


@pytest.mark.parametrize("system", ["stock:tree=best_first,nodes=10", "stock:tree=best_first,nodes=10,batch_rows=auto"])
def test_a_chunk_the_target_predicts_past_a_block_stays_within_the_paths_columns(pair, system):
    """Prompts that are the target's own greedy continuations: a chunk of a tree's 10 rows rides as a chain whose
    tokens all match the target's picks, deeper than the drafter's block of 6 (the longest path a tree's verdict
    holds). The carrying slot's verdict is unused, but its walk must stop at the block: a deeper accepted row put its
    ancestors past the path's columns (an out-of-range scatter in accept_tree; on the GPU a device-side assert in the
    step's graph, seen at nodes=32 over SmolLM2's block of 16). AR's tokens, batched."""
    target, drafter = pair
    ar = Engine(target, None, parse_system("ar"), context=CONTEXT)
    rng = random.Random(5)
    reqs = []
    for i in range(4):  # prompts of 23..26 tokens: chunks of 10 rows whose tokens the target predicts
        head = [rng.randrange(VOCAB) for _ in range(3)]
        reqs.append(Prompted(head + ar.generate([Prompted(head, 20 + i, ())])[0].tokens, 4 + i, ()))
    alone = [ar.generate([r])[0].tokens for r in reqs]
    engine = Engine(target, drafter, parse_system(f"{system},admit=true"), context=CONTEXT, slots=SLOTS)
    assert engine.admit_chunk == 10 > engine.block == 6
    assert [g.tokens for g in engine.generate(reqs, arrivals=[0, 0, 1, 2])] == alone
