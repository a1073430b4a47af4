"""`force` and `compare`: token forcing and the controller, the two judges of a candidate."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
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
    console,
    err,
    interruptible,
    load_named,
    named_or_tiny,
    output_budget,
    positive,
    progress_bar,
    system_help,
)
from specpilot.errors import UserError
from specpilot.forcing import POWER_BOUND


@app.command()
def force(
    candidate: Annotated[str, typer.Option(help=system_help("The system under audit,"))],
    reference: Annotated[str, typer.Option(help="The system it must be as faithful as (as --candidate).")
                         ] = "stock",
    preset: Preset = None,
    deployment: DeploymentFile = None,
    dataset: Datasets = None,
    split: Split = None,
    limit: Annotated[int | None, typer.Option(help="Requests per dataset to start from (the power bound may add "
                                                   "more, up to --max-limit). Default: the deployment's [budgets] "
                                                   "limit, else all.")] = None,
    max_new_tokens: MaxNewTokens = None,
    data_dir: DataDir = None,
    power_bound: Annotated[float, typer.Option(help="Add requests (doubling, up to --max-limit per dataset) until an "
                                               "excess mismatch rate this small (a fraction: 0.001 = 0.1 points) "
                                               "would be detected with 80% power; a pass short of it is "
                                               "'inconclusive'. 0: judge the --limit requests as they are.")
                           ] = POWER_BOUND,
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
    from specpilot.bench.harness import Runner
    from specpilot.bench.run import BenchPlan, collect_requests
    from specpilot.config.env import parse
    from specpilot.datasets import round_robin
    from specpilot.forcing.outputs import OutputStore, described
    from specpilot.forcing.parallel import pool_for
    from specpilot.forcing.run import EXACT_AR_REQUESTS, exact_mode, exact_target
    from specpilot.forcing.run import force as run_force
    from specpilot.results import environment, write_json_atomic
    from specpilot.runtime.pair import build_pair

    dep = load_named(preset, deployment)
    parse(candidate), parse(reference)  # bad names fail before any model loads
    budget = output_budget(max_new_tokens, dep, most=4096)
    check_output(json_path)
    if not 0 <= power_bound < 1:
        raise UserError(f"--power-bound is a fraction in [0, 1), got {power_bound}")
    exact = exact_mode(exact, dep, reference, candidate)
    positive(workers=workers)
    if outputs is not None and outputs.exists() and not outputs.is_dir():
        raise UserError(f"--outputs {outputs} is a file, not a folder")
    first = limit if limit is not None else dep.limit
    most = max_limit if max_limit is not None else (4 * first if first and power_bound else first)
    positive(**{k: v for k, v in (("limit", first), ("max_limit", most)) if v is not None})
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
    kept = "no verdict; " + (f"the outputs made so far are kept in {outputs} (the same command resumes)"
                             if outputs is not None else "nothing was written")
    kept += f" ({json_path} was not touched)" if json_path else ""
    procs = pool_for(workers, *named_or_tiny(preset, deployment), [reference, candidate, "ar"], pool)
    with (interruptible(f"token forcing interrupted: {kept}"),
          progress_bar(err, f"{start} requests (up to {len(pool)}) x {roles} systems", turns) as advance,
          procs or contextlib.nullcontext()):
        report = run_force(runner, reference, candidate, pool, budget, advance,
                           bound=power_bound or None, start=start, exact=scorer,
                           generate=procs.generate if procs is not None else None,
                           store=OutputStore(outputs, described(dep)) if outputs is not None else None)
    ran = {"max_new_tokens": budget, "datasets": list(plan.datasets), "split": plan.split, "limit": first,
           "max_limit": most, "power_bound": power_bound, "requests_available": len(pool),
           "system_records": {role: _system_record(report["systems"][role]["system"])
                              for role in ("reference", "candidate", "ar")}}
    report = {**environment(), "deployment": dep.name, **ran, **report}
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


def _system_record(name: str) -> dict:
    """A system as asked: every option's value and its kernel plan (the engine's tuning table is its own)."""
    from specpilot.config.env import parse

    system = parse(name)
    return {**system.to_json(), "plan": system.plan().to_json()}


def _verdict(verdict: str, reason: str, good: str) -> None:
    """Print a judge's verdict; exit 1 unless it is the good one."""
    color = "green" if verdict == good else "red"
    console.print(f"[{color}]{verdict}[/{color}]: {escape(reason)}")
    if verdict != good:
        raise typer.Exit(1)


@app.command()
def compare(
    a: Annotated[str, typer.Option("--a", help=system_help("Baseline system,"))] = "stock",
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
    max_new_tokens: MaxNewTokens = None,
    block: Annotated[int, typer.Option(help="Requests per turn in the A B B A interleaving.")] = 4,
    gpu: Annotated[str | None, typer.Option(help="CUDA device the workers are pinned to (one GPU: A B B A blocks).")
                   ] = None,
    gpus: Annotated[str | None, typer.Option(help="Two CUDA devices, e.g. 0,1: paired runs, A and B at the same "
                                                  "time on different GPUs, then swapped.")] = None,
    noise: Annotated[float | None, typer.Option(help="Known A/A noise as a fraction (0.01 = 1%); default: measure it "
                                                    "with an A/A run.")
                     ] = None,
    aa_card: Annotated[Path | None, typer.Option(help="Evidence card of an earlier compare: reuse its A/A run "
                                                      "(noise, slot difference) instead of timing a new one; only "
                                                      "for the same side A (name, configuration, code), "
                                                      "deployment, --max-new-tokens and mode.")] = None,
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
    from specpilot.controller.compare import Side, StaleAA, aa_mismatch, run_mode, source_tree
    from specpilot.controller.compare import compare as run_compare
    from specpilot.results import environment, write_json_atomic

    dep = load_named(preset, deployment)
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
    new_tokens = output_budget(max_new_tokens, dep)
    check_output(json_path)
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
    from specpilot.datasets import load_requests

    count = sum(len(load_requests(d, spec["split"], None, spec["limit"])) for d in spec["datasets"])
    if count < 3:  # checked before any worker starts: the gate needs 3 paired requests
        raise UserError(f"only {count} requests selected; the gate needs at least 3 (raise --limit)")
    with source_tree(a_source) as src_a, source_tree(b_source) as src_b:
        mode = run_mode(spec, pair, alternating)
        why = aa_mismatch(aa, Side(a, src_a), spec, mode, "worker") if aa is not None else None
        if why:  # before any worker starts; the configuration A runs is checked once its worker reports it
            raise UserError(f"--aa-card {aa_card}: its A/A run cannot stand for this one: {why}; time a new one "
                            "(drop --aa-card)")
        err.print(f"[dim]timing {a} ({src_a}) against {b} ({src_b})[/dim]")
        kept = "no verdict; the workers were stopped and nothing was written" + (
            f" ({json_path} was not touched)" if json_path else "")
        with interruptible(f"compare interrupted: {kept}"):
            try:
                card = run_compare(Side(a, src_a), Side(b, src_b), spec, block, gpu, timeout, noise, gpus=pair,
                                   aa=aa, reps=reps, alternating=alternating)
            except StaleAA as exc:
                raise UserError(f"--aa-card {aa_card}: {exc}; time a new one (drop --aa-card)") from None
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
