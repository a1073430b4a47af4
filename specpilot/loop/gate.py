"""The loop's gate. Deterministic checks before statistics:
1. the float32 check (forcing/logic.py): the candidate's tokens against AR's, token for token, in float32 on the
   deployment's device (a bf16 deployment's float32 model of the same function); a parting beyond float32's own
   noise rejects at once, before anything is timed;
2. the controller proves it faster than the round's start (`specpilot compare`, its promotion rule unchanged);
3. token forcing bounds what precision changes (every output token scored under the exact target against the
   reference's): a reject stands; a pass at the tolerance (`Gate.power_bound`, the paper's stock + 0.5 points) lets
   it through; an inconclusive verdict (too few tokens for that bound) lets through only a change of logic alone,
   which step 1 decided, or a candidate whose outputs equal the reference's token for token (`forcing_refusal`). A
   candidate that changes the arithmetic (its own kernel plan, W12, the 8-bit pass) is forced on a larger pool of
   requests until the bound is reached, scored by the float32 model.

The controller's A/A run is measured once per start system and reused for every candidate judged against it
(the sealed final's included: noise belongs to the machine and the system, not to the requests), as `compare
--aa-card` does; one that no longer stands for the start (its code or configuration changed) is measured anew.

On a GPU the candidates of the loop's own install are timed in the loop's process, on its models (`in_process`:
compare's InProcessWorker), so that one copy of the target is on the GPU; another tree's workers start only after
the loop has released its models (`release`), which are built again when next used (`models`). A worker that
dies (a crash, out of memory, killed, timed out) makes the judgement an error, not a refusal: nothing was judged.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import asdict, dataclass, field

from specpilot.bench.harness import Runner, TurnRecord, closed_generate
from specpilot.config.env import parse
from specpilot.controller.compare import REPO, Side, Worker, WorkerDied, compare
from specpilot.controller.gate import ALPHA, decided_at, sequential_confidence
from specpilot.datasets import Request
from specpilot.errors import UserError
from specpilot.forcing import POWER_BOUND
from specpilot.forcing.logic import LogicCheck, precision_change
from specpilot.forcing.parallel import records_of
from specpilot.forcing.run import ExactTargets, force
from specpilot.loop.evidence import differs_from_ar, exact_arithmetic
from specpilot.results import system_record


@dataclass
class Gate:
    spec: dict  # the controller's request spec (deployment, datasets, split, limit, max_new_tokens, cpu/threads)
    models: Callable[[], Runner]  # the loop's models (built again after a release): forcing runs on them
    forcing_requests: list[Request]
    forcing_tokens: int
    alternating: bool
    reps: int
    timeout: float = 1800
    reference: str = "stock"  # what forcing holds the candidate to: the drafter's released behaviour
    aa: dict = field(default_factory=dict)  # start -> A/A run
    reuse: dict = field(default_factory=dict)  # forcing's memo of reference and AR runs
    seal: object | None = None  # agents/guards.Seal: checked before every judgement of another tree
    exact: ExactTargets | None = None  # the float32 model for kernel changes (forcing/run.exact_mode); None: never
    # the smallest excess mismatch rate forcing must be able to detect for a pass (forcing/run.force's bound); a
    # change of logic alone is decided by the float32 check and may fall short of it (forcing_refusal)
    power_bound: float = POWER_BOUND
    logic: LogicCheck | None = None  # the float32 check; None: none (a test's gate)
    # more dev requests, the forcing requests first: forcing of a precision change doubles into them until the bound
    forcing_pool: list[Request] = field(default_factory=list)
    precision_tokens: int | None = None  # their outputs' length (longer outputs reach the bound on fewer requests)
    in_process: bool = False  # time the install's candidates on `models` (a GPU: one copy of the target), not a worker
    looks: int = 1  # the timing's sequential looks (`timing`); 1: the controller's single run
    release: Callable[[], None] = lambda: None  # frees the loop's models before a worker loads its own copy
    say: Callable[[str], None] = lambda s: None  # progress lines (the loop's console)

    @property
    def runner(self) -> Runner:
        return self.models()

    def timing(self, start: str, candidate: str, split: str | None = None) -> dict:
        """The controller's card, sequentially: with `looks` > 1 a look whose bounds straddle the bar is followed
        by one on twice the requests per dataset (the first ones again and as many new), up to `looks` looks, each
        reading its bounds at sequential_confidence(looks) so that the chance of a false promotion over all of them
        stays at the controller's 5% (one-sided, Bonferroni). The card is the last look's, with "sequential": every
        look's gain and bounds, why it stopped, and the A/B seconds of all."""
        spec = {**self.spec, **({"split": split} if split else {})}
        limit = spec.get("limit")  # None: the worker's own requests, which no look can add to
        n = self.looks if limit else 1
        conf, looks, stopped = sequential_confidence(n), [], "the cap"
        for k in range(n):
            card = self._card(start, candidate, {**spec, "limit": limit * 2**k} if limit else spec, conf)
            d = card["decision"]
            looks.append({"requests": d["requests"], "gain": d["gain"], "lower": d["lower"], "upper": d["upper"],
                          "bar": d["bar"], "seconds": card["ab"].get("seconds")})
            if decided_at(d):
                stopped = "decided"
                break
            if k and looks[-1]["requests"] <= looks[-2]["requests"]:
                stopped = "no more requests"
                break
            if k + 1 < n:
                self.say(f"  timing: {d['requests']} requests undecided (bounds {d['lower']:.3f}-{d['upper']:.3f} "
                         f"around the bar {d['bar']:.3f}): more requests")
        card["sequential"] = {"looks": looks, "max_looks": n, "confidence": conf, "stopped": stopped,
                              "alpha": ALPHA,
                              "seconds": sum(x["seconds"] or 0.0 for x in looks)}
        return card

    def _card(self, start: str, candidate: str, spec: dict, confidence: float) -> dict:
        """One look. The noise is the machine's and the start system's: one A/A run per start serves every split
        and request count."""
        key = start
        if not self.in_process:
            self.release()  # the worker loads its own copy
        card = compare(Side(start, REPO), Side(candidate, REPO), spec, gpu=None, timeout=self.timeout,
                       aa=self.aa.get(key), reps=self.reps, alternating=self.alternating, remeasure=True,
                       runner=self.runner if self.in_process else None, confidence=confidence)
        self.aa[key] = card["aa"]  # the one it used: the cached one, or a new one where that no longer stood
        return card

    def forcing(self, candidate: str, requests: list[Request] | None = None, tokens: int | None = None,
                outputs=None, pool: list[Request] | None = None) -> dict:
        """Token forcing against the reference, scored by the exact target `exact_mode` picks (outputs: another
        tree's, whose code may change any kernel). A precision change (`precision_change`) is forced on `pool`
        (default: the gate's pool), from the requests given up, until the power bound is reached."""
        # below float32, every candidate is scored by the float32 model, which shares its rounding with no side (the
        # deployment's target shares the reference's prefill kernels: on the H100 stock's own margins failed against
        # AR's under it, 2026-12-06)
        mode, scorer = ("deployment", None) if self.exact is None else self.exact.pick(
            "float32" if self.exact.dep.torch_dtype().itemsize < 4 else "auto", self.reference, candidate,
            foreign=outputs is not None)
        start, precise = None, outputs is None and self.precision(candidate)
        requests = requests or self.forcing_requests
        tokens = tokens or (self.precision_tokens if precise and self.precision_tokens else self.forcing_tokens)
        pool = self.forcing_pool if pool is None else pool
        if precise and pool:
            have = {r.id for r in requests}
            requests, start = list(requests) + [r for r in pool if r.id not in have], len(requests)
        reuse = self.reuse.setdefault((mode, tokens), {}) if outputs is None else None
        report = out_of_memory_dies(f"token forcing of {candidate}", lambda: force(
            self.runner, self.reference, candidate, requests, tokens, reuse=reuse, bound=self.power_bound,
            outputs=outputs, exact=scorer, start=start, exact_ar=False,
            generate=closed_generate(self.runner) if getattr(self.runner, "slots", 1) > 1 else None,
            on_round=lambda r: self.say(f"  forcing: {progress(r)}; more requests")))
        self.say(f"  forcing: {progress(report)}: {report['verdict']}")
        report["max_new_tokens"] = tokens
        return report

    def check_logic(self, candidate: str, requests: list[Request] | None = None, tokens: int | None = None
                    ) -> dict | None:
        """The float32 check (forcing/logic.py) on the forcing requests; None where the gate has none."""
        if self.logic is None:
            return None
        return out_of_memory_dies(f"the float32 check of {candidate}", lambda: self.logic.check(
            candidate, requests or self.forcing_requests, tokens or self.forcing_tokens))

    def broken(self) -> list[str]:
        """Why the judges can no longer be trusted (the seal over their install and the sealed data; [] without a
        seal, as in a loop with no coding agent)."""
        return self.seal.broken() if self.seal is not None else []

    def judge(self, start: str, candidate: str) -> dict:
        """The float32 check first (deterministic, and it refuses a lossy candidate before anything is timed), then
        timing, then forcing only for what the controller would promote."""
        broken = self.broken()
        if broken:
            return {"candidate": candidate, "start": start, "promoted": False, "refused": "; ".join(broken),
                    "fatal": True}
        t0 = time.monotonic()
        out: dict = {"candidate": candidate, "start": start, "seconds": {}}
        try:
            logic = self.check_logic(candidate)
        except WorkerDied as exc:  # out of memory: nothing was judged
            return {**out, "promoted": False, "error": str(exc)}
        if logic is not None:
            out["logic"], out["seconds"]["logic"] = logic, time.monotonic() - t0
            self.say(f"  float32 check: {logic['verdict']} ({out['seconds']['logic']:.0f} s)")
            if logic.get("mechanism"):
                out["mechanism"] = logic["mechanism"]
            if logic["verdict"] == "reject":
                return {**out, "promoted": False, "refused": f"the float32 check rejects it: {logic['reason']}"}
        t0, cached = time.monotonic(), self.aa.get(start)
        try:
            card = self.timing(start, candidate)
        except WorkerDied as exc:  # the measurement failed: an error the loop reports, not a verdict
            return {**out, "promoted": False, "error": str(exc)}
        except UserError as exc:  # the candidate cannot run here (the engine refuses it): refused, the loop goes on
            return {**out, "promoted": False, "refused": str(exc)}
        out["controller"] = summary(card)
        out["seconds"].update({"timing": time.monotonic() - t0, "ab": card["sequential"]["seconds"],
                               "aa": card["aa"].get("seconds") if card["aa"] is not cached else 0.0})
        c = out["controller"]
        self.say(f"  timing: gain {c['gain']:.3f}, lower bound {c['lower']:.3f}, bar {c['bar']:.3f}: {c['verdict']} "
                 f"({out['seconds']['timing']:.0f} s)")
        precision = self.precision(candidate)
        if precision:  # what float32 could not run: what the deployment's engine holds and the path it took
            out["mechanism"] = {**out.get("mechanism", {}), **ran_on_deployment(self.runner, candidate)}
        if card["decision"]["verdict"] == "promote":
            t0 = time.monotonic()
            try:
                report = self.forcing(candidate)
            except WorkerDied as exc:
                return {**out, "promoted": False, "error": str(exc)}
            out["forcing"] = forcing_summary(report)
            out["seconds"].update(forcing=time.monotonic() - t0, forcing_tokens=report["max_new_tokens"])
        return decided(out, precision)

    def precision(self, candidate: str) -> str | None:
        """Why the candidate changes the deployment's arithmetic (forcing/logic.precision_change); None: logic
        alone (or no exact model to tell by: a test's gate)."""
        return None if self.exact is None else precision_change(self.exact.dep, self.reference, candidate)


