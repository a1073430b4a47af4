"""Deliberately lossy variants of a system, for auditing the token-forcing judge (`stock:fault=...`).

Each one is a shortcut a speed-rewarded optimiser might take; none is ever a default. Engine-level
faults change how the target's logits become tokens or how drafts are accepted; model-level ones
change the target's forward (an argument of each forward call, so none outlives the generation that used it).
"""

from __future__ import annotations

import torch

FAULTS = ("none", "logit_bias", "fp16_head", "skip_layer", "topk_truncate", "norm_eps", "unverified_accept")
MODEL_FAULTS = ("fp16_head", "skip_layer", "norm_eps")
BIAS = 3.0  # logit_bias: added to every tenth token id
KEEP = 7 / 8  # topk_truncate: the argmax only ever sees the first 7/8 of the vocabulary
NORM_EPS = 1.0  # norm_eps: the RMSNorm epsilon used instead of the config's


def distort(logits: torch.Tensor, fault: str) -> torch.Tensor:
    """Logits as a faulty system would turn them into tokens (identity for the others)."""
    if fault == "logit_bias":
        bias = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
        bias[::10] = BIAS
        return logits + bias
    if fault == "topk_truncate":
        cut = int(logits.shape[-1] * KEEP)
        return torch.cat([logits[..., :cut], torch.full_like(logits[..., cut:], float("-inf"))], -1)
    return logits


def force_first_draft(verdict, drafts: torch.Tensor):
    """unverified_accept: the first draft is committed even when the target disagrees (verdict: a
    speculative/accept.Verdict of a chain; drafts [B, R - 1])."""
    forced = verdict.accepted == 0
    tokens = verdict.tokens.clone()
    tokens[:, 0] = torch.where(forced, drafts[:, 0], tokens[:, 0])
    return type(verdict)(accepted=verdict.accepted + forced.to(verdict.accepted.dtype), path=verdict.path,
                         tokens=tokens)
