"""One agent on one direction: a worktree from the round's base commit, the brief, the backend run under its
budget (jailed where the machine allows), then what it left: the seal checked, the worktree frozen into a commit,
the submission read and checked against it. Anything wrong refuses the agent's candidates before they are timed;
the reason goes into the run's evidence."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from specpilot.agents import jail
from specpilot.agents.backends import Backend, Budget
from specpilot.agents.brief import MASTER_RULES, read_directions, read_submission, rules, write, write_master
from specpilot.agents.guards import Seal
from specpilot.agents.process import run_watched
from specpilot.agents.worktree import PRIVATE, add, freeze, git, remove


@dataclass
class AgentSetup:
    backend: Backend
    repo: Path  # the git repository worktrees come from
    root: Path  # where the worktrees go (the run directory's agents/)
    budget: Budget
    seal: Seal
    protect: list[Path] = field(default_factory=list)  # overlaid in the jail (the install, data, models, run dir)
    use_jail: bool = True
    headroom: float = 0.03
    env: dict = field(default_factory=dict)  # added to the agent's environment

    def jailed(self) -> tuple[bool, str | None]:
        """(jailed, why not)."""
        if not self.use_jail:
            return False, "the jail was turned off (--no-jail)"
        why = jail.available()
        return why is None, why


def run_agent(setup: AgentSetup, name: str, base: str, brief: dict) -> dict:
    """-> {"agent", "worktree", "base", "jail", "finished", "watch", "frozen", "private", "candidates", "refused",
    "fatal"}: each candidate {"system", "commit", "tree", "note", "code"}; `refused` says why none may be judged
    (None: they may); `fatal` when the judges themselves can no longer be trusted (their install or the sealed data
    changed). The worktree is removed at the end (its files are the frozen commit: `git worktree add DIR COMMIT`
    brings them back); the brief, the submission and the agent's stderr stay in ROOT/NAME.private."""
    wt = add(setup.repo, base, setup.root / name)
    try:
        out = _run(setup, name, wt, base, brief)
        frozen = freeze(wt, base, f"specpilot loop: {name} ({setup.backend.name})",
                        ref="refs/specpilot/agents/{commit}", repo=setup.repo)
        subs, problem = read_submission(wt / PRIVATE)
    finally:
        kept = setup.root / f"{name}.private"
        shutil.rmtree(kept, ignore_errors=True)
        if (wt / PRIVATE).is_dir():
            shutil.copytree(wt / PRIVATE, kept, ignore=shutil.ignore_patterns(".gitignore"))
        remove(setup.repo, wt)
    out.update(frozen=frozen.to_json(), private=str(kept))
    broken = setup.seal.broken()
    out["fatal"] = bool(broken)
    wrote = out.pop("wrote")
    refused = "; ".join(broken) or wrote or _killed(out) or problem
    if not refused:
        differ = [c for c in subs if c["measured_tree"] and c["measured_tree"] != frozen.tree]
        if differ:
            refused = (f"it measured tree {differ[0]['measured_tree'][:12]} but submitted tree {frozen.tree[:12]}: "
                       "the code judged would not be the code it measured")
    out["candidates"] = [{"system": c["system"], "commit": frozen.commit, "tree": frozen.tree, "note": c["note"],
                          "code": bool(frozen.changed)} for c in subs]
    out["refused"] = refused or None
    return out


def propose(setup: AgentSetup, name: str, base: str, brief: dict) -> dict:
    """An LLM master's turn: in a worktree of the base (read, not judged), it answers the brief with directions
    beyond the builtin master's. -> {"agent", "jail", "finished", "watch", "directions", "refused", "fatal"}; a
    master that broke a rule (killed, left processes, wrote protected files, broke the seal) proposes nothing."""
    wt = add(setup.repo, base, setup.root / name)
    try:
        out = _run(setup, name, wt, base, brief, master=True)
        directions, problem = read_directions(wt / PRIVATE)
    finally:
        remove(setup.repo, wt)
    broken = setup.seal.broken()
    wrote = out.pop("wrote")
    refused = "; ".join(broken) or wrote or _killed(out)
    out.update(fatal=bool(broken), refused=refused or None, directions=[] if refused else directions,
               problem=problem)
    return out


def _run(setup: AgentSetup, name: str, wt: Path, base: str, brief: dict, master: bool = False) -> dict:
    """The brief written, the agent run to its end (jailed where it can be), what it did recorded."""
    jailed, why_not = setup.jailed()
    brief = {**brief, "worktree": str(wt), "base": base, "budget": setup.budget.to_json(),
             "rules": (MASTER_RULES.format(headroom=setup.headroom) if master else
                       rules(setup.headroom, brief["target"])), "install": str(setup.seal.install)}
    path = (write_master if master else write)(wt / PRIVATE, brief)
    prompt = (f"Read the brief in {path} and follow it: " + (
        "propose directions as it says." if master else
        "improve the engine in this worktree along its direction, check it, and submit as it says."))
    argv = setup.backend.argv(wt, path, prompt, brief["rules"], setup.budget)
    stage = Path(tempfile.mkdtemp(prefix="specpilot-jail-"))
    if jailed:
        git_dir = Path(git(wt, "rev-parse", "--absolute-git-dir").strip())
        common = Path(git(wt, "rev-parse", "--git-common-dir").strip())
        argv = jail.wrap(argv, setup.protect, [wt, git_dir, (common if common.is_absolute() else wt / common)
                                                / "objects"], stage)
    env = {**os.environ, **setup.env, "PYTHONPATH": str(wt), "SPECPILOT_AGENT_WORKTREE": str(wt),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    watch = setup.backend.watch(setup.budget)
    try:
        done = run_watched(argv, wt, setup.budget.wall_s, env, setup.backend.stdin(path), watch.line)
        wrote = jail.protected_names(stage, setup.protect) if jailed else []
        # processes still running in the jail when the agent ended (pids of its namespace; the kernel killed them)
        survived = jail.survivors(stage) if jailed else 0
    finally:
        jail.clear(stage)
    return {"agent": setup.backend.name, "worktree": str(wt), "base": base,
            "jail": {"used": jailed, "why_not": why_not, "wrote_protected": wrote, "survivors": survived},
            "finished": done.to_json(), "watch": watch.to_json(),
            # the jail kept the files; the attempt alone refuses its candidates
            "wrote": wrote and (f"it wrote to protected files (kept unchanged by the jail): {', '.join(wrote[:8])}"
                                + (f" and {len(wrote) - 8} more" if len(wrote) > 8 else ""))}


def _killed(out: dict) -> str | None:
    done = out["finished"]
    if done["killed"]:
        return f"its process group was killed: {done['killed']}"
    n = len(done["stragglers"]) + out["jail"]["survivors"]
    if n:
        return f"{n} of its processes outlived it (killed): a child may change the code after it is submitted"
    return None