def out_of_memory_dies(what: str, work: Callable):
    """work(), its running out of GPU memory turned into WorkerDied (an error the loop reports, as a timing
    worker's death is, not a crash of the loop), the memory handed back first."""
    import torch

    from specpilot.bench.harness import free_gpu

    try:
        return work()
    except torch.OutOfMemoryError as exc:
        why = (str(exc).strip().splitlines() or [""])[0][:300]
    free_gpu()  # outside the handler: its traceback no longer holds the failed attempt's tensors
    raise WorkerDied(f"{what} ran out of GPU memory: {why}")


def progress(report: dict) -> str:
    """One line of a forcing round: its requests and tokens, what it could detect, where its time went."""
    tokens = (report.get("systems", {}).get("candidate") or {}).get("tokens")
    spent = ", ".join(f"{k} {v:.0f} s" for k, v in report.get("seconds", {}).items())
    rate = report.get("detectable_rate")
    return (f"{(report.get('power') or {}).get('requests')} requests, {tokens} tokens, detects "
            + (f"{100 * rate:.2f} points" if rate is not None else "(no power measured)") + f" ({spent})")


def ran_on_deployment(runner: Runner, candidate: str) -> dict:
    """A change of arithmetic's mechanism as the deployment's engine holds it: W12's forms and the bytes they
    hold, the path its few-row products took (or the 8-bit pass's), from the engine's own record."""
    rec = system_record(runner.engine(parse(candidate)))
    got = {k: rec[k] for k in ("w12", "kernel") if k in rec}
    return {"deployment": got or {"plan": {k: v for k, v in rec["plan"].items() if k != "tuning"}}}


