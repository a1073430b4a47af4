"""Phase 1 with a coding agent (`--agent claude|codex|command:EXE`): the builtin master names the directions (the
ceiling's factors, the base, the memory), and an LLM master (`--master`, optional) proposes more, tried first; for
each one the agent works in its own worktree from the round's base commit (agents/session.py), and what it
submits is judged:

- a submission that changed no code is a system of this install: gated as the builtin agent's are;
- one that changed code is a frozen commit, checked out afresh once the agent is gone, and judged against the
  start's own checkout by loop/gate.TreeGate (its outputs from its own worker, the controller's clock, forcing
  here); its memory entry carries the code delta.

Anything the agent did wrong (killed, a child left running, protected files written, the seal broken, a
submission that is not the tree it measured) refuses its candidates, with the reason, before anything is timed.
A broken seal (the judges' install or the sealed data changed on disk) stops the loop: no later verdict could be
trusted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specpilot.agents.session import AgentSetup, propose, run_agent
from specpilot.agents.worktree import checkout, remove
from specpilot.config.options import OPTIONS
from specpilot.config.system import parse_system
from specpilot.controller.compare import Side
from specpilot.controller.worker import code_hash
from specpilot.errors import UserError
from specpilot.loop.agent import BuiltinAgent, Direction


class Halted(Exception):
    """The judges can no longer be trusted: the loop stops (with everything finished kept)."""


@dataclass
class CodingAgent:
    setup: AgentSetup
    master: BuiltinAgent = field(default_factory=BuiltinAgent)
    base: str = ""  # the commit every worktree starts from (the install's files at the loop's start)
    checkouts: Path | None = None  # where frozen commits are checked out for timing
    target: str = ""  # how the agent's own commands name the deployment (`--preset tiny`, `--deployment F`)
    install_code: str = ""  # code hash of the install at the start: a checkout of the base must have it
    in_flight: int = 1  # the requests the deployment serves at once (regime batch: the judges time closed loops)
    proposer: AgentSetup | None = None  # an LLM master (`--master`): directions beyond the builtin master's

    @property
    def name(self) -> str:
        return self.setup.backend.name

    @property
    def headroom(self) -> float:
        return self.master.headroom

    def directions(self, *args, **kwargs) -> list[Direction]:
        return self.master.directions(*args, **kwargs)

    def tune(self, *args, **kwargs) -> dict:  # Phase 3 (kernel configuration) stays the master's search
        return self.master.tune(*args, **kwargs)

    def brief(self, d: Direction, start: str, ceiling: dict, memory: list[dict]) -> dict:
        keep = ("system", "speedup", "factors", "target", "predicted", "ceiling", "batch_model")
        return {"direction": d.to_json(), "start": start, "target": self.target, "in_flight": self.in_flight,
                "ceiling": {**{k: ceiling.get(k) for k in keep}, "classes": ceiling.get("classes", [])[:6],
                            "candidates": ceiling.get("candidates")},
                "memory": [f"{m['id']}: {m['registry'].get('system')}" for m in memory]}

    def work(self, name: str, brief: dict) -> dict:
        return run_agent(self.setup, name, self.base, brief)

    def propose(self, name: str, start: str, ceiling: dict, named: list[Direction], memory: list[dict]) -> dict:
        """The LLM master's directions for the round (its report; `directions` [] when it proposed none)."""
        brief = {**self.brief(named[0] if named else Direction("none", "none", []), start, ceiling, memory),
                 "named": [d.to_json() for d in named]}
        return propose(self.proposer, name, self.base, brief)

    def with_proposed(self, named: list[Direction], report: dict) -> list[Direction]:
        """The master's directions first (a user who asked for an LLM master wants them tried), then the builtin
        master's, capped as the builtin master caps its own. Options the install lacks are dropped."""
        mine = [Direction(d["factor"], d["mechanism"], [o for o in d["options"] if o in OPTIONS])
                for d in report["directions"]]
        return (mine + named)[: self.master.max_directions]

    def side(self, system: str, commit: str) -> Side:
        """A commit checked out afresh for timing, with the code hash it has now (what its worker must report)."""
        path = checkout(self.setup.repo, commit, self.checkouts / commit[:12])
        code = code_hash(path / "specpilot")
        if commit == self.base and self.install_code and code != self.install_code:
            # the object store is writable to agents (their worktrees commit into it): what the base checks out
            # to must still be the install's own code, or the start would be timed on something else
            raise Halted(f"the base commit {commit[:12]} checks out to code {code[:12]}, not the install's "
                         f"{self.install_code[:12]}: the repository's objects were altered")
        return Side(system, path, code)

    def clean(self) -> None:
        if self.checkouts is not None and self.checkouts.is_dir():
            for p in self.checkouts.iterdir():
                remove(self.setup.repo, p)


def submissions(report: dict, start: str) -> tuple[list[dict], list[dict]]:
    """(to judge, refused): each candidate as the loop's gate records it."""
    cands = report["candidates"]
    if report["refused"]:
        return [], [{"candidate": c["system"] if cands else None, "start": start, "promoted": False,
                     "refused": report["refused"], **_code(c)} for c in cands or [{}]]
    judge, refused = [], []
    for c in cands:
        if c["code"]:
            judge.append(c)
            continue
        try:
            same = parse_system(c["system"]).name == parse_system(start).name
        except UserError as exc:  # no code changed, so the system must be this install's
            refused.append({"candidate": c["system"], "start": start, "promoted": False,
                            "refused": f"it names no system of this install and changed no code ({exc})"})
            continue
        if same:
            refused.append({"candidate": c["system"], "start": start, "promoted": False,
                            "refused": "it submitted the round's start itself"})
        else:
            judge.append(c)
    return judge, refused


def _code(c: dict) -> dict:
    return {"commit": c["commit"], "tree": c["tree"]} if c.get("code") else {}
