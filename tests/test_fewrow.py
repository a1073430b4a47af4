"""The few-row products (kernels/fewrow): the kernel's W12 decode (its PyTorch twin, decode_pairs) against the
format on every bit pattern and on random matrices, the load-time check catching a corrupted plane or escape,
the reference's roundings, the split chosen from the shape alone, the NVRTC builds for sm_90, the engine's
weights=w12 on the CPU; on a Hopper GPU, the kernel against the reference (escapes of every kind, bias,
residual), batch invariance and determinism."""

import importlib.util
import secrets

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.config import parse_system
from specpilot.config.plan import KernelPlan
from specpilot.errors import UserError
from specpilot.fixtures.random_models import random_target, tiny_target_config
from specpilot.kernels import fewrow, nvrtc
from specpilot.results import system_record
from specpilot.runtime.engine import Engine
from specpilot.w12.attach import attach, off_kernel, projections
from specpilot.w12.format import TILE_COLS, TILE_ROWS, bits_of, encode, escape_rows, tile, untile
from specpilot.weights.dense import few_row_path

GPU = fewrow.runs()


def from_bits(bits) -> torch.Tensor:
    return torch.as_tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def fresh_seed() -> int:
    """A new seed each run (reported by the assertions that use it)."""
    return secrets.randbelow(2**31)


def weights(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Trained-like weights with every special value mixed in: zeros of both signs, subnormals, infinities,
    NaNs, outliers."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(rows, cols, generator=g) * 0.02).to(torch.bfloat16)
    specials = from_bits([0x0000, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80, 0x7FC1, 0x4480, 0xC2F0])
    idx = torch.randperm(rows * cols, generator=g)[:specials.numel()]
    w.view(-1)[idx] = specials[: idx.numel()]
    return w


def test_the_kernels_decode_gives_every_bf16_bit_pattern():
    """All 65,536 patterns: the pair decode holds each one's bits wherever it is not an escape."""
    w = from_bits(torch.randperm(65536, generator=torch.Generator().manual_seed(1))).reshape(512, 128)
    f = encode(w)
    dec = fewrow.decode_pairs(f.byte_plane, f.nibble_plane, f.base)
    escaped = torch.zeros(w.shape, dtype=torch.bool)
    escaped[escape_rows(f), f.esc_col.long()] = True
    assert (~escaped).sum() > 0.1 * w.numel()
    assert torch.equal(dec[~escaped], bits_of(w)[~escaped])
    assert fewrow.check_w12(f, w, on_device=False)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 24), words=st.integers(1, 12), seed=st.integers(0, 2**31 - 1),
       random_bits=st.booleans())
def test_the_load_check_passes_on_random_matrices(rows, words, seed, random_bits):
    g = torch.Generator().manual_seed(seed)
    cols = 8 * words
    w = (from_bits(torch.randint(0, 65536, (rows, cols), generator=g)) if random_bits
         else weights(rows, cols, seed))
    assert fewrow.check_w12(encode(w), w, on_device=False)


