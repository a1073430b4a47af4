"""W12 (specpilot/w12): every BF16 bit pattern round-trips exactly (all 65,536 of them, and random matrices of
any shape through hypothesis); the base window is the fullest; the 8-bit view is within 2^-4 and never an E4M3
NaN; `specpilot w12 inspect` reports bits per weight and bit-exactness against the weights as stored (a float32
checkpoint is not bit-exact where its BF16 rounding changes a value), keeping BF16 where W12 does not pay, and
records its own command line and the checkpoint's resolved path."""

import json
import secrets

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from specpilot.cli import app
from specpilot.errors import UserError
from specpilot.w12.format import WINDOW, choose_base, decode, encode, view8
from specpilot.w12.inspect import MAX_BITS, inspect_matrix, inspect_model


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def from_bits(bits) -> torch.Tensor:
    return torch.as_tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def test_every_bf16_bit_pattern_round_trips():
    """Zeros of both signs, every subnormal, infinities, every NaN payload, every normal: one matrix of all."""
    w = from_bits(torch.arange(65536)).reshape(256, 256)
    f = encode(w)
    assert same_bits(decode(f), w)
    specials = from_bits([0x0000, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80, 0x7FC1, 0xFFFF, 0x7F7F, 0x0080])
    g = encode(specials.reshape(2, 5))
    assert same_bits(decode(g), specials.reshape(2, 5)) and g.escapes >= 4  # zeros at least escape


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
def test_random_bit_patterns_of_any_shape_round_trip(rows, cols, seed):
    g = torch.Generator().manual_seed(seed)
    w = from_bits(torch.randint(0, 65536, (rows, cols), generator=g))
    assert same_bits(decode(encode(w)), w)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 16), cols=st.integers(2, 300), scale=st.floats(1e-4, 10.0), seed=st.integers(0, 2**31))
def test_weight_like_matrices_with_planted_specials_round_trip(rows, cols, scale, seed):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(rows, cols, generator=g) * scale).to(torch.bfloat16)
    flat = w.view(-1)
    for i, v in enumerate((0.0, -0.0, 1e-40, float("inf"), float("nan"), 1e30 * scale, -1e-30)):
        flat[(i * 7919) % flat.numel()] = v
    f = encode(w)
    assert same_bits(decode(f), w)
    assert int(f.esc_ptr[-1]) == f.escapes and f.esc_ptr.shape == (rows + 1,)


def test_the_base_is_the_fullest_window_and_ties_take_the_highest():
    e = torch.tensor([[100] * 5 + [120] * 3, [100] * 4 + [130] * 4, [50] * 8, [100] * 3 + [110] * 3 + [116] * 2])
    base = choose_base(e)
    assert base[0] == 99  # the windows holding the five 100s: 86..100 up to 100..114, the highest
    assert base[1] == 129  # 4 and 4: the highest window (130 at code 1)
    assert base[2] == 49 and WINDOW == 15
    assert base[3] == 99  # 100 and 110 (six) beat 110 and 116 (five); of the windows holding six, the highest


def test_weights_pay_about_twelve_bits():
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(512, 4096, generator=g) * 0.02).to(torch.bfloat16)
    f = encode(w)
    assert f.escapes / w.numel() < 0.001 and 12.0 < f.bits_per_weight < 12.03
    assert same_bits(decode(f), w)


def test_the_8_bit_view_is_within_a_sixteenth_and_never_an_e4m3_nan():
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(64, 512, generator=g) * 0.05).to(torch.bfloat16)
    w[0, 0], w[1, 1] = 0.0, 40.0  # an escape of each kind: exact in the view too
    f = encode(w)
    code, top = (f.byte_plane.int() >> 3) & 0xF, f.byte_plane.int() & 0x7
    assert not ((code == 15) & (top == 7)).any()  # E4M3's NaN code is kept free (an escape instead)
    v, x = view8(f), w.float()
    assert v[0, 0] == 0.0 and v[1, 1] == 40.0
    nz = x != 0
    assert ((v - x).abs()[nz] / x.abs()[nz]).max() <= 2**-4


def test_a_matrix_that_does_not_pay_stays_bf16_and_says_why():
    zeros = torch.zeros(8, 64, dtype=torch.bfloat16)  # every weight an escape
    r = inspect_matrix("zeros", zeros)
    assert r["stored"] == "bf16" and r["bits_per_weight"] > MAX_BITS and "escapes 100.00%" in r["kept_because"]
    assert r["bytes"] == 2 * zeros.numel() and r["bit_exact"]


