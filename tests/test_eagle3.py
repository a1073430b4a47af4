"""EAGLE-3's drafter (issue 60): the released config and checkpoint layout round-trip and load from a synthetic
checkpoint in the released key names, and a deployment serves one; its decoder layer against a plain
re-implementation of EAGLE-3's layer; the draft vocabulary's map into the target's; its drafted tree's greedy walk
against EAGLE-3's own sequential greedy draft; every builder over it gives AR's tokens, single and batched, greedy
and sampled; replay of its recorded trees commits what the live run did."""

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


def test_a_deployment_serves_a_checkpoint_in_the_released_layout(tmp_path: Path):
    """A deployment naming an EAGLE-3 folder loads it as EAGLE-3 (the DFlash loader refuses it by name); its stock
    output is AR's."""
    from specpilot.config import parse_system
    from specpilot.deployment import load_deployment
    from specpilot.models.loading import load_drafter
    from specpilot.runtime.engine import Engine
    from specpilot.runtime.pair import build_pair

    dep = load_deployment("tiny-eagle3")
    target, drafter, tok = build_pair(dep)
    save_eagle3(drafter, tmp_path / "e3")
    with pytest.raises(UserError, match="not a DFlash-style one"):
        load_drafter(tmp_path / "e3")
    (tmp_path / "d.toml").write_text((Path(dep.source).read_text().replace('name = "tiny-eagle3"', 'name = "mine"')
                                      .split("[drafter]")[0]) + f'[drafter]\npath = "{tmp_path / "e3"}"\n')
    mine = load_deployment(path=tmp_path / "d.toml")
    target2, loaded, _ = build_pair(mine)
    assert loaded.cfg == drafter.cfg
    prompt = tok.encode("an eagle")
    ar = Engine(target2, None, parse_system("ar"), context=mine.context).generate_one(prompt, 24, ()).tokens
    stock = Engine(target2, loaded, parse_system("stock"), context=mine.context)
    assert stock.generate_one(prompt, 24, ()).tokens == ar


# ----- drafting ---------------------------------------------------------------------------------------------

VOCAB = 10  # few tokens: random drafts are accepted now and then, so paths of every length occur
CONTEXT = 96
SYSTEMS = ["stock", "stock:block_size=3", "stock:tree=best_first,nodes=10", "stock:tree=ddtree,nodes=8",
           "stock:tree=eagle2,nodes=10,tree_k=4", "stock:tree=sequoia,nodes=8", "stock:nodes=7,batch_budget=8",
           "stock:batch_rows=auto", "stock:tree=best_first,nodes=10,admit=true"]
SLOW = ("stock:block_size=3", "stock:tree=ddtree,nodes=8", "stock:tree=sequoia,nodes=8")  # 2 s each: make test-slow
CASES = [pytest.param(system, sampled, marks=[pytest.mark.slow] if sampled and system != "stock" or system in SLOW
                      else []) for system in SYSTEMS for sampled in (False, True)]


@pytest.fixture(scope="module")
def pair():
    from specpilot.fixtures.random_models import random_target

    cfg = tiny_target_config(vocab=VOCAB, num_layers=5, max_position_embeddings=256, num_kv_heads=4)
    return random_target(cfg, seed=11), random_eagle3(cfg, draft_vocab=8, seed=3, taps=(0, 2, 3))


