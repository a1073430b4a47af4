"""Dense Llama / Qwen3-family decoder used as the target.

One forward serves three modes (`Mode`): prefill of a prompt, decode of one row, and verify of N rows
with explicit positions, explicit cache slots and a `Visibility` over the static cache, so that chains
and trees share one code path. Hidden states of requested layers come back with the logits (the
drafter conditions on them). Every forward takes the kernel plan it runs under; layers are built from the
config's layer types, the cache from the same list (models/cache.py).
"""

from __future__ import annotations

import enum

import torch
from torch import nn

from specpilot.config.plan import KernelPlan
from specpilot.core.contracts import Forward
from specpilot.core.regions import region
from specpilot.kernels import embed
from specpilot.kernels.gemv import gemv_applies, stream_of
from specpilot.kernels.norm import rms_norm
from specpilot.models.cache import Cache
from specpilot.models.config import DenseConfig
from specpilot.models.gdn import GDNBlock
from specpilot.models.layers import Attention, RopeTable, SwiGLU, run_layers
from specpilot.weights import DenseWeight


class Mode(enum.Enum):
    PREFILL = "prefill"  # a prompt: causal, logits of the last row only
    DECODE = "decode"  # one row per sequence
    VERIFY = "verify"  # N rows, explicit positions / slots / visibility, logits of every row


class Block(nn.Module):
    """A layer of the attention kind: attention and SwiGLU MLP, each after its RMSNorm."""

    def __init__(self, cfg: DenseConfig):
        super().__init__()
        self.attn_norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.attn = Attention(cfg)
        self.mlp_norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.rms_norm_eps)


LAYERS = {"attention": Block, "gdn": GDNBlock}  # a layer type -> its module