def test_inspect_model_counts_a_tied_head_once():
    emb = torch.nn.Embedding(300, 256).to(torch.bfloat16)
    with torch.no_grad():
        emb.weight.mul_(0.02)
    head = torch.nn.Linear(256, 300, bias=False).to(torch.bfloat16)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head, "norm": torch.nn.LayerNorm(256)})
    r = inspect_model(model)
    assert [t["name"] for t in r["tensors"]] == ["emb.weight"] and r["bit_exact"]
    assert r["bf16_bytes"] == 2 * 300 * 256 and r["w12_bytes"] < 0.8 * r["bf16_bytes"]


def test_the_inspect_command_writes_its_figures(tmp_path):
    out = tmp_path / "w12.json"
    result = CliRunner().invoke(app, ["w12", "inspect", "--preset", "tiny", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["bit_exact"] and 12.0 < report["bits_per_weight"] < 13.0 and report["commit"]
    assert report["deployment"] == "tiny" and report["source"].startswith("random target of tiny")
    assert all(t["bit_exact"] for t in report["tensors"]) and len(report["tensors"]) >= 10
    bad = CliRunner().invoke(app, ["w12", "inspect", "--preset", "tiny", "--deployment", "x.toml"])
    assert bad.exit_code != 0
    missing = CliRunner().invoke(app, ["w12", "inspect", str(tmp_path / "nothing")])
    assert missing.exit_code != 0


@pytest.mark.parametrize("bad", [torch.zeros(4, dtype=torch.bfloat16), torch.zeros(2, 2)])
def test_encode_refuses_what_it_cannot_store(bad):
    with pytest.raises((ValueError, TypeError)):
        encode(bad)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 300), seed=st.integers(0, 2**31 - 1))
def test_the_tiled_layout_round_trips(rows, cols, seed):
    """tile() pads to 16 x 128 and stores tile by tile; untile() gives the planes back; decode and the 8-bit view
    read either layout."""
    from specpilot.w12.format import TILE_COLS, TILE_ROWS, tile, untile

    g = torch.Generator().manual_seed(seed)
    w = from_bits(torch.randint(0, 65536, (rows, cols), generator=g))
    f = encode(w)
    t = tile(f)
    assert t.tiled and t.byte_plane.numel() == -(-rows // TILE_ROWS) * TILE_ROWS * -(-cols // TILE_COLS) * TILE_COLS
    back = untile(t)
    assert torch.equal(back.byte_plane, f.byte_plane) and torch.equal(back.nibble_plane, f.nibble_plane)
    assert same_bits(decode(t), w) and torch.equal(view8(t).nan_to_num(), view8(f).nan_to_num())


def fresh_seed() -> int:
    """A new seed each run (reported by the assertions that use it)."""
    return secrets.randbelow(2**31)


def random_floats(rows: int, cols: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=g) * 0.05).to(dtype)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 12), cols=st.integers(1, 200), seed=st.integers(0, 2**31 - 1),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.float64]), bf16_values=st.booleans())
def test_a_matrix_stored_above_bf16_is_bit_exact_only_when_its_rounding_changes_nothing(rows, cols, seed, dtype,
                                                                                          bf16_values):
    """Compared with the stored values in their own dtype: W12 holds their BF16 rounding."""
    w = random_floats(rows, cols, seed, dtype)
    if bf16_values:  # a BF16 checkpoint saved in a wider dtype: every value survives
        w = w.to(torch.bfloat16).to(dtype)
    r = inspect_matrix("w", w)
    name = str(dtype).removeprefix("torch.")
    change = int((w.to(torch.bfloat16).to(dtype) != w).sum())
    assert r["dtype"] == name and r["stored_bytes"] == w.numel() * w.element_size()
    if r["stored"] != "w12":  # did not pay: left in its own precision, nothing changes
        assert r["stored"] == name and r["bit_exact"]
        return
    assert r["bit_exact"] == (change == 0) and (change == 0 or not bf16_values)
    if change:
        why = f"{name}: W12 stores its bf16 rounding ({change:,} of {w.numel():,} weights change)"
        assert r["inexact_because"] == why


def test_a_model_with_one_float32_matrix_is_not_bit_exact():
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(128, 64, bias=False).to(torch.bfloat16),
                                 "b": torch.nn.Linear(128, 64, bias=False)})
    with torch.no_grad():
        model["a"].weight.copy_(torch.randn(64, 128, generator=g) * 0.02)
        model["b"].weight.copy_(torch.randn(64, 128, generator=g) * 0.02)
    r = inspect_model(model)
    assert not r["bit_exact"] and list(r["not_exact"]) == ["b.weight"] and r["dtypes"] == ["bf16", "float32"], seed
    assert "float32: W12 stores its bf16 rounding" in r["not_exact"]["b.weight"]
    assert r["stored_bytes"] == 64 * 128 * (2 + 4) and r["bf16_bytes"] == 2 * 2 * 64 * 128


