"""`bench` and `generate`: systems run on a deployment's requests, or on one prompt."""

from __future__ import annotations

import dataclasses
import sys
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
    console,
    err,
    fmt,
    interruptible,
    load_named,
    output_budget,
    progress_bar,
    read_prompt,
    system_help,
)
from specpilot.core.contracts import Prompted
from specpilot.errors import UserError


def _table(summaries: dict) -> Table:
    t = Table(title="decode, single request")
    for col in ("system", "tau", "speedup vs AR", "decode tok/s", "ms/token", "ms/step", "prefill ms",
                "mismatch vs AR", "req"):
        t.add_column(col, justify="left" if col == "system" else "right")
    for name, s in summaries.items():
        t.add_row(name, fmt(s["tau"]), fmt(s.get("speedup_vs_ar"), ".3f") + "x",
                  fmt(s["decode_tokens_per_s"], ".1f"), fmt(s["decode_ms_per_token"], ".3f"),
                  fmt(s.get("decode_ms_per_step"), ".3f"),
                  fmt(s["prefill_ms_mean"], ".1f"),
                  fmt(100 * s["mismatch_vs_ar"] if s.get("mismatch_vs_ar") is not None else None, ".2f") + "%",
                  str(s["n_requests"]))
    return t


def _batch_table(summaries: dict, in_flight: int) -> Table:
    t = Table(title=f"throughput, {in_flight} requests in flight")
    for col in ("system", "output tok/s", "speedup vs batched AR", "seconds"):
        t.add_column(col, justify="left" if col == "system" else "right")
    for name, s in summaries.items():
        b = s["batch"]
        t.add_row(name, fmt(b["output_tokens_per_s"], ".1f"), fmt(b["speedup_over_batched_ar"], ".3f") + "x",
                  fmt(b["seconds"], ".2f"))
    return t


# `bench` is a group so that `bench serve` can live under it; its callback is today's `bench` (run without a
# subcommand), so every `specpilot bench --preset ...` runs exactly as before.
bench_app = typer.Typer(add_completion=False, invoke_without_command=True, pretty_exceptions_enable=False)
app.add_typer(bench_app, name="bench")


