"""Model configs read from Hugging Face `config.json` files (target and DFlash drafter)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specpilot.errors import UserError

FAMILIES = ("llama", "qwen3", "qwen3_5")  # qwen3_5: Qwen3.5's text model, a hybrid of attention and Gated DeltaNet
LAYER_TYPES = ("attention", "gdn")  # what a layer may be (models/dense.LAYERS)


@dataclass(frozen=True)
class GDNShape:
    """A Gated DeltaNet layer's shape (Qwen3.5's `linear_*` fields): key heads and value heads (a key head serves
    v_heads / k_heads value heads), their dims, and the width of the short causal conv over q, k and v."""

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    conv: int = 4

    @property
    def key_dim(self) -> int:
        return self.k_heads * self.k_dim

    @property
    def value_dim(self) -> int:
        return self.v_heads * self.v_dim

    @property
    def conv_dim(self) -> int:
        """The conv's channels: q, k and v."""
        return 2 * self.key_dim + self.value_dim


@dataclass
class DenseConfig:
    """A dense decoder of the Llama / Qwen3 family."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    family: str = "llama"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qk_norm: bool | None = None  # None: the family's (Qwen3 and Qwen3.5 normalise q and k per head)
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    layer_types: list[str] = field(default_factory=list)  # one per layer; empty: every layer is attention
    # Qwen3.5's attention: an output gate (sigmoid, per channel) and rotary on the first rotary_dim dims only
    attn_output_gate: bool = False
    rotary_dim: int = 0  # 0: the whole head
    gdn: GDNShape | None = None  # the shape of the "gdn" layers

    def __post_init__(self) -> None:
        if self.family == "qwen3" or (self.family == "qwen3_5" and self.qk_norm is None):
            self.qk_norm = True  # Qwen3 always normalises q and k per head; a Qwen3.5-style hybrid may not
        self.qk_norm = bool(self.qk_norm)

    @property
    def kinds(self) -> list[str]:
        """Each layer's type, in order (the layers and the cache's states are built from it)."""
        return list(self.layer_types) or ["attention"] * self.num_layers

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def validate(self) -> None:
        positive = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                    "num_kv_heads", "head_dim")
        for name in positive:
            if getattr(self, name) <= 0:
                raise UserError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise UserError(f"model config: num_attention_heads ({self.num_heads}) is not a multiple "
                            f"of num_key_value_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise UserError(f"model config: head_dim must be even for RoPE, got {self.head_dim}")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise UserError(f"model config: {len(self.layer_types)} layer types for {self.num_layers} layers")
        unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if unknown:
            raise UserError(f"model config: layer type(s) {', '.join(unknown)} not supported yet "
                            f"(supported: {', '.join(LAYER_TYPES)})")
        if "gdn" in self.layer_types and self.gdn is None:
            raise UserError("model config: gdn layers need their shape (linear_num_key_heads, ...)")
        if self.gdn is not None and (min(self.gdn.k_heads, self.gdn.v_heads, self.gdn.k_dim, self.gdn.v_dim,
                                         self.gdn.conv) <= 0 or self.gdn.v_heads % self.gdn.k_heads):
            raise UserError(f"model config: bad gdn shape {self.gdn} (positive sizes; value heads a multiple of "
                            "key heads)")
        if not 0 <= self.rotary_dim <= self.head_dim or self.rotary_dim % 2:
            raise UserError(f"model config: rotary_dim must be even and in 0..{self.head_dim}, got "
                            f"{self.rotary_dim}")

    @property
    def rotated(self) -> int:
        """The head dims rotary turns."""
        return self.rotary_dim or self.head_dim

    def to_hf(self) -> dict[str, Any]:
        """The config.json a Hugging Face loader of this family would accept."""
        if self.family == "qwen3_5":
            return _qwen3_5_hf(self)
        arch = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
        eos = self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else (self.eos_token_ids or None)
        out = {
            "architectures": [arch[self.family]],
            "model_type": self.family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
        }
        if self.family == "llama":
            out["mlp_bias"] = self.mlp_bias
        return out


def _eos_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _rope(raw: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """Rope base and scaling from either the old (`rope_theta`, `rope_scaling`) or new (`rope_parameters`)
    layout of transformers configs."""
    params = raw.get("rope_parameters") or {}
    theta = float(raw.get("rope_theta", params.get("rope_theta", 10000.0)))
    scaling = raw.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ("default", "linear", "llama3"):
            raise UserError(f"model config: rope scaling type {kind!r} is not supported "
                            "(supported: default, linear, llama3)")
        if kind == "default":
            scaling = None
    return theta, scaling


def _qwen3_5_hf(cfg: DenseConfig) -> dict[str, Any]:
    """A Qwen3.5 text config.json. Two fields are ours (transformers' Qwen3.5 always gates and normalises q and k):
    `attn_output_gate` and `use_qk_norm`, written only when false (a hybrid student keeping Llama attention)."""
    names = {v: k for k, v in HF_LAYER_TYPES.items()}
    eos = cfg.eos_token_ids[0] if len(cfg.eos_token_ids) == 1 else (cfg.eos_token_ids or None)
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta, **(cfg.rope_scaling or {}),
            "partial_rotary_factor": cfg.rotated / cfg.head_dim}
    s = cfg.gdn
    out = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "vocab_size": cfg.vocab_size,
           "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
           "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
           "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
           "rms_norm_eps": cfg.rms_norm_eps, "rope_parameters": rope, "partial_rotary_factor": rope[
               "partial_rotary_factor"], "max_position_embeddings": cfg.max_position_embeddings,
           "tie_word_embeddings": cfg.tie_word_embeddings, "attention_bias": cfg.attention_bias,
           "bos_token_id": cfg.bos_token_id, "eos_token_id": eos, "layer_types": [names[k] for k in cfg.kinds]}
    if s is not None:
        out.update(linear_num_key_heads=s.k_heads, linear_num_value_heads=s.v_heads, linear_key_head_dim=s.k_dim,
                   linear_value_head_dim=s.v_dim, linear_conv_kernel_dim=s.conv)
    if not cfg.attn_output_gate:
        out["attn_output_gate"] = False
    if not cfg.qk_norm:
        out["use_qk_norm"] = False
    return out


HF_LAYER_TYPES = {"full_attention": "attention", "linear_attention": "gdn"}  # Qwen3.5's names -> ours


def _qwen3_5(raw: dict[str, Any]) -> dict[str, Any]:
    """Qwen3.5's text model as the fields read below: its layer types, gated attention, partial rotary (its
    M-RoPE is plain RoPE for text, whose three position rows are equal) and Gated DeltaNet shape."""
    if raw.get("model_type") == "qwen3_5":  # the multimodal wrapper: its text model
        raw = {**raw.get("text_config", {}), "tie_word_embeddings": raw.get("tie_word_embeddings", False)}
    params = raw.get("rope_parameters") or {}
    heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or int(raw["hidden_size"]) // heads)
    factor = float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25)))
    kinds = raw.get("layer_types") or ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                                       for i in range(int(raw["num_hidden_layers"]))]
    if set(kinds) - set(HF_LAYER_TYPES):
        raise UserError(f"model config: layer types {sorted(set(kinds) - set(HF_LAYER_TYPES))} are not supported")
    gdn = GDNShape(int(raw.get("linear_num_key_heads", 16)), int(raw.get("linear_num_value_heads", 32)),
                   int(raw.get("linear_key_head_dim", 128)), int(raw.get("linear_value_head_dim", 128)),
                   int(raw.get("linear_conv_kernel_dim", 4)))
    scaling = {k: v for k, v in params.items() if k not in ("partial_rotary_factor", "mrope_section",
                                                            "mrope_interleaved")}
    return {**raw, "model_type": "qwen3_5", "rope_parameters": scaling, "layer_types": kinds,
            "_extra": {"attn_output_gate": bool(raw.get("attn_output_gate", True)),
                       "qk_norm": bool(raw.get("use_qk_norm", True)), "rotary_dim": int(head_dim * factor), "gdn": gdn,
                       "layer_types": [HF_LAYER_TYPES[k] for k in kinds]}}


def dense_config_from_hf(raw: dict[str, Any], source: str = "config.json") -> DenseConfig:
    if raw.get("model_type") in ("qwen3_5", "qwen3_5_text"):
        try:
            raw = _qwen3_5(raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{source}: missing or invalid field {exc}") from None
    model_type = raw.get("model_type", "llama")
    if model_type not in FAMILIES:
        raise UserError(f"{source}: model_type {model_type!r} is not a supported dense target "
                        f"(supported: {', '.join(sorted(FAMILIES))})")
    if raw.get("hidden_act", "silu") != "silu":
        raise UserError(f"{source}: hidden_act {raw['hidden_act']!r} is not supported (only silu)")
    try:
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        theta, scaling = _rope(raw)
        family = model_type
        cfg = DenseConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            family=family,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=_eos_list(raw.get("eos_token_id")),
            **{"qk_norm": family in ("qwen3", "qwen3_5"), **raw.get("_extra", {})},
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{source}: missing or invalid field {exc}") from None
    cfg.validate()
    return cfg


@dataclass
class DrafterConfig:
    """A DFlash-style block drafter; field names follow DFlash checkpoints (`dflash_config`) and DeepSpec's DSpark
    ones (flat: `markov_rank`, `enable_confidence_head`, ...)."""

    layer: DenseConfig  # the drafter's own decoder shape (Qwen3-style: q/k norms)
    target_layer_ids: list[int]
    block_size: int = 16
    mask_token_id: int = 0
    num_target_layers: int = 0
    selector_rank: int = 0  # 0: no DFlash2 candidate selector
    selector_top_k: int = 16
    conv_kernel_size: int = 0  # 0: no DFlash2 grouped dynamic conv
    conv_group_size: int = 16
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    sliding_window: int | None = None
    is_causal: bool = False
    # DSpark (DeepSpec): every block slot drafts the next position (the anchor's too: block_size drafts, where
    # DFlash's slot 0 drafts nothing), a Markov head W2 W1[x_{k-1}] of this rank biases each slot's logits by the
    # token before it (0: none), and a confidence head says how likely each draft survives.
    anchor_drafts: bool = False
    markov_rank: int = 0
    confidence_head: bool = False
    confidence_with_markov: bool = True

    @property
    def rows(self) -> int:
        """The rows of its own chain: the anchor and its drafts."""
        return self.block_size + 1 if self.anchor_drafts else self.block_size

    @property
    def kind(self) -> str:
        return "dspark" if self.anchor_drafts else "dflash"

    def to_hf(self) -> dict[str, Any]:
        if self.anchor_drafts:
            return self._dspark_hf()
        out = self.layer.to_hf()
        out["architectures"] = ["DFlash2DraftModel" if self.selector_rank else "DFlashDraftModel"]
        out["model_type"] = "qwen3"
        out["num_target_layers"] = self.num_target_layers
        dflash = {
            "block_size": self.block_size,
            "mask_token_id": self.mask_token_id,
            "target_layer_ids": list(self.target_layer_ids),
        }
        if self.selector_rank:
            dflash.update(selector_rank=self.selector_rank, selector_top_k=self.selector_top_k)
        if self.conv_kernel_size:
            dflash.update(conv_kernel_size=self.conv_kernel_size, conv_group_size=self.conv_group_size)
        for name in ("input_embedding_scale", "output_multiplier"):
            if getattr(self, name) != 1.0:
                dflash[name] = getattr(self, name)
        if self.final_logit_softcapping:
            dflash["final_logit_softcapping"] = self.final_logit_softcapping
        out["dflash_config"] = dflash
        if self.sliding_window:
            out["sliding_window"] = self.sliding_window
            out["layer_types"] = ["sliding_attention"] * self.layer.num_layers
        out["is_causal"] = self.is_causal
        return out

    def _dspark_hf(self) -> dict[str, Any]:
        """DeepSpec's layout: the target's config with the drafter's fields flat beside it."""
        out = self.layer.to_hf()
        out.update(architectures=["Qwen3DSparkModel"], model_type="qwen3", num_target_layers=self.num_target_layers,
                   block_size=self.block_size, mask_token_id=self.mask_token_id,
                   target_layer_ids=list(self.target_layer_ids), tie_word_embeddings=False,
                   layer_types=["full_attention"] * self.layer.num_layers, num_anchors=512,
                   enable_confidence_head=self.confidence_head, markov_rank=self.markov_rank)
        if self.confidence_head:
            out["confidence_head_with_markov"] = self.confidence_with_markov
        if self.markov_rank:
            out["markov_head_type"] = "vanilla"
        return out


