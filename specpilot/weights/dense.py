"""The dense weight format: W [N, K] (and a bias) in the model's own dtype.

`project` is what every projection of the target and drafter calls: cuBLAS, with the norm before it, SwiGLU's
activation and the residual add after it as separate kernels; or, for a few rows under the plan's `gemv`,
the weight-streaming Triton GEMV that fuses them all (kernels/gemv). `qkv_rope` is the one-row q/k/v
projection fused with rope and the K/V write (kernels/qkv_rope). `rows` gathers rows (the embedding, whose
table a tied LM head shares). `reference` is the plain PyTorch the kernels are tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specpilot.config.plan import KernelPlan
from specpilot.kernels.gemv import gemv_applies, stream_of
from specpilot.kernels.gemv.naive import gemv_naive
from specpilot.kernels.norm import rms_norm
from specpilot.kernels.qkv_rope import qkv_rope, qkv_rope_applies
from specpilot.kernels.swiglu import silu_mul
from specpilot.runtime.regions import region


class DenseWeight(nn.Module):
    """A projection's weight [out, in] and optional bias [out] (state-dict names `weight`, `bias`, as a
    torch Linear's: checkpoints map onto it unchanged)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> DenseWeight:
        """The format around tensors that already exist (a float32 copy of a head for training, say)."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.weight, self.bias = weight, bias
        return self

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    def project(self, x, plan: KernelPlan, *, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                residual=None, gate_up: bool = False, next_norm: torch.Tensor | None = None):
        """[residual +] act(rms_norm?(x) W^T + b), act = silu(gate) * up when gate_up (W = [gate; up]). x and
        residual may be NormedStreams. next_norm: the weight of the norm that will read the result; a one-row
        streaming GEMV then returns a NormedStream for it (kernels/gemv), anything else a tensor."""
        if gemv_applies(x, plan):
            from specpilot.kernels.gemv.triton import gemv_triton

            with region("gemm"):
                return gemv_triton(x, self.weight, self.bias, plan=plan, norm_weight=norm_weight, eps=eps,
                                   residual=stream_of(residual), gate_up=gate_up, next_norm=next_norm)
        x, residual = stream_of(x), stream_of(residual)
        h = rms_norm(x, norm_weight, eps, plan) if norm_weight is not None else x
        with region("gemm"):
            y = F.linear(h, self.weight, self.bias)
        if gate_up:
            y = silu_mul(y, plan)
        return y if residual is None else residual + y

    def reference(self, x: torch.Tensor, *, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                  residual: torch.Tensor | None = None, gate_up: bool = False) -> torch.Tensor:
        """What `project` computes, in plain PyTorch."""
        return gemv_naive(x, self.weight, self.bias, norm_weight=norm_weight, eps=eps, residual=residual,
                          gate_up=gate_up)

    def qkv_rope_applies(self, x, plan: KernelPlan, qk_norm: bool, head_dim: int) -> bool:
        return qkv_rope_applies(x, plan, qk_norm, head_dim)

    def qkv_rope(self, x, plan: KernelPlan, norm_weight, eps, positions, rope, k_cache, v_cache, slots,
                 num_heads: int, num_kv_heads: int, head_dim: int) -> torch.Tensor:
        """One row: q [1, 1, Hq, D], this row's K/V written at its slot, in one launch."""
        with region("gemm"):  # the weight's read dominates the fused launch
            return qkv_rope(x, self.weight, self.bias, norm_weight, eps, positions, rope.cos, rope.sin, k_cache,
                            v_cache, slots, num_heads, num_kv_heads, head_dim, plan=plan)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows `ids` selects (an embedding lookup)."""
        return F.embedding(ids, self.weight)
