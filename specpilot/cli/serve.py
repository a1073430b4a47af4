"""`serve`: a deployment (a preset, a deployment file or a loop's best.toml) behind an OpenAI-compatible server."""

from __future__ import annotations

from typing import Annotated

import typer

from specpilot.cli.common import DeploymentFile, Preset, app, err, load_named, system_help
from specpilot.errors import UserError

DEFAULT_IN_FLIGHT = 8


@app.command()
def serve(
    preset: Preset = None,
    deployment: DeploymentFile = None,
    system: Annotated[str | None, typer.Option(
        "--system", "-s", help=system_help("The system to serve (default: the deployment's `system`, as a loop's "
                                           "best.toml names the one it proved, else stock where there is a "
                                           "drafter, else AR),"))] = None,
    host: Annotated[str, typer.Option(help="Address to listen at (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen at (0: any free one; the URL is printed).")] = 8000,
    max_in_flight: Annotated[int | None, typer.Option(
        "--max-in-flight", help="Requests decoded at once (each holds a cache row of the context). Default: the "
                                f"deployment's in_flight under regime batch, else {DEFAULT_IN_FLIGHT}.")] = None,
    max_waiting: Annotated[int, typer.Option(
        "--max-waiting", help="Requests that may wait for a slot; past that a request gets 503 with "
                              "Retry-After.")] = 256,
    model_name: Annotated[str | None, typer.Option(
        "--model-name", help="The model id clients name (default: the deployment's name).")] = None,
    drain_timeout: Annotated[float, typer.Option(
        "--drain-timeout", help="On SIGTERM, seconds to let requests in flight finish.")] = 60.0,
) -> None:
    """Serve OpenAI's /v1/completions and /v1/chat/completions (streaming too), /v1/models, /health, /metrics.

    Greedy where a request's temperature is 0; otherwise sampling, losslessly (the same seed gives AR's own
    sampled answer, whatever the system). Usage reports speculation in completion_tokens_details
    (accepted/rejected_prediction_tokens) and each answer's meta_info (target passes, tokens per pass)."""
    from functools import partial

    from specpilot.config import parse_system
    from specpilot.serve.app import Served
    from specpilot.serve.app import serve as run_server
    from specpilot.serve.core import build
    from specpilot.serve.worker import EngineProcess

    dep = load_named(preset, deployment)
    in_flight = max_in_flight if max_in_flight is not None else (
        dep.in_flight if dep.regime == "batch" else DEFAULT_IN_FLIGHT)
    if in_flight < 1 or max_waiting < 0 or drain_timeout < 0 or not 0 <= port < 65536:
        raise UserError("--max-in-flight must be at least 1, --max-waiting and --drain-timeout at least 0, and "
                        "--port in 0..65535")
    sys_ = parse_system(system or dep.system or ("stock" if dep.drafter is not None else "ar"))
    if sys_.speculative and dep.drafter is None:
        raise UserError(f"deployment {dep.name} has no drafter, so it cannot serve {sys_.name}")
    err.print(f"loading {dep.name} ({sys_.name}) in the engine's process ...")
    # 2 slots at least: the batch executor's; a lone request runs at batch size 1
    worker = EngineProcess(partial(build, dep, sys_.name, max(2, in_flight)), in_flight, max_waiting)
    info = worker.info
    served = Served(model_name or dep.name, sys_.name, info["tokenizer"], info["context"], info["rows"],
                    info["speculative"], in_flight)
    try:
        run_server(served, worker, host, port, drain_timeout)
    finally:
        worker.stop()
