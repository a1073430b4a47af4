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

With `batch_rows=auto` each decode step verifies, for every request alike, the system's rows, a shorter chain, or
the anchor alone (no drafting: speculative/step.AnchorStep), as speculative/allot.RowsChoice chooses from the
steps' costs, timed here once an engine after the graphs are captured (all slots parked), and the requests' recent
acceptance; over a best_first/ddtree tree the widths are budgets of rows shared by the requests' likeliest nodes,
chosen by allot.TreeRowsChoice from what each step's trees expected every budget to commit.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from specpilot.core.contracts import Forward, Generation, Prompted
from specpilot.core.regions import region
from specpilot.errors import UserError
from specpilot.models.dense import Mode
from specpilot.runtime.scheduler import Scheduler, size_for
from specpilot.speculative.allot import RowsChoice, TreeRowsChoice

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


@dataclass
class Update:
    """What one step gave a request: its new tokens (the prefill's first, or a pass's), and whether it is done
    (then its Generation)."""

    rid: int
    tokens: list[int]
    done: bool = False
    generation: Generation | None = None


class Batcher:
    """Continuous batching online: requests are submitted and cancelled between steps (by the thread that owns the
    engine); each `step()` runs one scheduler plan and says what each request got. The step graphs of each kind
    needed (greedy; sampling, where any decoding row samples) are captured when the batcher is made, all slots
    parked (a capture's warm-up runs would move a decoding row)."""

    def __init__(self, engine, base: str | None = None, chunk: int = CHUNK, kinds: tuple[bool, ...] = (False, True),
                 in_flight: int | None = None, costs: dict[int, dict[int, float]] | None = None):
        """kinds: the step kinds to capture (False greedy, True sampling); a request of a kind not captured is
        refused at submit. in_flight: requests at once, at most the engine's slots (default all of them). costs:
        batch_rows=auto's seconds a step by rows and batch size (default: timed here, once an engine)."""
        self.engine, self.spec = engine, (base or engine.system.base) == "stock"
        if self.spec and engine.drafter is None:
            raise UserError("system 'stock' needs a drafter in the deployment")
        if engine.slots < 2:
            raise UserError("a batcher needs an engine of at least 2 slots")
        if not 1 <= (in_flight or engine.slots) <= engine.slots:
            raise UserError(f"in_flight must be in 1..{engine.slots} (the engine's slots), got {in_flight}")
        # admit=true: prompts ride in the steps' verify passes, a step's rows a slot each step (speculative/admit.py)
        self.admits = engine.admit_steps() if self.spec else {}
        per_slot = engine.admit_chunk if self.admits else None
        self.sched = Scheduler(in_flight or engine.slots, chunk, per_slot)
        self.live: dict[int, _Live] = {}
        self.kinds = kinds
        self._next = 0
        steps = engine.batch_steps(self.spec)
        narrower = engine.width_steps() if self.spec else {}
        widths = {engine.full_rows: steps, **narrower} if narrower else {}
        self.rows: RowsChoice | None = None
        with torch.inference_mode():
            engine.live.zero_()  # every slot parked at 0 while the steps are captured (warm-ups move nothing)
            engine.pos.zero_()
            if self.admits:
                engine.admission.count.zero_()  # (and no slot carries a chunk)
            for graphs in [*(widths.values() or [steps]), *([self.admits] if self.admits else [])]:
                for (_, sampled), step in graphs.items():
                    if sampled in kinds:
                        step.prepare()
            if widths:
                kind = False not in kinds  # the greedy kind (False) where it is captured, else the sampling one
                if costs is None and kind not in engine.step_costs:  # timed once an engine
                    engine.step_costs[kind] = _step_costs(engine, widths, kind)
                table = costs or engine.step_costs[kind]
                self.rows = (TreeRowsChoice(table, steps=engine.step_rows, shares=engine.shares) if engine.shares else
                             RowsChoice(table, steps=engine.step_rows))
            if self.spec:
                engine.state.ctx_count.zero_()
        self.steps, self.widths = steps, widths
        engine.requests += 1

    @property
    def busy(self) -> bool:
        """Whether any request submitted is not done."""
        return not self.sched.finished

    def submit(self, request: Prompted, arrival: int | None = None) -> int:
        """A request (checked against the engine's context first); its id. arrival: the step it may start at
        (default: the next)."""
        self.engine.check_request(request.prompt, request.max_new_tokens)
        if request.samples not in self.kinds:
            raise UserError(f"this batcher serves {'sampling' if True in self.kinds else 'greedy'} requests only")
        rid, self._next = self._next, self._next + 1
        self.sched.submit(rid, len(request.prompt), self.sched.step if arrival is None else arrival)
        self.live[rid] = _Live(request)
        return rid

    def cancel(self, rid: int) -> None:
        """Gives the request up (its client left): its slot is free for the next step."""
        slot = self.sched.cancel(rid)
        if slot is not None:
            self._park(slot)
        self.live.pop(rid, None)
        self.sched.forget(rid)
        if self.rows:
            self.rows.forget(rid)

    @torch.inference_mode()
    def step(self) -> list[Update]:
        """One plan: its prompt chunks, then one decode step of the decoding slots."""
        engine, work, out = self.engine, self.sched.plan(), []
        for rid in work.admitted:
            slot, r = self.sched.requests[rid].slot, self.live[rid].request
            engine.pos[slot] = len(r.prompt)  # parked past its prompt until the prefill is done
            engine.sampler.set(slot, r.sampling)
            self.live[rid].admitted = time.perf_counter()
        chunks = {}  # admit=true: slot -> (rid, first, end), carried by the decode step
        for slot, rid, first, end in work.prefill:
            r = self.live[rid].request
            if self.admits:
                chunks[slot] = (rid, first, end)
            elif _prefill(engine, slot, r.prompt, first, end, self.spec, r.samples):
                self.live[rid].first = time.perf_counter()
                out.append(self._took(rid, slot, [int(engine.token[slot])]))
        if work.decode or chunks:
            running = [*work.decode.values(), *(rid for rid, _, _ in chunks.values())]
            highest = max([*work.decode, *chunks])
            sampled = any(self.live[r].request.samples for r in running)
            size = size_for(highest, engine.sizes)
            rows = self.rows.choose(work.decode.values(), size) if self.rows and work.decode and not chunks else None
            if chunks:  # the step carrying them verifies every row (batch_rows=auto: the full step)
                if self.rows:
                    rows = self.rows.full
                    self.rows.steps[rows] += 1
                engine.admission.set({slot: (self.live[rid].request.prompt[first:end], first,
                                             end == len(self.live[rid].request.prompt))
                                      for slot, (rid, first, end) in chunks.items()})
                step = self.admits[size, sampled]
            else:
                step = (self.steps if rows is None else self.widths[rows])[size, sampled]
            values = _decode(engine, step, work.decode, self.spec)
            out += self._admitted(chunks)
            if isinstance(self.rows, TreeRowsChoice) and (rows or 0) > 1 and work.decode:  # each budget's expectation
                committed = sum(len(values[slot]) for slot in work.decode)
                self.rows.told(engine.state.expect.tolist(), len(work.decode), rows, committed)
            for slot, rid in work.decode.items():
                self.live[rid].accepted.append(len(values[slot]))
                if self.rows:
                    self.rows.saw(rid, len(values[slot]), rows)
                out.append(self._took(rid, slot, values[slot]))
        return out

    def _park(self, slot: int) -> None:
        """A free slot parks at 0 (what it writes stays in the first rows a step writes) with nothing left to tell
        its drafter (the last step's rows were its request's)."""
        self.engine.pos[slot] = 0
        if self.spec:
            self.engine.state.ctx_count[slot] = 0

    def _admitted(self, chunks: dict[int, tuple[int, int, int]]) -> list[Update]:
        """The first token of each request whose prompt's last chunk the step carried."""
        ended = [(slot, rid) for slot, (rid, _, end) in chunks.items() if end == len(self.live[rid].request.prompt)]
        if not ended:
            return []
        tokens = self.engine.token.tolist()
        for _, rid in ended:
            self.live[rid].first = time.perf_counter()
        return [self._took(rid, slot, [tokens[slot]]) for slot, rid in ended]

    def _took(self, rid: int, slot: int, new: list[int]) -> Update:
        live = self.live[rid]
        before = len(live.out)
        if not live.take(new):
            return Update(rid, new)
        self.sched.finish(rid)
        self.sched.forget(rid)
        if self.rows:
            self.rows.forget(rid)
        self._park(slot)
        del self.live[rid]
        gen = live.generation()  # cut at its stop token or budget: a pass may have committed past them
        return Update(rid, gen.tokens[before:], True, gen)


