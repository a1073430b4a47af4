"""Checkpoint folders in Hugging Face layout (config.json + safetensors) <-> our modules.

Our modules fuse q/k/v and gate/up into single weights (one GEMM each); the name map below says
which Hugging Face tensors are concatenated into each of ours, and `save_*` splits them back.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from specpilot.errors import UserError
from specpilot.models.config import (
    DenseConfig,
    DrafterConfig,
    dense_config_from_hf,
    drafter_config_from_hf,
    read_json,
)
from specpilot.models.dense import DenseTarget
from specpilot.models.dflash import DFlashDrafter
from specpilot.results import folder_atomic


def _layer_sources(hf: str, ours: str, cfg: DenseConfig) -> dict[str, list[str]]:
    att, mlp = hf + "self_attn.", hf + "mlp."
    m = {
        ours + "attn_norm": [hf + "input_layernorm.weight"],
        ours + "mlp_norm": [hf + "post_attention_layernorm.weight"],
        ours + "attn.wqkv.weight": [att + f"{p}_proj.weight" for p in "qkv"],
        ours + "attn.wo.weight": [att + "o_proj.weight"],
        ours + "mlp.w13.weight": [mlp + "gate_proj.weight", mlp + "up_proj.weight"],
        ours + "mlp.w2.weight": [mlp + "down_proj.weight"],
    }
    if cfg.qk_norm:
        m[ours + "attn.q_norm"] = [att + "q_norm.weight"]
        m[ours + "attn.k_norm"] = [att + "k_norm.weight"]
    if cfg.attention_bias:
        m[ours + "attn.wqkv.bias"] = [att + f"{p}_proj.bias" for p in "qkv"]
        m[ours + "attn.wo.bias"] = [att + "o_proj.bias"]
    if cfg.mlp_bias:
        m[ours + "mlp.w13.bias"] = [mlp + "gate_proj.bias", mlp + "up_proj.bias"]
        m[ours + "mlp.w2.bias"] = [mlp + "down_proj.bias"]
    return m


def target_sources(cfg: DenseConfig) -> dict[str, list[str]]:
    m = {"embed.weight": ["model.embed_tokens.weight"], "norm": ["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        m["lm_head"] = ["lm_head.weight"]
    for i in range(cfg.num_layers):
        m.update(_layer_sources(f"model.layers.{i}.", f"layers.{i}.", cfg))
    return m


def drafter_sources(cfg: DrafterConfig) -> dict[str, list[str]]:
    m = {"fc.weight": ["fc.weight"], "hidden_norm": ["hidden_norm.weight"], "norm": ["norm.weight"]}
    for i in range(cfg.layer.num_layers):
        m.update(_layer_sources(f"layers.{i}.", f"layers.{i}.", cfg.layer))
        if cfg.conv_kernel_size:
            for hf, ours in (("attention_conv", "attn_conv"), ("mlp_conv", "mlp_conv")):
                m[f"layers.{i}.{ours}.base_kernel"] = [f"layers.{i}.{hf}.base_kernel"]
                m[f"layers.{i}.{ours}.kernel_projection.weight"] = [f"layers.{i}.{hf}.kernel_projection.weight"]
    if cfg.selector_rank:
        for name in ("predecessor_codebook", "successor_codebook", "hidden_projection"):
            m[f"selector.{name}.weight"] = [f"candidate_selector.{name}.weight"]
    if cfg.markov_rank:  # DeepSpec's DSpark (its own embed_tokens and lm_head are frozen copies of the target's:
        # the target's own are used, never loaded twice)
        m["markov.w1.weight"] = ["markov_head.markov_w1.weight"]
        m["markov.w2.weight"] = ["markov_head.markov_w2.weight"]
    if cfg.confidence_head:
        m["confidence.proj.weight"] = ["confidence_head.proj.weight"]
        m["confidence.proj.bias"] = ["confidence_head.proj.bias"]
    return m


# Released DFlash2 checkpoints store the codebooks without the ".weight" suffix.
_ALIASES = {f"candidate_selector.{n}.weight": f"candidate_selector.{n}"
            for n in ("predecessor_codebook", "successor_codebook")}


class _Tensors:
    """Lazy reader over one folder's safetensors files (single file or sharded)."""

    def __init__(self, folder: Path):
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise UserError(f"missing checkpoint weights: no *.safetensors file in {folder}")
        self.where: dict[str, Path] = {}
        for f in files:
            try:
                with safe_open(str(f), framework="pt") as h:
                    for key in h.keys():
                        self.where[key] = f
            except (SafetensorError, OSError, ValueError) as exc:
                raise UserError(f"corrupt safetensors file {f}: {exc}") from None

    def get(self, name: str) -> torch.Tensor:
        key = name if name in self.where else _ALIASES.get(name, name)
        if key not in self.where:
            raise UserError(f"checkpoint is missing tensor {name!r} ({len(self.where)} tensors found)")
        try:
            with safe_open(str(self.where[key]), framework="pt") as h:
                return h.get_tensor(key)
        except (SafetensorError, OSError, ValueError) as exc:
            raise UserError(f"corrupt safetensors file {self.where[key]}: {exc}") from None


