"""`specpilot loop`: a deployment in, the fastest configuration it could prove lossless out (`DIR/best.toml`), with
every measurement, verdict and memory entry in the run directory and a report beside them."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from specpilot.agents.backends import Budget, backend
from specpilot.agents.guards import Seal
from specpilot.agents.session import AgentSetup
from specpilot.agents.worktree import freeze, git
from specpilot.bench.harness import Runner
from specpilot.controller.compare import REPO
from specpilot.controller.worker import code_hash
from specpilot.datasets import data_file, load_requests
from specpilot.deployment import Deployment
from specpilot.errors import UserError
from specpilot.forcing import TOLERANCE
from specpilot.forcing.logic import LogicCheck
from specpilot.forcing.run import ExactTargets
from specpilot.loop.agent import BuiltinAgent
from specpilot.loop.best import write_best, write_best_patch
from specpilot.loop.coding import CodingAgent
from specpilot.loop.gate import Gate
from specpilot.loop.remember import fingerprint, remember
from specpilot.loop.rounds import Loop, LoopPlan
from specpilot.loop.rundir import RunDir
from specpilot.loop.slots import check_devices, launch
from specpilot.memory.faithful import resolve, tree_of
from specpilot.memory.store import Store
from specpilot.models.smollm2 import models_dir
from specpilot.results import environment, write_json_atomic

# requests per dataset a change of arithmetic may be forced on: on the pair (H100), 8 of each of 5 datasets x 256
# tokens scored 9566 tokens, enough to detect 0.57 points where the tolerance is 0.5
POOL = 12
# the gate's timing looks on a GPU (loop/gate.Gate.timing): the dev requests, then twice and four times as many
# while the bounds straddle the bar (on the pair, best_first N=16's 5 requests: gain 1.089, lower 1.020, bar 1.036);
# a CPU's lockstep passes settle its own runs, and a look there costs a minute
LOOKS = 3
# tokens the float32 check scores at least on a GPU (forcing/logic.py: 2048 see a change of logic that alters 0.15%
# of AR's choices, 95%); on a CPU only the forcing requests (the float32 deployment's forcing is exact as well)
LOGIC_TOKENS = 2048
ENGINES = 8  # engines the loop's process keeps (the search visits dozens of systems; see Runner.max_engines)


@dataclass
class LoopArgs:
    dep: Deployment
    worker_spec: dict  # how a controller worker names the deployment: {"preset": ...} or {"deployment": path}
    run_dir: Path
    rounds: int
    agent: str
    limit: int
    max_new_tokens: int
    resume: bool = False
    budget_s: float | None = None
    data_dir: str | None = None
    sealed_tokens: int | None = None  # the sealed final's forcing outputs (None: 4x max_new_tokens, up to 4096)
    agent_budget: Budget | None = None  # a coding agent's wall seconds, turns and money per direction
    jail: bool = True  # jail coding agents where the machine allows (agents/jail.py)
    directions: int = 10  # at most this many directions per round (each costs an agent's run with a coding agent)
    master: str = "builtin"  # who names the directions: the builtin master, or an LLM's (beside it; coding agents)
    slots: list[str] = field(default_factory=list)  # Phase 1's devices, a process each (loop/slots.py); []: one
    slot: tuple[int, int] | None = None  # (k, n) in a slot's own process
    forcing_bound: float = TOLERANCE  # the gate's forcing power bound (loop/gate.Gate.power_bound)
    logic_tokens: int | None = None  # the float32 check's least tokens (None: LOGIC_TOKENS on a GPU, 0 on a CPU)

    @property
    def sealed(self) -> int:
        return self.sealed_tokens or min(4096, 4 * self.max_new_tokens)


def requests(dep: Deployment, split: str, limit: int, data_dir: str | None) -> list:
    out = [r for d in dep.datasets for r in load_requests(d, split, data_dir, limit)]
    if len(out) < 3:
        raise UserError(f"deployment {dep.name}: only {len(out)} {split} requests; the gate needs at least 3 "
                        "(raise --limit, or add a --dataset)")
    return out


def pool(dep: Deployment, split: str, first: list, limit: int, data_dir: str | None) -> list:
    """`first`, then more requests of the split (up to `limit` per dataset): what forcing of a change of arithmetic
    doubles into until its power bound is reached."""
    have = {r.id for r in first}
    return list(first) + [r for d in dep.datasets for r in load_requests(d, split, data_dir, limit)
                          if r.id not in have]


def identity(a: LoopArgs) -> dict:
    """What a run's steps depend on: the deployment as served (not its name or file), the requests' selection and
    the output budgets, the agent."""
    dep = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(a.dep).items()
           if k not in ("name", "source", "limit", "max_new_tokens")}
    for role in ("target", "drafter"):
        if dep[role] is not None and dep[role]["path"] is not None:
            dep[role]["path"] = str(Path(dep[role]["path"]).resolve())
    return {"deployment": dep, "limit": a.limit, "max_new_tokens": a.max_new_tokens, "sealed_tokens": a.sealed,
            "agent": a.agent, "master": a.master, "forcing_bound": a.forcing_bound, "logic_tokens": a.logic_tokens}


def step_key(a: LoopArgs, code: str) -> dict:
    """What each stored step's result depends on (loop/rundir.py): the code that measured it (the install's hash)
    and the run's identity. A resume reuses a step only under the same key, with or without run.json."""
    return {"code": code, **identity(a)}


