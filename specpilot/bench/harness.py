"""The harness: requests in, run records out. Every system is run through here and nowhere else."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from specpilot.config import KernelPlan, System
from specpilot.core.contracts import Prompted
from specpilot.datasets import Request
from specpilot.errors import UserError
from specpilot.runtime.engine import Engine


@dataclass
class TurnRecord:
    """One generation: a request's turn (MT-Bench has two; the second sees this system's own first answer)."""

    id: str
    dataset: str
    turn: int
    prompt: list[int]
    tokens: list[int]
    prefill_s: float
    decode_s: float
    accepted: list[int] = field(default_factory=list)  # tokens committed per decode target pass

    @property
    def decode_tokens(self) -> int:
        return max(len(self.tokens) - 1, 0)

    @property
    def decode_rate(self) -> float | None:
        return self.decode_tokens / self.decode_s if self.decode_tokens and self.decode_s > 0 else None

    def to_json(self) -> dict:
        return asdict(self)


class Runner:
    """Holds one engine per system (engines whose kernel plans agree share one plan, and so its step tuning)."""

    def __init__(self, target, drafter, tokenizer, context: int, max_engines: int | None = None, slots: int = 1):
        """slots: requests in flight on each engine (a deployment's `in_flight` under regime batch)."""
        self.target, self.drafter, self.tokenizer, self.context = target, drafter, tokenizer, context
        self.slots = slots
        self._engines: dict[str, Engine] = {}  # least recently used first
        self._plans: dict[tuple, KernelPlan] = {}
        self._warm: set[str] = set()
        # A search that visits dozens of systems keeps only this many engines (each holds its own K/V caches and
        # captured graphs: ~1 GB apiece on a 28B target); None keeps every one.
        self.max_engines = max_engines
        self._single: Runner | None = None  # single()

    @staticmethod
    def _key(system: System, slot: int) -> str:
        return system.name if slot == 0 else f"{system.name}#{slot}"

    def engine(self, system: System, slot: int = 0) -> Engine:
        """slot: a second engine of the same system (its own caches), for running a system against itself."""
        key = self._key(system, slot)
        if key in self._engines:
            self._engines[key] = self._engines.pop(key)  # now the most recently used
        else:
            self._evict()
            plan = self.shared_plan(system.plan())
            drafter = self.drafter if system.speculative else None
            self._engines[key] = Engine(self.target, drafter, system, context=self.context, plan=plan,
                                        slots=self.slots)
        return self._engines[key]

    def shared_plan(self, plan: KernelPlan) -> KernelPlan:
        """The plan this runner's engines of equal features share (its tuning table filled by their step tuning),
        or `plan`, now shared."""
        return self._plans.setdefault(tuple(sorted(plan.features().items())), plan)

    def _evict(self) -> None:
        """Drop the least recently used engines until one more fits under max_engines; their memory is freed."""
        if self.max_engines is None or len(self._engines) < self.max_engines:
            return
        while self._engines and len(self._engines) >= self.max_engines:
            key = next(iter(self._engines))
            del self._engines[key]
            self._warm.discard(key)
        if self.target.device.type == "cuda":  # a CPU gets its memory back without a full collection (0.16 s each)
            gc.collect()
            torch.cuda.empty_cache()

    def keep(self, wanted: list[tuple[System, int]]) -> None:
        """Drop every engine but these (system, slot)s: a timing in this process holds the target and the engines it
        times, not the K/V caches and graphs of every system visited before it."""
        keys = {self._key(system, slot) for system, slot in wanted}
        dropped = [k for k in self._engines if k not in keys]
        for key in dropped:
            del self._engines[key]
            self._warm.discard(key)
        if dropped:
            free_gpu()

    def single(self) -> Runner:
        """This runner's models one request at a time (itself where it has one slot): under regime batch what a
        single request's step timings, recordings and profiles need (an engine of several slots serves its requests
        together). Made once; its engines are its own, its kernel plans (and their step tuning) shared."""
        if self.slots == 1:
            return self
        if self._single is None:
            self._single = Runner(self.target, self.drafter, self.tokenizer, self.context, self.max_engines)
            self._single._plans = self._plans
        return self._single

    def close(self) -> None:
        """Drop the engines and the models: whoever still holds this runner keeps no GPU memory alive."""
        if self._single is not None:
            self._single.close()
            self._single = None
        self._engines.clear()
        self._plans.clear()
        self._warm.clear()
        self.target = self.drafter = None
        free_gpu()

    def warmup(self, system: System, slot: int = 0) -> None:
        key = self._key(system, slot)
        if key not in self._warm:
            self.engine(system, slot).warmup()
            self._warm.add(key)

    def run(self, system: System, request: Request, max_new_tokens: int,
            on_turn: Callable[[], None] | None = None, recorder=None, slot: int = 0) -> list[TurnRecord]:
        """recorder (replay/record.Recorder): each turn's lattices are recorded (its steps run one by one).
        slot: which engine of the system (engine()), so that an A/A run's two sides are two engines."""
        engine = self.engine(system, slot)
        engine.recorder = recorder
        messages: list[dict[str, str]] = []
        records = []
        for k, text in enumerate(request.turns):
            messages.append({"role": "user", "content": text})
            prompt = self.tokenizer.chat_prompt(messages)
            rid = request.id if len(request.turns) == 1 else f"{request.id}#turn{k + 1}"
            try:
                gen = engine.generate([Prompted(prompt, max_new_tokens, tuple(self.tokenizer.eos_ids))])[0]
            except UserError as exc:  # which request, for a message about its length
                raise UserError(f"request {rid}: {exc}") from None
            messages.append({"role": "assistant", "content": self.tokenizer.decode(gen.tokens)})
            records.append(TurnRecord(rid, request.dataset, k + 1, prompt, gen.tokens, gen.prefill_s,
                                      gen.decode_s, gen.accepted))
            if recorder is not None:
                recorder.finish(rid, request.dataset, prompt, gen.tokens, gen.accepted)
            if on_turn:
                on_turn()
        engine.recorder = None
        return records


def free_gpu() -> None:
    """Hand the GPU memory of dropped objects back (a CPU gets its memory back without a full collection)."""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


def run_lockstep(runner: Runner, a: System, b: System, request: Request, max_new_tokens: int, first: int = 0
                 ) -> tuple[list[TurnRecord], list[TurnRecord]]:
    """Both systems answer the request step by step in turn, each turn's decode steps interleaved so that both
    progress through their outputs together (the side with fewer tokens steps next; on a tie the side that
    stepped second last time goes first; `first` = 1: B starts), every step timed alone. On a machine whose
    speed drifts within a second both sides see the same speeds; in one process neither disturbs the other.
    Each side's decode time is the sum of its own steps; prefill is timed alone before the decode."""
    sides = [(runner.engine(a), []), (runner.engine(b, slot=int(a.name == b.name)), [])]
    records: tuple[list[TurnRecord], list[TurnRecord]] = ([], [])
    for k, text in enumerate(request.turns):
        prompts, gens, clocks = [], [], []
        for engine, messages in sides:
            messages.append({"role": "user", "content": text})
            prompts.append(runner.tokenizer.chat_prompt(messages))
            steps = engine.steps(prompts[-1], max_new_tokens, runner.tokenizer.eos_ids)
            t0 = time.perf_counter()
            next(steps)
            gens.append(steps)
            clocks.append([time.perf_counter() - t0, 0.0, 1])  # prefill, decode, tokens so far
        results: list = [None, None]
        turn = first
        while any(r is None for r in results):
            live = [i for i in (0, 1) if results[i] is None]
            i = min(live, key=lambda j: (clocks[j][2], j != turn))
            t0 = time.perf_counter()
            try:
                clocks[i][2] = next(gens[i])
            except StopIteration as done:
                results[i] = done.value
            clocks[i][1] += time.perf_counter() - t0
            turn = 1 - i
        rid = request.id if len(request.turns) == 1 else f"{request.id}#turn{k + 1}"
        for (_, messages), recs, gen, (pre, dec, _), prompt in zip(sides, records, results, clocks, prompts,
                                                                    strict=True):
            messages.append({"role": "assistant", "content": runner.tokenizer.decode(gen.tokens)})
            recs.append(TurnRecord(rid, request.dataset, k + 1, prompt, gen.tokens, pre, dec, gen.accepted))
    return records


def run_request_major(runner: Runner, systems: dict[str, System], requests: list[Request], max_new_tokens: int,
                      progress: Callable[[], None] | None = None) -> dict[str, list[TurnRecord]]:
    """Every system runs request i before any runs request i+1, so slow drift of the machine hits all
    alike; graphs are captured in a warm-up first. Keys are the caller's (system names, or roles, where
    the same system may appear twice for a genuine second run)."""
    for system in systems.values():
        runner.warmup(system)
    records: dict[str, list[TurnRecord]] = {key: [] for key in systems}
    for request in requests:
        for key, system in systems.items():
            records[key].extend(runner.run(system, request, max_new_tokens, progress))
    return records


def run_batched(runner: Runner, systems: dict[str, System], requests: list[Request], max_new_tokens: int,
                progress: Callable[[], None] | None = None) -> tuple[dict[str, list[TurnRecord]], dict[str, float]]:
    """Regime batch, closed loop, each system in turn (run_closed). Returns the records (each turn's prefill_s
    from its admission) and each system's wall seconds over all its turns."""
    for system in systems.values():
        runner.warmup(system)
    records: dict[str, list[TurnRecord]] = {}
    seconds: dict[str, float] = {}
    for key, system in systems.items():
        records[key], seconds[key] = run_closed(runner, system, requests, max_new_tokens)
        if progress:
            progress()
    return records, seconds


def run_closed(runner: Runner, system: System, requests: list[Request], max_new_tokens: int, slot: int = 0
               ) -> tuple[list[TurnRecord], float]:
    """One closed loop of `requests` on the system's engine (slot: as engine()) of `runner.slots` requests in flight:
    every request's first turn submitted at once, then every second turn (each on its own first answer), and so on.
    -> (the records, request by request and turn by turn; the wall seconds over all turns). The engine is warmed
    first (its graphs captured, batch_rows=auto's step costs timed): one dropped for another under the runner's
    max_engines is made again here, and that must not be timed (2026-12-07: a sweep of six systems on three engines
    timed the remade engines' captures, AR at 520 tok/s where it makes ~3600)."""
    runner.warmup(system, slot)
    engine = runner.engine(system, slot)
    eos = tuple(runner.tokenizer.eos_ids)
    chats: list[list[dict[str, str]]] = [[] for _ in requests]
    done: list[list[TurnRecord]] = [[] for _ in requests]
    t0 = time.perf_counter()
    for k in range(max((len(r.turns) for r in requests), default=0)):
        live = [i for i, r in enumerate(requests) if k < len(r.turns)]
        prompts = []
        for i in live:
            chats[i].append({"role": "user", "content": requests[i].turns[k]})
            prompts.append(runner.tokenizer.chat_prompt(chats[i]))
        gens = engine.generate([Prompted(p, max_new_tokens, eos) for p in prompts])
        for i, prompt, gen in zip(live, prompts, gens, strict=True):
            chats[i].append({"role": "assistant", "content": runner.tokenizer.decode(gen.tokens)})
            r = requests[i]
            rid = r.id if len(r.turns) == 1 else f"{r.id}#turn{k + 1}"
            done[i].append(TurnRecord(rid, r.dataset, k + 1, prompt, gen.tokens, gen.prefill_s, gen.decode_s,
                                      gen.accepted))
    return [rec for recs in done for rec in recs], time.perf_counter() - t0


def closed_generate(runner: Runner) -> Callable:
    """forcing/run.Generate on `runner`'s batched engines: the requests' turn records made `runner.slots` in flight
    (closed loop), as a batch deployment serves them, each request's handed to keep."""
    from specpilot.config.env import parse

    def generate(name: str, requests: list[Request], max_new: int, progress, keep) -> dict[str, list[TurnRecord]]:
        records = run_closed(runner, parse(name), requests, max_new)[0] if requests else []
        out: dict[str, list[TurnRecord]] = {r.id: [] for r in requests}
        for rec in records:
            out[rec.id.split("#")[0]].append(rec)
            if progress:
                progress()
        for rid, recs in out.items():
            if keep:
                keep(rid, recs)
        return out

    return generate
