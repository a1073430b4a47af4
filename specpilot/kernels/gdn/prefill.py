"""A prompt chunk through a Gated DeltaNet layer: fla-core's chunked kernel on CUDA, the reference elsewhere.

fla-core (`fla.ops.gated_delta_rule.chunk_gated_delta_rule`, Triton) is the library's WY/UT chunk form, the same
algorithm as `naive.chunked`: its state layout [B, Hv, Dk, Dv] is ours, it repeats key heads onto value heads
(GVA), L2-normalises q and k in the kernel and scales q by 1/sqrt(Dk). Its products run on tensor cores, so its
outputs match the float32 reference to those products' rounding (tests/test_gdn_prefill.py, GPU). A prefill is not
captured in a CUDA graph, and every later token starts from the state it leaves, AR and speculative runs alike.
Without fla-core (or with `kernels=naive`, or on a CPU) the reference runs.
"""

from __future__ import annotations

import functools

import torch

from specpilot.config.plan import KernelPlan
from specpilot.kernels.dispatch import use_triton
from specpilot.kernels.gdn import naive


@functools.cache
def fla_chunk():
    """fla-core's chunked forward, or None where it is not installed."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return None
    return chunk_gated_delta_rule


def prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            state: torch.Tensor, plan: KernelPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [B, T, Hv, Dv], the state after the chunk [B, Hv, Dk, Dv] float32) from `state`."""
    chunk = fla_chunk() if q.is_cuda and use_triton(q, plan) else None
    if chunk is None:
        return naive.chunked(q, k, v, g, beta, state)
    dtype = v.dtype if v.dtype in (torch.bfloat16, torch.float16) else torch.float32
    o, after = chunk(q.to(dtype), k.to(dtype), v.to(dtype), g.float(), beta.to(dtype),
                     initial_state=state.float(), output_final_state=True, use_qk_l2norm_in_kernel=True)
    return o.float(), after.float()
