"""`bench serve`: load an OpenAI-compatible server (closed loop at fixed concurrencies, or Poisson arrivals) and
report vLLM-style latency and throughput figures, plus the accept length when the server reports it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specpilot.cli.common import DataDir, Limit, Split, check_output, console, err, fmt, interruptible, progress_bar
from specpilot.cli.run import bench_app
from specpilot.errors import UserError

ServeDatasets = Annotated[list[str] | None, typer.Option(
    "--dataset", help="gsm8k, math500, humaneval, mbpp, mtbench or builtin (each request's first turn); "
                      "repeatable. Default: builtin.",
    callback=lambda names: list(dict.fromkeys(names)) if names else names)]  # named twice: run once


def _whole_numbers(option: str, text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise UserError(f"{option}: expected a comma list of whole numbers >= 1, got {text!r}")
    return list(dict.fromkeys(values))


def _rates(texts: list[str]) -> list[float]:
    rates = []
    for text in texts:
        for part in text.split(","):
            try:
                rate = float(part)
            except ValueError:
                rate = math.nan
            if not (math.isfinite(rate) and rate > 0):
                raise UserError(f"--rate: expected requests per second > 0 (a number, or a comma list), got {part!r}")
            rates.append(rate)
    return list(dict.fromkeys(rates))


def _levels(concurrency: str | None, rate: list[str] | None, max_concurrency: int | None):
    """The runs, in order: a closed loop per concurrency, or an open loop per rate."""
    from specpilot.bench.serve_load import PAPER_CONCURRENCY, Level

    if max_concurrency is not None and max_concurrency < 1:
        raise UserError(f"--max-concurrency must be at least 1, got {max_concurrency}")
    if rate:
        if concurrency is not None:
            raise UserError("give --concurrency (closed loop) or --rate (open loop), not both")
        return [Level(max_concurrency, r) for r in _rates(rate)]
    if max_concurrency is not None:
        raise UserError("--max-concurrency caps the open loop (--rate); a closed loop's is --concurrency")
    levels = _whole_numbers("--concurrency", concurrency) if concurrency is not None else PAPER_CONCURRENCY
    return [Level(c) for c in levels]


def _check_numbers(max_tokens: int, temperature: float, timeout: float, limit: int | None,
                   num_requests: int | None) -> None:
    if max_tokens < 1:
        raise UserError(f"--max-tokens must be at least 1, got {max_tokens}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise UserError(f"--temperature must be >= 0, got {temperature}")
    if not (math.isfinite(timeout) and timeout > 0):
        raise UserError(f"--timeout must be a positive number of seconds, got {timeout}")
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be positive, got {limit}")
    if num_requests is not None and num_requests < 1:
        raise UserError(f"--num-requests must be at least 1, got {num_requests}")


def _table(runs: list[dict], names: list[str], model: str) -> Table:
    t = Table(title=f"{model}: client-side figures per run (ms)")
    for col in ("run", "done", "failed", "req/s", "out tok/s", "TTFT mean", "TTFT p99", "TPOT mean", "ITL mean",
                "ITL p99", "E2EL mean", "accept len"):
        t.add_column(col, justify="left" if col == "run" else "right")
    for name, r in zip(names, runs, strict=True):
        t.add_row(name, str(r["completed"]), str(r["failed"]), fmt(r["request_throughput"]),
                  fmt(r["output_throughput"], ".1f"), fmt(r["mean_ttft_ms"], ".1f"), fmt(r["p99_ttft_ms"], ".1f"),
                  fmt(r["mean_tpot_ms"]), fmt(r["mean_itl_ms"]), fmt(r["p99_itl_ms"]), fmt(r["mean_e2el_ms"], ".1f"),
                  fmt(r["accept_length"]))
    return t


def _said(name: str, r: dict) -> str:
    line = (f"{name}: {r['completed']} done, {r['failed']} failed in {r['duration']:.1f} s, "
            f"{fmt(r['output_throughput'], '.1f')} output tok/s, peak {r['peak_concurrency']} in flight")
    if r["errors"]:
        worst = max(r["errors"], key=r["errors"].get)
        line += f"; most common error ({r['errors'][worst]}x): {worst}"
    return line


@bench_app.command("serve")
def serve(
    url: Annotated[str, typer.Option(help="The server's base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is "
                                          "dropped); requests go to URL/v1/chat/completions.")],
    model: Annotated[str | None, typer.Option(help="The model to ask for. Default: the first that GET "
                                                   "/v1/models lists.")] = None,
    concurrency: Annotated[str | None, typer.Option(
        help="Closed loop: a run per concurrency C (C requests in flight, each sent as soon as one is answered), "
             "as a comma list. Default: 1,8,16,24,32.")] = None,
    rate: Annotated[list[str] | None, typer.Option(
        help="Open loop instead: Poisson arrivals at R requests/s, a run per rate (repeatable, or a comma "
             "list).")] = None,
    max_concurrency: Annotated[int | None, typer.Option(
        help="Open loop: at most N requests in flight; later arrivals wait for a place.")] = None,
    num_requests: Annotated[int | None, typer.Option(
        help="Requests per run, cycling through the request set. Default: the set's size, and at least the "
             "run's concurrency.")] = None,
    dataset: ServeDatasets = None,
    split: Split = None,
    limit: Limit = None,
    data_dir: DataDir = None,
    prompts_file: Annotated[Path | None, typer.Option(
        "--prompts", help="A JSONL file of {\"prompt\": ...} (optional \"id\") instead of --dataset.")] = None,
    max_tokens: Annotated[int, typer.Option(help="max_tokens of every request.")] = 256,
    temperature: Annotated[float, typer.Option(help="temperature of every request.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the open loop's arrival times.")] = 0,
    timeout: Annotated[float, typer.Option(help="Seconds a request may take, its whole stream included; past "
                                                "them it counts as failed.")] = 600.0,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the summaries and per-request rows "
                                                                  "here.")] = None,
) -> None:
    """Load an OpenAI-compatible server with streamed chat requests and report, per run, TTFT, TPOT, ITL and
    end-to-end latency (mean, median, std, p90, p99), throughput, failures, and the accept length when the
    server reports its target passes (meta_info.spec_verify_ct)."""
    from specpilot.bench.serve_load import (
        Target,
        collect_prompts,
        cycled,
        normalize_url,
        pick_model,
        read_prompts,
        report,
        run_level,
    )
    from specpilot.results import write_json_atomic

    levels = _levels(concurrency, rate, max_concurrency)
    _check_numbers(max_tokens, temperature, timeout, limit, num_requests)
    if prompts_file is not None and (dataset or split or limit is not None or data_dir):
        raise UserError("--prompts replaces --dataset, --split, --limit and --data-dir; give one or the other")
    check_output(json_path)
    base = normalize_url(url)
    datasets, split = dataset or ["builtin"], split or "dev"
    prompts = read_prompts(prompts_file) if prompts_file else collect_prompts(datasets, split, data_dir, limit)
    target = Target(base, pick_model(base, model), max_tokens, temperature, timeout)
    err.print(f"[dim]{target.url}: model {target.model}, {len(prompts)} prompts, {len(levels)} runs[/dim]")
    runs = []
    with interruptible("bench serve interrupted: nothing was written"):
        for level in levels:
            batch = cycled(prompts, num_requests or max(len(prompts), level.concurrency or 0))
            with progress_bar(err, level.name, len(batch)) as advance:
                runs.append(run_level(target, batch, level, seed, lambda _o, step=advance: step()))
            err.print(_said(level.name, runs[-1]), markup=False, highlight=False, soft_wrap=True)
    source = {"prompts": str(prompts_file)} if prompts_file else {"datasets": datasets, "split": split,
                                                                  "limit": limit, "data_dir": data_dir}
    setup = {**source, "num_prompts": len(prompts), "seed": seed}
    if json_path is not None:
        write_json_atomic(json_path, report(target, setup, runs))
    console.print(_table(runs, [level.name for level in levels], target.model))
    if json_path is not None:
        console.print(f"[dim]wrote {json_path}[/dim]")
