"""`specpilot force`: run reference, candidate and AR on the same requests, score every output token under the
exact target, measure the deployment's noise (the reduction-order noise of the target itself; the reference-vs-AR
near-ties reported beside it), and give the verdict with its evidence (forcing/judge.py).

The exact target is the deployment's own (its dtype, float32 LM head) or, in the FP32-reference mode, a float32
model of the same function (`exact_target`): every output is then scored in float32, and AR in float32 runs on the
first requests as a fourth system, reported beside the verdict (how far the deployment's precision itself is from
exact).

Which one judges (`exact_mode`, mode "auto", the default): the deployment's target, unless the candidate runs other
kernels than the reference (its kernel plan differs, or it is another tree's code, which may change any kernel) in
a deployment below float32. The deployment's target scores in prefill through cuBLAS, and cuBLAS gives a row the
same bits at 1, 16 and 400 rows (bench/results/2026-12-04_rows_alike_fe75d34_h200.json): the reference's
projections are the scorer's own, bit for bit, while the few-row kernel (BF16 or W12) parts from the scorer in a few
outputs in ten thousand at every layer, as any kernel with another summation order (the GEMV) may. Such a ruler
sides with the reference; the float32 target shares its rounding with neither side."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from specpilot.bench.harness import Runner, TurnRecord
from specpilot.config.env import parse
from specpilot.datasets import Request
from specpilot.deployment import Deployment
from specpilot.errors import UserError
from specpilot.forcing.judge import calibrate_delta, compare, first_divergence, tally, verdict
from specpilot.forcing.noise import margin_noise
from specpilot.forcing.outputs import OutputStore
from specpilot.forcing.score import score_output
from specpilot.models.dense import DenseTarget

ROLES = ("reference", "candidate", "ar")
NOISE_REQUESTS = 4  # AR outputs recomputed for the noise measurement
EXACT_AR = "ar:graphs=false,kernels=naive"  # AR of the float32 model: the PyTorch references, no capture
# requests AR of the float32 model answers (reported, it does not decide): it runs here, uncaptured, one request at a
# time, so at the power bound (a thousand requests) it would take longer than everything else
EXACT_AR_REQUESTS = 16
EXACT_MODES = ("auto", "deployment", "float32")
Outputs = Callable[[Request, int], list[TurnRecord]]  # a request's turn records from another tree's worker
# (system name, requests, max_new, progress, keep) -> each request's turn records, made elsewhere
# (forcing/parallel.py), each request's also handed to keep as it comes
Generate = Callable[[str, list[Request], int, Callable[[], None] | None,
                     Callable[[str, list[TurnRecord]], None] | None], dict[str, list[TurnRecord]]]


@dataclasses.dataclass(frozen=True)
class Foreign:
    """A system of another tree: known here by its name only."""

    name: str


def checked(runner: Runner, request: Request, records: list[TurnRecord]) -> list[TurnRecord]:
    """A foreign worker's records, if each turn's prompt is the one this install builds (the request's text and the
    candidate's own earlier answers in the chat template); UserError otherwise: its tokens would be scored
    against a prompt it did not answer."""
    tok, messages = runner.tokenizer, []
    if len(records) != len(request.turns):
        raise UserError(f"{request.id}: the candidate's worker returned {len(records)} turns, not "
                        f"{len(request.turns)}")
    for text, rec in zip(request.turns, records, strict=True):
        messages.append({"role": "user", "content": text})
        if list(rec.prompt) != tok.chat_prompt(messages):
            raise UserError(f"{request.id}: the candidate's worker answered a prompt other than the request's")
        messages.append({"role": "assistant", "content": tok.decode(rec.tokens)})
    return records


def exact_mode(mode: str, dep: Deployment, reference: str, candidate: str, foreign: bool = False) -> str:
    """'deployment' or 'float32': the exact target that judges `candidate` against `reference` (module doc).
    foreign: the candidate is another tree's code (its outputs come from its own worker)."""
    if mode not in EXACT_MODES:
        raise UserError(f"the exact target is one of {', '.join(EXACT_MODES)}, got {mode!r}")
    if mode != "auto":
        return mode
    if dep.torch_dtype().itemsize == 4:  # the deployment is the float32 function already
        return "deployment"
    if foreign or parse(reference).plan().features() != parse(candidate).plan().features():
        return "float32"
    return "deployment"


class ExactTargets:
    """The float32 model, built the first time a judgement needs it (`target("float32")`); None for the deployment's
    own target."""

    def __init__(self, dep: Deployment):
        self.dep = dep
        self._float32: DenseTarget | None = None

    def target(self, mode: str) -> DenseTarget | None:
        if mode == "deployment":
            return None
        if self._float32 is None:
            self._float32 = exact_target(self.dep)
        return self._float32

    def pick(self, requested: str, reference: str, candidate: str, foreign: bool = False
             ) -> tuple[str, DenseTarget | None]:
        """(mode, `force`'s `exact`) for judging `candidate` against `reference` (`exact_mode`)."""
        mode = exact_mode(requested, self.dep, reference, candidate, foreign)
        return mode, self.target(mode)


def float32_of(dep: Deployment) -> Deployment:
    """The deployment's function in float32 on its device. A twin is the unwidened pair: the widening computes the
    same function in exact arithmetic (models/twin.py), at 1/r^2 of the memory (a hybrid twin's GDN layers write
    nothing measurable: its function is the unwidened pair's too, so its GDN machinery is not what this checks)."""
    return dataclasses.replace(dep, dtype="float32", twin_width=1, twin_depth=None, twin_gdn=None)


def exact_target(dep: Deployment) -> DenseTarget:
    """The deployment's target function in float32 on its device (float32_of)."""
    from specpilot.runtime.pair import build_pair

    return build_pair(float32_of(dep), with_drafter=False)[0]


def near_tie_gaps(scorer, reference: list[TurnRecord], ar: list[TurnRecord]) -> list[float]:
    """At each request's first reference-vs-AR divergence, log p(reference token) - log p(AR token)."""
    gaps = []
    for ref, base in zip(reference, ar, strict=True):
        if ref.prompt != base.prompt:
            continue  # a later turn whose history already differs: not the same prefix
        i = first_divergence(ref.tokens, base.tokens)
        if i is not None:
            gaps.append(score_output(scorer, ref.prompt, ref.tokens[: i + 1], others={i: base.tokens[i]}).gap_to[i])
    return gaps


def force(runner: Runner, reference: str, candidate: str, requests, max_new: int, progress=None,
          reuse: dict | None = None, bound: float | None = None, start: int | None = None,
          exact: DenseTarget | None = None, outputs: Outputs | None = None, generate: Generate | None = None,
          on_round: Callable[[dict], None] | None = None, store: OutputStore | None = None,
          exact_ar: bool = True) -> dict:
    """Judge the candidate on requests[:start] (default: all); with `bound`, while the smallest excess mismatch
    rate the scored tokens could detect is above it, double the requests (up to all of them). A reject stands
    whatever the power; a pass that never got the power becomes "inconclusive".

    reuse: a dict kept across calls on the same runner and budget: each (system, request) of the reference and
    AR runs once (never the candidate's: a candidate equal to the reference is a genuine second run of it); keep
    one per `exact`, whose scores it holds.
    exact: the FP32-reference mode's float32 model (`exact_target`); None: score under the deployment's target.
    outputs: the candidate's turn records come from there (a tree under judgement, run by its own worker; its
    system may name options this install does not have); each turn's prompt is checked against the one this
    install builds from the request and the candidate's own earlier answers, then scored here.
    generate: the reference's, AR's and (without `outputs`) the candidate's records come from there, the requests
    of a round at once (forcing/parallel.Pool: worker processes of this install); scored here.
    on_round: called with each round's report (its verdict under the power rule) before the requests double, so
    that a long run cut short keeps them.
    store: the outputs made are kept there and those kept by an earlier run of the same code are reused
    (forcing/outputs.py), so that a run cut short resumes; every token is scored afresh.
    exact_ar: with `exact`, also AR of the float32 model on the first requests, reported beside the verdict (it
    decides nothing: the loop's gate leaves it out). The report's "seconds" say where the time went."""
    cand = parse(candidate) if outputs is None else Foreign(candidate)
    systems = dict(zip(ROLES, (parse(reference), cand, parse("ar")), strict=True))
    reuse = {} if reuse is None else reuse
    own: dict = {}  # the candidate's runs, kept across this call's rounds only
    exact_runner = None if exact is None else Runner(exact, None, runner.tokenizer, runner.context)
    n = min(start or len(requests), len(requests))
    seconds: dict[str, float] = {}  # every round's, summed: a round reuses the outputs and scores made before it
    while True:
        report = _with_power(_judge(runner, systems, requests[:n], max_new, progress, reuse, own, exact_runner,
                                    outputs, generate, store, exact_ar), bound, n)
        for k, v in report["seconds"].items():
            seconds[k] = seconds.get(k, 0.0) + v
        report["seconds"] = dict(seconds)
        if report["verdict"] == "reject" or report["power"]["met"] or n >= len(requests):
            return report
        if on_round is not None:
            on_round(report)
        n = min(2 * n, len(requests))


def _with_power(report: dict, bound: float | None, n: int) -> dict:
    """The report with its power: a pass that could not detect an excess as small as `bound` is inconclusive."""
    report["power"] = {"bound": bound, "requests": n, "met": bound is None or report["detectable_rate"] <= bound}
    if report["verdict"] == "pass" and not report["power"]["met"]:
        report["verdict"] = "inconclusive"
        report["reason"] += (f"; but {n} requests could not detect less than {100 * report['detectable_rate']:.2f} "
                             f"points (bound {100 * bound:.2f}): more requests or longer outputs are needed")
    return report


def _runs(runner: Runner, system, requests, max_new: int, progress, memo: dict, scorer,
          outputs: Outputs | None = None, generate: Generate | None = None,
          store: OutputStore | None = None, role: str = "ar") -> tuple[list, list]:
    """Each request's turn records and scores under `scorer`, from memo where this system already ran it; the
    records from `store` where an earlier run kept them for this role, else made (and kept there)."""
    todo = [r for r in requests if (system.name, r.id) not in memo]
    made: dict[str, list[TurnRecord]] = {}
    if outputs is None and store is not None:
        kept = store.get(role, system.name, max_new)
        made = {r.id: kept[r.id] for r in todo if r.id in kept}
        for _ in range(sum(len(t) for t in made.values()) if progress else 0):
            progress()
    if outputs is None and generate is not None:
        keep = None if store is None else (lambda rid, recs: store.put(role, system.name, max_new, rid, recs))
        made.update(generate(system.name, [r for r in todo if r.id not in made], max_new, progress, keep))
    elif outputs is None and len(made) < len(todo):
        runner.warmup(system)
    records, scores = [], []
    for req in requests:
        key = (system.name, req.id)
        if key not in memo:
            if req.id in made:
                recs = checked(runner, req, made[req.id])
            elif outputs is None:
                recs = runner.run(system, req, max_new, progress)
                if store is not None:
                    store.put(role, system.name, max_new, req.id, recs)
            else:
                recs = checked(runner, req, outputs(req, max_new))
            memo[key] = (recs, [score_output(scorer, r.prompt, r.tokens) for r in recs])
        records += memo[key][0]
        scores += memo[key][1]
    return records, scores


def agreement(requests, reference: list[TurnRecord], candidate: list[TurnRecord]) -> dict:
    """On how many of the requests the candidate's outputs equal the reference's token for token (every turn)."""
    equal, at = 0, 0
    for req in requests:
        turns = len(req.turns)
        pairs = zip(reference[at : at + turns], candidate[at : at + turns], strict=True)
        equal += all(a.prompt == b.prompt and a.tokens == b.tokens for a, b in pairs)
        at += turns
    return {"requests": len(requests), "equal": equal}


def _judge(runner: Runner, systems: dict, requests, max_new: int, progress, reuse: dict, own: dict,
           exact_runner: Runner | None, outputs: Outputs | None = None, generate: Generate | None = None,
           store: OutputStore | None = None, exact_ar: bool = True) -> dict:
    scorer = runner.target if exact_runner is None else exact_runner.target
    seconds, t0 = {}, time.monotonic()
    runs = {}
    for role, s in systems.items():  # each role's outputs made (or read back) and scored
        runs[role] = _runs(runner, s, requests, max_new, progress, own if role == "candidate" else reuse, scorer,
                           outputs if role == "candidate" else None, generate, store, role)
        seconds[role], t0 = time.monotonic() - t0, time.monotonic()
    records = {role: r for role, (r, _) in runs.items()}
    gaps = near_tie_gaps(scorer, records["reference"], records["ar"])
    pairs = [(r.prompt, r.tokens) for r in records["ar"][:NOISE_REQUESTS]]
    key = ("noise", tuple((tuple(p), tuple(t)) for p, t in pairs))  # the same AR outputs: the same measurement
    noise = reuse[key] = reuse[key] if key in reuse else margin_noise(runner.target, pairs, share=runner.shared_plan)
    seconds["noise"], t0 = time.monotonic() - t0, time.monotonic()
    delta, unexplained = calibrate_delta(gaps, noise["max"])
    tallies = {role: tally(s.name, runs[role][1], delta, [(r.prompt, r.tokens) for r in records[role]])
               for role, s in systems.items()}
    judged = verdict(tallies["reference"], tallies["candidate"], tallies["ar"], delta)
    report = {**judged, "delta": delta, "calibration": {"near_tie_gaps": gaps, "noise": noise,
                                                        "partings_beyond_noise": unexplained},
              "agreement": agreement(requests, records["reference"], records["candidate"]),
              "exact": "deployment" if exact_runner is None else "float32",
              "reference": systems["reference"].name, "candidate": systems["candidate"].name,
              "systems": {role: {"system": systems[role].name, **t.to_json()} for role, t in tallies.items()}}
    report["seconds"] = seconds
    if exact_runner is not None and exact_ar:  # AR in float32 beside the verdict: the deployment's precision
        fp32, first = parse(EXACT_AR), requests[:EXACT_AR_REQUESTS]
        _, scores = _runs(exact_runner, fp32, first, max_new, progress, reuse.setdefault("float32", {}), scorer)
        _, ar_scores = _runs(runner, systems["ar"], first, max_new, progress, reuse, scorer)  # kept: no new run
        t = tally("ar (float32)", scores, delta)
        report["systems"]["ar_float32"] = {"system": f"{fp32.name} (float32)", "requests": len(first), **t.to_json()}
        # reported; it does not decide: AR on the same first requests against AR of the float32 model
        report["tests"]["ar_vs_float32"] = compare(tally("ar", ar_scores, delta), t)
        seconds["ar_float32"] = time.monotonic() - t0
    return report
