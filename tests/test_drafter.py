"""DFlash drafter: config and checkpoint round-trips, draft_block against a plain re-implementation,
the DFlash2 candidate selector, and lattice invariants."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from specpilot.config import KernelPlan
from specpilot.core.contracts import Lattice
from specpilot.fixtures.random_models import random_drafter, tiny_drafter_config, tiny_target_config
from specpilot.models.config import drafter_config_from_hf
from specpilot.models.loading import load_drafter, save_drafter
from specpilot.weights import DenseWeight

PLAN = KernelPlan.stock()

VOCAB = 96


def _target_cfg(**kw):
    return tiny_target_config(vocab=VOCAB, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                              num_kv_heads=2, head_dim=8, max_position_embeddings=128, **kw)


VARIANTS = {
    "plain": dict(),
    "selector": dict(selector_rank=8, selector_top_k=4),
    "conv": dict(conv_kernel_size=2, conv_group_size=16),
    "selector-conv": dict(selector_rank=8, selector_top_k=4, conv_kernel_size=2, conv_group_size=16),
    "sliding": dict(sliding_window=6, is_causal=True),
    "sliding-noncausal": dict(sliding_window=6, is_causal=False),
    "scaled-softcap": dict(input_embedding_scale=1.5, output_multiplier=0.5, final_logit_softcapping=20.0),
}


def _drafter_cfg(variant: str, block_size: int = 4, layers: int = 2):
    return tiny_drafter_config(_target_cfg(), block_size=block_size, layers=layers, target_layer_ids=[0, 2],
                               **VARIANTS[variant])


def _head(seed: int = 11) -> tuple[torch.Tensor, torch.Tensor]:
    """A target-like embedding and LM head (unit-RMS embeddings, logits of order one)."""
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(VOCAB, 32, generator=gen)
    head = torch.randn(VOCAB, 32, generator=gen) / math.sqrt(32) * 3
    return DenseWeight.of(embed), DenseWeight.of(head)


def _context(drafter, ctx_len: int, total: int, seed: int = 5):
    """A drafter cache holding `ctx_len` context rows (slots == positions), garbage in every later slot."""
    gen = torch.Generator().manual_seed(seed)
    feats = torch.randn(1, ctx_len, len(drafter.cfg.target_layer_ids) * 32, generator=gen)
    cache = drafter.new_cache(1, total)
    for state in cache.layers:
        state.k.copy_(torch.randn(state.k.shape, generator=gen) * 10)
        state.v.copy_(torch.randn(state.v.shape, generator=gen) * 10)
    pos = torch.arange(ctx_len)[None]
    drafter.write_context(feats, pos, pos, cache, PLAN)
    return feats, cache


def _draft(drafter, embed, ctx_len: int = 9, anchor: int = 7, total: int = 32):
    feats, cache = _context(drafter, ctx_len, total)
    bk = drafter.cfg.block_size
    block = torch.tensor([[anchor] + [drafter.cfg.mask_token_id] * (bk - 1)])
    return feats, block, drafter.draft_block(embed, block, torch.tensor([ctx_len]), cache, PLAN)


# ----- (a) config round-trip ----------------------------------------------------------------------------

@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_config_round_trip(variant):
    cfg = _drafter_cfg(variant)
    raw = cfg.to_hf()
    back = drafter_config_from_hf(json.loads(json.dumps(raw)))
    assert back == cfg
    assert raw["architectures"] == ["DFlash2DraftModel" if cfg.selector_rank else "DFlashDraftModel"]
    assert raw["dflash_config"]["target_layer_ids"] == [0, 2]


def test_config_defaults_of_a_sliding_layer_are_causal():
    raw = _drafter_cfg("sliding").to_hf()
    del raw["is_causal"]
    assert drafter_config_from_hf(raw).is_causal
    raw = _drafter_cfg("plain").to_hf()
    del raw["is_causal"]
    assert not drafter_config_from_hf(raw).is_causal


# ----- (b) checkpoint round-trip --------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["plain", "selector-conv", "sliding", "scaled-softcap"])
@torch.no_grad()
def test_save_load_round_trip(variant, tmp_path: Path):
    cfg = _drafter_cfg(variant)
    drafter = random_drafter(cfg, seed=2)
    save_drafter(drafter, tmp_path / "d")
    loaded = load_drafter(tmp_path / "d")
    assert loaded.cfg == cfg
    embed, head = _head()
    _, _, h1 = _draft(drafter, embed)
    _, _, h2 = _draft(loaded, embed)
    assert torch.equal(h1, h2)
    anchor = torch.tensor([7])
    l1, l2 = drafter.lattice(h1, head, anchor, 8, PLAN), loaded.lattice(h2, head, anchor, 8, PLAN)
    assert torch.equal(l1.tokens, l2.tokens) and torch.equal(l1.logp, l2.logp)
    if cfg.selector_rank:
        assert torch.equal(l1.edges, l2.edges)
    # Every parameter came back: a changed weight would have changed the state dict.
    for (name, a), b in zip(drafter.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@torch.no_grad()
def test_load_dflash2_codebook_names(tmp_path: Path):
    """Released DFlash2 checkpoints store the selector codebooks without the '.weight' suffix."""
    drafter = random_drafter(_drafter_cfg("selector"), seed=4)
    folder = tmp_path / "d2"
    save_drafter(drafter, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    for n in ("predecessor_codebook", "successor_codebook"):
        tensors[f"candidate_selector.{n}"] = tensors.pop(f"candidate_selector.{n}.weight")
    assert "candidate_selector.hidden_projection.weight" in tensors
    save_file(tensors, str(folder / "model.safetensors"))
    loaded = load_drafter(folder)
    assert torch.equal(loaded.selector.predecessor_codebook.weight, drafter.selector.predecessor_codebook.weight)
    assert torch.equal(loaded.selector.successor_codebook.weight, drafter.selector.successor_codebook.weight)
    embed, head = _head()
    _, _, h = _draft(loaded, embed)
    anchor = torch.tensor([3])
    assert torch.equal(loaded.lattice(h, head, anchor, 4, PLAN).edges, drafter.lattice(h, head, anchor, 4, PLAN).edges)


# ----- (c) draft_block against a straightforward re-implementation ----------------------------------------

def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, positions, theta):
    """x [T, H, D] rotated (rotate-half convention) at integer positions [T]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = positions.double()[:, None] * inv[None]
    cos, sin = ang.cos().float()[:, None], ang.sin().float()[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _visible(cfg, ctx_len: int, bk: int) -> torch.Tensor:
    """[Bk, C + Bk]: which of [context, block] each block row sees (all of it unless causal / sliding)."""
    out = torch.ones(bk, ctx_len + bk, dtype=torch.bool)
    for j in range(bk):
        row = ctx_len + j
        for s in range(ctx_len + bk):
            if cfg.is_causal and s > row:
                out[j, s] = False
            if cfg.sliding_window and abs(row - s) >= cfg.sliding_window:
                out[j, s] = False
    return out


def _reference_draft(drafter, embed, feats, block, ctx_len):
    """DFlash written out: q from the block only; k/v from [context, block] (each layer's own k/v
    projections, k-norm on both, RoPE at absolute positions); full attention over context + block
    (restricted only for causal / sliding-window drafters)."""
    cfg = drafter.cfg
    lc = cfg.layer
    eps, hd, hq, hkv = lc.rms_norm_eps, lc.head_dim, lc.num_heads, lc.num_kv_heads
    bk = block.shape[1]
    ctx = _rms(feats[0] @ drafter.fc.weight.t(), drafter.hidden_norm, eps)  # [C, H]
    ctx_pos = torch.arange(ctx_len)
    blk_pos = torch.arange(ctx_len, ctx_len + bk)
    x = embed.weight[block[0]] * cfg.input_embedding_scale  # [Bk, H]
    for layer in drafter.layers:
        a = layer.attn
        wq, wk, wv = a.wqkv.weight.split([lc.q_dim, lc.kv_dim, lc.kv_dim], 0)
        h = _rms(x, layer.attn_norm, eps)
        q = _rope(_rms((h @ wq.t()).view(bk, hq, hd), a.q_norm, eps), blk_pos, lc.rope_theta)
        both = torch.cat([ctx, h], 0)
        k = _rms((both @ wk.t()).view(-1, hkv, hd), a.k_norm, eps)
        k = _rope(k, torch.cat([ctx_pos, blk_pos]), lc.rope_theta)
        v = (both @ wv.t()).view(-1, hkv, hd)
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
        scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
        scores = scores.masked_fill(~_visible(cfg, ctx_len, bk), float("-inf"))
        o = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(bk, hq * hd)
        x = x + o @ a.wo.weight.t()
        h = _rms(x, layer.mlp_norm, eps)
        gate, up = (h @ layer.mlp.w13.weight.t()).split(lc.intermediate_size, -1)
        x = x + (F.silu(gate) * up) @ layer.mlp.w2.weight.t()
    return _rms(x, drafter.norm, eps)[None]


@pytest.mark.parametrize("block_size,layers,ctx_len,kv_heads", [(4, 1, 9, 2), (8, 2, 13, 2), (2, 2, 1, 4),
                                                               (16, 3, 20, 1)])
@torch.no_grad()
def test_draft_block_matches_reference(block_size, layers, ctx_len, kv_heads):
    tcfg = _target_cfg()
    cfg = tiny_drafter_config(tcfg, block_size=block_size, layers=layers, target_layer_ids=[0, 2],
                              input_embedding_scale=1.25)
    cfg = dataclasses.replace(cfg, layer=dataclasses.replace(cfg.layer, num_kv_heads=kv_heads,
                                                             rope_theta=5000.0))
    drafter = random_drafter(cfg, seed=block_size + layers)
    embed, _ = _head()
    feats, block, hidden = _draft(drafter, embed, ctx_len=ctx_len, anchor=5, total=ctx_len + block_size + 6)
    ref = _reference_draft(drafter, embed, feats, block, ctx_len)
    assert hidden.shape == ref.shape == (1, block_size, 32)
    assert (hidden - ref).abs().max().item() <= 1e-5
    # The context matters: other features give other drafts.
    _, cache = _context(drafter, ctx_len, ctx_len + block_size + 6, seed=99)
    other = drafter.draft_block(embed, block, torch.tensor([ctx_len]), cache, PLAN)
    assert (other - hidden).abs().max().item() > 1e-3


@pytest.mark.parametrize("variant", ["sliding", "sliding-noncausal", "plain"])
@torch.no_grad()
def test_draft_block_masks_match_reference(variant):
    """Causal and sliding-window drafters (DFlash's sliding layers) against the written-out reference."""
    cfg = dataclasses.replace(_drafter_cfg(variant, block_size=8), is_causal=variant == "sliding")
    drafter = random_drafter(cfg, seed=6)
    embed, _ = _head()
    feats, block, hidden = _draft(drafter, embed, ctx_len=10, anchor=3, total=24)
    ref = _reference_draft(drafter, embed, feats, block, 10)
    assert (hidden - ref).abs().max().item() <= 1e-5
    mask = drafter.block_visibility(torch.tensor([10]), 8).dense(8, 24)
    assert mask.shape == (1, 8, 24)
    want = torch.zeros(8, 24, dtype=torch.bool)
    want[:, :18] = _visible(cfg, 10, 8)
    assert torch.equal(mask[0], want)


# ----- (d) the selector and greedy_chain --------------------------------------------------------------------

def _lattice(variant: str, seed: int, block_size: int = 6, anchor: int = 7, top_k: int = 5) -> tuple:
    drafter = random_drafter(_drafter_cfg(variant, block_size=block_size), seed=seed)
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, block_size, 32, generator=gen)
    _, head = _head(seed)
    a = torch.tensor([anchor, (anchor * 5 + 1) % VOCAB])
    return drafter, hidden, head, drafter.lattice(hidden, head, a, top_k, PLAN)


