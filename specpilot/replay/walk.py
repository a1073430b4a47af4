"""Replaying recorded lattices: the tokens each step would have committed under any tree builder and node
budget, the best any tree over the lattice allows (tau_best), and Sequoia's acceptance by rank.

A step's tree is built from its recorded lattice by the engine's own builders (speculative/tree.py) and walked
along the recorded output: a node is accepted when its token is the output's token at its depth and its parent
is accepted, exactly the engine's acceptance, since the target's argmax at every accepted node is the output's
next token. The steps are those of the recorded run (its anchors): for the recorded system the replay equals the
live run step by step; for another builder it is the tokens that builder would commit at the same anchors.
"""

from __future__ import annotations

import torch

from specpilot.core.contracts import DraftTree
from specpilot.replay.record import TurnLattices
from specpilot.speculative.tree import TreeBuilder, child_scores


def walk(tree: DraftTree, continuation: torch.Tensor, remaining: torch.Tensor) -> torch.Tensor:
    """[S]: tokens each step commits (accepted drafts + the bonus, at most what the output still holds)."""
    depth = tree.depth
    want = continuation.gather(1, (depth - 1).clamp(min=0))
    match = (tree.tokens == want) | (depth == 0)
    seen = tree.ancestors(continuation.shape[1])
    on_path = ~(seen & ~match[:, None, :]).any(-1)
    accepted = torch.where(on_path, depth, -1).max(1).values
    return torch.minimum(accepted + 1, remaining.to(accepted.device))


def committed(turn: TurnLattices, builder: TreeBuilder, device=None) -> torch.Tensor:
    lattice = turn.lattice(device)
    cont = turn.continuation(lattice.depth).to(lattice.tokens.device)
    return walk(builder(lattice), cont, turn.remaining()).cpu()


def best(turn: TurnLattices, nodes: int | None = None) -> torch.Tensor:
    """[S]: tau_best per step: the longest prefix of the output found among each depth's top-K (any tree holding
    that path accepts it), within `nodes` rows if given."""
    depth = turn.tokens.shape[1]
    hit = (turn.tokens == turn.continuation(depth)[..., None]).any(-1)
    accepted = hit.long().cumprod(1).sum(1)
    if nodes is not None:
        accepted = accepted.clamp(max=nodes - 1)
    return torch.minimum(accepted + 1, turn.remaining())


def rank_hits(turn: TurnLattices, width: int) -> tuple[torch.Tensor, int]:
    """Sequoia's acceptance by rank: along the output's path through the lattice, how often the output's token is
    its parent's r-th best child (by conditional score), and how many parents were reached."""
    lattice = turn.lattice()
    depth = lattice.depth
    cont = turn.continuation(depth)
    where = lattice.tokens == cont[..., None]  # [S, D, K]
    found = where.any(-1)
    idx = where.long().argmax(-1)  # the output token's candidate index where found
    reached = torch.cat([torch.ones_like(found[:, :1]), found[:, :-1].long().cumprod(1).bool()], 1)
    reached &= cont >= 0
    parent = torch.cat([torch.zeros_like(idx[:, :1]), idx[:, :-1]], 1)
    scores = child_scores(lattice, "best_first")  # [S, D, K, K]
    row = scores.gather(2, parent[:, :, None, None].expand(-1, -1, 1, scores.shape[-1]))[:, :, 0]  # [S, D, K]
    mine = row.gather(2, idx[..., None])  # the output token's score
    rank = (row > mine).sum(-1)  # better siblings
    counted = reached & found
    hits = torch.bincount(rank[counted], minlength=width)[:width]
    return hits, int(reached.sum())


def accept_profile(turns: list[TurnLattices]) -> list[float]:
    """Sequoia's acceptance by rank over every recorded step: hits at each rank over the parents reached."""
    width = turns[0].tokens.shape[2]
    hits, reached = torch.zeros(width, dtype=torch.int64), 0
    for t in turns:
        h, r = rank_hits(t, width)
        hits, reached = hits + h, reached + r
    return [round(float(h) / max(reached, 1), 4) for h in hits]


def replay(turns: list[TurnLattices], systems: list[tuple[str, int]], k: int = 4,
           accept: tuple[float, ...] = (), device=None) -> dict:
    """tau per (builder, nodes), tau_best per node budget and unbounded, the live tau and Sequoia's profile;
    tau: the mean over turns of each turn's tokens per step, as `bench` reports it."""
    if not turns:
        return {}
    depth, width = turns[0].tokens.shape[1], turns[0].tokens.shape[2]
    out: dict = {"turns": len(turns), "steps": sum(t.steps for t in turns), "depth": depth, "width": width,
                 "live_tau": _mean([sum(t.live) / len(t.live) for t in turns])}
    rows = {}
    for name, nodes in systems:
        builder = TreeBuilder(name, nodes, depth, width, k, accept)
        per = [_step_mean(committed(t, builder, device)) for t in turns]
        rows[f"{name}@{nodes}"] = {"builder": name, "nodes": builder.rows, "tau": _mean(per),
                                   "by_dataset": _by_dataset(turns, per)}
    out["replayed"] = rows
    budgets = sorted({n for _, n in systems})
    out["tau_best"] = {str(n): _mean([_step_mean(best(t, n)) for t in turns]) for n in budgets}
    out["tau_best"]["any"] = _mean([_step_mean(best(t)) for t in turns])
    out["accept_by_rank"] = accept_profile(turns)
    return out


def _step_mean(tokens: torch.Tensor) -> float:
    """Tokens per step of one turn, as the live figure is computed (integer sum over the step count)."""
    return int(tokens.sum()) / tokens.numel()


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _by_dataset(turns: list[TurnLattices], values: list[float]) -> dict[str, float]:
    groups: dict[str, list[float]] = {}
    for t, v in zip(turns, values, strict=True):
        groups.setdefault(t.dataset, []).append(v)
    return {k: _mean(v) for k, v in sorted(groups.items())}
