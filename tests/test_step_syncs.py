"""No host sync inside a step (what a CUDA graph captures): every operation that reads a device value on the host
(`.item()`, `int()`, `bool()` of a tensor: aten._local_scalar_dense; nonzero) is caught on the CPU, dense and hybrid,
AR and speculative, single and batched. Such a read is illegal during capture; outside it, it stalls every step
(a check of the tree's parents in every GDN layer broke the hybrid's first capture on the H100)."""

import contextlib

import pytest
import torch

from specpilot.config import parse_system
from specpilot.core.contracts import Prompted
from specpilot.fixtures.random_models import (
    random_drafter,
    random_target,
    tiny_drafter_config,
    tiny_hybrid_config,
    tiny_target_config,
)
from specpilot.kernels.attention import live
from specpilot.kernels.attention.naive import attend_naive
from specpilot.kernels.gdn import naive
from specpilot.runtime import graphs
from specpilot.runtime.engine import Engine

# what reads a tensor's value on the host (a dispatch mode does not see them under inference mode, where steps run)
READS = ("__bool__", "__int__", "__float__", "__index__", "item", "tolist", "nonzero", "numpy")


@contextlib.contextmanager
def no_host_reads():
    def refuse(name):
        def read(self, *a, **kw):
            raise AssertionError(f"a host read inside a step: Tensor.{name}")
        return read

    saved = {name: torch.Tensor.__dict__.get(name) for name in READS}
    for name in READS:
        setattr(torch.Tensor, name, refuse(name))
    try:
        yield
    finally:
        for name, method in saved.items():
            if method is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, method)


@pytest.fixture
def steps_checked(monkeypatch):
    """Every step function runs under no_host_reads. What reads on the CPU only is replaced by what a GPU runs: the
    live-slot attention (a GPU without Triton runs the reference) and the references' check of a tree's parents
    (skipped off the CPU: test_parents_are_checked_on_the_cpu_only)."""
    monkeypatch.setattr(live, "attend_live", lambda q, k, v, vis, scale: attend_naive(q, k, v, vis, scale))
    monkeypatch.setattr(naive, "check_parents", lambda parents: None)
    ran = []

    def call(self):
        ran.append(1)
        with no_host_reads():
            self.fn()

    monkeypatch.setattr(graphs.StepGraph, "__call__", call)
    return ran


@pytest.mark.parametrize("hybrid", [False, True])
@pytest.mark.parametrize("system", ["ar", "stock", "stock:tree=best_first,nodes=8",
                                    "stock:tree=best_first,nodes=8,hybrid_tree=recompute", "stock:batch_rows=auto",
                                    "stock:tree=best_first,nodes=8,batch_budget=7"])
@pytest.mark.parametrize("slots", [1, 3])
def test_no_step_reads_a_device_value_on_the_host(steps_checked, hybrid, system, slots):
    cfg = (tiny_hybrid_config if hybrid else tiny_target_config)(vocab=64)
    target = random_target(cfg, seed=5)
    drafter = random_drafter(tiny_drafter_config(cfg, target_layer_ids=[0, 3], block_size=4), seed=6)
    engine = Engine(target, drafter, parse_system(system), context=96, slots=slots)
    asks = [Prompted([1 + i, 7, 9, 3 * i + 2], 12, ()) for i in range(3)]
    out = engine.generate(asks) if slots > 1 else [engine.generate_one(a.prompt, 12, ()) for a in asks]
    assert all(len(g.tokens) == 12 for g in out) and steps_checked


def test_parents_are_checked_on_the_cpu_only():
    with pytest.raises(ValueError):
        naive.check_parents(torch.tensor([[-1, 1]]))
    with no_host_reads():  # a device's parents are not read (a meta tensor stands for it: any read would fail)
        naive.check_parents(torch.empty(2, 5, dtype=torch.int64, device="meta"))
