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
    qg = hf[src + "q_proj.weight"].view(h, 1 + cfg.attn_output_gate, d, -1)  # per head: the query, then the gate
    q = qg[:, 0][:, order].reshape(h * d, -1)
    k = hf[src + "k_proj.weight"].view(cfg.num_kv_heads, d, -1)[:, order].reshape(cfg.kv_dim, -1)
    out = {dst + "wqkv.weight": torch.cat([q, k, hf[src + "v_proj.weight"]]),
           dst + "wo.weight": hf[src + "o_proj.weight"]}
    if cfg.attn_output_gate:
        out[dst + "wgate.weight"] = qg[:, 1].reshape(h * d, -1)
    if cfg.qk_norm:
        out[dst + "q_norm"] = (1.0 + hf[src + "q_norm.weight"].float())[order]
        out[dst + "k_norm"] = (1.0 + hf[src + "k_norm.weight"].float())[order]
    return out


def _gdn(hf, src: str, dst: str) -> dict[str, torch.Tensor]:
    return {dst + "w_qkvz.weight": torch.cat([hf[src + "in_proj_qkv.weight"], hf[src + "in_proj_z.weight"]]),
            dst + "w_ba.weight": torch.cat([hf[src + "in_proj_b.weight"], hf[src + "in_proj_a.weight"]]),
            dst + "conv": hf[src + "conv1d.weight"][:, 0],
            dst + "dt_bias": hf[src + "dt_bias"], dst + "A_log": hf[src + "A_log"],
            dst + "norm": hf[src + "norm.weight"], dst + "wo.weight": hf[src + "out_proj.weight"]}


def export(ours: dict[str, torch.Tensor], cfg: DenseConfig, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """Our DenseTarget's state dict -> a Qwen3.5 text checkpoint's tensors (`convert`'s inverse). A zero-centred
    norm is stored as float32 w - 1, exact for w in bf16 and for float32 w >= 0.5 (so `convert` gives w back)."""
    if cfg.attention_bias or cfg.mlp_bias:
        raise ValueError("Qwen3.5's layout has no attention or MLP biases")
    centred = lambda w: w.float() - 1.0  # noqa: E731
    out = {prefix + "embed_tokens.weight": ours["embed.weight"], prefix + "norm.weight": centred(ours["norm"])}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = ours["lm_head"]
    back = torch.argsort(rotary_order(cfg.head_dim, cfg.rotated))  # the checkpoint's dim j is our dim back[j]
    for i, kind in enumerate(cfg.kinds):
        src, dst = f"layers.{i}.", f"{prefix}layers.{i}."
        gate, up = ours[src + "mlp.w13.weight"].chunk(2)
        out.update({dst + "input_layernorm.weight": centred(ours[src + "attn_norm"]),
                    dst + "post_attention_layernorm.weight": centred(ours[src + "mlp_norm"]),
                    dst + "mlp.gate_proj.weight": gate, dst + "mlp.up_proj.weight": up,
                    dst + "mlp.down_proj.weight": ours[src + "mlp.w2.weight"]})
        out.update(_gdn_back(ours, src + "mixer.", dst + "linear_attn.", cfg) if kind == "gdn" else
                   _attention_back(ours, src + "attn.", dst + "self_attn.", cfg, back))
    return {k: v.contiguous() for k, v in out.items()}


def _attention_back(ours, src: str, dst: str, cfg: DenseConfig, back: torch.Tensor) -> dict[str, torch.Tensor]:
    h, d = cfg.num_heads, cfg.head_dim
    q, k, v = ours[src + "wqkv.weight"].split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim])
    q = q.view(h, 1, d, -1)[:, :, back]
    if cfg.attn_output_gate:
        q = torch.cat([q, ours[src + "wgate.weight"].view(h, 1, d, -1)], 1)
    out = {dst + "q_proj.weight": q.reshape(-1, q.shape[-1]), dst + "v_proj.weight": v,
           dst + "k_proj.weight": k.view(cfg.num_kv_heads, d, -1)[:, back].reshape(cfg.kv_dim, -1),
           dst + "o_proj.weight": ours[src + "wo.weight"]}
    if cfg.qk_norm:
        out[dst + "q_norm.weight"] = ours[src + "q_norm"][back].float() - 1.0
        out[dst + "k_norm.weight"] = ours[src + "k_norm"][back].float() - 1.0
    return out


def _gdn_back(ours, src: str, dst: str, cfg: DenseConfig) -> dict[str, torch.Tensor]:
    s = cfg.gdn
    qkv, z = ours[src + "w_qkvz.weight"].split([s.conv_dim, s.value_dim])
    b, a = ours[src + "w_ba.weight"].chunk(2)
    return {dst + "in_proj_qkv.weight": qkv, dst + "in_proj_z.weight": z, dst + "in_proj_b.weight": b,
            dst + "in_proj_a.weight": a, dst + "conv1d.weight": ours[src + "conv"][:, None],
            dst + "dt_bias": ours[src + "dt_bias"], dst + "A_log": ours[src + "A_log"],
            dst + "norm.weight": ours[src + "norm"], dst + "out_proj.weight": ours[src + "wo.weight"]}
