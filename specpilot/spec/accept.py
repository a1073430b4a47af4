"""Acceptance of a verified chain.

Greedy: accept the longest prefix of drafts that equals the target's argmax, plus one bonus token.
Everything stays on the device (no host sync), so a step can run inside a CUDA graph. A sampling
acceptor would take the same inputs plus the drafter's probabilities and return the same pair.
"""

from __future__ import annotations

import torch


def accept_greedy(drafts: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """drafts [D] proposed after the anchor; target_logits [D+1, V] of rows [anchor, drafts...].

    Returns (a, committed): a = number of accepted drafts (0-d int64 tensor) and committed [D+1], the
    target's argmax per row, whose first a+1 entries are the tokens this step commits (the accepted
    drafts equal the target's argmax by definition, and entry a is the bonus token).
    """
    predicted = target_logits.argmax(-1)
    matches = (drafts == predicted[:-1]).to(torch.int64)
    return matches.cumprod(0).sum(), predicted
