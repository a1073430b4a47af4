"""`replay` and `ceiling`: exact replay of recorded lattices, and the cost model's ceiling analysis."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specpilot.cli.common import (
    DataDir,
    Datasets,
    DeploymentFile,
    Limit,
    MaxNewTokens,
    Preset,
    Split,
    app,
    check_output,
    check_output_folder,
    console,
    err,
    fmt,
    interruptible,
    load_named,
    output_budget,
    positive,
    progress,
    progress_bar,
    read_json_object,
)
from specpilot.errors import UserError


@app.command()
def replay(
    run_dir: Annotated[Path, typer.Argument(help="Folder of recorded lattices (written here with --record).")],
    record: Annotated[bool, typer.Option("--record", help="First run --system on the deployment's requests and "
                                         "record every step's lattice into RUN_DIR (replaces a recording there).")
                      ] = False,
    system: Annotated[str, typer.Option("--system", "-s", help="The speculative system to record (as in bench).")
                      ] = "stock",
    preset: Preset = None,
    deployment: DeploymentFile = None,
    dataset: Datasets = None,
    split: Split = None,
    limit: Limit = None,
    max_new_tokens: MaxNewTokens = None,
    data_dir: DataDir = None,
    builder: Annotated[list[str] | None, typer.Option(
        "--builder", help="Tree builders to replay (repeatable; default: all: chain, ddtree, best_first, eagle2, "
                          "sequoia).")] = None,
    nodes: Annotated[str, typer.Option(help="Node budgets, comma-separated (rows verified, the anchor included).")
                     ] = "8,16,24,32,48,64",
    tree_k: Annotated[int, typer.Option(help="eagle2's k.")] = 4,
    tree_accept: Annotated[str, typer.Option(help="sequoia's acceptance by rank (p0/p1/...; default: the one "
                                             "measured in this recording).")] = "",
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the replayed figures here.")] = None,
) -> None:
    """Exact replay: the tau every tree builder and node budget would reach on a recorded run's lattices (its
    own anchors, the recorded output as the target's greedy continuation), without the target; tau_best (the
    longest output prefix the lattice holds) and the acceptance by rank that a Sequoia tree is shaped from."""
    from specpilot.config.options import OPTIONS
    from specpilot.replay.record import load
    from specpilot.replay.run import accept_option, policies
    from specpilot.replay.walk import accept_profile
    from specpilot.replay.walk import replay as run_replay
    from specpilot.results import environment, write_json_atomic
    from specpilot.speculative.sequoia import parse_accept
    from specpilot.speculative.tree import BUILDERS

    unknown = [b for b in builder or [] if b not in BUILDERS]
    if unknown:
        raise UserError(f"unknown tree builder {unknown[0]!r} (known: {', '.join(BUILDERS)})")
    budgets = _budgets(nodes)
    try:
        accept = parse_accept(tree_accept) if tree_accept else ()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    low, high = OPTIONS["tree_k"].minimum, OPTIONS["tree_k"].maximum  # the engine option's range
    if not low <= tree_k <= high:
        raise UserError(f"--tree-k must be in {low:g}..{high:g}, got {tree_k}")
    check_output(json_path)
    if record:  # the recording replaces RUN_DIR at the end: a path that cannot take it fails before the run
        check_output_folder(run_dir, "lattices.pt", make_parents=True)
        _record(run_dir, system, preset, deployment, dataset, split, limit, max_new_tokens, data_dir)
    elif not run_dir.exists():
        raise UserError(f"{run_dir} does not exist (record into it with --record)")
    turns, meta = load(run_dir)
    if not turns:
        raise UserError(f"{run_dir} holds no speculative steps")
    block = turns[0].tokens.shape[1] + 1
    pairs = policies(builder or [], budgets, block)
    if not accept and any(b == "sequoia" for b, _ in pairs):  # the profile measured here shapes Sequoia's tree
        accept = parse_accept(accept_option(accept_profile(turns)))
    with interruptible("replay interrupted: nothing was written"):
        try:
            result = run_replay(turns, pairs, tree_k, accept)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    report = {**environment(), "recording": meta, "run_dir": str(run_dir), "tree_k": tree_k,
              "tree_accept": "/".join(map(str, accept)), **result}
    if json_path is not None:
        write_json_atomic(json_path, report)
    console.print(_replay_table(result, budgets))
    console.print(f"[dim]{result['turns']} turns, {result['steps']} steps recorded ({meta.get('system', '?')}: live "
                  f"tau {result['live_tau']:.3f}); acceptance by rank: tree_accept="
                  f"{accept_option(result['accept_by_rank'])}[/dim]")
    if json_path is not None:
        console.print(f"[dim]wrote {json_path}[/dim]")


def _speculative_run(systems: list[str], why: str, preset, deployment, dataset, split, limit, max_new_tokens,
                     data_dir):
    """The checks and set-up that recording and measuring share: stock systems only, a deployment with a drafter,
    a positive budget; then the requests and the models. -> (systems, plan, requests, runner)."""
    from specpilot.bench.harness import Runner
    from specpilot.bench.run import BenchPlan, collect_requests
    from specpilot.config.env import parse
    from specpilot.runtime.pair import build_pair

    parsed = list({s.name: s for s in map(parse, systems)}.values())  # each system once
    bad = [s.name for s in parsed if not s.speculative]
    if bad:
        raise UserError(f"--system {bad[0]!r} drafts nothing {why}: name a stock system")
    dep = load_named(preset, deployment)
    if dep.drafter is None:
        raise UserError(f"deployment {dep.name} has no drafter")
    budget = output_budget(max_new_tokens, dep)
    plan = BenchPlan(dep, parsed, dataset or dep.datasets, split or dep.split,
                     limit if limit is not None else dep.limit, budget, data_dir)
    requests = collect_requests(plan)
    err.print(f"[dim]deployment {dep.name}: loading models on {dep.torch_device()} ({dep.torch_dtype()})[/dim]")
    target, drafter, tok = build_pair(dep, with_drafter=True)
    return parsed, plan, requests, Runner(target, drafter, tok, dep.context)


def _record(run_dir: Path, system: str, preset, deployment, dataset, split, limit, max_new_tokens, data_dir) -> None:
    from specpilot.replay.record import save
    from specpilot.replay.run import record
    from specpilot.results import environment

    (sys_,), plan, requests, runner = _speculative_run([system], "to record", preset, deployment, dataset,
                                                       split, limit, max_new_tokens, data_dir)
    with interruptible(f"recording interrupted: {run_dir} was not touched"), \
            progress_bar(err, f"recording {sys_.name}", sum(len(r.turns) for r in requests)) as advance:
        turns = record(runner, sys_, requests, plan.max_new_tokens, advance)
    meta = {**environment(), "system": sys_.name, "deployment": plan.deployment.name, "datasets": plan.datasets,
            "split": plan.split, "limit": plan.limit, "max_new_tokens": plan.max_new_tokens,
            "config": runner.engine(sys_).system.to_json()}
    save(run_dir, turns, meta)
    err.print(f"[dim]recorded {len(turns)} turns into {run_dir}[/dim]")


def _replay_table(result: dict, budgets: list[int]) -> Table:
    t = Table(title="replayed tau (recorded anchors)")
    t.add_column("builder", justify="left")
    for n in budgets:
        t.add_column(f"N={n}", justify="right")
    rows: dict[str, dict[int, float]] = {}
    for row in result["replayed"].values():
        rows.setdefault(row["builder"], {})[row["nodes"]] = row["tau"]
    for name, by_n in rows.items():
        t.add_row(name, *[fmt(by_n.get(min(n, max(by_n)) if name == "chain" else n)) for n in budgets])
    t.add_row("tau_best", *[fmt(result["tau_best"].get(str(n))) for n in budgets])
    return t


@app.command()
def ceiling(
    run_dir: Annotated[Path, typer.Argument(help="Folder of the measurements (written here with --measure).")],
    measure: Annotated[bool, typer.Option("--measure", help="First measure --system(s) on the deployment's requests "
                                          "into RUN_DIR (replaces what is there): a timed run with AR, a recording "
                                          "of every step's lattice, a kernel profile, the step timed at each node "
                                          "budget, the machine's bandwidth and FLOP rate.")] = False,
    system: Annotated[list[str] | None, typer.Option("--system", "-s", help="Speculative systems to analyse "
                                                      "(repeatable; default: stock).")] = None,
    preset: Preset = None,
    deployment: DeploymentFile = None,
    dataset: Datasets = None,
    split: Split = None,
    limit: Limit = None,
    max_new_tokens: MaxNewTokens = None,
    data_dir: DataDir = None,
    nodes: Annotated[str, typer.Option(help="Node budgets whose step is timed for c(N) (with --measure).")
                     ] = "8,16,32,64",
    profile_requests: Annotated[int, typer.Option(help="Requests profiled and timed step by step.")] = 2,
    profile_tokens: Annotated[int, typer.Option(help="Output tokens per profiled request.")] = 64,
    sweep: Annotated[Path | None, typer.Option(help="A `bench --json` report of the same deployment: its systems' "
                                               "measured speedups check the predicted S(N).")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the report here.")] = None,
    png: Annotated[Path | None, typer.Option(help="Plot where each step's time goes here (PNG).")] = None,
) -> None:
    """Ceiling analysis: how far each system is from its speedup ceiling and which factor binds. The cost model
    S = tau / c (c = T_step / T_AR) and its factors: tau_best / tau (a better tree, from exact replay),
    T_prof / T_floor (kernels against the bytes and FLOPs they must move, per kernel class), T_step / T_prof
    (time outside the kernels), and tau_ideal / tau_best (a better drafter: needs training). The largest of the
    first three is the target; candidates, what-ifs (12-bit weights, a second draft round, the best node budget)
    and the cost model's check against measured speedups come with it."""
    from specpilot.ceiling.plot import plot
    from specpilot.ceiling.report import compute
    from specpilot.ceiling.run import load
    from specpilot.ceiling.tables import classes_table, factors_table, furthest_line, what_if_table
    from specpilot.results import environment, write_json_atomic

    budgets = _budgets(nodes)
    for path in (json_path, png):
        check_output(path)
    if png is not None and png.suffix.lower() != ".png":
        raise UserError(f"--png {png}: the plot is a PNG file (name it *.png)")
    sweep_report = read_json_object(sweep) if sweep is not None else None
    if sweep_report is not None and not isinstance(sweep_report.get("systems"), dict):
        raise UserError(f"--sweep {sweep} is not a `specpilot bench --json` report (it has no systems)")
    if measure:  # the measurement replaces RUN_DIR at the end: a path that cannot take it fails before the run
        check_output_folder(run_dir, "inputs.json", make_parents=True)
        _measure_ceiling(run_dir, system or ["stock"], preset, deployment, dataset, split, limit, max_new_tokens,
                         data_dir, budgets, profile_requests, profile_tokens)
    elif not run_dir.exists():
        raise UserError(f"{run_dir} does not exist (measure into it with --measure)")
    inputs, recordings = load(run_dir)
    report = {**environment(), "run_dir": str(run_dir), "measured": inputs.get("meta", {}),
              **compute(inputs, recordings, sweep_report)}
    if json_path is not None:
        write_json_atomic(json_path, report)
    console.print(factors_table(report))
    console.print(classes_table("AR", report["ar"]["classes"], report["t_ar_s"]))
    for name, s in report["systems"].items():
        console.print(classes_table(name, s["classes"], s["factors"]["overhead"]["t_step_s"]))
        console.print(f"[dim]{furthest_line(s)}[/dim]")
    console.print(what_if_table(report))
    if png is not None:
        plot(report, f"where a step goes: {inputs.get('meta', {}).get('deployment', run_dir)}", png)
        console.print(f"[dim]wrote {png}[/dim]")
    if json_path is not None:
        console.print(f"[dim]wrote {json_path}[/dim]")


