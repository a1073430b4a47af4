"""The server's side of the engine: requests go to the stepping loop (serve/core.py), each step's tokens come back
to the event loop of the request's handler, one wake-up a step.

Two ways to run the loop. `EngineProcess` (what `specpilot serve` runs): a spawned process of its own, as vLLM's
EngineCore is, so the event loop (HTTP, JSON, detokenizing a token a request a step) never holds the GIL the
engine's step needs: on one thread beside it, AR on the pair at 16 in flight streamed a third of the Python API's
tokens a second (H100, 2026-12-06). `EngineWorker`: a thread of this process, over an engine already built (tests;
embedding). Either way a request waits in a bounded queue for a slot (a full queue is refused at once: the server
answers 503), a failing request is answered with its error while the others go on, and a client that leaves is
cancelled before the next step, freeing its slot.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import queue
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from specpilot.core.contracts import Generation, Prompted
from specpilot.errors import UserError
from specpilot.serve.core import Core, Out


class Full(Exception):
    """The waiting queue is full."""


class Gone(Exception):
    """The engine stopped answering (its process died)."""


@dataclass
class Job:
    """One request between the event loop and the engine: its updates arrive on `updates`, each a list of new
    tokens, then None (done: `generation`), or an exception."""

    request: Prompted
    loop: asyncio.AbstractEventLoop
    updates: asyncio.Queue = field(default_factory=asyncio.Queue)
    key: int | None = None
    generation: Generation | None = None
    submitted: float = field(default_factory=time.perf_counter)
    first: float | None = None  # when its first token came (time to first token)


def _deliver(items: list[tuple[Job, object]]) -> None:
    """On the event loop: a step's updates, in order."""
    for job, item in items:
        job.updates.put_nowait(item)


class Stats:
    """What /metrics reads: counts kept by the thread that reads the engine (plain numbers: a read sees one step or
    the next)."""

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


def drive(core: Core, take, give) -> None:
    """The stepping loop: take(block) -> the messages sent since (None: stop); give(outs, counts) after each batch
    of messages and each step."""
    while True:
        try:
            messages = take(not core.busy)
            if messages is None:
                return
            outs: list[Out] = []
            for what, key, *request in messages:
                if what == "submit":
                    outs += core.submit(key, request[0])
                elif what == "cancel":
                    core.cancel(key)
            if messages:
                give(outs, core.counts())
            if core.busy:
                give(core.step(), core.counts())
        except Exception as exc:  # noqa: BLE001 - a bug here must answer the requests, not hang the server
            give(core.fail_all(exc), core.counts())


class _Front:
    """The bookkeeping on the server's side: jobs by key, the bounded queue, metrics' counts, delivery."""

    def __init__(self, slots: int, max_waiting: int, on_done=None, on_first=None):
        self.slots, self.max_waiting = slots, max_waiting
        self.on_done = on_done  # called (on the reading thread) with each finished job
        self.on_first = on_first  # and with each job whose first token came (a client that leaves later had one)
        self.jobs: dict[int, Job] = {}  # submitted, not done, not cancelled
        self.stats = Stats()
        self.gone: str | None = None
        self._keys = itertools.count()
        self._lock = threading.Lock()

    def submit(self, job: Job) -> None:
        with self._lock:
            if self.gone is not None:
                raise Gone(self.gone)
            if len(self.jobs) >= self.max_waiting + self.slots:
                raise Full
            job.key = next(self._keys)
            self.jobs[job.key] = job
        self._send(("submit", job.key, job.request))

    def cancel(self, job: Job) -> None:
        with self._lock:
            if self.jobs.pop(job.key, None) is None:
                return
        self._send(("cancel", job.key))

    @property
    def busy(self) -> int:
        """Requests submitted and not done."""
        return len(self.jobs)

    def _send(self, message: tuple) -> None:
        raise NotImplementedError

    def _arrived(self, outs: list[Out], counts: tuple[int, int]) -> None:
        """A batch of the engine's answers, on the thread that reads them."""
        self.stats.in_flight, self.stats.waiting = counts
        out: dict[asyncio.AbstractEventLoop, list[tuple[Job, object]]] = {}
        for o in outs:
            job = self.jobs.get(o.key)
            if job is None:  # cancelled
                continue
            items = out.setdefault(job.loop, [])
            if o.error is not None:
                self._forget(o.key)
                items.append((job, o.error))
                continue
            if job.first is None:  # the prefill's token
                job.first = time.perf_counter()
                if self.on_first is not None:
                    self.on_first(job)
            else:
                self.stats.decoded += len(o.tokens)
                self.stats.passes += 1
            items.append((job, o.tokens))
            self.stats.add(len(o.tokens))
            if o.done:
                job.generation = o.generation
                self._forget(o.key)
                if self.on_done is not None:
                    self.on_done(job)
                items.append((job, None))
        for loop, items in out.items():  # one wake-up of the event loop a step, not one a request
            loop.call_soon_threadsafe(_deliver, items)

    def _forget(self, key: int) -> None:
        with self._lock:
            self.jobs.pop(key, None)

    def _lost(self, why: str) -> None:
        """The engine is gone: every job is answered with why, later ones are refused."""
        with self._lock:
            self.gone, jobs = why, list(self.jobs.values())
            self.jobs.clear()
        for job in jobs:
            job.loop.call_soon_threadsafe(job.updates.put_nowait, RuntimeError(why))


