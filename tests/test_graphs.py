"""StepGraph's capture on a CPU, CUDA's calls stood in for: no garbage collection runs while a graph is captured."""

import contextlib
import gc

import pytest
import torch

from specpilot.runtime.graphs import StepGraph


class _Graph:
    def replay(self) -> None:
        pass


@pytest.fixture
def streams(monkeypatch):
    """CUDA's streams and graph object stood in for."""
    stream = type("S", (), {"wait_stream": lambda self, other: None})
    monkeypatch.setattr(torch.cuda, "Stream", stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", stream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)


def test_capture_runs_with_garbage_collection_off_and_restores_it(monkeypatch, streams):
    seen, capturing = [], []

    @contextlib.contextmanager
    def graph(g, pool=None):
        capturing.append(True)
        yield
        capturing.pop()

    monkeypatch.setattr(torch.cuda, "graph", graph)
    step = StepGraph(lambda: seen.append((bool(capturing), gc.isenabled())), use_graph=True)
    assert gc.isenabled()
    step.prepare()
    # two warm-up runs with collection on, then the captured run with it off; on again afterwards
    assert seen == [(False, True), (False, True), (True, False)]
    assert gc.isenabled()


def test_a_failed_capture_turns_collection_back_on(monkeypatch, streams):
    monkeypatch.setattr(torch.cuda, "graph", lambda g, pool=None: contextlib.nullcontext())
    runs = []

    def fn():
        runs.append(1)
        if len(runs) == 3:
            raise RuntimeError("capture failed")

    with pytest.raises(RuntimeError, match="capture failed"):
        StepGraph(fn, use_graph=True).prepare()
    assert len(runs) == 3 and gc.isenabled()
