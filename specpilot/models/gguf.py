"""GGUF checkpoints (llama.cpp) -> Hugging Face layout folders that `load_target` reads.

Supports the `llama` and `qwen3` GGUF architectures. Every tensor is dequantized to float32 with the
`gguf` package (imported lazily: the engine never needs it). Two llama.cpp conventions are undone:

* shapes: GGUF lists dimensions fastest-first (ne0 = columns), so a [rows, cols] matrix is stored with
  shape [cols, rows]; the dequantized data is reshaped to the reversed shape;
* RoPE layout: for `llama`, llama.cpp's converter reorders the rows of q and k within each head from
  Hugging Face's "two halves" layout to interleaved pairs (its RoPE rotates adjacent elements); the rows
  are put back here. Qwen3 uses the half layout in llama.cpp too, so its tensors are stored as they are.

Llama 3.x rope scaling is stored by llama.cpp as a `rope_freqs` tensor (per-frequency divisors), not as
metadata; `read_gguf_config` recovers the equivalent `llama3` rope scaling and checks it reproduces it.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specpilot.errors import UserError
from specpilot.models.config import DenseConfig

ARCHITECTURES = ("llama", "qwen3")
QUANT_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
               "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")
Progress = Callable[[str], None] | None

# GGUF tensor name -> Hugging Face name (per layer: blk.N.<key> -> model.layers.N.<value>).
_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
          "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_ROPE_FREQS = "rope_freqs.weight"  # llama3 rope factors: read into the config, not a weight


def hf_tensor_name(name: str) -> str:
    """The Hugging Face name of a GGUF tensor name (e.g. blk.3.attn_q.weight -> ...q_proj.weight)."""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    if m and m.group(2) in _LAYER:
        return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}.{m.group(3)}"
    m = re.fullmatch(r"(\w+)\.(weight|bias)", name)
    if m and m.group(1) in _GLOBAL:
        return f"{_GLOBAL[m.group(1)]}.{m.group(2)}"
    raise UserError(f"GGUF tensor {name!r} has no Hugging Face counterpart in a llama/qwen3 model")


# ---------------------------------------------------------------------------------------------- reading


def _open(path: str | Path):
    """A GGUFReader over `path`, after checking the file exists and is a GGUF of a supported family."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"GGUF file not found: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise UserError(f"{path} is not a GGUF file (magic {magic!r}, expected b'GGUF')")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # the reader raises assorted errors on a truncated or malformed file
        raise UserError(f"corrupt GGUF file {path}: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    arch = _meta(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise UserError(f"{path}: GGUF architecture {arch!r} is not supported "
                        f"(supported: {', '.join(ARCHITECTURES)})")
    return reader


def _meta(reader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    return value.decode() if isinstance(value, bytes) else value


def _f32(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(value)))


def _required(reader, key: str) -> Any:
    value = _meta(reader, key)
    if value is None:
        raise UserError(f"GGUF metadata lacks {key!r}")
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise UserError(f"GGUF metadata {key!r} varies per layer ({value[:4]}...), which is not supported")
        value = value[0]
    return value


def _tensors(reader) -> dict[str, Any]:
    return {t.name: t for t in reader.tensors}


