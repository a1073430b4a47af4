"""Logit parity of our dense target with `transformers` (Llama and Qwen3 families), in float32 on the CPU.

Every Hugging Face model gets scale-aware random weights (including its RMSNorm weights and biases,
which transformers initialises to ones / zeros) so that a wrong norm, bias, RoPE or GQA mapping shows up
as a logit difference far above the float32 tolerance.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from specpilot.core.contracts import Forward, Visibility, chain_visibility, verify_mask
from specpilot.fixtures.random_models import random_target, tiny_target_config
from specpilot.models.dense import Mode
from specpilot.models.layers import rope_inv_freq
from specpilot.models.loading import load_target, save_target

TOL = 1e-4
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
LINEAR = {"rope_type": "linear", "factor": 2.0}

# name -> (family, config kwargs, sequence length)
CASES = {
    "llama-gqa2-untied": ("llama", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                        rope_theta=10000.0, tie_word_embeddings=False), 24),
    "llama-mha-tied-bias": ("llama", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                                          rope_theta=500000.0, tie_word_embeddings=True,
                                          attention_bias=True), 24),
    "llama-gqa3-llama3-rope": ("llama", dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2,
                                             rope_theta=10000.0, rope_scaling=LLAMA3), 80),
    "llama-linear-rope": ("llama", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                        rope_theta=10000.0, rope_scaling=LINEAR), 40),
    "qwen3-gqa2-headdim24": ("qwen3", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                           head_dim=24, rope_theta=1000000.0, tie_word_embeddings=False), 24),
    "qwen3-gqa3-tied": ("qwen3", dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
                                      head_dim=16, rope_theta=10000.0, tie_word_embeddings=True), 24),
    "qwen3-mha-llama3-rope": ("qwen3", dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                                            head_dim=8, rope_theta=10000.0, rope_scaling=LLAMA3), 72),
}


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Unit-scale random weights: matrices ~ N(0, 1/fan_in), embeddings ~ N(0, 1), norms 1 + 0.3 N(0, 1),
    biases 0.2 N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                value = 0.2 * torch.randn(p.shape, generator=gen)
            elif p.dim() == 1:
                value = 1.0 + 0.3 * torch.randn(p.shape, generator=gen)
            elif "embed_tokens" in name:
                value = torch.randn(p.shape, generator=gen)
            else:
                value = torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1])
            p.copy_(value)


def _hf_model(family: str, kwargs: dict, seed: int = 0):
    torch.manual_seed(seed)
    common = dict(vocab_size=101, intermediate_size=96, num_hidden_layers=3, max_position_embeddings=256,
                  rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
    common.update(copy.deepcopy(kwargs))  # transformers writes rope_theta into a rope_scaling dict it is given
    if family == "llama":
        cfg, cls = LlamaConfig(**common), LlamaForCausalLM
    else:
        cfg, cls = Qwen3Config(**common), Qwen3ForCausalLM
    cfg._attn_implementation = "eager"
    model = cls(cfg).float().eval()
    _randomise(model, seed + 1)
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    """(HF model, our model loaded from its save_pretrained folder, tokens, HF outputs)."""
    family, kwargs, seq = CASES[request.param]
    hf = _hf_model(family, kwargs, seed=sorted(CASES).index(request.param))
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder, safe_serialization=True)
    ours = load_target(folder, rope_length=max(seq, 8) + 8)
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, hf.config.vocab_size, (1, seq), generator=gen)
    with torch.no_grad():
        out = hf(tokens, output_hidden_states=True)
    return hf, ours, tokens, out


def _verify(model, tokens, start, cache, hidden_layers=(), explicit_chain=True):
    """VERIFY rows `tokens` [1, N] at positions start.. as a chain over a cache of `start` rows (the chain
    given explicitly as a lower-triangular tree, or as the default tree=None)."""
    n = tokens.shape[1]
    positions = torch.arange(start, start + n)[None]
    s = torch.tensor([start])
    vis = Visibility(cache_len=s, start=s, tree=chain_visibility(n) if explicit_chain else None)
    causal = torch.arange(cache.length)[None, None, :] <= positions[:, :, None]
    assert torch.equal(vis.dense(n, cache.length), causal)
    assert torch.equal(verify_mask(s, s, chain_visibility(n), cache.length), causal)
    return model(tokens, Forward(positions, positions, vis), cache, Mode.VERIFY, None, hidden_layers)


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


@torch.no_grad()
def test_config_read_from_hf(pair):
    hf, ours, _, _ = pair
    c, h = ours.cfg, hf.config
    assert c.family == h.model_type
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (h.num_attention_heads, h.num_key_value_heads,
                                                          h.head_dim)
    assert c.tie_word_embeddings == h.tie_word_embeddings
    assert c.qk_norm == (h.model_type == "qwen3")
    assert c.attention_bias == h.attention_bias


@torch.no_grad()
def test_full_sequence_logits(pair):
    hf, ours, tokens, out = pair
    ref = out.logits
    assert ref.abs().max() > 1.0  # the random init gives logits of order one, not all ~0
    seq = tokens.shape[1]
    logits, _ = _verify(ours, tokens, 0, ours.new_cache(1, seq))
    assert _maxdiff(logits, ref) <= TOL
    # PREFILL returns the last row only.
    last, _ = ours(tokens, Forward.consecutive(torch.arange(seq)[None]), ours.new_cache(1, seq), Mode.PREFILL)
    assert last.shape == (1, 1, hf.config.vocab_size)
    assert _maxdiff(last[0, 0], ref[0, -1]) <= TOL


@torch.no_grad()
def test_prefill_then_decode(pair):
    hf, ours, tokens, out = pair
    seq = tokens.shape[1]
    prefix = seq // 2
    cache = ours.new_cache(1, seq)
    last, _ = ours(tokens[:, :prefix], Forward.consecutive(torch.arange(prefix)[None]), cache, Mode.PREFILL)
    assert _maxdiff(last[0, 0], out.logits[0, prefix - 1]) <= TOL
    for p in range(prefix, seq):
        step, _ = ours(tokens[:, p : p + 1], Forward.consecutive(torch.tensor([[p]])), cache, Mode.DECODE)
        assert step.shape == (1, 1, hf.config.vocab_size)
        assert _maxdiff(step[0, 0], out.logits[0, p]) <= TOL, p


@torch.no_grad()
def test_verify_after_prefix(pair):
    _, ours, tokens, out = pair
    seq = tokens.shape[1]
    prefix, n = seq - 9, 7
    cache = ours.new_cache(1, seq + 4)  # longer than used: the slots past the rows must stay invisible
    for state in cache.layers:  # garbage in unused slots
        state.k.normal_()
        state.v.normal_()
    ours(tokens[:, :prefix], Forward.consecutive(torch.arange(prefix)[None]), cache, Mode.PREFILL)
    logits, _ = _verify(ours, tokens[:, prefix : prefix + n], prefix, cache)
    assert _maxdiff(logits, out.logits[:, prefix : prefix + n]) <= TOL
    # Again with the default (implicit) chain: the same rows overwrite the same slots.
    again, _ = _verify(ours, tokens[:, prefix : prefix + n], prefix, cache, explicit_chain=False)
    assert _maxdiff(again, out.logits[:, prefix : prefix + n]) <= TOL


@torch.no_grad()
def test_hidden_states_of_a_middle_layer(pair):
    hf, ours, tokens, out = pair
    seq = tokens.shape[1]
    layers = hf.config.num_hidden_layers
    for i in range(layers - 1):  # the last entry of HF's hidden_states is after the final norm
        _, hidden = _verify(ours, tokens, 0, ours.new_cache(1, seq), hidden_layers=(i,))
        assert _maxdiff(hidden, out.hidden_states[i + 1]) <= TOL
    _, both = _verify(ours, tokens, 0, ours.new_cache(1, seq), hidden_layers=(0, 1))
    ref = torch.cat([out.hidden_states[1], out.hidden_states[2]], -1)
    assert _maxdiff(both, ref) <= TOL


@torch.no_grad()
def test_rope_tables_match(pair):
    hf, ours, tokens, _ = pair
    seq = tokens.shape[1]
    x = torch.zeros(1, seq, hf.config.hidden_size)
    cos, sin = hf.model.rotary_emb(x, torch.arange(seq)[None])
    assert _maxdiff(ours.rope.cos[:seq], cos[0]) <= 1e-5
    assert _maxdiff(ours.rope.sin[:seq], sin[0]) <= 1e-5


def test_norm_weights_matter(pair, tmp_path):
    """The randomised norms are really used: resetting one to ones changes the logits."""
    hf, ours, tokens, out = pair
    with torch.no_grad():
        saved = ours.norm.clone()
        ours.norm.fill_(1.0)
        try:
            logits, _ = _verify(ours, tokens, 0, ours.new_cache(1, tokens.shape[1]))
        finally:
            ours.norm.copy_(saved)
    assert _maxdiff(logits, out.logits) > 10 * TOL


@pytest.mark.parametrize("head_dim", [16, 64, 128])
@pytest.mark.parametrize("theta", [10000.0, 500000.0])
@pytest.mark.parametrize("scaling", [None, LINEAR, LLAMA3, {**LLAMA3, "factor": 32.0, "high_freq_factor": 2.0,
                                                             "original_max_position_embeddings": 1024}])
def test_rope_inv_freq_matches_transformers(head_dim, theta, scaling):
    hf_cfg = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim, rope_theta=theta,
                         rope_scaling=copy.deepcopy(scaling), max_position_embeddings=4096)
    assert hf_cfg.rope_parameters["rope_theta"] == theta
    rotary = LlamaRotaryEmbedding(hf_cfg)
    assert rotary.attention_scaling == 1.0
    ours = rope_inv_freq(head_dim, theta, scaling)
    torch.testing.assert_close(ours, rotary.inv_freq.float(), rtol=1e-6, atol=0)


# ----- our random targets -> save_target -> load_target / transformers ---------------------------------

OURS = {
    "llama": dict(family="llama"),
    "llama-tied-bias-llama3": dict(family="llama", tie_word_embeddings=True, attention_bias=True,
                                   num_kv_heads=4, rope_scaling=LLAMA3, rope_theta=500000.0),
    "qwen3-headdim24": dict(family="qwen3", qk_norm=True, head_dim=24, rope_theta=1000000.0),
    "qwen3-tied-linear": dict(family="qwen3", qk_norm=True, tie_word_embeddings=True, rope_scaling=LINEAR),
}


@pytest.mark.parametrize("name", sorted(OURS))
@torch.no_grad()
def test_save_target_round_trip_and_transformers(name, tmp_path: Path):
    cfg = tiny_target_config(vocab=128, num_layers=2, max_position_embeddings=256, **copy.deepcopy(OURS[name]))
    model = random_target(cfg, seed=3)
    folder = tmp_path / "target"
    save_target(model, folder)
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert not (tmp_path / "target.partial").exists()
    seq = 72
    tokens = torch.randint(0, cfg.vocab_size, (1, seq), generator=torch.Generator().manual_seed(5))
    ref, _ = _verify(model, tokens, 0, model.new_cache(1, seq))

    loaded = load_target(folder)
    assert loaded.cfg == model.cfg
    got, _ = _verify(loaded, tokens, 0, loaded.new_cache(1, seq))
    assert torch.equal(got, ref)

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert type(hf).__name__ == {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[cfg.family]
    hf_logits = hf(tokens).logits
    assert _maxdiff(hf_logits, ref) <= TOL
