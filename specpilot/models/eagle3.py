"""EAGLE-3's drafter (SafeAILab/EAGLE; what sglang and vLLM load as LlamaForCausalLMEagle3): its config, its weights
in the released layout, and its one decoder layer.

The layer reads [norm(embed(token)); norm(h)] (2H wide into q/k/v; the residual is h itself), where h is fc of three
target layers' hidden states (low, mid, high) for a committed position, or, while drafting, the layer's own
previous output (pre-norm). Row t pairs position t's h with the token at t + 1 and predicts the token at t + 2. Its
head is over a reduced draft vocabulary: target id = draft id + d2t[draft id]. The embedding is the target's.

Here: the config, the module, the loader and the forward; its drafting (its own cache, a tree of top-k expansions
per depth handed to the tree builders) is speculative/eagle3.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specpilot.config.plan import KernelPlan
from specpilot.core.contracts import Visibility
from specpilot.errors import UserError
from specpilot.kernels.norm import rms_norm
from specpilot.models.cache import AttentionState
from specpilot.models.config import DenseConfig, dense_config_from_hf
from specpilot.models.layers import Attention, RopeTable, SwiGLU
from specpilot.weights import DenseWeight

ARCHITECTURE = "LlamaForCausalLMEagle3"
ROPE_THETA = 10000.0  # EAGLE-3 trains at this base whatever the target's (a config's own rope_theta wins)


@dataclass
class Eagle3Config:
    layer: DenseConfig  # the decoder layer's shape (vocab_size: the target's, whose embedding it reads)
    draft_vocab: int
    target_hidden: int
    taps: tuple[int, ...]  # target layers read (low, mid, high): the output of each, as DFlash's target_layer_ids

    def to_hf(self) -> dict[str, Any]:
        out = self.layer.to_hf()
        out.update(architectures=[ARCHITECTURE], model_type="llama", num_hidden_layers=1,
                   draft_vocab_size=self.draft_vocab, tie_word_embeddings=False,
                   eagle_config={"eagle_aux_hidden_state_layer_ids": list(self.taps), "use_aux_hidden_state": True})
        if self.target_hidden != self.layer.hidden_size:
            out["target_hidden_size"] = self.target_hidden
        return out


def default_taps(target_layers: int) -> tuple[int, ...]:
    """EAGLE's own: the hidden states entering layers 2, L//2 and L-3, i.e. the outputs of layers 1, L//2-1, L-4."""
    return (1, target_layers // 2 - 1, target_layers - 4)


def eagle3_config_from_hf(raw: dict[str, Any], source: str = "config.json",
                          target_layers: int | None = None) -> Eagle3Config:
    """The released config.json. Its tap ids (eagle_config.eagle_aux_hidden_state_layer_ids) are layer outputs, as
    sglang reads them; without them EAGLE's default over `target_layers`."""
    if ARCHITECTURE not in (raw.get("architectures") or []):
        raise UserError(f"{source}: not an EAGLE-3 drafter (architectures {raw.get('architectures')})")
    if int(raw.get("num_hidden_layers", 1)) != 1:
        raise UserError(f"{source}: an EAGLE-3 drafter has one decoder layer, this config says "
                        f"{raw.get('num_hidden_layers')}")
    hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    plain = {**raw, "model_type": "llama", "num_hidden_layers": 1, "head_dim": hidden // heads,
             "rope_theta": raw.get("rope_theta") or ROPE_THETA, "rope_scaling": None}
    layer = dense_config_from_hf(plain, source)
    ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        if target_layers is None:
            raise UserError(f"{source}: no eagle_config.eagle_aux_hidden_state_layer_ids, and no target to take "
                            "EAGLE's default taps from")
        ids = default_taps(target_layers)
    if len(ids) != 3:
        raise UserError(f"{source}: an EAGLE-3 drafter reads three target layers, the config names {list(ids)}")
    return Eagle3Config(layer=layer, draft_vocab=int(raw.get("draft_vocab_size") or layer.vocab_size),
                        target_hidden=int(raw.get("target_hidden_size") or hidden), taps=tuple(int(i) for i in ids))


class Eagle3Attention(Attention):
    """Llama attention whose q/k/v read the 2H-wide [embedding; hidden] rows; o writes back H."""

    def __init__(self, cfg: DenseConfig):
        super().__init__(cfg)
        self.wqkv = DenseWeight(2 * cfg.hidden_size, cfg.q_dim + 2 * cfg.kv_dim)


class Eagle3Drafter(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.cfg = cfg
        lc, h = cfg.layer, cfg.layer.hidden_size
        self.fc = DenseWeight(len(cfg.taps) * cfg.target_hidden, h)
        self.input_norm = nn.Parameter(torch.ones(h))  # the token embedding's
        self.hidden_norm = nn.Parameter(torch.ones(h))  # the fused (or own) hidden state's
        self.attn = Eagle3Attention(lc)
        self.mlp_norm = nn.Parameter(torch.ones(h))
        self.mlp = SwiGLU(h, lc.intermediate_size, False, lc.rms_norm_eps)
        self.norm = nn.Parameter(torch.ones(h))
        self.head = DenseWeight(h, cfg.draft_vocab)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab, dtype=torch.int64))
        self.rope = RopeTable(lc, lc.max_position_embeddings)

    def set_rope_length(self, length: int, device=None) -> None:
        self.rope.resize(length, device=device)

    def fuse(self, feats: torch.Tensor, plan: KernelPlan) -> torch.Tensor:
        """The committed rows' h: fc over the three taps' hidden states [B, T, 3 Ht] -> [B, T, H]."""
        return self.fc.project(feats, plan)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, state: AttentionState,
                slots: torch.Tensor, vis: Visibility, plan: KernelPlan) -> torch.Tensor:
        """The layer over rows [B, T]: embeddings of each row's next token, h, their positions; K/V written at
        `slots`. -> the output before the final norm [B, T, H] (what a deeper draft step reads as its h)."""
        x = self._rows(embeds, hidden, plan)
        return self._mlp(hidden + self.attn(x, positions, self.rope, state, slots, vis, plan), plan)

    def _rows(self, embeds: torch.Tensor, hidden: torch.Tensor, plan: KernelPlan) -> torch.Tensor:
        """[norm(embedding); norm(h)]: the 2H-wide rows q/k/v read."""
        eps = self.cfg.layer.rms_norm_eps
        return torch.cat([rms_norm(embeds, self.input_norm, eps, plan), rms_norm(hidden, self.hidden_norm, eps, plan)],
                         -1)

    def _mlp(self, h1: torch.Tensor, plan: KernelPlan) -> torch.Tensor:
        return h1 + self.mlp(rms_norm(h1, self.mlp_norm, self.cfg.layer.rms_norm_eps, plan), plan)

    def forward_masked(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                       state: AttentionState, slots: torch.Tensor, mask: torch.Tensor, plan: KernelPlan
                       ) -> torch.Tensor:
        """The layer over rows that see what `mask` [B, T, L] allows of the cache's slots (their own K/V written at
        `slots` first): a drafted tree's rows see the context and their ancestors' rows, wherever those lie."""
        lc = self.cfg.layer
        q = self.attn._prologue(self._rows(embeds, hidden, plan), positions, self.rope, state, slots, True, plan)
        # grouped heads read their K/V in place (no copy of the whole cache per depth)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), state.k.to(q.dtype), state.v.to(q.dtype),
                                           attn_mask=mask[:, None], scale=lc.head_dim ** -0.5,
                                           enable_gqa=lc.num_heads != lc.num_kv_heads)
        return self._mlp(hidden + self.attn.wo.project(o.transpose(1, 2).flatten(2), plan), plan)

    def logits(self, out: torch.Tensor, plan: KernelPlan) -> torch.Tensor:
        """Draft-vocabulary logits [.., Vd] (float32) of the layer's outputs."""
        return self.head.project(rms_norm(out, self.norm, self.cfg.layer.rms_norm_eps, plan), plan).float()

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