def forcing_refusal(forcing: dict, logic: dict | None = None, precision: str | None = "unknown") -> str | None:
    """Why forcing keeps out a candidate the controller would promote; None: it lets it through. A pass does, a
    reject never does. An inconclusive verdict (its tokens could not reach the power bound) does where the float32
    check decided the candidate (it passed it, and the candidate changes logic alone: `precision` None), or where
    its outputs equal the reference's token for token on every forcing request; else more tokens are needed: on a
    few tokens the tests cannot tell a lossy change of arithmetic (six mismatches of 3.5 nats against none in 64
    tokens pass Fisher at its level)."""
    if forcing["verdict"] == "pass":
        return None
    if forcing["verdict"] == "reject":
        return f"forcing rejected it: {forcing['reason']}"
    if precision is None and logic is not None and logic.get("verdict") == "pass":
        return None
    agree = forcing.get("agreement") or {}
    if agree.get("requests") and agree["equal"] == agree["requests"]:
        return None
    why = f" ({precision})" if precision not in (None, "unknown") else ""
    return (f"forcing is inconclusive, it changes the arithmetic{why} and its outputs differ from the reference's "
            f"on {agree.get('requests', 0) - agree.get('equal', 0)} of {agree.get('requests', 0)} requests: more "
            f"forcing tokens are needed ({forcing['reason']})")


