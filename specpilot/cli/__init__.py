"""The `specpilot` command: one Typer app (cli/common.py) whose commands live in this folder's modules, each
registered when imported here, in the order `--help` lists them. `main` turns a user's mistake into one line
and exit 2, and Ctrl-C into exit 130 with what was kept."""

from __future__ import annotations

import importlib
import sys

from rich.markup import escape

from specpilot.cli.common import app, err
from specpilot.errors import Interrupted, UserError

__all__ = ["app", "main"]
# each registers its commands (bench_serve: under run's `bench` group)
for _module in ("run", "bench_serve", "serve", "measure", "judges", "training", "loop", "inventory"):
    importlib.import_module(f"specpilot.cli.{_module}")


def main() -> None:
    try:
        app()
    except UserError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)  # user text: no markup
        sys.exit(2)
    except Interrupted as exc:
        err.print(f"\n[yellow]{escape(str(exc))}[/yellow]", highlight=False, soft_wrap=True)
        sys.exit(130)
    except KeyboardInterrupt:
        err.print("\ninterrupted")
        sys.exit(130)
    except SystemExit as exc:  # Typer turns a Ctrl-C outside interruptible (loading, set-up) into a silent 130
        if exc.code == 130 and isinstance(getattr(exc.__context__, "__cause__", None), KeyboardInterrupt):
            err.print("\ninterrupted while starting: no output was written")
        raise
