"""Acceptance of a verified proposal: the verdict.

Greedy: accept the longest path of drafts that equals the target's argmax, plus one bonus token. On a chain
the path is a prefix. Everything stays on the device (no host sync), so a step can run inside a CUDA
graph. A sampling acceptor would take the same inputs plus the drafter's probabilities and return a Verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.speculative.proposal import Proposal


@dataclass
class Verdict:
    accepted: torch.Tensor  # [B] int64: drafted tokens accepted (0 .. R - 1)
    path: torch.Tensor  # [B, R] int64: the accepted path's rows, the anchor first (entries past accepted: padding)
    tokens: torch.Tensor  # [B, R] int64: the target's argmax along the path; 0..accepted are committed

    @property
    def bonus(self) -> torch.Tensor:
        """[B]: the last committed token (the target's own, after the accepted drafts)."""
        return self.tokens.gather(1, self.accepted[:, None])[:, 0]


def accept_greedy(proposal: Proposal, logits: torch.Tensor) -> Verdict:
    """logits [B, R, V] of the proposal's rows. On a chain the accepted drafts equal the target's argmax by
    definition, so the committed tokens are the argmax of rows 0..accepted (the last is the bonus)."""
    if not proposal.chain:
        raise NotImplementedError("greedy acceptance of a tree proposal")
    predicted = logits.argmax(-1)  # [B, R]
    matches = (proposal.drafts == predicted[:, :-1]).to(torch.int64)
    return Verdict(accepted=matches.cumprod(1).sum(1), path=proposal.index.expand_as(predicted), tokens=predicted)
