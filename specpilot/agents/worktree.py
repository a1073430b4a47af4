"""Git worktrees for agents, and the frozen commits the judges time.

Every git command here runs with hooks and the file-system monitor off, and a worktree's files are frozen with
plumbing that runs no filters (`hash-object --no-filters`, `update-index --index-info`): nothing an agent writes
into a worktree's attributes or hooks runs in the loop's process. A frozen commit is checked out again into a
folder of its own for timing, once the agent and everything it started are gone: the code timed is the commit's,
whatever the worktree holds afterwards.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specpilot.errors import UserError

SAFE = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false")
IDENTITY = {"GIT_AUTHOR_NAME": "specpilot", "GIT_AUTHOR_EMAIL": "loop@specpilot", "GIT_COMMITTER_NAME": "specpilot",
            "GIT_COMMITTER_EMAIL": "loop@specpilot", "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
            "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}  # a frozen commit's id depends on its content only
PRIVATE = ".specpilot"  # a worktree's brief, submission and logs: never part of what is frozen


def git(cwd: Path, *args: str, env: dict | None = None, stdin: bytes | None = None) -> str:
    done = subprocess.run(["git", *SAFE, "-C", str(cwd), *args], capture_output=True, input=stdin, timeout=300,
                          env={**os.environ, **IDENTITY, **(env or {})})
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        raise UserError(f"git {args[0]} failed in {cwd}: {lines[-1] if lines else 'no message'}")
    return done.stdout.decode()


@dataclass(frozen=True)
class Frozen:
    commit: str
    tree: str
    changed: tuple[str, ...]  # paths that differ from the base

    def to_json(self) -> dict:
        return {"commit": self.commit, "tree": self.tree, "changed": list(self.changed)}


def add(repo: Path, commit: str, path: Path) -> Path:
    """A detached worktree of `commit` at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    git(repo, "worktree", "prune")  # registrations of worktrees whose folders are gone (an earlier run deleted)
    git(repo, "worktree", "add", "--detach", str(path), commit)
    return path


def remove(repo: Path, path: Path) -> None:
    subprocess.run(["git", *SAFE, "-C", str(repo), "worktree", "remove", "--force", str(path)], capture_output=True,
                   timeout=300)


def freeze(folder: Path, base: str, message: str, ref: str | None = None, repo: Path | None = None) -> Frozen:
    """A commit (parent `base`) of the folder's files as they are: tracked and untracked ones alike, ignored ones
    and the private folder left out. ref: a ref that keeps the commit from git's garbage collection ("{commit}"
    in it is replaced by the commit's id: one ref per commit, none overwritten)."""
    with tempfile.TemporaryDirectory(prefix="specpilot-freeze-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(folder, "read-tree", base, env=env)
        listed = git(folder, "ls-files", "-z", "--cached", "--others", "--exclude-standard", env=env)
        paths = sorted({p for p in listed.split("\0") if p and not p.startswith(f"{PRIVATE}/")})
        empty = {"GIT_INDEX_FILE": str(Path(tmp) / "fresh")}
        git(folder, "update-index", "--index-info", env=empty, stdin=_entries(folder, paths).encode())
        tree = git(folder, "write-tree", env=empty).strip()
    commit = git(folder, "commit-tree", tree, "-p", base, "-m", message).strip()
    if ref:
        git(repo or folder, "update-ref", ref.replace("{commit}", commit), commit)
    changed = [p for p in git(folder, "diff", "-z", "--name-only", "--no-renames", base, commit).split("\0") if p]
    return Frozen(commit, tree, tuple(changed))


def _entries(folder: Path, paths: list[str]) -> str:
    """`update-index --index-info` lines for the files as they are on disk (gone ones and non-files left out):
    regular files hashed in one `hash-object --stdin-paths` call, links by their target."""
    files, links = [], []
    for rel in paths:
        try:
            st = (folder / rel).lstat()
        except (FileNotFoundError, NotADirectoryError):  # gone, or a folder of it replaced by a file
            continue
        if stat.S_ISLNK(st.st_mode):
            links.append(rel)
        elif stat.S_ISREG(st.st_mode):
            files.append((rel, "100755" if st.st_mode & 0o111 else "100644"))
    if any("\n" in rel for rel, _ in files):
        raise UserError("a file name in the worktree holds a line break: refusing to freeze it")
    blobs = git(folder, "hash-object", "-w", "--no-filters", "--stdin-paths",
                stdin="".join(f"{rel}\n" for rel, _ in files).encode()).split() if files else []
    out = [f"{mode} {blob}\t{rel}\n" for (rel, mode), blob in zip(files, blobs, strict=True)]
    for rel in links:
        blob = git(folder, "hash-object", "-w", "--no-filters", "--stdin",
                   stdin=os.readlink(folder / rel).encode()).strip()
        out.append(f"120000 {blob}\t{rel}\n")
    return "".join(out)


def checkout(repo: Path, commit: str, path: Path) -> Path:
    """A fresh detached worktree of `commit` for timing (replaced if one is there)."""
    if path.exists():
        remove(repo, path)
    return add(repo, commit, path)
