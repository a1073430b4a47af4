"""The decode attention in thread-block clusters (kernels/attention/cluster.py) against the PyTorch reference.

The kernel is CUDA C++ for Hopper: its numerical tests run on a GPU; on the CPU what is tested is when it is
offered, that a config asking for it falls back to the Triton kernel where it cannot run, and (with the dev
extras' NVRTC) that it builds for sm_90 without spills within the shared memory `eligible` assumes.
"""

from __future__ import annotations

import os
import re

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported

import pytest  # noqa: E402

from specpilot.config.plan import KernelPlan  # noqa: E402
from specpilot.core.contracts import Visibility  # noqa: E402
from specpilot.kernels import nvrtc  # noqa: E402
from specpilot.kernels.attention import cluster  # noqa: E402
from specpilot.kernels.attention import triton as kernel_module  # noqa: E402
from specpilot.kernels.attention.naive import attend_naive  # noqa: E402
from specpilot.kernels.tuning import candidates  # noqa: E402

CUDA = torch.cuda.is_available()
RUNS = CUDA and nvrtc.bindings_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
needs_cluster = pytest.mark.skipif(not RUNS, reason="needs cuda-bindings and a GPU of compute capability 9+")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.shape == ref.shape
    assert torch.isfinite(out).all()
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def case(seed: int, b: int, hq: int, hkv: int, d: int, length: int, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, 1, hq, d, generator=gen).to(DEVICE, dtype)
    k = torch.randn(b, hkv, length, d, generator=gen).to(DEVICE, dtype)
    v = torch.randn(b, hkv, length, d, generator=gen).to(DEVICE, dtype)
    return q, k, v


def vis_of(cache_len, start) -> Visibility:
    return Visibility(torch.tensor(cache_len, device=DEVICE), torch.tensor(start, device=DEVICE))


def test_offered_only_where_it_runs(monkeypatch):
    key = ("attention", 1, 8, 4, 128, 1024)
    plan = KernelPlan.stock()
    monkeypatch.setattr(candidates, "_cluster_runs", lambda: False)
    assert not any("CLUSTER" in c for c in candidates.candidates(key, plan))
    monkeypatch.setattr(candidates, "_cluster_runs", lambda: True)
    offered = [c for c in candidates.candidates(key, plan) if "CLUSTER" in c]
    assert offered == candidates.CLUSTER and {c["CLUSTER"] for c in offered} <= set(cluster.SPLITS)
    assert not any("CLUSTER" in c for c in candidates.candidates(key, plan.but(cluster=False)))
    no_late = candidates.candidates(key, plan.but(attn_late=False))
    assert [c for c in no_late if "CLUSTER" in c] == [{"CLUSTER": 4}, {"CLUSTER": 8}]
    assert not any(c.get("LATE") for c in no_late)


def test_eligibility():
    q, k, v = case(0, 1, 8, 2, 64, 64)
    vis = vis_of([10], [10])
    assert cluster.eligible(q, k, v, vis, 4) == RUNS
    assert not cluster.eligible(q, k, v, vis, 3)  # not a cluster size it is built for
    assert not cluster.eligible(q.float(), k.float(), v.float(), vis, 4)
    assert not cluster.eligible(q, k, v, Visibility(vis.cache_len, vis.start, window=8), 4)
    assert not cluster.eligible(q.expand(1, 2, 8, 64), k, v, vis, 4)  # two rows
    wide = case(0, 1, 64, 8, 128, 64)  # 8 query heads a KV head at 128 wide: 66 KB of shared memory
    assert cluster.smem_bytes(8, 128, 8) > cluster.STATIC_SMEM
    assert not cluster.eligible(*wide, vis, 8)


