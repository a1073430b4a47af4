"""`specpilot force`: run reference, candidate and AR on the same requests, score every output token
under the exact target, calibrate delta from reference vs AR, and give a verdict with its evidence."""

from __future__ import annotations

from specpilot.bench.harness import Runner, TurnRecord, run_request_major
from specpilot.config.env import parse
from specpilot.forcing.judge import calibrate_delta, first_divergence, tally, verdict
from specpilot.forcing.score import score_output

ROLES = ("reference", "candidate", "ar")


def near_tie_gaps(target, reference: list[TurnRecord], ar: list[TurnRecord]) -> list[float]:
    """At each request's first reference-vs-AR divergence, log p(reference token) - log p(AR token)."""
    gaps = []
    for ref, base in zip(reference, ar, strict=True):
        if ref.prompt != base.prompt:
            continue  # a later turn whose history already differs: not the same prefix
        i = first_divergence(ref.tokens, base.tokens)
        if i is not None:
            gaps.append(score_output(target, ref.prompt, ref.tokens[: i + 1], others={i: base.tokens[i]}).gap_to[i])
    return gaps


def force(runner: Runner, reference: str, candidate: str, requests, max_new: int, progress=None) -> dict:
    systems = dict(zip(ROLES, (parse(reference), parse(candidate), parse("ar")), strict=True))
    # a candidate equal to the reference is a genuine second run of it (one key per role)
    records = run_request_major(runner, systems, requests, max_new, progress)
    target = runner.target
    gaps = near_tie_gaps(target, records["reference"], records["ar"])
    delta = calibrate_delta(gaps)
    stock_out = [r.tokens for r in records["reference"]]
    tallies = {}
    for role, s in systems.items():
        recs = records[role]
        scores = [score_output(target, r.prompt, r.tokens) for r in recs]
        tallies[role] = tally(s.name, scores, [r.tokens for r in recs], stock_out, delta)
    outcome, reason = verdict(tallies["reference"], tallies["candidate"])
    return {"verdict": outcome, "reason": reason, "delta": delta, "delta_gaps": gaps,
            "delta_calibrated": bool(gaps), "reference": systems["reference"].name,
            "candidate": systems["candidate"].name,
            "systems": {role: {"system": systems[role].name, **t.to_json()} for role, t in tallies.items()}}
