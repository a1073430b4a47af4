"""CUDA-graph capture of a step that reads and writes only persistent tensors."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


class StepGraph:
    """Runs `fn` eagerly, or on CUDA as a captured graph.

    Capturing runs `fn` twice for warm-up, which advances whatever state it updates, so `prepare()`
    must be called before a request sets its state, never in the middle of one."""

    def __init__(self, fn: Callable[[], None], use_graph: bool):
        self.fn = fn
        self.use_graph = use_graph
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
        with torch.cuda.graph(graph):
            self.fn()
        return graph


def replay_ms(step: Callable[[], None], reset: Callable[[], None], reps: int = 10) -> float:
    """Median milliseconds of one replay of `step` captured as a graph, its state reset before capture
    and before timing (the capture's warm-up runs also compile kernels for new configs)."""
    reset()
    graph = StepGraph(step, use_graph=True)
    graph.prepare()
    reset()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)