def drafter_config_from_hf(raw: dict[str, Any], source: str = "config.json") -> DrafterConfig:
    if any("Eagle3" in str(a) for a in raw.get("architectures") or []):
        raise UserError(f"{source}: an EAGLE-3 drafter, not a DFlash-style one (a deployment loads it as what it is: "
                        "runtime/pair.py)")
    dflash = raw.get("dflash_config") or {}

    def get(name: str, default: Any = None) -> Any:
        return dflash.get(name, raw.get(name, default))

    layer = dense_config_from_hf({**raw, "model_type": "qwen3"}, source)
    ids = get("target_layer_ids")
    if not ids:
        raise UserError(f"{source}: a DFlash drafter config needs dflash_config.target_layer_ids")
    if get("mask_token_id") is None:
        raise UserError(f"{source}: a DFlash drafter config needs dflash_config.mask_token_id")
    layer_types = raw.get("layer_types") or []
    sliding = "sliding_attention" in layer_types
    causal = raw.get("is_causal")
    softcap = get("final_logit_softcapping")
    dspark = any("DSpark" in str(a) for a in raw.get("architectures") or [])
    rank = int(raw.get("markov_rank", 0) or 0) if dspark else 0
    if rank and raw.get("markov_head_type", "vanilla") != "vanilla":
        raise UserError(f"{source}: markov_head_type {raw.get('markov_head_type')!r} is not supported (only "
                        "'vanilla', the one DeepSpec's released drafters use)")
    cfg = DrafterConfig(
        layer=layer,
        target_layer_ids=[int(i) for i in ids],
        block_size=int(get("block_size", 16)),
        mask_token_id=int(get("mask_token_id")),
        num_target_layers=int(raw.get("num_target_layers", 0)),
        selector_rank=int(get("selector_rank", 0) or 0),
        selector_top_k=int(get("selector_top_k", 16) or 16),
        conv_kernel_size=int(get("conv_kernel_size", 0) or 0),
        conv_group_size=int(get("conv_group_size", 16) or 16),
        input_embedding_scale=float(get("input_embedding_scale", 1.0)),
        output_multiplier=float(get("output_multiplier", 1.0)),
        final_logit_softcapping=float(softcap) if softcap else None,
        sliding_window=int(raw["sliding_window"]) if sliding and raw.get("sliding_window") else None,
        # DFlash: full-attention draft layers see the whole block; sliding ones are causal unless told.
        is_causal=bool(causal) if causal is not None else sliding,
        anchor_drafts=dspark,
        markov_rank=rank,
        confidence_head=bool(raw.get("enable_confidence_head", False)) and dspark,
        confidence_with_markov=bool(raw.get("confidence_head_with_markov", True)),
    )
    if cfg.block_size < (1 if dspark else 2):
        raise UserError(f"{source}: block_size must be at least {1 if dspark else 2}, got {cfg.block_size}")
    return cfg


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"missing checkpoint file: {path}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"corrupt JSON in {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"corrupt config {path}: expected a JSON object")
    return data
