"""Phase 1 on several devices (`specpilot loop --gpus 0,1`): the round's directions shared among one process per
device, each pinned to its GPU (CUDA_VISIBLE_DEVICES, which the controller's timing workers it starts inherit)
and holding its own models; direction i goes to process i mod n. Each process measures its directions' steps into
the run directory, whose lock the loop's own process keeps; the loop then reads the steps back in order, as a
resumed run does, and goes on with Phases 2-4 itself.

On a CPU deployment, `cpu` entries stand in for devices (the code paths and the tests): each process gets its
share of the cores. What a direction promotes is known to the directions after it in the same process only, so
a direction the one-process loop would prune under a rival may be searched here (rounds.Loop._out_of_reach).

A slot's process runs loop/slot.py with the JSON that `launch` writes."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

from specpilot.errors import UserError


def check_devices(slots: list[str], on_cpu: bool) -> None:
    """--gpus: CUDA device numbers for a GPU deployment, `cpu` entries for a CPU one (two or more)."""
    if len(slots) < 2:
        raise UserError(f"--gpus names the devices of Phase 1's processes: two or more, got {slots}")
    if on_cpu and any(s != "cpu" for s in slots):
        raise UserError(f"a CPU deployment's --gpus entries are 'cpu' (simulated devices), got {','.join(slots)}")
    if not on_cpu and not all(s.isdigit() for s in slots):
        raise UserError(f"--gpus takes CUDA device numbers (e.g. 0,1), got {','.join(slots)}")


def launch(a, run, r: int, start: str, count: int, budget_s: float | None = None) -> dict:
    """Round r's Phase 1 in min(devices, directions) processes, each given the round's budget_s (default: the run's
    left); waits for all. -> what ran where and how long (wall seconds). A process that fails stops the loop with
    its log's last line."""
    n = min(len(a.slots), count)
    logs = run.root / "slots"
    logs.mkdir(exist_ok=True)
    cores = sorted(os.sched_getaffinity(0))
    args = {f.name: getattr(a, f.name) for f in dataclasses.fields(a)
            if f.name not in ("dep", "agent_budget", "slots", "slot", "resume")}
    args.update(run_dir=str(a.run_dir), datasets=a.dep.datasets, budget_s=run.left() if budget_s is None else budget_s)
    t0, procs = time.monotonic(), []
    for k in range(n):
        env = dict(os.environ)
        share = cores[k::n] if a.slots[k] == "cpu" else None
        env["CUDA_VISIBLE_DEVICES"] = "" if share is not None else a.slots[k]
        spec = {**args, "slot": [k, n], "round": r, "start": start, "cores": share}
        log = open(logs / f"round-{r}-slot-{k}.log", "w")  # noqa: SIM115 (the child's; closed when it ends)
        procs.append((subprocess.Popen([sys.executable, "-m", "specpilot.loop.slot", json.dumps(spec)],
                                       env=env, stdout=log, stderr=subprocess.STDOUT), log))
    failed = []
    try:
        for p, _ in procs:
            p.wait()
    finally:  # the loop interrupted (Ctrl-C, a kill): no slot goes on writing into its run directory
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    for k, (p, _) in enumerate(procs):
        if p.returncode != 0:
            lines = (logs / f"round-{r}-slot-{k}.log").read_text().strip().splitlines()
            failed.append(f"slot {k} ({a.slots[k]}): {lines[-1] if lines else f'exit {p.returncode}'}")
    if failed:
        raise UserError("Phase 1's processes failed: " + "; ".join(failed))
    return {"processes": n, "devices": a.slots[:n], "wall_s": round(time.monotonic() - t0, 1)}
