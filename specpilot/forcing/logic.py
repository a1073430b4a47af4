"""The deterministic half of the lossless judge: a candidate's tokens against AR's, token for token, in float32.

A change of which tokens are proposed (a tree, a node budget, a block size, a builder) is lossless exactly when
every committed token is the exact target's greedy choice. In float32 that is decidable: a lossless candidate
answers as AR does, except where the two runs' reduction orders part at a near-tie, and such a parting is within
float32's own noise (a few millionths of a nat) where any lossy change (a biased logit, an unverified draft, a
skipped layer, a lower-precision head) parts by far more. So each request is run by the candidate and by AR in
float32 on the deployment's device; the first token where they part is scored under the float32 target: within
`eps` (float32's measured reduction-order noise, times a safety factor) the request is a tie and excused, beyond it
the candidate is rejected with the request, the position and the gap.

A bf16 deployment is checked on the float32 model of the same function (its target and drafter in float32; a
twin's unwidened pair, models/twin.py); a float32 deployment on its own models. What float32 cannot show is
reported, not guessed: a candidate whose mechanism does not run in float32 (W12's forms, the 8-bit pass of
two-level verification, both made from BF16 weights; FP8 weights, quantized from them) is "skipped" here and left to
the statistical judge. weights=fp8 changes the target itself: the FP8 model is the target function, and a system
with it is lossless only against AR with weights=fp8 (weights/fp8.py), which float32 does not run.

The check sees a change only where AR's own output reaches it: a change of logic that alters a fraction p of AR's
greedy choices goes unseen on n tokens with probability (1 - p)^n. So the check scores at least `cover` tokens,
going on past the requests it is given into `pool`, and says the smallest such fraction it sees at 95% (3 / n). On
the bf16 pair a cut of the vocabulary's last eighth (fault=topk_truncate: about 0.25% of AR's tokens) went unseen
on the gate's 384 tokens (2026-12-06); 2048 tokens see it with 99% probability.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

from specpilot.bench.harness import Runner, TurnRecord, run_closed
from specpilot.config.env import parse
from specpilot.config.system import with_options
from specpilot.datasets import Request
from specpilot.deployment import Deployment
from specpilot.errors import UserError
from specpilot.forcing.judge import first_divergence
from specpilot.forcing.noise import margin_noise
from specpilot.forcing.run import float32_of
from specpilot.forcing.score import score_output

EPS_FACTOR = 4.0  # a parting within this many times float32's largest measured noise is a tie
EPS_FLOOR = 1e-5  # nats: where the noise measured is zero (one reduction order on a CPU), still a few ulps of a logit
NOISE_REQUESTS = 2  # AR outputs rescored to measure the noise
SEES = 3.0  # a change altering 3/n of n tokens' choices is missed with probability e^-3 (5%)
# options whose mechanism reads BF16 weights: in float32 they run nothing of their own (the engine refuses them or
# runs the exact weights; weights=fp8 would run a quantized target that the float32 reference is not), so float32
# says nothing about them
BF16_ONLY = {"weights": ("w12", "fp8"), "verify": ("tlv",), "fewrow": (True,)}
FP8_TARGET = ("; weights=fp8 is another target function (the FP8 model is the target: lossless means equal to AR "
              "with weights=fp8, not to the BF16 model)")


def float32_only_misses(system: str) -> str | None:
    """Why float32 cannot check this system's mechanism, or None."""
    s = parse(system)
    off = [f"{k}={str(s.get(k)).lower()}" for k, vs in BF16_ONLY.items() if s.get(k) in vs]
    if off:
        return (f"{', '.join(off)} reads BF16 weights (W12 forms, the 8-bit view, FP8 forms quantized from them): its "
                "mechanism does not run in float32, so only the statistical judge sees it"
                + (FP8_TARGET if s.get("weights") == "fp8" else ""))
    return None


