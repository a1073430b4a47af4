"""The one-launch best-first tree builder (kernels/tree_build, Triton) against the PyTorch reference
(speculative/tree.best_paths): the same rows in the same order, the same tokens and ancestor matrix, on fresh
random lattices. Without CUDA it runs in Triton's CPU interpreter."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from specpilot.config.plan import KernelPlan  # noqa: E402
from specpilot.core.contracts import Lattice  # noqa: E402
from specpilot.kernels import tree_build  # noqa: E402
from specpilot.speculative.tree import TreeBuilder, max_nodes  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TRITON = KernelPlan.stock(kernels="triton")


def _lattice(seed: int, b: int, d: int, k: int, selector: bool) -> Lattice:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.stack([torch.stack([torch.randperm(1000, generator=gen)[:k] for _ in range(d)]) for _ in range(b)])
    unary = torch.randn(b, d, k, generator=gen).sort(-1, descending=True).values
    logp = unary - torch.logsumexp(unary, -1, keepdim=True) - torch.rand(b, d, 1, generator=gen)
    edges = torch.randn(b, d, k, k, generator=gen) * 2 if selector else None
    to = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    return Lattice(tokens=to(tokens), unary=to(unary), logp=to(logp), edges=to(edges),
                   anchor=to(torch.randint(0, 1000, (b,), generator=gen)))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 3), d=st.integers(1, 15), k=st.sampled_from([1, 2, 4, 16]),
       selector=st.booleans(), name=st.sampled_from(["best_first", "ddtree", "eagle2"]), nodes=st.integers(2, 64),
       keep=st.sampled_from([1, 2, 3, 4]))
def test_kernel_equals_reference(seed, b, d, k, selector, name, nodes, keep):
    if nodes > max_nodes(name, d, k, min(keep, k)):
        return
    lattice = _lattice(seed, b, d, k, selector)
    ref = TreeBuilder(name, nodes, d, k, keep)(lattice)
    fast_builder = TreeBuilder(name, nodes, d, k, keep, plan=TRITON)
    fast = fast_builder(lattice)
    assert fast.seen is not None  # the kernel ran
    for field in ("parents", "depth", "cand", "tokens"):
        assert torch.equal(getattr(fast, field), getattr(ref, field)), field
    assert torch.equal(fast.ancestors(d), ref.ancestors(d))


def test_reference_runs_beyond_the_kernels_budget():
    lattice = _lattice(0, 1, 6, 4, True)
    assert not tree_build.applies(lattice.logp, tree_build.MAX_NODES + 1, TRITON)
    tree = TreeBuilder("best_first", tree_build.MAX_NODES + 1, 6, 4, plan=TRITON)(lattice)
    assert tree.seen is None and tree.rows == tree_build.MAX_NODES + 1


@pytest.mark.parametrize("name", ["best_first", "ddtree", "eagle2"])
@pytest.mark.parametrize("d,k,keep,nodes", [(15, 16, 4, 32), (15, 16, 4, 64), (5, 4, 2, 9), (7, 8, 3, 20)])
def test_kernel_equals_reference_at_serving_shapes(name, d, k, keep, nodes):
    """The drafter's own shape (15 depths, 16 candidates) and a few smaller ones, two sequences, three seeds."""
    for seed in range(3):
        lattice = _lattice(seed, 2, d, k, True)
        ref = TreeBuilder(name, nodes, d, k, keep)(lattice)
        fast = TreeBuilder(name, nodes, d, k, keep, plan=TRITON)(lattice)
        assert fast.seen is not None
        for field in ("parents", "depth", "cand", "tokens"):
            assert torch.equal(getattr(fast, field), getattr(ref, field)), (seed, field)
        assert torch.equal(fast.seen, ref.ancestors(d))