@pytest.mark.parametrize("seed", [0, 1, 2])
@torch.no_grad()
def test_selector_edges_per_parent_loop(seed):
    drafter, hidden, head, lat = _lattice("selector", seed)
    sel = drafter.selector
    b, d, k = lat.tokens.shape
    assert (b, d, k) == (2, 5, 4)  # the selector's own top_k wins over the caller's
    assert lat.edges.shape == (b, d, k, k)
    proj = hidden[:, 1:] @ sel.hidden_projection.weight.t()  # [B, D, r]
    for bi in range(b):
        for di in range(d):
            for p in range(k):
                parent = lat.anchor[bi] if di == 0 else lat.tokens[bi, di - 1, p]
                for c in range(k):
                    child = lat.tokens[bi, di, c]
                    pred = sel.predecessor_codebook.weight[parent] * proj[bi, di]
                    want = lat.unary[bi, di, c] + torch.dot(pred, sel.successor_codebook.weight[child])
                    assert abs(lat.edges[bi, di, p, c].item() - want.item()) <= 1e-5


def _walk(lat: Lattice) -> list[list[int]]:
    out = []
    for bi in range(lat.tokens.shape[0]):
        chain, parent = [], 0
        for di in range(lat.depth):
            row = lat.edges[bi, di, parent].tolist()
            parent = max(range(len(row)), key=row.__getitem__)
            chain.append(int(lat.tokens[bi, di, parent]))
        out.append(chain)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@torch.no_grad()
