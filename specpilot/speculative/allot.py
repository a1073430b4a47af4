"""A step's verify rows shared by the requests in flight (issue 59's first batching mechanism), and a draft block
per request: the planning rules, pure functions of the drafter's confidences and the measured step cost.

With many requests in flight a verify row costs the same whoever it serves, but it is worth its probability of
being accepted. So the rows go where that probability is highest, across requests, and there are only as many as
pay for their cost: each request keeps its root row (the token every step commits), and the budget B of further
rows maximises expected committed tokens per second,

    B* = argmax_B (N + sum of the B largest survival probabilities over all requests) / step_cost(N + B),

vLLM's DSpark rule (PR #47808; its costs are tables profiled at start-up, ours the step timings the ceiling
measures). A node's survival probability is the product of the drafter's confidences along its root path, so it
never exceeds its parent's: a request's nodes in best-first order are non-increasing, and the B largest over all
requests are a prefix of each request's list (ties go to the lower request, then the lower rank), i.e. a valid tree
for every request. The draft block per request is the shortest of the offered blocks whose last draft is reached
with probability below `floor` (drafts past it, less likely still, would not pay): confident requests draft long,
unsure ones short.

Not wired into the engine yet: a batched verify of unequal rows per request is the next step (issue 59).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Allotment:
    rows: tuple[int, ...]  # verify rows per request, its root included (>= 1)
    expected: float  # committed tokens expected this step (N + the chosen nodes' survival probabilities)
    cost: float  # the step's predicted cost at sum(rows)

    @property
    def rate(self) -> float:
        return self.expected / self.cost


def allot(survival: Sequence[Sequence[float]], step_cost: Callable[[int], float],
          max_rows: int | None = None) -> Allotment:
    """survival[r]: request r's candidate nodes' probabilities of acceptance, non-increasing (best-first order).
    step_cost(rows): the predicted seconds of a step verifying that many rows in all (positive). max_rows: the
    most rows a step may verify (at least one per request)."""
    n = len(survival)
    if n == 0:
        raise ValueError("no request to allot rows to")
    for r, probs in enumerate(survival):
        if any(not 0.0 <= p <= 1.0 for p in probs) or any(a < b for a, b in zip(probs, probs[1:], strict=False)):
            raise ValueError(f"request {r}: survival probabilities must lie in [0, 1] and not increase")
    cap = sum(len(p) for p in survival) if max_rows is None else max_rows - n
    if cap < 0:
        raise ValueError(f"max_rows {max_rows} is below one row per request ({n})")
    order = _merged(survival, cap)
    best, total = (0, n / step_cost(n)), 0.0
    for b, (p, _, _) in enumerate(order, start=1):
        total += p
        rate = (n + total) / step_cost(n + b)
        if rate > best[1]:
            best = (b, rate)
    rows = [1] * n
    for _, r, _ in order[: best[0]]:
        rows[r] += 1
    expected = n + sum(p for p, _, _ in order[: best[0]])
    return Allotment(tuple(rows), expected, step_cost(n + best[0]))


def _merged(survival: Sequence[Sequence[float]], count: int) -> list[tuple[float, int, int]]:
    """The `count` largest (probability, request, rank) over all requests, largest first; ties by request, then
    rank, so each request's share is a prefix of its list."""
    heap = [(-probs[0], r, 0) for r, probs in enumerate(survival) if probs]
    heapq.heapify(heap)
    out = []
    while heap and len(out) < count:
        p, r, i = heapq.heappop(heap)
        out.append((-p, r, i))
        if i + 1 < len(survival[r]):
            heapq.heappush(heap, (-survival[r][i + 1], r, i + 1))
    return out


def chain_survival(confidence: Sequence[float]) -> list[float]:
    """Probabilities that the first 1, 2, ... drafts of a chain are all accepted (the drafter's per-position
    confidences multiplied along the chain)."""
    out, s = [], 1.0
    for c in confidence:
        s *= c
        out.append(s)
    return out


def draft_block(confidence: Sequence[float], blocks: Sequence[int] = (8, 12, 16), floor: float = 0.05) -> int:
    """The shortest offered block whose last draft is reached with probability below `floor` (the longest when no
    block's is); confidence[d]: the drafter's confidence in draft d + 1, as many as the longest block drafts."""
    choices = sorted(blocks)
    if not choices or choices[0] < 2:
        raise ValueError(f"blocks must be at least 2 (an anchor and a draft), got {list(blocks)}")
    if len(confidence) < choices[-1] - 1:
        raise ValueError(f"{len(confidence)} confidences for a block of {choices[-1]}")
    reach = chain_survival(confidence)
    for b in choices:
        if b == choices[-1] or reach[b - 2] < floor:
            return b
    return choices[-1]