def _load_into(model: torch.nn.Module, sources: dict[str, list[str]], folder: Path,
               dtype: torch.dtype | None, device) -> None:
    reader = _Tensors(folder)
    expected = {k: v for k, v in model.state_dict().items()}
    state = {}
    for ours, names in sources.items():
        want = tuple(expected[ours].shape)
        # Check each source tensor before fusing: a bad part must name itself, not crash torch.cat.
        rows = _split_sizes(ours, want[0], model) if len(names) > 1 else [want[0]]
        parts = [reader.get(n) for n in names]
        for name, part, r in zip(names, parts, rows, strict=True):
            if tuple(part.shape) != (r, *want[1:]):
                raise UserError(f"{folder}: tensor {name!r} has shape {tuple(part.shape)}, "
                                f"config implies {(r, *want[1:])}")
        t = torch.cat(parts, 0) if len(parts) > 1 else parts[0]
        state[ours] = t.to(device=device, dtype=dtype or t.dtype)
    missing = set(expected) - set(state)
    if missing:
        raise UserError(f"{folder}: no source for {sorted(missing)[:3]}")
    model.load_state_dict(state, assign=True, strict=True)


def load_target(folder: str | Path, dtype: torch.dtype | None = torch.float32, device="cpu",
                rope_length: int | None = None) -> DenseTarget:
    """dtype None: each tensor as the checkpoint stores it (`w12 inspect` judges the stored bits; a fused tensor
    whose parts differ takes their common type)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"target checkpoint folder not found: {folder}")
    cfg = dense_config_from_hf(read_json(folder / "config.json"), str(folder / "config.json"))
    with torch.device("meta"):
        model = DenseTarget(cfg, rope_length=1)
    if cfg.family == "qwen3_5":
        _load_qwen3_5(model, folder, dtype, device)
    else:
        _load_into(model, target_sources(cfg), folder, dtype, device)
    model.set_rope_length(rope_length or cfg.max_position_embeddings, device=device)
    return model.eval()


def _load_qwen3_5(model: DenseTarget, folder: Path, dtype: torch.dtype | None, device) -> None:
    """A Qwen3.5 text checkpoint (its text model's tensors; a multimodal one's vision tower is not read)."""
    from specpilot.models.qwen3_5 import convert

    reader = _Tensors(folder)
    prefix = "model.language_model." if "model.language_model.embed_tokens.weight" in reader.where else "model."
    wanted = {n: reader.get(n) for n in reader.where if n.startswith(prefix) or n == "lm_head.weight"}
    try:
        state = convert(wanted, model.cfg, prefix)
    except KeyError as exc:
        raise UserError(f"{folder}: checkpoint is missing tensor {exc}") from None
    expected = model.state_dict()
    for name, t in state.items():
        if tuple(t.shape) != tuple(expected[name].shape):
            raise UserError(f"{folder}: {name} has shape {tuple(t.shape)}, config implies "
                            f"{tuple(expected[name].shape)}")
    model.load_state_dict({k: v.to(device=device, dtype=dtype or v.dtype) for k, v in state.items()}, assign=True,
                          strict=True)


def load_drafter(folder: str | Path, dtype: torch.dtype = torch.float32, device="cpu",
                 rope_length: int | None = None) -> DFlashDrafter:
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"drafter checkpoint folder not found: {folder}")
    cfg = drafter_config_from_hf(read_json(folder / "config.json"), str(folder / "config.json"))
    with torch.device("meta"):
        model = DFlashDrafter(cfg)
    _load_into(model, drafter_sources(cfg), folder, dtype, device)
    model.set_rope_length(rope_length or cfg.layer.max_position_embeddings, device=device)
    return model.eval()


def _split_state(model: torch.nn.Module, sources: dict[str, list[str]]) -> dict[str, torch.Tensor]:
    """Our fused state dict back to Hugging Face names (q/k/v and gate/up split by their sizes)."""
    out = {}
    state = model.state_dict()
    for ours, names in sources.items():
        t = state[ours].detach().cpu().contiguous()
        if len(names) == 1:
            out[names[0]] = t
            continue
        sizes = _split_sizes(ours, t.shape[0], model)
        for name, part in zip(names, t.split(sizes, 0), strict=True):
            out[name] = part.contiguous()
    return out


def _split_sizes(ours: str, rows: int, model) -> list[int]:
    cfg = model.cfg if isinstance(model, DenseTarget) else model.cfg.layer
    if ".wqkv." in ours:
        return [cfg.q_dim, cfg.kv_dim, cfg.kv_dim]
    return [rows // 2, rows // 2]


def _shards(tensors: dict[str, torch.Tensor], max_bytes: int | None) -> list[dict[str, torch.Tensor]]:
    """Greedy split into files of at most max_bytes (one tensor may exceed it alone)."""
    if not max_bytes:
        return [tensors]
    shards, size = [{}], 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    return shards


def _write_folder(folder: Path, config: dict, tensors: dict[str, torch.Tensor],
                  extra: dict[str, str | bytes] | None = None, max_shard_bytes: int | None = None) -> None:
    """Write config + weights (+ extra files: text or bytes) into a fresh folder, atomically: nothing
    half-written on failure.
    max_shard_bytes splits the weights over several files (the GPU machine returns files of <= 16 MiB)."""
    with folder_atomic(folder) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        shards = _shards(tensors, max_shard_bytes)
        for i, shard in enumerate(shards):
            name = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(tmp / name), metadata={"format": "pt"})
        for name, content in (extra or {}).items():
            if isinstance(content, bytes):
                (tmp / name).write_bytes(content)
            else:
                (tmp / name).write_text(content)


def save_target(model: DenseTarget, folder: str | Path, extra: dict[str, str | bytes] | None = None,
                max_shard_bytes: int | None = None) -> None:
    """A hybrid (family qwen3_5) is written in Qwen3.5's layout (models/qwen3_5.export), others in their own."""
    if model.cfg.family == "qwen3_5":
        from specpilot.models.qwen3_5 import export

        tensors = export({k: v.detach().cpu() for k, v in model.state_dict().items()}, model.cfg)
    else:
        tensors = _split_state(model, target_sources(model.cfg))
    _write_folder(Path(folder), model.cfg.to_hf(), tensors, extra, max_shard_bytes)


def save_drafter(model: DFlashDrafter, folder: str | Path, extra: dict[str, str | bytes] | None = None,
                 max_shard_bytes: int | None = None) -> None:
    """extra: more files for the folder (the training record, its prompts), written in the same atomic step."""
    tensors = _split_state(model, drafter_sources(model.cfg))
    _write_folder(Path(folder), model.cfg.to_hf(), tensors, extra, max_shard_bytes)
