"""CUDA-graph capture of a step that reads and writes only persistent tensors."""

from __future__ import annotations

import gc
import statistics
from collections.abc import Callable

import torch


class StepGraph:
    """Runs `fn` eagerly, or on CUDA as a captured graph.

    Capturing runs `fn` twice for warm-up, which advances whatever state it updates, so `prepare()`
    must be called before a request sets its state, never in the middle of one."""

    def __init__(self, fn: Callable[[], None], use_graph: bool, pool: tuple | None = None):
        """pool: a memory pool shared with other graphs (torch.cuda.graph_pool_handle) that never replay at once
        and read only persistent tensors: their temporaries then take the largest one's memory, not the sum."""
        self.fn = fn
        self.use_graph = use_graph
        self.pool = pool
        self.graph: torch.cuda.CUDAGraph | None = None

    def prepare(self) -> None:
        if self.use_graph and self.graph is None:
            self.graph = self._capture()

    def __call__(self) -> None:
        if not self.use_graph:
            self.fn()
            return
        if self.graph is None:
            raise RuntimeError("StepGraph used before prepare(): capture would corrupt the running request")
        self.graph.replay()

    def _capture(self) -> torch.cuda.CUDAGraph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # No garbage collection while capturing: a CUDA graph or event freed mid-capture (here, a cycle the
        # collector found) is an illegal call under the global capture mode and spoils the capture ("operation not
        # permitted when stream is capturing (function reset)", seen on the H100 when a sampling thread freed
        # frames late, 2026-12-06: bench/gpu/sampled.py). torch.cuda.graph collects once as it begins.
        was = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                self.fn()
        finally:
            if was:
                gc.enable()
        return graph


class Lookahead:
    """Reads each step's output on the host `depth` steps late: steps k + 1 .. k + depth are enqueued before
    the host waits for step k, so the GPU does not idle while the host reads a token and launches the next
    graph (nor through a host hiccup shorter than depth - 1 steps). Still one host sync per step; each output
    is copied to one of depth + 1 pinned buffers as its step ends."""

    def __init__(self, out: torch.Tensor, depth: int = 1):
        self.out = out
        self.depth = depth
        cuda = out.is_cuda  # on the CPU (tests) the same bookkeeping runs synchronously
        self.host = [torch.empty(out.shape, dtype=out.dtype, pin_memory=cuda) for _ in range(depth + 1)]
        self.done = [torch.cuda.Event() if cuda else None for _ in range(depth + 1)]
        self.launched = 0
        self.read_upto = 0

    def launch(self, step: Callable[[], None]) -> None:
        if self.launched > self.read_upto + self.depth:
            raise RuntimeError(f"Lookahead: step {self.launched} launched before step {self.read_upto} was read "
                               f"(depth {self.depth})")
        step()
        i = self.launched % len(self.host)  # its buffer was read: step launched - depth - 1 precedes read_upto
        self.host[i].copy_(self.out, non_blocking=True)
        if self.done[i] is not None:
            self.done[i].record()
        self.launched += 1

    def read(self, k: int) -> list[int]:
        """Step k's output (the oldest step launched and not yet read)."""
        if k != self.read_upto or k >= self.launched:
            raise RuntimeError(f"Lookahead: read {k} out of order ({self.read_upto} next, {self.launched} launched)")
        i = k % len(self.host)
        if self.done[i] is not None:
            self.done[i].synchronize()
        self.read_upto += 1
        return self.host[i].tolist()

    def reset(self) -> None:
        self.launched = self.read_upto = 0


def replay_ms(step: Callable[[], None], reset: Callable[[], None], reps: int = 10) -> float:
    """Median milliseconds of one replay of `step` captured as a graph, its state reset before capture
    and before timing (the capture's warm-up runs also compile kernels for new configs)."""
    reset()
    graph = StepGraph(step, use_graph=True)
    graph.prepare()
    reset()
    return median_ms(graph, reps)


def median_ms(fn: Callable[[], None], reps: int) -> float:
    """Median milliseconds of fn() on the current CUDA stream, by events around each call."""
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)
