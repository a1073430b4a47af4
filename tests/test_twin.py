"""The twin: a function-preserving widening of a target and its drafter."""

import pytest
import torch

from specpilot.core.contracts import Forward
from specpilot.fixtures.random_models import random_drafter, random_target, tiny_drafter_config, tiny_target_config
from specpilot.models.dense import Mode
from specpilot.models.twin import widen_drafter, widen_target
from specpilot.runtime.engine import Engine
from tests.conftest import RecordingEngine, prompts

CASES = {
    "llama-untied": dict(family="llama"),
    "llama-tied": dict(family="llama", tie_word_embeddings=True),
    "qwen3-bias": dict(family="qwen3", attention_bias=True),
}


def logits(model, tokens):
    cache = model.new_cache(1, tokens.shape[1])
    positions = torch.arange(tokens.shape[1])[None]
    out, _ = model(tokens, Forward.consecutive(positions), cache, Mode.PREFILL)
    return out


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("r", [2, 3, 4])
def test_widened_target_keeps_its_logits(case, r):
    small = random_target(tiny_target_config(vocab=200, **CASES[case]), seed=7)
    twin = widen_target(small, r)
    assert twin.cfg.hidden_size == r * small.cfg.hidden_size and twin.cfg.num_kv_heads == r * small.cfg.num_kv_heads
    assert sum(p.numel() for p in twin.layers.parameters()) > (r * r - 1) * sum(
        p.numel() for p in small.layers.parameters()) // 2
    tokens = torch.randint(0, 200, (1, 23), generator=torch.Generator().manual_seed(r))
    with torch.no_grad():
        assert rel(logits(twin, tokens), logits(small, tokens)) < 1e-5