def test_a_matrix_that_is_not_floating_point_is_refused():
    with pytest.raises(UserError, match="int8: W12 stores floating-point weights"):
        inspect_matrix("q", torch.randint(-100, 100, (4, 16), dtype=torch.int8))


def _checkpoint(folder, dtype, seed, bf16_values=False):
    from specpilot.fixtures.random_models import random_target, tiny_target_config
    from specpilot.models.loading import save_target

    target = random_target(tiny_target_config(vocab=256, hidden_size=128, intermediate_size=256, head_dim=32),
                           seed=seed, dtype=torch.bfloat16 if bf16_values else dtype)
    save_target(target.to(dtype), folder)
    return folder


def _inspect(monkeypatch, args):
    import sys

    monkeypatch.setattr(sys, "argv", ["specpilot", "w12", "inspect", *args])  # what the shell would have run
    return CliRunner().invoke(app, ["w12", "inspect", *args])


def test_inspect_judges_a_float32_checkpoint_by_its_stored_values(tmp_path, monkeypatch):
    """A float32 checkpoint is read as float32 (not rounded to BF16 first): every matrix whose rounding changes a
    value is not bit-exact, with the reason, and the command fails; the result names the real command line and
    the checkpoint's resolved path."""
    seed = fresh_seed()
    _checkpoint(tmp_path / "fp32", torch.float32, seed)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "fp32.json"
    result = _inspect(monkeypatch, ["fp32", "--json", str(out)])
    assert result.exit_code == 1, (seed, result.output)
    report = json.loads(out.read_text())
    assert report["command"] == f"specpilot w12 inspect fp32 --json {out}"
    assert report["source"] == str((tmp_path / "fp32").resolve()) and "deployment" not in report
    assert not report["bit_exact"] and report["dtypes"] == ["float32"]
    assert report["stored_bytes"] == 2 * report["bf16_bytes"]
    for t in report["tensors"]:
        assert t["dtype"] == "float32" and not t["bit_exact"], (seed, t)
        assert t["inexact_because"].startswith("float32: W12 stores its bf16 rounding (")
    assert "not bit-exact: layers.0.attn.wqkv.weight: float32: W12 stores its bf16 rounding" in result.output


@pytest.mark.parametrize("dtype,bf16_values", [(torch.bfloat16, True), (torch.float32, True)])
def test_inspect_passes_a_checkpoint_whose_stored_values_w12_holds(tmp_path, monkeypatch, dtype, bf16_values):
    """BF16 weights, stored as BF16 or widened to float32 (every value BF16): bit-exact, each at its dtype."""
    seed = fresh_seed()
    folder = _checkpoint(tmp_path / "ckpt", dtype, seed, bf16_values)
    out = tmp_path / "r.json"
    result = _inspect(monkeypatch, [str(folder), "--json", str(out)])
    assert result.exit_code == 0, (seed, result.output)
    report = json.loads(out.read_text())
    name = "bf16" if dtype == torch.bfloat16 else "float32"
    assert report["bit_exact"] and report["dtypes"] == [name] and report["source"] == str(folder.resolve())
    assert all(t["bit_exact"] and t["stored"] == "w12" for t in report["tensors"]), seed
    assert 12.0 < report["bits_per_weight"] < 13.0


def test_inspect_of_a_deployment_reads_its_checkpoint_and_names_its_path(tmp_path, monkeypatch):
    """--deployment whose target is a checkpoint: the result's source is that folder's resolved path (the
    deployment's name beside it), and its float32 weights are judged as stored."""
    seed = fresh_seed()
    _checkpoint(tmp_path / "ckpt", torch.float32, seed)
    (tmp_path / "dep.toml").write_text('name = "mine"\ndtype = "bfloat16"\ntokenizer = "bytes"\n'
                                       '[target]\npath = "ckpt"\n')
    out = tmp_path / "r.json"
    result = _inspect(monkeypatch, ["--deployment", str(tmp_path / "dep.toml"), "--json", str(out)])
    assert result.exit_code == 1, (seed, result.output)
    report = json.loads(out.read_text())
    assert report["source"] == str((tmp_path / "ckpt").resolve()) and report["deployment"] == "mine"
    assert report["command"] == f"specpilot w12 inspect --deployment {tmp_path / 'dep.toml'} --json {out}"
    assert report["dtypes"] == ["float32"] and not report["bit_exact"]
