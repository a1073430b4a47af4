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

`allot` and `draft_block` are not wired into the engine yet (a batched verify of unequal rows per request is the
next step, issue 59). `Fallback` is: a batch's choice each step between its speculative step and an anchor step
(each request's anchor verified alone, no drafting: AR's pass), `batch_fallback=auto`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field


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


@dataclass
class Fallback:
    """Speculate this step, or verify the anchors alone? Speculating commits the requests' expected tokens a step at
    spec_cost[size] seconds; an anchor step one token each at anchor_cost[size] (the costs measured at start-up, by
    captured batch size). A request's expectation is the moving average (weight `alpha` on the newest) of what its
    speculative steps committed; a request not seen yet takes the average over all requests' steps, and before any
    step the batch speculates. While anchor steps win, every `probe`-th step speculates anyway, so that the
    expectations follow the text (an anchor step says nothing about acceptance)."""

    spec_cost: dict[int, float]
    anchor_cost: dict[int, float]
    alpha: float = 0.25
    probe: int = 16
    expected: dict[Hashable, float] = field(default_factory=dict)
    overall: float | None = None
    since: int = 0  # anchor steps in a row
    steps: dict[str, int] = field(default_factory=lambda: {"speculative": 0, "anchor": 0})

    def __post_init__(self):
        if set(self.spec_cost) != set(self.anchor_cost) or not self.spec_cost:
            raise ValueError("the two steps' costs must be given at the same batch sizes")
        if min(*self.spec_cost.values(), *self.anchor_cost.values()) <= 0:
            raise ValueError("step costs must be positive")
        if not 0 < self.alpha <= 1 or self.probe < 1:
            raise ValueError("alpha must be in (0, 1] and probe at least 1")

    def speculate(self, requests: Iterable[Hashable], size: int) -> bool:
        """The choice for a step of `size` (a captured batch size) whose decoding requests are `requests`."""
        reqs = list(requests)
        if self.overall is None or self.rate(reqs, size) >= len(reqs) / self.anchor_cost[size]:
            self.since = 0
        else:
            self.since += 1
            if self.since < self.probe:
                self.steps["anchor"] += 1
                return False
            self.since = 0
        self.steps["speculative"] += 1
        return True

    def rate(self, requests: Sequence[Hashable], size: int) -> float:
        """Tokens a second a speculative step is expected to commit."""
        return sum(self.expected.get(r, self.overall) for r in requests) / self.spec_cost[size]

    def saw(self, request: Hashable, committed: int) -> None:
        """What a speculative step committed for a request (its accepted drafts and the bonus token)."""
        if committed < 1:
            raise ValueError("a step commits at least one token")
        old = self.expected.get(request, self.overall if self.overall is not None else committed)
        self.expected[request] = (1 - self.alpha) * old + self.alpha * committed
        self.overall = committed if self.overall is None else (1 - self.alpha) * self.overall + self.alpha * committed

    def forget(self, request: Hashable) -> None:
        self.expected.pop(request, None)