def _budgets(nodes: str) -> list[int]:
    try:
        budgets = sorted({int(n) for n in nodes.split(",") if n.strip()})
    except ValueError:
        raise UserError(f"--nodes takes integers separated by commas, got {nodes!r}") from None
    if not budgets or budgets[0] < 2:
        raise UserError(f"--nodes needs budgets of at least 2 rows, got {nodes!r}")
    return budgets


def _measure_ceiling(run_dir: Path, systems: list[str], preset, deployment, dataset, split, limit, max_new_tokens,
                     data_dir, budgets: list[int], profile_requests: int, profile_tokens: int) -> None:
    from specpilot.ceiling.run import CeilingPlan, measure, save
    from specpilot.config.env import parse
    from specpilot.results import environment

    positive(profile_requests=profile_requests, profile_tokens=profile_tokens)
    parsed, plan, requests, runner = _speculative_run(systems, "to analyse (AR is the baseline)", preset,
                                                      deployment, dataset, split, limit, max_new_tokens, data_dir)
    cplan = CeilingPlan(parsed, requests, plan.max_new_tokens, budgets, profile_requests, profile_tokens)
    with interruptible(f"ceiling measurement interrupted: {run_dir} was not touched"), \
            progress(err, "measuring") as say:
        inputs, recordings = measure(cplan, runner, parse("ar"), lambda what: say(f"measuring: {what}"))
    meta = {**environment(), "deployment": plan.deployment.name, "datasets": plan.datasets, "split": plan.split,
            "limit": plan.limit, "max_new_tokens": plan.max_new_tokens, "requests": len(requests)}
    save(run_dir, inputs, recordings, meta)
    err.print(f"[dim]measured {len(parsed)} system(s) into {run_dir}[/dim]")
