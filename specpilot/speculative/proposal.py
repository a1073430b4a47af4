"""The proposers: what a step asks the target to verify (a core/contracts.Proposal), made from a drafter's
lattice. Stock's chain is the drafter's own greedy walk; a tree builder's rows (speculative/tree.py) sit at slots
start + r but at positions start + depth, and see their ancestors.
"""

from __future__ import annotations

import torch

from specpilot.core.contracts import DraftTree, Lattice, Proposal, Visibility, chain
from specpilot.core.regions import region
from specpilot.speculative.drafter import Drafter
from specpilot.speculative.tree import TreeBuilder


class ChainProposer:
    """Stock drafting: the drafter's lattice (speculative/drafter.py), then its own greedy walk of it (DFlash2:
    through the selector's edges), [B, block - 1]."""

    def __init__(self, drafter: Drafter, device):
        self.drafter = drafter
        self.index = torch.arange(drafter.block, device=device)
        self.parents = (self.index - 1)[None]

    @property
    def last(self) -> Lattice | None:
        """The step's lattice (graph-static when captured), for recording runs."""
        return self.drafter.last

    def lattice(self, anchor: torch.Tensor, start: torch.Tensor) -> Lattice:
        return self.drafter.lattice(anchor, start)

    def drafts(self, anchor: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        lattice = self.lattice(anchor, start)
        with region("tree"):  # the chain's build: the drafter's greedy walk of its lattice (like a tree's build)
            return lattice.greedy_chain()

    def propose(self, anchor: torch.Tensor, start: torch.Tensor) -> Proposal:
        return chain(anchor, self.drafts(anchor, start), start, self.index, self.parents)


class TreeProposer(ChainProposer):
    """A tree over the same lattice (the `tree` option): rows at slots start + r, positions start + depth, each
    seeing its ancestors."""

    def __init__(self, drafter: Drafter, device, builder: TreeBuilder):
        super().__init__(drafter, device)
        self.builder = builder
        self.rows = torch.arange(builder.rows, device=device)

    def propose(self, anchor: torch.Tensor, start: torch.Tensor) -> Proposal:
        lattice = self.lattice(anchor, start)
        with region("tree"):
            tree = self.builder(lattice)
        return self.rows_of(lattice, tree, start)

    def rows_of(self, lattice: Lattice, tree: DraftTree, start: torch.Tensor) -> Proposal:
        """The verify rows of a tree built on `lattice`, after position `start`."""
        with region("tree"):
            seen = tree.ancestors(lattice.depth)
        return Proposal(tokens=tree.tokens, positions=start[:, None] + tree.depth, slots=start[:, None] + self.rows,
                        visibility=Visibility(cache_len=start, start=start, tree=seen), parents=tree.parents,
                        index=self.rows, chain=False, path_rows=lattice.depth + 1)
