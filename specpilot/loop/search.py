"""Phase 1 as a ranked search: every candidate of every direction predicted on the cheapest evidence first, then
gates spent from the top of the ranking down.

The paper's lesson (a single agent without the cost model chased token counts and never touched the weight reads):
evidence in bulk before any gate. The cheapest evidence comes first: the tau of every tree builder and node budget
by exact replay of the round's recorded lattices (no target needed), the step cost c(N) of each row count once
(shared by every builder that verifies N rows; a budget whose replayed tau over the cheapest step it could have
cannot reach the bar is never timed), AR's own variants (speculation on or off is a direction like any other: tau
is 1, only the step is timed), then kernel and host options, block sizes (a short run each) and the memory's
entries. Each prediction is S = tau x T_AR / T_step (loop/evidence.py); the ranking is by the predicted gain over
the start's own prediction made the same way, and a candidate is put forward only where that gain clears the
headroom (or twice the step timing's spread).

A budget bounds the survey: candidates not reached are listed as such, never guessed.
"""

from __future__ import annotations

import time

from specpilot.config import System
from specpilot.loop.agent import BuiltinAgent, Direction
from specpilot.loop.evidence import RUN, Evidence

# the order evidence is gathered in, cheapest first (a factor not named here comes last)
# (plain speculation off first: AR's step is timed already, and where speculation does not pay, as on a CPU, it is
# the answer; under regime batch the batch's verify rows next: the mechanisms made for it, each a closed loop; AR's
# variants after the trees: a kernel option's engine can cost minutes to build on a large target, and on the twin
# one such timing once spent a round's whole survey before any tree was predicted)
COST_ORDER = ("base", "batch", "tau-tree", "memory", "base-variant", "kernel", "overhead", "tau")
TO_GATE = "to gate"


def _cost(d: Direction, c: System, ev: Evidence) -> tuple:
    kind = "tau-tree" if ev.replayable(c) else "base-variant" if d.factor == "base" and c.options else d.factor
    rank = COST_ORDER.index(kind) if kind in COST_ORDER else len(COST_ORDER)
    return rank, (c.get("nodes") or 0) if kind == "tau-tree" else 0  # small budgets first: they bound the rest


def survey(agent: BuiltinAgent, directions: list[Direction], start: System, ev: Evidence, device: str, block: int,
           width: int, deadline: float | None = None, ceiling: dict | None = None, dtype: str | None = None) -> dict:
    """-> {"start": the start's prediction, "noise", "margin", "ranked": [every candidate, best first, with its
    direction, evidence and status], "skipped": [directions with no candidate here, and why]}. deadline: a
    time.monotonic() past which no more evidence is gathered; dtype: the served weights' (space.values)."""
    base = ev.predict(start)
    noise = ev.noise(start) if "speedup" in base else 0.0
    margin = 1 + max(agent.headroom, 2 * noise)
    bar = base.get("speedup", float("inf")) * margin
    found: dict[str, tuple[System, Direction]] = {}
    skipped = []
    for d in directions:
        mine = agent.candidates(d, start, device, block, width, dtype, ev.hybrid, ev.in_flight,
                                ev.runs(start) if d.factor == "batch" else None)
        if not mine:
            skipped.append({"direction": d.mechanism, "factor": d.factor,
                            "reason": "no value of its options runs here from this start" if d.options or d.systems
                            else "nothing to search"})
        for c in mine:
            found.setdefault(c.name, (c, d))
    # a candidate a memory entry gives names the entries (the report says which carried to this deployment), also
    # where another direction reached it first
    sources = {name: systems for d in directions if d.factor == "memory"
               for name, systems in agent.memory_sources(d, start, device, dtype).items()}
    order = sorted(found.values(), key=lambda cd: _cost(cd[1], cd[0], ev))
    # pruned only against the bar, never against the best prediction so far: the best may be refused at its gate
    # (on the pair on an H100, ar:gemv=true by forcing's power), and the next one down must then be there to gate
    evaluated = []
    for c, d in order:
        row = {"system": c.name, "direction": d.mechanism, "factor": d.factor, **({"reused": True} if d.reused else {}),
               **({"entries": sources[c.name]} if c.name in sources else {})}
        if deadline is not None and time.monotonic() > deadline:
            evaluated.append({**row, "status": "not reached: the survey's share of the budget is spent"})
            continue
        reach = _ceiling_reach(d, start, ceiling)
        if reach is not None and reach < bar:
            evaluated.append({**row, "bound": reach, "status": f"pruned: the ceiling bounds its factor at "
                              f"{reach:.3f}x over AR, under the start's bar {bar:.3f}x"})
            continue
        up = ev.bound(c)
        if up is not None and up * (1 + 2 * noise) < bar:
            evaluated.append({**row, "bound": up, "status": f"pruned: replayed tau over the cheapest step it could "
                              f"have bounds it at {up:.3f}x over AR, under the start's bar {bar:.3f}x"})
            continue
        evaluated.append({**row, **ev.predict(c, ref=start)})
    start_run = ev.predict(start, run=True) if any(e.get("tau_from") == RUN for e in evaluated) else None
    for e in evaluated:
        if "status" in e:
            continue
        if "speedup" not in e:
            e["status"] = f"error: {e.get('error', 'no prediction')}"
            continue
        ref = start_run if e.get("tau_from") == RUN else base
        e["over_start"] = e["speedup"] / ref["speedup"] if "speedup" in ref else 0.0
        e["status"] = TO_GATE if e["over_start"] >= margin else "below the bar"
    # by the predicted gain over the start made the same way (replay against the start's replay, a short run
    # against its short run): on a CPU an AR step timed back to back with the start's and AR's own timing drift
    # apart by more than the headroom, and S over AR of two differently made predictions is no ranking
    ranked = sorted(evaluated, key=lambda e: (-(e.get("over_start") or 0.0), -(e.get("speedup") or 0.0),
                                              e["system"]))
    return {"start": base, "start_run": start_run, "noise": noise, "margin": margin, "bar": bar,
            "ranked": ranked, "skipped": skipped}


def _ceiling_reach(d: Direction, start: System, ceiling: dict | None) -> float | None:
    """What a kernel or host option of the start can reach at most: S times the factor (its kernels at their
    floor, no overhead), from the ceiling of that same start; None where the ceiling bounds nothing."""
    if ceiling is None or d.factor not in ("kernel", "overhead") or not d.value or ceiling.get("system") != start.name:
        return None
    return ceiling["speedup"] * d.value
