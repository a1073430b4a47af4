"""What the commands share: the Typer apps and consoles, the options several commands take, and the checks
made before any work (a user's mistake is one line and exit 2, never a traceback after the work)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from typer.core import TyperGroup

import specpilot
from specpilot.errors import Interrupted, UserError
from specpilot.memory.cli import app as memory_app
from specpilot.results import in_place, open_descriptor


class _BenchFirst(TyperGroup):
    """Typer lists every group after every command; `bench` is a group (for `bench serve`) and still the first
    command `--help` lists."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda name: name != "bench")  # stable: the others keep their order


app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, cls=_BenchFirst,
                  help="SpecPilot: lossless speculative decoding, measured and tuned per deployment.")
data_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Benchmark data files.")
app.add_typer(data_app, name="data")
models_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Real models from package registries.")
app.add_typer(models_app, name="models")
app.add_typer(memory_app, name="memory")
w12_app = typer.Typer(add_completion=False, no_args_is_help=True, help="W12, the lossless 12-bit weight format.")
app.add_typer(w12_app, name="w12")
# Piped, a console is 80 columns by default and cuts tables there: give it room instead.
console = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def version() -> str:
    """The installed package's version; a tree run without installing it: the one its source names."""
    try:
        return importlib.metadata.version("specpilot")
    except importlib.metadata.PackageNotFoundError:
        return specpilot.__version__


def _print_version(asked: bool) -> None:
    if asked:
        console.print(f"specpilot {version()}", markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def _options(show_version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True, help="Print the version and exit.")] = False) -> None:
    """Options of `specpilot` itself, before the command."""


def system_help(what: str) -> str:
    """The --system help: the bases, every option with its default, and where the defaults come from."""
    from specpilot.config import BASES, OPTIONS

    listed = ", ".join(f"{o.name}={shown(o.default)}" for o in OPTIONS.values() if o.group != "diagnostic")
    return (f"{what} as base[:key=value,...]. Bases: {', '.join(BASES)}. Options (default: stock's, from "
            f"specpilot/config/options.py; `specpilot options` explains each): {listed}. SPECPILOT_OPTIONS="
            "key=value,... sets options on every system (an override, recorded in the results).")


def shown(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


Named = Annotated[str | None, typer.Option("--preset", "-p", help="A named deployment (see `specpilot presets`).")]
Preset = Annotated[str | None, typer.Option("--preset", "-p", help="A named deployment (see `specpilot presets`); "
                                            "with neither --preset nor --deployment: tiny (random models).")]
DeploymentFile = Annotated[Path | None, typer.Option("--deployment", "-d", help="A deployment TOML file.")]
Datasets = Annotated[list[str] | None, typer.Option(
    "--dataset", help="gsm8k, math500, humaneval, mbpp, mtbench or builtin; repeatable. Default: the deployment's.",
    callback=lambda names: list(dict.fromkeys(names)) if names else names)]  # named twice: run once
Limit = Annotated[int | None, typer.Option(help="At most N requests per dataset. Default: the deployment's "
                                           "[budgets] limit, else all.")]
DataDir = Annotated[str | None, typer.Option(help="Folder holding the benchmark files.")]
MaxNewTokens = Annotated[int | None, typer.Option(help="Output budget per generation (tokens). Default: the "
                                                  "deployment's [budgets] max_new_tokens.")]
Split = Annotated[str | None, typer.Option(help="dev (tuning), sealed (finals) or all. Default: the deployment's "
                                           "split, else dev.")]


@contextlib.contextmanager
def interruptible(kept: str):
    """Ctrl-C inside: stop, and say what was kept (Typer would otherwise exit 130 with a blank line)."""
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(kept) from None


@contextlib.contextmanager
def progress(out: Console, start: str = "starting"):
    """Long work's say(step): on a terminal a spinner showing `start`, then the latest step; elsewhere (a log, a
    pipe), where a spinner prints nothing, a line per step with the seconds since the start, flushed at once.
    Nothing before the first step: a user's mistake found first stays one line."""
    if out.is_terminal:
        with out.status(escape(start)) as status:
            yield lambda what: status.update(escape(what))
        return
    yield _stamped(out)


@contextlib.contextmanager
def progress_bar(out: Console, what: str, total: int):
    """Counted work's advance(): on a terminal a bar, gone when done; elsewhere a line per step done as progress()
    prints, at most one a second (a small model's turn takes milliseconds), and the count it ended at."""
    if out.is_terminal:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=out, transient=True) as bar:
            task = bar.add_task(what, total=total)
            yield lambda: bar.advance(task)
        return
    say, done, shown, shown_at = _stamped(out), 0, 0, time.monotonic()

    def advance() -> None:
        nonlocal done, shown, shown_at
        done += 1
        if done == total or time.monotonic() - shown_at >= 1.0:
            say(f"{what}: {done}/{total}")
            shown, shown_at = done, time.monotonic()

    yield advance
    if shown != done:
        say(f"{what}: {done}/{total}")