class EngineWorker(_Front):
    """The stepping loop on a thread of this process, over `engine` (an Engine of `in_flight` slots at least)."""

    def __init__(self, engine, in_flight: int, max_waiting: int, on_done=None, on_first=None):
        self.core = Core(engine, in_flight)
        super().__init__(self.core.slots, max_waiting, on_done, on_first)
        self.inbox: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=drive, args=(self.core, self._take, self._arrived),
                                       name="specpilot-engine", daemon=True)

    @property
    def batcher(self):
        return self.core.batcher

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.inbox.put(None)
        self.thread.join()

    def _send(self, message: tuple) -> None:
        self.inbox.put(message)

    def _take(self, block: bool) -> list[tuple] | None:
        messages = []
        try:
            messages.append(self.inbox.get(block=block))
            while True:
                messages.append(self.inbox.get_nowait())
        except queue.Empty:
            pass
        return None if None in messages else messages


class EngineProcess(_Front):
    """The stepping loop in a spawned process: build() -> (engine, tokenizer) runs there (a picklable callable; the
    engine's CUDA state never crosses a fork). Made once the engine is ready: `info` has the tokenizer, the engine's
    context and rows, whether its system speculates; a deployment it cannot load raises UserError here."""

    def __init__(self, build, in_flight: int, max_waiting: int, on_done=None, on_first=None):
        ctx = multiprocessing.get_context("spawn")
        self._from, theirs_out = ctx.Pipe(duplex=False)
        theirs_in, self._to = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_engine_main, args=(build, in_flight, theirs_in, theirs_out),
                                name="specpilot-engine", daemon=True)
        self.proc.start()
        theirs_in.close()
        theirs_out.close()
        try:
            what, info = self._from.recv()
        except (EOFError, OSError):
            self.proc.join(5)
            raise UserError(f"the engine process exited while loading (exit code {self.proc.exitcode})") from None
        if what == "failed":
            self.proc.join(30)
            raise UserError(info)
        self.info = info
        super().__init__(info["slots"], max_waiting, on_done, on_first)
        self._send_lock = threading.Lock()
        self._stopping = False
        self.reader = threading.Thread(target=self._read, name="specpilot-engine-reader", daemon=True)

    def start(self) -> None:
        self.reader.start()

    def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        try:
            self._send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        if self.reader.is_alive():
            self.reader.join(5)

    def _send(self, message: tuple | None) -> None:
        with self._send_lock:
            self._to.send(message)

    def _read(self) -> None:
        """Each step's answers as they come (recv waits without the GIL)."""
        while True:
            try:
                outs, counts = self._from.recv()
            except (EOFError, OSError):
                break
            self._arrived(outs, counts)
        if not self._stopping:
            self._lost(f"the engine process exited (exit code {self.proc.exitcode})")


def _engine_main(build, in_flight: int, inbox, outbox) -> None:
    """The engine process: build, say ready (or why not, in one line), then step until told to stop or the server
    is gone (its pipe closes). The server drains on SIGTERM/SIGINT and then stops this one, so both are ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stdout = sys.stderr  # the server's stdout says where it listens, nothing else
    try:
        engine, tokenizer = build()
        core = Core(engine, in_flight)
    except UserError as exc:
        outbox.send(("failed", str(exc)))
        return
    except Exception as exc:  # noqa: BLE001 - the server says it in one line and exits; the trace goes to stderr
        import traceback

        traceback.print_exc()
        outbox.send(("failed", f"the engine could not be built: {type(exc).__name__}: {exc}"))
        return
    outbox.send(("ready", {"tokenizer": tokenizer, "context": engine.context, "rows": engine.rows,
                           "speculative": engine.system.speculative, "slots": core.slots}))

    def take(block: bool) -> list[tuple] | None:
        messages = []
        try:
            if block or inbox.poll():
                messages.append(inbox.recv())
                while inbox.poll():
                    messages.append(inbox.recv())
        except (EOFError, OSError):
            return None
        return None if None in messages else messages

    drive(core, take, lambda outs, counts: outbox.send((outs, counts)))
