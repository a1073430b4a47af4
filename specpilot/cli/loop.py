"""`loop` and `report`: the SpecPilot loop, and the report of its run directory."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from specpilot.cli.common import (
    DataDir,
    Datasets,
    DeploymentFile,
    Named,
    app,
    check_folder_path,
    console,
    err,
    interruptible,
    progress,
)
from specpilot.errors import UserError
from specpilot.forcing import TOLERANCE

GATE_FAILED = 3  # exit status of a loop whose gates' timing failed (2 is a user's mistake, 130 Ctrl-C)

# A named deployment's defaults: its [budgets] are a benchmark's (the twin's 20 requests per dataset x 256 tokens,
# timed on both sides, are minutes a look on an H100); the loop starts small and its gate adds what it needs
GATE_REQUESTS = 3  # the controller's minimum
LOOP_TOKENS = 64
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
    limit: Annotated[int | None, typer.Option(help="Requests per dataset in each split (dev, sealed) the gate "
                                                   "starts from; it needs 3 in all, and on a GPU it adds requests "
                                                   "while a gain's bounds straddle its bar (up to 4x) and forces a "
                                                   "change of arithmetic on up to 12 per dataset. Default: as few "
                                                   "as make 3 (one per dataset of the pair or its twin).")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Output budget of the dev requests. Default: the "
                                                            "deployment's, at most 64 (no deployment named: "
                                                            "16).")] = None,
    sealed_tokens: Annotated[int | None, typer.Option(help="Output budget of the sealed final's token forcing "
                                                           "(default 4x --max-new-tokens, at most 4096).")] = None,
    budget: Annotated[float | None, typer.Option(help="Wall-clock seconds: a round starts only if the last one's "
                                                      "duration fits in what is left, and the loop stops cleanly "
                                                      "between two measurements once they are spent. Default: "
                                                      "none (no deployment named: 480).")] = None,
    forcing_bound: Annotated[float, typer.Option(help="The gate's tolerance: token forcing of a change of "
                                                 "arithmetic (a kernel plan of its own, W12, the 8-bit pass) must be "
                                                 "able to detect an excess mismatch rate over stock's this small (a "
                                                 "fraction: 0.005 = 0.5 points, the paper's rule), else it is not "
                                                 "promoted; a change of logic alone is decided by the float32 check "
                                                 "and reports what forcing could detect.")] = TOLERANCE,
    logic_tokens: Annotated[int | None, typer.Option(min=0, help="Tokens the float32 check scores at least (past "
                                                  "the gate's own requests, into more dev requests of 256 tokens): "
                                                  "it sees a change of logic that alters 3/N of AR's choices at 95%. "
                                                  "Default: 2048 on a GPU, the gate's requests alone on a CPU.")
                    ] = None,
    in_flight: Annotated[int | None, typer.Option(
        "--in-flight", help="Tune for this many requests served at once (regime batch, continuous batching): the "
                            "gate times closed loops of that many requests (three at least: --limit defaults to "
                            "as many), the float32 check and token forcing run them batched, and the batch's "
                            "verify rows are searched first (batch_rows, batch_budget).")] = None,
    dataset: Datasets = None,
    data_dir: DataDir = None,
) -> None:
    """The SpecPilot loop: rounds of ceiling analysis (Phase 0), directions tuned on cheap evidence and gated by
    the controller and token forcing (1), integration (2), kernel tuning (3) and a sealed final against stock
    (4). Writes DIR/best.toml (a deployment with the winning system: `specpilot bench --deployment
    DIR/best.toml` runs it), DIR/loop.json, the memory entries in DIR/memory, and the report (`specpilot report
    DIR`). With no arguments: the SmolLM2 pair (`specpilot models fetch smollm2`, `specpilot data fetch`), one
    request from each of GSM8K, HumanEval and MT-Bench, 16 tokens (32 in the sealed forcing), a budget of 480 s: a
    finished report in under ten minutes on a small CPU. Naming a deployment drops these defaults. Exit status: 0;
    2 for a mistake in the arguments; 3 when a gate's timing failed (its worker died: a crash, out of memory,
    killed, timed out), after loop.json (its "errors") and the report are written; 130 on Ctrl-C."""
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
    named = naming(preset, deployment)
    if in_flight is not None:
        if in_flight < 1:
            raise UserError(f"--in-flight must be at least 1, got {in_flight}")
        dep = dep.serving(in_flight)
        named = {**named, "in_flight": in_flight}  # the timing workers serve the same batch
    units = 3 * dep.in_flight if dep.regime == "batch" else GATE_REQUESTS
    folder = run_dir or Path("runs") / f"loop-{dep.name}"
    check_folder_path(folder, make_parents=True)  # a file on the way fails here, not after a round's work
    if not resume:
        folder.parent.mkdir(parents=True, exist_ok=True)
    args = LoopArgs(dep, named,
                    folder, rounds, agent, limit if limit is not None else -(-units // len(dep.datasets)),
                    max_new_tokens if max_new_tokens is not None else min(dep.max_new_tokens, LOOP_TOKENS), resume,
                    budget, data_dir,
                    sealed_tokens, Budget(agent_wall, agent_turns, agent_usd), jail, directions, master,
                    [g.strip() for g in gpus.split(",")] if gpus else [], forcing_bound=forcing_bound,
                    logic_tokens=logic_tokens)
    kept = f"everything measured so far is in {folder}; continue with --resume --run-dir {folder}"
    with interruptible(f"loop interrupted: {kept}"), progress(err) as say:
        summary = run_loop(args, say)
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
    for e in summary.get("errors", []):
        err.print(f"[red]gate failed:[/red] {escape(e)}", highlight=False, soft_wrap=True)
    if summary.get("errors"):
        raise typer.Exit(GATE_FAILED)


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="A loop's run directory.")]) -> None:
    """Render a loop's run directory as Markdown (report.md, its chart report.png) and one self-contained HTML
    page (report.html): the verdict first (the best system's sealed speedup over stock and AR, forcing and its
    power, the logic check; errors above it), tokens/s across rounds with each round's bottleneck, every
    candidate with its evidence, why each skipped direction was skipped, links to the run's files."""
    from specpilot.loop.report import write_report

    md, html = write_report(run_dir)
    console.print(f"wrote {md}\nwrote {html}", markup=False)