def node_budgets(context: int, tokens: int) -> list[int]:
    """Budgets whose step timings fit the context after a profiled request (18 steps of N rows)."""
    return [n for n in (4, 8, 16, 32, 48, 64) if 18 * n + tokens + 128 <= context] or [4]


def coding_agent(a: LoopArgs, sealed: list, code: str) -> CodingAgent:
    """The agent's backend, its budget and guards: the seal over the install and the sealed requests' files, the
    folders the jail protects, and the base commit (the install's files now, frozen)."""
    files = [f for f in (data_file(d, a.data_dir) for d in {r.dataset for r in sealed}) if f is not None]
    install = REPO / "specpilot"
    seal = Seal.take(install, files)
    protect = [REPO, *{f.parent for f in files}, models_dir(), a.run_dir.resolve()]
    setup = AgentSetup(backend(a.agent), REPO, a.run_dir.resolve() / "agents", a.agent_budget or Budget(1800, 50),
                       seal, protect, use_jail=a.jail)
    base = freeze(REPO, "HEAD", "specpilot loop: the install's files at the start")
    head = resolve(REPO, "HEAD")
    clean = base.tree == tree_of(REPO, head)
    if not clean:  # uncommitted changes: their commit is kept (memory entries name it)
        git(REPO, "update-ref", f"refs/specpilot/bases/{base.commit}", base.commit)
    target = (f"--preset {a.worker_spec['preset']}" if "preset" in a.worker_spec else
              f"--deployment {a.worker_spec['deployment']}")
    proposer = None if a.master == "builtin" else AgentSetup(backend(a.master), REPO, setup.root, setup.budget,
                                                             seal, protect, use_jail=a.jail)
    return CodingAgent(setup, BuiltinAgent(max_directions=a.directions), proposer=proposer,
                       base=head if clean else base.commit,
                       checkouts=a.run_dir.resolve() / "checkouts", target=target,
                       install_code=code, in_flight=a.dep.in_flight if a.dep.regime == "batch" else 1)


def check_units(dep, dev: list, sealed: list, limit: int) -> None:
    """Under regime batch every timing unit is a closed loop of `in_flight` requests (controller/worker.units), and
    the controller needs three of them on the dev and the sealed requests alike."""
    need = 3 * dep.in_flight
    if dep.regime != "batch" or min(len(dev), len(sealed)) >= need:
        return
    more = math.ceil(need / max(len(dep.datasets), 1))
    fix = (f"raise --limit to {more} or more" if limit < more else
           "the datasets hold no more: add datasets or serve fewer requests in flight")
    raise UserError(f"deployment {dep.name} serves {dep.in_flight} requests in flight: the gate times closed loops "
                    f"of {dep.in_flight} and needs three, {need} requests a split, but --limit {limit} gives "
                    f"{len(dev)} dev and {len(sealed)} sealed; {fix}")