def test_a_cluster_config_falls_back_to_the_triton_kernel_where_it_cannot_run(monkeypatch):
    """{"CLUSTER": s} chosen for a call the cluster kernel does not take (here: float32, or no GPU) runs the
    Triton kernel with s splits."""
    q, k, v = case(3, 1, 8, 2, 64, 200, dtype=torch.float32)
    vis = vis_of([150], [150])
    ref = attend_naive(q, k, v, vis, 0.125)
    asked = []
    real = kernel_module._config
    monkeypatch.setattr(kernel_module, "_config", lambda *a: asked.append(a[-1]) or real(*a))
    plan = KernelPlan.stock(gemv=True)
    plan.table.chosen[("attention", 1, 2, 4, 64, 200)] = {"CLUSTER": 4, "LATE": True}
    out = kernel_module.attend_triton(q, k, v, vis, 0.125, plan)
    assert asked == [4]
    assert rel_err(out, ref) <= 1e-4


# ---------------------------------------------------------------- NVRTC builds (no GPU needed)


def _nvrtc_runs() -> bool:
    try:
        from cuda.bindings import nvrtc

        return int(nvrtc.nvrtcVersion()[0]) == 0
    except Exception:  # no cuda-bindings, or no libnvrtc beside it
        return False


needs_nvrtc = pytest.mark.skipif(not _nvrtc_runs(), reason="needs cuda-bindings and NVRTC (the dev extras)")


def ptxas_report(log: str) -> dict[str, int]:
    """ptxas's -v lines for the one kernel: registers, spill stores / loads, static shared memory bytes."""
    def grab(pattern: str) -> int:
        (value,) = re.findall(pattern, log)
        return int(value)

    return {"registers": grab(r"Used (\d+) registers"), "spill_stores": grab(r"(\d+) bytes spill stores"),
            "spill_loads": grab(r"(\d+) bytes spill loads"), "smem": grab(r"(\d+) bytes smem")}


@needs_nvrtc
@pytest.mark.parametrize("splits", cluster.SPLITS)
@pytest.mark.parametrize("g,d,late,preload,half", [(1, 64, True, True, False), (4, 128, False, True, False),
                                                   (5, 128, True, False, True), (2, 256, True, True, True)])
def test_sm90_build_fits_and_does_not_spill(splits, g, d, late, preload, half):
    """The 8B's shape (4 query heads a KV head, 128 wide), the 27B's (5) and two more build for sm_90 at every
    cluster size with no spills, and their static shared memory is what `smem_bytes` (eligible's bound) says."""
    cubin, log = cluster.build(cluster.macros_for(g, d, splits, late, preload, half), "sm_90", verbose=True)
    assert cubin[:4] == b"\x7fELF"
    report = ptxas_report(log)
    assert report["spill_stores"] == report["spill_loads"] == 0, log
    assert report["smem"] == cluster.smem_bytes(g, d, splits) <= cluster.STATIC_SMEM
    assert report["registers"] * cluster.WARPS * 32 <= 65536  # one block fits an SM's register file


@needs_nvrtc
def test_a_build_over_the_static_shared_memory_bound_is_refused():
    """8 query heads a KV head at 128 wide and 4 splits need more than 48 KB: ptxas refuses it, and eligible
    (through smem_bytes) never offers it."""
    assert cluster.smem_bytes(8, 128, 4) > cluster.STATIC_SMEM
    with pytest.raises(RuntimeError, match="too much shared data"):
        cluster.build(cluster.macros_for(8, 128, 4, False, True, False), "sm_90")


# ---------------------------------------------------------------- GPU only


@needs_cluster
@pytest.mark.parametrize("splits", cluster.SPLITS)
@pytest.mark.parametrize("g,d", [(1, 64), (4, 128), (2, 256)])
@pytest.mark.parametrize("late,preload", [(False, True), (True, True), (True, False)])
def test_matches_reference(splits, g, d, late, preload):
    hkv, length = 4, 1100
    q, k, v = case(splits * 100 + g * 10 + d, 2, g * hkv, hkv, d, length)
    for cache_len in (0, 1, 5, 63, 64, 65, 200, 383, 1000, length - 1):
        vis = vis_of([cache_len, max(0, cache_len - 3)], [cache_len, max(0, cache_len - 3)])
        out = cluster.attend_cluster(q, k, v, vis, d**-0.5, splits, late=late, preload=preload, pdl=False)
        ref = attend_naive(q.float(), k.float(), v.float(), vis, d**-0.5)
        assert out.dtype == q.dtype
        assert rel_err(out, ref) <= 1e-2, cache_len


