"""The engine's stepping loop alone: requests in by key, each step's new tokens out by key. Nothing here knows of
HTTP or of threads; serve/worker.py runs it on a thread of the server's process or in a process of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from specpilot.core.contracts import Generation, Prompted
from specpilot.errors import UserError


@dataclass
class Out:
    """What one step gave one request: new tokens; or its end (`done`, then `generation`); or an error."""

    key: int
    tokens: list[int]
    done: bool = False
    generation: Generation | None = None
    error: Exception | None = None


class Core:
    """engine: an Engine of `in_flight` slots at least (2 at least: runtime/batch.Batcher)."""

    def __init__(self, engine, in_flight: int):
        from specpilot.runtime.batch import Batcher

        self.batcher = Batcher(engine, in_flight=in_flight)  # captures the step graphs (both kinds) now
        self.rids: dict[int, int] = {}  # key -> the batcher's request id
        self.keys: dict[int, int] = {}  # and back

    @property
    def busy(self) -> bool:
        return self.batcher.busy

    @property
    def slots(self) -> int:
        return self.batcher.sched.slots

    def counts(self) -> tuple[int, int]:
        """(requests in flight, requests waiting for a slot)."""
        return self.batcher.sched.in_flight, self.batcher.sched.queued

    def submit(self, key: int, request: Prompted) -> list[Out]:
        """[] once taken; the engine's own refusal (the server checked the request) answers this one alone."""
        try:
            rid = self.batcher.submit(request)
        except UserError as exc:
            return [Out(key, [], error=exc)]
        self.rids[key], self.keys[rid] = rid, key
        return []

    def cancel(self, key: int) -> None:
        rid = self.rids.pop(key, None)
        if rid is not None:
            self.batcher.cancel(rid)
            del self.keys[rid]

    def step(self) -> list[Out]:
        try:
            updates = self.batcher.step()
        except Exception as exc:  # noqa: BLE001 - every request in flight is answered, the engine serves on
            return self.fail_all(exc)
        outs = []
        for u in updates:
            key = self.keys.get(u.rid)
            if key is None:
                continue
            outs.append(Out(key, u.tokens, u.done, u.generation))
            if u.done:
                del self.keys[u.rid], self.rids[key]
        return outs

    def fail_all(self, exc: Exception) -> list[Out]:
        outs = [Out(key, [], error=RuntimeError(f"the engine failed: {exc}")) for key in self.rids]
        for rid in self.keys:
            self.batcher.cancel(rid)
        self.rids.clear()
        self.keys.clear()
        return outs


def build(dep, system: str, slots: int):
    """-> (engine, tokenizer): the deployment's engine of `slots` slots running `system`, warmed (its graphs
    captured). Module-level, so the engine process can be given it by name."""
    from specpilot.config import parse_system
    from specpilot.runtime.engine import Engine
    from specpilot.runtime.pair import build_pair

    sys_ = parse_system(system)
    target, drafter, tokenizer = build_pair(dep, with_drafter=sys_.speculative)
    engine = Engine(target, drafter, sys_, context=dep.context, slots=slots)
    engine.warmup()
    return engine, tokenizer
