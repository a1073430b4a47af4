"""The drafter's lattice: top-K candidates per draft position, their scores, and edge scores.

Depth d (0-based) holds candidates for the token d+1 places after the anchor (the last committed
token). Edge scores are parent-conditioned when the drafter has a selector; otherwise every parent
shares the position's marginal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Lattice:
    tokens: torch.Tensor  # [B, D, K] candidate ids, best unary first
    unary: torch.Tensor  # [B, D, K] drafter logits of the candidates
    logp: torch.Tensor  # [B, D, K] full-vocabulary log-probabilities of the candidates (marginals)
    edges: torch.Tensor | None  # [B, D, K_parent, K_child] selector scores; depth 0's parent is the anchor
    anchor: torch.Tensor  # [B]

    @property
    def depth(self) -> int:
        return self.tokens.shape[1]

    @property
    def width(self) -> int:
        return self.tokens.shape[2]

    def edge_logp(self) -> torch.Tensor:
        """log p(child | parent) [B, D, K, K]: softmax over the K children of each parent."""
        if self.edges is None:
            return self.logp[:, :, None, :].expand(-1, -1, self.width, -1)
        return torch.log_softmax(self.edges.float(), dim=-1)

    def greedy_picks(self) -> torch.Tensor:
        """The candidate index [B, D] of the drafter's own greedy walk: argmax child of each chosen parent."""
        if self.edges is None:
            return torch.zeros(self.tokens.shape[:2], dtype=torch.int64, device=self.tokens.device)
        index = self.edges[:, 0, 0].argmax(-1)  # [B]
        picks = [index]
        for d in range(1, self.depth):
            rows = self.edges[:, d].gather(1, index[:, None, None].expand(-1, 1, self.width))[:, 0]
            index = rows.argmax(-1)
            picks.append(index)
        return torch.stack(picks, 1)

    def greedy_chain(self) -> torch.Tensor:
        """The drafter's own greedy walk [B, D] (stock)."""
        if self.edges is None:
            return self.tokens[..., 0]
        return self.tokens.gather(2, self.greedy_picks()[..., None])[..., 0]
