"""Forcing's outputs from several worker processes of this install at once (`specpilot force --workers N`).

Token forcing needs many tokens before it can detect a small excess mismatch rate (forcing/judge.py's detectable
rate), and a single request at a time leaves a GPU mostly idle on a small model: N workers (controller/worker.py,
each with its own models on the same device) answer a share of the requests each, and the parent scores what they
return. A request's tokens do not depend on which process answered it, nor on what else ran beside it: the
engine's arithmetic is fixed by the system and the request (tests/test_forcing_parallel.py holds the two ways to
the same report)."""

from __future__ import annotations

import os
import select
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, closing
from pathlib import Path

import torch

from specpilot.bench.harness import TurnRecord
from specpilot.controller.compare import Side, Worker
from specpilot.controller.worker import code_hash
from specpilot.datasets import Request
from specpilot.errors import UserError

TIMEOUT = 3600.0  # seconds a worker may take over one chunk
CHUNK = 4  # requests a worker is given at a time


def records_of(rows: list[dict], requests: list[Request]) -> dict[str, list[TurnRecord]]:
    """A worker's output rows (controller/worker.py: id "request#turnN", prompt, tokens) as each request's turn
    records, in turn order."""
    out: dict[str, list[TurnRecord]] = {}
    by_id = {r.id: r for r in requests}
    for row in rows:
        rid = row["id"].split("#")[0]
        turns = out.setdefault(rid, [])
        turns.append(TurnRecord(row["id"], by_id[rid].dataset, len(turns) + 1, row["prompt"], row["tokens"], 0.0, 0.0))
    return out


class Pool:
    """N workers of this install serving `systems` on `requests` (of one split; the workers read the benchmark files
    as this process did, and forcing/run.checked holds every prompt they answered to this one's). `generate` is
    forcing/run.force's `generate`. The workers start when the first output is asked for: a run that finds every
    output kept (forcing/outputs.py) only scores, and starts none (each builds its models and captures its graphs)."""

    def __init__(self, workers: int, deployment: dict, systems: list[str], requests: list[Request]):
        # the workers load the requests' benchmarks themselves (a thousand requests' texts overflow a command line)
        splits = {r.split for r in requests}
        if len(splits) > 1:
            raise ValueError(f"one split at a time, got {sorted(splits)}")
        spec = {**deployment, "datasets": sorted({r.dataset for r in requests}), "split": splits.pop(), "limit": None,
                "timing": False}
        if not torch.cuda.is_available():  # CPU workers share the cores rather than each spinning on all of them
            spec["cpu"], spec["threads"] = True, max(1, len(os.sched_getaffinity(0)) // workers)
        self._count, self._spec, self._systems = workers, spec, systems
        self._stack = ExitStack()
        self.workers: list[Worker] = []

    def _start(self) -> None:
        source = Path(__file__).resolve().parents[2]
        side = Side(self._systems[0], source, code_hash(source / "specpilot"))
        with ThreadPoolExecutor(self._count) as ex:  # each builds its models and warms up: all at once
            started = [ex.submit(Worker, side, self._spec, None, TIMEOUT, self._systems[1:])
                       for _ in range(self._count)]
        for f in started:
            if f.exception() is None:
                self._stack.enter_context(closing(f.result()))
        failed = [f.exception() for f in started if f.exception() is not None]
        if failed:  # one that would not start: the others go too
            self._stack.close()
            raise failed[0]
        self.workers = [f.result() for f in started]

    def generate(self, system: str, requests: list[Request], max_new: int,
                 progress: Callable[[], None] | None = None,
                 keep: Callable[[str, list[TurnRecord]], None] | None = None) -> dict[str, list[TurnRecord]]:
        """Each request's turn records from the workers: CHUNK requests at a time to whichever worker is free,
        each chunk's records handed to `keep` as they come (a run cut short loses only the chunks in flight)."""
        if requests and not self.workers:
            self._start()
        queue = [requests[i : i + CHUNK] for i in range(0, len(requests), CHUNK)][::-1]
        busy: dict[Worker, list[Request]] = {}
        out: dict[str, list[TurnRecord]] = {}

        def feed(w: Worker) -> None:
            if queue:
                busy[w] = queue.pop()
                w.ask_outputs([r.id for r in busy[w]], max_new, system)

        for w in self.workers:
            feed(w)
        while busy:
            ready, _, _ = select.select([w.proc.stdout for w in busy], [], [], TIMEOUT)
            if not ready:
                raise UserError(f"no forcing worker answered in {TIMEOUT:.0f} s")
            for w in [w for w in busy if w.proc.stdout in ready]:
                got = records_of(w.receive(), busy.pop(w))
                feed(w)
                for rid, recs in got.items():
                    out[rid] = recs
                    if keep is not None:
                        keep(rid, recs)
                    for _ in recs if progress is not None else ():
                        progress()
        return out

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def pool_for(workers: int, preset: str | None, deployment: Path | None, systems: list[str],
             requests: list[Request]) -> Pool | None:
    """A pool for `force(generate=...)` with `workers` > 1 (None: generate in this process). `systems` by any
    spelling: the workers are started with their canonical names, the ones `force` asks for."""
    from specpilot.config.env import parse
    from specpilot.deployment import naming

    if workers <= 1:
        return None
    names = list(dict.fromkeys(parse(s).name for s in systems))
    return Pool(workers, naming(preset, deployment), names, requests)
