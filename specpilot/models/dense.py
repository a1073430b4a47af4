"""Dense Llama / Qwen3-family decoder used as the target.

One forward serves three modes (`Mode`): prefill of a prompt, decode of one row, and verify of N rows
with explicit positions, explicit cache slots and a `Visibility` over the static cache, so that chains
and trees share one code path. Hidden states of requested layers come back with the logits (the
drafter conditions on them).
"""

from __future__ import annotations

import enum

import torch
from torch import nn

from specpilot.kernels.dispatch import use_triton
from specpilot.kernels.embed import embed_handoff
from specpilot.kernels.embed import kernel_on as embed_kernel_on
from specpilot.kernels.gemv import gemv_applies, handoff_on, project, stream_of
from specpilot.kernels.norm import rms_norm
from specpilot.models.config import DenseConfig
from specpilot.models.layers import Attention, RopeTable, SwiGLU, run_layers
from specpilot.runtime.faults import NORM_EPS
from specpilot.spec.masks import Visibility


class Mode(enum.Enum):
    PREFILL = "prefill"  # a prompt: causal, logits of the last row only
    DECODE = "decode"  # one row per sequence
    VERIFY = "verify"  # N rows, explicit positions / slots / visibility, logits of every row


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

    def rows(self, first: int, last: int) -> KVCache:
        """A view of sequences first..last-1 (writes go to this cache)."""
        view = object.__new__(KVCache)
        view.k, view.v = self.k[:, first:last], self.v[:, first:last]
        return view


class Block(nn.Module):
    def __init__(self, cfg: DenseConfig):
        super().__init__()
        self.attn_norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.attn = Attention(cfg)
        self.mlp_norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.rms_norm_eps)


class DenseTarget(nn.Module):
    gemv = False  # the LM head through the Triton GEMV too (see layers.use_gemv)
    fault = "none"  # a deliberately lossy forward, for auditing the judge (runtime/faults.py)

    def __init__(self, cfg: DenseConfig, rope_length: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.rope = RopeTable(cfg, rope_length or cfg.max_position_embeddings)

    def set_rope_length(self, length: int, device=None) -> None:
        self.rope.resize(length, device=device)

    @property
    def head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.cfg.tie_word_embeddings else self.lm_head

    def new_cache(self, batch: int, length: int, dtype=None, device=None) -> KVCache:
        cfg = self.cfg
        dtype = dtype or self.embed.weight.dtype
        device = device or self.embed.weight.device
        return KVCache(cfg.num_layers, batch, length, cfg.num_kv_heads, cfg.head_dim, dtype, device)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, mode: Mode,
                slots: torch.Tensor | None = None, vis: Visibility | None = None,
                hidden_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens, positions [B, T] -> (logits [B, T or 1, V], hidden [B, T, len(hidden_layers) * H]).

        PREFILL and DECODE rows are consecutive positions whose K/V go to slot == position and which
        see every earlier slot; VERIFY takes the slots and the visibility from the caller (a tree's
        rows sit at consecutive slots past the cache but at positions given by their depth).
        """
        h, hidden, fused = self._trunk(tokens, positions, cache, mode, slots, vis, hidden_layers)
        if mode is Mode.PREFILL:
            h = stream_of(h)[:, -1:]
        final = self.norm if fused else None  # fused: h is the un-normed stream, normed inside the head GEMV
        if self.fault == "fp16_head":
            normed = rms_norm(stream_of(h), self.norm, self._eps()) if fused else h
            return (normed.half() @ self.head_weight.half().t()).to(h.dtype), hidden
        return project(h, self.head_weight, norm_weight=final, eps=self._eps(), gemv=self.gemv), hidden

    def _eps(self) -> float:
        return NORM_EPS if self.fault == "norm_eps" else self.cfg.rms_norm_eps

    def _trunk(self, tokens, positions, cache, mode, slots, vis, hidden_layers):
        """-> (hidden after the last layer: final-normed, or the raw stream when fused, possibly as a
        NormedStream for the final norm; taps; fused)."""
        if mode is Mode.VERIFY:
            if slots is None or vis is None:
                raise ValueError("verify needs explicit slots and visibility")
        else:
            slots = positions
            vis = Visibility(cache_len=positions[:, 0], start=positions[:, 0])

        def attn(i, layer, h, **kw):
            return layer.attn(h, positions, self.rope, cache.k[i], cache.v[i], slots, vis, **kw)

        layers = self.layers
        if self.fault == "skip_layer":  # the middle layer left out
            layers = [layer for i, layer in enumerate(self.layers) if i != len(self.layers) // 2]
        if self.gemv and tokens.numel() == 1 and use_triton(self.embed.weight) and embed_kernel_on() and handoff_on():
            x = embed_handoff(tokens, self.embed.weight, layers[0].attn_norm, pdl_default=True)
        else:
            x = self.embed(tokens)
        fused = gemv_applies(x, self.gemv)
        h, kept = run_layers(x, layers, self.norm, self._eps(), attn,
                             lambda i, layer, h, **kw: layer.mlp(h, **kw), hidden_layers, fused=fused)
        hidden = torch.cat([kept[i] for i in hidden_layers], -1) if kept else None
        return h, hidden, fused

    def normed_hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden states of every row of whole sequences [B, T] (teacher forcing: the
        caller applies its own LM head, e.g. in float32)."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)[None].expand(tokens.shape[0], -1)
        cache = self.new_cache(tokens.shape[0], tokens.shape[1])
        h, _, fused = self._trunk(tokens, positions, cache, Mode.PREFILL, None, None, ())
        return rms_norm(stream_of(h), self.norm, self.cfg.rms_norm_eps) if fused else h
