"""The plain types every layer of the engine shares: what a forward is asked to do, what a drafter proposes, and
what verification decides. Tensors and static sizes only; no module, no kernel, no policy.

  Visibility   which cache slots each new row attends to (the compact form every attention path takes; dense()
               is the reference mask the kernels are checked against);
  Forward      a forward's metadata: positions, cache slots, visibility, the tree's parent rows, the weight view;
  Lattice      a drafter's top-K candidates per draft position, their scores and edge scores;
  DraftTree    N rows per sequence over a lattice (row 0 the anchor), each after its parent;
  Proposal     the rows a step asks the target to verify (a chain or a tree), with their slots and visibility;
  Verdict      what acceptance kept: the accepted count, the path's rows and the tokens to commit;
  Sampling     how a request's tokens are drawn (temperature, top_p, top_k, seed);
  Prompted     one request to an engine: its prompt tokens, its token budget, stop tokens and sampling;
  Generation   what the engine made of it: the output tokens, times, tokens committed per target pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

VIEWS = ("exact", "8bit")  # the weights a forward reads: the model's own, or W12's 8-bit view (lossy, never committed)


@dataclass
class Visibility:
    cache_len: torch.Tensor  # [B] int64
    start: torch.Tensor  # [B] int64
    tree: torch.Tensor | None = None  # [T, T] or per sequence [B, T, T] bool: row t sees new row u iff tree[t, u];
    # None = causal
    window: int | None = None  # sliding window: row at position start+t sees slot s iff |start+t-s| < window
    # what an attention path derived from it once, for every layer of the forward to reuse (kernels/attention/live.py)
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    def dense(self, rows: int, length: int) -> torch.Tensor:
        tree = self.tree if self.tree is not None else chain_visibility(rows, device=self.start.device)
        mask = verify_mask(self.cache_len, self.start, tree, length)
        if self.window:
            slots = torch.arange(length, device=self.start.device)
            pos = self.start[:, None, None] + torch.arange(rows, device=self.start.device)[None, :, None]
            mask &= (pos - slots[None, None, :]).abs() < self.window
        return mask


def verify_mask(cache_len: torch.Tensor, start: torch.Tensor, visibility: torch.Tensor,
                length: int) -> torch.Tensor:
    """Rows at slots start..start+N-1 see every committed slot < cache_len, and the new rows that
    visibility [N, N] allows (a chain: lower triangle; a tree: each node's ancestors and itself).
    cache_len, start: [B]; visibility [N, N] or per sequence [B, N, N]. Returns [B, N, length]; built on the
    device without host syncs."""
    n = visibility.shape[-1]
    slots = torch.arange(length, device=start.device)
    rel = slots[None, :] - start[:, None]  # [B, L]
    inside = (rel >= 0) & (rel < n)
    per_seq = visibility if visibility.dim() == 3 else visibility.expand(start.shape[0], n, n)
    tree = per_seq.gather(2, rel.clamp(0, n - 1)[:, None, :].expand(-1, n, -1))  # [B, N, L]
    committed = slots[None, None, :] < cache_len[:, None, None]
    return committed | (tree & inside[:, None, :])


def chain_visibility(n: int, device=None) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


@dataclass
class Forward:
    """What one target forward is asked to do beyond its tokens [B, T]: the rows' positions [B, T], the cache slots
    their K/V (or state) go to [B, T], what each row sees, each row's parent row [B, T] (a tree's; None: a chain,
    row r after r - 1) and the weights it reads (`VIEWS`)."""

    positions: torch.Tensor
    slots: torch.Tensor
    visibility: Visibility
    parents: torch.Tensor | None = None
    view: str = "exact"
    # the rows computed, as flat indices into [B, T] (ascending; a static count): the projections and MLPs run on
    # these rows alone, packed as [1, len(packed)], and each attention or recurrent core on the padded [B, T] layout
    # (a shared row budget: rows outside it are never accepted). None: every row
    packed: torch.Tensor | None = None
    # what the layers derive from the rows' shape alone (a tree's paths, a conv's windows), made by the first layer
    # that needs it and shared by the others: one computation a forward, not one a layer
    derived: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        if self.view not in VIEWS:
            raise ValueError(f"weight view {self.view!r} is not one of {VIEWS}")

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """Packed rows [1, P, ...] -> the padded [B, T, ...] layout (zeros where no row was computed)."""
        b, t = self.positions.shape
        out = x.new_zeros(b * t, *x.shape[2:])
        return out.index_copy_(0, self.packed, x[0]).view(b, t, *x.shape[2:])

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """The padded [B, T, ...] layout -> the packed rows [1, P, ...]."""
        return x.reshape(-1, *x.shape[2:]).index_select(0, self.packed)[None]

    @classmethod
    def consecutive(cls, positions: torch.Tensor, view: str = "exact") -> Forward:
        """Rows at consecutive positions (a prompt, a decode row) whose K/V go to slot == position and which see
        every earlier slot."""
        return cls(positions, positions, Visibility(cache_len=positions[:, 0], start=positions[:, 0]), view=view)


@dataclass
class Lattice:
    tokens: torch.Tensor  # [B, D, K] candidate ids, best unary first
    unary: torch.Tensor  # [B, D, K] drafter logits of the candidates
    logp: torch.Tensor  # [B, D, K] full-vocabulary log-probabilities of the candidates (marginals)
    edges: torch.Tensor | None  # [B, D, K_parent, K_child] selector scores; depth 0's parent is the anchor
    anchor: torch.Tensor  # [B]
    confidence: torch.Tensor | None = None  # [B, D] P(greedy draft d survives | d-1 did): DSpark's confidence head
    # edges are exact log p(child | parent), -inf-like where a candidate is not that parent's child: a drafter that
    # drafts a tree (EAGLE-3: each candidate has one parent), not scores to renormalize over a depth's candidates
    exact: bool = False

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
        if self.exact:
            return self.edges.float()
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


@dataclass
class DraftTree:
    """N rows per sequence, [B, N] each (row 0 the root: parent 0, depth 0, candidate 0, the anchor token)."""

    parents: torch.Tensor
    depth: torch.Tensor
    cand: torch.Tensor
    tokens: torch.Tensor
    seen: torch.Tensor | None = None  # the ancestor matrix where the builder made it (the kernels; Sequoia)

    @property
    def rows(self) -> int:
        return self.parents.shape[1]

    def ancestors(self, max_depth: int) -> torch.Tensor:
        """[B, N, N] bool: row t sees row u iff u is t or one of its ancestors (the tree's visibility)."""
        if self.seen is not None:
            return self.seen
        b, n = self.parents.shape
        seen = torch.eye(n, dtype=torch.bool, device=self.parents.device).expand(b, n, n).clone()
        step = torch.nn.functional.one_hot(self.parents, n).bool()  # [B, N, N]: each row's parent
        for _ in range(max_depth):  # fold in one more generation per round (no host read of the depth)
            seen |= step
            step = step.gather(1, self.parents[..., None].expand(-1, -1, n))  # the parent's own parent row
        return seen


@dataclass
class Proposal:
    """R rows per sequence: row 0 the anchor (the last committed token, whose logits give the bonus), rows 1.. the
    drafted tokens. A chain is the case where row r's parent is r - 1 and slot = position: any accepted path is then
    a prefix already in place in every cache. A tree's rows sit at slots start + r but at positions start + depth,
    and see their ancestors."""

    tokens: torch.Tensor  # [B, R] int64: the anchor, then the drafted tokens
    positions: torch.Tensor  # [B, R] int64
    slots: torch.Tensor  # [B, R] int64: where each row's K/V is written
    visibility: Visibility  # committed slots < cache_len for every row, new rows as `tree` says
    parents: torch.Tensor  # [B, R] int64: each row's parent row (the anchor's: -1 in a chain, 0 in a tree)
    index: torch.Tensor  # [R] int64: 0 .. R - 1 (made once per engine: a captured step allocates nothing)
    chain: bool  # static: parents are r - 1 and slots are positions (accepted paths are prefixes, in place)
    path_rows: int = 0  # static: the longest path (0: all R rows, a chain)
    packed: torch.Tensor | None = None  # the rows the verify pass computes (Forward.packed; None: all)

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

    def forward(self, view: str = "exact") -> Forward:
        """The verify pass's metadata (a chain's parents are implied: None)."""
        return Forward(self.positions, self.slots, self.visibility, None if self.chain else self.parents, view,
                       packed=self.packed)


def chain(anchor: torch.Tensor, drafts: torch.Tensor, start: torch.Tensor, index: torch.Tensor,
          parents: torch.Tensor) -> Proposal:
    """The chain [anchor, drafts...] at positions start, start + 1, ...: anchor, start [B]; drafts [B, R - 1];
    index arange(R) and parents index - 1 ([1, R]), made once by the caller."""
    positions = start[:, None] + index
    return Proposal(tokens=torch.cat([anchor[:, None], drafts], 1), positions=positions, slots=positions,
                    visibility=Visibility(cache_len=start, start=start), parents=parents.expand_as(positions),
                    index=index, chain=True)


@dataclass
class Verdict:
    accepted: torch.Tensor  # [B] int64: drafted tokens accepted (0 .. P - 1)
    path: torch.Tensor  # [B, P] int64: the accepted path's rows, the anchor first (entries past accepted: padding)
    tokens: torch.Tensor  # [B, P] int64: the target's argmax along the path; 0..accepted are committed
    # P: the longest path a proposal can hold (a chain's rows; a tree's depth + 1)

    @property
    def bonus(self) -> torch.Tensor:
        """[B]: the last committed token (the target's own, after the accepted drafts)."""
        return self.tokens.gather(1, self.accepted[:, None])[:, 0]


@dataclass(frozen=True)
class Sampling:
    """How a request's tokens are drawn (kernels/sample): temperature 0 is greedy; top_k 0 keeps every token;
    top_p 1 keeps the whole distribution; the seed fixes the draws (the same seed, the same output)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be at least 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be at least 0, got {self.top_k}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be in 0..2**32 - 1, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Prompted:
    """One request to an engine (Engine.generate takes a list): greedy decoding of up to max_new_tokens after
    prompt, cut after the first stop token."""

    prompt: list[int]
    max_new_tokens: int
    stop_ids: tuple[int, ...] = ()
    sampling: Sampling | None = None  # None: greedy

    @property
    def samples(self) -> bool:
        return self.sampling is not None and not self.sampling.greedy

    def cut(self, tokens: list[int]) -> list[int]:
        """tokens up to and including the first stop token, at most max_new_tokens (a step may commit past
        either)."""
        for i, t in enumerate(tokens[: self.max_new_tokens]):
            if t in self.stop_ids:
                return tokens[: i + 1]
        return tokens[: self.max_new_tokens]


@dataclass
class Generation:
    tokens: list[int]  # output tokens (the prompt excluded), cut at a stop token or max_new_tokens
    prefill_s: float
    decode_s: float  # from the first token (given by prefill) to the last
    accepted: list[int] = field(default_factory=list)  # tokens committed by each decode target pass

    @property
    def decode_tokens(self) -> int:
        return max(len(self.tokens) - 1, 0)
