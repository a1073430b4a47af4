"""A hybrid's prompt chunk: fla-core's chunked kernel on CUDA against the float32 reference (kernels/gdn/prefill.py);
the reference itself where fla-core, CUDA or the Triton plan is missing."""

import pytest
import torch
import torch.nn.functional as F

from specpilot.config.plan import KernelPlan
from specpilot.kernels.gdn import naive
from specpilot.kernels.gdn.prefill import fla_chunk, prefill


def inputs(device: str, t: int = 70, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    b, hk, hv, dk, dv = 2, 2, 4, 32, 32

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    g = -F.softplus(randn(b, t, hv))
    beta = torch.rand(b, t, hv, generator=gen).to(device)
    return randn(b, t, hk, dk), randn(b, t, hk, dk), randn(b, t, hv, dv), g, beta, 0.1 * randn(b, hv, dk, dv)


def test_the_reference_runs_where_fla_cannot():
    q, k, v, g, beta, s = inputs("cpu")
    o, after = prefill(q, k, v, g, beta, s, KernelPlan.stock())
    ro, rs = naive.chunked(q, k, v, g, beta, s)
    assert torch.equal(o, ro) and torch.equal(after, rs)


@pytest.mark.skipif(not torch.cuda.is_available() or fla_chunk() is None, reason="needs CUDA and fla-core")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fla_chunk_matches_the_reference_on_cuda(dtype):
    q, k, v, g, beta, s = inputs("cuda", seed=1)
    o, after = prefill(q.to(dtype), k.to(dtype), v.to(dtype), g, beta, s, KernelPlan.stock())
    ro, rs = (x.double() for x in naive.chunked(q, k, v, g, beta, s))  # float32 from float32 inputs
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    assert (o.double() - ro).abs().max() < tol * ro.abs().max()
    assert (after.double() - rs).abs().max() < tol * rs.abs().max()
