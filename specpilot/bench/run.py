"""`specpilot bench`: run systems on a deployment's requests, request by request, and summarise."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from specpilot.bench.datasets import Request, load_requests
from specpilot.bench.harness import Runner, TurnRecord, run_request_major
from specpilot.bench.metrics import summarize
from specpilot.deployment import Deployment
from specpilot.errors import UserError
from specpilot.runtime.options import System, parse_system


@dataclass
class BenchPlan:
    deployment: Deployment
    systems: list[System]
    datasets: list[str]
    split: str
    limit: int | None
    max_new_tokens: int
    data_dir: str | None = None
    oracle: bool = False  # replay the drafter's lattices along AR's output: chain tau and top-K oracle tau


def plan_systems(names: list[str]) -> list[System]:
    """AR is always run: it is the reference every other system's speedup and mismatch are measured
    against. Duplicates are dropped."""
    systems = [parse_system(n) for n in names] or [parse_system("ar"), parse_system("stock")]
    if all(s.base != "ar" for s in systems):
        systems.insert(0, parse_system("ar"))
    unique = {s.name: s for s in systems}
    return list(unique.values())


def collect_requests(plan: BenchPlan) -> list[Request]:
    requests = []
    for name in plan.datasets:
        requests.extend(load_requests(name, plan.split, plan.data_dir, plan.limit))
    if not requests:
        raise UserError(f"no requests: the {plan.split} split of {', '.join(plan.datasets)} is empty")
    return requests


def environment() -> dict:
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    if os.environ.get("SPECPILOT_COMMIT"):  # a copied tree (the GPU machine) may carry a stale .git
        commit, dirty = os.environ["SPECPILOT_COMMIT"], None
    cuda = torch.cuda.is_available()
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": dirty,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def run_bench(plan: BenchPlan, runner: Runner, requests: list[Request], progress=None) -> dict:
    records = run_request_major(runner, {s.name: s for s in plan.systems}, requests, plan.max_new_tokens, progress)
    ar = next(s.name for s in plan.systems if s.base == "ar")
    summaries = {name: summarize(recs, records[ar]) for name, recs in records.items()}
    if plan.oracle and runner.drafter is not None:
        for system in plan.systems:
            if system.base == "stock":
                summaries[system.name].update(oracle_summary(runner, system, records[ar]))
    return summaries


def oracle_summary(runner: Runner, system: System, ar_records: list[TurnRecord]) -> dict:
    """Replayed along each request's AR output (the target's greedy continuation), so the figures do not
    depend on the speculative run itself: the mean over requests of per-request step means."""
    from specpilot.bench.oracle import lattice_taus

    block = runner.engine(system).block
    rows = [lattice_taus(runner.target, runner.drafter, r.prompt, r.tokens, block) for r in ar_records]
    chain = [r["replay_chain_tau"] for r in rows if r["replay_chain_tau"] is not None]
    oracle = [r["oracle_tau"] for r in rows if r["oracle_tau"] is not None]
    steps = [s for r in rows for s in r["oracle_steps"]]
    return {"replay_chain_tau": sum(chain) / len(chain) if chain else None,
            "oracle_tau_top16": sum(oracle) / len(oracle) if oracle else None,
            "oracle_histogram": {str(k): steps.count(k) for k in sorted(set(steps))}}


def write_json_atomic(path: str | Path, data: dict) -> None:
    """Write via a temporary file and rename: a crash never leaves a half-written file behind."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise UserError(f"cannot write {path}: folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def bench_report(plan: BenchPlan, summaries: dict) -> dict:
    dep = plan.deployment
    return {
        **environment(),
        "deployment": {"name": dep.name, "source": dep.source, "regime": dep.regime, "dtype": str(dep.torch_dtype()),
                       "context": dep.context},
        "datasets": plan.datasets,
        "split": plan.split,
        "limit": plan.limit,
        "max_new_tokens": plan.max_new_tokens,
        "systems": summaries,
    }
