"""Acceptance of a verified proposal: the verdict.

Accept the longest path of drafts that equals the target's predicted tokens, plus one bonus token: its argmax
(greedy), or its sampled token (kernels/sample: the draws AR would make at the same positions, so that a sampled
run is AR's sampled run). On a chain the path is a prefix; in a tree, a node is accepted when its token is the
target's predicted token at its parent and its parent is accepted (siblings never share a token, so the
accepted nodes form one path from the root). Everything stays on the device (no host sync), so a step can run
inside a CUDA graph.
"""

from __future__ import annotations

import torch

from specpilot.core.contracts import Proposal, Verdict


def accept_greedy(proposal: Proposal, logits: torch.Tensor) -> Verdict:
    """logits [B, R, V] of the proposal's rows: the walk along the target's argmax."""
    return accept_predicted(proposal, logits.argmax(-1))


def accept_predicted(proposal: Proposal, predicted: torch.Tensor) -> Verdict:
    """predicted [B, R]: the target's token after each row (its argmax, or its sample: kernels/sample). On a
    chain the accepted drafts equal the predicted tokens by definition, so the committed tokens are those of rows
    0..accepted (the last is the bonus)."""
    if not proposal.chain:
        return accept_tree(proposal, predicted)
    matches = (proposal.drafts == predicted[:, :-1]).to(torch.int64)
    return Verdict(accepted=matches.cumprod(1).sum(1), path=proposal.index.expand_as(predicted), tokens=predicted)


def accept_tree(proposal: Proposal, predicted: torch.Tensor) -> Verdict:
    """The walk from the root along the predicted tokens, as tensor ops over all rows at once: a row is on the
    accepted path iff every row it sees (itself and its ancestors) drafted its parent's predicted token."""
    drafted_right = proposal.tokens == predicted.gather(1, proposal.parents.clamp(min=0))
    drafted_right[:, 0] = True  # the root is committed already
    seen = proposal.visibility.tree  # [B, R, R]: ancestors and self
    depth = proposal.positions - proposal.positions[:, :1]
    p = proposal.longest
    # a row deeper than the longest path is never on it: a tree's rows never are, but a slot carrying a prompt chunk
    # (speculative/admit.ride) has a chain of R rows in the tree's layout, R (nodes) past p (the drafter's block),
    # whose prompt tokens may all match the target's picks; its verdict is unused (SpecStep.kept), but must stay
    # within the p columns of path and tokens (a deeper row put its ancestors past them: an out-of-range scatter)
    on_path = ~(seen & ~drafted_right[:, None, :]).any(-1) & (depth < p)  # [B, R]
    accepted, deepest = torch.where(on_path, depth, -1).max(1)
    # the deepest accepted row's ancestors, each put at its depth (the others into a column that is dropped)
    lineage = seen.gather(1, deepest[:, None, None].expand(-1, 1, seen.shape[2]))[:, 0]
    spot = torch.where(lineage, depth, p)
    path = torch.zeros(predicted.shape[0], p + 1, dtype=torch.int64, device=predicted.device)
    path.scatter_(1, spot, proposal.index.expand_as(spot))
    path = path[:, :p]
    return Verdict(accepted=accepted, path=path, tokens=predicted.gather(1, path))
