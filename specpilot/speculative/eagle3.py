"""EAGLE-3's drafter behind the drafter protocol (speculative/drafter.py): its own K/V cache of committed rows, and
a tree drafted depth by depth, handed to the step as a lattice whose edges are the tree's exact conditionals.

Row t pairs position t's features with the token at t + 1, so the last committed row waits (`pending`) until the
next anchor is known: `lattice` runs it first (its output's distribution is depth 0: the tokens after the anchor),
and the next `commit` writes it again with the same inputs. Depth e + 1's candidates come from expanding depth e's
`frontier` best nodes (the greedy node always among them, so the lattice's greedy walk is the drafter's own greedy
chain), each into its `width / frontier` likeliest children; an expansion row reads its parent row's output as h
and sees the context and its ancestors' rows (a dense mask over the cache: the rows lie in a scratch area past the
context's slots, rewritten each step).
"""

from __future__ import annotations

import copy

import torch

from specpilot.config.plan import KernelPlan
from specpilot.core.contracts import Lattice, Visibility
from specpilot.core.regions import region
from specpilot.errors import UserError
from specpilot.models.cache import Cache
from specpilot.models.eagle3 import Eagle3Drafter
from specpilot.weights import DenseWeight

NEG = -1e4  # log p of a candidate under a parent it is not the child of
# The release's drafting (SafeAILab/EAGLE's EaModel defaults: top_k 10, depth 6, total_token 60): each depth's 10
# likeliest nodes expanded into 10 children each, six depths, 60 nodes verified beside the anchor (chosen by path
# score: the eagle2 builder). An EAGLE-3 deployment's stock (tree=chain, nodes=0) is this tree.
RELEASE_TOP_K, RELEASE_DEPTH, RELEASE_NODES = 10, 6, 61


