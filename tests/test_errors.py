"""User errors: one clear line (a UserError, never a traceback from deep inside torch or safetensors)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specpilot.config import parse_system
from specpilot.errors import UserError
from specpilot.fixtures.random_models import random_drafter, random_target, tiny_drafter_config, tiny_target_config
from specpilot.models.loading import load_drafter, load_target, save_drafter, save_target
from specpilot.runtime.engine import Engine

VOCAB = 64


def _raises(fn, *needles: str) -> str:
    with pytest.raises(UserError) as info:
        fn()
    msg = str(info.value)
    assert msg and "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    cfg = tiny_target_config(vocab=VOCAB, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                             num_kv_heads=2, head_dim=8, max_position_embeddings=64)
    folder = tmp_path_factory.mktemp("ckpt") / "target"
    save_target(random_target(cfg, seed=0), folder)
    return folder


@pytest.fixture()
def copy(checkpoint, tmp_path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(checkpoint, dst)
    return dst


def _edit_tensors(folder: Path, fn) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    fn(tensors)
    save_file(tensors, str(path))


# ----- checkpoints ---------------------------------------------------------------------------------------

def test_the_fixture_loads(checkpoint):
    assert load_target(checkpoint).cfg.vocab_size == VOCAB


def test_missing_folder(tmp_path):
    _raises(lambda: load_target(tmp_path / "nowhere"), "nowhere", "not found")
    _raises(lambda: load_drafter(tmp_path / "nowhere"), "nowhere", "not found")


def test_missing_config(copy):
    (copy / "config.json").unlink()
    _raises(lambda: load_target(copy), "config.json", "missing")


@pytest.mark.parametrize("content", ["{not json", "", "\xff\xfe garbage", "[1, 2, 3]", "null"])
def test_corrupt_config(copy, content):
    (copy / "config.json").write_text(content, encoding="latin-1")
    _raises(lambda: load_target(copy), "config.json", "corrupt")


def test_config_missing_a_field(copy):
    raw = json.loads((copy / "config.json").read_text())
    del raw["hidden_size"]
    (copy / "config.json").write_text(json.dumps(raw))
    _raises(lambda: load_target(copy), "config.json", "hidden_size")


@pytest.mark.parametrize("field,value,needle", [
    ("model_type", "mistral", "mistral"),
    ("hidden_act", "gelu", "gelu"),
    ("num_key_value_heads", 3, "num_key_value_heads"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "yarn"),
    ("num_hidden_layers", 0, "num_layers"),
    ("vocab_size", "many", "'many'"),
])
def test_config_unsupported_values(copy, field, value, needle):
    raw = json.loads((copy / "config.json").read_text())
    raw[field] = value
    (copy / "config.json").write_text(json.dumps(raw))
    _raises(lambda: load_target(copy), needle)


def test_missing_safetensors(copy):
    (copy / "model.safetensors").unlink()
    _raises(lambda: load_target(copy), "safetensors", str(copy))


@pytest.mark.parametrize("cut", ["empty", "header", "half", "tail", "garbage"])
def test_corrupt_safetensors(copy, cut):
    path = copy / "model.safetensors"
    data = path.read_bytes()
    data = {"empty": b"", "header": data[:20], "half": data[: len(data) // 2], "tail": data[:-64],
            "garbage": bytes(range(256)) * 4}[cut]
    path.write_bytes(data)
    _raises(lambda: load_target(copy), "model.safetensors", "corrupt")


@pytest.mark.parametrize("name", ["model.norm.weight", "model.layers.1.self_attn.v_proj.weight",
                                  "model.layers.0.mlp.up_proj.weight", "lm_head.weight"])
def test_missing_tensor(copy, name):
    _edit_tensors(copy, lambda t: t.pop(name))
    _raises(lambda: load_target(copy), name, "missing")


@pytest.mark.parametrize("name,shape", [
    ("model.embed_tokens.weight", (VOCAB + 1, 32)),
    ("model.norm.weight", (31,)),
    ("lm_head.weight", (VOCAB, 33)),
    ("model.layers.0.self_attn.q_proj.weight", (33, 32)),  # fused q/k/v: a wrong row count
    ("model.layers.0.self_attn.k_proj.weight", (16, 33)),  # fused q/k/v: a wrong column count
    ("model.layers.1.mlp.up_proj.weight", (47, 32)),  # fused gate/up: only the second part is wrong
    ("model.layers.1.mlp.gate_proj.weight", (48,)),  # fused gate/up: wrong rank
])
def test_tensor_of_the_wrong_shape(copy, name, shape):
    def change(t):
        t[name] = torch.zeros(shape)
    _edit_tensors(copy, change)
    _raises(lambda: load_target(copy), name, "shape", str(tuple(shape)))


def test_drafter_config_errors(tmp_path):
    tcfg = tiny_target_config(vocab=VOCAB, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=8, max_position_embeddings=64)
    folder = tmp_path / "drafter"
    save_drafter(random_drafter(tiny_drafter_config(tcfg, block_size=4)), folder)
    raw = json.loads((folder / "config.json").read_text())
    for key, needle in (("target_layer_ids", "target_layer_ids"), ("mask_token_id", "mask_token_id")):
        bad = json.loads(json.dumps(raw))
        del bad["dflash_config"][key]
        (folder / "config.json").write_text(json.dumps(bad))
        _raises(lambda: load_drafter(folder), needle, "config.json")
    bad = json.loads(json.dumps(raw))
    bad["dflash_config"]["block_size"] = 1
    (folder / "config.json").write_text(json.dumps(bad))
    _raises(lambda: load_drafter(folder), "block_size")


# ----- requests ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine(checkpoint) -> Engine:
    target = load_target(checkpoint)
    drafter = random_drafter(tiny_drafter_config(target.cfg, block_size=4))
    return Engine(target, drafter, context=48)


@pytest.mark.parametrize("s", ["ar", "stock"])
def test_request_errors(engine, s):
    _raises(lambda: engine.generate_one([], 4, (), s), "empty prompt")
    for n in (0, -3):
        _raises(lambda n=n: engine.generate_one([1, 2], n, (), s), "max_new_tokens", str(n))
    _raises(lambda: engine.generate_one([1] * 40, 8, (), s), "context", "40")
    _raises(lambda: engine.generate_one([1] * 48, 1, (), s), "context")
    _raises(lambda: engine.generate_one([1, VOCAB], 4, (), s), "vocabulary", str(VOCAB - 1))
    _raises(lambda: engine.generate_one([-1, 2], 4, (), s), "vocabulary")
    # A valid request still works after the errors.
    assert len(engine.generate_one([1, 2, 3], 4, (), s).tokens) == 4


def test_stock_needs_a_drafter(engine):
    ar_only = Engine(engine.target, None, context=48)
    _raises(lambda: ar_only.generate_one([1, 2], 4, (), "stock"), "stock", "drafter")


@pytest.mark.parametrize("block_size", [1, 5, 100])
def test_engine_block_size_out_of_range(engine, block_size):
    system = parse_system(f"stock:block_size={block_size}")
    _raises(lambda: Engine(engine.target, engine.drafter, system, context=48), "block_size", str(block_size))
    _raises(lambda: Engine(engine.target, None, system, context=48), "stock", "drafter")


# ----- systems -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,needles", [
    ("eagle", ["eagle", "unknown system"]),
    ("", ["unknown system"]),
    ("stock:speed=3", ["speed", "unknown system option"]),
    ("stock:block_size=abc", ["block_size", "abc"]),
    ("stock:block_size=-2", ["block_size", "-2"]),
    ("stock:block_size=2.5", ["block_size", "2.5"]),
    ("ar:graphs=maybe", ["graphs", "maybe"]),
    ("stock:block_size", ["block_size", "value"]),
    ("stock:graphs", ["graphs", "value"]),
    ("ar:block_size=4", ["block_size", "'ar'"]),
])
def test_parse_system_errors(text, needles):
    _raises(lambda: parse_system(text), *needles)


def test_parse_system_accepts_valid_names():
    assert parse_system("ar").name == "ar"
    assert parse_system(" stock ").name == "stock"
    assert parse_system("stock:block_size=0").name == "stock"  # the default is dropped
    assert parse_system("stock:block_size=4,graphs=off").name == "stock:block_size=4,graphs=false"
    assert parse_system("stock:graphs=false, block_size=4") == parse_system("stock:block_size=4,graphs=0")