class DenseTarget(nn.Module):
    def __init__(self, cfg: DenseConfig, rope_length: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed = DenseWeight(cfg.hidden_size, cfg.vocab_size)  # the table [V, H]; rows() is the lookup
        self.layers = nn.ModuleList(LAYERS[kind](cfg) for kind in cfg.kinds)
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        if not cfg.tie_word_embeddings:  # the checkpoint's tensor (registered here: random init order, names)
            self.lm_head = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.rope = RopeTable(cfg, rope_length or cfg.max_position_embeddings)

    def set_rope_length(self, length: int, device=None) -> None:
        self.rope.resize(length, device=device)

    @property
    def head(self) -> DenseWeight:
        """The LM head's weight object (the embedding's when tied)."""
        if self.cfg.tie_word_embeddings:
            return self.embed
        view = self.__dict__.get("_head")
        if view is None or view.weight is not self.lm_head:
            view = DenseWeight.of(self.lm_head)
            object.__setattr__(self, "_head", view)  # kept beside the module, not registered in it
        return view

    @property
    def head_weight(self) -> torch.Tensor:
        return self.head.weight

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def new_cache(self, batch: int, length: int, dtype=None, device=None, stacked: bool = True) -> Cache:
        cfg = self.cfg
        return Cache.build(cfg.kinds, batch, length, cfg.num_kv_heads, cfg.head_dim,
                           dtype or self.embed.weight.dtype, device or self.device, stacked, cfg.gdn)

    def forward(self, tokens: torch.Tensor, meta: Forward, cache: Cache, mode: Mode, plan: KernelPlan | None = None,
                hidden_layers: tuple[int, ...] = (), *, layers: list[int] | None = None, eps: float | None = None,
                head: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens [B, T] -> (logits [B, T or 1, V], hidden [B, T, len(hidden_layers) * H]).

        meta (core/contracts.Forward): the rows' positions, their cache slots, what each sees and the weights the
        pass reads (W12's 8-bit view: two-level verification's cheap pass). PREFILL and DECODE take consecutive
        rows (Forward.consecutive); VERIFY any proposal's (a tree's rows sit at consecutive slots past the cache
        but at positions given by their depth). PREFILL returns the logits of the last row only. plan: the kernel
        plan (None: stock's). layers: the indices of the layers to run (None: all), eps: the RMSNorm epsilon
        (None: the config's), head: a weight [V, H] to project with instead of the model's, in its own dtype
        (None: the model's head): variants of the function that callers outside the model compose (the audited
        faults of runtime/faults.py).
        """
        plan = plan or KernelPlan.stock()
        if meta.view != plan.view:
            plan = plan.but(view=meta.view)
        eps = self.cfg.rms_norm_eps if eps is None else eps
        if meta.packed is not None:  # only the packed rows run (a shared row budget); the rest come back as zeros
            if mode is Mode.PREFILL:
                raise ValueError("a prefill runs every row: packed rows are for decode and verify passes")
            logits, hidden = self._forward(meta.pack(tokens), meta, cache, mode, plan, hidden_layers, layers, eps, head)
            return meta.unpack(logits), None if hidden is None else meta.unpack(hidden)
        return self._forward(tokens, meta, cache, mode, plan, hidden_layers, layers, eps, head)

    def _forward(self, tokens, meta: Forward, cache: Cache, mode: Mode, plan: KernelPlan, hidden_layers, layers,
                 eps: float, head) -> tuple[torch.Tensor, torch.Tensor | None]:
        h, hidden, fused = self._trunk(tokens, meta, cache, hidden_layers, plan, layers, eps, mode is Mode.PREFILL)
        if mode is Mode.PREFILL:
            h = stream_of(h)[:, -1:]
        if head is not None:
            normed = rms_norm(stream_of(h), self.norm, eps, plan) if fused else h
            return (normed.to(head.dtype) @ head.t()).to(normed.dtype), hidden
        final = self.norm if fused else None  # fused: h is the un-normed stream, normed inside the head GEMV
        with region("head"):
            return self.head.project(h, plan, norm_weight=final, eps=eps), hidden

    def _trunk(self, tokens, meta: Forward, cache, hidden_layers, plan: KernelPlan, which: list[int] | None,
               eps: float, prefill: bool = True):
        """-> (hidden after the last layer: final-normed, or the raw stream when fused, possibly as a
        NormedStream for the final norm; taps; fused). prefill: rows of a prompt (a recurrent layer moves its
        state past them; other rows leave it to the cache's commit)."""

        def attn(i, layer, h, **kw):
            if isinstance(layer, GDNBlock):
                return layer.mixer(h, meta, cache[index[i]], prefill, plan, **kw)
            return layer.attn(h, meta.positions, self.rope, cache[index[i]], meta.slots, meta.visibility, plan,
                              meta=meta, **kw)

        index = list(range(len(self.layers))) if which is None else list(which)
        layers = [self.layers[i] for i in index]
        if embed.applies(tokens, self.embed.weight, plan):
            x = embed.embed_handoff(tokens, self.embed.weight, layers[0].attn_norm, plan)
        else:
            x = self.embed.rows(tokens)
        fused = gemv_applies(x, plan) and meta.packed is None  # (packed rows: the projections' cuBLAS path)
        h, kept = run_layers(x, layers, self.norm, eps, attn, lambda i, layer, h, **kw: layer.mlp(h, plan, **kw),
                             plan, hidden_layers, fused=fused)
        hidden = torch.cat([kept[i] for i in hidden_layers], -1) if kept else None
        return h, hidden, fused

    def normed_hidden(self, tokens: torch.Tensor, plan: KernelPlan | None = None) -> torch.Tensor:
        """Final-normed hidden states of every row of whole sequences [B, T] (teacher forcing: the
        caller applies its own LM head, e.g. in float32)."""
        plan = plan or KernelPlan.stock()
        positions = torch.arange(tokens.shape[1], device=tokens.device)[None].expand(tokens.shape[0], -1)
        cache = self.new_cache(tokens.shape[0], tokens.shape[1])
        eps = self.cfg.rms_norm_eps
        h, _, fused = self._trunk(tokens, Forward.consecutive(positions), cache, (), plan, None, eps)
        return rms_norm(stream_of(h), self.norm, eps, plan) if fused else h
