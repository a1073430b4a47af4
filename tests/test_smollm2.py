"""SmolLM2-135M-Instruct (the real pair's target): float32 losslessness of stock against AR on the CPU."""

import pytest
import torch

from specpilot.datasets import load_requests
from specpilot.errors import UserError
from specpilot.fixtures.random_models import random_drafter, tiny_drafter_config
from specpilot.models.loading import load_target
from specpilot.models.smollm2 import fetch_smollm2
from specpilot.models.tokenizer import HFTokenizer
from specpilot.runtime.engine import Engine
from tests.test_lossless import OracleEngine


@pytest.fixture(scope="module")
def smol():
    try:
        folder = fetch_smollm2()
    except UserError as exc:
        pytest.skip(f"SmolLM2 not available here: {exc}")
    target = load_target(folder, torch.float32, rope_length=512)
    drafter = random_drafter(tiny_drafter_config(target.cfg, block_size=8, layers=1, selector_rank=16,
                                                 selector_top_k=8), seed=5)
    tok = HFTokenizer(folder)
    prompts = [tok.chat_prompt([{"role": "user", "content": r.turns[0]}]) for r in load_requests("builtin")[:3]]
    return target, drafter, tok, prompts


def test_stock_equals_ar_on_smollm2(smol):
    target, drafter, tok, prompts = smol
    engine = Engine(target, drafter, context=512)
    for prompt in prompts[:2]:  # a random drafter: every draft rejected (the trained drafter's tests follow)
        ar = engine.generate_one(prompt, 16, tok.eos_ids, "ar")
        stock = engine.generate_one(prompt, 16, tok.eos_ids, "stock")
        assert stock.tokens == ar.tokens
        assert len(tok.decode(ar.tokens).split()) >= 3  # a real model writes words


def test_oracle_drafts_on_smollm2_stay_lossless(smol):
    """Drafts that are mostly right (so whole and partial blocks are accepted) on a real model."""
    target, drafter, tok, prompts = smol
    ar = Engine(target, None, context=512).generate_one(prompts[0], 32, (), "ar").tokens
    engine = OracleEngine(target, drafter, context=512, sequence=prompts[0] + ar, corrupt_seed=1)
    gen = engine.generate_one(prompts[0], 32, (), "stock")
    assert gen.tokens == ar
    assert max(gen.accepted) == 8 and min(gen.accepted) < 8


def test_committed_drafter_through_the_preset(smol):
    """The `smollm2` preset: the committed trained drafter loads against the real target, stays lossless
    in float32, and accepts drafts (a random drafter almost never does)."""
    from specpilot.deployment import load_deployment
    from specpilot.runtime.pair import build_pair

    dep = load_deployment("smollm2", None)
    target, drafter, tok = build_pair(dep, with_drafter=True)
    assert drafter.cfg.block_size == 16 and target.cfg.vocab_size == drafter.cfg.layer.vocab_size
    engine = Engine(target, drafter, context=512)
    prompt = tok.chat_prompt([{"role": "user", "content": "What is 12 times 7? Explain step by step."}])
    ar = engine.generate_one(prompt, 48, tok.eos_ids, "ar")
    stock = engine.generate_one(prompt, 48, tok.eos_ids, "stock")
    assert stock.tokens == ar.tokens
    assert max(stock.accepted) >= 3 and len(stock.accepted) < len(ar.tokens) - 1


def test_smollm2_is_fetched_on_first_use_only(tmp_path, monkeypatch):
    import specpilot.models.smollm2 as smollm2
    from specpilot.runtime.pair import fetch_if_known

    calls = []
    monkeypatch.setenv("SPECPILOT_MODELS", str(tmp_path))
    monkeypatch.setattr(smollm2, "fetch_smollm2", lambda dest, progress=None: calls.append(dest))
    fetch_if_known(tmp_path / "other")  # not a model it knows
    assert calls == []
    fetch_if_known(tmp_path / "smollm2")  # missing: fetched
    assert calls == [tmp_path / "smollm2"]
    (tmp_path / "smollm2").mkdir()
    fetch_if_known(tmp_path / "smollm2")  # present (e.g. staged on the GPU machine): left alone
    assert len(calls) == 1


@pytest.mark.slow
def test_every_tree_builder_on_the_real_pair(smol):
    """The committed drafter against the real target in float32: every builder at a budget above the block (and
    best_first below it) returns AR's tokens, with drafts accepted (tau well above 1), best_first at 24 nodes at least
    as many as the stock chain."""
    from specpilot.config import parse_system
    from specpilot.deployment import load_deployment
    from specpilot.runtime.pair import build_pair

    target, drafter, tok = build_pair(load_deployment("smollm2", None), with_drafter=True)
    prompt = tok.chat_prompt([{"role": "user", "content": "Write a Python function that reverses a list."}])
    ar = Engine(target, None, context=512).generate_one(prompt, 20, tok.eos_ids, "ar").tokens
    taus = {}
    for system in ("stock", "stock:tree=best_first,nodes=8", "stock:tree=best_first,nodes=24",
                   "stock:tree=ddtree,nodes=24", "stock:tree=eagle2,nodes=24", "stock:tree=sequoia,nodes=24"):
        gen = Engine(target, drafter, parse_system(system), context=512).generate_one(prompt, 20, tok.eos_ids)
        assert gen.tokens == ar, system
        taus[system] = (len(gen.tokens) - 1) / len(gen.accepted)
    assert taus["stock:tree=best_first,nodes=24"] >= taus["stock"]
    assert min(taus.values()) > 1.5, taus
