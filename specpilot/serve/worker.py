"""The engine's own thread: it alone touches the engine (its caches, CUDA graphs and state), taking requests and
cancellations from the server's event loop between steps and handing each request's tokens back to it.

A request waits in a bounded queue for a slot; a full queue is refused at once (the server answers 503). A
request that fails is answered with its error and the others in flight go on; a client that leaves is cancelled
before the next step, so its slot is free for the next request at once.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from specpilot.core.contracts import Generation, Prompted
from specpilot.errors import UserError


class Full(Exception):
    """The waiting queue is full."""


@dataclass
class Job:
    """One request between the event loop and the engine thread: its updates arrive on `updates`, each a list of
    new tokens, then None (done: `generation`), or an exception."""

    request: Prompted
    loop: asyncio.AbstractEventLoop
    updates: asyncio.Queue = field(default_factory=asyncio.Queue)
    rid: int | None = None
    generation: Generation | None = None
    submitted: float = field(default_factory=time.perf_counter)
    first: float | None = None  # when its first token came (time to first token)

    def put(self, item) -> None:
        self.loop.call_soon_threadsafe(self.updates.put_nowait, item)


def _deliver(items: list[tuple[Job, object]]) -> None:
    """On the event loop: a step's updates, in order."""
    for job, item in items:
        job.updates.put_nowait(item)


class Stats:
    """What /metrics reads: counts kept by the engine thread (plain numbers: a read sees one step or the next)."""

    def __init__(self, window: float = 10.0):
        self.in_flight = self.waiting = 0
        self.decoded = self.passes = 0  # tokens of decode steps, and the requests' target passes that made them
        self.window, self.recent = window, deque()  # (time, tokens) of the last `window` seconds

    def add(self, tokens: int) -> None:
        now = time.perf_counter()
        self.recent.append((now, tokens))
        while self.recent and self.recent[0][0] < now - self.window:
            self.recent.popleft()

    def tokens_per_s(self) -> float:
        now = time.perf_counter()
        return sum(n for t, n in list(self.recent) if t >= now - self.window) / self.window


class EngineWorker:
    """engine: an Engine of `in_flight` slots at least (2 at least: runtime/batch.Batcher); max_waiting: requests
    that may wait for a slot."""

    def __init__(self, engine, in_flight: int, max_waiting: int, on_done=None, on_first=None):
        from specpilot.runtime.batch import Batcher

        self.batcher = Batcher(engine, in_flight=in_flight)  # captures the step graphs (both kinds) now
        self.engine, self.max_waiting = engine, max_waiting
        self.on_done = on_done  # called (on the engine thread) with each finished job
        self.on_first = on_first  # and with each job whose first token came (a client that leaves later had one)
        self.inbox: queue.Queue = queue.Queue()
        self.jobs: dict[int, Job] = {}
        self.pending = 0  # submitted and not yet taken by the engine thread
        self.stats = Stats()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="specpilot-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job) -> None:
        with self._lock:
            if self.pending + self.stats.waiting >= self.max_waiting + self._free_slots():
                raise Full
            self.pending += 1
        self.inbox.put(("submit", job))

    def cancel(self, job: Job) -> None:
        self.inbox.put(("cancel", job))

    @property
    def busy(self) -> int:
        """Requests submitted and not done."""
        return self.pending + len(self.jobs)

    def stop(self) -> None:
        self._stop.set()
        self.inbox.put(("stop", None))
        self.thread.join()

    def _free_slots(self) -> int:
        return self.batcher.sched.slots - self.stats.in_flight

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._take(block=not self.batcher.busy)
                if self.batcher.busy:
                    self._step()
            except Exception as exc:  # noqa: BLE001 - a bug here must answer the requests, not hang the server
                self._fail_all(exc)

    def _fail_all(self, exc: Exception) -> None:
        for job in self.jobs.values():
            job.put(RuntimeError(f"the engine failed: {exc}"))
            self.batcher.cancel(job.rid)
        self.jobs.clear()

    def _take(self, block: bool) -> None:
        """The inbox's requests and cancellations (block: wait for one first)."""
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            what, job = item
            if what == "submit":
                self._admit(job)
            elif what == "cancel" and job.rid in self.jobs:
                self.batcher.cancel(job.rid)
                del self.jobs[job.rid]
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                break
        self._count()

    def _admit(self, job: Job) -> None:
        with self._lock:
            self.pending -= 1
        try:
            job.rid = self.batcher.submit(job.request)
        except UserError as exc:  # the server checked it; an engine's own refusal still answers this one alone
            job.put(exc)
            return
        self.jobs[job.rid] = job

    def _step(self) -> None:
        try:
            updates = self.batcher.step()
        except Exception as exc:  # noqa: BLE001 - every request in flight is answered, the thread stays up
            self._fail_all(exc)
            return
        out: dict[asyncio.AbstractEventLoop, list[tuple[Job, object]]] = {}
        for u in updates:
            job = self.jobs.get(u.rid)
            if job is None:
                continue
            if job.first is None:  # the prefill's token
                job.first = time.perf_counter()
                if self.on_first is not None:
                    self.on_first(job)
            else:
                self.stats.decoded += len(u.tokens)
                self.stats.passes += 1
            items = out.setdefault(job.loop, [])
            items.append((job, u.tokens))
            self.stats.add(len(u.tokens))
            if u.done:
                job.generation = u.generation
                del self.jobs[u.rid]
                if self.on_done is not None:
                    self.on_done(job)
                items.append((job, None))
        for loop, items in out.items():  # one wake-up of the event loop a step, not one a request
            loop.call_soon_threadsafe(_deliver, items)
        self._count()

    def _count(self) -> None:
        self.stats.in_flight, self.stats.waiting = self.batcher.sched.in_flight, self.batcher.sched.queued
