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

`allot` and `draft_block` are the reference rules; `draft_block` is not wired into the engine yet. `RowsChoice` is:
the rows every request's step verifies, chosen each step among the anchor alone (no drafting: AR's pass), shorter
chains and the system's rows (`batch_rows=auto`). `TreeRowsChoice` is `allot`'s rule on the engine's captured steps
(`batch_rows=auto` over a best_first/ddtree tree): the step's budget chosen among a few captured ones, each step's
expected tokens computed on the device (speculative/budget.expected_tokens) and calibrated by what was committed.
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
class RowsChoice:
    """How many rows each request's step verifies, the same for all (`batch_rows=auto`): 1 (the anchor alone, no
    drafting), a shorter chain, or the system's full rows (the largest key of `costs`: rows -> captured batch size
    -> seconds a step, measured at start-up). The step chosen commits the most expected tokens a second.

    A step of w rows is taken to commit min(c, w) tokens of a request where a full step commits c (a chain of w rows
    is a prefix of a longer one's; for a tree only w = 1 and the full rows are offered). Each request's expectation
    for w is the moving average (weight `alpha` on the newest) of min(committed, w) over its steps of w rows or more;
    w = 1 commits 1. A request not seen yet takes the average over all requests, and before any step the batch runs
    full steps. After `probe` steps in a row below the full rows a full step runs, so that the expectations of the
    wide steps follow the text."""

    costs: dict[int, dict[int, float]]
    alpha: float = 0.25
    probe: int = 16
    expected: dict[Hashable, dict[int, float]] = field(default_factory=dict)
    overall: dict[int, float] = field(default_factory=dict)
    since: int = 0  # steps in a row below the full rows
    steps: dict[int, int] = field(default_factory=dict)  # steps run, by rows

    def __post_init__(self):
        sizes = [set(t) for t in self.costs.values()]
        if 1 not in self.costs or len(self.costs) < 2 or any(s != sizes[0] for s in sizes) or not sizes[0]:
            raise ValueError("costs of the one-row step and at least one wider step, at the same batch sizes")
        if min(c for t in self.costs.values() for c in t.values()) <= 0:
            raise ValueError("step costs must be positive")
        if not 0 < self.alpha <= 1 or self.probe < 1:
            raise ValueError("alpha must be in (0, 1] and probe at least 1")
        self.full = max(self.costs)
        for w in self.costs:
            self.steps.setdefault(w, 0)

    def choose(self, requests: Iterable[Hashable], size: int) -> int:
        """The rows of a step of `size` (a captured batch size) whose decoding requests are `requests`."""
        reqs = list(requests)
        best = self.full
        if self.known():
            rates = {w: self.rate(reqs, w, size) for w in self.costs}
            best = max(rates, key=lambda w: (rates[w], w))  # a tie goes to the wider step
        self.since = self.since + 1 if best != self.full else 0
        if self.since >= self.probe:
            best, self.since = self.full, 0
        self.steps[best] += 1
        return best

    def known(self) -> bool:
        """Whether any step wider than the anchor was seen (before, the full rows run)."""
        return bool(self.overall)

    def rate(self, requests: Sequence[Hashable], rows: int, size: int) -> float:
        """Tokens a second a step of `rows` rows is expected to commit."""
        return sum(self.expect(r, rows) for r in requests) / self.costs[rows][size]

    def expect(self, request: Hashable, rows: int) -> float:
        if rows == 1:
            return 1.0
        return self.expected.get(request, {}).get(rows, self.overall.get(rows, float(rows)))

    def saw(self, request: Hashable, committed: int, rows: int) -> None:
        """What a step of `rows` rows committed for a request (its accepted drafts and the bonus token)."""
        if committed < 1:
            raise ValueError("a step commits at least one token")
        mine = self.expected.setdefault(request, {})
        for w in self.costs:
            if 1 < w <= rows:
                seen = min(committed, w)
                mine[w] = (1 - self.alpha) * mine.get(w, self.overall.get(w, seen)) + self.alpha * seen
                self.overall[w] = (1 - self.alpha) * self.overall.get(w, seen) + self.alpha * seen

    def forget(self, request: Hashable) -> None:
        self.expected.pop(request, None)


@dataclass
class TreeRowsChoice(RowsChoice):
    """`batch_rows=auto` over a tree in score order: the rows a step verifies in all are one of the captured budgets,
    w rows a request on average (costs' keys: 1 the anchor alone, the full rows the whole trees), chosen by
    `allot`'s rule, the most expected tokens a second. A step that builds the trees says what every budget on offer
    would have committed (`told`: one plus the likeliest nodes' survival probabilities a request, summed over the
    live requests, in the order of `shares`); the next step's choice reads the last such step's (its trees are the
    nearest known), scaled by `calibration`: committed over expected above the roots, moving sums (weight `alpha`
    on the newest) over the tree steps, whichever budget ran (the drafter's probabilities are not the target's).
    One factor for all budgets keeps their order: a larger budget's nodes include a smaller one's, so it never
    expects fewer tokens (a factor per budget, tried first, made the pair's budget of 8 look better than its full
    trees of 16 at equal cost). Before any tree step, full steps; after `probe` anchor steps in a row, a full one."""

    shares: tuple[int, ...] = ()  # the widths whose expected tokens the device writes (the full rows last)
    extra: dict[int, float] = field(default_factory=dict)  # width -> expected tokens above the roots, a request
    sums: list[float] = field(default_factory=list)  # [committed, expected] above the roots, moving sums

    def __post_init__(self):
        super().__post_init__()
        if not self.shares or set(self.shares) != set(self.costs) - {1} or self.shares[-1] != self.full:
            raise ValueError(f"shares {self.shares} must be the widths above the anchor, the full rows last")

    def expect(self, request: Hashable, rows: int) -> float:
        """A request's expected tokens from a step of `rows` a request (1: the anchor's one; unknown: `rows`)."""
        if rows == 1:
            return 1.0
        if rows not in self.extra:
            return float(rows)
        return 1.0 + self.calibration() * self.extra[rows]

    def calibration(self) -> float:
        """Committed over expected tokens above the roots (1 before any tree step)."""
        if not self.sums or self.sums[1] <= 0:
            return 1.0
        return self.sums[0] / self.sums[1]

    def known(self) -> bool:
        return bool(self.extra)

    def told(self, expected: Sequence[float], live: int, rows: int, committed: int) -> None:
        """A step of `rows` rows a request over `live` requests committed `committed` tokens in all; `expected`: what
        each of `shares` was expected to commit over those requests, from this step's trees."""
        if len(expected) != len(self.shares) or live < 1 or committed < live or rows not in self.shares:
            raise ValueError("one expectation per share, a shared width, one live request and a token each at least")
        self.extra = {w: max(e - live, 0.0) / live for w, e in zip(self.shares, expected, strict=True)}
        seen = (committed - live, max(expected[self.shares.index(rows)] - live, 0.0))
        self.sums = list(seen) if not self.sums else [(1 - self.alpha) * a + self.alpha * b
                                                      for a, b in zip(self.sums, seen, strict=True)]

    def saw(self, request: Hashable, committed: int, rows: int) -> None:
        if committed < 1:
            raise ValueError("a step commits at least one token")

    def forget(self, request: Hashable) -> None:
        pass
