"""Hybrid targets (Gated DeltaNet + gated attention, Qwen3.5's layout) on the CPU in float32: the model equals
transformers' Qwen3.5 on a small random config, and every system's output equals AR's token for token, single and
batched."""

from __future__ import annotations

import random

import pytest
import torch

from specpilot.config import parse_system
from specpilot.core.contracts import Forward, Prompted
from specpilot.fixtures.random_models import random_drafter, random_target, tiny_drafter_config, tiny_hybrid_config
from specpilot.models.dense import DenseTarget, Mode
from specpilot.runtime.engine import Engine

VOCAB, CONTEXT = 24, 96
SYSTEMS = ["stock", "stock:tree=best_first,nodes=10", "stock:tree=ddtree,nodes=8", "stock:tree=eagle2,nodes=8,tree_k=2",
           "stock:tree=sequoia,nodes=8", "stock:tree=best_first,nodes=10,hybrid_tree=recompute",
           "stock:tree=ddtree,nodes=8,hybrid_tree=recompute"]  # trees: a state per node (default), or none


def _hf_pair():
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    from specpilot.models.config import dense_config_from_hf

    hf_cfg = transformers.Qwen3_5TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=8, max_position_embeddings=256, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    hf = Qwen3_5ForCausalLM(hf_cfg).eval()
    with torch.no_grad():  # weights of full effect (the init's zero-centred norms and small weights hide bugs)
        for p in hf.parameters():
            p.copy_(0.3 * torch.randn_like(p) if p.dim() == 1 else torch.randn_like(p) / p.shape[-1] ** 0.5)
    cfg = dense_config_from_hf(hf_cfg.to_dict())
    return hf, cfg


def test_a_qwen3_5_config_reads_as_a_hybrid():
    _, cfg = _hf_pair()
    assert cfg.kinds == ["gdn", "gdn", "gdn", "attention"] and cfg.attn_output_gate and cfg.rotary_dim == 4
    assert (cfg.gdn.k_heads, cfg.gdn.v_heads, cfg.gdn.k_dim, cfg.gdn.v_dim, cfg.gdn.conv) == (2, 4, 8, 8, 4)


def _ours(hf, cfg) -> DenseTarget:
    from specpilot.models.qwen3_5 import convert

    model = DenseTarget(cfg, rope_length=256)
    model.load_state_dict(convert(hf.state_dict(), cfg), strict=True)
    return model.eval()


@torch.inference_mode()
def test_logits_equal_transformers_qwen3_5_at_every_prefix():
    hf, cfg = _hf_pair()
    ours = _ours(hf, cfg)
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(1))
    want = hf(ids).logits
    for t in (1, 5, 17, 40):  # prefill of t tokens: the chunked form across the chunk boundary too
        cache = ours.new_cache(1, 64)
        got, _ = ours(ids[:, :t], Forward.consecutive(torch.arange(t)[None]), cache, Mode.PREFILL)
        torch.testing.assert_close(got[0, -1], want[0, t - 1], rtol=1e-4, atol=1e-4)


def test_a_qwen3_5_checkpoint_folder_loads_as_its_logits_say(tmp_path):
    from specpilot.models.loading import load_target

    hf, _ = _hf_pair()
    hf.save_pretrained(tmp_path)
    ours = load_target(tmp_path)
    ids = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        got, _ = ours(ids, Forward.consecutive(torch.arange(9)[None]), ours.new_cache(1, 16), Mode.PREFILL)
        torch.testing.assert_close(got[0, -1], hf(ids).logits[0, -1], rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_greedy_decoding_equals_transformers_generate():
    hf, cfg = _hf_pair()
    engine = Engine(_ours(hf, cfg), None, parse_system("ar"), context=80)
    prompt = [3, 14, 15, 9, 26, 5]
    want = hf.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False, min_new_tokens=30)[0, 6:]
    assert engine.generate_one(prompt, 30).tokens == want.tolist()


@pytest.fixture(scope="module")
def pair():
    tcfg = tiny_hybrid_config(vocab=VOCAB, max_position_embeddings=128)
    target = random_target(tcfg, seed=3)
    drafter = random_drafter(tiny_drafter_config(tcfg, target_layer_ids=[0, 3], block_size=4, selector_rank=8,
                                                 selector_top_k=4), seed=4)
    return target, drafter


def _requests(seed: int, n: int) -> list[Prompted]:
    rng = random.Random(seed)
    return [Prompted([rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))], rng.randint(1, 30)) for _ in range(n)]


@pytest.mark.parametrize("system", SYSTEMS)
def test_every_system_equals_ar_on_a_hybrid_single_and_batched(pair, system):
    target, drafter = pair
    reqs = _requests(SYSTEMS.index(system), 6)
    ar = Engine(target, drafter, parse_system("ar"), context=CONTEXT)
    want = [g.tokens for g in ar.generate(reqs)]
    spec = Engine(target, drafter, parse_system(system), context=CONTEXT)
    got = spec.generate(reqs)
    assert [g.tokens for g in got] == want, system
    assert any(n > 1 for g in got for n in g.accepted), system  # drafts were taken, not only bonus tokens
    batch = Engine(target, drafter, parse_system(system), context=CONTEXT, slots=3)
    assert [g.tokens for g in batch.generate(reqs, arrivals=[0, 0, 1, 3, 3, 8])] == want, system
    ar_batch = Engine(target, drafter, parse_system("ar"), context=CONTEXT, slots=3)
    assert [g.tokens for g in ar_batch.generate(reqs, arrivals=[0, 2, 2, 3, 5, 5])] == want
