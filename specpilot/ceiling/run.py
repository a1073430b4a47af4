"""`specpilot ceiling`, the measuring half: everything the cost model needs, from one deployment and its systems.

Per system, through the harness on the same requests: a timed run (with AR: tau, T_step, T_AR, speedup), a
recording of every step's lattice (replay: tau_best, tau(N)), the target's own top-K along each recorded output
(the lattice factor), a kernel profile of eager steps (ceiling/profile.py), the captured step timed alone at
every node budget (c(N)), the floors of the step's shape, and the machine's rates. `inputs` is plain JSON (with
the recorded lattices beside it, a run directory that `--from` recomputes the report from, without the models).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specpilot.bench.harness import Runner, run_request_major
from specpilot.bench.metrics import summarize
from specpilot.ceiling import machine
from specpilot.ceiling.floors import StepShape, floors, to_json
from specpilot.ceiling.profile import profile_generations
from specpilot.config import KernelPlan, System
from specpilot.config.system import with_options
from specpilot.core.contracts import Prompted
from specpilot.datasets import Request
from specpilot.errors import UserError
from specpilot.replay.record import TurnLattices
from specpilot.replay.record import load as load_lattices
from specpilot.replay.record import write as write_lattices
from specpilot.replay.run import record
from specpilot.replay.walk import best
from specpilot.results import folder_atomic

KEPT = ("tau", "tau_histogram", "decode_ms_per_step", "decode_ms_per_token", "speedup_vs_ar", "n_requests",
        "mismatch_vs_ar", "by_dataset")


@dataclass
class CeilingPlan:
    systems: list[System]  # speculative systems (AR, the reference, is added)
    requests: list[Request]
    max_new_tokens: int
    nodes: list[int]  # node budgets for c(N) and tau(N)
    profile_requests: int = 2  # requests profiled (eager: slow) and used for the step timings
    profile_tokens: int = 64  # output tokens per profiled request
    ideal_k: int = 16  # the target's own top-K along its greedy path
    step_reps: int = 16  # steps per c(N) timing (a CPU's long synchronous steps need fewer)


def measure(plan: CeilingPlan, runner: Runner, ar: System, progress: Callable[[str], None] = lambda s: None
            ) -> tuple[dict, dict[str, list[TurnLattices]]]:
    """(inputs, recordings by system name)."""
    device, dtype = runner.target.device, runner.target.embed.weight.dtype
    progress("timed run (AR and every system)")
    systems = {s.name: s for s in [ar, *plan.systems]}
    records = run_request_major(runner, systems, plan.requests, plan.max_new_tokens)
    bench = {name: {k: v for k, v in summarize(recs, records[ar.name]).items() if k in KEPT}
             for name, recs in records.items()}
    prompts = [r.prompt for r in records[ar.name][: plan.profile_requests]]
    stops = runner.tokenizer.eos_ids
    inputs: dict = {"bench": bench, "systems": {}, "machine": machine.measure(device, dtype),
                    "max_new_tokens": plan.max_new_tokens, "nodes": plan.nodes}
    progress("AR: profile and step timing")
    inputs["ar"] = {"profile": _profile(runner, ar, prompts, plan.profile_tokens, stops),
                    "step_s": step_seconds(runner, ar, prompts[0], plan.profile_tokens, plan.step_reps)}
    recordings = {}
    for sys_ in plan.systems:
        progress(f"{sys_.name}: recording lattices")
        # a recording holds one drafting round a step: two-level verification's are recorded with exact verify
        recorded = with_options(sys_, "verify=exact") if sys_.get("verify") == "tlv" else sys_
        turns = record(runner, recorded, plan.requests, plan.max_new_tokens)
        recordings[sys_.name] = turns
        progress(f"{sys_.name}: profile, step timings, the target's top-K")
        inputs["systems"][sys_.name] = _system_inputs(runner, sys_, turns, prompts, plan, stops)
    context = _mean_context(recordings)
    inputs["ar"]["floors"] = to_json(floors(runner.target.cfg, None, StepShape(1, context, dtype_bytes=_bytes(dtype))))
    return inputs, recordings


def _system_inputs(runner: Runner, sys_: System, turns: list[TurnLattices], prompts, plan: CeilingPlan,
                   stops) -> dict:
    engine = runner.engine(sys_)
    depth, width = turns[0].tokens.shape[1:3] if turns else (engine.block - 1, 0)
    taus = [sum(t.live) / len(t.live) for t in turns]
    shape = StepShape(rows=engine.rows, context=_mean_context({sys_.name: turns}), draft_rows=engine.block,
                      ctx_rows=sum(taus) / len(taus) if taus else 1.0, depth=depth, width=width,
                      tree=engine.builder is not None, dtype_bytes=_bytes(runner.target.embed.weight.dtype))
    step_s = {}
    builder = engine.tree[0]  # what it runs: an EAGLE-3 drafter's stock is its release's tree, not a chain
    for n in sorted({*plan.nodes, engine.rows}):
        if builder == "chain" and n > engine.block:
            continue  # a chain holds the block at most
        at = f"nodes={n}" if builder == sys_.get("tree") else f"tree={builder},nodes={n}"
        variant = sys_ if n == engine.rows else with_options(sys_, at)
        step_s[str(n)] = step_seconds(runner, variant, prompts[0], plan.profile_tokens, plan.step_reps)
    return {"config": engine.system.to_json(), "builder": builder, "rows": engine.rows, "block": engine.block,
            "shape": dataclasses.asdict(shape), "floors": to_json(floors(runner.target.cfg, runner.drafter.cfg, shape)),
            "profile": _profile(runner, sys_, prompts, plan.profile_tokens, stops),
            "step_s": step_s, "ideal": ideal(runner.target, turns, plan.ideal_k, engine.rows)}


def _profile(runner: Runner, sys_: System, prompts, tokens: int, stops) -> dict:
    eager = with_options(sys_, "graphs=false")
    runner.warmup(eager)
    return profile_generations(runner.engine(eager), prompts, tokens, stops).to_json()


def step_seconds(runner: Runner, sys_: System, prompt: list[int], tokens: int, reps: int = 16) -> float:
    """Seconds per step of `reps` steps enqueued back to back (a graph replay each on CUDA), continuing a real
    request from its state after `tokens` outputs: the decode loop's steady state, where the host's reads are
    hidden behind the steps in flight."""
    runner.warmup(sys_)
    engine = runner.engine(sys_)
    # a repeated timing from the same request starts from the same state, kept on the engine: no new prefill
    kept = engine.timing_state
    if kept is None or kept[0] != (tuple(prompt), tokens) or not engine.restore(kept[1]):
        engine.generate([Prompted(prompt, tokens)])
        engine.timing_state = ((tuple(prompt), tokens), engine.snapshot())
    step = engine._spec if sys_.speculative else engine._ar
    if int(engine.pos) + (reps + 2) * max(engine.rows, 1) > engine.context:
        raise UserError(f"the step timing of {sys_.name} needs {reps + 2} more steps of context than "
                        f"{engine.context} holds: lower --profile-tokens")
    cuda = engine.device.type == "cuda"
    with torch.inference_mode():
        step()  # the first after generate may still pay a lazy initialisation
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                step()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1000 / reps
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        return (time.perf_counter() - t0) / reps


@torch.inference_mode()
def ideal(target, turns: list[TurnLattices], k: int, nodes: int) -> dict:
    """The lattice factor's numerator: an ideal drafter's lattice holds, at each depth, the target's own top-K at
    that position of its greedy output (so the output's token, the target's argmax, at rank 0). Replayed like
    tau_best at the same anchors and node budget; `top1_agreement` is the share of output tokens the target's
    teacher-forced argmax reproduces (below 1 only where the precision's rounding flips a near-tie)."""
    taus, agree, total = [], 0, 0
    for t in turns:
        seq = torch.tensor([t.sequence], device=target.device)
        h = target.normed_hidden(seq)
        # [T, K]: the top-K of the token after each position
        top = target.head.project(h, KernelPlan.stock()).topk(k, dim=-1).indices[0].cpu()
        out = torch.tensor(t.sequence[t.prompt_len:])
        agree += int((top[t.prompt_len - 1 : -1, 0] == out).sum())
        total += len(out)
        depth = t.tokens.shape[1]
        at = (t.starts[:, None] + torch.arange(depth)).clamp(max=len(t.sequence) - 1)
        steps = best(dataclasses.replace(t, tokens=top[at]), nodes)
        taus.append(int(steps.sum()) / steps.numel())
    return {"tau_ideal": sum(taus) / len(taus) if taus else None, "k": k,
            "top1_agreement": agree / total if total else None}


def _mean_context(recordings: dict[str, list[TurnLattices]]) -> float:
    starts = [float(s) for turns in recordings.values() for t in turns for s in t.starts]
    return sum(starts) / len(starts) if starts else 0.0


def _bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def save(run_dir, inputs: dict, recordings: dict[str, list[TurnLattices]], meta: dict) -> None:
    """run_dir/inputs.json and one recorded-lattice folder per system (lattices-<i>, named in inputs.json), the
    folder replaced as one unit (never one system's recording new and another's old)."""
    with folder_atomic(run_dir) as tmp:
        folders = {}
        for i, (name, turns) in enumerate(recordings.items()):
            folders[name] = f"lattices-{i}"
            write_lattices(tmp / folders[name], turns, {**meta, "system": name})
        (tmp / "inputs.json").write_text(json.dumps({**inputs, "meta": meta, "lattices": folders}, indent=1) + "\n")


def load(run_dir) -> tuple[dict, dict[str, list[TurnLattices]]]:
    path = Path(run_dir) / "inputs.json"
    if not path.exists():
        raise UserError(f"no ceiling measurements in {run_dir} (expected {path}; `specpilot ceiling --measure` "
                        "makes them)")
    try:
        inputs = json.loads(path.read_text())
        folders = inputs["lattices"].items()
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{path} is not a ceiling measurement ({type(exc).__name__}: {exc}); measure again with "
                        "`specpilot ceiling --measure`") from None
    recordings = {name: load_lattices(Path(run_dir) / folder)[0] for name, folder in folders}
    return inputs, recordings
