"""EAGLE-3's drafter, its first pieces (issue 60): the released config and checkpoint layout round-trip and load
from a synthetic checkpoint in the released key names; its decoder layer against a plain re-implementation of
EAGLE-3's layer; the draft vocabulary's map into the target's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from specpilot.config import KernelPlan
from specpilot.core.contracts import Visibility
from specpilot.errors import UserError
from specpilot.fixtures.random_models import random_eagle3, tiny_target_config
from specpilot.models.cache import Cache
from specpilot.models.eagle3 import default_taps, eagle3_config_from_hf, load_eagle3, save_eagle3

PLAN = KernelPlan.stock()
TARGET = tiny_target_config(vocab=64, hidden_size=32, intermediate_size=48, num_layers=6, num_heads=4,
                            num_kv_heads=2, head_dim=8, max_position_embeddings=128)
RELEASED = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.input_layernorm.weight",
            "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight",
            *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
            *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down"))}


@pytest.fixture(scope="module")
def drafter():
    return random_eagle3(TARGET, draft_vocab=20, seed=3, taps=(1, 2, 4))


def test_the_config_round_trips_and_takes_eagles_default_taps(drafter):
    raw = json.loads(json.dumps(drafter.cfg.to_hf()))
    assert raw["architectures"] == ["LlamaForCausalLMEagle3"] and raw["draft_vocab_size"] == 20
    assert eagle3_config_from_hf(raw) == drafter.cfg
    del raw["eagle_config"]
    assert eagle3_config_from_hf(raw, target_layers=32).taps == default_taps(32) == (1, 15, 28)
    with pytest.raises(UserError, match="no target"):
        eagle3_config_from_hf(raw)
    with pytest.raises(UserError, match="one decoder layer"):
        eagle3_config_from_hf({**raw, "num_hidden_layers": 2}, target_layers=32)


@torch.no_grad()
def test_a_checkpoint_in_the_released_key_names_loads_whole(drafter, tmp_path: Path):
    save_eagle3(drafter, tmp_path / "e3")
    tensors = load_file(str(tmp_path / "e3" / "model.safetensors"))
    assert set(tensors) == RELEASED
    h = TARGET.hidden_size
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (TARGET.q_dim, 2 * h)  # [embedding; hidden]
    assert tensors["fc.weight"].shape == (h, 3 * h) and tensors["lm_head.weight"].shape == (20, h)
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert int(tensors["t2d"].sum()) == 20
    loaded = load_eagle3(tmp_path / "e3")
    assert loaded.cfg == drafter.cfg and loaded.d2t.dtype == torch.int64
    for (name, a), b in zip(drafter.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    ids = torch.arange(20)
    assert torch.equal(loaded.target_ids(ids), ids + tensors["d2t"])  # target id = draft id + d2t[draft id]
    assert tensors["t2d"][loaded.target_ids(ids)].all()


def test_a_checkpoint_whose_shapes_disagree_with_its_config_is_one_line(drafter, tmp_path: Path):
    save_eagle3(drafter, tmp_path / "e3")
    cfg = json.loads((tmp_path / "e3" / "config.json").read_text())
    (tmp_path / "e3" / "config.json").write_text(json.dumps({**cfg, "draft_vocab_size": 21}))
    with pytest.raises(UserError, match="has shape"):
        load_eagle3(tmp_path / "e3")


def _rotate(x: torch.Tensor, pos: torch.Tensor, dim: int, theta: float) -> torch.Tensor:
    inv = 1.0 / theta ** (torch.arange(0, dim, 2).float() / dim)
    ang = pos[:, None].float() * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


@torch.no_grad()
def test_the_layer_is_eagle3s_layer(drafter):
    """Rows 0..T-1 causally: norms of the embedding and of h side by side into q/k/v, h itself the residual, rope at
    base 10000, grouped-query attention, the MLP; then the final norm and the draft head."""
    gen = torch.Generator().manual_seed(7)
    t, lc = 5, drafter.cfg.layer
    embeds, feats = torch.randn(1, t, lc.hidden_size, generator=gen), torch.randn(1, t, 3 * 32, generator=gen)
    hidden = drafter.fuse(feats, PLAN)
    cache = Cache.build(["attention"], 1, 16, lc.num_kv_heads, lc.head_dim, torch.float32, "cpu")
    pos = torch.arange(t)[None]
    vis = Visibility(cache_len=torch.tensor([0]), start=torch.tensor([0]))
    out = drafter(embeds, hidden, pos, cache[0], pos, vis, PLAN)

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + lc.rms_norm_eps) * w

    x = torch.cat([norm(embeds[0], drafter.input_norm), norm(hidden[0], drafter.hidden_norm)], -1)
    wq, wk, wv = drafter.attn.wqkv.weight.split([lc.q_dim, lc.kv_dim, lc.kv_dim])
    d = lc.head_dim
    q = _rotate((x @ wq.T).view(t, lc.num_heads, d).transpose(0, 1), torch.arange(t), d, 10000.0)
    k = _rotate((x @ wk.T).view(t, lc.num_kv_heads, d).transpose(0, 1), torch.arange(t), d, 10000.0)
    v = (x @ wv.T).view(t, lc.num_kv_heads, d).transpose(0, 1)
    rep = lc.num_heads // lc.num_kv_heads
    o = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0), is_causal=True)
    h1 = hidden[0] + o.transpose(0, 1).reshape(t, -1) @ drafter.attn.wo.weight.T
    gate, up = drafter.mlp.w13.weight.split(lc.intermediate_size)
    y = norm(h1, drafter.mlp_norm)
    want = h1 + (F.silu(y @ gate.T) * (y @ up.T)) @ drafter.mlp.w2.weight.T
    torch.testing.assert_close(out[0], want, rtol=1e-4, atol=1e-4)
    logits = drafter.logits(out, PLAN)
    torch.testing.assert_close(logits[0], norm(want, drafter.norm) @ drafter.head.weight.T, rtol=1e-4, atol=1e-4)
    assert logits.shape[-1] == 20


def test_a_deployment_naming_an_eagle3_drafter_is_told_in_one_line(drafter, tmp_path: Path):
    from specpilot.models.loading import load_drafter

    save_eagle3(drafter, tmp_path / "e3")
    with pytest.raises(UserError, match="cannot draft with one yet"):
        load_drafter(tmp_path / "e3")
