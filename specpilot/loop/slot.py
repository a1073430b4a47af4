"""A slot's process of `specpilot loop --gpus` (loop/slots.py): `python -m specpilot.loop.slot SPEC` builds the loop
from SPEC (the loop's arguments, the round, its start, the slot (k, n) and, on a CPU, the cores it may use) on
the run directory its parent holds, measures its share of the round's Phase 1 there, and exits."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from specpilot.errors import UserError


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec.get("cores"):  # a CPU slot: its share of the cores, its threads as many
        import torch

        os.sched_setaffinity(0, spec["cores"])
        torch.set_num_threads(len(spec["cores"]))
    from specpilot.deployment import load_deployment
    from specpilot.loop.main import LoopArgs, build_loop
    from specpilot.loop.rundir import BudgetSpent

    where = {k: v for k, v in spec["worker_spec"].items() if k in ("preset", "deployment")}
    dep = dataclasses.replace(load_deployment(where.get("preset"), where.get("deployment")),
                              datasets=spec["datasets"])
    if "in_flight" in spec["worker_spec"]:  # the loop's --in-flight
        dep = dep.serving(spec["worker_spec"]["in_flight"])
    fields = {f.name for f in dataclasses.fields(LoopArgs)} - {"dep", "run_dir", "slot"}
    a = LoopArgs(dep=dep, run_dir=Path(spec["run_dir"]), slot=tuple(spec["slot"]),
                 **{k: v for k, v in spec.items() if k in fields})
    loop, run = build_loop(a, lambda what: print(what, flush=True))
    with run:
        try:
            loop.round(spec["round"], spec["start"])
        except BudgetSpent as exc:  # what finished stands; the loop's process meets the budget itself
            print(f"stopped: {exc}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except UserError as exc:
        print(f"error: {exc}", flush=True)
        sys.exit(2)
