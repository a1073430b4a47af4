"""Dense Llama / Qwen3-family decoder used as the target.

One forward serves three modes (`Mode`): prefill of a prompt, decode of one row, and verify of N rows
with explicit positions, explicit cache slots and an arbitrary visibility mask over the static cache,
so that chains and trees share one code path. Hidden states of requested layers come back with the
logits (the drafter conditions on them).
"""

from __future__ import annotations

import enum

import torch
from torch import nn

from specpilot.models.config import DenseConfig
from specpilot.models.layers import SwiGLU, apply_rope, attention, rms_norm, rope_table, write_rows


class Mode(enum.Enum):
    PREFILL = "prefill"  # a prompt: causal, logits of the last row only
    DECODE = "decode"  # one row per sequence
    VERIFY = "verify"  # N rows, explicit positions / slots / mask, logits of every row


class KVCache:
    """Static K/V buffers [layers, B, Hkv, L, D] (the layout attention reads without a copy);
    a row's slot is where its K/V lives."""

    def __init__(self, layers: int, batch: int, length: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device):
        shape = (layers, batch, kv_heads, length, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def length(self) -> int:
        return self.k.shape[3]


def causal_mask(positions: torch.Tensor, length: int) -> torch.Tensor:
    """[B, T, L]: slot s is visible to a row at position p iff s <= p (slot == position layout)."""
    slots = torch.arange(length, device=positions.device)
    return slots[None, None, :] <= positions[:, :, None]


class Attention(nn.Module):
    def __init__(self, cfg: DenseConfig):
        super().__init__()
        self.cfg = cfg
        self.wqkv = nn.Linear(cfg.hidden_size, cfg.q_dim + 2 * cfg.kv_dim, bias=cfg.attention_bias)
        self.wo = nn.Linear(cfg.q_dim, cfg.hidden_size, bias=cfg.attention_bias)
        if cfg.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(cfg.head_dim))
            self.k_norm = nn.Parameter(torch.ones(cfg.head_dim))

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        cfg = self.cfg
        b, t, _ = x.shape
        q, k, v = self.wqkv(x).split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim], dim=-1)
        q = q.view(b, t, cfg.num_heads, cfg.head_dim)
        k = k.view(b, t, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(b, t, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q = rms_norm(q, self.q_norm, cfg.rms_norm_eps)
            k = rms_norm(k, self.k_norm, cfg.rms_norm_eps)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x, cos, sin, k_cache, v_cache, slots, mask):
        q, k, v = self.project(x, cos, sin)
        write_rows(k_cache, slots, k)
        write_rows(v_cache, slots, v)
        o = attention(q, k_cache, v_cache, mask, self.cfg.head_dim ** -0.5)
        return self.wo(o.flatten(2))


class Block(nn.Module):
    def __init__(self, cfg: DenseConfig):
        super().__init__()
        self.eps = cfg.rms_norm_eps
        self.attn_norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.attn = Attention(cfg)
        self.mlp_norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)

    def forward(self, x, cos, sin, k_cache, v_cache, slots, mask):
        x = x + self.attn(rms_norm(x, self.attn_norm, self.eps), cos, sin, k_cache, v_cache, slots, mask)
        return x + self.mlp(rms_norm(x, self.mlp_norm, self.eps))


class DenseTarget(nn.Module):
    def __init__(self, cfg: DenseConfig, rope_length: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.set_rope_length(rope_length or cfg.max_position_embeddings)

    def set_rope_length(self, length: int, device=None) -> None:
        cos, sin = rope_table(length, self.cfg.head_dim, self.cfg.rope_theta, self.cfg.rope_scaling,
                              device=device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.cfg.tie_word_embeddings else self.lm_head

    def new_cache(self, batch: int, length: int, dtype=None, device=None) -> KVCache:
        cfg = self.cfg
        dtype = dtype or self.embed.weight.dtype
        device = device or self.embed.weight.device
        return KVCache(cfg.num_layers, batch, length, cfg.num_kv_heads, cfg.head_dim, dtype, device)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden, self.norm, self.cfg.rms_norm_eps) @ self.head_weight.t()

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, mode: Mode,
                slots: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                hidden_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens, positions [B, T] -> (logits [B, T or 1, V], hidden [B, T, len(hidden_layers) * H]).

        PREFILL and DECODE write K/V at slot == position and see every earlier slot; VERIFY takes the
        slots and the [B, T, L] mask from the caller (a tree's rows sit at slots past the cache but at
        positions given by their depth).
        """
        if mode is Mode.VERIFY:
            if slots is None or mask is None:
                raise ValueError("verify needs explicit slots and mask")
        else:
            slots = positions
            mask = causal_mask(positions, cache.length)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        x = self.embed(tokens)
        kept = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.k[i], cache.v[i], slots, mask)
            if i in hidden_layers:
                kept[i] = x
        hidden = torch.cat([kept[i] for i in hidden_layers], -1) if kept else None
        if mode is Mode.PREFILL:
            x = x[:, -1:]
        return self.logits(x), hidden