def build_loop(a: LoopArgs, say: Callable[[str], None]) -> tuple[Loop, RunDir]:
    for who in {a.agent, a.master} - {"builtin"}:
        backend(who)  # an unknown kind or a missing program is refused before anything runs
    if a.master != "builtin" and a.agent == "builtin":
        raise UserError("--master proposes directions for a coding agent to build: give --agent too")
    if a.dep.drafter is None:
        raise UserError(f"deployment {a.dep.name} has no drafter: the loop tunes speculative decoding from the "
                        "drafter's stock behaviour (train one with `specpilot train-drafter`)")
    counts = {"--rounds": a.rounds, "--limit": a.limit, "--max-new-tokens": a.max_new_tokens,
              "--sealed-tokens": a.sealed, "--directions": a.directions}
    for flag, value in counts.items():
        if value <= 0:
            raise UserError(f"{flag} must be positive, got {value}")
    if a.sealed > 4096:
        raise UserError(f"--sealed-tokens is at most 4096, got {a.sealed}")
    if not 0 < a.forcing_bound < 1:
        raise UserError(f"the forcing power bound is a fraction in (0, 1), got {a.forcing_bound}")
    if a.budget_s is not None and not (a.budget_s > 0 and math.isfinite(a.budget_s)):
        raise UserError(f"--budget is a positive number of seconds, got {a.budget_s}")
    if a.run_dir.exists() and not a.run_dir.is_dir():
        raise UserError(f"--run-dir {a.run_dir} is a file; name a folder")
    if a.agent_budget is not None and (a.agent_budget.wall_s <= 0 or (a.agent_budget.turns or 1) <= 0
                                       or (a.agent_budget.usd or 1) <= 0):
        raise UserError("--agent-wall, --agent-turns and --agent-usd must be positive")
    on_cpu = a.dep.torch_device().type == "cpu"
    if a.slots:
        check_devices(a.slots, on_cpu)
        if a.agent != "builtin":
            raise UserError("--gpus shares the builtin agent's directions; coding agents run one at a time")
    dev, sealed = (requests(a.dep, s, a.limit, a.data_dir) for s in ("dev", "sealed"))
    check_units(a.dep, dev, sealed, a.limit)
    code = code_hash(REPO / "specpilot")  # the install's, once: every step of this process ran this code
    run = RunDir(a.run_dir, resume=a.resume, budget_s=a.budget_s, shared=a.slot is not None, key=step_key(a, code))
    if a.slot is None:  # a slot's process writes into the run its parent checked
        run.same_run(identity(a))
    agent = BuiltinAgent(max_directions=a.directions) if a.agent == "builtin" else coding_agent(a, sealed, code)
    # a change of arithmetic is forced on up to POOL requests per dataset (a GPU's; a CPU deployment is float32,
    # where the float32 check decides and nothing is forced further)
    more = POOL if not on_cpu else a.limit
    plan = LoopPlan(a.dep, a.rounds, dev, sealed, a.max_new_tokens, a.sealed,
                    # a CPU's ceiling times its start's own rows only: the survey times each row count it needs,
                    # and six more budgets took a minute of a busy two-core CPU's ten
                    [] if on_cpu else node_budgets(a.dep.context, 16), agent=agent,
                    sealed_pool=pool(a.dep, "sealed", sealed, max(more, a.limit), a.data_dir))
    dev_pool = pool(a.dep, "dev", dev, max(more, a.limit), a.data_dir)
    cover = a.logic_tokens if a.logic_tokens is not None else (0 if on_cpu else LOGIC_TOKENS)
    logic_pool = pool(a.dep, "dev", dev, max(POOL, a.limit), a.data_dir) if cover else dev
    spec = {**a.worker_spec, "datasets": a.dep.datasets, "split": "dev", "limit": a.limit,
            "max_new_tokens": a.max_new_tokens, "data_dir": a.data_dir,
            **({"cpu": True, "threads": len(os.sched_getaffinity(0))} if on_cpu else {}),
            **({"in_flight": a.dep.in_flight} if a.dep.regime == "batch" else {})}

    def models() -> Runner:
        from specpilot.runtime.pair import build_pair

        target, drafter, tok = build_pair(a.dep)
        return Runner(target, drafter, tok, a.dep.context, max_engines=ENGINES, slots=a.dep.in_flight)

    def gate(runner: Callable[[], Runner], release: Callable[[], None]) -> Gate:
        # both systems served by one process, request by request: on a GPU the loop's own, on its models (a second
        # copy of a 28B twin, 56 GB, does not fit beside the first in 80 GB); on a CPU one worker in lockstep,
        # pinned to its cores with passive OpenMP threads (what the A/A noise below was measured with; a running
        # process cannot change its OpenMP policy), for a model load of a few seconds
        # on a CPU: 5 lockstep passes (an A/B run stops after 3 once settled); the A/A run's 5 measured 1.6% on
        # SmolLM2's 3 default requests where 3 passes measured 4.7% and 6.7% (a bar no real gain cleared)
        return Gate(spec, runner, dev, a.max_new_tokens, alternating=True, reps=5 if on_cpu else 1,
                    seal=getattr(agent, "setup", None) and agent.setup.seal, exact=ExactTargets(a.dep),
                    power_bound=a.forcing_bound, in_process=not on_cpu, release=release,
                    logic=LogicCheck(a.dep, runner, logic_pool, cover), forcing_pool=dev_pool,
                    precision_tokens=a.sealed,
                    looks=1 if on_cpu else LOOKS)

    shipped = Store(REPO / "memory", REPO)
    memory = [{"id": i, "registry": e.registry, "fingerprint": e.evidence.get("fingerprint", {})}
              for i, e in ((i, shipped.read(i)) for i in shipped.ids())]
    slots = partial(launch, a, run) if a.slots and a.slot is None else None
    return Loop(plan, run, models, gate, memory=memory, say=say, launch_slots=slots, slot=a.slot), run


