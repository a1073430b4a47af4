"""The token-forcing verdict: is a candidate as faithful to the exact target as the reference is, and is the
reference itself faithful to it?

Every output token is scored under the exact target (forcing/score.py); a token that is not the argmax is a
mismatch with a margin (nats). delta bounds a legitimate near-tie: the reduction-order noise of the deployment
itself, measured (forcing/noise.py); where the reference and AR first part is reported beside it. A mismatch
whose margin exceeds 2 delta is a large-margin event. No earlier divergence excuses one (a system's tokens are
scored on its own prefix), but one event is not a verdict either: events up to GROSS delta are counted, and only a
significantly higher event rate than the baseline's rejects (one in 288k tokens of a lossless kernel with another
reduction order was seen on an H100). An event beyond GROSS delta (a gross event) rejects whatever the counts,
unless the baseline made the same choice in the same context (its output the same up to that token): then it is
the baseline's, and the reference's own such events fail the reference against AR alike.

Two comparisons, each of three one-sided tests (a higher mismatch rate and a higher event rate, Fisher's exact test;
larger margins at mismatches, Mann-Whitney U): candidate against reference, and reference against AR (the exact target's
own greedy output in the deployment's precision). A reference that departs from the exact target cannot vouch for
anything: the candidate is then held to AR itself (candidate against AR decides in place of candidate against reference:
still two decisive comparisons). The six tests share the level alpha (Bonferroni), so a lossless candidate with a
lossless reference is rejected at most alpha of the time, provided the exact target is as far from one as from the
other. A bf16 target scoring through cuBLAS is not, where the candidate runs other kernels: the reference's projections
are then the scorer's own, bit for bit, and the margins test leans against the candidate (AR on W12 was rejected on
margins at 562 requests under it; scored by the float32 model, the same outputs failed no test). forcing/run.exact_mode
gives such candidates the float32 target (the loop's gate gives it every candidate below float32: stock's own margins
failed against AR's under the bf16 scorer). The verdict also states the smallest excess mismatch rate its own mismatch
test could have detected with its token counts (80% power). The gross-event rule is no statistical test: it adds to
alpha only where the deployment's noise could reach GROSS delta, which delta, the noise's own measured maximum, says it
does not.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from scipy.stats import binom, binomtest, fisher_exact, mannwhitneyu

from specpilot.forcing.score import TokenScores

ALPHA = 0.05
TESTS = 6  # two comparisons x (mismatch rate, event rate, margins)
POWER = 0.8
MIN_MARGINS = 3  # mismatches each side needs before their margins are compared
# The gross bar, in multiples of delta. A large-margin event (above 2 delta) may still be noise's rare tail: on an
# H100, ar:weights=w12 (bit-exact weights, another kernel's reduction order) made one above 1 nat (delta 0.5) in
# 288k tokens against the reference's none, and passes; such events stay with the event-rate test. 8 delta (4 nats
# at delta 0.5: a token e^4 = 55 times less likely than the argmax) is four times the event threshold and eight
# times the largest shift the deployment's own recomputations gave any margin: no reduction order explains it,
# and the lossy systems measured make such choices (topk_truncate: margins up to 9.6 nats).
GROSS = 8


@dataclass
class SystemForcing:
    name: str
    tokens: int = 0
    mismatches: int = 0
    large_margin_events: int = 0
    margins: list[float] = field(default_factory=list)  # at every mismatch
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
                "margins": sorted(self.margins, reverse=True)[:200], "margin_quantiles": self.quantiles(),
                "events": self.events[:200]}

    def quantiles(self) -> dict[str, float]:
        """Quartiles and the 90th / 99th percentile of the margins at every mismatch (the margins test's
        samples, which the 200 largest kept beside them do not show)."""
        m = sorted(self.margins)
        return {f"p{q}": m[min(len(m) - 1, len(m) * q // 100)] for q in (25, 50, 75, 90, 99)} if m else {}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None


def calibrate_delta(gaps: list[float], noise_max: float) -> tuple[float, list[float]]:
    """delta is the measured reduction-order noise. A reference-vs-AR parting whose gap exceeds it is not a
    near-tie that noise explains (a lossy reference makes such partings): it is returned apart, to be reported,
    and widens nothing."""
    return noise_max, [g for g in gaps if abs(g) > noise_max]


def choice(prompt: list[int], output: list[int], position: int) -> str:
    """What identifies a choice: the token at `position` and everything before it (prompt and output)."""
    return hashlib.sha256(json.dumps([prompt, output[: position + 1]]).encode()).hexdigest()[:16]


def tally(name: str, scores: list[TokenScores], delta: float,
          outputs: list[tuple[list[int], list[int]]] | None = None) -> SystemForcing:
    """outputs: each score's (prompt, output): every event then names its choice, so that two systems' events
    are the same one only where the same token was chosen in the same context (`gross`)."""
    s = SystemForcing(name)
    for rid, sc in enumerate(scores):
        s.tokens += len(sc.margin)
        for i, (ok, m) in enumerate(zip(sc.is_argmax, sc.margin, strict=True)):
            if ok:
                continue
            s.mismatches += 1
            s.margins.append(m)
            if m > 2 * delta:
                s.large_margin_events += 1
                s.events.append({"request": rid, "position": i, "margin": m,
                                 **({"choice": choice(*outputs[rid], i)} if outputs is not None else {})})
    return s


def _event_key(e: dict) -> tuple:
    return e["request"], e["position"], e.get("choice")


def gross(subject: SystemForcing, baseline: SystemForcing, bar: float) -> list[dict]:
    """The subject's events with a margin above `bar` that the baseline did not make (the same choice in the same
    context; without recorded choices, at the same request and position)."""
    made = {_event_key(e) for e in baseline.events}
    return [e for e in subject.events if e["margin"] > bar and _event_key(e) not in made]


def _fisher(a_hits: int, a_n: int, b_hits: int, b_n: int) -> float:
    """p that a's rate exceeds b's (one-sided Fisher exact)."""
    if not a_n or not b_n:
        return 1.0
    return float(fisher_exact([[a_hits, a_n - a_hits], [b_hits, b_n - b_hits]], alternative="greater").pvalue)


def compare(subject: SystemForcing, baseline: SystemForcing, delta: float | None = None) -> dict:
    """The three one-sided tests of `subject` worse than `baseline`, their p-values and the level each uses; with
    delta, also the subject's gross events the baseline did not make (any fails it: "gross")."""
    level = ALPHA / TESTS
    out = {"mismatch_p": _fisher(subject.mismatches, subject.tokens, baseline.mismatches, baseline.tokens),
           "events_p": _fisher(subject.large_margin_events, subject.tokens, baseline.large_margin_events,
                               baseline.tokens),
           "margins_p": None, "level": level}
    if len(subject.margins) >= MIN_MARGINS and len(baseline.margins) >= MIN_MARGINS:
        out["margins_p"] = float(mannwhitneyu(subject.margins, baseline.margins, alternative="greater").pvalue)
    out["failed"] = [k[:-2] for k in ("mismatch_p", "events_p", "margins_p") if out[k] is not None and out[k] < level]
    if delta is not None:
        found = gross(subject, baseline, GROSS * delta)
        out["gross"] = {"bar": GROSS * delta, "count": len(found),
                        "largest": max((e["margin"] for e in found), default=None), "events": found[:20]}
        out["failed"] += ["gross events"] if found else []
    return out


