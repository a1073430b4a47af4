"""Rounds of the paper's five phases, every measurement a resumable step of the run directory.

Phase 0  the ceiling of the round's start (its largest factor is the round's target);
Phase 1  directions in turn, each tuned on cheap evidence, the best checked and gated (with several devices, the
         directions shared among one process per device: loop/slots.py);
Phase 2  integration: the promoted and the small-gain candidates combined, gated against the start;
Phase 3  kernel tuning of the class furthest from its floor (the options that configure its kernels);
Phase 4  the sealed final on requests no phase saw: the controller against stock and token forcing with longer
         outputs; a failure rejects the round's result and the next round starts where this one did.
A promoted mechanism becomes a memory entry; the round's result is the next round's start.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from specpilot.bench.harness import Runner, free_gpu
from specpilot.ceiling.batch import from_inputs as batch_model
from specpilot.ceiling.report import compute
from specpilot.ceiling.run import CeilingPlan, load, measure, save
from specpilot.config import System
from specpilot.config.env import parse
from specpilot.config.system import parse_system
from specpilot.controller.compare import WorkerDied
from specpilot.datasets import Request
from specpilot.deployment import Deployment
from specpilot.loop.agent import BuiltinAgent, Direction
from specpilot.loop.coding import CodingAgent, Halted, submissions
from specpilot.loop.evidence import BatchEvidence, Evidence
from specpilot.loop.gate import Gate, TreeGate, forcing_refusal, forcing_summary, summary
from specpilot.loop.rundir import BudgetSpent, RunDir
from specpilot.loop.search import TO_GATE, survey
from specpilot.loop.space import runs_as_named, variant

# the kernel classes and the options that configure their kernels (Phase 3)
CLASS_OPTIONS = {"target_gemm": ["gemv", "staged", "l2", "tune_rounds", "ahead", "epilogue_early"],
                 "drafter_gemm": ["gemv", "staged", "tune_rounds"], "attention": ["attn_late", "cluster"],
                 "lm_head": ["greedy_kernel"], "elementwise": ["embed_kernel", "handoff", "pdl"],
                 "drafter_other": ["pdl"], "tree": ["tree_k"]}


# of a budget's time left at Phase 1, what the survey may take (the gates and the final need the rest); a CPU's
# gates cost more against its survey (a busy two-core CPU: survey 150 s, one gate 233 s of a 480-s budget)
SURVEY_SHARE = {"cuda": 0.4, "cpu": 0.25}
PHASE3_SHARE = 0.5  # of what the sealed final leaves, for Phase 3's evidence (the rest may gate what it finds)


@dataclass
class LoopPlan:
    dep: Deployment
    rounds: int
    dev: list[Request]  # Phase 0-3 requests
    sealed: list[Request]  # Phase 4 only
    max_new_tokens: int
    sealed_tokens: int  # forcing's outputs in the final (up to 4096)
    nodes: list[int]  # node budgets the ceiling times
    profile_tokens: int = 8
    ceiling_requests: int = 3  # of the dev requests, the ones the ceiling times, records and profiles
    agent: BuiltinAgent | CodingAgent = field(default_factory=BuiltinAgent)
    sealed_pool: list[Request] = field(default_factory=list)  # more sealed requests: forcing a precision change


@dataclass
class Loop:
    plan: LoopPlan
    run: RunDir
    models: Callable[[], Runner]  # built on first use: a resumed run whose steps are all done loads nothing
    gate_factory: Callable[[Callable[[], Runner], Callable[[], None]], Gate]  # given (the runner, release)
    memory: list[dict] = field(default_factory=list)  # entries the agent may reuse (index rows + registry)
    say: Callable[[str], None] = lambda s: None
    # Phase 1 on several devices (loop/slots.py): `launch_slots(round, start, directions)` runs the directions in
    # processes of their own, one per device, and returns what it did; `slot` = (k, n) in such a process: it
    # measures directions i with i % n == k into the run directory and returns after Phase 1
    launch_slots: Callable[[int, str, int, float | None], dict] | None = None
    slot: tuple[int, int] | None = None
    _round_stop: float | None = None  # with a budget, when this round's share of it ends (loop())
    _runner: Runner | None = None
    _gate: Gate | None = None
    _releases: int = 0  # how often the models were released (a round's evidence is handed the new ones)
    # the evidence's measurements by the ceiling's system they were made from (step timings, closed runs): a later
    # round from the same start reads them back instead of timing again
    _measured: dict = field(default_factory=dict)
    _gated: dict = field(default_factory=dict)  # (start, candidate) -> the round that gated it and its verdict

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            self.say("loading the deployment's models")
            self._runner = self.models()
        return self._runner

    @property
    def gate(self) -> Gate:
        if self._gate is None:  # it asks for the runner each time: the one built after a release, not the old one
            self._gate = self.gate_factory(lambda: self.runner, self.release)
            self._gate.say = self.say
        return self._gate

    def release(self) -> None:
        """Before another tree's worker loads its copy of the target on this GPU (a 28B twin is 56 GB: two do not
        fit in 80): the loop's models are dropped, and built again when next used (`runner`). A CPU's memory holds
        both: nothing is dropped there."""
        if self._runner is None or self.plan.dep.torch_device().type != "cuda":
            return
        self.say("releasing the deployment's models for a worker")
        self._runner.close()  # whoever still holds the old runner (a round's evidence) keeps no model alive
        self._runner = None
        self._releases += 1
        free_gpu()

    # Phase 0

    def ceiling(self, system: str) -> dict:
        """The ceiling report of a system (a speculative one: AR's round analyses stock), measured once per run."""
        analysed = system if parse(system).speculative else "stock"
        folder = self.run.root / "ceilings" / slug(analysed)

        def measure_it() -> dict:
            self.say(f"phase 0: ceiling of {analysed}")
            cpu = self.plan.dep.torch_device().type == "cpu"  # as the evidence's step timings (evidence())
            cplan = CeilingPlan([parse(analysed)], self.plan.dev[: self.plan.ceiling_requests],
                                self.plan.max_new_tokens, self.plan.nodes, profile_requests=1,
                                profile_tokens=self.plan.profile_tokens, step_reps=4 if cpu else 16)
            # a single request's steps, recordings and profile (under regime batch too: the lattices replay and
            # the factors name what one request's step spends)
            inputs, recordings = measure(cplan, self.runner.single(), parse("ar"))
            save(folder, inputs, recordings, {"deployment": self.plan.dep.name, "system": analysed})
            report = compute(inputs, recordings)["systems"][analysed]
            out = {"system": analysed, "folder": str(folder.relative_to(self.run.root)), "target": report["target"],
                   "factors": {k: {"value": v["value"]} for k, v in report["factors"].items()},
                   "speedup": report["speedup"], "classes": report["classes"], "candidates": report["candidates"],
                   "predicted": report["predicted"], "ceiling": report["ceiling"]}
            if self.runner.slots > 1:  # the speedup the regime has: over batched AR, measured (BatchEvidence)
                batch = BatchEvidence(self.runner, self.plan.dev, self.plan.max_new_tokens, [], parse(analysed))
                got = batch.predict(parse(analysed))
                out.update(single_speedup=report["speedup"], in_flight=self.runner.slots,
                           speedup=got.get("speedup", report["speedup"]), batch=got,
                           batch_runs={key[1]: runs for key, runs in batch.cache.items() if key[0] == "closed"},
                           batch_model=batch_model(inputs, analysed, self.runner.target.cfg,
                                                   getattr(self.runner.drafter, "cfg", None), self.runner.slots))
            return out

        return self.run.once(f"ceilings/{slug(analysed)}", measure_it)

    def evidence(self, ceiling: dict) -> Evidence:
        _, recordings = load(self.run.root / ceiling["folder"])
        analysed = parse(ceiling["system"])
        cpu = self.plan.dep.torch_device().type == "cpu"
        # a CPU step is long and synchronous: a few steps time it as well as many, and no queue needs filling
        fewer = {"step_tokens": 2, "step_reps": 4} if cpu else {}
        kind = BatchEvidence if self.runner.slots > 1 else Evidence
        cache, row_steps = self._measured.setdefault(analysed.name, ({}, {}))
        ev = kind(self.runner, self.plan.dev, self.plan.max_new_tokens, recordings.get(analysed.name, []),
                  analysed, paired=cpu, cache=cache, row_steps=row_steps, **fewer)
        for name, (rates, tau) in ceiling.get("batch_runs", {}).items():  # the start's and AR's, not run again
            ev.cache["closed", name] = (rates, tau)
        return ev

    # Phases 1-4

    def round(self, r: int, start: str) -> dict:
        name = f"round-{r}"
        ceiling = self.ceiling(start)
        out: dict = {"round": r, "start": start, "ceiling": ceiling, "target": ceiling["target"], "directions": []}
        start_sys = parse(start)
        lazy: dict = {}

        def ev() -> Evidence:  # made only when a step has to run; handed the models built after a release
            if "ev" not in lazy:
                lazy["ev"], lazy["releases"] = self.evidence(ceiling), self._releases
            elif lazy["releases"] != self._releases:
                lazy["ev"], lazy["releases"] = replace(lazy["ev"], runner=self.runner), self._releases
            return lazy["ev"]

        device = self.plan.dep.torch_device().type
        speedup = ceiling["speedup"] if start_sys.speculative else None
        rivals: dict[str, float] = {}  # base -> the best predicted speedup promoted so far this round
        directions = self.plan.agent.directions(ceiling["factors"], start_sys, self.memory, speedup,
                                                self.plan.dep.in_flight)
        if isinstance(self.plan.agent, CodingAgent) and self.plan.agent.proposer is not None:
            agent = self.plan.agent
            out["master"] = self.run.once(f"{name}/phase-1/master", lambda: agent.propose(
                f"r{r}-master", start, ceiling, directions, self.memory))
            if out["master"].get("fatal"):
                raise Halted(out["master"]["refused"])
            directions = agent.with_proposed(directions, out["master"])
        if self._ranks():
            out["search"] = self._search(name, start_sys, ceiling, ev, device, directions)
        mine = (range(0) if self._ranks() else range(len(directions)) if self.slot is None else
                range(self.slot[0], len(directions), self.slot[1]))
        if self.slot is None and self.launch_slots is not None and len(directions) > 1 and not all(
                self.run.done(f"{name}/phase-1/d{i}/evidence") for i in mine):
            # the slots measure the directions' steps; the loop below reads them back in order
            out["slots"] = self.launch_slots(r, start, len(directions), self._left())
            self.run.refresh()
        for i in mine:
            step, d = f"{name}/phase-1/d{i}", directions[i]
            out["directions"].append(
                self._coding(step, f"r{r}-d{i}", d, start_sys, ceiling, ev)
                if isinstance(self.plan.agent, CodingAgent) else
                self._direction(step, d, start_sys, ev, device, rivals, self._out_of_reach(d, ceiling, start_sys,
                                                                                           rivals)))
        if self.slot is not None:  # a slot's share of Phase 1 is measured: the parent does the rest
            return out
        gated = [g for d in out["directions"] for g in d["gated"]] + out.get("search", {}).get("gated", [])
        promoted = [g for g in gated if g["promoted"]]
        out["integration"] = self._integrate(f"{name}/phase-2", start, gated)
        result, commit = out["integration"]["result"], out["integration"].get("commit")
        if commit:  # Phase 3 configures this install's kernels; the result's code is another tree's
            out["tuning"] = {"class": None, "skipped": f"the result is code (commit {commit[:12]})"}
        else:
            out["tuning"] = self._tune_kernels(f"{name}/phase-3", ceiling, result, ev, device)
        if out["tuning"].get("gated", {}).get("promoted"):
            result = out["tuning"]["gated"]["candidate"]
        out["sealed"] = self.run.once(f"sealed/{slug(result)}" + (f"-{commit[:8]}" if commit else ""),
                                      lambda: self._sealed_tree(result, commit) if commit else self._sealed(result))
        out["result"] = result if out["sealed"]["passed"] else start
        out["result_commit"] = commit if out["sealed"]["passed"] else None
        out["promoted"] = list(dict.fromkeys([g["candidate"] for g in promoted] + (  # a tree judged once counts once
            [out["tuning"]["gated"]["candidate"]] if out["tuning"].get("gated", {}).get("promoted") else [])))
        if out["result"] != start and not out["result_commit"]:
            try:  # the next round's Phase 0, measured once; the budget spent, the sealed result stands without it
                out["ceiling_after"] = self.ceiling(out["result"])
            except BudgetSpent as exc:
                out["ceiling_after"] = {"skipped": str(exc)}
        return out

    def _ranks(self) -> bool:
        """Phase 1 as one ranked search (loop/search.py): the builtin agent on one device. Coding agents work
        direction by direction, and several devices share the directions (loop/slots.py)."""
        return isinstance(self.plan.agent, BuiltinAgent) and self.slot is None and self.launch_slots is None

    def _search(self, name: str, start: System, ceiling: dict, ev, device: str, directions: list[Direction]) -> dict:
        """Every direction's candidates predicted (one step, bounded by its share of the budget), then gates from
        the top of the ranking down: a candidate is gated only while it is predicted to beat what this round
        already promoted (by its measured gain) by the headroom, at most `max_gates` of them."""
        agent, step = self.plan.agent, f"{name}/phase-1/search"
        self.say("phase 1: every candidate predicted (replay, step costs, AR variants)")
        short = self._short(step, "evidence")
        if short:
            return {"ranked": [], "skipped": [], "gated": [], "refused": short}
        deadline = self._deadline()
        # under regime batch the ceiling's kernel and host factors are a single request's: they bound no batch
        reach = ceiling if self.plan.dep.in_flight == 1 else None
        found = self.run.once(step, lambda: survey(agent, directions, start, ev(), device, self._block(),
                                                   self._width(), deadline, reach, self._dtype()))
        ranked = [dict(e) for e in found["ranked"]]  # statuses below are this round's, from the gates' steps
        gated, best = [], None
        for e in ranked:
            if e.get("status") != TO_GATE:
                continue
            if best is not None and e["over_start"] < best * (1 + agent.headroom):
                e["status"] = f"not gated: under the {best:.3f}x over the start already promoted by the headroom"
                continue
            if len(gated) >= agent.max_gates:
                e["status"] = f"not gated: the round's {agent.max_gates} gates are spent"
                continue
            before = self._gated.get((start.name, e["system"]))
            if before is not None:  # a round that went on with the same start's search: judged already
                e["status"] = f"gated in {before[0]}: {before[1]}"
                continue
            gstep = f"{name}/phase-1/{slug(e['system'])}/gate"
            short = self._short(gstep, "gate")
            if short:
                e["status"] = f"not reached: {short}"
                continue
            self.say(f"gate: {e['system']} (predicted {e['speedup']:.2f}x over AR, {e['over_start']:.2f}x the start)")
            g = self.run.once(gstep, lambda c=e["system"]: self.gate.judge(start.name, c))
            gated.append({**g, "predicted": e["speedup"], "direction": e["direction"]})
            e["status"] = ("promoted" if g["promoted"] else f"error: {g['error']}" if g.get("error") else
                           f"refused: {g.get('refused') or g.get('controller', {}).get('reason', '')}")
            self._gated[start.name, e["system"]] = (name, e["status"])
            if g.get("fatal"):
                raise Halted(g["refused"])
            if g["promoted"]:
                best = max(best or 0.0, g["controller"]["gain"])
        return {**found, "ranked": ranked, "gated": gated}

    def _deadline(self, share: float | None = None) -> float | None:
        """With a budget, a step's share (default: the survey's) of what is left after the sealed final's estimate:
        gates need the rest."""
        left = self._left()
        if left is None:
            return None
        if share is None:
            share = SURVEY_SHARE.get(self.plan.dep.torch_device().type, SURVEY_SHARE["cuda"])
        return time.monotonic() + max(0.0, share * (left - self._sealed_estimate()))

    def _coding(self, step: str, name: str, d: Direction, start: System, ceiling: dict, ev) -> dict:
        """A coding agent's direction: its work (one step), then each of its submissions gated."""
        agent = self.plan.agent
        self.say(f"phase 1: {d.factor}: {d.mechanism} ({agent.name})")
        short = self._short(f"{step}/agent", "agent")
        if short:
            return {"direction": d.to_json(), "agent": {"skipped": short}, "gated": []}
        report = self.run.once(f"{step}/agent", lambda: agent.work(name, agent.brief(d, start.name, ceiling,
                                                                                     self.memory)))
        if report.get("fatal"):
            raise Halted(report["refused"])
        judge, gated = submissions(report, start.name)
        for c in judge:
            # code is judged once per round and tree: agents of several directions may well write the same
            key = (f"{step.split('/')[0]}/trees/{c['tree'][:12]}-{slug(c['system'])}" if c["code"] else
                   f"{step}/{slug(c['system'])}")
            short = self._short(f"{key}/gate", "gate")
            if short:
                gated.append({"candidate": c["system"], "start": start.name, "promoted": False, "refused": short})
                continue
            self.say(f"gate: {c['system']}" + (f" (commit {c['commit'][:12]})" if c["code"] else ""))
            if c["code"]:
                gated.append(self.run.once(f"{key}/gate", lambda c=c: self._judge_tree(start.name, c)))
            else:
                cand = parse(c["system"]).name
                check = {"equals_ar": True} if cand == "ar" else self.run.once(
                    f"{key}/correct", lambda c=cand: {"equals_ar": ev().equals_ar(parse(c))})
                gated.append({"candidate": cand, "start": start.name, "promoted": False,
                              "refused": "its outputs differ from AR's in float32"} if check["equals_ar"] is False
                             else self.run.once(f"{key}/gate", lambda c=cand: self.gate.judge(start.name, c)))
            if gated[-1].get("fatal"):
                raise Halted(gated[-1]["refused"])
        return {"direction": d.to_json(), "agent": report, "gated": gated}

    def _judge_tree(self, start: str, c: dict) -> dict:
        agent = self.plan.agent
        g = TreeGate(self.gate).judge(agent.side(start, agent.base), agent.side(c["system"], c["commit"]))
        return {**g, "commit": c["commit"], "tree": c["tree"]}

    def _sealed_tree(self, result: str, commit: str) -> dict:
        """The sealed final of a result that is code: stock's checkout against the result's, as TreeGate judges
        (sealed requests, forcing with the longer outputs)."""
        self.say(f"phase 4: sealed final of {result} (commit {commit[:12]})")
        agent = self.plan.agent
        g = TreeGate(self.gate).judge(agent.side("stock", agent.base), agent.side(result, commit), self.plan.sealed,
                                      self.plan.sealed_tokens)
        if g.get("fatal"):
            raise Halted(g["refused"])
        if g.get("error"):  # not a verdict: the round stops with it (loop), and a resumed run measures it again
            raise WorkerDied(g["error"])
        forcing = g.get("forcing", {})
        reason = (g.get("refused") or ("forcing rejected it" if forcing.get("verdict") == "reject" else
                  f"not proven faster than stock on the sealed requests ({g['controller']['reason']})"
                  if g["controller"]["verdict"] != "promote" else "held"))
        return {"passed": g["promoted"], "result": result, "commit": commit, "reason": reason,
                "controller": g.get("controller"), "forcing": g.get("forcing"), "tamper": g.get("tamper"),
                "seconds": g.get("seconds")}

    def _out_of_reach(self, d: Direction, ceiling: dict, start: System, rivals: dict[str, float]) -> str | None:
        """Why a kernel or host direction need not be searched: the ceiling bounds what its factor can give the
        start (S times the factor's value: its kernels at their floor, no overhead), and that is below what the
        round already promoted of another base (which the direction's candidates cannot join) by the headroom.
        None: search it."""
        # tau's factor holds the step's rows fixed, but its candidates (budgets, block sizes) move the step's cost
        # too: nothing in the ceiling bounds them, so they are always searched
        if d.factor not in ("kernel", "overhead") or not d.value or ceiling["system"] != start.name:
            return None
        rival = max((v for b, v in rivals.items() if b != start.base), default=None)
        reach = ceiling["speedup"] * d.value
        if rival is None or reach >= rival * (1 + self.plan.agent.headroom):
            return None
        return (f"the ceiling bounds {d.factor} at {reach:.3f}x over AR ({ceiling['speedup']:.3f} x {d.value:.3f}), "
                f"under the {rival:.3f}x already promoted this round by more than the headroom")

    def _direction(self, step: str, d: Direction, start: System, ev, device: str, rivals: dict[str, float],
                   skipped: str | None = None) -> dict:
        """rivals: what this round already promoted, by base (a candidate that cannot be combined with those must
        be predicted to beat them); updated with what this direction promotes. skipped: why the ceiling rules the
        direction out (recorded as its evidence, so a resumed run skips it alike)."""
        self.say(f"phase 1: {d.factor}: {d.mechanism}")
        short = self._short(f"{step}/evidence", "evidence")
        if short and not skipped:  # not a step: a resumed run with time left searches it
            return {"direction": d.to_json(), "evidence": {"skipped": short, "evaluated": [], "chosen": []},
                    "gated": []}
        tuned = self.run.once(f"{step}/evidence", lambda: {"skipped": skipped, "evaluated": [], "chosen": []}
                              if skipped else self.plan.agent.tune(d, start, ev(), device, self._block(), dict(rivals),
                                                                   self._width(), self._dtype()))
        gated = []
        for cand in tuned["chosen"]:
            short = self._short(f"{step}/{slug(cand)}/gate", "gate")
            if short:
                gated.append({"candidate": cand, "start": start.name, "promoted": False, "refused": short})
                continue
            check = {"equals_ar": True} if parse(cand).name == "ar" else self.run.once(  # AR itself: nothing to check
                f"{step}/{slug(cand)}/correct", lambda c=cand: {"equals_ar": ev().equals_ar(parse(c))})
            if check["equals_ar"] is False:
                gated.append({"candidate": cand, "start": start.name, "promoted": False,
                              "refused": "its outputs differ from AR's in float32"})
                continue
            self.say(f"gate: {cand}")
            gated.append(self.run.once(f"{step}/{slug(cand)}/gate", lambda c=cand: self.gate.judge(start.name, c)))
            predicted = next((e.get("speedup") for e in tuned["evaluated"] if e["system"] == cand), None)
            if gated[-1]["promoted"] and predicted is not None:
                base = parse(cand).base
                rivals[base] = max(rivals.get(base, 0.0), predicted)
        return {"direction": d.to_json(), "evidence": tuned, "gated": gated}

    def _integrate(self, step: str, start: str, gated: list[dict]) -> dict:
        """The promoted candidates and those that gained without being proven, combined; gated against the start.
        Without a combination, the best promoted candidate (by its gain) is the result. A code candidate (another
        tree's) combines with nothing: when it gained most it is the result, with its commit."""
        promoted = sorted((g for g in gated if g["promoted"] and not g.get("commit")),
                          key=lambda g: -g["controller"]["gain"])
        code = sorted((g for g in gated if g["promoted"] and g.get("commit")), key=lambda g: -g["controller"]["gain"])
        if code and (not promoted or code[0]["controller"]["gain"] > promoted[0]["controller"]["gain"]):
            promoted = code
        if promoted and promoted[0].get("commit"):  # code: judged alone (options of two trees do not combine)
            top = promoted[0]
            return {"parts": [], "combined": None, "result": top["candidate"], "commit": top["commit"]}
        small = [g for g in gated if not g["promoted"] and "controller" in g and g["controller"]["gain"] > 1
                 and g.get("forcing", {}).get("verdict") != "reject" and not g.get("commit")]
        parts = [g["candidate"] for g in promoted + small]
        best = promoted[0]["candidate"] if promoted else start
        combined = combine(start, parts)
        if combined is None or combined in parts or combined == start:
            return {"parts": parts, "combined": combined, "result": best}
        merged = parse(combined)
        if not runs_as_named(merged, self._block(), self._width()):  # e.g. a chain of nodes=8 beside block_size=4
            return {"parts": parts, "combined": combined, "result": best, "refused": self._unrunnable(merged)}
        short = self._short(f"{step}/gate", "gate")
        if short:
            return {"parts": parts, "combined": combined, "refused": short, "result": best}
        self.say(f"phase 2: {combined}")
        g = self.run.once(f"{step}/gate", lambda: self.gate.judge(start, combined))
        better = g["promoted"] and (not promoted or g["controller"]["gain"] >= promoted[0]["controller"]["gain"])
        return {"parts": parts, "combined": combined, "gated": g, "result": combined if better else best}

    def _unrunnable(self, system) -> str:
        """Why the engine refuses a system that runs_as_named turned down."""
        block = system.get("block_size") or self._block()
        tree, k, width = system.get("tree"), system.get("tree_k"), self._width()
        nodes = system.get("nodes") or block
        if tree == "chain":
            return f"a chain verifies its block's {block} rows at most, {nodes} asked"
        if tree == "eagle2" and k > width:
            return f"tree_k={k} exceeds the drafter's {width} candidates per position"
        return f"tree={tree} cannot place {nodes} rows on the drafter's lattice ({block - 1} deep, {width} wide)"

    def _tune_kernels(self, step: str, ceiling: dict, start: str, ev, device: str) -> dict:
        furthest = next((c["class"] for c in ceiling["classes"] if c["class"] in CLASS_OPTIONS
                         and CLASS_OPTIONS[c["class"]]), None)
        if furthest is None:
            return {"class": None}
        d = Direction("kernel", f"kernel configuration of {furthest}", CLASS_OPTIONS[furthest])
        short = self._short(f"{step}/evidence", "evidence")
        if short:
            return {"class": furthest, "refused": short}
        self.say(f"phase 3: {d.mechanism}")
        # half of what the sealed final leaves: each option of a GEMV start is an engine to tune (tens of seconds
        # on a GPU), and the other half may gate what it finds
        deadline = self._deadline(PHASE3_SHARE)
        tuned = self.run.once(f"{step}/evidence",
                              lambda: self.plan.agent.tune(d, parse(start), ev(), device, self._block(),
                                                           width=self._width(), dtype=self._dtype(),
                                                           deadline=deadline))
        out = {"class": furthest, "evidence": tuned}
        if tuned["chosen"]:
            cand = tuned["chosen"][0]
            short = self._short(f"{step}/gate", "gate")
            out["gated"] = ({"candidate": cand, "start": start, "promoted": False, "refused": short} if short else
                            self.run.once(f"{step}/gate", lambda: self.gate.judge(start, cand)))
        return out

    def _left(self) -> float | None:
        """Seconds this round may still use: its share of the budget (what was left when it started, over the
        rounds still to run), so that round 1's survey and gates leave the later rounds theirs; None: no budget."""
        left = self.run.left()
        if left is None or self._round_stop is None:
            return left
        return min(left, self._round_stop - time.monotonic())

    def _sealed_estimate(self) -> float:
        """Seconds the sealed final will take, from the gates measured so far: an A/B run (the start's A/A is
        measured once and stock's serves the final) and forcing at the sealed outputs' length. A gate that recorded
        no split counts whole."""
        out = 0.0
        for name, took in self.run.seconds.items():
            if not name.endswith("/gate"):
                continue
            parts = (self.run.read(name) or {}).get("seconds", {})
            if parts.get("ab") is None:
                out = max(out, took)
            else:  # forcing scaled from the length it ran at (a change of arithmetic's: the sealed length already)
                scale = self.plan.sealed_tokens / parts.get("forcing_tokens", self.plan.max_new_tokens)
                out = max(out, parts.get("logic", 0.0) + parts["ab"] + scale * parts.get("forcing", 0.0))
        return out

    def _short(self, step: str, kind: str) -> str | None:
        """With a budget, why a step of this kind ("evidence" or "gate") is not started: what is left would not
        hold it (as long as the longest one measured) and then the sealed final (_sealed_estimate), which a round
        must end with. None: it runs (also when it finished before: a resumed run reads it back)."""
        have = self._left()
        if have is None or self.run.done(step):
            return None
        need = max((v for k, v in self.run.seconds.items() if k.endswith(f"/{kind}")), default=0.0)
        reserve = self._sealed_estimate()
        if have - need >= reserve:
            return None
        return (f"budget: {max(have, 0):.0f} s left; the longest {kind} step so far took {need:.0f} s and the sealed "
                f"final needs about {reserve:.0f} s")

    def _sealed(self, result: str) -> dict:
        """Stock against the result on the sealed requests, then forcing of the result with the longer outputs."""
        self.say(f"phase 4: sealed final of {result}")
        if result == "stock":
            return {"passed": True, "result": result, "reason": "the round kept stock"}
        if self.gate.broken():  # before the sealed requests are used: the judges and the data as they were
            raise Halted("; ".join(self.gate.broken()))
        t0 = time.monotonic()
        # the float32 check on the unseen requests at the dev outputs' length: on a GPU it runs on the PyTorch
        # references uncaptured (~40 ms a token on SmolLM2, H100), so the sealed outputs' length would cost minutes;
        # the longer outputs go to forcing below
        logic = self.gate.check_logic(result, self.plan.sealed, self.plan.max_new_tokens)
        seconds = {"logic": time.monotonic() - t0}
        if logic is not None and logic["verdict"] == "reject":
            return {"passed": False, "result": result, "logic": logic, "seconds": seconds,
                    "reason": f"the float32 check rejects it on the sealed requests: {logic['reason']}"}
        t0 = time.monotonic()
        card = self.gate.timing("stock", result, split="sealed")
        t1 = time.monotonic()
        forcing = forcing_summary(self.gate.forcing(result, self.plan.sealed, self.plan.sealed_tokens,
                                                    pool=self.plan.sealed_pool))
        seconds.update({"timing": t1 - t0, "forcing": time.monotonic() - t1})
        timed = summary(card)
        refusal = forcing_refusal(forcing, logic, self.gate.precision(result))  # the gate's own rule
        # proven faster than stock (the controller's own promotion rule), not merely a gain above 1: on three
        # sealed requests a CPU run measured 1.17x with a lower bound of 0.36
        passed = timed["verdict"] == "promote" and refusal is None
        reason = refusal or ("held" if timed["verdict"] == "promote" else
                             f"not proven faster than stock on the sealed requests ({timed['reason']})")
        return {"passed": passed, "result": result, "reason": reason, "controller": timed, "forcing": forcing,
                **({"logic": logic} if logic is not None else {}), "seconds": seconds}

    def _block(self) -> int:
        """The drafter's block (the models load here, only when a step must run)."""
        return self.runner.engine(parse("stock")).block

    def _width(self) -> int:
        """The drafter's lattice candidates per position (as _block)."""
        return self.runner.engine(parse("stock")).width

    def _dtype(self) -> str:
        """The served weights' dtype (space.values: verify=tlv and weights=w12 need BF16), as the deployment says."""
        return str(self.plan.dep.torch_dtype()).removeprefix("torch.")

    def loop(self, remember: Callable[[dict], list[str]] = lambda r: []) -> dict:
        """With a budget (the run directory's), a round starts only if the last one's duration fits in what is
        left. A budget spent inside a round stops the loop there: the rounds that ended stand, and the best is the
        last one's result."""
        start, rounds, converged, stopped, errors = "stock", [], None, None, []
        for r in range(1, self.plan.rounds + 1):
            have = self.run.left()
            # a round fits its share (_left): it will not fit less than the shortest round so far took
            shortest = min((x["seconds"] for x in rounds), default=0.0)
            if rounds and have is not None and have < shortest:
                stopped = (f"round {r} not started: the shortest round so far took {shortest:.0f} s and "
                           f"{max(have, 0):.0f} s of the budget are left")
                break
            if have is not None:
                self._round_stop = time.monotonic() + have / (self.plan.rounds - r + 1)
            mark = len(self.run.touched)
            try:
                rounds.append(self.round(r, start))
            except BudgetSpent as exc:
                stopped = f"{exc} during round {r}"
                break
            except Halted as exc:
                stopped = f"halted in round {r}: {exc}"
                break
            except WorkerDied as exc:  # the sealed final's timing: the round has no result
                errors.append(str(exc))
                stopped = f"round {r} failed: {exc}"
                break
            # its steps' measured time, also where a resumed run read them back (the first step to need the
            # models counts their loading)
            rounds[-1]["seconds"] = round(self.run.cost(self.run.touched[mark:]), 1)
            rounds[-1]["memory"] = remember(rounds[-1])
            failed = errors_of(rounds[-1])
            if failed:  # what it kept is not what its search would have found: neither converged nor a next round
                errors += failed
                kept = "kept its start" if rounds[-1]["result"] == start else f"ended with {rounds[-1]['result']}"
                stopped = f"round {r} {kept}, but {len(failed)} gates failed: {'; '.join(failed)}"
                start = rounds[-1]["result"]
                break
            if rounds[-1].get("result_commit"):
                start = rounds[-1]["result"]
                converged = (f"round {r}'s result is code (commit {rounds[-1]['result_commit'][:12]}): a next round "
                             "starts from that commit's own install")
                self.say(f"converged: {converged}")
                break
            unreached = not_reached(rounds[-1])
            if rounds[-1]["result"] == start and r < self.plan.rounds and unreached:
                # its survey ran out of its share: the next round goes on with it (what was measured is read
                # back, what was gated is not gated again), and only a round that saw every candidate converges
                rounds[-1]["unreached"] = unreached
                what = f"{unreached} candidates not reached" if isinstance(unreached, int) else unreached
                self.say(f"round {r} kept its start with {what}: round {r + 1} goes on with its search")
                continue
            if rounds[-1]["result"] == start and r < self.plan.rounds:
                # the agent is deterministic over its evidence: a round from the same start would search the same
                # candidates again (and a promoted one would meet its cached sealed verdict again)
                converged = f"round {r} kept its start; the next round would repeat its search"
                self.say(f"converged: {converged}")
                break
            start = rounds[-1]["result"]
        if stopped:
            self.say(f"stopped: {stopped}")
        commit = next((r.get("result_commit") for r in rounds[::-1] if r["result"] == start), None)
        return {"rounds": rounds, "best": start, "best_commit": commit, "converged": converged, "stopped": stopped,
                "errors": errors}


def not_reached(round: dict) -> int | str:
    """Candidates of a round's ranked search that its share of the budget did not reach; or why it did not search
    at all (its share spent before its survey began: on a CPU the ceiling alone can take round 1's)."""
    search = round.get("search", {})
    if search.get("refused"):
        return f"its survey did not begin ({search['refused']})"
    return sum(1 for e in search.get("ranked", []) if e.get("status", "").startswith("not reached"))


def errors_of(round: dict) -> list[str]:
    """Every gate's error in a round, wherever the round keeps its gate results: a string under "error" in a dict
    that also names a "candidate"."""
    found = []

    def walk(node) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("error"), str) and "candidate" in node:
                found.append(node["error"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(round)
    return found


def combine(start: str, parts: list[str]) -> str | None:
    """The start with every part's options on top (the parts' own changes relative to the start); None when two
    parts set one option to different values or bases differ."""
    base = parse_system(start)
    merged: dict = {}
    for p in parts:
        s = parse_system(p)
        if s.base != base.base:
            return None
        for k in set(s.options) | set(base.options):
            if s.get(k) != base.get(k):
                if k in merged and merged[k] != s.get(k):
                    return None
                merged[k] = s.get(k)
    return variant(base, **merged).name if merged else None


def slug(system: str) -> str:
    """A system's name as a step name (lower case, no colons or commas)."""
    return re.sub(r"[^a-z0-9._=-]+", "-", system.lower()).strip("-")