@needs_cluster
@pytest.mark.parametrize("splits", cluster.SPLITS)
def test_unread_slots_and_gap(splits):
    """NaN in every slot it must not read (past the new row, and between cache_len and start) changes
    nothing; fp16 too."""
    hq, hkv, d, length = 16, 4, 128, 512
    q, k, v = case(splits, 2, hq, hkv, d, length, dtype=torch.float16)
    vis = vis_of([37, 300], [60, 300])
    slots = torch.arange(length, device=DEVICE)
    seen = (slots[None] < vis.cache_len[:, None]) | (slots[None] == vis.start[:, None])
    dead = (~seen)[:, None, :, None].expand_as(k)
    ref = attend_naive(q.float(), k.float(), v.float(), vis, 0.1)
    out = cluster.attend_cluster(q, k.masked_fill(dead, float("nan")), v.masked_fill(dead, float("nan")), vis, 0.1,
                                 splits, pdl=False)
    assert rel_err(out, ref) <= 1e-2


@needs_cluster
def test_pdl_after_a_kernel_that_writes_q_in_a_graph():
    """Launched as a programmatic dependent of a kernel whose every block releases it at once and whose last
    blocks write q after the others copied 64 MB: the cluster kernel, resident early, must wait for q
    (graph replays at several lengths)."""
    import triton
    import triton.language as tl

    @triton.jit
    def copy_then_q(big_src, big_dst, big_blocks, q_src, q_dst, n_q, BLOCK: tl.constexpr):
        tl.extra.cuda.gdc_launch_dependents()
        pid = tl.program_id(0)
        if pid < big_blocks:
            offs = pid * BLOCK + tl.arange(0, BLOCK)
            tl.store(big_dst + offs, tl.load(big_src + offs))
        else:
            offs = (pid - big_blocks) * BLOCK + tl.arange(0, BLOCK)
            tl.store(q_dst + offs, tl.load(q_src + offs, mask=offs < n_q), mask=offs < n_q)

    hq, hkv, d, length = 32, 8, 128, 1024
    q, k, v = case(7, 1, hq, hkv, d, length)
    vis = vis_of([300], [300])
    q_src = torch.empty_like(q)
    block = 1024
    big = torch.randn(16 * 2**20, device=DEVICE)
    big_dst = torch.empty_like(big)
    grid = (big.numel() // block + triton.cdiv(q.numel(), block),)
    for splits in cluster.SPLITS:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            copy_then_q[grid](big, big_dst, big.numel() // block, q_src, q, q.numel(), BLOCK=block)
            out = cluster.attend_cluster(q, k, v, vis, d**-0.5, splits, late=True, preload=True, pdl=True)
        for cl in (300, 17, 900):
            vis.cache_len.fill_(cl)
            vis.start.fill_(cl)
            q_src.copy_(torch.randn(q.shape, device=DEVICE))
            graph.replay()
            torch.cuda.synchronize()
            ref = attend_naive(q_src.float(), k.float(), v.float(), vis, d**-0.5)
            assert rel_err(out, ref) <= 1e-2, (splits, cl)


@needs_cluster
def test_decode_step_runs_the_cluster_kernel_when_chosen(monkeypatch):
    """In the `gemv` decode step a {"CLUSTER": s} choice launches this kernel (no Triton split kernel)."""
    hq, hkv, d, length = 32, 8, 128, 512
    q, k, v = case(11, 1, hq, hkv, d, length)
    vis = vis_of([200], [200])
    ref = attend_naive(q.float(), k.float(), v.float(), vis, d**-0.5)
    launched = []
    real = cluster.attend_cluster
    monkeypatch.setattr(cluster, "attend_cluster", lambda *a, **kw: launched.append(a[5]) or real(*a, **kw))
    plan = KernelPlan.stock(gemv=True)
    plan.table.chosen[("attention", 1, hkv, hq // hkv, d, length)] = {"CLUSTER": 8}
    out = kernel_module.attend_triton(q, k, v, vis, d**-0.5, plan)
    assert launched == [8]
    assert rel_err(out, ref) <= 1e-2
