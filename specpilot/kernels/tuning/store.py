"""The step tuning's choices kept on disk, so that no process tunes a step another already tuned (issue 55: on an
H100 the first step timing of SmolLM2's ar:gemv=true, warm-up and GEMV tuning included, took 27 s with Triton's
compiled kernels on disk and 121 s without, in each process that ran it: the sweep, the loop, a resumed loop).

An entry holds the configs chosen for every key one step launches, under a name made of what they depend on: the
GPU's model, the kernels' code (every file of specpilot/kernels) with the torch and Triton versions, the plan's
options, and the step (the model's configuration, dtype and context, which fix its keys: kernel, shapes, fusions).
Any of these changed, the name changes and the step is tuned afresh; an entry that does not cover every key the step
launches is not used. The name is known before the step runs: its configs are in place for the first eager run,
which would otherwise start Triton's autotuner on every key (tens of seconds on a GPU). The plan's
`tune_store=false` neither reads nor writes it. Entries are written whole (a temporary file renamed); an unreadable
one counts as missing.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import tempfile
from functools import cache
from pathlib import Path

import torch

from specpilot.config.plan import KernelPlan

ROOT = Path.home() / ".cache" / "specpilot" / "tuning"  # tests point it elsewhere
KERNELS = Path(__file__).resolve().parents[1]


@cache
def kernels_code() -> str:
    """The hash of every source file under specpilot/kernels, with the torch and Triton versions."""
    h = hashlib.sha256(f"torch {torch.__version__}\n".encode())
    try:
        import triton

        h.update(f"triton {triton.__version__}\n".encode())
    except ImportError:
        pass
    for path in sorted(p for p in KERNELS.rglob("*") if p.suffix in (".py", ".cu") and p.is_file()):
        h.update(str(path.relative_to(KERNELS)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def entry_name(device: str, plan: KernelPlan, step: dict) -> str:
    """The file name of the choices for one step under this plan on this GPU model, with this code. step: what
    names the step's keys before it runs (the model's configuration, its dtype, the context); the entry's own keys
    are checked against those the step launches when it is used."""
    what = {"device": device, "code": kernels_code(), "plan": plan.features(), "step": step}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:24] + ".json"


def load(name: str) -> dict[tuple, dict] | None:
    """The configs stored under `name`, by key; None where there are none (or the file is unreadable)."""
    try:
        raw = json.loads((ROOT / name).read_text())
        return {ast.literal_eval(k): v for k, v in raw["chosen"].items()}
    except (OSError, ValueError, KeyError, SyntaxError, TypeError, AttributeError):
        return None


def save(name: str, chosen: dict[tuple, dict], device: str) -> Path | None:
    """Keep `chosen` under `name` (written whole: a reader never sees half a file); None where the folder cannot be
    written (a read-only home: the next process tunes again)."""
    body = json.dumps({"device": device, "chosen": {repr(k): v for k, v in chosen.items()}}, indent=1)
    try:
        ROOT.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=ROOT, prefix=".", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.replace(tmp, ROOT / name)
    except OSError:
        return None
    return ROOT / name
