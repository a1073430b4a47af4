"""What a step proposes for the target to verify, and the stock proposer that makes it.

A Proposal is R rows per sequence: row 0 is the anchor (the last committed token, whose logits the bonus
comes from), rows 1.. the drafted tokens. Each row has a position, a cache slot for its K/V, a parent row
and, in `visibility`, the slots it may attend to. A chain is the case where row r's parent is r - 1 and
slot = position: any accepted path is then a prefix already in place in every cache. A tree's rows sit at
slots start + r but at positions start + depth, and see their ancestors (speculative/tree.py builds them).
"""

from __future__ import annotations

import torch

from specpilot.config.plan import KernelPlan
from specpilot.core.contracts import Lattice, Proposal, Visibility, chain
from specpilot.core.regions import region
from specpilot.models.cache import Cache
from specpilot.models.dflash import DFlashDrafter
from specpilot.speculative.tree import TreeBuilder
from specpilot.weights import DenseWeight

TOP_K = 16  # candidates per draft position when the drafter has no selector of its own


class ChainProposer:
    """Stock drafting: one pass of the block drafter conditioned on the target's features, then the
    drafter's own greedy walk of its lattice (DFlash2: through the selector's edges), [B, block - 1]."""

    def __init__(self, drafter: DFlashDrafter, embed: DenseWeight, head: DenseWeight, block: int, plan: KernelPlan,
                 device, top_k: int = TOP_K):
        self.drafter, self.embed, self.head, self.plan, self.top_k = drafter, embed, head, plan, top_k
        self.masks = torch.full((1, block - 1), drafter.cfg.mask_token_id, dtype=torch.int64, device=device)
        self.index = torch.arange(block, device=device)
        self.parents = (self.index - 1)[None]
        self.last: Lattice | None = None  # the step's lattice (graph-static when captured), for recording runs

    def lattice(self, anchor: torch.Tensor, start: torch.Tensor, cache: Cache) -> Lattice:
        with region("drafter"):
            block_in = torch.cat([anchor[:, None], self.masks.expand(anchor.shape[0], -1)], 1)
            hidden = self.drafter.draft_block(self.embed, block_in, start, cache, self.plan)
            self.last = self.drafter.lattice(hidden, self.head, anchor, self.top_k, self.plan)
        return self.last

    def drafts(self, anchor: torch.Tensor, start: torch.Tensor, cache: Cache) -> torch.Tensor:
        lattice = self.lattice(anchor, start, cache)
        with region("tree"):  # the chain's build: the drafter's greedy walk of its lattice (like a tree's build)
            return lattice.greedy_chain()

    def propose(self, anchor: torch.Tensor, start: torch.Tensor, cache: Cache) -> Proposal:
        return chain(anchor, self.drafts(anchor, start, cache), start, self.index, self.parents)


class TreeProposer(ChainProposer):
    """A tree over the same lattice (the `tree` option): rows at slots start + r, positions start + depth, each
    seeing its ancestors."""

    def __init__(self, drafter: DFlashDrafter, embed: DenseWeight, head: DenseWeight, block: int, plan: KernelPlan,
                 device, builder: TreeBuilder, top_k: int = TOP_K):
        super().__init__(drafter, embed, head, block, plan, device, top_k)
        self.builder = builder
        self.rows = torch.arange(builder.rows, device=device)

    def propose(self, anchor: torch.Tensor, start: torch.Tensor, cache: Cache) -> Proposal:
        lattice = self.lattice(anchor, start, cache)
        with region("tree"):
            tree = self.builder(lattice)
            seen = tree.ancestors(lattice.depth)
        return Proposal(tokens=tree.tokens, positions=start[:, None] + tree.depth, slots=start[:, None] + self.rows,
                        visibility=Visibility(cache_len=start, start=start, tree=seen), parents=tree.parents,
                        index=self.rows, chain=False, path_rows=lattice.depth + 1)
