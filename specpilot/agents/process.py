"""An agent's process: its own process group, a hard wall-clock limit, and nothing left behind.

The program runs in a new session (its own process group) with a marker in its environment. Its stdout is read
line by line as it comes; each line goes to a watcher that may ask for the whole group to be killed (too many
turns, money spent). At the wall-clock limit, when the watcher asks, and always once the program has exited, the
group is killed (SIGKILL). A child that left the group (setsid, a double fork) keeps the marker unless it cleared
its environment: every process that still carries it is killed too, and reported. In the jail (agents/jail.py)
the program is the first process of its own PID namespace, and the kernel kills everything in it when it exits.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

MARK = "SPECPILOT_AGENT_MARK"  # environment variable that names the processes of one agent run


@dataclass
class Finished:
    returncode: int | None  # None: killed by the runner
    seconds: float
    killed: str | None = None  # why the runner killed the group
    stragglers: list[int] = field(default_factory=list)  # processes alive after the program ended (killed)
    stdout_tail: list[str] = field(default_factory=list)
    stderr_tail: str = ""

    def to_json(self) -> dict:
        return {"returncode": self.returncode, "seconds": round(self.seconds, 3), "killed": self.killed,
                "stragglers": self.stragglers, "stderr_tail": self.stderr_tail[-2000:]}


def marked(mark: str) -> list[int]:
    """Processes (other than this one) whose environment carries the mark."""
    needle = f"{MARK}={mark}".encode()
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                out.append(int(proc.name))
        except OSError:  # gone, or not ours to read
            continue
    return out


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # nothing left in it
        pass


def run_watched(argv: list[str], cwd: Path, timeout: float, env: dict | None = None, stdin: Path | None = None,
                watch: Callable[[str], str | None] = lambda line: None, tail: int = 50) -> Finished:
    """Run argv to its end or its limit. stdin: a file to read (else /dev/null: an open pipe makes some CLIs wait
    for input forever). watch(line) -> a reason to kill the group, or None. The stderr goes to a file (a chatty
    program cannot block on a full pipe). However this returns or raises, the group and the marked are killed."""
    mark = secrets.token_hex(8)
    full_env = {**(env if env is not None else os.environ), MARK: mark}
    t0, lines = time.monotonic(), []
    err_path = Path(cwd) / ".specpilot" / "agent.stderr"
    err_path.parent.mkdir(parents=True, exist_ok=True)
    with open(stdin or os.devnull, "rb") as fin, open(err_path, "wb") as ferr:
        proc = subprocess.Popen(argv, cwd=cwd, env=full_env, stdin=fin, stdout=subprocess.PIPE, stderr=ferr,
                                start_new_session=True)
        try:
            killed = _follow(proc, t0, timeout, watch, lines, tail)
            # what still runs besides the program itself: children that outlived it (or were alive at the kill)
            stragglers = [p for p in marked(mark) if p != proc.pid]
        finally:
            _kill_group(proc.pid)
            proc.wait()
            sweep(mark)
    with open(err_path, "rb") as f:  # the end of it: a program may have written gigabytes
        f.seek(max(0, err_path.stat().st_size - 20000))
        err = f.read().decode("utf-8", "replace")
    return Finished(None if killed else proc.returncode, time.monotonic() - t0, killed, stragglers, lines[-tail:], err)


def _follow(proc: subprocess.Popen, t0: float, timeout: float, watch: Callable[[str], str | None], lines: list[str],
            tail: int) -> str | None:
    """Read the program's output until it ends (and exits), a watcher's reason, or the wall-clock limit; -> why it
    must be killed (None: it ended by itself)."""
    limit, buf, out = f"wall-clock limit of {timeout:.0f} s reached", b"", proc.stdout
    while out is not None:
        left = timeout - (time.monotonic() - t0)
        if left <= 0:
            return limit
        ready, _, _ = select.select([out], [], [], min(left, 1.0))
        if not ready:
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(out.fileno(), 65536)
        if chunk:
            *done, buf = (buf + chunk).split(b"\n")
        else:  # stdout closed: it ended, or it closed its output and goes on (waited for below)
            done, buf, out = [buf] if buf else [], b"", None
        for raw in done:
            line = raw.decode("utf-8", "replace")
            lines.append(line)
            del lines[:-tail]
            reason = watch(line)
            if reason:
                return reason
    try:
        proc.wait(timeout=max(0.0, timeout - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        return limit
    return None


def sweep(mark: str) -> list[int]:
    """Kill every process still carrying the mark (a child that left the group); -> their pids."""
    found = marked(mark)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return found