def decided(out: dict, precision: str | None = "unknown") -> dict:
    """A judgement with its decision: promoted where the controller promotes and forcing lets it through; the
    reason where forcing keeps it out. precision: why the candidate changes the arithmetic (None: logic alone)."""
    promote = out["controller"]["verdict"] == "promote"
    refusal = forcing_refusal(out["forcing"], out.get("logic"), precision) if promote and "forcing" in out else None
    return {**out, "promoted": promote and "forcing" in out and refusal is None,
            **({"precision": precision} if precision != "unknown" else {}), **({"refused": refusal} if refusal else {})}


def summary(card: dict) -> dict:
    """What the loop keeps of an evidence card: the verdict, gain and bounds, noise, each side's rows, and what
    each side ran (its code and the hash of its complete configuration, as its worker reported them)."""
    d = card["decision"]
    return {"verdict": d["verdict"], "reason": d["reason"], "gain": d["gain"], "lower": d["lower"],
            "upper": d["upper"], "noise": d["noise"], "bar": d["bar"], "requests": d["requests"],
            "outputs_equal": card["ab"]["outputs_equal"], "mode": card["ab"]["mode"],
            "passes": card["ab"].get("passes"), "aa_passes": card.get("aa", {}).get("passes"),
            "aa_gain": card.get("slots", {}).get("aa_gain"),
            "a_rate": _rate(card["ab"]["rows_a"]), "b_rate": _rate(card["ab"]["rows_b"]),
            "sides": {k: _side(card["ab"][k]) for k in ("a", "b") if k in card["ab"]},
            "controller_code": card.get("controller", {}).get("code_hash"),
            **({"sequential": card["sequential"]} if "sequential" in card else {})}


