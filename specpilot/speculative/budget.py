"""A step's verify rows shared by the requests in flight (`batch_budget`, issue 59's first mechanism), on the device.

Each request's tree is built at the system's `nodes`; the budget T of rows a batch step verifies in all then goes
to the likeliest nodes over all requests: every request keeps its root, and the other T - B rows are the nodes of
highest path log-probability (a node survives verification about as often as the drafter's probability of its
whole path). A best-first tree lists its rows in score order (`speculative/tree.best_paths`), so what a request
gets is a prefix of its rows: a tree again. The verify pass computes only those rows (core/contracts
Forward.packed); the others are marked never to be accepted. The reference rule with a cost model is
`speculative/allot.allot`; here T is fixed per captured step, so that the step is one graph. With `batch_rows=auto`
over such a tree every step also writes, for each budget on offer, the tokens it expects the batch to commit
(`expected_tokens`), from which the host picks the next step's budget (speculative/allot.TreeRowsChoice).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.core.contracts import DraftTree, Lattice, Proposal, chain
from specpilot.core.regions import region
from specpilot.speculative.proposal import ChainProposer, TreeProposer
from specpilot.speculative.tree import TreeBuilder, child_scores

NEVER = -1  # the token of a row outside the budget: no prediction equals it, so it is never accepted


def path_scores(tree: DraftTree, scores: torch.Tensor) -> torch.Tensor:
    """[B, N] float32: each row's summed child score (log p(child | parent)) along its root path, the root's 0.
    scores: child_scores(lattice, builder) [B, D, K, K]. Graph-safe: one gather, then D rounds of adding the
    parent's total (a node's depth is at most D)."""
    b, n = tree.parents.shape
    d, k = scores.shape[1], scores.shape[-1]
    parents = tree.parents.clamp(min=0)
    parent_cand = tree.cand.gather(1, parents)  # the root's candidate is 0: the anchor, depth 0's parent
    at = (tree.depth - 1).clamp(min=0) * k * k + parent_cand * k + tree.cand
    edge = torch.where(tree.depth == 0, 0.0, scores.reshape(b, -1).gather(1, at))
    total = edge
    for _ in range(d):
        total = edge + torch.where(tree.depth == 0, 0.0, total.gather(1, parents))
    return total


def chain_scores(lattice: Lattice, picks: torch.Tensor, own: bool = False) -> torch.Tensor:
    """[B, D + 1] float32: the drafter's chain's path scores (its rows: the anchor, then the candidates `picks`
    [B, D] of each depth), the summed log p(child | parent) down the chain (best_first's child scores). own: picks
    are the drafter's own greedy walk, which a drafter with a confidence head (DSpark) scores by it: the summed log
    of each draft's survival odds, the prefix-survival products DeepSpec's scheduler sorts by."""
    if own and lattice.confidence is not None:
        edge = lattice.confidence.float().clamp(min=1e-6).log()
        return torch.cat([edge.new_zeros(edge.shape[0], 1), edge.cumsum(1)], 1)
    scores = child_scores(lattice, "best_first")  # [B, D, K_parent, K_child]
    parent = torch.cat([torch.zeros_like(picks[:, :1]), picks[:, :-1]], 1)  # depth 0's parent: the anchor, row 0
    k = scores.shape[-1]
    flat = scores.reshape(*scores.shape[:2], k * k)
    edge = flat.gather(2, (parent * k + picks)[..., None])[..., 0]
    return torch.cat([edge.new_zeros(edge.shape[0], 1), edge.cumsum(1)], 1)


def allot_rows(scores: torch.Tensor, budget: int, live: torch.Tensor | None = None) -> torch.Tensor:
    """[B] int64: the rows each request verifies (its root included) when `budget` rows go to the roots and then
    the highest path scores [B, N] over all requests (rows in score order, non-increasing after the root); parked
    requests (live 0) keep their root alone where live requests can use the rows."""
    b, n = scores.shape
    if not b <= budget <= b * n:
        raise ValueError(f"a budget of {budget} rows for {b} requests of at most {n} rows each")
    rest = scores[:, 1:].float()
    if live is not None:
        rest = torch.where(live.bool()[:, None], rest, torch.finfo(rest.dtype).min)
    counts = torch.zeros(b, dtype=torch.int64, device=scores.device)
    if budget > b:
        top = rest.reshape(-1).topk(budget - b).indices
        counts.scatter_add_(0, top // (n - 1), torch.ones_like(top))
    return counts + 1


def packed_rows(counts: torch.Tensor, n: int, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(valid [B, N] bool: each request's first counts[b] rows; packed [budget]: their flat indices, ascending).
    Graph-safe: the indices come from a sort with a static count, no host read."""
    b = counts.shape[0]
    valid = torch.arange(n, device=counts.device)[None] < counts[:, None]
    flat = torch.arange(b * n, device=counts.device)
    order = (valid.reshape(-1).logical_not().to(torch.int64) * (b * n) + flat).argsort()
    return valid, order[:budget]


def expected_tokens(scores: torch.Tensor, offers: tuple[int, ...], live: torch.Tensor | None = None) -> torch.Tensor:
    """[len(offers)] float32: the tokens a step verifying each offered budget of rows (roots included) is expected to
    commit over the live requests: one each (the root's token) plus the survival probabilities exp(path score) of
    the nodes it verifies, the likeliest first (what allot_rows gives them). Graph-safe: static indices."""
    b, n = scores.shape
    if any(not b <= t <= b * n for t in offers):
        raise ValueError(f"budgets {offers} for {b} requests of at most {n} rows each")
    probs = scores[:, 1:].float().exp().clamp(max=1.0)
    alive = torch.ones(b, dtype=torch.bool, device=scores.device) if live is None else live.bool()
    top = torch.where(alive[:, None], probs, 0.0).reshape(-1).sort(descending=True).values.cumsum(0)
    extra = torch.stack([top[t - b - 1] if t > b else top.new_zeros(()) for t in offers])
    return alive.sum().float() + extra


@dataclass
class Expect:
    """Where a step writes expected_tokens for the budgets on offer (static: one per captured step)."""

    out: torch.Tensor  # [len(offers)] float32, shared by the steps of every budget and batch size
    offers: tuple[int, ...]


class BudgetProposer(TreeProposer):
    """A tree per request at the builder's nodes, then the batch's `budget` rows allotted (allot_rows): the rows
    outside it carry NEVER and the verify pass computes only the rows inside (Proposal.packed). budget 0: every
    row (the tree as built). expect: where the expected tokens of each budget on offer go (batch_rows=auto)."""

    def __init__(self, drafter, device, builder: TreeBuilder, budget: int, live: torch.Tensor | None,
                 expect: Expect | None = None):
        super().__init__(drafter, device, builder)
        if builder.builder not in ("best_first", "ddtree"):
            raise ValueError(f"a row budget needs rows in score order (best_first, ddtree), not {builder.builder}")
        self.budget, self.live, self.expect = budget, live, expect

    def propose(self, anchor: torch.Tensor, start: torch.Tensor) -> Proposal:
        lattice = self.lattice(anchor, start)
        with region("tree"):
            tree = self.builder(lattice)
            scores = path_scores(tree, child_scores(lattice, self.builder.builder))
            if self.expect is not None:
                self.expect.out.copy_(expected_tokens(scores, self.expect.offers, self.live))
        proposal = self.rows_of(lattice, tree, start)
        if not self.budget:
            return proposal
        return shared(proposal, scores, self.budget, self.live)


class ChainBudgetProposer(ChainProposer):
    """Stock's chain per request, then the batch's `budget` rows allotted by the chains' path scores (chain_scores):
    each request verifies a prefix of its chain, a draft block of its own chosen each step from the drafter's
    confidence, the likelier chains longer (issue 59's per-request draft block)."""

    def __init__(self, drafter, device, budget: int, live: torch.Tensor | None):
        super().__init__(drafter, device)
        self.budget, self.live = budget, live

    def propose(self, anchor: torch.Tensor, start: torch.Tensor) -> Proposal:
        lattice = self.lattice(anchor, start)
        with region("tree"):  # (the chain's build, as ChainProposer.drafts)
            picks = lattice.greedy_picks()
            drafts = lattice.tokens.gather(2, picks[..., None])[..., 0]
            scores = chain_scores(lattice, picks, own=True)
        return shared(chain(anchor, drafts, start, self.index, self.parents), scores, self.budget, self.live)


def shared(proposal: Proposal, scores: torch.Tensor, budget: int, live: torch.Tensor | None) -> Proposal:
    """The proposal with only its batch's `budget` likeliest rows computed (allot_rows), the others never accepted."""
    counts = allot_rows(scores, budget, live)
    valid, packed = packed_rows(counts, proposal.rows, budget)
    proposal.tokens = torch.where(valid, proposal.tokens, NEVER)
    proposal.packed = packed
    return proposal
