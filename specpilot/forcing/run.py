"""`specpilot force`: run reference, candidate and AR on the same requests, score every output token under the
exact target, measure the deployment's noise (the reference-vs-AR near-ties and the reduction-order noise of the
target itself), and give the verdict with its evidence (forcing/judge.py)."""

from __future__ import annotations

from specpilot.bench.harness import Runner, TurnRecord
from specpilot.config.env import parse
from specpilot.forcing.judge import calibrate_delta, first_divergence, tally, verdict
from specpilot.forcing.noise import margin_noise
from specpilot.forcing.score import score_output

ROLES = ("reference", "candidate", "ar")
NOISE_REQUESTS = 4  # AR outputs recomputed for the noise measurement


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


def force(runner: Runner, reference: str, candidate: str, requests, max_new: int, progress=None,
          reuse: dict | None = None, bound: float | None = None, start: int | None = None) -> dict:
    """Judge the candidate on requests[:start] (default: all); with `bound`, while the smallest excess mismatch
    rate the scored tokens could detect is above it, double the requests (up to all of them). A reject stands
    whatever the power; a pass that never got the power becomes "inconclusive".

    reuse: a dict kept across calls on the same runner and budget: each (system, request) of the reference and
    AR runs once (never the candidate's: a candidate equal to the reference is a genuine second run of it)."""
    systems = dict(zip(ROLES, (parse(reference), parse(candidate), parse("ar")), strict=True))
    reuse = {} if reuse is None else reuse
    own: dict = {}  # the candidate's runs, kept across this call's rounds only
    n = min(start or len(requests), len(requests))
    while True:
        report = _judge(runner, systems, requests[:n], max_new, progress, reuse, own)
        if report["verdict"] == "reject" or bound is None or report["detectable_rate"] <= bound or n >= len(requests):
            break
        n = min(2 * n, len(requests))
    report["power"] = {"bound": bound, "requests": n, "met": bound is None or report["detectable_rate"] <= bound}
    if report["verdict"] == "pass" and not report["power"]["met"]:
        report["verdict"] = "inconclusive"
        report["reason"] += (f"; but {n} requests could not detect less than {100 * report['detectable_rate']:.2f} "
                             f"points (bound {100 * bound:.2f}): more requests or longer outputs are needed")
    return report


def _runs(runner: Runner, system, requests, max_new: int, progress, memo: dict) -> tuple[list, list]:
    """Each request's turn records and scores, from memo where this system already ran it."""
    target = runner.target
    runner.warmup(system)
    records, scores = [], []
    for req in requests:
        key = (system.name, req.id)
        if key not in memo:
            recs = runner.run(system, req, max_new, progress)
            memo[key] = (recs, [score_output(target, r.prompt, r.tokens) for r in recs])
        records += memo[key][0]
        scores += memo[key][1]
    return records, scores


def _judge(runner: Runner, systems: dict, requests, max_new: int, progress, reuse: dict, own: dict) -> dict:
    runs = {role: _runs(runner, s, requests, max_new, progress, own if role == "candidate" else reuse)
            for role, s in systems.items()}
    records = {role: r for role, (r, _) in runs.items()}
    target = runner.target
    gaps = near_tie_gaps(target, records["reference"], records["ar"])
    noise = margin_noise(target, [(r.prompt, r.tokens) for r in records["ar"][:NOISE_REQUESTS]])
    delta = calibrate_delta(gaps, noise["max"])
    tallies = {role: tally(s.name, runs[role][1], delta) for role, s in systems.items()}
    judged = verdict(tallies["reference"], tallies["candidate"], tallies["ar"])
    return {**judged, "delta": delta, "calibration": {"near_tie_gaps": gaps, "noise": noise},
            "reference": systems["reference"].name, "candidate": systems["candidate"].name,
            "systems": {role: {"system": systems[role].name, **t.to_json()} for role, t in tallies.items()}}