@pytest.mark.parametrize("damage", ["byte", "nibble", "escape_bits", "base"])
def test_the_load_check_fails_on_damage(damage):
    w = weights(16, 64, 3)
    f = encode(w)
    assert f.escapes > 0 and fewrow.check_w12(f, w, on_device=False)
    escaped = torch.zeros(w.shape, dtype=torch.bool)
    escaped[escape_rows(f), f.esc_col.long()] = True
    r, c = (int(i) for i in (~escaped).nonzero()[0])  # a weight the planes hold
    if damage == "byte":
        f.byte_plane[r, c] ^= 0x01
    elif damage == "nibble":  # column c's nibble: word c // 8, nibble (c % 8) / 2 for even columns, 4 + that for odd
        i = c % 8
        j = i // 2 + 4 * (i % 2)
        f.nibble_plane[r, 4 * (c // 8) + j // 2] ^= 1 << (4 * (j % 2))
    elif damage == "escape_bits":
        f.esc_bits[0] ^= 0x0001
    else:
        f.base[r] ^= 0x01
    assert not fewrow.check_w12(f, w, on_device=False)


def tile_address(r: int, c: int, cols: int) -> tuple[int, int, int]:
    """Where the tiled planes keep weight (r, c) (w12/format.tile's layout, written out): its byte in the byte
    plane, and its nibble's byte in the nibble plane with the nibble's shift in that byte."""
    tile_index = (r // TILE_ROWS) * -(-cols // TILE_COLS) + c // TILE_COLS
    line = tile_index * TILE_ROWS + r % TILE_ROWS
    i = c % 8
    j = i // 2 + 4 * (i % 2)  # the nibble's place in its word (w12/format's word order)
    return line * TILE_COLS + c % TILE_COLS, line * TILE_COLS // 2 + (c % TILE_COLS) // 8 * 4 + j // 2, 4 * (j % 2)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 40), words=st.integers(1, 40), seed=st.integers(0, 2**31 - 1),
       random_bits=st.booleans())
def test_the_tiled_form_is_read_as_the_kernel_addresses_it(rows, words, seed, random_bits):
    """The planes gathered at the kernel's tile addresses are the planes in rows (whole tiles and padded ones),
    and the load check passes on the tiled form, specials and all."""
    g = torch.Generator().manual_seed(seed)
    cols = 8 * words
    w = (from_bits(torch.randint(0, 65536, (rows, cols), generator=g)) if random_bits
         else weights(rows, cols, seed))
    f = encode(w)
    t = tile(f)
    byte, nibble = fewrow.kernel_planes(t)
    assert torch.equal(byte, f.byte_plane) and torch.equal(nibble, f.nibble_plane)
    assert fewrow.check_w12(t, w, on_device=False)


@pytest.mark.parametrize("plane", ["byte", "nibble"])
def test_the_load_check_reads_the_tiled_form_and_catches_its_damage(plane):
    seed = fresh_seed()
    w = weights(40, 2 * TILE_COLS, seed)
    checked = fewrow.encode_checked(w)
    t = checked.w12
    assert t.tiled and fewrow.check_w12(t, w, on_device=False)
    escaped = torch.zeros(w.shape, dtype=torch.bool)
    escaped[escape_rows(t), t.esc_col.long()] = True
    held = (~escaped).nonzero()
    r, c = (int(i) for i in held[torch.randint(len(held), (1,))][0])  # a weight the planes hold
    byte, nib, shift = tile_address(r, c, w.shape[1])
    if plane == "byte":
        t.byte_plane[byte] ^= 0x04
    else:
        t.nibble_plane[nib] ^= 1 << shift
    assert not fewrow.check_w12(t, w, on_device=False), (seed, r, c)
    assert fewrow.check_w12(untile(encode(w)), w, on_device=False)  # the planes in rows are intact


def test_a_tiling_fault_keeps_the_weight_bf16_and_says_why(monkeypatch):
    """encode_checked checks the tiled object the kernel reads, not the planes it came from: a fault in tile()
    is caught, and attach keeps those weights BF16, naming them."""
    def faulty(f):
        t = tile(f)
        t.byte_plane[TILE_COLS * TILE_ROWS:] = t.byte_plane[TILE_COLS * TILE_ROWS:].roll(1)  # tiles off by a byte
        return t

    monkeypatch.setattr(fewrow, "tile", faulty)
    w = weights(32, 2 * TILE_COLS, fresh_seed())
    with pytest.raises(fewrow.DecodeMismatch, match="tiled"):
        fewrow.encode_checked(w)
    target = random_target(tiny_target_config(hidden_size=128, head_dim=32, intermediate_size=176),
                           seed=fresh_seed(), dtype=torch.bfloat16)
    kept = attach(target)["kept_bf16"]
    tiled = {name for name, dw in projections(target) if dw.shape[1] % TILE_COLS == 0}
    assert tiled and {n for n, why in kept.items() if "(tiled) does not decode" in why} == tiled
    assert all(dw.w12 is None for name, dw in projections(target) if name in tiled)


def test_reference_rounds_the_sum_then_adds_the_residual():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    w = weights(40, 64, 5).nan_to_num(0.0, 1.0, -1.0)
    b = torch.randn(40, generator=g).to(torch.bfloat16)
    res = torch.randn(3, 40, generator=g).to(torch.bfloat16)
    want = ((x.double() @ w.double().t() + b.double()).float().to(torch.bfloat16).float() + res.float())
    got = fewrow.reference(x, fewrow.FewRowWeight.of_w12(encode(w), b), residual=res)
    assert torch.allclose(got.float(), want.to(torch.bfloat16).float(), rtol=2 ** -7, atol=1e-3)
    same = fewrow.reference(x, fewrow.FewRowWeight.bf16(w, b), residual=res)
    assert torch.equal(got, same)  # the W12 form is the same matrix


def test_layout_and_split_follow_the_shape_not_the_rows():
    assert [fewrow.m_tiles(m) for m in (1, 8, 9, 16, 17, 32, 33, 64)] == [1, 1, 2, 2, 4, 4, 8, 8]
    for n, k in ((48, 5120), (1024, 5120), (5120, 17408), (248320, 5120), (64, 128)):
        s = fewrow.split_for(n, k, 132)
        assert 1 <= s and (s == 1 or -(-k // fewrow.CHUNK) // s >= fewrow.MIN_CHUNKS)
    assert fewrow.fits(576) is None and fewrow.fits(100) is not None


@pytest.mark.skipif(importlib.util.find_spec("cuda") is None, reason="needs cuda-bindings' NVRTC")
@pytest.mark.parametrize("w12,rows,tiled", [(True, 1, False), (True, 1, True), (False, 8, False)])
def test_the_kernel_builds_for_hopper(w12, rows, tiled):
    """Tiled too: the load check decodes the tiled planes with the product's own tile addressing."""
    macros = fewrow.macros(w12, rows, *fewrow.LAYOUT[rows], tiled=tiled)
    log = nvrtc.build(fewrow.SOURCE, macros, "sm_90", verbose=True)[1]
    # (failed twice on the H200 within the whole file, passed alone there: the log says why next time)
    assert "few_row_product" in log and "w12_decode" in log, log[-2000:]


def test_weights_w12_in_the_engine_on_the_cpu():
    """The W12 forms are made and checked at engine start (a matrix the kernel cannot take stays BF16, with the
    reason), the memory held is reported (the BF16 copies stay: nothing is called saved), the path that ran is
    recorded, and the tokens are AR's (the CPU reads the checked BF16)."""
    target = random_target(tiny_target_config(intermediate_size=176), seed=0, dtype=torch.bfloat16)
    ar = Engine(target, None, parse_system("ar"), context=96)
    w12 = Engine(target, None, parse_system("ar:weights=w12"), context=96)
    report = w12.w12_report
    assert set(report["kept_bf16"]) == {f"layers.{i}.mlp.w2" for i in range(4)}
    assert all("176 columns" in why for why in report["kept_bf16"].values())
    forms = [dw for name, dw in projections(target) if name not in report["kept_bf16"]]
    assert all(dw.w12 is not None for dw in forms)
    dense = sum(2 * dw.weight.numel() for _, dw in projections(target))
    assert report["w12_bytes"] == sum(dw.w12.bytes for dw in forms) and 0 < report["w12_bytes"] < 0.8 * dense
    assert report["held_bytes"] == dense + report["w12_bytes"] and report["saved"] is None
    record = system_record(w12)
    assert record["w12"]["held_bytes"] == report["held_bytes"] and record["w12"]["saved"] is None
    assert record["kernel"] == {"path": "torch on the cpu (the dense weights; no few-row kernel there)"}
    assert "kernel" not in system_record(ar)
    assert ar.generate_one([1, 2, 3, 4], 12).tokens == w12.generate_one([1, 2, 3, 4], 12).tokens
    assert attach(target)["held_bytes"] == report["held_bytes"]  # attaching again keeps the forms made once


def test_w12_dense_drop_frees_the_layers_copies_and_keeps_the_tokens():
    """w12_dense=drop: the layers' dense copies go (the LM head, here the tied embedding, keeps its own), the
    report counts what is held against BF16, reading a dropped weight decodes its exact bits, and the tokens
    are AR's on a target that kept everything."""
    seed = fresh_seed()
    kept = random_target(tiny_target_config(intermediate_size=176), seed=seed, dtype=torch.bfloat16)
    target = random_target(tiny_target_config(intermediate_size=176), seed=seed, dtype=torch.bfloat16)
    before = {name: dw.weight.clone() for name, dw in projections(target)}
    engine = Engine(target, None, parse_system("ar:weights=w12,w12_dense=drop"), context=96)
    report = engine.w12_report
    dropped = {name for name, dw in projections(target) if dw.dense_dropped}
    assert dropped == {name for name, dw in projections(target) if dw.w12 is not None and name != "lm_head"}
    assert dropped and all("weight" not in dict(dw.named_parameters()) for name, dw in projections(target)
                           if name in dropped)
    assert report["allocated_change_bytes"] is None  # the CPU: no allocator count
    forms = sum(dw.w12.bytes for _, dw in projections(target) if dw.w12 is not None)
    dense = sum(2 * before[n].numel() for n, dw in projections(target) if n not in dropped)
    assert report["held_bytes"] == dense + forms < report["bf16_bytes"]
    assert report["saved"] == pytest.approx(1 - report["held_bytes"] / report["bf16_bytes"]) and report["saved"] > 0
    assert "dropped for" in report["dense_copy"] and "lm_head" in report["dense_copy"]
    for name in dropped:
        got = projections(target)
        dw = dict(got)[name]
        assert dw.shape == before[name].shape and torch.equal(bits_of(dw.weight), bits_of(before[name])), seed
    ar = Engine(kept, None, parse_system("ar"), context=96)
    assert ar.generate_one([1, 2, 3, 4], 12).tokens == engine.generate_one([1, 2, 3, 4], 12).tokens, seed
    assert system_record(engine)["w12"]["saved"] == report["saved"]


def test_w12_dense_drop_never_shares_a_target_with_a_system_that_reads_the_copies():
    target = random_target(tiny_target_config(), seed=fresh_seed(), dtype=torch.bfloat16)
    with pytest.raises(UserError, match="w12_dense=drop needs weights=w12"):
        Engine(target, None, parse_system("ar:w12_dense=drop"), context=64)
    ar = Engine(target, None, parse_system("ar"), context=64)
    with pytest.raises(UserError, match="system\\(s\\) ar read the BF16 copies it would free"):
        Engine(target, None, parse_system("ar:weights=w12,w12_dense=drop"), context=64)
    assert not any(dw.dense_dropped for _, dw in projections(target))  # refused before anything was freed
    del ar
    drop = Engine(target, None, parse_system("ar:weights=w12,w12_dense=drop"), context=64)  # ar is gone now
    again = Engine(target, None, parse_system("ar:weights=w12,w12_dense=drop"), context=64)  # drop with drop
    assert again.w12_report["saved"] == drop.w12_report["saved"] > 0
    for system in ("ar", "ar:weights=w12"):
        with pytest.raises(UserError, match="freed the BF16 copies it reads"):
            Engine(target, None, parse_system(system), context=64)


def test_held_bytes_count_a_float32_dense_copy_at_its_size():
    target = random_target(tiny_target_config(), seed=fresh_seed(), dtype=torch.float32)
    report = attach(target)  # float32 values BF16 does not hold: every projection keeps only its dense form
    assert report["w12_bytes"] == 0 and report["held_bytes"] == 2 * report["bf16_bytes"]
    assert all(why == "float32 values that BF16 does not hold" for why in report["kept_bf16"].values())


def test_few_row_path_says_where_the_options_run(monkeypatch):
    """The CPU path is recorded as such; on a GPU the kernel cannot run, or for a float32 model, the options
    are refused at engine build (no silent cuBLAS under a w12 or fewrow label)."""
    w12, few, plain = (KernelPlan.stock(weights="w12"), KernelPlan.stock(fewrow=True), KernelPlan.stock())
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert few_row_path(plain, gpu, torch.float32) is None
    assert few_row_path(w12, cpu, torch.float32).startswith("torch on the cpu")
    monkeypatch.setattr(fewrow, "unavailable", lambda: "the GPU's compute capability is 8.0, the kernel needs 9.0+")
    with pytest.raises(UserError, match="weights=w12 runs the few-row kernel, which cannot run here: .*8.0"):
        few_row_path(w12, gpu, torch.bfloat16)
    monkeypatch.setattr(fewrow, "unavailable", lambda: None)
    with pytest.raises(UserError, match="fewrow=true runs .* the model is float32, the kernel takes BF16"):
        few_row_path(few, gpu, torch.float32)
    with pytest.raises(UserError, match="weights=w12, fewrow=true run "):
        few_row_path(KernelPlan.stock(weights="w12", fewrow=True), gpu, torch.float16)
    with pytest.raises(UserError, match="verify=tlv runs .* the model is float32"):  # its Q pass: no silent exact
        few_row_path(plain, gpu, torch.float32, tlv=True)
    assert few_row_path(plain, cpu, torch.float32, tlv=True).startswith("torch on the cpu")
    assert few_row_path(few, gpu, torch.bfloat16).startswith("few-row kernel for 1..64 rows")
    assert few_row_path(plain, gpu, torch.bfloat16, tlv=True).startswith("few-row kernel for verify=tlv's 8-bit")


def test_off_kernel_names_each_projection_on_the_dense_path():
    target = random_target(tiny_target_config(intermediate_size=176), seed=fresh_seed(), dtype=torch.bfloat16)
    kept = attach(target)["kept_bf16"]
    w2 = {f"layers.{i}.mlp.w2" for i in range(4)}
    assert off_kernel(target, KernelPlan.stock(weights="w12"), kept) == kept and set(kept) == w2
    few = off_kernel(target, KernelPlan.stock(fewrow=True), {})
    assert set(few) == w2 and all("176 columns is not a multiple of 32" in why for why in few.values())
    wide = random_target(tiny_target_config(), seed=1, dtype=torch.float32)
    assert set(off_kernel(wide, KernelPlan.stock(fewrow=True), {}).values()) == {"float32 weights"}


# ---------------------------------------------------------------- on a Hopper GPU

@pytest.mark.skipif(not GPU, reason="needs cuda-bindings and a GPU of compute capability 9+")
@pytest.mark.parametrize("n,k", [(48, 512), (200, 576), (1024, 2048)])
def test_the_kernel_matches_the_reference_at_every_row_count(n, k):
    w = weights(n, k, n + k).cuda()
    w = w.nan_to_num(0.0, 1.0, -1.0)  # finite sums: compared with a tolerance
    b = torch.randn(n, device="cuda").to(torch.bfloat16)
    x64 = torch.randn(64, k, device="cuda").to(torch.bfloat16)
    res = torch.randn(64, n, device="cuda").to(torch.bfloat16)
    tiled = fewrow.encode_checked(w, b)
    forms = {"w12": tiled, "w12 in rows": fewrow.FewRowWeight.of_w12(untile(tiled.w12), b),
             "bf16": fewrow.FewRowWeight.bf16(w, b)}
    for name, form in forms.items():
        outs = {}
        for m in (1, 3, 16, 33, 64):
            y = fewrow.product(x64[:m], form, residual=res[:m])
            ref = fewrow.reference(x64[:m], forms["bf16"], residual=res[:m])
            torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-2, msg=f"{name} {m} rows")
            assert torch.equal(y, fewrow.product(x64[:m], form, residual=res[:m]))  # deterministic
            outs[m] = y
        assert all(torch.equal(outs[m], outs[64][:m]) for m in outs)  # batch-invariant


@pytest.mark.skipif(not GPU, reason="needs cuda-bindings and a GPU of compute capability 9+")
@pytest.mark.parametrize("layout", [(1, 1, 0), (1, 1, 2), (2, 1, 2), (1, 2, 0)])
@pytest.mark.parametrize("n,k", [(200, 1024), (72, 1088)])  # tiled; in rows, with a half chunk at the end
def test_every_layout_gives_the_same_bits(layout, n, k):
    """X read as it goes, staged in the shared ring (with one or two weight tiles a warp) or the weights two
    chunks ahead: the same products, bit for bit, at every row count and split (fragment.cu)."""
    w = weights(n, k, 5).cuda().nan_to_num(0.0, 1.0, -1.0)
    x64 = torch.randn(64, k, device="cuda").to(torch.bfloat16)
    for form in (fewrow.encode_checked(w), fewrow.FewRowWeight.bf16(w)):
        for m in (1, 2, 9, 17, 40, 64):
            for split in (1, 3):
                default = fewrow.product(x64[:m], form, split=split)
                assert torch.equal(fewrow.product(x64[:m], form, split=split, layout=layout), default), (m, split)


@pytest.mark.skipif(not GPU, reason="needs cuda-bindings and a GPU of compute capability 9+")
@pytest.mark.parametrize("n,k", [(200, 1024), (1024, 2048), (72, 1088)])
def test_w12_sums_as_bf16_does_except_for_its_escapes(n, k):
    """The W12 form decodes in registers to the BF16 matrix's own values and sums them as the BF16 form does;
    only a weight row with escapes differs, by its correction x * (true - decoded) added after the row's sum
    (fragment.cu). So an output whose weight row has no escape has the BF16 form's bits exactly, bias and
    residual included, at every row count; the escaped rows' order is for token forcing to judge."""
    w = weights(n, k, n + 7).cuda().nan_to_num(0.0, 1.0, -1.0)
    b = torch.randn(n, device="cuda").to(torch.bfloat16)
    x64 = torch.randn(64, k, device="cuda").to(torch.bfloat16)
    res = torch.randn(64, n, device="cuda").to(torch.bfloat16)
    w12, bf16 = fewrow.encode_checked(w, b), fewrow.FewRowWeight.bf16(w, b)
    clean = torch.ones(n, dtype=torch.bool)
    clean[escape_rows(untile(w12.w12)).unique()] = False
    assert clean.any() and not clean.all()  # both kinds of row are tested
    for m in (1, 2, 9, 17, 33, 64):
        got = fewrow.product(x64[:m], w12, residual=res[:m])
        assert torch.equal(got[:, clean.cuda()], fewrow.product(x64[:m], bf16, residual=res[:m])[:, clean.cuda()]), m


@pytest.mark.skipif(not GPU, reason="needs cuda-bindings and a GPU of compute capability 9+")
def test_infinities_and_nans_in_the_weights_reach_the_outputs():
    w = torch.full((32, 128), 0.01, device="cuda").to(torch.bfloat16)
    w[3, 5], w[7, 9] = float("inf"), float("nan")
    x = torch.ones(2, 128, device="cuda").to(torch.bfloat16)
    y = fewrow.product(x, fewrow.encode_checked(w)).float()
    assert torch.isinf(y[:, 3]).all() and torch.isnan(y[:, 7]).all() and torch.isfinite(y[:, 0]).all()


@pytest.mark.skipif(not GPU, reason="needs cuda-bindings and a GPU of compute capability 9+")
def test_the_8bit_view_matches_its_reference():
    w = weights(96, 256, 11).cuda().nan_to_num(0.0, 1.0, -1.0)
    x = torch.randn(5, 256, device="cuda").to(torch.bfloat16)
    form = fewrow.encode_checked(w)
    y = fewrow.product(x, form, view8=True)
    torch.testing.assert_close(y.float(), fewrow.reference(x, form, view8=True).float(), rtol=2e-2, atol=2e-2)
    exact = fewrow.reference(x, form).float()
    assert (y.float() - exact).abs().max() > 0  # it is the view, not the weights
    with pytest.raises(ValueError, match="8-bit view"):
        fewrow.product(x, fewrow.FewRowWeight.bf16(w), view8=True)


@pytest.mark.skipif(not GPU, reason="needs cuda-bindings and a GPU of compute capability 9+")
@pytest.mark.parametrize("cols", [3 * TILE_COLS, 200])  # tiled, and in rows
def test_the_gpu_decodes_a_dropped_copy_bit_for_bit(cols):
    """dense_matrix (what a dropped weight's reads return): the kernel's decode into BF16 with the escapes
    patched gives the original bits, specials and all."""
    seed = fresh_seed()
    w = weights(72, cols, seed)
    form = fewrow.encode_checked(w.cuda()).w12
    assert form.tiled == (cols % TILE_COLS == 0)
    assert torch.equal(bits_of(fewrow.dense_matrix(form).cpu()), bits_of(w)), seed


@pytest.mark.skipif(not GPU, reason="needs cuda-bindings and a GPU of compute capability 9+")
def test_the_load_check_on_the_gpu_decodes_the_tiled_planes():
    """The production decode (w12_decode, TILED) reads the tiles as the CPU twin gathers them, and a damaged
    tile fails the check."""
    seed = fresh_seed()
    w = weights(72, 3 * TILE_COLS, seed)
    t = fewrow.encode_checked(w.cuda()).w12
    twin = tile(encode(w))
    assert t.tiled and torch.equal(fewrow.decode_on_device(t).cpu(),
                                   fewrow.decode_pairs(*fewrow.kernel_planes(twin), twin.base)), seed
    escaped = torch.zeros(w.shape, dtype=torch.bool)
    escaped[escape_rows(twin), twin.esc_col.long()] = True
    r, c = (int(i) for i in (~escaped).nonzero()[-1])
    t.byte_plane[tile_address(r, c, w.shape[1])[0]] ^= 0x04
    assert not fewrow.check_w12(t, w.cuda(), on_device=True), (seed, r, c)


def test_w12_forms_that_would_not_fit_beside_the_bf16_copies_are_refused_before_any_is_made(monkeypatch):
    """On the twin (56 GB in BF16, an 80-GB H100) the forms need 42 GB more: refused with what to do, the target
    untouched; with room to spare they are made."""
    from specpilot.w12 import attach as attach_mod

    target = random_target(tiny_target_config(hidden_size=128, head_dim=32, intermediate_size=176),
                           seed=fresh_seed(), dtype=torch.bfloat16)
    weights_n = sum(dw.weight.numel() for _, dw in projections(target))
    monkeypatch.setattr(attach_mod, "_free_bytes", lambda t: int(weights_n * 1.5))  # no 10% to spare
    with pytest.raises(UserError, match="w12_dense=drop"):
        attach(target)
    assert all(dw.w12 is None for _, dw in projections(target))
    monkeypatch.setattr(attach_mod, "_free_bytes", lambda t: int(weights_n * 1.5 * 1.2))
    assert attach(target)["held_bytes"] and any(dw.w12 is not None for _, dw in projections(target))
