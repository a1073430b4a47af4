"""Continuous batching on one engine of several slots (Engine(slots=S)): every request holds a cache row from its
admission to its end; each step prefills prompt chunks (each chunk its own pass on its row) and then runs one
decode step of the slots up to the highest decoding one (rounded up to a captured batch size), AR or speculative,
each row at its own position with its own chain or tree; slots above it do not run.

A slot without a decoding request is parked: where the step runs it, it runs on whatever the slot holds, but its
position and its drafter context do not move (the step's `live` mask), and what it writes lies at or past the
position it is parked at. A free slot parks at 0; from its admission until its prefill is done it parks at its
request's prompt length, so the junk of the steps in between lands past the prompt, where the request writes
before it reads. Outputs are per row (greedy, or sampled by the row's own seed), so each request's tokens are those
it gets alone (tests/test_batch.py).
"""

from __future__ import annotations

import time

import torch

from specpilot.core.contracts import Forward, Generation, Prompted
from specpilot.core.regions import region
from specpilot.errors import UserError
from specpilot.models.dense import Mode
from specpilot.runtime.scheduler import Scheduler, size_for

CHUNK = 256  # prompt tokens prefilled a step, over all slots


class _Live:
    """One request's progress: its output, tokens per target pass, and clock."""

    def __init__(self, request: Prompted):
        self.request, self.out, self.accepted = request, [], []
        self.admitted = self.first = self.last = 0.0

    def take(self, new: list[int]) -> bool:
        """Appends a pass's tokens; True when the request is done (a stop token, its budget)."""
        self.out.extend(new)
        self.last = time.perf_counter()
        return bool(set(self.request.stop_ids).intersection(new)) or len(self.out) >= self.request.max_new_tokens

    def generation(self) -> Generation:
        out = self.request.cut(self.out)
        accepted = list(self.accepted)
        if accepted:  # the last pass may have committed past a stop or the budget: count what was kept
            accepted[-1] = len(out) - 1 - sum(accepted[:-1])
        return Generation(tokens=out, prefill_s=self.first - self.admitted, decode_s=self.last - self.first,
                          accepted=accepted)


@torch.inference_mode()
def run_batch(engine, requests: list[Prompted], base: str | None = None, arrivals: list[int] | None = None,
              chunk: int = CHUNK) -> list[Generation]:
    """Each request's Generation (in order); prefill_s runs from its admission to its first token."""
    spec = (base or engine.system.base) == "stock"
    if spec and engine.drafter is None:
        raise UserError("system 'stock' needs a drafter in the deployment")
    if arrivals is not None and len(arrivals) != len(requests):
        raise ValueError("one arrival step per request")
    for r in requests:
        engine.check_request(r.prompt, r.max_new_tokens)
    engine.requests += 1
    sched = Scheduler(engine.slots, chunk)
    for rid, r in enumerate(requests):
        sched.submit(rid, len(r.prompt), arrivals[rid] if arrivals else 0)
    live = [_Live(r) for r in requests]
    engine.sample_as(requests)
    steps = engine.batch_steps(spec)
    engine.live.zero_()  # every slot parked at 0 while the steps are captured (their warm-up runs move nothing)
    engine.pos.zero_()
    for step in steps.values():
        step.prepare()
    if spec:
        engine.state.ctx_count.zero_()
    while not sched.finished:
        work = sched.plan()
        for rid in work.admitted:
            slot = sched.requests[rid].slot
            engine.pos[slot] = len(requests[rid].prompt)  # parked past its prompt until the prefill is done
            engine.sampler.set(slot, requests[rid].sampling)
            live[rid].admitted = time.perf_counter()
        for slot, rid, first, end in work.prefill:
            if _prefill(engine, slot, requests[rid].prompt, first, end, spec):
                live[rid].first = time.perf_counter()
                if live[rid].take([int(engine.token[slot])]):
                    _free(engine, sched, slot, rid)
        if work.decode:
            _decode(engine, steps[size_for(max(work.decode), engine.sizes)], sched, work.decode, live, spec)
    return [r.generation() for r in live]


def _prefill(engine, slot: int, prompt: list[int], first: int, end: int, spec: bool) -> bool:
    """Prompt tokens first..end of the request in `slot`, on its cache row; True when that was the last chunk
    (its first token is then in engine.token[slot] and its position at the prompt's end)."""
    device = engine.device
    ids = torch.tensor([prompt[first:end]], dtype=torch.int64, device=device)
    positions = torch.arange(first, end, device=device)[None]
    taps = engine.spec.hidden_layers if spec else ()
    with region("prefill"):
        logits, hidden = engine.forward(ids, Forward.consecutive(positions), engine.cache.rows(slot, slot + 1),
                                        Mode.PREFILL, engine.plan, taps)
        if spec:
            engine.draft.prefill(hidden, first, slot)
    if end < len(prompt):
        return False
    engine.token[slot] = engine.first_token(logits, len(prompt), slot)
    engine.pos[slot] = len(prompt)
    if spec:
        engine.state.ctx_count[slot] = 0
    return True


def _decode(engine, step, sched: Scheduler, rows: dict[int, int], live: list[_Live], spec: bool) -> None:
    """One step of the slots `step` runs (those up to the highest decoding one, rounded up to a batch size: a
    graph replay on CUDA); the decoding ones (only they move) take their tokens."""
    mask = torch.zeros(engine.slots, dtype=torch.int64)
    mask[list(rows)] = 1
    engine.live.copy_(mask)
    with region("decode"):
        step()
        values = (engine.state.out if spec else engine.token).tolist()
    for slot, rid in rows.items():
        new = values[slot][1 : values[slot][0] + 2] if spec else [values[slot]]
        live[rid].accepted.append(len(new))
        if live[rid].take(new):
            _free(engine, sched, slot, rid)


def _free(engine, sched: Scheduler, slot: int, rid: int) -> None:
    """The request is done: its slot parks at position 0 (a finished request may have committed past its budget;
    the junk a free slot writes stays in the first rows a step writes, inside any context)."""
    sched.finish(rid)
    engine.pos[slot] = 0