def _array(t) -> np.ndarray:
    """One tensor dequantized to float32, in numpy (row-major, slowest dimension first) shape."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    kind = GGMLQuantizationType(t.tensor_type)
    if kind.name not in QUANT_TYPES:
        raise UserError(f"GGUF tensor {t.name!r} has quantization type {kind.name}, which is not supported "
                        f"(supported: {', '.join(QUANT_TYPES)})")
    data = dequantize(t.data, kind)
    return np.array(data, dtype=np.float32).reshape(tuple(int(d) for d in reversed(t.shape.tolist())))


# ----------------------------------------------------------------------------------------------- config


def _dense_config(reader) -> DenseConfig:
    arch = _meta(reader, "general.architecture")
    tensors = _tensors(reader)
    if "token_embd.weight" not in tensors:
        raise UserError("GGUF file lacks tensor 'token_embd.weight'")
    hidden = int(_required(reader, f"{arch}.embedding_length"))
    heads = int(_required(reader, f"{arch}.attention.head_count"))
    has_kv = _meta(reader, f"{arch}.attention.head_count_kv") is not None
    head_dim = int(_meta(reader, f"{arch}.attention.key_length") or hidden // heads)
    rot = _meta(reader, f"{arch}.rope.dimension_count")
    if rot is not None and int(rot) != head_dim:
        raise UserError(f"GGUF rope.dimension_count {rot} differs from head_dim {head_dim} (partial rotary "
                        "embeddings are not supported)")
    theta = _f32(_meta(reader, f"{arch}.rope.freq_base", 10000.0))
    cfg = DenseConfig(
        vocab_size=int(tensors["token_embd.weight"].shape[1]),  # GGUF shape [hidden, vocab]
        hidden_size=hidden,
        intermediate_size=int(_required(reader, f"{arch}.feed_forward_length")),
        num_layers=int(_required(reader, f"{arch}.block_count")),
        num_heads=heads,
        num_kv_heads=int(_required(reader, f"{arch}.attention.head_count_kv")) if has_kv else heads,
        head_dim=head_dim,
        family=arch,
        rms_norm_eps=_f32(_required(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_theta=theta,
        rope_scaling=_rope_scaling(reader, arch, head_dim, theta),
        max_position_embeddings=int(_required(reader, f"{arch}.context_length")),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        mlp_bias="blk.0.ffn_gate.bias" in tensors,
        bos_token_id=_meta(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=_eos_ids(reader),
    )
    cfg.validate()
    return cfg


def _eos_ids(reader) -> list[int]:
    ids = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        value = _meta(reader, key)
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    return ids


def _rope_scaling(reader, arch: str, head_dim: int, theta: float) -> dict[str, Any] | None:
    kind = _meta(reader, f"{arch}.rope.scaling.type", "none")
    factor = _meta(reader, f"{arch}.rope.scaling.factor")
    old_ctx = _meta(reader, f"{arch}.rope.scaling.original_context_length")
    freqs = _tensors(reader).get(_ROPE_FREQS)
    if kind == "linear" and factor and float(factor) != 1.0:
        return {"rope_type": "linear", "factor": _f32(factor)}
    if kind not in ("none", "linear", "llama3"):
        raise UserError(f"GGUF rope scaling type {kind!r} is not supported (supported: none, linear, llama3)")
    if freqs is None:
        if kind == "llama3":
            raise UserError(f"GGUF rope scaling is llama3 but the file lacks the {_ROPE_FREQS!r} tensor")
        return None
    return _llama3_from_freqs(_array(freqs).astype(np.float64), head_dim, theta, int(old_ctx or 8192))


def _llama3_from_freqs(freqs: np.ndarray, head_dim: int, theta: float, old_ctx: int) -> dict[str, Any] | None:
    """The `llama3` rope scaling whose per-frequency divisors are `freqs` (llama.cpp's rope_freqs tensor).

    llama3 keeps high frequencies (divisor 1), divides low ones by `factor`, and in between blends with a
    weight linear in old_ctx / wavelength; the blend points give that line, hence low/high_freq_factor.
    """
    from specpilot.models.layers import rope_inv_freq

    if freqs.shape != (head_dim // 2,):
        raise UserError(f"GGUF tensor {_ROPE_FREQS!r} has shape {freqs.shape}, expected ({head_dim // 2},)")
    factor = float(freqs.max())
    if abs(factor - 1.0) < 1e-6:
        return None
    inv = theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    x = old_ctx * inv / (2 * math.pi)  # old_ctx / wavelength
    mid = (freqs > 1 + 1e-4) & (freqs < factor * (1 - 1e-4))
    if mid.sum() < 2:
        raise UserError(f"cannot recover llama3 rope scaling from GGUF tensor {_ROPE_FREQS!r}: fewer than two "
                        "blended frequencies")
    smooth = (1 / freqs[mid] - 1 / factor) / (1 - 1 / factor)
    slope, intercept = np.polyfit(x[mid], smooth, 1)
    low = -intercept / slope
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": float(low),
               "high_freq_factor": float(low + 1 / slope), "original_max_position_embeddings": old_ctx}
    want = torch.from_numpy(inv / freqs)
    got = rope_inv_freq(head_dim, theta, scaling).double()
    if not torch.allclose(got, want, rtol=1e-4, atol=0):
        raise UserError(f"GGUF tensor {_ROPE_FREQS!r} does not follow llama3 rope scaling")
    return scaling


def read_gguf_config(path: str | Path) -> dict[str, Any]:
    """The Hugging Face config.json dict of a llama / qwen3 GGUF file."""
    return _dense_config(_open(path)).to_hf()


# ---------------------------------------------------------------------------------------------- weights


def _expected_shapes(cfg: DenseConfig) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> Hugging Face (row-major) shape, for every tensor the config implies."""
    h, f, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_dim, cfg.kv_dim
    out = {"token_embd.weight": (cfg.vocab_size, h), "output_norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = (cfg.vocab_size, h)
    layer = {"attn_q": (q, h), "attn_k": (kv, h), "attn_v": (kv, h), "attn_output": (h, q),
             "ffn_gate": (f, h), "ffn_up": (f, h), "ffn_down": (h, f), "attn_norm": (h,), "ffn_norm": (h,)}
    if cfg.qk_norm:
        layer.update(attn_q_norm=(cfg.head_dim,), attn_k_norm=(cfg.head_dim,))
    biases = {}
    if cfg.attention_bias:
        biases.update({k: layer[k][:1] for k in ("attn_q", "attn_k", "attn_v", "attn_output")})
    if cfg.mlp_bias:
        biases.update({k: layer[k][:1] for k in ("ffn_gate", "ffn_up", "ffn_down")})
    for i in range(cfg.num_layers):
        out.update({f"blk.{i}.{k}.weight": s for k, s in layer.items()})
        out.update({f"blk.{i}.{k}.bias": s for k, s in biases.items()})
    return out


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order: per head, rows (i, pair) -> (pair, i), i.e. interleaved -> halves."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _state_dict(reader, cfg: DenseConfig, progress: Progress = None) -> dict[str, torch.Tensor]:
    tensors = _tensors(reader)
    expected = _expected_shapes(cfg)
    extra = sorted(set(tensors) - set(expected) - {_ROPE_FREQS})
    if extra:
        raise UserError(f"GGUF tensor {extra[0]!r} is not expected for this {cfg.family} config "
                        f"({len(extra)} unexpected tensors)")
    state = {}
    for n, (name, shape) in enumerate(expected.items()):
        if name not in tensors:
            raise UserError(f"GGUF file lacks tensor {name!r}")
        w = torch.from_numpy(_array(tensors[name]))
        if tuple(w.shape) != shape:
            raise UserError(f"GGUF tensor {name!r} has shape {tuple(w.shape)}, config implies {shape}")
        if cfg.family == "llama" and re.search(r"\.attn_[qk]\.", name):
            w = _unpermute(w, cfg.num_heads if ".attn_q." in name else cfg.num_kv_heads)
        state[hf_tensor_name(name)] = w.contiguous()
        if progress and (n + 1) % 50 == 0:
            progress(f"dequantized {n + 1}/{len(expected)} tensors")
    return state


def gguf_state_dict(path: str | Path, progress: Progress = None) -> dict[str, torch.Tensor]:
    """Every weight of a llama / qwen3 GGUF file as float32, under Hugging Face names and layout."""
    reader = _open(path)
    return _state_dict(reader, _dense_config(reader), progress)


# -------------------------------------------------------------------------------------------- tokenizer


_SPECIALS = (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unknown_token_id"),
             ("pad_token", "padding_token_id"))


def _token(reader, index: int) -> str:
    value = reader.fields["tokenizer.ggml.tokens"].contents(index)
    return value.decode() if isinstance(value, bytes) else value


def _save_tokenizer(path: Path, reader, out_dir: Path) -> None:
    from transformers import AutoTokenizer

    if "tokenizer.ggml.tokens" not in reader.fields:
        raise UserError(f"{path}: the GGUF file has no tokenizer (tokenizer.ggml.tokens)")
    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: transformers cannot build the tokenizer: {str(exc).splitlines()[0]}") from None
    count = len(reader.fields["tokenizer.ggml.tokens"].data)
    for attr, key in _SPECIALS:
        index = _meta(reader, f"tokenizer.ggml.{key}")
        if index is not None and 0 <= int(index) < count:
            setattr(tok, attr, _token(reader, int(index)))
    tok.clean_up_tokenization_spaces = False  # BPE: keep decode exact
    if not getattr(tok, "chat_template", None):
        tok.chat_template = _meta(reader, "tokenizer.chat_template")
    if not tok.chat_template:
        raise UserError(f"{path}: the GGUF file has no chat template (tokenizer.chat_template)")
    tok.save_pretrained(str(out_dir))


# ------------------------------------------------------------------------------------------- conversion


def convert_gguf(path: str | Path, out_dir: str | Path, progress: Progress = None,
                 with_tokenizer: bool = True) -> Path:
    """Write a Hugging Face folder (config.json, float32 model.safetensors, tokenizer files with a chat
    template) for a llama / qwen3 GGUF file. Built in `<out_dir>.partial` and renamed into place: a failure
    leaves nothing new at `out_dir` (an older folder there is replaced only on success)."""
    from safetensors.torch import save_file

    path, out_dir = Path(path), Path(out_dir)
    say = progress or (lambda _msg: None)
    reader = _open(path)
    cfg = _dense_config(reader)
    say(f"reading {path.name}: {cfg.family}, {cfg.num_layers} layers, hidden {cfg.hidden_size}")
    state = _state_dict(reader, cfg, progress)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        (tmp / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2) + "\n")
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "model.safetensors").chmod(0o644)  # safetensors creates it owner-only
        del state
        if with_tokenizer:
            say("building the tokenizer")
            _save_tokenizer(path, reader, tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"wrote {out_dir}")
    return out_dir