@torch.no_grad()
def test_the_lattices_greedy_walk_is_eagle3s_own_greedy_draft(pair):
    """A plain re-implementation: rows (fc(features at t), embedding of the token at t + 1) for the prompt and the
    anchor, causally, then each draft row reading the previous row's output and its own pick; its greedy picks are
    the lattice's greedy chain, and each depth's candidates include the children of the greedy node."""
    from specpilot.models.teacher import target_features
    from specpilot.speculative.eagle3 import Eagle3

    target, model = pair
    prompt, anchor = [3, 1, 4, 1, 5, 9, 2, 6, 5], 7
    feats = target_features(target, [prompt], model.cfg.taps)  # [1, P, 3H]
    draft = Eagle3(model, target.embed, CONTEXT, 0, PLAN, depth=5)
    draft.prefill(feats, 0, 0, torch.tensor([prompt]))
    p = len(prompt)
    lattice = draft.lattice(torch.tensor([anchor]), torch.tensor([p]))

    lc = model.cfg.layer
    cache = Cache.build(["attention"], 1, 64, lc.num_kv_heads, lc.head_dim, torch.float32, "cpu")
    h = model.fuse(feats, PLAN)
    nexts = torch.tensor([prompt[1:] + [anchor]])
    pos = torch.arange(p)[None]
    out = model(target.embed.rows(nexts), h, pos, cache[0], pos, Visibility(torch.tensor([0]), torch.tensor([0])),
                PLAN)[:, -1:]
    picks = []
    for i in range(5):
        ids = model.logits(out[:, -1], PLAN).argmax(-1)
        picks.append(int(model.target_ids(ids)))
        at = torch.tensor([[p + i]])
        out = model(target.embed.rows(torch.tensor([[picks[-1]]])), out[:, -1:], at, cache[0], at,
                    Visibility(torch.tensor([p + i]), torch.tensor([p + i])), PLAN)
    assert lattice.greedy_chain()[0].tolist() == picks
    assert lattice.exact and lattice.tokens.shape == (1, 5, 8)  # two nodes a depth expanded into four children


@pytest.mark.parametrize("system, sampled", CASES)
def test_every_builder_over_eagle3_gives_ar_tokens_single_and_batched(pair, system, sampled):
    from tests.conftest import assert_ar_tokens_alone_and_batched

    target, model = pair  # sampled at 0.5: the random drafter's guesses then land now and then
    assert_ar_tokens_alone_and_batched(target, model, system, SYSTEMS.index(system) + 7 * sampled, sampled, VOCAB,
                                       CONTEXT, temperature=0.5)


@pytest.mark.parametrize("system", ["stock", "stock:tree=best_first,nodes=10", "stock:tree=eagle2,nodes=10,tree_k=4"])
@torch.no_grad()
def test_replay_of_recorded_eagle3_trees_commits_what_the_live_run_did(pair, system, tmp_path: Path):
    """The recording keeps the lattices' exact edges (through its files), so replay commits at each step what the
    engine committed: the loop's predictions for an EAGLE-3 drafter stand on its own trees."""
    from specpilot.config import parse_system
    from specpilot.replay.record import Recorder, load, save
    from specpilot.replay.walk import committed
    from specpilot.runtime.engine import Engine
    from specpilot.speculative.tree import TreeBuilder

    target, model = pair
    engine = Engine(target, model, parse_system(system), context=CONTEXT)
    engine.recorder = recorder = Recorder()
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    gen = engine.generate_one(prompt, 40, ())
    recorder.finish("r", "test", prompt, gen.tokens, gen.accepted)
    save(tmp_path, recorder.turns, {})
    turns, _ = load(tmp_path)
    assert turns[0].exact
    builder = engine.builder or TreeBuilder("chain", engine.block, engine.block - 1, engine.width)
    assert committed(turns[0], builder).tolist() == gen.accepted


@pytest.mark.slow  # a loop round on two cores: about 90 s
def test_the_loop_measures_an_eagle3_deployment_whose_stock_is_its_release_tree(tmp_path):
    """The ceiling and the survey read the builder the engine runs (stock's eagle2 tree of 61 rows), not the option's
    name (chain): the start is predicted, and the round runs to its sealed final."""
    import json

    from tests.test_cli import specpilot

    out = specpilot("loop", "--preset", "tiny-eagle3", "--rounds", "1", "--budget", "200", "--run-dir", tmp_path / "r")
    assert out.returncode == 0, out.stderr
    summary = json.loads((tmp_path / "r" / "loop.json").read_text())
    first = summary["rounds"][0]
    assert "speedup" in first["search"]["start"], first["search"]["start"]
    assert first["ceiling"]["system"] == "stock" and first["sealed"]["result"] == first["result"]