def _stamped(out: Console):
    """say(line): the line after the seconds since this call, as `[  12.3 s] phase 0: ceiling of stock`."""
    start = time.monotonic()

    def say(line: str) -> None:
        out.print(f"[{time.monotonic() - start:6.1f} s] {line}", markup=False, highlight=False, soft_wrap=True)
        out.file.flush()

    return say


def check_output(path: Path | None) -> None:
    """Fail before any work when the output could not be written. It is written at the end by
    results.write_bytes_atomic: a device, FIFO or descriptor in place (opened only then: a FIFO's open waits for
    its reader), any other file atomically beside its symlinks' target."""
    if path is None:
        return
    if not path.name or path.is_dir():
        raise UserError(f"cannot write {str(path)!r}: give a file's path, not a folder")
    if open_descriptor(path) is not None or in_place(path):
        if not os.access(path, os.W_OK):
            raise UserError(f"cannot write {path}: permission denied")
        return
    _writable_parent(Path(os.path.realpath(path)) if path.is_symlink() else path)


def _writable_parent(path: Path) -> None:
    """path's folder exists and takes a file (the temporary one an atomic write makes beside path)."""
    if not path.parent.is_dir():
        what = "is not a folder" if path.parent.exists() else "does not exist"
        raise UserError(f"cannot write {path}: {path.parent} {what}")
    _takes_files(path.parent, path)


def _takes_files(folder: Path, path: Path) -> None:
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{path.name}.", suffix=".check"):
            pass
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None


def check_output_folder(path: Path, mark: str, make_parents: bool = False) -> None:
    """Fail before any work when a folder output could not be written, or would replace a folder this command did
    not write (the write replaces the folder as one unit; `mark` is a file every earlier output of it holds)."""
    check_folder_path(path, make_parents)
    if path.is_dir() and any(path.iterdir()) and not (path / mark).exists():
        raise UserError(f"refusing to replace {path}: it holds files this command did not write (no {mark}); "
                        "give a new or empty folder")


def check_folder_path(path: Path, make_parents: bool = False) -> None:
    """path is, or can become, a folder: not a file, and its parent (make_parents: the nearest folder above it
    that exists, the write making the rest) a folder that takes new entries."""
    if path.exists() and not path.is_dir():
        raise UserError(f"cannot write {path}: it is a file; give a folder's path")
    if not make_parents:
        _writable_parent(path)
        return
    above = path.absolute().parent
    while not above.exists() and above != above.parent:  # a path through a file "does not exist" up to the file
        above = above.parent
    if not above.is_dir():
        raise UserError(f"cannot write {path}: {above} is a file, not a folder")
    _takes_files(above, path)


def named_or_tiny(preset: str | None, deployment: Path | None) -> tuple[str | None, Path | None]:
    """The deployment a command names; neither: the tiny preset."""
    return ("tiny", None) if preset is None and deployment is None else (preset, deployment)


def load_named(preset: str | None, deployment: Path | None):
    from specpilot.deployment import load_deployment

    return load_deployment(*named_or_tiny(preset, deployment))


def fmt(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def read_json_object(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} holds no JSON object")
    return data


def read_prompt(given: str) -> str:
    """A prompt as the user gave it, or from stdin for "-", checked to be text before any model loads. Bytes that
    are not UTF-8 reach Python's argv as lone surrogates (surrogateescape), which the tokenizer would choke on."""
    where = " on stdin" if given == "-" else ""
    if where:
        data = sys.stdin.buffer.read()
        try:
            given = data.decode("utf-8").removesuffix("\n")  # the newline `echo` and editors end a file with
        except UnicodeDecodeError as exc:
            raise UserError(f"the prompt{where} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                            f"{exc.start})") from None
    try:
        given.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UserError(f"the prompt is not UTF-8 text (byte 0x{ord(given[exc.start]) & 0xff:02x} at character "
                        f"{exc.start})") from None
    if not given.strip():
        raise UserError(f"empty prompt{where}")
    return given


def output_budget(given: int | None, dep, most: int | None = None) -> int:
    """--max-new-tokens, else the deployment's; checked before any model loads."""
    budget = given if given is not None else dep.max_new_tokens
    if budget <= 0 or (most is not None and budget > most):
        bound = f"in 1..{most}" if most is not None else "positive"
        raise UserError(f"--max-new-tokens must be {bound}, got {budget}")
    return budget


def positive(**values) -> None:
    for name, value in values.items():
        if value <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, got {value}")
