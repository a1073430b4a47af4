"""`specpilot bench`: run systems on a deployment's requests, request by request, and summarise."""

from __future__ import annotations

from dataclasses import dataclass

from specpilot.bench.harness import Runner, TurnRecord, run_batched, run_request_major
from specpilot.bench.metrics import summarize
from specpilot.config import System
from specpilot.config.env import parse
from specpilot.datasets import Request, data_file, load_requests
from specpilot.deployment import Deployment
from specpilot.errors import UserError
from specpilot.pypi import sha256_file
from specpilot.results import environment, system_record


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
    """Plain AR always runs first: it is the reference every other system's speedup and mismatch are measured
    against (a named AR variant, a lossy fault or an idle pad included, is a system like any other). Duplicates
    are dropped; SPECPILOT_OPTIONS applies to all, the reference too."""
    systems = [parse("ar"), *([parse(n) for n in names] or [parse("stock")])]
    unique = {s.name: s for s in systems}
    return list(unique.values())


def collect_requests(plan: BenchPlan) -> list[Request]:
    requests = []
    for name in plan.datasets:
        requests.extend(load_requests(name, plan.split, plan.data_dir, plan.limit))
    if not requests:
        raise UserError(f"no requests: the {plan.split} split of {', '.join(plan.datasets)} is empty")
    return requests


def run_bench(plan: BenchPlan, runner: Runner, requests: list[Request], progress=None) -> dict:
    systems = {s.name: s for s in plan.systems}
    ar = plan.systems[0].name  # plan_systems puts plain AR first
    if plan.deployment.regime == "batch":
        records, seconds = run_batched(runner, systems, requests, plan.max_new_tokens, progress)
    else:
        records, seconds = run_request_major(runner, systems, requests, plan.max_new_tokens, progress), None
    summaries = {name: summarize(recs, records[ar]) for name, recs in records.items()}
    if seconds is not None:  # throughput: every output token over the wall time of all of a system's turns
        rate = {name: sum(len(r.tokens) for r in recs) / seconds[name] for name, recs in records.items()}
        for name in records:
            summaries[name]["batch"] = {"in_flight": runner.slots, "seconds": seconds[name],
                                        "output_tokens_per_s": rate[name],
                                        "speedup_over_batched_ar": rate[name] / rate[ar]}
            engine = runner.engine(systems[name])
            if engine.width_steps():  # batch_rows=auto: the steps each width ran, and the widths' costs
                summaries[name]["batch"].update(steps_by_rows=dict(engine.step_rows), step_costs_s={
                    "sampled" if sampled else "greedy": table for sampled, table in engine.step_costs.items()})
    for system in plan.systems:  # the complete configuration each system ran under, tuning table included
        summaries[system.name]["config"] = system_record(runner.engine(system))
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
    per: dict[str, dict[str, list[float]]] = {}
    for rec, row in zip(ar_records, rows, strict=True):
        for key in ("replay_chain_tau", "oracle_tau"):
            if row[key] is not None:
                per.setdefault(rec.dataset, {}).setdefault(key, []).append(row[key])
    return {"replay_chain_tau": sum(chain) / len(chain) if chain else None,
            "oracle_tau_top16": sum(oracle) / len(oracle) if oracle else None,
            "oracle_histogram": {str(k): steps.count(k) for k in sorted(set(steps))},
            "oracle_by_dataset": {name: {"replay_chain_tau": _mean(v.get("replay_chain_tau")),
                                         "oracle_tau_top16": _mean(v.get("oracle_tau"))} for name, v in per.items()}}


def _mean(values: list[float] | None) -> float | None:
    return sum(values) / len(values) if values else None


def bench_report(plan: BenchPlan, summaries: dict) -> dict:
    return {
        **environment(),
        "deployment": plan.deployment.as_served(),  # what ran, not only its name: a preset's file may change
        "datasets": plan.datasets,
        "data_files": data_files(plan),
        "split": plan.split,
        "limit": plan.limit,
        "max_new_tokens": plan.max_new_tokens,
        "reference": plan.systems[0].name,  # speedup and mismatch are against it: plain AR (plan_systems)
        "systems": summaries,
    }


def data_files(plan: BenchPlan) -> dict:
    """Each dataset's file as read, with its sha256 (None: the built-in prompts, fixed by the commit)."""
    out = {}
    for name in plan.datasets:
        path = data_file(name, plan.data_dir)
        out[name] = None if path is None else {"path": str(path.resolve()), "sha256": sha256_file(path)}
    return out
