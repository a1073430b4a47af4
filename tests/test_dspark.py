"""DSpark (DeepSpec's drafter) beside DFlash, in float32 on the CPU: its config and checkpoint layout round-trip and
load from a synthetic checkpoint written in DeepSpec's own key names; its lattice's greedy walk is DSpark's own
sequential greedy draft (a plain re-implementation); every builder over it gives AR's tokens, single and batched,
greedy and sampled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specpilot.config import KernelPlan, parse_system
from specpilot.fixtures.random_models import random_drafter, random_target, tiny_drafter_config, tiny_target_config
from specpilot.models.config import drafter_config_from_hf
from specpilot.models.loading import load_drafter, save_drafter
from specpilot.runtime.engine import Engine
from specpilot.weights import DenseWeight
from tests.conftest import assert_ar_tokens_alone_and_batched

PLAN = KernelPlan.stock()
VOCAB = 24  # few tokens: random drafts are accepted now and then, so paths of every length occur
CONTEXT = 96
DSPARK = dict(anchor_drafts=True, markov_rank=8, confidence_head=True)
SYSTEMS = ["stock", "stock:block_size=3", "stock:tree=best_first,nodes=10", "stock:tree=ddtree,nodes=8",
           "stock:tree=eagle2,nodes=8,tree_k=2", "stock:tree=sequoia,nodes=8", "stock:batch_budget=6"]
# the tensors of DeepSpec's Qwen3DSparkModel (deepspec/modeling/dspark/qwen3/modeling.py), one draft layer
DEEPSPEC_KEYS = {
    "embed_tokens.weight", "fc.weight", "hidden_norm.weight", "norm.weight", "lm_head.weight",
    "markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
    "confidence_head.proj.bias",
    *(f"layers.0.{n}.weight" for n in (
        "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
        "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj",
        "mlp.down_proj")),
}


def _pair(seed: int = 11, **kw):
    tcfg = tiny_target_config(vocab=VOCAB, num_layers=2, max_position_embeddings=128, num_kv_heads=4)
    target = random_target(tcfg, seed=seed)
    cfg = tiny_drafter_config(tcfg, target_layer_ids=[0, 1], block_size=3, **{**DSPARK, **kw})
    return target, random_drafter(cfg, seed=seed + 1)


@pytest.fixture(scope="module")
def pair():
    return _pair()


def test_the_config_is_deepspecs_flat_layout_and_round_trips():
    cfg = _pair()[1].cfg
    raw = json.loads(json.dumps(cfg.to_hf()))
    assert raw["architectures"] == ["Qwen3DSparkModel"] and "dflash_config" not in raw
    assert raw["markov_rank"] == 8 and raw["markov_head_type"] == "vanilla" and raw["enable_confidence_head"]
    assert raw["block_size"] == 3 and cfg.rows == 4  # three drafts: the anchor's slot drafts too
    assert drafter_config_from_hf(raw) == cfg
    bad = {**raw, "markov_head_type": "rnn"}
    with pytest.raises(Exception, match="markov_head_type 'rnn' is not supported"):
        drafter_config_from_hf(bad)


@torch.no_grad()
def test_a_checkpoint_in_deepspecs_key_names_loads_and_ours_round_trips(pair, tmp_path: Path):
    target, drafter = pair
    folder = tmp_path / "dspark"
    save_drafter(drafter, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    # DeepSpec saves its own (frozen) copies of the target's embedding and head; the loader uses the target's
    tensors["embed_tokens.weight"] = target.embed.weight.clone()
    tensors["lm_head.weight"] = target.head.weight.clone()
    assert set(tensors) == DEEPSPEC_KEYS
    h, r = drafter.cfg.layer.hidden_size, drafter.cfg.markov_rank
    assert tensors["markov_head.markov_w2.weight"].shape == (VOCAB, r)
    assert tensors["confidence_head.proj.weight"].shape == (1, h + r)
    save_file(tensors, str(folder / "model.safetensors"))
    loaded = load_drafter(folder)
    assert loaded.cfg == drafter.cfg
    for (name, a), b in zip(drafter.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@torch.no_grad()
def test_the_greedy_walk_is_dsparks_sequential_draft_and_edges_carry_each_parents_bias(pair):
    target, drafter = pair
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 3, drafter.cfg.layer.hidden_size, generator=gen)
    size = drafter.cfg.layer.hidden_size
    head = DenseWeight.of(torch.randn(VOCAB, size, generator=gen) / size**0.5)  # logits of the bias's order
    anchor = torch.tensor([5, 17])
    lattice = drafter.lattice(hidden, head, anchor, 6, PLAN)
    w1, w2 = drafter.markov.w1.weight, drafter.markov.w2.weight
    logits, unbiased = hidden @ head.weight.T, []
    for b in range(2):  # DeepSpec's drafting: slot k's pick is the argmax of its logits + W2 W1[pick k-1]
        prev, picks, conf = int(anchor[b]), [], []
        for k in range(3):
            picks.append(int((logits[b, k] + w2 @ w1[prev]).argmax()))
            x = torch.cat([hidden[b, k], w1[prev]])
            conf.append(torch.sigmoid(drafter.confidence.proj(x))[0])
            prev = picks[-1]
        assert lattice.greedy_chain()[b].tolist() == picks
        unbiased.append(picks != logits[b].argmax(-1).tolist())
        torch.testing.assert_close(lattice.confidence[b], torch.stack(conf))
    assert any(unbiased)  # the bias moved a pick: the walk is not the logits' own argmax
    from specpilot.speculative.budget import chain_scores

    # batch_budget shares a batch's rows by the prefix-survival odds of each drafter's own chain (DeepSpec's rule)
    own = chain_scores(lattice, lattice.greedy_picks(), own=True)
    torch.testing.assert_close(own[:, 1:], lattice.confidence.log().cumsum(1))
    assert own[:, 0].eq(0).all() and not torch.equal(own, chain_scores(lattice, lattice.greedy_picks()))
    d, p, c = 2, 3, 1  # an edge: the child's own logit plus the bias after that parent
    parent, child = lattice.tokens[0, d - 1, p], lattice.tokens[0, d, c]
    torch.testing.assert_close(lattice.edges[0, d, p, c], logits[0, d, child] + w1[parent] @ w2[child])


@pytest.mark.parametrize("system, sampled", [  # sampled past stock's: make test-slow
    pytest.param(system, sampled, marks=[pytest.mark.slow] if sampled and system != "stock" else [])
    for system in SYSTEMS for sampled in (False, True)])
def test_every_builder_over_dspark_gives_ar_tokens_single_and_batched(pair, system, sampled):
    target, drafter = pair
    assert_ar_tokens_alone_and_batched(target, drafter, system, SYSTEMS.index(system) + 7 * sampled, sampled, VOCAB,
                                       CONTEXT)


def test_the_tiny_dspark_preset_runs_its_own_block():
    from specpilot.deployment import load_deployment
    from specpilot.runtime.pair import build_pair

    dep = load_deployment("tiny-dspark")
    target, drafter, tok = build_pair(dep)
    engine = Engine(target, drafter, parse_system("stock"), context=dep.context)
    assert drafter.cfg.kind == "dspark" and engine.block == drafter.cfg.block_size + 1 == 8
    prompt = tok.encode("a dspark drafter")
    ar = Engine(target, None, parse_system("ar"), context=dep.context)
    assert engine.generate_one(prompt, 24, ()).tokens == ar.generate_one(prompt, 24, ()).tokens
