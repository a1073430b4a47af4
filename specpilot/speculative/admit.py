"""Prompt admission (issue 59's third batching mechanism, `admit=true`): a waiting request's prompt rides in the
batch's verify pass instead of a prefill pass of its own. The weights are read once a step for every row, so a
chunk of prompt in the pass of a step that reads them anyway costs its rows, not another pass over the weights.

A slot being prefilled is parked (its decode rows are junk past its prompt, runtime/batch.py), so its rows of the
verify layout [B, R] are free: they carry the next R tokens of its prompt, at consecutive positions and slots from
`first`, seeing the cached prompt before `first` and each other causally (a chain). Their keys and values land in
the cache where a prefill would put them; their taps go to the drafter's context (its `commit`, as a prefill's);
after the chunk that ends the prompt the slot's first token is the target's pick at its last row, and the slot
decodes from the next step. Each (batch size, sampling) has a step of its own with admission (a step without it
pays nothing: runtime/engine.admit_steps); the host fills `Admission` before the step runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from specpilot.core.contracts import Proposal, Visibility, chain_visibility


@dataclass
class Admission:
    """The prompt chunks a step carries, one per slot: tokens [B, R] (rows past count: unread), its first prompt
    index [B], its rows count [B] (0: the slot carries none), last [B] (1: the chunk ends the prompt)."""

    tokens: torch.Tensor
    first: torch.Tensor
    count: torch.Tensor
    last: torch.Tensor
    index: torch.Tensor  # [R]: 0 .. R - 1 (made once: a captured step allocates nothing)
    causal: torch.Tensor  # [R, R] bool: a chunk's rows see every earlier row of it

    @classmethod
    def zeros(cls, slots: int, rows: int, device) -> Admission:
        z = torch.zeros(slots, dtype=torch.int64, device=device)
        return cls(torch.zeros(slots, rows, dtype=torch.int64, device=device), z, z.clone(), z.clone(),
                   torch.arange(rows, device=device), chain_visibility(rows, device=device))

    def rows(self, n: int) -> Admission:
        """The first n slots (views)."""
        return Admission(self.tokens[:n], self.first[:n], self.count[:n], self.last[:n], self.index, self.causal)

    def set(self, chunks: dict[int, tuple[list[int], int, bool]]) -> None:
        """chunks: slot -> (its prompt tokens this step, their first prompt index, whether they end the prompt);
        every other slot carries none."""
        slots, rows = self.tokens.shape
        tokens = torch.zeros(slots, rows, dtype=torch.int64)
        first, count, last = (torch.zeros(slots, dtype=torch.int64) for _ in range(3))
        for slot, (ids, start, ends) in chunks.items():
            if not 1 <= len(ids) <= rows:
                raise ValueError(f"a chunk of {len(ids)} tokens for {rows} rows a slot")
            tokens[slot, : len(ids)] = torch.tensor(ids)
            first[slot], count[slot], last[slot] = start, len(ids), int(ends)
        for dst, src in ((self.tokens, tokens), (self.first, first), (self.count, count), (self.last, last)):
            dst.copy_(src)


def ride(proposal: Proposal, admission: Admission) -> Proposal:
    """The proposal with each carrying slot's rows replaced by its prompt chunk (graph-safe: masks, no host read)."""
    on, index = admission.count > 0, admission.index
    if proposal.rows != index.shape[0]:
        raise ValueError(f"chunks of {index.shape[0]} rows for a proposal of {proposal.rows}")
    at = admission.first[:, None] + index  # [B, R]: the chunk's positions, and its slots
    vis = proposal.visibility
    tree = vis.tree
    if tree is not None:  # a tree's rows see their ancestors; a chunk's, every earlier row of it
        tree = torch.where(on[:, None, None], admission.causal,
                           tree if tree.dim() == 3 else tree.expand(on.shape[0], -1, -1))
    visibility = Visibility(cache_len=torch.where(on, admission.first, vis.cache_len),
                            start=torch.where(on, admission.first, vis.start), tree=tree, window=vis.window)
    parents = proposal.parents
    if parents is not None:
        parents = torch.where(on[:, None], (index - 1).clamp(min=0), parents)
    return dataclasses.replace(proposal, tokens=torch.where(on[:, None], admission.tokens, proposal.tokens),
                               positions=torch.where(on[:, None], at, proposal.positions),
                               slots=torch.where(on[:, None], at, proposal.slots), visibility=visibility,
                               parents=parents)
