"""Continuous batching's host side: which request holds which cache slot, what each step prefills and decodes.

Requests wait in arrival order; a free slot takes the oldest arrived one. A slot's request first prefills its
prompt, at most `chunk` prompt tokens a step over all slots (a long prompt in several chunks, so that decoding
requests are never stalled for a whole prompt), then decodes one step with every other decoding slot. The
executor reports what each step produced; a request that is done frees its slot at once, for the next one to
take in the same plan. Nothing here touches a tensor: the rules are tested on their own (tests/test_scheduler.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


def batch_sizes(slots: int) -> tuple[int, ...]:
    """The batch sizes a step is captured at for an engine of `slots` (1, 2, 4, 8, then every 8, and slots): a step
    runs the smallest that holds its highest decoding slot, so a half-empty batch does not pay for a full one."""
    sizes = {n for n in (1, 2, 4) if n < slots} | set(range(8, slots, 8)) | {slots}
    return tuple(sorted(sizes))


def size_for(highest: int, sizes: tuple[int, ...]) -> int:
    """The smallest of `sizes` that holds slot `highest` (slots are numbered from 0)."""
    return next(n for n in sizes if n > highest)


@dataclass
class Tracked:
    """A request as the scheduler sees it: rid, prompt length, when it may start (a step count), its slot, how
    much of its prompt is in the cache, and whether it is done."""

    rid: int
    prompt_len: int
    arrival: int = 0
    slot: int | None = None
    prefilled: int = 0
    done: bool = False

    @property
    def decoding(self) -> bool:
        return self.slot is not None and not self.done and self.prefilled == self.prompt_len


@dataclass
class StepPlan:
    """One step: prefill chunks (slot, rid, first prompt index, end) in order, then one decode step for `decode`
    (slot -> rid) where any is. `admitted`: requests that took a slot at this plan."""

    prefill: list[tuple[int, int, int, int]] = field(default_factory=list)
    decode: dict[int, int] = field(default_factory=dict)
    admitted: list[int] = field(default_factory=list)

    @property
    def idle(self) -> bool:
        return not self.prefill and not self.decode


class Scheduler:
    """slots: requests in flight at most (the cache's batch rows); chunk: prompt tokens prefilled a step; per_slot:
    prompt tokens a slot prefills a step at most (None: as many as `chunk` leaves; prompt admission: a step's rows)."""

    def __init__(self, slots: int, chunk: int, per_slot: int | None = None):
        if slots < 1 or chunk < 1 or (per_slot is not None and per_slot < 1):
            raise ValueError(f"slots, chunk and per_slot must be positive, got {slots}, {chunk} and {per_slot}")
        self.slots, self.chunk, self.per_slot = slots, chunk, per_slot
        self.requests: dict[int, Tracked] = {}
        self.waiting: deque[int] = deque()
        self.holder: list[int | None] = [None] * slots
        self.step = 0

    def submit(self, rid: int, prompt_len: int, arrival: int = 0) -> None:
        if rid in self.requests:
            raise ValueError(f"request {rid} was submitted already")
        if prompt_len < 1:
            raise ValueError(f"request {rid}: a prompt needs at least one token")
        self.requests[rid] = Tracked(rid, prompt_len, arrival)
        self.waiting.append(rid)

    @property
    def finished(self) -> bool:
        return all(r.done for r in self.requests.values())

    @property
    def in_flight(self) -> int:
        """Requests holding a slot."""
        return sum(rid is not None for rid in self.holder)

    @property
    def queued(self) -> int:
        """Requests waiting for a slot."""
        return len(self.waiting)

    def forget(self, rid: int) -> None:
        """Drops a done request's record (a server's scheduler would otherwise keep every request it served)."""
        if not self.requests[rid].done:
            raise ValueError(f"request {rid} is not done")
        del self.requests[rid]

    def plan(self) -> StepPlan:
        """The next step's work (its prompt chunks, then the decoding slots); the step count moves on."""
        out = StepPlan()
        for slot in range(self.slots):
            if self.holder[slot] is None:
                rid = self._next_arrived()
                if rid is None:
                    break
                self.holder[slot] = rid
                self.requests[rid].slot = slot
                out.admitted.append(rid)
        budget = self.chunk
        for slot, rid in enumerate(self.holder):
            if rid is None:
                continue
            r = self.requests[rid]
            if r.prefilled < r.prompt_len and budget > 0:
                end = min(r.prompt_len, r.prefilled + min(budget, self.per_slot or budget))
                out.prefill.append((slot, rid, r.prefilled, end))
                budget -= end - r.prefilled
                r.prefilled = end
            elif r.decoding:
                out.decode[slot] = rid
        self.step += 1
        return out

    def _next_arrived(self) -> int | None:
        for i, rid in enumerate(self.waiting):
            if self.requests[rid].arrival <= self.step:
                del self.waiting[i]
                return rid
        return None

    def cancel(self, rid: int) -> int | None:
        """The request is given up (its client left): it waits no more, or frees its slot for the next plan. The
        slot it held, if any (None: it held none, or was done already)."""
        r = self.requests[rid]
        if r.done:
            return None
        if r.slot is None:
            self.waiting.remove(rid)
            r.done = True
            return None
        self.finish(rid)
        return r.slot

    def finish(self, rid: int) -> None:
        """The request is done (a stop token, its budget): its slot is free for the next plan."""
        r = self.requests[rid]
        if r.slot is None or r.done:
            raise ValueError(f"request {rid} holds no slot")
        r.done = True
        self.holder[r.slot] = None