def _side(side: dict) -> dict:
    config = side.get("config")
    digest = None if config is None else hashlib.sha256(
        json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {"system": side.get("system"), "code_hash": side.get("code_hash"), "config_hash": digest}


def _rate(rows: list[dict]) -> float | None:
    """Decode tokens per second over a side's rows (every repetition counted)."""
    seconds = sum(r["decode_s"] for r in rows)
    return sum(r["decode_tokens"] for r in rows) / seconds if seconds else None


def forcing_summary(report: dict) -> dict:
    """What the loop keeps of a forcing report: the verdict, the exact target, each test's p-values and failures,
    the tokens and mismatch rate per role, the power and the candidate's agreement with the reference."""
    systems = report.get("systems", {})
    tests = {name: {k: t.get(k) for k in ("mismatch_p", "events_p", "margins_p", "level", "failed")}
             | ({"gross": t["gross"]["count"]} if "gross" in t else {})
             for name, t in report.get("tests", {}).items()}
    tokens = (systems.get("candidate") or {}).get("tokens")
    sees = (f"any excess of the candidate's mismatch rate over the reference's of "
            f"{100 * report['detectable_rate']:.2f} points or more (80% power), on {tokens} tokens scored"
            if report.get("detectable_rate") is not None else None)
    return {"verdict": report["verdict"], "reason": report["reason"], "exact": report.get("exact"),
            "held_to": report.get("held_to", "reference"),  # "ar" where the reference could not vouch
            "sees": sees, "cannot_see": ("a smaller excess; a loss that changes no greedy token on these requests and "
                                         "lengths; a difference below the deployment's own reduction-order noise"),
            "delta": report.get("delta"), "detectable_rate": report.get("detectable_rate"),
            "seconds": report.get("seconds"),
            "power": report.get("power"), "agreement": report.get("agreement"), "tests": tests,
            "mismatch": {role: s.get("mismatch_rate") for role, s in systems.items()},
            "tokens": {role: s.get("tokens") for role, s in systems.items()},
            "events": {role: s.get("large_margin_events") for role, s in systems.items()}}


def foreign_outputs(side: Side, spec: dict, requests: list[Request], max_new: int, timeout: float
                    ) -> dict[str, list[TurnRecord]]:
    """Each request's turn records as another tree's own worker produces them (untimed)."""
    with closing(Worker(side, {**spec, "requests": [asdict(r) for r in requests]}, None, timeout)) as w:
        return records_of(w.outputs([r.id for r in requests], max_new), requests)


@dataclass
class TreeGate:
    """The gate for a candidate from another tree (an agent's frozen commit, checked out afresh): its outputs from
    its own worker (equal to AR's on a float32 deployment, then scored by token forcing here), its timing against
    the start's tree with the controller's clock and tamper.py's checks, the seal checked first."""

    gate: Gate

    def judge(self, start: Side, cand: Side, requests: list[Request] | None = None, tokens: int | None = None
              ) -> dict:
        g = self.gate
        requests, tokens = requests or g.forcing_requests, tokens or g.forcing_tokens
        out: dict = {"candidate": cand.system, "start": start.system, "promoted": False,
                     "trees": {"start": str(start.source), "candidate": str(cand.source), "code_hash": cand.code}}
        broken = g.broken()
        if broken:
            return {**out, "refused": "; ".join(broken), "fatal": True}
        t0 = time.monotonic()
        # the workers read no data file; on a GPU (in_process) one worker at a time: the device never holds the
        # target twice (the twin is 56 GB of an 80-GB card)
        spec = {**g.spec, "requests": [asdict(r) for r in requests], **({"one_copy": True} if g.in_process else {})}
        try:
            exact = exact_arithmetic(g.runner)  # asked before the release: no rebuild of the models for it
            g.release()  # each worker below loads its own copy of the target
            outs = foreign_outputs(cand, spec, requests, tokens, g.timeout)
            differs = exact and differs_from_ar(g.runner, requests[:2], tokens,
                                                lambda r: [x.tokens for x in outs[r.id]])
            if differs:
                return {**out, "refused": f"its outputs differ from AR's in float32 ({differs})"}
            key = ("tree", start.system, start.code)  # the noise is the machine's and the start's, not the split's
            cached = g.aa.get(key)
            g.release()
            card = compare(start, cand, spec, gpu=None, timeout=g.timeout, aa=cached, reps=g.reps,
                           clock="controller", remeasure=True)
        except WorkerDied as exc:  # a worker died or timed out: the measurement failed, nothing was judged
            return {**out, "error": str(exc)}
        except UserError as exc:  # its worker refused the system or imported other code: refused
            return {**out, "refused": str(exc)}
        g.aa[key] = card["aa"]
        out["controller"] = summary(card)
        out["tamper"] = card["tamper"]
        out["seconds"] = {"timing": time.monotonic() - t0, "ab": card["ab"].get("seconds"),
                          "aa": card["aa"].get("seconds") if card["aa"] is not cached else 0.0}
        if card["tamper"]["refused"]:
            return {**out, "refused": card["tamper"]["refused"]}
        if card["decision"]["verdict"] == "promote":
            t1 = time.monotonic()
            try:
                report = g.forcing(cand.system, requests, tokens, outputs=lambda req, n: outs[req.id])
            except UserError as exc:
                return {**out, "refused": str(exc)}
            out["forcing"] = forcing_summary(report)
            out["seconds"]["forcing"] = time.monotonic() - t1
        return decided(out)
