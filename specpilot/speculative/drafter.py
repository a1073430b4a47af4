"""What a speculative step asks of a drafter, and DFlash's block drafter as its first kind.

A drafter proposes a lattice (top-K candidates per draft position) from an anchor token at a position, keeps its
own state (DFlash: a K/V cache of projected target features), and is told what was committed. Every method but
`prefill` runs on the device without a host sync, so a step that calls it can be captured as one CUDA graph. The
step turns the lattice into a chain or a tree (speculative/proposal.py), so every tree builder works over every
drafter.
"""

from __future__ import annotations

import copy
from typing import Protocol

import torch

from specpilot.config.plan import KernelPlan
from specpilot.core.contracts import Lattice
from specpilot.core.regions import region
from specpilot.errors import UserError
from specpilot.models.dflash import DFlashDrafter
from specpilot.weights import DenseWeight

TOP_K = 16  # candidates per draft position when the drafter has no selector of its own


class Drafter(Protocol):
    """taps: the target layers whose hidden states it conditions on (the verify pass returns them); block: the rows
    of its chain, the anchor and block - 1 drafts; width: candidates per position of its lattice; plan: the kernel
    plan it runs under; last: the lattice of its latest `lattice` call (graph-static when captured)."""

    taps: tuple[int, ...]
    block: int
    width: int
    plan: KernelPlan
    last: Lattice | None

    def prefill(self, hidden: torch.Tensor, first: int = 0, slot: int = 0, tokens: torch.Tensor | None = None
                ) -> None:
        """A request's prompt, or its chunk at prompt positions first..: the target's taps over it [1, n, F], for
        the request in cache row `slot`; tokens [1, n]: the chunk's own tokens (a drafter that pairs a position's
        features with the token after it, EAGLE-3's, reads them)."""

    def commit(self, feats: torch.Tensor, first: torch.Tensor, count: torch.Tensor, rows: torch.Tensor,
               tokens: torch.Tensor | None = None) -> None:
        """Rows at positions first + rows [B, len(rows)] with their taps feats [B, len(rows), F] and their own
        tokens [B, len(rows)]: the first count [B] of them are the request's (committed or tentatively so); the
        rest are to be ignored."""

    def lattice(self, anchor: torch.Tensor, start: torch.Tensor) -> Lattice:
        """The lattice after anchor [B] at position start [B]."""

    def live(self) -> list[torch.Tensor]:
        """The tensors besides its caches that a step reads (a timing snapshot keeps them)."""

    def rows(self, first: int, last: int) -> Drafter:
        """The same drafter over its cache rows first..last-1 (views: a batch step over fewer slots)."""


class DFlash:
    """DFlash's block drafter: one pass of its layers over [anchor, mask...] attending to the projected target
    features of every committed position (its cache, one slot past the context absorbing rows not valid this
    step), then its lattice: top-K per position, with edge scores from its selector when it has one (DFlash2). A
    DSpark model (models/dflash.py) runs here too: its anchor drafts as well, so its block of inputs is one shorter
    than its chain, and its Markov head makes the edges."""

    def __init__(self, model: DFlashDrafter, embed: DenseWeight, head: DenseWeight, context: int, block: int,
                 plan: KernelPlan, vocab: int, slots: int = 1):
        own = model.cfg.rows
        if block and not 2 <= block <= own:
            raise UserError(f"block_size={block} is outside 2..{own} (the drafter's own block size)")
        self.model, self.embed, self.head = model, embed, head
        self.block = block or own
        self.lead = 0 if model.cfg.anchor_drafts else 1  # slots before the first draft (DFlash: the anchor's)
        self.width = min(model.selector.top_k if model.selector is not None else TOP_K, vocab)
        self.taps = tuple(model.cfg.target_layer_ids)
        self.plan = plan.but(gemv=False)  # the drafter's block rows are never a few-row stream
        device = embed.weight.device
        if model.rope.length < context + 1:
            model.set_rope_length(context + 1, device=device)
        self.cache = model.new_cache(slots, context + 1)
        self.trash = context  # the cache's last slot
        self.masks = torch.full((1, self.block - 2 + self.lead), model.cfg.mask_token_id, dtype=torch.int64,
                                device=device)
        self.last: Lattice | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.cache[0].k.dtype

    def prefill(self, hidden: torch.Tensor, first: int = 0, slot: int = 0, tokens: torch.Tensor | None = None
                ) -> None:
        pos = first + torch.arange(hidden.shape[1], device=hidden.device)[None]
        self.model.write_context(hidden.to(self.dtype), pos, pos, self.cache.rows(slot, slot + 1), self.plan)

    def commit(self, feats: torch.Tensor, first: torch.Tensor, count: torch.Tensor, rows: torch.Tensor,
               tokens: torch.Tensor | None = None) -> None:
        pos = (first[:, None] + rows).clamp(min=0)
        slots = torch.where(rows < count[:, None], pos, self.trash)
        self.model.write_context(feats, pos, slots, self.cache, self.plan)

    def lattice(self, anchor: torch.Tensor, start: torch.Tensor) -> Lattice:
        with region("drafter"):
            block_in = torch.cat([anchor[:, None], self.masks.expand(anchor.shape[0], -1)], 1)
            hidden = self.model.draft_block(self.embed, block_in, start, self.cache, self.plan)
            self.last = self.model.lattice(hidden, self.head, anchor, self.width, self.plan)
        return self.last

    def live(self) -> list[torch.Tensor]:
        return []

    def rows(self, first: int, last: int) -> DFlash:
        view = copy.copy(self)
        view.cache, view.last = self.cache.rows(first, last), None
        return view

    def narrowed(self, block: int) -> DFlash:
        """The same drafter and cache drafting a shorter block (2..its block): a shorter chain's drafts."""
        if not 2 <= block <= self.block:
            raise ValueError(f"a narrowed block must be in 2..{self.block}, got {block}")
        view = copy.copy(self)
        view.block, view.masks, view.last = block, self.masks[:, : block - 2 + self.lead], None
        return view
