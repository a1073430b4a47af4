"""What the drafter is told beside each committed row's features: the row's own token (a drafter that pairs a
position's features with the token after it, EAGLE-3, needs them). Every token told at a position is the token the
request has there, in single-request and batched runs, over chains, trees, anchor steps and admitted prompt chunks,
and every position of the prompt and of all but the last step's output is told."""

from __future__ import annotations

import pytest

from specpilot.config import parse_system
from specpilot.core.contracts import Prompted
from specpilot.fixtures.random_models import random_drafter, random_target, tiny_drafter_config, tiny_target_config
from specpilot.runtime.engine import Engine
from specpilot.speculative.drafter import DFlash

VOCAB = 24
CONTEXT = 96


@pytest.fixture(scope="module")
def pair():
    cfg = tiny_target_config(vocab=VOCAB, num_layers=2, max_position_embeddings=128, num_kv_heads=4)
    drafter = random_drafter(tiny_drafter_config(cfg, target_layer_ids=[0, 1], block_size=4, selector_rank=8,
                                                 selector_top_k=4), seed=12)
    return random_target(cfg, seed=11), drafter


def _recording(monkeypatch) -> dict[int, dict[int, int]]:
    """slot -> position -> the token the drafter was told there (a position told twice must agree)."""
    told: dict[int, dict[int, int]] = {}

    def note(slot: int, pos: int, token: int) -> None:
        assert told.setdefault(slot, {}).setdefault(pos, token) == token, (slot, pos)

    real_prefill, real_commit = DFlash.prefill, DFlash.commit

    def prefill(self, hidden, first=0, slot=0, tokens=None):
        for i, t in enumerate(tokens[0].tolist()):
            note(slot, first + i, t)
        return real_prefill(self, hidden, first, slot, tokens)

    def commit(self, feats, first, count, rows, tokens=None):
        rows2 = rows if rows.dim() == 2 else rows[None].expand(first.shape[0], -1)
        for b in range(first.shape[0]):
            for r in range(int(count[b])):
                note(b, int(first[b] + rows2[b, r]), int(tokens[b, r]))
        return real_commit(self, feats, first, count, rows, tokens)

    monkeypatch.setattr(DFlash, "prefill", prefill)
    monkeypatch.setattr(DFlash, "commit", commit)
    return told


@pytest.mark.parametrize("system", ["stock", "stock:tree=best_first,nodes=10", "stock:batch_rows=auto",
                                    "stock:admit=true", "stock:tree=ddtree,nodes=8,admit=true"])
@pytest.mark.parametrize("slots", [1, 2])
def test_every_committed_row_is_told_with_its_own_token(pair, monkeypatch, system, slots):
    if slots == 1 and "admit" in system:
        pytest.skip("prompt admission is a batch's")
    target, drafter = pair
    told = _recording(monkeypatch)
    engine = Engine(target, drafter, parse_system(system), context=CONTEXT, slots=slots)
    reqs = [Prompted([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8], 30),
            Prompted([2, 7, 1, 8, 2, 8], 26)][:slots]
    if slots == 1:
        gens = [engine.generate_one(reqs[0].prompt, reqs[0].max_new_tokens, ())]
    else:
        gens = engine.generate(reqs, arrivals=[0, 3])
    for slot, (r, g) in enumerate(zip(reqs, gens, strict=True)):
        sequence = r.prompt + g.tokens
        for pos, token in told[slot].items():
            assert pos < len(sequence) and token == sequence[pos], (system, slot, pos)
        # every prompt position, and each output position but the last step's rows (no step comes after it)
        missing = sorted(set(range(len(sequence))) - set(told[slot]))
        assert missing == list(range(len(sequence) - len(missing), len(sequence))) and len(missing) <= 4, missing