def run_batch(engine, requests: list[Prompted], base: str | None = None, arrivals: list[int] | None = None,
              chunk: int = CHUNK) -> list[Generation]:
    """Each request's Generation (in order); prefill_s runs from its admission to its first token."""
    if arrivals is not None and len(arrivals) != len(requests):
        raise ValueError("one arrival step per request")
    for r in requests:
        engine.check_request(r.prompt, r.max_new_tokens)
    batcher = Batcher(engine, base, chunk, kinds=tuple(sorted({r.samples for r in requests})))
    ids = [batcher.submit(r, arrivals[i] if arrivals else 0) for i, r in enumerate(requests)]
    done: dict[int, Generation] = {}
    while batcher.busy:
        done.update((u.rid, u.generation) for u in batcher.step() if u.done)
    return [done[rid] for rid in ids]


def _step_costs(engine, widths: dict[int, dict], kind: bool, reps: int = 5) -> dict[int, dict[int, float]]:
    """Seconds of each width's step at each batch size (the median of `reps` runs after one warm-up, every slot
    parked: what a parked row computes, a decoding one does; its attention reads less), of one kind (the greedy one
    where captured: the sampling kind's costs differ little, the same passes)."""
    cuda = engine.device.type == "cuda"
    out: dict[int, dict[int, float]] = {}
    for rows, graphs in widths.items():
        for n in engine.sizes:
            times = []
            for _ in range(reps + 1):
                if cuda:
                    torch.cuda.synchronize(engine.device)
                t0 = time.perf_counter()
                graphs[n, kind]()
                if cuda:
                    torch.cuda.synchronize(engine.device)
                times.append(time.perf_counter() - t0)
            out.setdefault(rows, {})[n] = statistics.median(times[1:])
    return out


def _prefill(engine, slot: int, prompt: list[int], first: int, end: int, spec: bool, sampled: bool) -> bool:
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
            engine.draft.prefill(hidden, first, slot, ids)
    if end < len(prompt):
        return False
    engine.token[slot] = engine.first_token(logits, len(prompt), slot, sampled)
    engine.pos[slot] = len(prompt)
    if spec:
        engine.state.ctx_count[slot] = 0
    return True


def _decode(engine, step, rows: dict[int, int], spec: bool) -> dict[int, list[int]]:
    """One step of the slots `step` runs (those up to the highest decoding one, rounded up to a batch size: a
    graph replay on CUDA); each decoding slot's new tokens (only those slots move)."""
    mask = torch.zeros(engine.slots, dtype=torch.int64)
    mask[list(rows)] = 1
    engine.live.copy_(mask)
    with region("decode"):
        step()
        if engine.device.type == "cuda":  # wait with the GIL released: a server's event loop runs meanwhile
            torch.cuda.current_stream(engine.device).synchronize()
        values = (engine.state.out if spec else engine.token).tolist()
    return {slot: values[slot][1 : values[slot][0] + 2] if spec else [values[slot]] for slot in rows}