def test_greedy_chain_is_a_sequential_walk(seed):
    _, _, _, lat = _lattice("selector", seed)
    assert lat.greedy_chain().tolist() == _walk(lat)


@torch.no_grad()
def test_greedy_chain_follows_the_parent():
    """Hand-made edges where the best child depends on the parent: the walk must follow its own picks."""
    tokens = torch.tensor([[[10, 11], [20, 21], [30, 31]]])
    unary = torch.zeros(1, 3, 2)
    edges = torch.tensor([[[[0.0, 1.0], [0.0, 1.0]],  # depth 0 (anchor): pick index 1 -> 11
                           [[5.0, 0.0], [0.0, 5.0]],  # parent index 1 -> child index 1 -> 21
                           [[0.0, 9.0], [9.0, 0.0]]]])  # parent index 1 -> child index 0 -> 30
    lat = Lattice(tokens=tokens, unary=unary, logp=unary, edges=edges, anchor=torch.tensor([1]))
    assert lat.greedy_chain().tolist() == [[11, 21, 30]]


@pytest.mark.parametrize("seed", [0, 1])
@torch.no_grad()
def test_greedy_chain_without_selector_is_argmax(seed):
    drafter, hidden, head, lat = _lattice("plain", seed)
    assert lat.edges is None
    logits = drafter.draft_logits(hidden[:, 1:], head, PLAN)
    assert torch.equal(lat.greedy_chain(), logits.argmax(-1))
    assert lat.tokens.shape[-1] == 5  # the caller's top_k
    assert torch.allclose(lat.edge_logp()[:, :, 0], lat.logp)


