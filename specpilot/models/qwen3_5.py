"""Qwen3.5's text model (a hybrid of gated attention and Gated DeltaNet layers) in our layout.

Three things differ from the Llama/Qwen3 layout beyond the Gated DeltaNet layers (models/gdn.py):
- its RMSNorms are zero-centred (x * (1 + w)): the checkpoint's w becomes our 1 + w (its gated norm is not);
- its attention's q_proj holds, per head, the query then an output gate: split into our q rows and `wgate`;
- its rotary turns only the first rotary_dim dims of a head, as pairs (i, i + rotary_dim / 2): its q/k dims are
  placed so that our rotate-half over the whole head (pairs (j, j + head_dim / 2), cos 1 and sin 0 past
  rotary_dim / 2: models/layers.rope_table) turns the same pairs at the same frequencies. q.k is unchanged by a
  permutation of both, and so is a per-head RMSNorm (its weight permuted alike).
"""

from __future__ import annotations

import torch

from specpilot.models.config import DenseConfig

ZERO_CENTRED = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight")


def rotary_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """Our head dim p holds the checkpoint's dim order[p] (see the module docstring)."""
    half, rh = head_dim // 2, rotary_dim // 2
    rest = torch.arange(rotary_dim, head_dim)  # dims rotary leaves alone, split over our two halves' tails
    return torch.cat([torch.arange(rh), rest[: half - rh], torch.arange(rh, rotary_dim), rest[half - rh :]])


def convert(hf: dict[str, torch.Tensor], cfg: DenseConfig, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """A Qwen3.5 text checkpoint's tensors (Hugging Face names) -> our DenseTarget's state dict."""
    out = {"embed.weight": hf[prefix + "embed_tokens.weight"], "norm": 1.0 + hf[prefix + "norm.weight"].float()}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = hf["lm_head.weight"]
    order = rotary_order(cfg.head_dim, cfg.rotated)
    for i, kind in enumerate(cfg.kinds):
        src, dst = f"{prefix}layers.{i}.", f"layers.{i}."
        out[dst + "attn_norm"] = 1.0 + hf[src + "input_layernorm.weight"].float()
        out[dst + "mlp_norm"] = 1.0 + hf[src + "post_attention_layernorm.weight"].float()
        mlp = src + "mlp."
        out[dst + "mlp.w13.weight"] = torch.cat([hf[mlp + "gate_proj.weight"], hf[mlp + "up_proj.weight"]])
        out[dst + "mlp.w2.weight"] = hf[mlp + "down_proj.weight"]
        out.update(_gdn(hf, src + "linear_attn.", dst + "mixer.") if kind == "gdn" else
                   _attention(hf, src + "self_attn.", dst + "attn.", cfg, order))
    return out


def _attention(hf, src: str, dst: str, cfg: DenseConfig, order: torch.Tensor) -> dict[str, torch.Tensor]:
    h, d = cfg.num_heads, cfg.head_dim
    qg = hf[src + "q_proj.weight"].view(h, 2, d, -1)  # per head: the query's d rows, then the gate's
    q = qg[:, 0][:, order].reshape(h * d, -1)
    k = hf[src + "k_proj.weight"].view(cfg.num_kv_heads, d, -1)[:, order].reshape(cfg.kv_dim, -1)
    return {dst + "wqkv.weight": torch.cat([q, k, hf[src + "v_proj.weight"]]),
            dst + "wgate.weight": qg[:, 1].reshape(h * d, -1),
            dst + "wo.weight": hf[src + "o_proj.weight"],
            dst + "q_norm": (1.0 + hf[src + "q_norm.weight"].float())[order],
            dst + "k_norm": (1.0 + hf[src + "k_norm.weight"].float())[order]}


def _gdn(hf, src: str, dst: str) -> dict[str, torch.Tensor]:
    return {dst + "w_qkvz.weight": torch.cat([hf[src + "in_proj_qkv.weight"], hf[src + "in_proj_z.weight"]]),
            dst + "w_ba.weight": torch.cat([hf[src + "in_proj_b.weight"], hf[src + "in_proj_a.weight"]]),
            dst + "conv": hf[src + "conv1d.weight"][:, 0],
            dst + "dt_bias": hf[src + "dt_bias"], dst + "A_log": hf[src + "A_log"],
            dst + "norm": hf[src + "norm.weight"], dst + "wo.weight": hf[src + "out_proj.weight"]}
