"""The brief an agent gets: a Markdown file and its JSON twin in the worktree's private folder (.specpilot/), never
part of what is frozen and judged."""

from __future__ import annotations

import json
from pathlib import Path

SUBMIT = "submit.json"
DIRECTIONS = "directions.json"
MASTER_RULES = """\
1. Propose mechanisms the directions below do not cover, each one a coding agent could build in one worktree
   as an engine option whose default reproduces stock; say which factor of the ceiling it moves and why.
2. Reason from the evidence here and the code in this worktree; change nothing (your worktree is not judged).
3. Propose nothing rather than something the evidence gives under {headroom:.0%} of headroom.
4. Write .specpilot/directions.json (below); nothing else is read."""
RULES = """\
1. Every change is an engine option whose default reproduces stock, in the options registry
   (specpilot/config/options.py): what an existing system computes must not change.
2. Cheapest evidence first: reason from the ceiling below, then microbenchmarks and replays, then end-to-end runs.
3. Build only where the evidence predicts more than {headroom:.0%} of headroom; otherwise submit nothing.
4. Before submitting, check your system's outputs against AR and run token forcing on the dev requests
   (`python -m specpilot.cli force {target} --candidate SYSTEM --reference stock`).
5. Change files in this worktree only. The judges (controller, token forcing, the sealed requests) run from an
   install outside it that you must not touch; they time your submission from a fresh checkout of what you
   submit, on requests you never see, with their own clock.
6. Submit by writing .specpilot/submit.json (below); nothing else is read. A submission is judged as the files
   are when you end: if you name the git tree you measured ("measured_tree", from `git add -A && git write-tree`
   or `git rev-parse HEAD^{{tree}}`), it must be the tree you submit."""


def rules(headroom: float, target: str) -> str:
    return RULES.format(headroom=headroom, target=target)


def _private(folder: Path, brief: dict) -> None:
    """The private folder with the brief's JSON twin; its .gitignore keeps it out of `git add -A`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".gitignore").write_text("*\n")
    (folder / "brief.json").write_text(json.dumps(brief, indent=1) + "\n")


def _serving(in_flight: int, target: str) -> list[str]:
    """The concurrency the judges time at, where it is more than one request."""
    if in_flight <= 1:
        return []
    return [f"It serves {in_flight} requests in flight: the judges time closed loops of {in_flight} requests, one "
            "batched step for all of them (what pays for one request may not pay here: every request's rows share "
            f"each pass over the weights). Time yours the same way: `specpilot bench {target} --in-flight "
            f"{in_flight} --system SYSTEM`."]


def write(folder: Path, brief: dict) -> Path:
    """BRIEF.md and brief.json in folder; -> the Markdown file."""
    _private(folder, brief)
    d, b = brief["direction"], brief["budget"]
    lines = [f"# SpecPilot brief: {d['factor']}: {d['mechanism']}", "",
             f"You work in the git worktree `{brief['worktree']}`, a copy of the engine at commit {brief['base']}.",
             f"The deployment: {brief['target']}. The round starts from the system `{brief['start']}`.",
             *_serving(brief.get("in_flight", 1), brief["target"]), "",
             "## Direction", "", f"- factor: {d['factor']} (its value in the ceiling: {d.get('value')})",
             f"- mechanism: {d['mechanism']}", f"- options it already has: {', '.join(d['options']) or 'none'}", "",
             "## Ceiling evidence", "", "```json", json.dumps(brief["ceiling"], indent=1), "```", "",
             "## Rules", "", brief["rules"], "",
             "## Memory entries that apply", ""]
    lines += [f"- {m}" for m in brief["memory"]] or ["- none"]
    lines += ["", "## Budget", "", f"- wall time: {b['wall_s']:.0f} s (the loop kills your process group then)",
              f"- turns: {b['turns'] if b['turns'] is not None else 'not capped'}",
              "- money: " + ("not capped" if b["usd"] is None else f"${b['usd']:.2f}"), "",
              "## How to submit", "", f"Write `.specpilot/{SUBMIT}` in the worktree:", "", "```json",
              json.dumps({"candidates": [{"system": "stock:your_option=value", "measured_tree": "optional git tree id",
                                          "note": "what it does and what you measured"}]}, indent=1),
              "```", "", f"The judges' install (read-only for you): `{brief['install']}`.", ""]
    path = folder / "BRIEF.md"
    path.write_text("\n".join(lines))
    return path


def write_master(folder: Path, brief: dict) -> Path:
    """The master's brief: the ceiling, the directions the builtin master names, the memory; it answers with
    directions of its own."""
    _private(folder, brief)
    b = brief["budget"]
    lines = ["# SpecPilot brief: propose directions", "",
             f"You work in the git worktree `{brief['worktree']}` (commit {brief['base']}), read-only in effect.",
             f"The deployment: {brief['target']}. The round starts from the system `{brief['start']}`.", "",
             "## Ceiling evidence", "", "```json", json.dumps(brief["ceiling"], indent=1), "```", "",
             "## Directions already named", ""]
    lines += [f"- {d['factor']}: {d['mechanism']} (options: {', '.join(d['options']) or 'none'})"
              for d in brief["named"]] or ["- none"]
    lines += ["", "## Memory entries", ""] + ([f"- {m}" for m in brief["memory"]] or ["- none"])
    lines += ["", "## Rules", "", brief["rules"], "", "## Budget", "",
              f"- wall time: {b['wall_s']:.0f} s; turns: {b['turns'] if b['turns'] is not None else 'not capped'}",
              "", "## How to answer", "", f"Write `.specpilot/{DIRECTIONS}`:", "", "```json",
              json.dumps({"directions": [{"factor": "tau | kernel | overhead | lattice",
                                          "mechanism": "what to build and why it pays here",
                                          "options": ["existing options it touches, if any"]}]}, indent=1),
              "```", ""]
    path = folder / "BRIEF.md"
    path.write_text("\n".join(lines))
    return path


def read_directions(folder: Path) -> tuple[list[dict], str | None]:
    """The directions a master proposed ([] and why not, when the file is missing or malformed)."""
    path = folder / DIRECTIONS
    if not path.is_file():
        return [], "it proposed nothing (no .specpilot/directions.json)"
    try:
        given = json.loads(path.read_text())["directions"]
        out = [{"factor": str(d["factor"])[:40], "mechanism": str(d["mechanism"])[:500],
                "options": [str(o) for o in d.get("options", [])][:20]} for d in given]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        return [], f"its directions are not valid JSON of the briefed form ({exc.__class__.__name__}: {exc})"
    return out, None


def read_submission(folder: Path) -> tuple[list[dict], str | None]:
    """The candidates an agent submitted ([] and why not, when the file is missing or malformed)."""
    path = folder / SUBMIT
    if not path.is_file():
        return [], "it submitted nothing (no .specpilot/submit.json)"
    try:
        data = json.loads(path.read_text())
        cands = data["candidates"]
        out = [{"system": c["system"], "measured_tree": c.get("measured_tree"), "note": str(c.get("note", ""))[:2000]}
               for c in cands]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        return [], f"its submission is not valid JSON of the briefed form ({exc.__class__.__name__}: {exc})"
    bad = [c for c in out if not isinstance(c["system"], str) or not isinstance(c["measured_tree"], str | None)]
    if bad:
        return [], "its submission names a system or a tree that is not a string"
    return out, None
