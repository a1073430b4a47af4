"""Building blocks shared by the target and the drafter.

The elementwise work goes through `specpilot.kernels` (a Triton kernel on CUDA, the PyTorch reference
elsewhere, as the kernel plan says); each projection is a weight object (specpilot/weights) that owns its
kernels, with q/k/v and gate/up fused into one weight each. Every call takes the plan explicitly.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from specpilot.config.plan import KernelPlan
from specpilot.core.contracts import Forward
from specpilot.kernels.attention import attend
from specpilot.kernels.gemv import stream_of
from specpilot.kernels.norm import add_rms_norm, rms_norm
from specpilot.kernels.rope import rope_qkv
from specpilot.models.cache import AttentionState
from specpilot.models.config import DenseConfig
from specpilot.weights import DenseWeight

if TYPE_CHECKING:  # type hints only: Visibility is the step's type (speculative/, a layer up)
    from specpilot.core.contracts import Visibility


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv / factor
    # llama3: leave high frequencies, divide low ones by factor, blend in between.
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_ctx = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    return torch.where(medium, blended, scaled)


def rope_table(length: int, head_dim: int, theta: float, scaling: dict | None, device=None,
               rotary_dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, float32, [length, head_dim], halves duplicated (rotate-half convention). rotary_dim (partial
    rotary, Qwen3.5): only the first rotary_dim / 2 dims of each half turn, at the frequencies of a rotary_dim
    head; the rest keep cos 1, sin 0 (a checkpoint's q/k dims are placed so: models/qwen3_5.py)."""
    inv = rope_inv_freq(rotary_dim or head_dim, theta, scaling)
    if rotary_dim and rotary_dim < head_dim:
        inv = torch.cat([inv, inv.new_zeros((head_dim - rotary_dim) // 2)])
    inv = inv.to(device)
    freqs = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


class RopeTable(nn.Module):
    """Rotary cos/sin tables, rebuilt (not loaded) for the context length in use."""

    def __init__(self, cfg: DenseConfig, length: int):
        super().__init__()
        self.cfg = cfg
        self.resize(length)

    def resize(self, length: int, device=None) -> None:
        cos, sin = rope_table(length, self.cfg.head_dim, self.cfg.rope_theta, self.cfg.rope_scaling, device=device,
                              rotary_dim=self.cfg.rotary_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @property
    def length(self) -> int:
        return self.cos.shape[0]


class Attention(nn.Module):
    def __init__(self, cfg: DenseConfig):
        super().__init__()
        self.cfg = cfg
        self.wqkv = DenseWeight(cfg.hidden_size, cfg.q_dim + 2 * cfg.kv_dim, bias=cfg.attention_bias)
        self.wo = DenseWeight(cfg.q_dim, cfg.hidden_size, bias=cfg.attention_bias)
        if cfg.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(cfg.head_dim))
            self.k_norm = nn.Parameter(torch.ones(cfg.head_dim))
        if cfg.attn_output_gate:  # Qwen3.5: the output times sigmoid(a projection of the same input)
            self.wgate = DenseWeight(cfg.hidden_size, cfg.q_dim, bias=cfg.attention_bias)

    def _prologue(self, x, positions, rope: RopeTable, state: AttentionState, slots, want_q: bool,
                  plan: KernelPlan, norm_weight=None, meta: Forward | None = None):
        """q [B, T, Hq, D] (or None without want_q); the rows' K/V written into the state at their slots. meta with
        packed rows: x holds those rows alone, and the projection is unpacked to [B, T] for the rest."""
        cfg = self.cfg
        qn, kn = (self.q_norm, self.k_norm) if cfg.qk_norm else (None, None)
        packed = meta is not None and meta.packed is not None
        if want_q and not packed and self.wqkv.qkv_rope_applies(x, plan, cfg.qk_norm, cfg.head_dim):  # one launch
            return self.wqkv.qkv_rope(x, plan, norm_weight, cfg.rms_norm_eps, positions, rope, state.k, state.v,
                                      slots, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        qkv = self.wqkv.project(x, plan, norm_weight=norm_weight, eps=cfg.rms_norm_eps)
        if packed:
            qkv = meta.unpack(qkv)
        return rope_qkv(qkv, positions, rope.cos, rope.sin, qn, kn, cfg.rms_norm_eps, state.k, state.v, slots,
                        cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, plan, want_q)

    def write_kv(self, x, positions, rope: RopeTable, state: AttentionState, slots, plan: KernelPlan) -> None:
        """Only the K/V of rows x (the drafter's context rows) into the cache."""
        self._prologue(x, positions, rope, state, slots, False, plan)

    def forward(self, x, positions, rope: RopeTable, state: AttentionState, slots, vis: Visibility,
                plan: KernelPlan, norm_weight=None, residual=None, next_norm=None, meta: Forward | None = None):
        """Attention of normed rows x; or, fused, of rms_norm(x, norm_weight) with the output added to
        `residual` and handed to the norm `next_norm` (see `run_layers`). meta with packed rows (Forward.packed):
        x holds those rows alone; the projections run on them, the core on the padded [B, T] layout."""
        q = self._prologue(x, positions, rope, state, slots, True, plan, norm_weight=norm_weight, meta=meta)
        o = attend(q, state.k, state.v, vis, self.cfg.head_dim ** -0.5, plan).flatten(2)
        if meta is not None and meta.packed is not None:
            o = meta.pack(o)
        if self.cfg.attn_output_gate:
            gate = self.wgate.project(x, plan, norm_weight=norm_weight, eps=self.cfg.rms_norm_eps)
            o = o * torch.sigmoid(gate)
        return self.wo.project(o, plan, residual=residual, next_norm=next_norm)


class SwiGLU(nn.Module):
    """gate and up projections fused into one weight (one GEMM), then down."""

    def __init__(self, hidden: int, inter: int, bias: bool = False, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.w13 = DenseWeight(hidden, 2 * inter, bias=bias)
        self.w2 = DenseWeight(inter, hidden, bias=bias)

    def forward(self, x, plan: KernelPlan, norm_weight=None, residual=None, next_norm=None):
        h = self.w13.project(x, plan, norm_weight=norm_weight, eps=self.eps, gate_up=True)
        return self.w2.project(h, plan, residual=residual, next_norm=next_norm)


def run_layers(x, layers, final_norm, eps: float, attn_fn, mlp_fn, plan: KernelPlan,
               hidden_layers: tuple[int, ...] = (), fused: bool = False):
    """Pre-norm residual stack.

    attn_fn(i, layer, h, **kw) and mlp_fn(i, layer, h, **kw) compute layer i's sublayers. Unfused (cuBLAS
    path), h is normed input and each residual add is fused into the norm that follows it; the result is
    the final-normed hidden. Fused (few-row GEMV path), h is the residual stream itself and kw carries
    norm_weight and residual: every norm happens inside the projection that reads it, every residual
    add inside the projection that writes it, and the result is the un-normed stream (the final norm
    goes into the LM head's projection). Each projection that writes the stream also gets the weight of the
    norm that reads it next (next_norm), for the hand-over of kernels/gemv.NormedStream; the result may be
    one. Returns (hidden, {layer index: residual stream after it})."""
    kept = {}
    if fused:
        for i, layer in enumerate(layers):
            following = layers[i + 1].attn_norm if i + 1 < len(layers) else final_norm
            x = attn_fn(i, layer, x, norm_weight=layer.attn_norm, residual=x, next_norm=layer.mlp_norm)
            x = mlp_fn(i, layer, x, norm_weight=layer.mlp_norm, residual=x, next_norm=following)
            if i in hidden_layers:
                kept[i] = stream_of(x)
        return x, kept
    h = rms_norm(x, layers[0].attn_norm, eps, plan)
    for i, layer in enumerate(layers):
        x, h = add_rms_norm(x, attn_fn(i, layer, h), layer.mlp_norm, eps, plan)
        following = layers[i + 1].attn_norm if i + 1 < len(layers) else final_norm
        x, h = add_rms_norm(x, mlp_fn(i, layer, h), following, eps, plan)
        if i in hidden_layers:
            kept[i] = x
    return h, kept
