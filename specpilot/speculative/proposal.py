"""What a step proposes for the target to verify, and the stock proposer that makes it.

A Proposal is R rows per sequence: row 0 is the anchor (the last committed token, whose logits the bonus
comes from), rows 1.. the drafted tokens. Each row has a position, a cache slot for its K/V, a parent row
and, in `visibility`, the slots it may attend to. A chain is the case where row r's parent is r - 1 and
slot = position: any accepted path is then a prefix already in place in every cache. A tree's rows sit at
slots start + r but at positions start + depth, and see their ancestors (speculative/tree.py builds them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.config.plan import KernelPlan
from specpilot.models.cache import Cache
from specpilot.models.dflash import DFlashDrafter
from specpilot.runtime.regions import region
from specpilot.speculative.lattice import Lattice
from specpilot.speculative.tree import TreeBuilder
from specpilot.speculative.visibility import Visibility
from specpilot.weights import DenseWeight


@dataclass
class Proposal:
    tokens: torch.Tensor  # [B, R] int64: the anchor, then the drafted tokens
    positions: torch.Tensor  # [B, R] int64
    slots: torch.Tensor  # [B, R] int64: where each row's K/V is written
    visibility: Visibility  # committed slots < cache_len for every row, new rows as `tree` says
    parents: torch.Tensor  # [B, R] int64: each row's parent row (the anchor's: -1 in a chain, 0 in a tree)
    index: torch.Tensor  # [R] int64: 0 .. R - 1 (made once per engine: a captured step allocates nothing)
    chain: bool  # static: parents are r - 1 and slots are positions (accepted paths are prefixes, in place)
    path_rows: int = 0  # static: the longest path (0: all R rows, a chain)

    @property
    def rows(self) -> int:
        return self.tokens.shape[1]

    @property
    def longest(self) -> int:
        return self.path_rows or self.rows

    @property
    def drafts(self) -> torch.Tensor:
        """[B, R - 1]: the drafted tokens."""
        return self.tokens[:, 1:]


def chain(anchor: torch.Tensor, drafts: torch.Tensor, start: torch.Tensor, index: torch.Tensor,
          parents: torch.Tensor) -> Proposal:
    """The chain [anchor, drafts...] at positions start, start + 1, ...: anchor, start [B]; drafts [B, R - 1];
    index arange(R) and parents index - 1 ([1, R]), made once by the caller."""
    positions = start[:, None] + index
    return Proposal(tokens=torch.cat([anchor[:, None], drafts], 1), positions=positions, slots=positions,
                    visibility=Visibility(cache_len=start, start=start), parents=parents.expand_as(positions),
                    index=index, chain=True)


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
