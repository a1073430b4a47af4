"""Is an entry faithful: does its patch, applied to its base commit, give the source system's code byte for byte?

The check runs in a private git index (GIT_INDEX_FILE): read the base commit's tree, apply the patch to the
index only, write the tree and compare its id with the one the entry recorded. No work tree is touched.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from specpilot.errors import UserError
from specpilot.memory.entry import Entry


def git(repo: Path, *args: str, env: dict | None = None, stdin: str | None = None) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, input=stdin,
                          env={**os.environ, **(env or {})}, timeout=120)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise UserError(f"git {args[0]} failed: {lines[-1] if lines else 'no message'}")
    return done.stdout


def tree_of(repo: Path, commit: str) -> str:
    return git(repo, "rev-parse", f"{commit}^{{tree}}").strip()


def resolve(repo: Path, ref: str) -> str:
    return git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}").strip()


def patch_between(repo: Path, base: str, source: str) -> str:
    """The code delta from base to source, binary files included, with full blob ids."""
    return git(repo, "diff", "--binary", "--full-index", base, source)


def applied_tree(repo: Path, base: str, patch: str) -> str:
    """The tree id of `base` with `patch` applied (raises UserError when the patch does not apply)."""
    with tempfile.TemporaryDirectory(prefix="specpilot-memory-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", base, env=env)
        if patch:
            git(repo, "apply", "--cached", "--binary", "-", env=env, stdin=patch)
        return git(repo, "write-tree", env=env).strip()


def check(repo: Path, entry: Entry) -> str | None:
    """None when the entry is faithful, else why not."""
    try:
        resolve(repo, entry.base_commit)
    except UserError:
        return f"its base commit {entry.base_commit[:12]} is not in this repository"
    try:
        got = applied_tree(repo, entry.base_commit, entry.patch)
    except UserError as exc:
        return f"its patch does not apply to {entry.base_commit[:12]} ({exc})"
    if got != entry.tree:
        return f"applied to {entry.base_commit[:12]} it gives tree {got[:12]}, not the recorded {entry.tree[:12]}"
    return None
