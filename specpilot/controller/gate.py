"""The controller's statistical gate: is a candidate really faster than the baseline?

Gain = geometric mean over requests of per-request rate ratios (candidate tokens/s over baseline
tokens/s on the same request). Its confidence interval is the Student-t interval of the mean log ratio
(paired by construction: one ratio per request). A BCa bootstrap, used before, undercovers at the few requests
a run may have: with a true gain of 1 and 2% noise its one-sided 95% lower bound exceeded 1 in 16% of runs of 3
requests, 11% of 6, 7% of 12 (t: 5%); on the H200 and CPU cards of 10-40 requests the two agree to 0.0003. Noise is
measured, not assumed: an A/A run (baseline against itself) gives the half-width of its own interval
around 1. A candidate is promoted only when the one-sided 95% lower bound of its gain exceeds
1 + margin + 2 x noise, where margin is 1%, or 3% when outputs differ (per-request times then
compare different work token for token, so only tokens/s is compared and the bar is higher).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy.stats import t as student_t

MARGIN_SAME = 0.01
MARGIN_DIVERGED = 0.03
CONFIDENCE = 0.90  # of the gain's two-sided interval: each bound one-sided 95%
ALPHA = (1 - CONFIDENCE) / 2  # the one-sided error of a promotion


@dataclass
class GainEstimate:
    gain: float
    lower: float  # one-sided 95% lower bound
    upper: float  # one-sided 95% upper bound
    requests: int

    def to_json(self) -> dict:
        return asdict(self)


def rate_ratios(base_tokens, base_seconds, cand_tokens, cand_seconds) -> np.ndarray:
    base = np.asarray(base_tokens, float) / np.asarray(base_seconds, float)
    cand = np.asarray(cand_tokens, float) / np.asarray(cand_seconds, float)
    return cand / base


def estimate(ratios, confidence: float = CONFIDENCE) -> GainEstimate:
    """confidence: of the two-sided interval (0.90: each bound one-sided 95%). Exact when the log ratios are
    normal, whatever the number of requests; a symmetric heavier tail only widens it."""
    logs = np.log(np.asarray(ratios, float))
    n = int(logs.size)
    if n < 3:
        raise ValueError(f"a gain needs at least 3 requests, got {n}")
    if np.allclose(logs, logs[0]):  # a degenerate sample has no spread: its interval is its value
        g = float(math.exp(logs[0]))
        return GainEstimate(g, g, g, n)
    mean = float(logs.mean())
    half = float(student_t.ppf(0.5 + confidence / 2, n - 1) * logs.std(ddof=1) / math.sqrt(n))
    return GainEstimate(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n)


def noise_from(aa: GainEstimate) -> float:
    """A/A noise: how far the A/A interval reaches from 1 on either side."""
    return max(abs(1 - aa.lower), abs(aa.upper - 1))


SLOT_DIFF_WARN = 0.02  # an A/A gain this far from 1 is a systematic difference between the two slots


def slot_corrected(aa_ids, aa_ratios, ab_ids, ab_ratios) -> GainEstimate | None:
    """The A/B gain with the A/A run's per-request difference divided out (ab_i / aa_i per request).

    The two slots of a run need not be equal: in paired mode A's and B's workers run at the same time
    and on the H200 one slot ran 11% slower than the other whatever the GPU (launch-bound SmolLM2) or
    1.1% (the twin). Dividing by the A/A ratio of the same request removes what the slots add, not what
    the systems differ by. None when fewer than 3 requests are common to both runs. A reading for the
    card: the verdict still uses the uncorrected gain and the A/A noise, which already contains the
    slot difference, so no correction can promote anything."""
    aa = dict(zip(aa_ids, aa_ratios, strict=True))
    common = [(r, aa[i]) for i, r in zip(ab_ids, ab_ratios, strict=True) if i in aa]
    if len(common) < 3:
        return None
    return estimate([r / q for r, q in common])


EARLY_CONFIDENCE = 0.99  # an interim look stops a run only on bounds at one-sided 99.5%
MIN_PASSES = 3


def settled(ratios, noise: float, outputs_equal: bool) -> bool:
    """After some of a run's passes: is the verdict already beyond doubt? Either the lower bound clears the bar,
    or the upper bound is under it (no more passes would promote it), both at one-sided 99.5% (so the final rule,
    at 95% on the passes run, says the same; each extra look adds at most 0.5% to its false-promotion or its
    false-refusal rate)."""
    if len(ratios) < 3:
        return False
    est = estimate(ratios, confidence=EARLY_CONFIDENCE)
    bar = 1 + (MARGIN_SAME if outputs_equal else MARGIN_DIVERGED) + 2 * noise
    return est.lower > bar or est.upper < bar


def sequential_confidence(looks: int, alpha: float = ALPHA) -> float:
    """The two-sided confidence each of `looks` looks at a growing set of requests reads its bounds at, so that
    the chance of any false promotion over all of them stays at most `alpha` (one-sided; Bonferroni: alpha/looks
    each). One look: the controller's own 90% (95% one-sided)."""
    return 1 - 2 * alpha / looks


def decided_at(decision: dict) -> bool:
    """A look's verdict that more requests could not change: its lower bound clears the bar, or its upper bound is
    under it (not even the gain's best case would clear it)."""
    return decision["lower"] > decision["bar"] or decision["upper"] < decision["bar"]


def decide(candidate: GainEstimate, noise: float, outputs_equal: bool) -> dict:
    margin = MARGIN_SAME if outputs_equal else MARGIN_DIVERGED
    bar = 1 + margin + 2 * noise
    promote = candidate.lower > bar
    if promote:
        reason = f"lower bound {candidate.lower:.4f} > {bar:.4f}"
    elif candidate.upper < 1 - 2 * noise:  # a slowdown inside the A/A noise is no finding either way
        reason = f"slower: upper bound {candidate.upper:.4f} < {1 - 2 * noise:.4f} (1 - 2x noise)"
    else:
        reason = f"not proven: lower bound {candidate.lower:.4f} <= {bar:.4f}"
    return {"verdict": "promote" if promote else "reject", "reason": reason, "bar": bar, "margin": margin,
            "noise": noise, **candidate.to_json()}
