"""The one schema of a result file: provenance (when, which code, which machine, how it was run, any
environment override) and, per system, its complete configuration (every option and the kernel plan with
its tuning table). `specpilot bench`, `force`, `compare`, drafter training and the GPU scripts write it."""

from __future__ import annotations

import contextlib
import datetime
import errno
import io
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from specpilot.errors import UserError

SCHEMA = 1


def environment() -> dict:
    """Provenance: date, commit (SPECPILOT_COMMIT where the tree was copied without its history, as on the
    GPU machine), whether the tree had uncommitted changes, the command, device, versions, and the options
    an environment override set (config/env.py)."""
    import torch  # here: the CLI checks its outputs (common.py) before it needs torch

    head = provenance()
    tail = {key: head.pop(key) for key in ("python", "env_overrides")}  # the device goes before them, as ever
    cuda = torch.cuda.is_available()
    return {**head, "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
            "torch": torch.__version__, **tail}


def provenance() -> dict:
    """environment() without the device and torch's version, so without importing torch: for a client that
    measures a remote server (`specpilot bench serve`), whose device this machine cannot see."""
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
    return {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": dirty,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "python": platform.python_version(),
        "env_overrides": {VARIABLE: override_text()} if override_text() else {},
    }


def system_record(engine) -> dict:
    """A system as an engine ran it: every option, the kernel plan with the tuning table it ran under, (with
    weights=w12) what the target's projections are stored as and the bytes they hold, (with weights=fp8) the path
    its FP8 products ran on and the bytes held, and (with weights=w12 or fewrow=true) the path their few-row
    products ran on."""
    record = {**engine.system.to_json(), "plan": engine.plan.to_json()}
    w12 = getattr(engine, "w12_report", None)
    if w12 is not None:  # held: dense copies kept beside W12 forms count; saved only once some are freed
        record["w12"] = {k: w12[k] for k in ("bf16_bytes", "w12_bytes", "held_bytes", "dense_copy", "saved",
                                             "kept_bf16", "allocated_change_bytes") if k in w12}
    fp8 = getattr(engine, "fp8_report", None)
    if fp8 is not None:  # weights=fp8: what ran the products and the bytes held
        record["fp8"] = {k: v for k, v in fp8.items() if k != "tensors"}
    kernel = getattr(engine, "kernel_record", None)
    if kernel is not None:
        record["kernel"] = kernel
    return record


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_figure(path: str | Path, fig, **savefig) -> None:
    """A matplotlib figure as a file (its format from path's suffix), written as write_bytes_atomic writes."""
    buf = io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix.lstrip(".") or "png", **savefig)
    write_bytes_atomic(path, buf.getvalue())


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """How a command writes a file. A regular file (or a new one) is written via a temporary file beside it and a
    rename: a crash never leaves it half-written. A symlink is written through to its target (the link stays). A
    device, FIFO or socket is written in place: renaming over one would put a regular file where it was (as root
    even /dev/full). A descriptor of this process (/dev/stdout as `> file` made it) is written through that
    descriptor, so what the command prints after it follows it. A failed write is a one-line UserError."""
    path = Path(path)
    try:
        fd = open_descriptor(path)
        if fd is not None:
            _write_descriptor(fd, data)
        elif in_place(path):
            with open(path, "wb") as f:
                f.write(data)
        else:
            _replace(Path(os.path.realpath(path)), data)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None


def in_place(path: Path) -> bool:
    """path exists and is neither a regular file nor a folder: it is written in place, never replaced."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # not there (or not reachable): a new file, whose folder check_output and _replace check
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def open_descriptor(path: Path) -> int | None:
    """The descriptor of this process that path names (/dev/stdout, /dev/fd/N, /proc/self/fd/N, or a link to
    one), else None: a new open of such a regular file would write from its start, under what the shell's
    descriptor writes next."""
    hop, fds = Path(os.path.abspath(path)), os.path.realpath(f"/proc/{os.getpid()}/fd")
    for _ in range(40):  # the kernel's own limit on a chain of links
        parent = os.path.realpath(hop.parent)
        if parent == fds and hop.name.isdigit():
            return int(hop.name)
        if not hop.is_symlink():
            return None
        hop = Path(os.path.normpath(os.path.join(parent, os.readlink(hop))))
    return None


def _write_descriptor(fd: int, data: bytes) -> None:
    for stream in (sys.stdout, sys.stderr):  # what Python buffered for it goes first
        with contextlib.suppress(AttributeError, OSError, ValueError):
            if stream.fileno() == fd:
                stream.flush()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _replace(path: Path, data: bytes) -> None:
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "it is a folder")
    if not path.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, f"folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def folder_atomic(path: str | Path, suffix: str = ".partial"):
    """Yield a fresh folder beside `path` to fill; on success it replaces `path` as one unit, on any failure (or
    Ctrl-C) it goes and `path` is as it was. A symlink is written through: its target is the folder replaced."""
    path = Path(os.path.realpath(path))  # absolute: "." has no name to put a sibling beside
    if path.exists() and not path.is_dir():  # the swap would rename a file (or a device) away and drop it
        raise UserError(f"cannot write {path}: it is not a folder")
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