def eagle3_sources() -> dict[str, list[str]]:
    """Our names -> the released checkpoint's (no prefix; q/k/v and gate/up fused here)."""
    att, mlp = "midlayer.self_attn.", "midlayer.mlp."
    return {"fc.weight": ["fc.weight"], "input_norm": ["midlayer.input_layernorm.weight"],
            "hidden_norm": ["midlayer.hidden_norm.weight"], "mlp_norm": ["midlayer.post_attention_layernorm.weight"],
            "attn.wqkv.weight": [att + f"{p}_proj.weight" for p in "qkv"], "attn.wo.weight": [att + "o_proj.weight"],
            "mlp.w13.weight": [mlp + "gate_proj.weight", mlp + "up_proj.weight"],
            "mlp.w2.weight": [mlp + "down_proj.weight"], "norm": ["norm.weight"], "head.weight": ["lm_head.weight"],
            "d2t": ["d2t"]}


def load_eagle3(folder: str | Path, dtype: torch.dtype = torch.float32, device="cpu",
                target_layers: int | None = None) -> Eagle3Drafter:
    """A released EAGLE-3 drafter folder (config.json, model.safetensors; t2d, training's alone, is not read)."""
    from specpilot.models.loading import _load_into, read_json

    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"drafter checkpoint folder not found: {folder}")
    cfg = eagle3_config_from_hf(read_json(folder / "config.json"), str(folder / "config.json"), target_layers)
    with torch.device("meta"):
        model = Eagle3Drafter(cfg)
    _load_into(model, eagle3_sources(), folder, None, device)  # the file's dtypes: d2t's ids stay integers
    model.to(dtype=dtype)  # the floating tensors alone
    model.set_rope_length(cfg.layer.max_position_embeddings, device=device)
    return model.eval()


