"""The harness: requests in, run records out. Every system is run through here and nowhere else."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from specpilot.bench.datasets import Request
from specpilot.runtime.engine import Engine
from specpilot.runtime.options import System


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
    """Holds one engine per step shape (systems that share a shape share caches and graphs)."""

    def __init__(self, target, drafter, tokenizer, context: int):
        self.target, self.drafter, self.tokenizer, self.context = target, drafter, tokenizer, context
        self._engines: dict[tuple, Engine] = {}
        self._warm: set[str] = set()

    def engine(self, system: System) -> Engine:
        drafter = self.drafter if system.base == "stock" else None
        block = system.get("block_size") if drafter else 0
        kwargs = {"use_graphs": system.get("graphs"), "block_size": block, "gemv": system.get("gemv"),
                  "fault": system.get("fault"), "pad_us": system.get("pad_us")}
        key = (system.base, *kwargs.values())
        if key not in self._engines:
            self._engines[key] = Engine(self.target, drafter, context=self.context, **kwargs)
        return self._engines[key]

    def warmup(self, system: System) -> None:
        if system.name not in self._warm:
            self.engine(system).warmup(system)
            self._warm.add(system.name)

    def run(self, system: System, request: Request, max_new_tokens: int,
            on_turn: Callable[[], None] | None = None) -> list[TurnRecord]:
        engine = self.engine(system)
        messages: list[dict[str, str]] = []
        records = []
        for k, text in enumerate(request.turns):
            messages.append({"role": "user", "content": text})
            prompt = self.tokenizer.chat_prompt(messages)
            gen = engine.generate(prompt, max_new_tokens, self.tokenizer.eos_ids, system)
            messages.append({"role": "assistant", "content": self.tokenizer.decode(gen.tokens)})
            rid = request.id if len(request.turns) == 1 else f"{request.id}#turn{k + 1}"
            records.append(TurnRecord(rid, request.dataset, k + 1, prompt, gen.tokens, gen.prefill_s,
                                      gen.decode_s, gen.accepted))
            if on_turn:
                on_turn()
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
