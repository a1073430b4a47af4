"""The builtin agent (no LLM): directions from the ceiling's factors and from memory, each tuned on the cheapest
evidence (replay, microbenchmarks) before anything reaches the gate.

A direction is a mechanism with the options that express it (ceiling/model.CANDIDATES). The agent tries every
value the search space (loop/space.py) allows for those options from the round's start, predicts each one's
speedup (loop/evidence.py), and submits the best few that clear the start's own prediction by the headroom
(3%). It is a search over measured predictions, not a list of known answers: what it submits on a deployment
depends on that deployment's measurements alone.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from itertools import product

from specpilot.ceiling.model import CANDIDATES
from specpilot.config import System
from specpilot.config.options import OPTIONS
from specpilot.config.system import parse_system
from specpilot.loop.evidence import RUN, Evidence
from specpilot.loop.space import BATCH_SHARES, GRIDS, SHARED_NODES, runs_as_named, unsearched, values, variant

FACTORS = ("tau", "kernel", "overhead")  # what a configuration can change (the lattice needs training)
# the options of the kernel and host mechanisms that AR takes too (the base direction's AR variants)
AR_OPTIONS = list(dict.fromkeys(o for f in ("kernel", "overhead") for c in CANDIDATES[f] if c["built"]
                                for o in c["options"] if "ar" in OPTIONS[o].bases))


@dataclass
class Direction:
    factor: str
    mechanism: str
    options: list[str]
    value: float | None = None  # the factor's value in the round's ceiling
    reused: bool = False  # from memory: re-tuned and re-tested here, never counted as a discovery
    systems: list[str] = field(default_factory=list)  # memory: the entries' systems

    def to_json(self) -> dict:
        return asdict(self)


BATCH = Direction("batch", "the batch's verify rows: chosen per step (batch_rows), shared across the requests "
                  "(batch_budget), carrying waiting prompts (admit)", ["batch_rows", "batch_budget", "admit"])


def batch_moves(start: System, in_flight: int, block: int, runs: tuple[str, int] | None = None) -> list[System]:
    """The batch direction's moves: each step's rows chosen from the requests' acceptance (batch_rows=auto); over
    stock's chain, budgets of rows shared by the requests' chains (a draft block per request, BATCH_SHARES rows a
    request on average); and over the start's tree where it is best_first or ddtree, else over best_first trees of
    SHARED_NODES, a budget fixed (BATCH_SHARES) or chosen each step (batch_rows=auto); prompts carried in the
    verify passes (admit=true) over the start. runs: (builder, rows) the engine runs for the start where its
    options do not say it (Engine.tree: an EAGLE-3 drafter's stock is its release's eagle2 tree, not a chain)."""
    if not start.speculative or in_flight < 2:
        return []
    builder, rows = runs or (start.get("tree"), start.get("nodes") or block)
    out = [variant(start, batch_rows="auto", batch_budget=0), variant(start, admit=True)]
    if builder == "chain" and rows == block:  # stock's chain: a block per request
        out += [variant(start, batch_rows="fixed", batch_budget=in_flight * m) for m in BATCH_SHARES if m < block]
    trees = ([start] if builder in ("best_first", "ddtree") else
             [variant(start, tree="best_first", nodes=n) for n in SHARED_NODES])
    for tree in trees:
        rows = tree.get("nodes") or block
        out.append(variant(tree, batch_rows="auto", batch_budget=0))
        out += [variant(tree, batch_rows="fixed", batch_budget=in_flight * m) for m in BATCH_SHARES if m < rows]
    return list({s.name: s for s in out if s.name != start.name}.values())


class BuiltinAgent:
    name = "builtin"

    def __init__(self, headroom: float = 0.03, per_direction: int = 1, max_directions: int = 10, max_gates: int = 6):
        self.headroom, self.per_direction, self.max_directions = headroom, per_direction, max_directions
        self.max_gates = max_gates  # a round's gates at most (the ranked search, loop/search.py)

    def directions(self, factors: dict, start: System, memory: list[dict] = (), speedup: float | None = None,
                   in_flight: int = 1) -> list[Direction]:
        """Largest factor first; within it the ceiling's built mechanisms; then speculation on or off (the base;
        first when the start's measured speedup over AR is below the headroom), then the memory's entries. With
        several requests in flight the batch's verify rows (BATCH) come first: what batching takes from speculation
        (every request's rows verified in one pass, attention per request) is what they trade."""
        order = sorted(FACTORS, key=lambda f: -(factors.get(f, {}).get("value") or 0.0))
        out = [Direction(f, c["mechanism"], list(c["options"]), factors.get(f, {}).get("value"))
               for f in order for c in CANDIDATES[f] if c["built"] and c["options"]]
        if in_flight > 1:
            out.insert(0, BATCH)
        out = out[: self.max_directions]  # the mechanisms' cut: speculation on or off and the memory always come
        base = Direction("base", "speculation on or off", [])
        if speedup is not None and speedup < 1 + self.headroom:  # speculating does not pay here: look at AR first
            out.insert(0, base)
        else:
            out.append(base)
        systems = sorted({e["registry"]["system"] for e in memory})
        if systems:  # (until 2026-12-07 the mechanisms' cut came after it: a GPU round never searched its memory)
            out.append(Direction("memory", "entries of the structured memory", [], reused=True, systems=systems))
        return out

    def candidates(self, d: Direction, start: System, device: str, block: int, width: int = 0,
                   dtype: str | None = None, hybrid: bool = False, in_flight: int = 1,
                   runs: tuple[str, int] | None = None) -> list[System]:
        """Every system the direction can reach from `start` in one move (its parameters varied jointly), each one
        the engine runs as named (block and width: the drafter's, space.runs_as_named); dtype: the served weights'
        (space.values). hybrid: the target has Gated DeltaNet layers (else `hybrid_tree` changes nothing; on one, a
        tree is tried with each way of keeping their state, which costs differently: N states written, or none).
        in_flight: the requests a step serves (the batch direction's budgets are per request); runs: the builder
        and rows the engine runs for `start` (batch_moves)."""
        moves = (batch_moves(start, in_flight, block, runs) if d.factor == "batch" else
                 self._moves(d, start, device, block, dtype))
        if not hybrid:
            moves = [s for s in moves if s.get("hybrid_tree") == start.get("hybrid_tree")]
        elif "tree" in d.options:
            moves += [variant(s, hybrid_tree=v) for s in list(moves) for v in values("hybrid_tree", s, device, block,
                                                                                    dtype)]
        return list({s.name: s for s in moves if runs_as_named(s, block, width)}.values())

    @staticmethod
    def memory_sources(d: Direction, start: System, device: str, dtype: str | None) -> dict[str, list[str]]:
        """The memory direction's candidates from `start`, each with the entries' systems it comes from: an entry's
        options the search may set here (w12_dense, say, is a memory choice, not speed; gemv does nothing on a CPU;
        verify=tlv needs BF16 weights) set on the start; an entry of the other base is no move from it."""
        out: dict[str, list[str]] = {}
        for entry in d.systems:
            if parse_system(entry).base != start.base:
                continue
            move = variant(start, **{k: v for k, v in parse_system(entry).options.items()
                                     if not unsearched(k, v, device, dtype)})
            if move.name != start.name:
                out.setdefault(move.name, []).append(entry)
        return out

    def _moves(self, d: Direction, start: System, device: str, block: int, dtype: str | None) -> list[System]:
        if d.factor == "base":
            other = "ar" if start.speculative else "stock"
            kept = ",".join(f"{k}={v}" for k, v in start.options.items() if "ar" in OPTIONS[k].bases)
            first = parse_system(other + (":" + kept if kept and other == "ar" else ""))
            if other == "stock":
                return [first]
            # speculation off is a direction like any other: AR with each of its kernel and host options too
            return [first] + [variant(first, **{name: v}) for name in AR_OPTIONS
                              for v in values(name, first, device, block, dtype)]
        if d.factor == "memory":
            return [parse_system(name) for name in self.memory_sources(d, start, device, dtype)]
        if not start.speculative and any(o in ("tree", "nodes", "block_size", "tree_k") for o in d.options):
            return []
        if "tree" in d.options:  # a builder is nothing without its budget: tune both (small budgets first: bounds)
            builders = values("tree", start, device, dtype=dtype) + [start.get("tree")]
            return [variant(start, tree=b, nodes=n) for n, b in product(GRIDS["nodes"], builders)
                    if (b, n) != (start.get("tree"), start.get("nodes"))]  # a chain past its block: candidates
        out = []
        for name in d.options:
            out += [variant(start, **{name: v}) for v in values(name, start, device, block, dtype)]
        return out

    def tune(self, d: Direction, start: System, ev: Evidence, device: str, block: int,
             rivals: dict[str, float] | None = None, width: int = 0, dtype: str | None = None,
             deadline: float | None = None) -> dict:
        """Predict every candidate; submit the best `per_direction` that beat the start's prediction by the
        headroom. A candidate whose tau needed a short run is held to the start's prediction from the same short
        run. rivals (base -> predicted speedup of what the round already promoted): a candidate of another base
        cannot be combined with those, so it must also be predicted to beat them by the headroom. A tree or budget
        candidate whose bound (Evidence.bound) cannot reach what it needs is not timed (`pruned`); past `deadline`
        (time.monotonic()) none is (`not reached`).
        -> {"start": prediction, "start_run": ..., "evaluated": [...], "chosen": [systems]}"""
        base = ev.predict(start)
        # the headroom, or twice the spread of the start's own repeated step timings if that is larger: a
        # prediction inside the microbenchmark's noise is no evidence
        noise = ev.noise(start) if "speedup" in base else 0.0
        margin = 1 + max(self.headroom, 2 * noise)
        rivals = rivals or {}

        def rival(system: str) -> float:  # the best promoted of another base
            mine = parse_system(system).base
            return max((v for b, v in rivals.items() if b != mine), default=0.0)

        evaluated, best = [], 0.0
        for c in self.candidates(d, start, device, block, width, dtype, ev.hybrid, ev.in_flight,
                                 ev.runs(start) if d.factor == "batch" else None):
            if deadline is not None and time.monotonic() > deadline:
                evaluated.append({"system": c.name, "not_reached": "the step's share of the budget is spent"})
                continue
            # what it must reach to be submitted: the start's and rivals' bars, and the best replayed so far
            needed = max(base.get("speedup", 0.0) * margin, rival(c.name) * margin,
                         best if self.per_direction == 1 else 0.0)
            up = ev.bound(c)
            if up is not None and up * (1 + 2 * noise) < needed:  # its step is not timed: it cannot be chosen
                evaluated.append({"system": c.name, "bound": up, "pruned": f"bounded at {up:.3f}x over AR, under "
                                  f"the {needed:.3f}x it needs"})
                continue
            evaluated.append(ev.predict(c, ref=start))
            if "speedup" in evaluated[-1] and evaluated[-1].get("tau_from") != RUN:
                best = max(best, evaluated[-1]["speedup"])
        ran = any(e.get("tau_from") == RUN for e in evaluated) and start.speculative
        base_run = ev.predict(start, run=True) if ran else base

        def gain(e: dict) -> float:  # over the start's prediction made the same way
            ref = base_run if e.get("tau_from") == RUN else base
            return e["speedup"] / ref["speedup"] if "speedup" in ref else 0.0

        for e in evaluated:
            if "speedup" in e:
                e["over_start"] = gain(e)
        ok = sorted((e for e in evaluated if "speedup" in e), key=lambda e: -e["over_start"])
        chosen = [e["system"] for e in ok if e["over_start"] >= margin and e["speedup"] >= rival(e["system"]) * margin]
        return {"start": base, "start_run": base_run if ran else None, "noise": noise, "margin": margin,
                "rivals": rivals,
                "bar": base.get("speedup", float("inf")) * margin, "evaluated": evaluated,
                "chosen": chosen[: self.per_direction]}
