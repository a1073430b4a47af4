"""The loop's run directory: every finished measurement on disk, so that `--resume` redoes none of them.

A measurement is a named step (`round-1/phase-0/ceiling`) whose result is a JSON object written atomically to
`steps/<name>.json` when it finishes, beside the run's key: what the result depends on (the code that measured
it, the deployment, the budgets; loop/main.step_key). A step that was interrupted left nothing and runs again; so
does one whose key is not the run's (a resume under other code or settings: the log names the fields that
differ), and one written before steps carried keys. A step file that is not a step's record (a broken disk, a
hand edit) is the user's to look at: a UserError naming it, never a silent re-run. Events go to `log.jsonl` (one
object per line, flushed as written). One loop at a time holds a run directory (a lock file); a budget (wall
seconds) stops the loop cleanly between steps, never inside one. `run.json` keeps what the steps depend on, so
that a resume under another set-up is refused while it is there; without it each step's key still decides.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from specpilot.errors import UserError
from specpilot.results import write_json_atomic

# a step file that cannot be read back: shown, not re-run silently (it may be a disk's fault, not the run's)
FIX = "look at it, then delete it and run again with --resume to measure that step anew"
NAME = re.compile(r"^[a-z0-9][a-z0-9._=-]*(/[a-z0-9][a-z0-9._=-]*)*$")


def differing(kept: dict, now: dict) -> list[str]:
    """The fields whose values differ, a dict's by its own fields one level down (`deployment.dtype`)."""
    out = []
    for k in sorted(set(kept) | set(now)):
        a, b = kept.get(k), now.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{k}.{f}" for f in sorted(set(a) | set(b)) if a.get(f) != b.get(f)]
        elif a != b:
            out.append(k)
    return out


class BudgetSpent(Exception):
    """The run's budget is spent: the loop stops between steps, everything finished kept."""


class RunDir:
    """shared: a slot's process (loop/slots.py) writing its steps into the run its parent holds the lock of."""

    def __init__(self, root: Path, resume: bool = False, budget_s: float | None = None, shared: bool = False,
                 key: dict | None = None):
        self.root = Path(root)
        self.key = key or {}  # what every step's result depends on: a stored step under another key runs again
        if self.root.exists() and any(self.root.iterdir()) and not (resume or shared):
            raise UserError(f"{self.root} is not empty: pass --resume to continue that run, or name a new folder")
        if (resume or shared) and not (self.root / "steps").is_dir():
            raise UserError(f"{self.root} holds no run to resume")
        (self.root / "steps").mkdir(parents=True, exist_ok=True)
        self._lock = None
        if not shared:
            self._lock = open(self.root / ".lock", "w")  # noqa: SIM115 (held for the run's lifetime)
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UserError(f"another loop is running in {self.root}") from None
        self.started = time.monotonic()
        self.budget_s = budget_s
        self.ran: list[str] = []  # steps measured by this process
        self.reused: list[str] = []  # steps read back from a previous process
        self.touched: list[str] = []  # every step asked for, in order (measured or read back)
        self.seconds: dict[str, float] = self._durations()  # what each finished step took when it was measured

    def same_run(self, identity: dict) -> None:
        """What the steps depend on (the deployment, its requests, the budgets), kept in run.json by the run that
        started here; a resume under anything else is refused (its steps would be reused as if measured on it)."""
        path = self.root / "run.json"
        if not path.is_file():
            write_json_atomic(path, identity)
            return
        kept = json.loads(path.read_text())
        differ = sorted(k for k in set(kept) | set(identity) if kept.get(k) != identity.get(k))
        if differ:
            raise UserError(f"{self.root} holds a run of another set-up ({', '.join(differ)} differ; see its "
                            "run.json): resume it with the arguments it started with, or name a new folder")

    def path(self, name: str) -> Path:
        if not NAME.match(name):
            raise ValueError(f"bad step name {name!r}")
        return self.root / "steps" / f"{name}.json"

    def done(self, name: str) -> bool:
        """Whether the step finished under this run's key (once() would read it back)."""
        return self._stored(name)[0] is not None

    def read(self, name: str) -> dict | None:
        """The step's result if it finished under this run's key, else None."""
        return self._stored(name)[0]

    def once(self, name: str, measure: Callable[[], dict]) -> dict:
        """The step's result: read back if it finished before under this run's key, else measured now (after
        checking the budget) and written atomically with the key. A gate that failed (its result names a
        "candidate" and an "error": its worker died) is measured again."""
        path = self.path(name)
        self.touched.append(name)
        kept, stale = self._stored(name)
        if kept is not None and not (isinstance(kept.get("error"), str) and "candidate" in kept):
            self.reused.append(name)
            return kept
        self.check_budget()
        if stale:
            self.log("stale", step=name, why=stale)
        self.log("start", step=name)
        t0 = time.monotonic()
        result = measure()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"key": self.key, "result": result})
        self.ran.append(name)
        self.seconds[name] = time.monotonic() - t0
        self.log("done", step=name, seconds=self.seconds[name])
        return result

    def _stored(self, name: str) -> tuple[dict | None, str | None]:
        """(its result, None) for a step stored under this run's key; (None, why it is not reused) for one stored
        under another key or none; (None, None) for one never finished. A file that is no step's record: UserError."""
        path = self.path(name)
        if not path.is_file():
            return None, None
        try:
            data = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise UserError(f"{path} is not JSON ({exc}): {FIX}") from None
        if not isinstance(data, dict):
            raise UserError(f"{path} is not a step's record (not a JSON object): {FIX}")
        if "key" not in data:
            return None, "written without a key (before steps carried one)"
        if not (isinstance(data["key"], dict) and isinstance(data.get("result"), dict)):
            raise UserError(f"{path} is not a step's record (its key or result is missing or not an object): {FIX}")
        differ = differing(data["key"], self.key)
        return (None, f"measured under another {', '.join(differ)}") if differ else (data["result"], None)

    def refresh(self) -> None:
        """Take in the durations of steps other processes (the slots) measured since this one started."""
        self.seconds.update(self._durations())

    def cost(self, names) -> float:
        """Seconds the named steps took when they were measured (whichever process measured them)."""
        return sum(self.seconds.get(n, 0.0) for n in set(names))

    def _durations(self) -> dict[str, float]:
        log = self.root / "log.jsonl"
        rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.is_file() else []
        return {r["step"]: r["seconds"] for r in rows if r.get("event") == "done" and "seconds" in r}

    def left(self) -> float | None:
        """Seconds of the budget left (None: no budget)."""
        return None if self.budget_s is None else self.budget_s - (time.monotonic() - self.started)

    def check_budget(self) -> None:
        if self.budget_s is not None and time.monotonic() - self.started > self.budget_s:
            self.log("budget", spent_s=time.monotonic() - self.started)
            raise BudgetSpent(f"the wall-time budget of {self.budget_s:.0f} s is spent")

    def log(self, event: str, **fields) -> None:
        with open(self.root / "log.jsonl", "a") as f:  # one short line per write: processes append whole lines
            f.write(json.dumps({"t": time.time(), "event": event, "pid": os.getpid(), **fields}) + "\n")

    def close(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