def save_eagle3(model: Eagle3Drafter, folder: str | Path, extra: dict[str, str | bytes] | None = None,
                max_shard_bytes: int | None = None) -> None:
    """The released layout (config.json, model.safetensors with t2d; extra files beside), written atomically."""
    from specpilot.models.loading import _split_state, _write_folder

    tensors = _split_state(model, eagle3_sources())
    t2d = torch.zeros(model.cfg.layer.vocab_size, dtype=torch.bool)
    t2d[model.target_ids(torch.arange(model.cfg.draft_vocab, device=model.d2t.device)).cpu()] = True
    _write_folder(Path(folder), model.cfg.to_hf(), {**tensors, "t2d": t2d}, extra, max_shard_bytes)


def is_eagle3(folder: str | Path) -> bool:
    """Whether a checkpoint folder holds an EAGLE-3 drafter (its config's architecture); False when unreadable
    (the DFlash loader then says what is wrong with it)."""
    import json

    try:
        return ARCHITECTURE in json.loads((Path(folder) / "config.json").read_text()).get("architectures", [])
    except (OSError, ValueError, AttributeError):
        return False


def check_eagle3_pair(target: DenseConfig, cfg: Eagle3Config) -> None:
    """An EAGLE-3 drafter reads this target's embedding and three of its layers."""
    if cfg.layer.vocab_size != target.vocab_size or cfg.target_hidden != target.hidden_size:
        raise UserError(f"the EAGLE-3 drafter was made for a target of {cfg.layer.vocab_size} tokens and hidden size "
                        f"{cfg.target_hidden}; this target has {target.vocab_size} and {target.hidden_size}")
    if cfg.layer.hidden_size != target.hidden_size:
        raise UserError("the EAGLE-3 drafter's hidden size differs from the target's, whose embedding it reads")
    bad = [i for i in cfg.taps if not 0 <= i < target.num_layers]
    if bad:
        raise UserError(f"the EAGLE-3 drafter reads target layers {bad}, outside the target's {target.num_layers}")