@dataclasses.dataclass
class LogicCheck:
    """deployment: the deployment's models as served (a callable: the loop may release and rebuild them), used as
    they are where they are float32; elsewhere the float32 pair is built here on first use."""

    dep: Deployment
    deployment: Callable[[], Runner] | None = None
    pool: list[Request] = dataclasses.field(default_factory=list)  # requests for coverage past the given ones
    cover: int = 0  # tokens the check scores at least (where the pool holds them)
    cover_tokens: int = 256  # the output length of each pool request it adds
    _runner: Runner | None = None
    _ar: dict = dataclasses.field(default_factory=dict)  # (request id, tokens) -> AR's turn records
    _eps: float | None = None
    _noise: dict | None = None

    @property
    def runner(self) -> Runner:
        if self.deployment is not None and self.dep.torch_dtype().itemsize == 4:
            return self.deployment()
        if self._runner is None:
            self._runner = float32_runner(self.dep)
        return self._runner

    def ar(self, request: Request, tokens: int) -> list[TurnRecord]:
        """AR's turn records, one request at a time: the reference, also under regime batch."""
        key = (request.id, tokens)
        if key not in self._ar:
            self._ar[key] = self.runner.single().run(self._named("ar"), request, tokens)
        return self._ar[key]

    def _named(self, system: str):
        """The system as the check runs it. On a GPU on the PyTorch references, uncaptured: the same function (each
        kernel is tested against its reference) with no kernel compiled for float32 (a GPU's Triton kernels would
        each compile anew for it) and nothing captured for a check that runs once."""
        named = parse(system)
        if self._naive() and named.get("kernels") == "auto":
            named = with_options(named, "kernels=naive,graphs=false")
        return named

    def _answers(self, system: str, items: list[tuple[Request, int]]):
        """(request, length, its turn records) for each item, in order: one at a time, or under regime batch (the
        runner's slots) each run of consecutive items of one length together, `slots` in flight, as served."""
        named, slots = self._named(system), self.runner.slots
        group: list[tuple[Request, int]] = []
        for k, item in enumerate(items):
            group.append(item)
            last = k + 1 == len(items) or items[k + 1][1] != item[1] or len(group) == slots
            if not last:
                continue
            if slots > 1:
                recs = run_closed(self.runner, named, [r for r, _ in group], item[1])[0]
                yield from ((r, n, [x for x in recs if x.id.split("#")[0] == r.id]) for r, n in group)
            else:
                yield from ((r, n, self.runner.run(named, r, n)) for r, n in group)
            group = []

    def _naive(self) -> bool:
        """Whether the check runs on the PyTorch references (a GPU: see _named)."""
        return self.runner.target.embed.weight.device.type == "cuda"

    def eps(self, requests: list[Request], tokens: int) -> float:
        """The tie bound: float32's reduction-order noise on AR's own outputs (forcing/noise.py), measured once."""
        if self._eps is None:
            pairs = [(rec.prompt, rec.tokens) for r in requests[:NOISE_REQUESTS] for rec in self.ar(r, tokens)]
            self._noise = margin_noise(self.runner.target, pairs, naive=self._naive())
            self._eps = max(EPS_FACTOR * self._noise["max"], EPS_FLOOR)
        return self._eps

    def check(self, system: str, requests: list[Request], tokens: int) -> dict:
        """{"verdict": "pass" | "reject" | "skipped", "reason", counts, each parting, what ran (mechanism)}."""
        missed = float32_only_misses(system)
        if missed:
            return {"verdict": "skipped", "reason": missed, "system": system}
        # a name the engine does not take: its UserError before anything runs; plain AR is the reference itself
        # (42 s on a busy two-core CPU to find it equal)
        if parse(system).name == "ar":
            return {"verdict": "pass", "system": system, "reason": "plain AR is what the check compares with"}
        eps = self.eps(requests, tokens)
        scorer = self.runner.target
        equal, ties, records, ran_as = 0, [], [], self._named(system).name
        answers = self._answers(system, self._plan(requests, tokens))
        for i in itertools.count():
            if i >= len(requests) and sum(len(r.tokens) for r in records) >= self.cover:
                break
            try:
                req, length, mine = next(answers)
            except StopIteration:
                break
            except UserError as exc:
                return {"verdict": "skipped", "system": system, "reason": f"does not run in float32: {exc}"}
            except (RuntimeError, ValueError) as exc:  # a kernel without a float32 form, say: no evidence either way
                first = (str(exc).splitlines() or [""])[0][:300]
                return {"verdict": "skipped", "system": system,
                        "reason": f"does not run in float32 here ({type(exc).__name__}: {first})"}
            records += mine
            parting = _parting(scorer, self.ar(req, length), mine)
            if parting is None:
                equal += 1
                continue
            if parting["gap"] is None or abs(parting["gap"]) > eps:
                by = parting.get("note") or f"by {parting['gap']:.3g} nats"
                return {"verdict": "reject", "system": system, "eps": eps, "parting": parting, "equal": equal,
                        "reason": (f"in float32 it parts from AR at {parting['request']} token {parting['position']}"
                                   f" ({by}), beyond float32's noise ({eps:.2g} nats): it changes the exact "
                                   "target's greedy choice"),
                        **self._where(len(records))}
            ties.append(parting)
        n, checked = sum(len(r.tokens) for r in records), equal + len(ties)
        sees = min(1.0, SEES / n) if n else 1.0
        return {"verdict": "pass", "system": system, "ran_as": ran_as, "requests": checked, "tokens": n,
                "equal": equal, "ties": ties, "eps": eps, "noise": self._noise, "sees_rate": sees,
                "sees": (f"any change of logic that alters at least {100 * sees:.2g}% of AR's greedy choices (95%), "
                         f"on {n} tokens"),
                "mechanism": mechanism(self.runner, parse(ran_as), records),
                "reason": (f"equals AR token for token in float32 on {equal} of {checked} requests ({n} tokens; "
                           f"it would see a change of logic altering {100 * sees:.2g}% of AR's choices)"
                           + (f"; {len(ties)} parted at a near-tie within float32's noise ({eps:.2g} nats)"
                              if ties else "")),
                **self._where(len(records))}

    def _plan(self, requests: list[Request], tokens: int) -> list[tuple[Request, int]]:
        """The requests given, at `tokens`; then the pool's others, at `cover_tokens` (the caller stops once
        `cover` tokens were scored)."""
        have = {r.id for r in requests}
        return [(r, tokens) for r in requests] + [(r, self.cover_tokens) for r in self.pool if r.id not in have]

    def _where(self, turns: int) -> dict:
        t = self.runner.target.embed.weight
        return {"exact": f"float32 on {t.device.type}", "turns": turns}