class Eagle3:
    def __init__(self, model: Eagle3Drafter, embed: DenseWeight, context: int, block: int, plan: KernelPlan,
                 slots: int = 1, width: int = RELEASE_TOP_K ** 2, frontier: int = RELEASE_TOP_K,
                 depth: int = RELEASE_DEPTH):
        """block: the rows of its chain (0: depth + 1); width: candidates per depth (at most the draft vocabulary:
        frontier nodes expanded times children each)."""
        self.block = block or depth + 1
        if self.block < 2:
            raise UserError(f"EAGLE-3 drafting: block {self.block} is below 2")
        vocab = model.cfg.draft_vocab
        self.children = min(width // frontier, max(vocab // 2, 1))  # a tiny vocabulary: still 2 nodes expanded
        self.frontier = min(frontier, vocab // self.children)
        self.model, self.embed, self.width = model, embed, self.frontier * self.children
        self.taps = tuple(model.cfg.taps)
        self.plan = plan.but(gemv=False)
        lc, device = model.cfg.layer, embed.weight.device
        if model.rope.length < context + self.block + 1:
            model.set_rope_length(context + self.block + 1, device=device)
        self.context = context  # committed rows' slots; the expansion rows' scratch area follows, then the trash slot
        self.area = (self.block - 2) * self.frontier
        length = context + self.area + 1
        dtype = model.fc.weight.dtype
        self.cache = Cache.build(["attention"], slots, length, lc.num_kv_heads, lc.head_dim, dtype, device)
        self.trash = length - 1
        self.pending = torch.zeros(slots, len(self.taps) * model.cfg.target_hidden, dtype=dtype, device=device)
        self.last: Lattice | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.pending.dtype

    def _tell(self, feats: torch.Tensor, first: torch.Tensor, count: torch.Tensor, rows: torch.Tensor,
              tokens: torch.Tensor, cache: Cache, pending: torch.Tensor) -> None:
        """Rows at positions first + rows [B, R] with their features [B, R, F] and own tokens [B, R], the first
        count [B] of them the request's: the context rows they complete (the pending row first, paired with row 0's
        token; a request's first rows, at position 0, have none before them), written at their positions; the last
        one's features become the pending row."""
        r = feats.shape[1]
        after = torch.cat([tokens[:, 1:], tokens[:, -1:]], 1)  # each row's next token (the last: unknown yet)
        fresh = (first == 0)[:, None]  # nothing pending: the rows pair with the tokens after them
        ctx = torch.where(fresh[..., None], feats, torch.cat([pending[:, None], feats[:, : r - 1]], 1).to(feats.dtype))
        pos = torch.where(fresh, first[:, None] + rows, first[:, None] - 1 + rows)
        valid = rows < torch.where(fresh[:, 0], count - 1, count)[:, None]
        h = self.model.fuse(ctx.to(self.dtype), self.plan)
        start = pos[:, 0]
        toks = torch.where(valid, torch.where(fresh, after, tokens), 0)  # rows past count hold anything (-1 too)
        self.model(self.embed.rows(toks).to(self.dtype), h, pos,
                   cache[0], torch.where(valid, pos, self.trash), Visibility(cache_len=start, start=start), self.plan)
        last = feats.gather(1, (count - 1).clamp(min=0)[:, None, None].expand(-1, 1, feats.shape[2]))[:, 0]
        pending.copy_(torch.where((count > 0)[:, None], last.to(self.dtype), pending))

    def prefill(self, hidden: torch.Tensor, first: int = 0, slot: int = 0, tokens: torch.Tensor | None = None
                ) -> None:
        if tokens is None:
            raise ValueError("EAGLE-3 pairs each position's features with the next token: prefill needs the tokens")
        n, device = hidden.shape[1], hidden.device
        self._tell(hidden, torch.tensor([first], device=device), torch.tensor([n], device=device),
                   torch.arange(n, device=device)[None], tokens, self.cache.rows(slot, slot + 1),
                   self.pending[slot : slot + 1])

    def commit(self, feats: torch.Tensor, first: torch.Tensor, count: torch.Tensor, rows: torch.Tensor,
               tokens: torch.Tensor | None = None) -> None:
        if tokens is None:
            raise ValueError("EAGLE-3 pairs each position's features with the next token: commit needs the tokens")
        rows = rows if rows.dim() == 2 else rows[None].expand(feats.shape[0], -1)
        self._tell(feats, first, count, rows, tokens, self.cache, self.pending)

    def lattice(self, anchor: torch.Tensor, start: torch.Tensor) -> Lattice:
        with region("drafter"):
            self.last = self._draft(anchor, start)
        return self.last

    def _draft(self, anchor: torch.Tensor, start: torch.Tensor) -> Lattice:
        m, plan, b, k, f, c = self.model, self.plan, anchor.shape[0], self.width, self.frontier, self.children
        prev = (start - 1).clamp(min=0)[:, None]
        h = m.fuse(self.pending[:, None], plan)
        out = m(self.embed.rows(anchor[:, None]).to(self.dtype), h, prev, self.cache[0], prev,
                Visibility(cache_len=prev[:, 0], start=prev[:, 0]), plan)  # [B, 1, H]: the pending row
        lp, ids = torch.log_softmax(m.logits(out[:, 0], plan), -1).topk(k, -1)  # depth 0, best first
        tokens, logp, parents = [m.target_ids(ids)], [lp], [torch.zeros_like(ids)]
        outs, cum = out.expand(-1, k, -1), lp  # each node's predicting row's output; its path's log p
        seen = torch.zeros(b, k, self.area, dtype=torch.bool, device=anchor.device)  # ancestors' scratch slots
        context = (torch.arange(self.context, device=anchor.device) < start[:, None])[:, None].expand(-1, f, -1)
        trash = context.new_zeros(b, f, 1)
        for e in range(self.block - 2):  # expand depth e into depth e + 1
            score = torch.cat([torch.full_like(cum[:, :1], float("inf")), cum[:, 1:]], 1)  # the greedy node first
            pick = score.topk(f, -1).indices  # [B, f]
            rows_h = outs.gather(1, pick[..., None].expand(-1, -1, outs.shape[2]))
            rows_t = tokens[-1].gather(1, pick)
            area = e * f + torch.arange(f, device=anchor.device)
            mine = seen.gather(1, pick[..., None].expand(-1, -1, seen.shape[2])).clone()
            mine[:, torch.arange(f, device=anchor.device), area] = True
            slots = (self.context + area)[None].expand(b, -1)
            pos = (start[:, None] + e).expand(-1, f)
            out = m.forward_masked(self.embed.rows(rows_t).to(self.dtype), rows_h, pos, self.cache[0], slots,
                                   torch.cat([context, mine, trash], 2), plan)  # [B, f, H]
            lp, ids = torch.log_softmax(m.logits(out, plan), -1).topk(c, -1)  # [B, f, c]
            tokens.append(m.target_ids(ids).reshape(b, k))
            logp.append(lp.reshape(b, k))
            parent = pick[..., None].expand(-1, -1, c).reshape(b, k)
            parents.append(parent)
            cum = cum.gather(1, parent) + logp[-1]
            outs = out[:, :, None].expand(-1, -1, c, -1).reshape(b, k, -1)
            seen = mine[:, :, None].expand(-1, -1, c, -1).reshape(b, k, -1)
        return self._as_lattice(anchor, torch.stack(tokens, 1), torch.stack(logp, 1), torch.stack(parents, 1))

    @staticmethod
    def _as_lattice(anchor, tokens, logp, parents) -> Lattice:
        """Depth 0's parent is the anchor (every row of edges alike); a deeper candidate is its one parent's child."""
        b, d, k = tokens.shape
        edges = torch.full((b, d, k, k), NEG, dtype=torch.float32, device=tokens.device)
        edges[:, 0] = logp[:, 0, None, :].float()
        edges[:, 1:].scatter_(2, parents[:, 1:, None, :], logp[:, 1:, None, :].float())
        return Lattice(tokens=tokens, unary=logp, logp=logp, edges=edges, anchor=anchor, exact=True)

    def live(self) -> list[torch.Tensor]:
        return [self.pending]

    def rows(self, first: int, last: int) -> Eagle3:
        view = copy.copy(self)
        view.cache, view.pending, view.last = self.cache.rows(first, last), self.pending[first:last], None
        return view

    def narrowed(self, block: int) -> Eagle3:
        """The same drafter and cache drafting a shorter chain (2..its block)."""
        if not 2 <= block <= self.block:
            raise ValueError(f"a narrowed block must be in 2..{self.block}, got {block}")
        view = copy.copy(self)
        view.block, view.last = block, None
        return view