@bench_app.callback()
def bench(
    ctx: typer.Context,
    preset: Preset = None,
    deployment: DeploymentFile = None,
    system: Annotated[list[str] | None, typer.Option(
        "--system", "-s", help=system_help("A system (repeatable; plain AR always runs, it is the reference; default: "
                                            "the deployment's `system`, else stock),"))] = None,
    dataset: Datasets = None,
    split: Split = None,
    limit: Limit = None,
    max_new_tokens: MaxNewTokens = None,
    data_dir: DataDir = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write every figure and per-request row here.")
                         ] = None,
    oracle: Annotated[bool, typer.Option(help="Also replay the drafter's lattices along AR's output: the chain's "
                                         "tau and the top-16 oracle tau (the lattice's ceiling).")] = False,
    in_flight: Annotated[int | None, typer.Option(
        "--in-flight", help="Serve this many requests at once (regime batch: continuous batching, closed loop; "
                            "each system's output tokens/s and speedup over batched AR). Default: the deployment's "
                            "regime.")] = None,
) -> None:
    """Run systems on a deployment's requests and report tau, speedup over AR, decode rate and mismatch.
    `specpilot bench serve --url URL` instead loads an OpenAI-compatible server (see its --help)."""
    if ctx.invoked_subcommand is not None:
        _no_bench_options(ctx)
        return
    from specpilot.bench.harness import Runner
    from specpilot.bench.run import BenchPlan, bench_report, collect_requests, plan_systems, run_bench
    from specpilot.results import write_json_atomic
    from specpilot.runtime.pair import build_pair

    dep = load_named(preset, deployment)
    if in_flight is not None:
        if in_flight < 1:
            raise UserError(f"--in-flight must be at least 1, got {in_flight}")
        dep = dataclasses.replace(dep, regime="batch", in_flight=in_flight)
    plan = BenchPlan(dep, plan_systems(system or ([dep.system] if dep.system else [])), dataset or dep.datasets,
                     split or dep.split,
                     limit if limit is not None else dep.limit,
                     output_budget(max_new_tokens, dep), data_dir, oracle)
    if plan.limit is not None and plan.limit <= 0:
        raise UserError(f"--limit must be positive, got {plan.limit}")
    check_output(json_path)
    requests = collect_requests(plan)
    needs_drafter = any(s.base == "stock" for s in plan.systems)
    if needs_drafter and dep.drafter is None:
        raise UserError(f"deployment {dep.name} has no drafter, so it cannot run {plan.systems[-1].name}")
    err.print(f"[dim]deployment {dep.name}: loading models on {dep.torch_device()} ({dep.torch_dtype()})[/dim]")
    target, drafter, tok = build_pair(dep, with_drafter=needs_drafter)
    runner = Runner(target, drafter, tok, dep.context, slots=dep.in_flight)
    # progress: a turn at a time, or under regime batch a system at a time (all its requests together)
    turns = len(plan.systems) if dep.regime == "batch" else sum(len(r.turns) for r in requests) * len(plan.systems)
    kept = "nothing was written" + (f" ({json_path} was not touched)" if json_path else "")
    with interruptible(f"bench interrupted before its summary: {kept}"), \
            progress_bar(err, f"{len(requests)} requests x {len(plan.systems)} systems", turns) as advance:
        summaries = run_bench(plan, runner, requests, advance)
    report = bench_report(plan, summaries)
    if json_path is not None:
        write_json_atomic(json_path, report)
    console.print(_table(summaries))
    if dep.regime == "batch":
        console.print(_batch_table(summaries, dep.in_flight))
    for name, s in summaries.items():
        hist = " ".join(f"{k}:{v}" for k, v in s["tau_histogram"].items())
        console.print(f"[dim]{name} tokens per target pass (count): {hist}[/dim]")
        if s.get("oracle_tau_top16") is not None:
            console.print(f"[dim]{name} replayed along AR's output: chain tau {s['replay_chain_tau']:.2f}, "
                          f"top-16 oracle tau {s['oracle_tau_top16']:.2f}[/dim]")
    if json_path is not None:
        console.print(f"[dim]wrote {json_path}[/dim]")


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="The user message (UTF-8); - reads it from stdin (one final "
                                               "newline dropped), e.g. `specpilot generate - < prompt.txt`.")],
    preset: Preset = None,
    deployment: DeploymentFile = None,
    system: Annotated[list[str] | None, typer.Option("--system", "-s", help=system_help(
        "The system (one; default: the deployment's `system`, else stock),"))] = None,
    max_new_tokens: MaxNewTokens = None,
) -> None:
    """Answer one prompt with one system: the model's text on stdout exactly as decoded (then one newline), its
    step statistics on stderr. Every option of the system applies (graphs and the `gemv` step tuning are warmed
    up first)."""
    from specpilot.config.env import parse
    from specpilot.runtime.engine import Engine
    from specpilot.runtime.pair import build_pair

    prompt = read_prompt(prompt)
    dep = load_named(preset, deployment)
    if system and len(system) > 1:
        raise UserError(f"generate runs one system; got {len(system)} (compare them with `specpilot bench`)")
    sys_ = parse(system[0] if system else dep.system or "stock")
    budget = output_budget(max_new_tokens, dep)
    if sys_.speculative and dep.drafter is None:
        raise UserError(f"deployment {dep.name} has no drafter, so it cannot run {sys_.name}")
    with interruptible("generation interrupted: nothing was printed"):
        target, drafter, tok = build_pair(dep, with_drafter=sys_.speculative)
        engine = Engine(target, drafter, sys_, context=dep.context)
        engine.warmup()
        asked = Prompted(tok.chat_prompt([{"role": "user", "content": prompt}]), budget, tuple(tok.eos_ids))
        gen = engine.generate([asked])[0]
    sys.stdout.write(tok.decode(gen.tokens) + "\n")  # as decoded: no wrapping, no markup
    sys.stdout.flush()
    tau = sum(gen.accepted) / len(gen.accepted) if gen.accepted else float("nan")
    err.print(f"[dim]{sys_.name}: {len(gen.tokens)} tokens, tau {tau:.2f}, prefill {1000 * gen.prefill_s:.1f} ms, "
              f"decode {1000 * gen.decode_s:.1f} ms[/dim]")


def _no_bench_options(ctx: typer.Context) -> None:
    """`bench`'s own options do nothing for a subcommand: say so rather than drop them silently."""
    sources = {p.opts[0]: ctx.get_parameter_source(p.name) for p in ctx.command.params if p.name}
    given = [opt for opt, source in sources.items() if source is not None and source.name != "DEFAULT"]
    if given:
        raise UserError(f"{', '.join(given)}: options of `specpilot bench` itself, not of `bench "
                        f"{ctx.invoked_subcommand}`; put the subcommand's options after its name")
