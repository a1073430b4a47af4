"""The cheapest evidence for a candidate, before anything is built or timed end to end.

A candidate's predicted speedup over AR is the cost model's S = tau / c, c = T_step / T_AR:
- tau from exact replay of the round's recorded lattices when the candidate changes only the tree builder or
  node budget (replay/walk.py), else from a short recorded run of the candidate itself (a block size, the base);
  a kernel or host option leaves tau as it is;
- T_step from the candidate's captured step timed alone (a microbenchmark: ceiling/run.step_seconds); on a CPU,
  whose speed drifts within seconds, timed back to back with the start's and taken as a ratio to it;
- correctness: on a float32 deployment the candidate's outputs must equal AR's on a few requests.
Every figure is measured here, on the deployment's own models, in the loop's process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specpilot.bench.harness import Runner, run_closed
from specpilot.ceiling.run import step_seconds
from specpilot.config import System
from specpilot.config.env import parse
from specpilot.config.options import OPTIONS
from specpilot.config.system import with_options
from specpilot.datasets import Request
from specpilot.errors import UserError
from specpilot.replay.record import TurnLattices
from specpilot.replay.walk import replay

RUN = "a short recorded run"
TREE_KEYS = {"tree", "nodes", "tree_k"}  # what replay of a recorded lattice predicts exactly
# options that change neither the outputs nor the steps, only how fast a step runs
NEUTRAL = {k for k, o in OPTIONS.items() if o.group in ("kernel", "tuning")} | {"graphs", "lookahead"}


def _changed(a: System, b: System) -> set[str]:
    return {k for k in set(a.options) | set(b.options) if a.get(k) != b.get(k)}


@dataclass
class Evidence:
    runner: Runner
    requests: list[Request]  # dev requests for short runs and correctness
    max_new_tokens: int
    lattices: list[TurnLattices]  # recorded by the round's start system (speculative) or by stock
    lattice_system: System
    step_tokens: int = 8  # outputs before a step timing (the decode loop's steady state)
    step_reps: int = 8
    repeats: int = 3
    paired: bool = False  # candidates' steps timed back to back with the start's (a CPU); see step()
    cache: dict = field(default_factory=dict)
    row_steps: dict = field(default_factory=dict)  # rows -> step seconds of the tree systems predicted so far

    @property
    def in_flight(self) -> int:
        """Requests a step serves (the runner's slots: a deployment's in_flight under regime batch)."""
        return self.runner.slots

    @property
    def hybrid(self) -> bool:
        """Whether the target has Gated DeltaNet layers (the `hybrid_tree` option acts on them)."""
        return "gdn" in self.runner.target.cfg.kinds

    def runs(self, system: System) -> tuple[str, int]:
        """(builder, rows) the engine runs for it (Engine.tree: an EAGLE-3 drafter's stock is a tree)."""
        return self.runner.engine(system).tree[:2] if system.speculative else ("chain", 1)

    def timings(self, system: System) -> list[float]:
        """The captured step timed alone `repeats` times (seconds per step each)."""
        key = ("step", system.name)
        if key not in self.cache:
            self.cache[key] = [self._one(system) for _ in range(self.repeats)]
        return self.cache[key]

    def _timed_as(self, system: System) -> System:
        """What a candidate's step timing times: a tree or budget candidate at its row count with the recorded
        system's builder switched to best_first above the block (c(N), as the cost model has it)."""
        if system.speculative and _changed(system, self.lattice_system) <= TREE_KEYS:
            rows = self.runner.engine(system).rows
            block = self.runner.engine(self.lattice_system).block
            tree = self.lattice_system.get("tree") if rows <= block else "best_first"
            return with_options(self.lattice_system, f"tree={tree},nodes={rows}")
        return system

    def step(self, system: System, ref: System | None = None) -> float:
        """Its fastest timing (noise only adds time). With `ref` and `paired` (a CPU, whose speed drifts within
        seconds): ref's fastest timing times the median ratio of the two timed back to back, `repeats` times."""
        mine = self._timed_as(system)
        if ref is None or not self.paired or self._timed_as(ref).name == mine.name:
            return min(self.timings(mine))
        other = self._timed_as(ref)
        key = ("pair", mine.name, other.name)
        if key not in self.cache:
            ratios = []
            for _ in range(self.repeats):
                t_ref = self._one(other)
                ratios.append(self._one(mine) / t_ref)
            self.cache[key] = sorted(ratios)[len(ratios) // 2]
        return min(self.timings(other)) * self.cache[key]

    def _one(self, system: System) -> float:
        prompt = self.runner.tokenizer.chat_prompt([{"role": "user", "content": self.requests[0].turns[0]}])
        return step_seconds(self.runner, system, prompt, self.step_tokens, self.step_reps)

    def noise(self, system: System) -> float:
        """The spread of its repeated step timings: the median over the fastest, minus 1 (one disturbed timing
        among them does not count). Paired (a CPU): the spread of what a prediction is made of, the ratio of two
        timings back to back, here of the system against itself (the median of |ratio - 1|): on a CPU another
        process's load moves single timings by 28% (two cores, one busy) and their ratios far less."""
        if not self.paired:
            t = sorted(self.timings(system))
            return t[len(t) // 2] / t[0] - 1
        key = ("aa", system.name)
        if key not in self.cache:
            mine = self._timed_as(system)
            spread = sorted(abs(self._one(mine) / self._one(mine) - 1) for _ in range(self.repeats))
            self.cache[key] = spread[len(spread) // 2]
        return self.cache[key]

    def tau(self, system: System, run: bool = False) -> tuple[float, str]:
        """(tau, how it was obtained). Replay wherever the recorded lattices predict it exactly (a builder or budget
        over them; a kernel or host option changes no token); else, or with `run`, a short recorded run."""
        if not system.speculative:
            return 1.0, "AR commits one token per step"
        changed = _changed(system, self.lattice_system)
        if not run and self.lattices and changed <= TREE_KEYS | NEUTRAL:
            key = ("replay", system.name)
            if key not in self.cache:
                name, nodes, k = self.runner.engine(system).tree
                got = replay(self.lattices, [(name, nodes)], k=k)
                self.cache[key] = got["replayed"][f"{name}@{nodes}"]["tau"]
            return self.cache[key], "replay of the recorded lattices"
        key = ("run", system.name)
        if key not in self.cache:
            accepted = [n for r in self.requests[:2] for rec in self.runner.run(system, r, self.max_new_tokens)
                        for n in rec.accepted]
            self.cache[key] = sum(accepted) / max(len(accepted), 1)
        return self.cache[key], RUN

    def replayable(self, system: System) -> bool:
        """Its tau comes from replay of the recorded lattices (a builder or budget over them)."""
        return system.speculative and bool(self.lattices) and _changed(system, self.lattice_system) <= TREE_KEYS

    def bound(self, system: System) -> float | None:
        """An upper bound on a tree or budget candidate's predicted speedup before its step is timed: its replayed
        tau over the cheapest step timed so far at no more rows than it verifies. Not the dearest of those: on a
        small model a step's cost is not monotone in its rows (SmolLM2 on an H100: trees of 4-12 rows 1.48-1.56 ms,
        the 16-row chain 1.39 ms, 32-row trees 1.46 ms), and that bound pruned the budgets that won. None where
        nothing bounds it yet."""
        if not self.replayable(system):
            return None
        rows = self.runner.engine(system).rows
        below = [t for r, t in self.row_steps.items() if r <= rows]
        if not below:
            return None
        return self.tau(system)[0] * self.step(parse("ar")) / min(below)

    def predict(self, system: System, run: bool = False, ref: System | None = None) -> dict:
        """The candidate's predicted speedup over AR, with its parts; {"error": ...} where it cannot be had.
        run: tau from a short run even where replay would do (a start compared with short-run candidates: the
        same requests on both sides, since tau differs from request to request far more than the headroom)."""
        try:
            tau, how = self.tau(system, run)
            t_step, t_ar = self.step(system, ref), self.step(parse("ar"))
        except UserError as exc:  # e.g. a budget whose step timing does not fit the context
            return {"system": system.name, "error": str(exc)}
        except (RuntimeError, ValueError) as exc:  # a value the engine cannot run here: no evidence, not a crash
            return {"system": system.name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        if self.replayable(system):
            rows = self.runner.engine(system).rows
            self.row_steps[rows] = min(self.row_steps.get(rows, t_step), t_step)
        return {"system": system.name, "tau": tau, "tau_from": how, "step_s": t_step, "ar_step_s": t_ar,
                "speedup": tau * t_ar / t_step}

    def equals_ar(self, system: System, requests: int = 2) -> bool | None:
        """On a float32 deployment: does the candidate answer exactly as AR does? None where bf16 arithmetic makes
        token equality no test (token forcing decides there)."""
        if not exact_arithmetic(self.runner):
            return None
        answer = lambda r: [rec.tokens for rec in self.runner.run(system, r, self.max_new_tokens)]  # noqa: E731
        return differs_from_ar(self.runner, self.requests[:requests], self.max_new_tokens, answer) is None


@dataclass
class BatchEvidence(Evidence):
    """Under regime batch (the runner's slots > 1) a candidate's speedup is measured, not modelled: the dev requests
    in a closed loop of `slots` in flight, `repeats` times, each system's fastest run's output tokens a second
    against batched AR's made the same way (a batch step's cost depends on which requests are in it, how far along,
    and with which rows, which a step microbenchmark of one request does not see). Its tau is the same runs'."""

    @property
    def how(self) -> str:
        return f"a closed loop of the dev requests, {self.runner.slots} in flight"

    def _closed(self, system: System) -> tuple[list[float], float]:
        """(each run's output tokens a second, tau)."""
        key = ("closed", system.name)
        if key not in self.cache:
            self.runner.warmup(system)
            runs = [run_closed(self.runner, system, self.requests, self.max_new_tokens) for _ in range(self.repeats)]
            rates = [sum(len(r.tokens) for r in recs) / seconds for recs, seconds in runs]
            accepted = [n for r in runs[0][0] for n in r.accepted]
            self.cache[key] = rates, sum(accepted) / max(len(accepted), 1)
        return self.cache[key]

    def tau(self, system: System, run: bool = False) -> tuple[float, str]:
        return (self._closed(system)[1], self.how) if system.speculative else (1.0, "AR commits one token per step")

    def replayable(self, system: System) -> bool:
        return False  # replay has no batch: every candidate is run

    def bound(self, system: System) -> float | None:
        return None

    def noise(self, system: System) -> float:
        """The spread of its runs' rates: the fastest over the median, minus 1."""
        rates = sorted(self._closed(system)[0])
        return rates[-1] / rates[len(rates) // 2] - 1

    def predict(self, system: System, run: bool = False, ref: System | None = None) -> dict:
        try:
            rates, tau = self._closed(system)
            ar = max(self._closed(parse("ar"))[0])
        except UserError as exc:
            return {"system": system.name, "error": str(exc)}
        except (RuntimeError, ValueError) as exc:
            return {"system": system.name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        return {"system": system.name, "tau": tau if system.speculative else 1.0, "tau_from": self.how,
                "tokens_per_s": max(rates), "ar_tokens_per_s": ar, "speedup": max(rates) / ar}


def exact_arithmetic(runner: Runner) -> bool:
    """A float32 deployment, where a lossless system's tokens equal AR's (in bf16 only forcing can tell)."""
    return runner.target.embed.weight.dtype.itemsize == 4


def differs_from_ar(runner: Runner, requests: list[Request], tokens: int,
                    answer: Callable[[Request], list[list[int]]]) -> str | None:
    """The first request whose answer (each turn's tokens) is not AR's, or None."""
    ar = parse("ar")
    for r in requests:
        if answer(r) != [rec.tokens for rec in runner.run(ar, r, tokens)]:
            return r.id
    return None
