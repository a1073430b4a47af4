"""The token-forcing verdict: is a candidate system as faithful to the exact target as stock is?

delta is calibrated from stock against AR: at each request's first position where the two outputs
differ, the log-prob gap between the two tokens (a legitimate near-tie from reduction order); delta is
their upper bound, rounded up. A large-margin event is a token whose margin exceeds 2 delta: explained
when it falls after the output's own first divergence from stock and that divergence was itself a
near-tie (margin <= 2 delta), unexplained otherwise. The candidate is rejected when its mismatch rate
exceeds stock's by more than 0.5 points, or its unexplained events exceed stock's rate (one-sided
binomial tests at 5%).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from scipy.stats import binomtest

from specpilot.forcing.score import TokenScores

MARGIN_POINTS = 0.005
ALPHA = 0.05
DEFAULT_DELTA = 0.25  # used only when stock and AR never diverge (no near-tie to calibrate on)


@dataclass
class SystemForcing:
    name: str
    tokens: int = 0
    mismatches: int = 0
    large_margin_events: int = 0
    unexplained_events: int = 0
    events: list[dict] = field(default_factory=list)

    @property
    def mismatch_rate(self) -> float:
        return self.mismatches / self.tokens if self.tokens else 0.0

    def ci(self) -> tuple[float, float]:
        if not self.tokens:
            return (0.0, 1.0)
        interval = binomtest(self.mismatches, self.tokens).proportion_ci(0.95)
        return (interval.low, interval.high)

    def to_json(self) -> dict:
        low, high = self.ci()
        return {"tokens": self.tokens, "mismatches": self.mismatches, "mismatch_rate": self.mismatch_rate,
                "mismatch_ci95": [low, high], "large_margin_events": self.large_margin_events,
                "unexplained_events": self.unexplained_events, "events": self.events[:200]}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None


def calibrate_delta(gaps: list[float]) -> float:
    """Upper bound of the near-tie gaps, rounded up to 3 decimals."""
    return math.ceil(max(abs(g) for g in gaps) * 1000) / 1000 if gaps else DEFAULT_DELTA


def tally(name: str, scores: list[TokenScores], outputs: list[list[int]], stock_outputs: list[list[int]],
          delta: float) -> SystemForcing:
    s = SystemForcing(name)
    for rid, (sc, out, ref) in enumerate(zip(scores, outputs, stock_outputs, strict=True)):
        s.tokens += len(out)
        s.mismatches += sc.mismatches
        split = first_divergence(out, ref)
        legit = split is not None and sc.margin[split] <= 2 * delta
        for i, m in enumerate(sc.margin):
            if m > 2 * delta:
                explained = legit and i > split
                s.large_margin_events += 1
                s.unexplained_events += not explained
                s.events.append({"request": rid, "position": i, "margin": m, "explained": explained})
    return s


def verdict(stock: SystemForcing, candidate: SystemForcing) -> tuple[str, str]:
    """("pass" | "reject", reason)."""
    if not candidate.tokens:
        return "reject", "the candidate produced no tokens"
    p0 = min(stock.mismatch_rate + MARGIN_POINTS, 1.0)
    mis = binomtest(candidate.mismatches, candidate.tokens, p0, alternative="greater").pvalue
    if mis < ALPHA:
        return "reject", (f"mismatch rate {100 * candidate.mismatch_rate:.2f}% exceeds stock's "
                          f"{100 * stock.mismatch_rate:.2f}% + 0.5 points (p = {mis:.2g})")
    # Stock's unexplained rate, with one pseudo-event so that a stock with none still leaves room for noise.
    p1 = min((stock.unexplained_events + 1) / max(stock.tokens, 1), 1.0)
    une = binomtest(candidate.unexplained_events, candidate.tokens, p1, alternative="greater").pvalue
    if une < ALPHA:
        return "reject", (f"{candidate.unexplained_events} unexplained large-margin events in {candidate.tokens} "
                          f"tokens exceed stock's {stock.unexplained_events} in {stock.tokens} (p = {une:.2g})")
    return "pass", (f"mismatch {100 * candidate.mismatch_rate:.2f}% vs stock {100 * stock.mismatch_rate:.2f}%, "
                    f"{candidate.unexplained_events} unexplained large-margin events")