def _rejecting_count(n: int, ref_hits: int, ref_n: int, level: float) -> int | None:
    """The fewest mismatches among n candidate tokens that the one-sided Fisher test rejects against the
    reference's count (its p-value falls as the count grows); None if not even n does."""
    if _fisher(n, n, ref_hits, ref_n) >= level:
        return None
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _fisher(mid, n, ref_hits, ref_n) < level else (mid + 1, hi)
    return lo


def detectable_rate(tokens: int, ref_mismatches: int, ref_tokens: int) -> float:
    """The smallest excess mismatch rate over the reference's that the verdict's own test (one-sided Fisher at the
    per-test level, the reference's count as observed) detects with 80% power on `tokens` candidate tokens."""
    if not tokens or not ref_tokens:
        return 1.0  # nothing scored: nothing is detectable
    base = ref_mismatches / ref_tokens
    k = _rejecting_count(tokens, ref_mismatches, ref_tokens, ALPHA / TESTS)
    if k is None:
        return 1.0 - base  # no count rejects: nothing is detectable
    lo, hi = base, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if binom.sf(k - 1, tokens, mid) >= POWER else (mid, hi)
    return hi - base


def verdict(reference: SystemForcing, candidate: SystemForcing, exact: SystemForcing, delta: float) -> dict:
    """{"verdict": "pass" | "reject", "reason", "tests": both comparisons (and the candidate against the exact
    target), "detectable_rate"}. A reference that departs from the exact target cannot vouch: the candidate is then
    held to AR (the exact target's own greedy output) in its place, "held_to": "ar", and passes only where it does
    not depart from AR itself (a candidate sharing the reference's flaw departs as it does). delta: the events'
    noise bound, which sets the gross bar."""
    tests = {"candidate_vs_reference": compare(candidate, reference, delta),
             "reference_vs_exact": compare(reference, exact, delta),
             # reported; decisive in place of the first where the reference fails the second
             "candidate_vs_exact": compare(candidate, exact, delta)}
    out = {"tests": tests, "detectable_rate": detectable_rate(candidate.tokens, reference.mismatches, reference.tokens)}
    ref_bad, cand_bad = tests["reference_vs_exact"]["failed"], tests["candidate_vs_reference"]["failed"]
    if not candidate.tokens:
        return {**out, "verdict": "reject", "reason": "the candidate produced no tokens"}
    if ref_bad:  # the candidate is held to AR itself, the two decisive comparisons still two
        why = (f"the reference {reference.name} departs from the exact target ({', '.join(ref_bad)}: mismatch "
               f"{100 * reference.mismatch_rate:.2f}% vs AR {100 * exact.mismatch_rate:.2f}%, "
               f"{reference.large_margin_events} vs {exact.large_margin_events} large-margin events"
               f"{_gross_text(tests['reference_vs_exact'], 'AR')}): it cannot vouch")
        t, bad = tests["candidate_vs_exact"], tests["candidate_vs_exact"]["failed"]
        out["detectable_rate"] = detectable_rate(candidate.tokens, exact.mismatches, exact.tokens)
        out["held_to"] = "ar"
        if bad:
            return {**out, "verdict": "reject", "reason": (
                f"{why}; held to AR instead, the candidate departs too ({', '.join(bad)}: mismatch "
                f"{100 * candidate.mismatch_rate:.2f}% vs {100 * exact.mismatch_rate:.2f}% (p = "
                f"{t['mismatch_p']:.2g}){_gross_text(t, 'AR')})")}
        return {**out, "verdict": "pass", "reason": (
            f"{why}; held to AR instead: mismatch {100 * candidate.mismatch_rate:.2f}% vs AR "
            f"{100 * exact.mismatch_rate:.2f}%, {candidate.large_margin_events} large-margin events vs "
            f"{exact.large_margin_events}; an excess mismatch rate of {100 * out['detectable_rate']:.2f} points over "
            f"AR's would have been caught")}
    if cand_bad:
        t = tests["candidate_vs_reference"]
        return {**out, "verdict": "reject", "reason": (
            f"worse than the reference in {', '.join(cand_bad)}: mismatch {100 * candidate.mismatch_rate:.2f}% "
            f"vs {100 * reference.mismatch_rate:.2f}% (p = {t['mismatch_p']:.2g}), "
            f"{candidate.large_margin_events} vs {reference.large_margin_events} large-margin events "
            f"(p = {t['events_p']:.2g}){_gross_text(t, 'the reference')}")}
    return {**out, "verdict": "pass", "reason": (
        f"mismatch {100 * candidate.mismatch_rate:.2f}% vs reference {100 * reference.mismatch_rate:.2f}%, "
        f"{candidate.large_margin_events} large-margin events vs {reference.large_margin_events}; an excess "
        f"mismatch rate of {100 * out['detectable_rate']:.2f} points would have been caught")}


def _gross_text(test: dict, baseline: str) -> str:
    g = test.get("gross")
    if not g or not g["count"]:
        return ""
    return (f"; {g['count']} beyond {GROSS} delta ({g['bar']:.3g} nats, the largest {g['largest']:.3g}) that "
            f"{baseline} did not make: no noise of this deployment reaches them")
