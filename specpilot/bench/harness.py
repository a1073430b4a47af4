"""The harness: requests in, run records out. Every system is run through here and nowhere else."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from specpilot.bench.datasets import Request
from specpilot.config import KernelPlan, System
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

    def __init__(self, target, drafter, tokenizer, context: int):
        self.target, self.drafter, self.tokenizer, self.context = target, drafter, tokenizer, context
        self._engines: dict[str, Engine] = {}
        self._plans: dict[tuple, KernelPlan] = {}
        self._warm: set[str] = set()

    def engine(self, system: System) -> Engine:
        if system.name not in self._engines:
            fresh = system.plan()
            plan = self._plans.setdefault(tuple(sorted(fresh.features().items())), fresh)
            drafter = self.drafter if system.speculative else None
            self._engines[system.name] = Engine(self.target, drafter, system, context=self.context, plan=plan)
        return self._engines[system.name]

    def warmup(self, system: System) -> None:
        if system.name not in self._warm:
            self.engine(system).warmup()
            self._warm.add(system.name)

    def run(self, system: System, request: Request, max_new_tokens: int,
            on_turn: Callable[[], None] | None = None, recorder=None) -> list[TurnRecord]:
        """recorder (replay/record.Recorder): each turn's lattices are recorded (its steps run one by one)."""
        engine = self.engine(system)
        engine.recorder = recorder
        messages: list[dict[str, str]] = []
        records = []
        for k, text in enumerate(request.turns):
            messages.append({"role": "user", "content": text})
            prompt = self.tokenizer.chat_prompt(messages)
            gen = engine.generate(prompt, max_new_tokens, self.tokenizer.eos_ids)
            messages.append({"role": "assistant", "content": self.tokenizer.decode(gen.tokens)})
            rid = request.id if len(request.turns) == 1 else f"{request.id}#turn{k + 1}"
            records.append(TurnRecord(rid, request.dataset, k + 1, prompt, gen.tokens, gen.prefill_s,
                                      gen.decode_s, gen.accepted))
            if recorder is not None:
                recorder.finish(rid, request.dataset, prompt, gen.tokens, gen.accepted)
            if on_turn:
                on_turn()
        engine.recorder = None
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