def _parting(scorer, ar: list[TurnRecord], mine: list[TurnRecord]) -> dict | None:
    """Where the candidate's turns first part from AR's: the request, turn, position and the float32 log-prob gap
    log p(AR's token) - log p(the candidate's token); None where every turn is equal. One output stopping (end of
    sequence) where the other goes on parts with no gap to score (None): the end token was not chosen alike."""
    for a, c in zip(ar, mine, strict=True):
        i = first_divergence(a.tokens, c.tokens)
        if i is None and len(a.tokens) != len(c.tokens):
            i = min(len(a.tokens), len(c.tokens))
            return {"request": a.id, "position": i, "gap": None,
                    "note": f"{'the candidate' if len(c.tokens) < len(a.tokens) else 'AR'} stopped first"}
        if i is None:
            continue
        s = score_output(scorer, a.prompt, a.tokens[: i + 1], others={i: c.tokens[i]})
        return {"request": a.id, "position": i, "gap": s.gap_to[i], "ar_token": a.tokens[i], "token": c.tokens[i]}
    return None


def mechanism(runner: Runner, system, records: list[TurnRecord]) -> dict:
    """How much of the candidate's mechanism ran in the check: target passes, rows verified in each, tokens
    committed per pass (a tree that never verified more than the chain's rows showed nothing of itself)."""
    steps = sum(len(r.accepted) for r in records)
    committed = sum(sum(r.accepted) for r in records)
    rows = runner.engine(system).rows if system.speculative else 1
    return {"ran": steps > 0, "target_passes": steps, "rows_per_pass": rows, "rows_verified": steps * rows,
            "tau": committed / steps if steps else None, "tree": system.get("tree") if system.speculative else None,
            "what": (f"{steps} target passes of {rows} rows ({system.get('tree')} tree), tau "
                     f"{committed / steps:.2f}" if steps and system.speculative else f"{steps} AR steps")}


def float32_runner(dep: Deployment) -> Runner:
    """The deployment's function in float32 on its device, drafter included (a twin's unwidened pair)."""
    from specpilot.runtime.pair import build_pair

    small = float32_of(dep)
    target, drafter, tok = build_pair(small)
    return Runner(target, drafter, tok, small.context, max_engines=4, slots=dep.in_flight)


def precision_change(dep: Deployment, reference: str, candidate: str) -> str | None:
    """Why the candidate changes the deployment's arithmetic, not only which tokens are proposed (a kernel plan of
    its own, or a mechanism that reads BF16 weights), so that the statistical judge must bound what that changes
    at its full power; None for a change of logic alone, which the float32 check decides. A float32 deployment is
    the exact function itself: nothing of it is left to statistics."""
    if dep.torch_dtype().itemsize == 4:
        return None
    missed = float32_only_misses(candidate)
    if missed:
        return missed
    ref, cand = parse(reference).plan().features(), parse(candidate).plan().features()
    changed = sorted(k for k in cand if cand[k] != ref.get(k))
    if changed:
        return f"its kernel plan differs from the reference's ({', '.join(changed)})"
    return None
