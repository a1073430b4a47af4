"""Deliberately lossy variants of a system, for auditing the token-forcing judge (`stock:fault=...`).

Each one is a shortcut a speed-rewarded optimiser might take; none is ever a default. Engine-level
faults change how the target's logits become tokens or how drafts are accepted; model-level ones
change the target's function (`faulty`: a wrapper around its forward that the engine calls instead, so the model
itself knows no fault and none outlives the engine that used it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specpilot.config.options import FAULTS as FAULTS  # the names, defined with the option that takes them

MODEL_FAULTS = ("low_head", "skip_layer", "norm_eps", "kv_low")
BIAS = 3.0  # logit_bias: added to every tenth token id
KEEP = 7 / 8  # topk_truncate: the argmax only ever sees the first 7/8 of the vocabulary
NORM_EPS = 1.0  # norm_eps: the RMSNorm epsilon used instead of the config's
NEAR_TIE = 0.5  # near_tie: where the top two logits are closer than this, the runner-up is taken
HOLE = 16  # vocab_hole: every 16th token id can never be the argmax
EVERY = 4  # rare_unverified: the first draft is forced only at positions that are multiples of this


def distort(logits: torch.Tensor, fault: str) -> torch.Tensor:
    """Logits as a faulty system would turn them into tokens (identity for the others)."""
    if fault == "logit_bias":
        bias = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
        bias[::10] = BIAS
        return logits + bias
    if fault == "topk_truncate":
        cut = int(logits.shape[-1] * KEEP)
        return torch.cat([logits[..., :cut], torch.full_like(logits[..., cut:], float("-inf"))], -1)
    if fault == "vocab_hole":
        hole = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        hole[HOLE - 1 :: HOLE] = True
        return logits.masked_fill(hole, float("-inf"))
    if fault == "near_tie":  # a shortcut that only acts where the choice looks arbitrary
        top = logits.topk(2, dim=-1)
        gap = top.values[..., 0] - top.values[..., 1]
        lift = torch.where(gap < NEAR_TIE, 2 * gap + 0.05, torch.zeros_like(gap))
        return logits.scatter_add(-1, top.indices[..., 1:], lift[..., None].to(logits.dtype))
    return logits


def faulty(target, fault: str) -> Callable:
    """The target's forward as a model-level fault changes it (the target itself for every other fault): called
    as the target is, models/dense.DenseTarget.forward."""
    return target if fault not in MODEL_FAULTS else FaultyForward(target, fault)


class FaultyForward:
    """A model-level fault around a target's forward:
      low_head    the LM head one precision step below the model's (lower_head), made once per weight version;
      skip_layer  the middle layer left out;
      norm_eps    every RMSNorm at epsilon NORM_EPS instead of the config's;
      kv_low      the K/V a pass wrote read back at a lower precision from then on (lower_state after the pass: a
                  layer's rows have read their own K/V by then, as a cache that rounds on write would let them)."""

    def __init__(self, target, fault: str):
        self.target, self.fault = target, fault
        self._head: tuple | None = None

    def __call__(self, tokens, meta, cache, mode, plan=None, hidden_layers=(), **kw):
        if self.fault == "low_head":
            kw["head"] = self.low_head()
        elif self.fault == "skip_layer":
            n = len(self.target.layers)
            kw["layers"] = [i for i in range(n) if i != n // 2]
        elif self.fault == "norm_eps":
            kw["eps"] = NORM_EPS
        out = self.target(tokens, meta, cache, mode, plan, hidden_layers, **kw)
        if self.fault == "kv_low":
            for layer in cache.layers:
                lower_state(layer.k, layer.v)
        return out

    def low_head(self) -> torch.Tensor:
        """Converting the head on every forward cost more than the head itself on the CPU: once per version."""
        w = self.target.head_weight
        key = (w.data_ptr(), w.dtype, tuple(w.shape), w._version)
        if self._head is None or self._head[0] != key:
            self._head = (key, lower_head(w.detach()))
        return self._head[1]


def lower_head(w: torch.Tensor) -> torch.Tensor:
    """low_head: the LM head one precision step below the model's. A float32 model's head in float16 (and its
    logits computed in float16); a 16-bit model's head in float8 (e4m3, one scale per row, as an FP8 head is
    served), computed in the model's dtype. Either is lossy at its own precision; a float16 head under bf16,
    this fault's first form, was not (float16 has more mantissa than bfloat16)."""
    if w.dtype == torch.float32:
        return w.half()
    scale = w.abs().amax(dim=1, keepdim=True).float().clamp_min(1e-12) / 448.0  # e4m3's largest finite value
    return ((w.float() / scale).to(torch.float8_e4m3fn).float() * scale).to(w.dtype)


def lower_state(k: torch.Tensor, v: torch.Tensor) -> None:
    """kv_low: the cached K/V kept in float8 (e4m3, an FP8 KV cache) whatever the model's dtype, in place; what a
    step wrote is rounded before the next one reads it."""
    for t in (k, v):
        t.copy_(t.to(torch.float8_e4m3fn).to(t.dtype))


def force_first_draft(verdict, drafts: torch.Tensor, pos: torch.Tensor | None = None):
    """unverified_accept: the first draft is committed even when the target disagrees (verdict: a
    speculative/accept.Verdict of a chain; drafts [B, R - 1]); with pos [B] (rare_unverified), only at positions
    that are multiples of EVERY."""
    forced = verdict.accepted == 0
    if pos is not None:
        forced &= pos % EVERY == 0
    tokens = verdict.tokens.clone()
    tokens[:, 0] = torch.where(forced, drafts[:, 0], tokens[:, 0])
    return type(verdict)(accepted=verdict.accepted + forced.to(verdict.accepted.dtype), path=verdict.path,
                         tokens=tokens)
