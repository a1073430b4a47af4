"""The Triton attention kernel against the PyTorch reference.

Without CUDA the kernel runs in Triton's CPU interpreter in float32 (the interpreter does not do bf16
dots); the bf16 and CUDA-graph tests run only on a GPU.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported

from unittest import mock  # noqa: E402

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from specpilot.config.plan import KernelPlan  # noqa: E402
from specpilot.core.contracts import Visibility  # noqa: E402
from specpilot.kernels.attention import attend  # noqa: E402
from specpilot.kernels.attention import triton as kernel_module  # noqa: E402
from specpilot.kernels.attention.naive import attend_naive  # noqa: E402
from specpilot.kernels.attention.triton import attend_triton  # noqa: E402
from specpilot.kernels.dispatch import use_triton  # noqa: E402
from specpilot.kernels.tuning import candidates  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.shape == ref.shape
    assert torch.isfinite(out).all()
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def random_tree(t: int, gen: torch.Generator) -> torch.Tensor:
    """Ancestor-closed tree: parent[i] < i; row i sees its ancestors and itself."""
    tree = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        tree[i, i] = True
        if i:
            parent = int(torch.randint(0, i, (1,), generator=gen))
            tree[i] |= tree[parent]
    return tree


def make_case(gen, b, t, hq, hkv, d, length, tree_kind="none", window=None, dtype=torch.float32):
    q = torch.randn(b, t, hq, d, generator=gen)
    k = torch.randn(b, hkv, length, d, generator=gen)
    v = torch.randn(b, hkv, length, d, generator=gen)
    cache_len = torch.randint(0, length + 1, (b,), generator=gen)
    start = torch.randint(0, length - t + 1, (b,), generator=gen)
    trees = {"none": lambda: None, "rand": lambda: random_tree(t, gen),
             "ones": lambda: torch.ones(t, t, dtype=torch.bool),
             "per_seq": lambda: torch.stack([random_tree(t, gen) for _ in range(b)])}  # a tree per sequence
    tree = trees[tree_kind]()
    vis = Visibility(cache_len.to(DEVICE), start.to(DEVICE), None if tree is None else tree.to(DEVICE), window)
    return q.to(DEVICE, dtype), k.to(DEVICE, dtype), v.to(DEVICE, dtype), vis


@settings(max_examples=14, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    b=st.sampled_from([1, 2]),
    t=st.sampled_from([1, 3, 16, 33]),
    g=st.sampled_from([1, 4, 5]),
    hkv=st.sampled_from([1, 2]),
    d=st.sampled_from([16, 64]),
    length=st.sampled_from([64, 200]),
    tree_kind=st.sampled_from(["none", "rand", "ones", "per_seq"]),
    window=st.sampled_from([None, 4, 17]),
    splits=st.sampled_from([None, 1, 3]),
    fuse=st.booleans(),
)
def test_matches_reference(seed, b, t, g, hkv, d, length, tree_kind, window, splits, fuse):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, vis = make_case(gen, b, t, g * hkv, hkv, d, length, tree_kind, window)
    scale = d**-0.5
    out = attend_triton(q, k, v, vis, scale, KernelPlan.stock(gemv=fuse), num_splits=splits)
    ref = attend_naive(q, k, v, vis, scale)
    assert out.dtype == q.dtype and out.is_contiguous()
    assert rel_err(out, ref) <= 1e-4


def test_fused_combine_merges_in_the_split_launch_and_resets_its_counters(monkeypatch):
    gen = torch.Generator().manual_seed(21)
    q, k, v, vis = make_case(gen, 2, 3, 8, 2, 16, 200, "rand")
    ref = attend_naive(q, k, v, vis, 0.25)

    class NoCombine:
        def __getitem__(self, grid):
            raise AssertionError("the combine kernel ran although the split launch merges")

    real_empty = torch.empty

    def poisoned_empty(*args, **kwargs):  # scratch a split has not written yet reads as NaN
        out = real_empty(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(kernel_module, "_combine_kernel", NoCombine())
    monkeypatch.setattr(kernel_module.torch, "empty", poisoned_empty)
    plan = KernelPlan.stock(gemv=True)  # the fused combine
    for _ in range(2):  # the second call finds the counters reset by the first
        assert rel_err(attend_triton(q, k, v, vis, 0.25, plan, num_splits=4), ref) <= 1e-4
        assert int(kernel_module._counters(q.device).abs().sum()) == 0


def test_decode_step_runs_the_split_count_chosen_in_the_step(monkeypatch):
    """In the `gemv` decode step (one row, fused combine) the split count comes from the plan's tuning table
    (kernels/tuning; 0 = the heuristic); other calls keep the heuristic."""
    gen = torch.Generator().manual_seed(5)
    q, k, v, vis = make_case(gen, 1, 1, 8, 2, 16, 300, "none")
    ref = attend_naive(q, k, v, vis, 0.25)
    asked = []
    real = kernel_module._config
    monkeypatch.setattr(kernel_module, "_config", lambda *a: asked.append(a[-1]) or real(*a))
    key = ("attention", 1, 2, 4, 16, 300)
    plan = KernelPlan.stock(gemv=True)
    assert [c["NUM_SPLITS"] for c in candidates.ATTENTION][0] == 0
    for splits, want in ((2, 2), (1, 1), (0, None)):
        plan.table.chosen[key] = {"NUM_SPLITS": splits}
        assert rel_err(attend_triton(q, k, v, vis, 0.25, plan), ref) <= 1e-4
        assert asked[-1] == want
    plain = KernelPlan.stock()  # not the gemv step: no lookup
    plain.table.chosen[key] = {"NUM_SPLITS": 2}
    assert rel_err(attend_triton(q, k, v, vis, 0.25, plain), ref) <= 1e-4
    assert asked[-1] is None
    assert plan.table.record(lambda: attend_triton(q, k, v, vis, 0.25, plan)) == [key]
    # the first committed block is loaded before the PDL wait unless the tuning chose otherwise
    preloads, kernel = [], kernel_module._split_kernel

    class Spy:
        def __getitem__(self, grid):
            return lambda *a, **kw: preloads.append((kw["PRELOAD"], kw["LATE"])) or kernel[grid](*a, **kw)

    monkeypatch.setattr(kernel_module, "_split_kernel", Spy())
    for chosen in ({"NUM_SPLITS": 2}, {"NUM_SPLITS": 2, "AHEAD": False}, {"NUM_SPLITS": 2, "LATE": True}):
        plan.table.chosen[key] = chosen
        assert rel_err(attend_triton(q, k, v, vis, 0.25, plan), ref) <= 1e-4
    assert preloads == [(True, False), (False, False), (True, True)]  # LATE: released after the wait
    # the plan's ahead=False turns the preload off whatever the tuning chose
    plan.table.chosen[key] = {"NUM_SPLITS": 2}
    assert rel_err(attend_triton(q, k, v, vis, 0.25, plan.but(ahead=False)), ref) <= 1e-4
    assert preloads[-1] == (False, False)


@pytest.mark.parametrize("tree_kind", ["none", "rand", "per_seq"])
def test_noncontiguous_q(tree_kind):
    gen = torch.Generator().manual_seed(11)
    b, t, hq, hkv, d, length = 2, 5, 8, 2, 64, 128
    _, k, v, vis = make_case(gen, b, t, hq, hkv, d, length, tree_kind)
    # q as a view of a fused qkv projection output: [B, T, (Hq + 2 Hkv) * D], first Hq * D columns.
    qkv = torch.randn(b, t, (hq + 2 * hkv) * d, generator=gen).to(DEVICE)
    q = qkv[..., : hq * d].view(b, t, hq, d)
    assert not q.is_contiguous()
    ref = attend_naive(q.contiguous(), k, v, vis, 0.125)
    assert rel_err(attend_triton(q, k, v, vis, 0.125, KernelPlan.stock(), num_splits=2), ref) <= 1e-4
    # A strided head_dim too.
    wide = torch.randn(b, t, hq, 2 * d, generator=gen).to(DEVICE)
    q2 = wide[..., ::2]
    ref2 = attend_naive(q2.contiguous(), k, v, vis, 0.125)
    assert rel_err(attend_triton(q2, k, v, vis, 0.125, KernelPlan.stock()), ref2) <= 1e-4


@pytest.mark.parametrize("splits", [None, 1, 4])
@pytest.mark.parametrize("tree_kind", ["none", "ones"])
def test_unreachable_slots_are_not_read(splits, tree_kind):
    """NaN in slots past max(cache_len, start + T), and in the gap cache_len <= s < start, changes nothing."""
    gen = torch.Generator().manual_seed(5)
    b, t, hq, hkv, d, length = 2, 4, 8, 2, 16, 256
    q, k, v, vis = make_case(gen, b, t, hq, hkv, d, length, tree_kind)
    vis.cache_len = torch.tensor([37, 90], device=DEVICE)
    vis.start = torch.tensor([60, 90], device=DEVICE)
    ref = attend_naive(q, k, v, vis, 0.25)
    slots = torch.arange(length, device=DEVICE)
    bound = torch.maximum(vis.cache_len, vis.start + t)
    gap = (slots[None] >= vis.cache_len[:, None]) & (slots[None] < vis.start[:, None])
    dead = (slots[None] >= bound[:, None]) | gap
    dead = dead[:, None, :, None].expand_as(k)
    k_nan, v_nan = k.masked_fill(dead, float("nan")), v.masked_fill(dead, float("nan"))
    out = attend_triton(q, k_nan, v_nan, vis, 0.25, KernelPlan.stock(), num_splits=splits)
    assert rel_err(out, ref) <= 1e-4


@pytest.mark.parametrize("splits", [None, 1, 2, 5])
@pytest.mark.parametrize("cache_len", [0, 1, 63, 64, 130, 255])
def test_decode_step_preload_of_committed_slots(splits, cache_len):
    """The `gemv` decode step's attention loads each split's first block of committed slots before the
    PDL wait (a peeled loop step): bit for bit the result without it, equal to the reference, and
    nothing read past the committed slots and the new row (NaN there changes nothing)."""
    gen = torch.Generator().manual_seed(cache_len * 7 + (splits or 0))
    hq, hkv, d, length = 8, 2, 64, 256
    q, k, v, _ = make_case(gen, 1, 1, hq, hkv, d, length)
    vis = Visibility(torch.tensor([cache_len], device=DEVICE), torch.tensor([cache_len], device=DEVICE))
    dead = (torch.arange(length, device=DEVICE) > cache_len)[None, None, :, None].expand_as(k)
    k, v = k.masked_fill(dead, float("nan")), v.masked_fill(dead, float("nan"))
    ref = attend_naive(q, k.nan_to_num(), v.nan_to_num(), vis, d**-0.5)
    outs = []
    for ahead in (False, True):
        outs.append(attend_triton(q, k, v, vis, d**-0.5, KernelPlan.stock(ahead=ahead, gemv=True), num_splits=splits))
    assert torch.equal(outs[0], outs[1])
    assert rel_err(outs[1], ref) <= 1e-4


def test_every_output_written_with_poisoned_allocations():
    """Output and split scratch come from torch.empty: fill them with NaN; empty splits must stay neutral."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, vis = make_case(gen, 2, 3, 8, 2, 16, 200, "rand")
    vis.cache_len = torch.tensor([0, 10], device=DEVICE)  # most of the 8 splits have no slots
    vis.start = torch.tensor([0, 10], device=DEVICE)
    real_empty = torch.empty

    def poisoned_empty(*args, **kwargs):
        out = real_empty(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    with mock.patch.object(kernel_module.torch, "empty", poisoned_empty):
        out = attend_triton(q, k, v, vis, 0.25, KernelPlan.stock(), num_splits=8)
    assert rel_err(out, attend_naive(q, k, v, vis, 0.25)) <= 1e-4


def test_row_that_sees_nothing_is_zero():
    gen = torch.Generator().manual_seed(2)
    q, k, v, vis = make_case(gen, 1, 4, 4, 1, 16, 64)
    tree = torch.ones(4, 4, dtype=torch.bool).tril()
    tree[2] = False
    vis = Visibility(torch.tensor([0], device=DEVICE), torch.tensor([8], device=DEVICE), tree.to(DEVICE))
    for splits in (1, 3):
        out = attend_triton(q, k, v, vis, 0.25, KernelPlan.stock(), num_splits=splits)
        ref = attend_naive(q, k, v, vis, 0.25)
        assert torch.isfinite(out).all() and torch.isfinite(ref).all()
        assert (out[:, 2] == 0).all() and (ref[:, 2] == 0).all()
        assert rel_err(out, ref) <= 1e-4


@pytest.mark.parametrize("window", [1, 3, 9])
def test_naive_window_matches_dense_definition(window):
    """attend_naive with a window equals a softmax written out from the mask definition."""
    gen = torch.Generator().manual_seed(window)
    b, t, hq, hkv, d, length = 2, 6, 6, 2, 16, 40
    q, k, v, vis = make_case(gen, b, t, hq, hkv, d, length, "rand", window)
    q, k, v = q.cpu(), k.cpu(), v.cpu()
    cl, st_, tree = vis.cache_len.cpu(), vis.start.cpu(), vis.tree.cpu()
    mask = torch.zeros(b, t, length, dtype=torch.bool)
    for bi in range(b):
        for ti in range(t):
            for s in range(length):
                rel = s - int(st_[bi])
                seen = s < int(cl[bi]) or (0 <= rel < t and bool(tree[ti, rel]))
                mask[bi, ti, s] = seen and abs(int(st_[bi]) + ti - s) < window
    assert torch.equal(Visibility(cl, st_, tree, window).dense(t, length), mask)
    g = hq // hkv
    kk = k.repeat_interleave(g, dim=1)  # [B, Hq, L, D]
    vv = v.repeat_interleave(g, dim=1)
    scores = torch.einsum("bthd,bhsd->bhts", q, kk) * 0.3
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    want = torch.einsum("bhts,bhsd->bthd", scores.softmax(-1), vv)
    got = attend_naive(q, k, v, Visibility(cl, st_, tree, window), 0.3)
    assert rel_err(got, want) <= 1e-5


def test_dispatch():
    x = torch.zeros(1)
    assert not use_triton(x, KernelPlan.stock(kernels="naive"))
    assert use_triton(x, KernelPlan.stock(kernels="auto")) is False  # CPU tensor
    assert use_triton(x, KernelPlan.stock()) is False  # auto is the default
    with pytest.raises(ValueError):
        KernelPlan.stock(kernels="bogus")
    triton_plan = KernelPlan.stock(kernels="triton")
    assert use_triton(x, triton_plan)
    gen = torch.Generator().manual_seed(9)
    q, k, v, vis = make_case(gen, 1, 3, 4, 2, 16, 64)
    ref = attend_naive(q, k, v, vis, 0.25)
    with mock.patch.object(kernel_module, "attend_triton", wraps=kernel_module.attend_triton) as spy:
        out = attend(q, k, v, vis, 0.25, triton_plan)
    assert spy.call_count == 1
    assert rel_err(out, ref) <= 1e-4
    with mock.patch.object(kernel_module, "attend_triton", side_effect=AssertionError) as spy:
        out = attend(q, k, v, vis, 0.25, KernelPlan.stock(kernels="naive"))
    assert spy.call_count == 0
    assert rel_err(out, ref) <= 1e-6  # the CPU's reference path over the live slots (attention/live.py)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    b=st.sampled_from([1, 2, 3]),
    t=st.sampled_from([1, 4, 16]),
    g=st.sampled_from([1, 3]),
    length=st.sampled_from([40, 96]),
    tree_kind=st.sampled_from(["none", "rand", "ones", "per_seq"]),
    window=st.sampled_from([None, 5]),
)
def test_live_slots_match_the_full_length_reference(seed, b, t, g, length, tree_kind, window):
    """The CPU attention over the live slots only equals the full-length reference to rounding, never reads a
    slot past the last visible one (NaN there), and shares one mask across the layers of a forward."""
    from specpilot.kernels.attention.live import attend_live, live_slots

    gen = torch.Generator().manual_seed(seed)
    q, k, v, vis = make_case(gen, b, t, g * 2, 2, 16, length, tree_kind, window)
    n = live_slots(vis, t, length)
    ref = attend_naive(q, k, v, vis, 0.25)
    k[:, :, n:] = float("nan")
    v[:, :, n:] = float("nan")
    out = attend_live(q, k, v, vis, 0.25)
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)
    memo = dict(vis.memo)
    again = attend_live(q * 2, k, v, vis, 0.25)  # a second layer of the same forward: the same mask object
    assert vis.memo.keys() == memo.keys() and all(vis.memo[key][1] is memo[key][1] for key in memo)
    assert torch.allclose(again, attend_naive(q * 2, k.nan_to_num(), v.nan_to_num(), vis, 0.25), atol=1e-5)