def test_depth_padding_changes_nothing_measurable():
    small = random_target(tiny_target_config(vocab=200), seed=8)
    twin = widen_target(small, 2, layers=7)
    assert twin.cfg.num_layers == 7
    tokens = torch.randint(0, 200, (1, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel(logits(twin, tokens), logits(small, tokens)) < 1e-5
    with pytest.raises(ValueError):
        widen_target(small, 2, layers=2)


@pytest.mark.parametrize("extra", [dict(), dict(selector_rank=8, selector_top_k=4), dict(conv_kernel_size=2),
                                   dict(anchor_drafts=True, markov_rank=8, confidence_head=True)])  # DSpark
def test_widened_pair_drafts_and_decodes_like_the_small_pair(extra):
    """Same drafts at every step and the same output: the twin keeps the pair's acceptance."""
    cfg = tiny_target_config(vocab=200)
    small_t = random_target(cfg, seed=9)
    small_d = random_drafter(tiny_drafter_config(cfg, block_size=4, **extra), seed=10)
    r = 2
    twin_t, twin_d = widen_target(small_t, r), widen_drafter(small_d, r)
    for prompt in prompts(3, seed=5):
        prompt = [t % 200 for t in prompt]
        ea, eb = RecordingEngine(small_t, small_d, context=80), RecordingEngine(twin_t, twin_d, context=80)
        a, b = ea.generate_one(prompt, 30, (), "stock"), eb.generate_one(prompt, 30, (), "stock")
        assert a.tokens == b.tokens and a.accepted == b.accepted
        assert len(ea.drafted) == len(a.accepted) and ea.drafted == eb.drafted  # rejected drafts too


def test_widened_trained_drafter_keeps_its_drafts(trained, looping_target):
    """A trained drafter (accepted often) keeps its drafts after widening both models."""
    drafter, _, _, tc, _ = trained
    r = 2
    twin_t, twin_d = widen_target(looping_target, r), widen_drafter(drafter, r)
    accepted = []
    for prompt in prompts(3, seed=2):
        ea, eb = RecordingEngine(looping_target, drafter, context=80), RecordingEngine(twin_t, twin_d, context=80)
        a, b = ea.generate_one(prompt, 30, (), "stock"), eb.generate_one(prompt, 30, (), "stock")
        assert a.tokens == b.tokens and a.accepted == b.accepted and ea.drafted == eb.drafted
        accepted += a.accepted
    assert max(accepted) > 1


TWIN_TOML = """
name = "tiny-twin"
context = 128
tokenizer = "bytes"
[target]
seed = 0
random.vocab_size = 300
random.hidden_size = 32
random.intermediate_size = 64
random.num_layers = 2
random.num_heads = 4
random.num_kv_heads = 2
random.head_dim = 8
[drafter]
seed = 1
random = { block_size = 4, layers = 1 }
[twin]
width = 2
"""


def test_deployment_twin_section_serves_the_widened_pair(tmp_path):
    from specpilot.deployment import load_deployment
    from specpilot.runtime.pair import build_pair

    (tmp_path / "twin.toml").write_text(TWIN_TOML)
    (tmp_path / "small.toml").write_text(TWIN_TOML.replace("[twin]\nwidth = 2\n", ""))
    wide_t, wide_d, _ = build_pair(load_deployment(path=tmp_path / "twin.toml"))
    small_t, small_d, _ = build_pair(load_deployment(path=tmp_path / "small.toml"))
    assert wide_t.cfg.hidden_size == 64 and wide_d.cfg.layer.hidden_size == 64
    prompt = [5, 9, 33, 2, 71]
    ar = Engine(small_t, None, context=128).generate_one(prompt, 24, (), "ar").tokens
    es, ew = RecordingEngine(small_t, small_d, context=128), RecordingEngine(wide_t, wide_d, context=128)
    small, wide = es.generate_one(prompt, 24, (), "stock"), ew.generate_one(prompt, 24, (), "stock")
    assert wide.tokens == ar == small.tokens
    assert es.drafted and ew.drafted == es.drafted  # the widened drafter drafts what the small one does


@pytest.mark.parametrize("section, message", [
    ("[twin]\nwidth = 0\n", "width must be a positive integer"),
    ("[twin]\nwidth = 2\nlayers = 3\n", "takes width"),
    ("[twin]\nwidth = 2\ndepth = 1\n", "below the target's 2 layers"),
])
def test_deployment_twin_section_errors(tmp_path, section, message):
    from specpilot.deployment import load_deployment
    from specpilot.errors import UserError
    from specpilot.runtime.pair import build_pair

    (tmp_path / "bad.toml").write_text(TWIN_TOML.replace("[twin]\nwidth = 2\n", section))
    with pytest.raises(UserError, match=message):
        build_pair(load_deployment(path=tmp_path / "bad.toml"))


def test_twin_preset_refuses_a_cpu_without_the_memory(monkeypatch):
    import specpilot.runtime.pair as pair
    from specpilot.deployment import load_deployment
    from specpilot.errors import UserError

    dep = load_deployment("tiny", None)
    dep.twin_width = 16
    monkeypatch.setattr(pair, "_memory_bytes", lambda: 1_000_000)
    with pytest.raises(UserError, match="run it on a GPU"):
        pair.build_pair(dep)


HYBRID = "[twin]\nwidth = 2\ngdn = { layers = 3, k_heads = 2, v_heads = 4, k_dim = 8, v_dim = 8 }\n"


def test_a_hybrid_twin_puts_gdn_layers_before_each_layer_and_keeps_the_function():
    """Three GDN layers (random weights, full shape) before each widened layer, writing nothing measurable: the
    logits stay the small model's, and the drafter's taps follow their layers."""
    from specpilot.models.config import GDNShape
    from specpilot.models.gdn import GDNBlock

    cfg = tiny_target_config(vocab=200)
    small_t, small_d = random_target(cfg, seed=11), random_drafter(tiny_drafter_config(cfg, block_size=4), seed=12)
    shape = GDNShape(k_heads=2, v_heads=4, k_dim=8, v_dim=8)
    twin_t, twin_d = widen_target(small_t, 2, gdn=shape, per=3), widen_drafter(small_d, 2, per=3)
    assert twin_t.cfg.kinds == ["gdn", "gdn", "gdn", "attention"] * cfg.num_layers
    assert sum(isinstance(layer, GDNBlock) for layer in twin_t.layers) == 3 * cfg.num_layers
    mixer = twin_t.layers[0].mixer
    assert mixer.w_qkvz.weight.abs().mean() > 0.01 and mixer.wo.weight.abs().max() < 1e-9  # full cost, ~no write
    assert twin_d.cfg.target_layer_ids == [4 * i + 3 for i in small_d.cfg.target_layer_ids]
    assert twin_d.cfg.num_target_layers == twin_t.cfg.num_layers
    tokens = torch.randint(0, 200, (1, 19), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert rel(logits(twin_t, tokens), logits(small_t, tokens)) < 1e-5
    for prompt in prompts(2, seed=4):
        prompt = [t % 200 for t in prompt]
        ea, eb = RecordingEngine(small_t, small_d, context=80), RecordingEngine(twin_t, twin_d, context=80)
        for system in ("stock", "stock:tree=best_first,nodes=8"):
            a, b = ea.generate_one(prompt, 24, (), system), eb.generate_one(prompt, 24, (), system)
            assert a.tokens == b.tokens and a.accepted == b.accepted


def test_deployment_twin_gdn_serves_a_hybrid_twin(tmp_path):
    from specpilot.deployment import load_deployment
    from specpilot.runtime.pair import build_pair

    (tmp_path / "hybrid.toml").write_text(TWIN_TOML.replace("[twin]\nwidth = 2\n", HYBRID))
    dep = load_deployment(path=tmp_path / "hybrid.toml")
    assert dep.twin and dep.twin_gdn == {"layers": 3, "k_heads": 2, "v_heads": 4, "k_dim": 8, "v_dim": 8, "conv": 4}
    wide_t, wide_d, _ = build_pair(dep)
    assert wide_t.cfg.num_layers == 8 and wide_t.cfg.kinds.count("gdn") == 6
    # the taps land on the source's layers, now behind their GDN layers
    assert all(wide_t.cfg.kinds[i] == "attention" for i in wide_d.cfg.target_layer_ids)
    assert wide_d.cfg.num_target_layers == 8


@pytest.mark.parametrize("section, message", [
    ("[twin]\nwidth = 2\ngdn = { layers = 3 }\n", "gdn takes layers"),
    ("[twin]\nwidth = 2\ngdn = { layers = 3, k_heads = 3, v_heads = 4, k_dim = 8, v_dim = 8 }\n", "multiple"),
    ("[twin]\nwidth = 2\ndepth = 4\ngdn = { layers = 1, k_heads = 1, v_heads = 1, k_dim = 8, v_dim = 8 }\n",
     "depth or gdn"),
])
def test_deployment_twin_gdn_errors(tmp_path, section, message):
    from specpilot.deployment import load_deployment
    from specpilot.errors import UserError

    (tmp_path / "bad.toml").write_text(TWIN_TOML.replace("[twin]\nwidth = 2\n", section))
    with pytest.raises(UserError, match=message):
        load_deployment(path=tmp_path / "bad.toml")


# ----- EAGLE-3 --------------------------------------------------------------------------------------------------

E3_TARGET = dict(vocab=64, num_layers=5, max_position_embeddings=256)


@pytest.fixture(scope="module")
def eagle3_pair():
    from specpilot.fixtures.random_models import random_eagle3

    cfg = tiny_target_config(**E3_TARGET)
    return random_target(cfg, seed=21), random_eagle3(cfg, draft_vocab=24, seed=22, taps=(0, 2, 3))


@torch.no_grad()
def eagle3_lattice(target, model, prompt, anchor):
    """Prefill over the prompt's tap features, then one drafted tree (the naive kernel plan, as test_eagle3's)."""
    from specpilot.config import KernelPlan
    from specpilot.models.teacher import target_features
    from specpilot.speculative.eagle3 import Eagle3

    feats = target_features(target, [prompt], model.cfg.taps)
    draft = Eagle3(model, target.embed, 96, 0, KernelPlan.stock(), depth=4)
    draft.prefill(feats, 0, 0, torch.tensor([prompt]))
    return draft.lattice(torch.tensor([anchor]), torch.tensor([len(prompt)]))


def assert_same_lattice(a, b):
    assert torch.equal(a.tokens, b.tokens)
    torch.testing.assert_close(a.logp, b.logp, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(a.edges, b.edges, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("r, depth", [(2, None), (3, None), (2, 7)])
def test_a_widened_eagle3_drafter_drafts_the_same_tree(eagle3_pair, r, depth):
    """fc reads three widened taps, q/k/v the two widened halves [emb'; h']: over the widened target's embedding
    and features the drafter's draft-vocabulary log p (so its tree) is the small one's; depth padding keeps the
    taps where they were."""
    from specpilot.models.twin import widen_eagle3

    small_t, small_d = eagle3_pair
    twin_t, twin_d = widen_target(small_t, r, depth), widen_eagle3(small_d, r)
    lc = twin_d.cfg.layer
    assert (lc.hidden_size, lc.intermediate_size, lc.num_heads, lc.num_kv_heads, lc.num_layers) == (
        r * small_d.cfg.layer.hidden_size, r * small_d.cfg.layer.intermediate_size,
        r * small_d.cfg.layer.num_heads, r * small_d.cfg.layer.num_kv_heads, 1)
    assert twin_d.cfg.target_hidden == twin_t.cfg.hidden_size and twin_d.cfg.taps == small_d.cfg.taps
    assert twin_d.cfg.draft_vocab == 24 and torch.equal(twin_d.d2t, small_d.d2t)
    for seed in range(3):
        prompt = torch.randint(0, 64, (11 + seed,), generator=torch.Generator().manual_seed(seed)).tolist()
        assert_same_lattice(eagle3_lattice(twin_t, twin_d, prompt, 7), eagle3_lattice(small_t, small_d, prompt, 7))


def test_a_widened_eagle3_pair_gives_ar_tokens_and_the_small_pairs_steps():
    """Stock (the release's tree) over the widened pair: AR's tokens, and the small pair's accepted lengths (a
    vocabulary of 10 tokens, so the random drafter is right now and then)."""
    from specpilot.config import parse_system
    from specpilot.fixtures.random_models import random_eagle3
    from specpilot.models.twin import widen_eagle3

    cfg = tiny_target_config(vocab=10, num_layers=5, max_position_embeddings=256, num_kv_heads=4)
    small_t, small_d = random_target(cfg, seed=11), random_eagle3(cfg, draft_vocab=8, seed=3, taps=(0, 2, 3))
    twin_t, twin_d = widen_target(small_t, 2), widen_eagle3(small_d, 2)
    accepted = []
    for prompt in ([3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8]):
        ar = Engine(small_t, None, parse_system("ar"), context=96).generate_one(prompt, 24, ()).tokens
        a = Engine(small_t, small_d, parse_system("stock"), context=96).generate_one(prompt, 24, ())
        b = Engine(twin_t, twin_d, parse_system("stock"), context=96).generate_one(prompt, 24, ())
        assert b.tokens == ar == a.tokens and b.accepted == a.accepted
        accepted += a.accepted
    assert max(accepted) > 1


def test_a_deployment_twin_widens_an_eagle3_drafter():
    from specpilot.deployment import load_deployment
    from specpilot.models.eagle3 import Eagle3Drafter
    from specpilot.runtime.pair import build_pair

    dep = load_deployment("tiny-eagle3")
    small_t, small_d, _ = build_pair(dep)
    dep.twin_width, dep.twin_depth = 2, 8
    wide_t, wide_d, _ = build_pair(dep)
    assert isinstance(wide_d, Eagle3Drafter) and wide_t.cfg.num_layers == 8
    assert wide_d.cfg.layer.hidden_size == wide_t.cfg.hidden_size == 2 * small_t.cfg.hidden_size
    assert wide_d.cfg.taps == small_d.cfg.taps
    prompt = [5, 9, 33, 2, 71, 40]
    assert_same_lattice(eagle3_lattice(wide_t, wide_d, prompt, 3), eagle3_lattice(small_t, small_d, prompt, 3))


def test_the_twin_command_writes_an_eagle3_drafter_in_its_layout(eagle3_pair, tmp_path):
    from specpilot.cli.training import twin
    from specpilot.errors import UserError
    from specpilot.fixtures.random_models import random_eagle3
    from specpilot.models.eagle3 import load_eagle3, save_eagle3
    from specpilot.models.loading import load_target, save_target

    small_t, small_d = eagle3_pair
    save_target(small_t, tmp_path / "small")
    save_eagle3(small_d, tmp_path / "e3")
    twin(target=tmp_path / "small", out=tmp_path / "twin", width=2, drafter=tmp_path / "e3", depth=6,
         dtype="float32")
    assert sorted(p.name for p in (tmp_path / "twin").iterdir()) == ["drafter", "target"]
    wide_t = load_target(tmp_path / "twin" / "target")
    wide_d = load_eagle3(tmp_path / "twin" / "drafter")
    assert wide_t.cfg.num_layers == 6 and wide_d.cfg.target_hidden == 2 * small_t.cfg.hidden_size
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    assert_same_lattice(eagle3_lattice(wide_t, wide_d, prompt, 5), eagle3_lattice(small_t, small_d, prompt, 5))
    foreign = tiny_target_config(**{**E3_TARGET, "hidden_size": 32, "head_dim": 8})
    save_eagle3(random_eagle3(foreign, draft_vocab=24, seed=1, taps=(0, 2, 3)), tmp_path / "foreign")
    with pytest.raises(UserError, match="is not a drafter of"):
        twin(target=tmp_path / "small", out=tmp_path / "twin2", width=2, drafter=tmp_path / "foreign", depth=None,
             dtype="float32")
    assert not (tmp_path / "twin2").exists()
