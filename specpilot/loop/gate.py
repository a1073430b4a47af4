"""The loop's gate: a candidate is promoted only if the controller proves it faster than the round's start
(`specpilot compare`, its promotion rule unchanged, workers from the tree's own code) and token forcing does
not reject it (every output token scored under the exact target against the reference's).

The controller's A/A run is measured once per start system and reused for every candidate judged against it
(the sealed final's included: noise belongs to the machine and the system, not to the requests), as `compare
--aa-card` does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from specpilot.bench.datasets import Request
from specpilot.bench.harness import Runner
from specpilot.controller.compare import REPO, Side, compare
from specpilot.errors import UserError
from specpilot.forcing.run import force


@dataclass
class Gate:
    spec: dict  # the controller's request spec (deployment, datasets, split, limit, max_new_tokens, cpu/threads)
    runner: Runner  # forcing runs in the loop's process, on the deployment's models
    forcing_requests: list[Request]
    forcing_tokens: int
    alternating: bool
    reps: int
    timeout: float = 1800
    reference: str = "stock"  # what forcing holds the candidate to: the drafter's released behaviour
    aa: dict = field(default_factory=dict)  # start -> A/A run
    reuse: dict = field(default_factory=dict)  # forcing's memo of reference and AR runs

    def timing(self, start: str, candidate: str, split: str | None = None) -> dict:
        """The noise is the machine's and the start system's: one A/A run per start serves every split."""
        spec = {**self.spec, **({"split": split} if split else {})}
        key = start
        card = compare(Side(start, REPO), Side(candidate, REPO), spec, gpu=None, timeout=self.timeout,
                       aa=self.aa.get(key), reps=self.reps, alternating=self.alternating)
        self.aa.setdefault(key, card["aa"])
        return card

    def forcing(self, candidate: str, requests: list[Request] | None = None, tokens: int | None = None) -> dict:
        return force(self.runner, self.reference, candidate, requests or self.forcing_requests,
                     tokens or self.forcing_tokens, reuse=self.reuse if requests is None else None)

    def judge(self, start: str, candidate: str) -> dict:
        """Timing first (cheap to refuse); forcing only for what the controller would promote."""
        t0, measured_aa = time.monotonic(), start not in self.aa  # this judgement pays for the start's A/A run
        try:
            card = self.timing(start, candidate)
        except UserError as exc:  # the worker died or timed out on this candidate: refused, the loop goes on
            return {"candidate": candidate, "start": start, "promoted": False, "refused": str(exc)}
        out = {"candidate": candidate, "start": start, "controller": summary(card),
               "seconds": {"timing": time.monotonic() - t0, "ab": card["ab"].get("seconds"),
                           "aa": card["aa"].get("seconds") if measured_aa and "aa" in card else 0.0}}
        if card["decision"]["verdict"] == "promote":
            t0 = time.monotonic()
            out["forcing"] = forcing_summary(self.forcing(candidate))
            out["seconds"]["forcing"] = time.monotonic() - t0
        out["promoted"] = out["controller"]["verdict"] == "promote" and out.get("forcing", {}).get("verdict") in (
            "pass", "inconclusive")
        return out


def summary(card: dict) -> dict:
    """What the loop keeps of an evidence card: the verdict, gain and bounds, noise, and each side's rows."""
    d = card["decision"]
    return {"verdict": d["verdict"], "reason": d["reason"], "gain": d["gain"], "lower": d["lower"],
            "upper": d["upper"], "noise": d["noise"], "bar": d["bar"], "requests": d["requests"],
            "outputs_equal": card["ab"]["outputs_equal"], "mode": card["ab"]["mode"],
            "passes": card["ab"].get("passes"), "aa_passes": card.get("aa", {}).get("passes"),
            "aa_gain": card.get("slots", {}).get("aa_gain"),
            "a_rate": _rate(card["ab"]["rows_a"]), "b_rate": _rate(card["ab"]["rows_b"])}


def _rate(rows: list[dict]) -> float | None:
    """Decode tokens per second over a side's rows (every repetition counted)."""
    seconds = sum(r["decode_s"] for r in rows)
    return sum(r["decode_tokens"] for r in rows) / seconds if seconds else None


def forcing_summary(report: dict) -> dict:
    systems = report.get("systems", {})
    return {"verdict": report["verdict"], "reason": report["reason"], "delta": report.get("delta"),
            "detectable_rate": report.get("detectable_rate"),
            "mismatch": {role: s.get("mismatch_rate") for role, s in systems.items()},
            "tokens": {role: s.get("tokens") for role, s in systems.items()}}