# ----- (e) lattice invariants ------------------------------------------------------------------------------

_DRAFTERS = {v: random_drafter(_drafter_cfg(v, block_size=5), seed=3) for v in ("plain", "selector",
                                                                                 "scaled-softcap")}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variant=st.sampled_from(sorted(_DRAFTERS)), seed=st.integers(0, 2**31 - 1),
       scale=st.floats(0.01, 30.0), top_k=st.integers(1, 12), batch=st.integers(1, 3),
       anchor=st.integers(0, VOCAB - 1))
@torch.no_grad()
def test_lattice_invariants(variant, seed, scale, top_k, batch, anchor):
    drafter = _DRAFTERS[variant]
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, 5, 32, generator=gen) * scale
    head = DenseWeight.of(torch.randn(VOCAB, 32, generator=gen))
    lat = drafter.lattice(hidden, head, torch.full((batch,), anchor), top_k, PLAN)
    k = 4 if drafter.selector is not None else top_k
    assert lat.tokens.shape == lat.unary.shape == lat.logp.shape == (batch, 4, k)
    assert bool((lat.unary[..., :-1] >= lat.unary[..., 1:]).all())  # best unary first
    assert bool((lat.logp <= 1e-4).all())
    assert bool(lat.logp.exp().sum(-1).le(1 + 1e-4).all())  # marginals of the top K
    logits = drafter.draft_logits(hidden[:, 1:], head, PLAN)
    assert torch.equal(lat.unary, logits.gather(-1, lat.tokens))
    assert lat.tokens.max() < VOCAB and lat.tokens.min() >= 0
    for row in lat.tokens.flatten(0, 1).tolist():
        assert len(set(row)) == len(row)  # distinct candidates
    probs = lat.edge_logp().exp()
    assert probs.shape == (batch, 4, k, k)
    if lat.edges is not None:
        torch.testing.assert_close(probs.sum(-1), torch.ones(batch, 4, k), atol=1e-5, rtol=0)
    chain = lat.greedy_chain()
    assert chain.shape == (batch, 4)
    assert bool((lat.tokens == chain[..., None]).any(-1).all())  # each pick is one of its depth's candidates
