"""Two-level verification (`verify=tlv`): one exact target pass verifies two drafting rounds.

  context  as in every step (speculative/step.py);
  propose  the first round (the step's proposer: a chain or a tree);
  Q pass   the target over W12's 8-bit view (the pass's weight view, core/contracts.Forward; cheaper, inexact)
           and its greedy walk: the row the first round would most likely be accepted to, and the token after it;
  propose  the drafter, given the Q pass's features of that path as tentative context, drafts a second round
           whose anchor is that token;
  verify   one exact pass over both rounds as one tree: the second round hangs below the Q path's last row;
  accept   the exact greedy walk of that tree; commit as any tree step.
The Q pass accepts nothing: every committed token is the exact pass's argmax along a path of the tree, so the
outputs are those of exact verification (token forcing checks it). The drafter's tentative context is written
over by the next step's context (exact features of what was committed) before it is read again.
"""

from __future__ import annotations

import torch

from specpilot.core.contracts import Proposal, Verdict, Visibility
from specpilot.core.regions import region
from specpilot.speculative.accept import accept_greedy
from specpilot.speculative.step import SpecStep


class TwoLevelStep(SpecStep):
    """The step of the module docstring over the same caches and state as SpecStep; `rows` = the first round's
    rows (each round's), `path` = each round's longest path. The state's ctx_feats and out hold 2 * path rows."""

    def __init__(self, *args, rows: int, path: int, **kwargs):
        super().__init__(*args, **kwargs)
        dev = self.target.device
        self.index = torch.arange(2 * rows, device=dev)
        self.ctx_rows = torch.arange(2 * path, device=dev)  # a step commits up to both rounds' paths
        self.path_index = torch.arange(path, device=dev)
        self.tail = torch.arange(rows, device=dev)  # the second round's rows, numbered within it
        self.chain_seen = self.tail[:, None] >= self.tail[None, :]  # a chain's rows see themselves and before

    def propose(self, s) -> Proposal:
        """The step's pipeline (SpecStep.__call__) with two rounds proposed as one tree: the first round, the Q
        pass's walk of it, the second round drafted from where that walk ends."""
        first = super().propose(s)
        q_logits, q_feats = self.verify(first, view="8bit")
        with region("tree"):
            q = accept_greedy(first, q_logits)
        with region("drafter"):
            self.tentative_context(first, q, q_feats)
        second = self.proposer.propose(q.bonus, s.pos + q.accepted + 1)
        with region("tree"):
            return self.join(first, q, second)

    def tentative_context(self, first: Proposal, q: Verdict, q_feats: torch.Tensor) -> None:
        """The Q pass's features along its path (anchor included) as draft context for the second round."""
        feats = q_feats.gather(1, q.path[..., None].expand(-1, -1, q_feats.shape[2]))
        self.drafter.commit(feats, self.state.pos, q.accepted + 1, self.path_index, first.tokens.gather(1, q.path))

    def seen(self, p: Proposal) -> torch.Tensor:
        return p.visibility.tree if p.visibility.tree is not None else self.chain_seen.expand(p.tokens.shape[0], -1, -1)

    def join(self, first: Proposal, q: Verdict, second: Proposal) -> Proposal:
        """Both rounds as one tree: the second's anchor becomes a child of the Q path's last row, its rows sit
        at slots after the first's and see that path."""
        b, r1, r2 = first.tokens.shape[0], first.rows, second.rows
        seen1, seen2 = self.seen(first), self.seen(second)
        last = q.path.gather(1, q.accepted[:, None])  # [B, 1]: the Q path's last row
        lineage = seen1.gather(1, last[:, :, None].expand(-1, 1, r1))  # [B, 1, R1]: it and its ancestors
        top = torch.cat([seen1, seen1.new_zeros(b, r1, r2)], 2)
        bottom = torch.cat([lineage.expand(-1, r2, -1), seen2], 2)
        parents2 = torch.where(self.tail == 0, last, r1 + second.parents)
        start = self.state.pos
        return Proposal(tokens=torch.cat([first.tokens, second.tokens], 1),
                        positions=torch.cat([first.positions, second.positions], 1),
                        slots=torch.cat([first.slots, start[:, None] + r1 + self.tail], 1),
                        visibility=Visibility(cache_len=start, start=start, tree=torch.cat([top, bottom], 1)),
                        parents=torch.cat([first.parents, parents2], 1), index=self.index, chain=False,
                        path_rows=first.longest + second.longest)