def run_loop(a: LoopArgs, say: Callable[[str], None] = lambda s: None) -> dict:
    """The whole loop; -> the summary written to DIR/loop.json (also when a budget stopped it early)."""
    loop, run = build_loop(a, say)
    env = environment()  # the code the loop starts with, not what the tree holds when it ends
    commit, dirty = resolve(REPO, "HEAD"), bool(env["dirty"])
    coding = isinstance(loop.plan.agent, CodingAgent)
    if coding:  # entries (and their patches) start from the base every worktree started from
        commit, dirty = loop.plan.agent.base, False
    store = Store(a.run_dir / "memory", REPO)
    with run:
        run.log("loop", rounds=a.rounds, agent=a.agent, deployment=a.dep.name, resume=a.resume)
        try:
            result = loop.loop(lambda r: remember(store, r, a.dep, REPO, commit, dirty, a.agent))
        finally:
            if coding:
                loop.plan.agent.clean()
        summary = {**env, "deployment": a.dep.name, "agent": a.agent, "rounds_asked": a.rounds,
                   "limit": a.limit, "max_new_tokens": a.max_new_tokens, "sealed_tokens": a.sealed,
                   "forcing_bound": a.forcing_bound, "budget_s": a.budget_s, "slots": a.slots,
                   **({"base_commit": commit} if coding else {}), "measured": run.ran, "reused_steps": run.reused,
                   "fingerprint": fingerprint(a.dep), "memory_given": loop.memory,
                   **result}
        write_json_atomic(a.run_dir / "loop.json", summary)
        if result.get("best_commit"):  # another tree's system: its code delta beside the deployment
            write_best_patch(a.run_dir / "best.patch", REPO, commit, result["best_commit"])
        elif result["best"] is not None:
            write_best(a.run_dir / "best.toml", a.dep, result["best"],
                       f"written by `specpilot loop` ({len(result['rounds'])} rounds, agent {a.agent}); "
                       f"run directory {a.run_dir}")
    return summary
