"""The jail an agent runs in, where the machine allows one (Linux user, mount and PID namespaces via `unshare`).

Inside, each protected folder (the install the loop and its judges run from, the data, the models) is covered by
an overlay whose writable layer lies in a scratch folder outside it: the agent may write there and sees its
writes, the real files never change, and after the run every file it wrote (or deleted) there is listed and
refuses its candidates. The agent's own worktree and the git metadata a worktree needs are bound back on top,
writable. The agent is the first process of a new PID namespace: when it ends, the kernel kills everything it
started, however its children detached. Without `unshare` (or where the kernel refuses the namespaces or the
overlay) the agent runs unjailed; then only the checks after the fact hold (agents/guards.py) and the run says so.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

UNSHARE = ("--user", "--map-root-user", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc")


@cache
def available() -> str | None:
    """None when agents can be jailed here, else why not (probed once: a namespace with an overlay)."""
    exe = shutil.which("unshare")
    if exe is None:
        return "no `unshare` on this machine"
    with tempfile.TemporaryDirectory(prefix="specpilot-jail-") as tmp:
        (Path(tmp) / "p").mkdir()
        (Path(tmp) / "w").mkdir()
        stage = Path(tmp) / "stage"
        argv = wrap(["sh", "-c", f"touch {shlex.quote(str(Path(tmp) / 'p' / 'x'))}"], [Path(tmp) / "p"],
                    [Path(tmp) / "w"], stage)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`unshare` failed: {exc}"
        if done.returncode != 0:
            return f"the kernel refused the namespaces or the overlay: {done.stderr.strip().splitlines()[-1:]}"
        if (Path(tmp) / "p" / "x").exists() or written(stage) != ["0/x"]:
            return "the overlay did not keep the protected folder unchanged"
    return None


def _outermost(paths: list[Path]) -> list[Path]:
    """Existing folders, resolved, without those inside another one of the list."""
    real = sorted({p.resolve() for p in paths if p.is_dir()})
    return [p for p in real if not any(p != q and p.is_relative_to(q) for q in real)]


def script(protect: list[Path], writable: list[Path], stage: Path) -> str:
    """The shell lines that set the mounts up, then exec the agent ("$@"). stage/keep/i holds a handle on the i-th
    writable folder (bound before the overlays hide it); stage/up/i and stage/work/i are the i-th protected
    folder's overlay layers."""
    protect = _outermost(protect)
    writable = [w.resolve() for w in writable if w.exists()]
    q = shlex.quote
    lines = ["set -e"]
    for i, w in enumerate(writable):
        lines.append(f"mkdir -p {q(str(stage / 'keep' / str(i)))} && mount --bind {q(str(w))} "
                     f"{q(str(stage / 'keep' / str(i)))}")
    for i, p in enumerate(protect):
        up, work = stage / "up" / str(i), stage / "work" / str(i)
        if any(c in str(x) for x in (p, up, work) for c in ",:"):
            raise ValueError(f"an overlay cannot name {p} or {stage} (a comma or colon in the path)")
        lines.append(f"mkdir -p {q(str(up))} {q(str(work))} && mount -t overlay overlay -o "
                     f"{q(f'lowerdir={p},upperdir={up},workdir={work}')} {q(str(p))}")
    for i, w in enumerate(writable):
        lines.append(f"mount --bind {q(str(stage / 'keep' / str(i)))} {q(str(w))}")
    # the survivors' list is opened now, then the stage is covered by an empty tmpfs: the agent cannot reach its
    # layers (to erase what it wrote) nor the list (the mounts and fd 3 keep working, and fd 3 is closed for it)
    lines += [f"exec 3> {q(str(stage / 'survivors'))}", f"mount -t tmpfs -o size=64k,mode=0 tmpfs {q(str(stage))}"]
    # the agent runs under this shell (the namespace's first process); once it ends, what still runs in the
    # namespace (zombies aside) is listed with shell builtins only (a forked helper would list itself), then the
    # shell exits and the kernel kills the rest
    lines += ["set +e", '"$@" 3>&-', "rc=$?", "for d in /proc/[0-9]*; do",
              '  n=${d#/proc/}; [ "$n" = 1 ] && continue', '  read -r st < "$d/stat" 2>/dev/null || continue',
              '  case "$st" in *") Z "*) ;; *) echo "$n" >&3 ;; esac', "done", "exit $rc"]
    return "\n".join(lines)


def wrap(argv: list[str], protect: list[Path], writable: list[Path], stage: Path) -> list[str]:
    stage.mkdir(parents=True, exist_ok=True)
    return [shutil.which("unshare") or "unshare", *UNSHARE, "sh", "-c", script(protect, writable, stage), "jail",
            *argv]


def written(stage: Path) -> list[str]:
    """What the agent wrote or deleted in the protected folders: '<i>/<path>' for the i-th one."""
    up = stage / "up"
    if not up.is_dir():
        return []
    return sorted(str(p.relative_to(up)) for p in up.rglob("*") if not p.is_dir())


def survivors(stage: Path) -> int:
    """How many of the agent's processes were still running in its namespace when it ended (killed since)."""
    path = stage / "survivors"
    return len(path.read_text().split()) if path.is_file() else 0


def protected_names(stage: Path, protect: list[Path]) -> list[str]:
    """written(), with each layer's index replaced by the protected folder it covered."""
    roots = _outermost(protect)
    out = []
    for w in written(stage):
        i, _, rel = w.partition("/")
        out.append(str(roots[int(i)] / rel) if i.isdigit() and int(i) < len(roots) else w)
    return out


def clear(stage: Path) -> None:
    """The scratch layers are the jail's, not the agent's: remove them (their files may be read-only)."""
    for root, dirs, _ in os.walk(stage):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
    shutil.rmtree(stage, ignore_errors=True)