@pytest.mark.parametrize("length", [1024, 2048, 4096, 8192])
@pytest.mark.parametrize("t", [1, 16])
def test_split_heuristic_fills_the_gpu(length, t):
    """B=1, Hkv=8 decode / draft: between one and about two waves of 132 SMs."""
    cfg = kernel_module._config(1, 8, t * 4, 128, length, 132, None)
    programs = 8 * cfg.row_tiles * cfg.num_splits
    assert 128 <= programs <= 2 * 132 + 8 * cfg.row_tiles
    assert cfg.block_n in (64, 128) and cfg.block_m >= 16


# ---------------------------------------------------------------- GPU only


@needs_cuda
@pytest.mark.parametrize("length", [1024, 4096])
@pytest.mark.parametrize("t", [1, 16, 64])
@pytest.mark.parametrize("tree_kind", ["none", "rand"])
@pytest.mark.parametrize("fuse", [False, True])
def test_bf16_realistic(length, t, tree_kind, fuse):
    gen = torch.Generator().manual_seed(length + t)
    q, k, v, vis = make_case(gen, 1, t, 32, 8, 128, length, tree_kind, dtype=torch.bfloat16)
    for cl in (length // 3, length - t):
        vis.cache_len.fill_(cl)
        vis.start.fill_(cl)
        out = attend_triton(q, k, v, vis, 128**-0.5, KernelPlan.stock(gemv=fuse))
        ref = attend_naive(q.float(), k.float(), v.float(), vis, 128**-0.5)
        assert out.dtype == torch.bfloat16
        assert rel_err(out, ref) <= 2e-2


@needs_cuda
@pytest.mark.parametrize("t", [1, 16])
@pytest.mark.parametrize("fuse", [False, True])
def test_cuda_graph_replay_tracks_lengths(t, fuse):
    gen = torch.Generator().manual_seed(t)
    length = 2048
    q, k, v, vis = make_case(gen, 2, t, 32, 8, 128, length, "none", dtype=torch.bfloat16)
    vis.cache_len.copy_(torch.tensor([100, 7]))
    vis.start.copy_(torch.tensor([100, 7]))
    plan = KernelPlan.stock(gemv=fuse)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            attend_triton(q, k, v, vis, 0.1, plan)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attend_triton(q, k, v, vis, 0.1, plan)
    for cl, st_ in [((5, 1500), (5, 1500)), ((1800, 0), (1800, 0)), ((64, 1000), (70, 900)), ((0, 2000), (0, 2000))]:
        vis.cache_len.copy_(torch.tensor(cl))
        vis.start.copy_(torch.tensor(st_))
        q.copy_(torch.randn(q.shape, generator=gen).to(q))
        graph.replay()
        torch.cuda.synchronize()
        ref = attend_naive(q.float(), k.float(), v.float(), vis, 0.1)
        assert rel_err(out, ref) <= 2e-2, (cl, st_)
