"""CUDA-graph capture of a step that reads and writes only persistent tensors."""

from __future__ import annotations

from collections.abc import Callable

import torch


class StepGraph:
    """Calls `fn` eagerly, or on CUDA captures it once (after two warm-up runs on a side stream, which
    advance the step state: callers reset their state before each request) and replays it."""

    def __init__(self, fn: Callable[[], None], use_graph: bool):
        self.fn = fn
        self.use_graph = use_graph
        self.graph: torch.cuda.CUDAGraph | None = None

    def __call__(self) -> None:
        if not self.use_graph:
            self.fn()
            return
        if self.graph is None:
            self.graph = self._capture()
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
