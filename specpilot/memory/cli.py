"""`specpilot memory list|show|replay|apply`: the loop's structured memory from the terminal."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specpilot.errors import UserError
from specpilot.memory.faithful import git
from specpilot.memory.store import Store

REPO = Path(__file__).resolve().parents[2]
app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="The loop's structured memory: mechanisms with their code, registry, evidence, provenance.")
console = Console(width=None if sys.stdout.isatty() else 200)  # piped: no cut at 80 columns
Root = Annotated[Path, typer.Option("--dir", help="The memory folder (entries/ and index.sqlite).")]


err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def _store(root: Path) -> Store:
    if not root.is_dir():
        raise UserError(f"no memory folder at {root} (--dir names one: a loop writes DIR/memory)")
    return Store(root, REPO)


@app.command("list")
def list_(root: Root = REPO / "memory",
          gpu: Annotated[str | None, typer.Option(help="Only entries measured on this GPU.")] = None,
          target: Annotated[str | None, typer.Option(help="Only entries measured with this target.")] = None) -> None:
    """Every entry: id, title, system, where it was measured, whether it carries code."""
    rows = _store(root).rows(**{k: v for k, v in (("gpu", gpu), ("target", target)) if v is not None})
    t = Table(title=f"{len(rows)} memory entries in {root}")
    for col in ("id", "title", "system", "code", "gpu", "target", "regime", "round", "agent"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["id"], r["title"], r["system"], "option" if r["option_only"] else "patch", r["gpu"], r["target"],
                  r["regime"], str(r["round"] if r["round"] is not None else "-"),
                  str(r["agent"]) + (" (reused)" if r["reused"] else ""))
    console.print(t)


@app.command()
def show(entry_id: Annotated[str, typer.Argument(help="An entry's id (a unique prefix will do).")],
         root: Root = REPO / "memory",
         patch: Annotated[bool, typer.Option(help="Print the code patch too.")] = False) -> None:
    """One entry as JSON (registry, evidence, provenance; the patch with --patch)."""
    store = _store(root)
    found = store.find(entry_id)
    problem = store.replay(found)[found]
    if problem:  # shown all the same, for a look at what changed
        err.print(f"[yellow]warning: entry {found} does not hold: {escape(problem)}[/yellow]")
    entry = store.read(found)
    body = entry.to_json()
    if not patch:
        body["patch"] = f"<{len(entry.patch.splitlines())} lines; --patch prints them>" if entry.patch else ""
    console.print_json(json.dumps({"id": entry.id, **body}))


@app.command()
def replay(entry_id: Annotated[str | None, typer.Argument(help="One entry (default: all).")] = None,
           root: Root = REPO / "memory") -> None:
    """Re-check entries: their files are what their id says, and the patch applied to its base commit gives the
    recorded tree. Exit 1 if any fails."""
    results = _store(root).replay(entry_id)
    if not results:
        console.print(f"no entries in {root}", markup=False)
    for i, problem in results.items():
        console.print(f"[green]ok[/green] {i}" if problem is None else f"[red]rejected[/red] {i}: {problem}")
    if any(p is not None for p in results.values()):
        raise typer.Exit(1)


@app.command()
def apply(entry_id: Annotated[str, typer.Argument(help="An entry's id (a unique prefix will do).")],
          worktree: Annotated[Path | None, typer.Option(help="Check the entry's base commit out here (a new git "
                                                        "worktree) and apply its patch to it.")] = None,
          root: Root = REPO / "memory") -> None:
    """Print the system an entry runs as; with --worktree, also materialise its code."""
    store = _store(root)
    found = store.find(entry_id)
    problem = store.replay(found)[found]
    if problem:
        raise UserError(f"entry {found} does not hold: {problem}")
    entry = store.read(found)
    if worktree is not None:
        if worktree.exists():
            raise UserError(f"{worktree} exists: name a new folder for the worktree")
        git(REPO, "worktree", "add", "--detach", str(worktree), entry.base_commit)
        if entry.patch:
            git(worktree, "apply", "--binary", "-", stdin=entry.patch)
        console.print(f"{worktree}: {entry.base_commit[:12]}" + (" + patch" if entry.patch else " (no code)"),
                      markup=False)
    elif entry.patch:
        err.print(f"entry {found} carries code (a patch against {entry.base_commit[:12]}): its system runs only "
                  "with it; --worktree DIR checks it out", markup=False)
    console.print(entry.registry["system"], markup=False)
