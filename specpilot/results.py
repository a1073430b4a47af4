"""The one schema of a result file: provenance (when, which code, which machine, how it was run, any
environment override) and, per system, its complete configuration (every option and the kernel plan with
its tuning table). `specpilot bench`, `force`, `compare`, drafter training and the GPU scripts write it."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from specpilot.errors import UserError

SCHEMA = 1


def environment() -> dict:
    """Provenance: date, commit (SPECPILOT_COMMIT where the tree was copied without its history, as on the
    GPU machine), whether the tree had uncommitted changes, the command, device, versions, and the options
    an environment override set (config/env.py)."""
    from specpilot.config.env import VARIABLE, override_text

    root = Path(__file__).resolve().parents[1]
    try:
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
        if not top or Path(top).resolve() != root:  # a tree unpacked inside another checkout is not its commit
            commit, dirty = None, None
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    if os.environ.get("SPECPILOT_COMMIT"):  # a copied tree (the GPU machine) may carry a stale .git
        commit, dirty = os.environ["SPECPILOT_COMMIT"], None
    cuda = torch.cuda.is_available()
    return {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": dirty,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "env_overrides": {VARIABLE: override_text()} if override_text() else {},
    }


def system_record(engine) -> dict:
    """A system as an engine ran it: every option, the kernel plan with the tuning table it ran under, (with
    weights=w12) what the target's projections are stored as and the bytes they hold, and (with weights=w12 or
    fewrow=true) the path their few-row products ran on."""
    record = {**engine.system.to_json(), "plan": engine.plan.to_json()}
    w12 = getattr(engine, "w12_report", None)
    if w12 is not None:  # held: dense copies kept beside W12 forms count; saved only once some are freed
        record["w12"] = {k: w12[k] for k in ("bf16_bytes", "w12_bytes", "held_bytes", "dense_copy", "saved",
                                             "kept_bf16", "allocated_change_bytes") if k in w12}
    kernel = getattr(engine, "kernel_record", None)
    if kernel is not None:
        record["kernel"] = kernel
    return record


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write via a temporary file and rename: a crash never leaves a half-written file behind."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise UserError(f"cannot write {path}: folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def folder_atomic(path: str | Path, suffix: str = ".partial"):
    """Yield a fresh folder beside `path` to fill; on success it replaces `path` as one unit, on any failure (or
    Ctrl-C) it goes and `path` is as it was."""
    path = Path(os.path.abspath(path))  # "." has no name to put a sibling beside
    old = path.with_name(f".{path.name}.replaced")
    if old.is_dir() and not path.exists():  # an earlier swap died between its renames: old is the last copy
        old.rename(path)
    tmp = path.with_name(path.name + suffix)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _swap_in(tmp, path, old)


def _swap_in(new: Path, path: Path, old: Path) -> None:
    """Rename the old folder away, the new one in, then delete the old: some complete copy is on disk at every
    instant (a crash between the renames leaves the old one at `old`, put back by the next write)."""
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    try:
        new.rename(path)
    except BaseException:
        if old.exists() and not path.exists():
            old.rename(path)
        shutil.rmtree(new, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_json_atomic(path: str | Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")
