"""The dense weight format: W [N, K] (and a bias) in the model's own dtype.

`project` is what every projection of the target and drafter calls: cuBLAS, with the norm before it, SwiGLU's
activation and the residual add after it as separate kernels; or, for a few rows under the plan's `gemv`,
the weight-streaming Triton GEMV that fuses them all (kernels/gemv); or, for 1..64 rows under the plan's
`weights=w12` (once w12/attach.py gave the weight its W12 form) or `fewrow`, the few-row tensor-core kernel
(kernels/fewrow), the residual added in its epilogue; or, under `weights=fp8` (once weights/fp8_attach.py gave the
weight its FP8 form), the W8A8 FP8 product of weights/fp8.py, for every row count. `qkv_rope` is the one-row q/k/v
projection fused with rope and the K/V write (kernels/qkv_rope). `rows` gathers rows (the embedding, whose
table a tied LM head shares). `reference` is the plain PyTorch the kernels are tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specpilot.config.plan import KernelPlan
from specpilot.core.regions import region
from specpilot.errors import UserError
from specpilot.kernels import fewrow
from specpilot.kernels.gemv import gemv_applies, stream_of
from specpilot.kernels.gemv.naive import gemv_naive
from specpilot.kernels.norm import rms_norm
from specpilot.kernels.qkv_rope import qkv_rope, qkv_rope_applies
from specpilot.kernels.swiglu import silu_mul
from specpilot.weights import fp8 as fp8_format


def _kernel_takes(x) -> bool:
    """Whether the few-row kernel can run this input: 1..64 BF16 rows on a GPU it runs on."""
    x = stream_of(x)
    return (x.is_cuda and x.numel() // x.shape[-1] <= fewrow.MAX_ROWS and x.dtype == torch.bfloat16
            and fewrow.runs())


def few_row_path(plan: KernelPlan, device: torch.device, dtype: torch.dtype, tlv: bool = False) -> str | None:
    """What runs the products of 1..64 rows that weights=w12 or fewrow=true send to the few-row kernel, for the
    record (None: the plan sends none); tlv: verify=tlv, whose 8-bit pass runs there too. On the CPU the PyTorch
    path on the dense weights (the W12 forms were checked to hold their bits; the 8-bit view a copy): the options'
    own CPU path. A GPU where the kernel can take none of them is the user's to fix (UserError): the option would
    name a kernel that never runs (and tlv's Q pass would silently read the exact weights)."""
    asked = [name for name, on in (("weights=w12", plan.weights == "w12"), ("fewrow=true", plan.fewrow),
                                   ("verify=tlv", tlv)) if on]
    if not asked:
        return None
    if device.type != "cuda":
        return "torch on the cpu (the dense weights; no few-row kernel there)"
    why = fewrow.unavailable() or (None if dtype == torch.bfloat16 else
                                   f"the model is {str(dtype).removeprefix('torch.')}, the kernel takes BF16")
    if why:
        raise UserError(f"{', '.join(asked)} {'runs' if len(asked) == 1 else 'run'} the few-row kernel, which "
                        f"cannot run here: {why} (drop the option, or run it in bfloat16 on a GPU of compute "
                        "capability 9.0+ with cuda-bindings)")
    if asked == ["verify=tlv"]:
        return "few-row kernel for verify=tlv's 8-bit pass (1..64 rows); the exact pass on the dense path (cuBLAS)"
    return "few-row kernel for 1..64 rows; the dense path (cuBLAS) past 64"


class DenseWeight(nn.Module):
    """A projection's weight [out, in] and optional bias [out] (state-dict names `weight`, `bias`, as a
    torch Linear's: checkpoints map onto it unchanged)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.w12: fewrow.FewRowWeight | None = None  # the W12 form, checked against `weight` (w12/attach.py)
        self.fp8: fp8_format.Fp8Weight | None = None  # the FP8 form quantized from `weight` (weights/fp8_attach.py)

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> DenseWeight:
        """The format around tensors that already exist (a float32 copy of a head for training, say)."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.weight, self.bias = weight, bias
        self.w12 = None
        self.fp8 = None
        return self

    @property
    def shape(self) -> torch.Size:
        if not self.dense_dropped:
            return self.weight.shape
        w12 = self.w12
        return torch.Size(w12.w12.shape) if w12 is not None and w12.w12 is not None else self.fp8.shape

    @property
    def dense_dropped(self) -> bool:
        """Whether the dense copy was freed (w12_dense=drop, fp8_dense=drop): `weight` is then decoded from the W12
        form (exact) or, with none, read from the FP8 form (the FP8 target's weight, not the original)."""
        return "_dense_dtype" in self.__dict__

    def drop_dense(self) -> None:
        """Free the dense copy of a weight whose W12 form was checked to hold its bits, or that has its FP8 form.
        From then on a read of `weight` decodes the W12 form into a temporary (fewrow.dense_matrix): the paths past
        the few-row kernel (prefill, rows past 64, the CPU) stay exact and pay a decode per call. With only an FP8
        form it dequantizes that (weights=fp8 itself reads the FP8 form on every path; w12/attach.claim keeps the
        systems that read the BF16 copy out of the process)."""
        if (self.w12 is None or self.w12.w12 is None) and self.fp8 is None:
            raise ValueError("only a weight with a W12 or FP8 form can drop its dense copy")
        self.__dict__["_dense_dtype"] = self.weight.dtype
        del self._parameters["weight"]

    def __getattr__(self, name: str):
        if name == "weight" and "_dense_dtype" in self.__dict__:
            w12 = self.__dict__["w12"]
            if w12 is not None and w12.w12 is not None:
                return fewrow.dense_matrix(w12.w12).to(self.__dict__["_dense_dtype"])
            return self.__dict__["fp8"].matrix(self.__dict__["_dense_dtype"])
        return super().__getattr__(name)

    def project(self, x, plan: KernelPlan, *, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                residual=None, gate_up: bool = False, next_norm: torch.Tensor | None = None):
        """[residual +] act(rms_norm?(x) W^T + b), act = silu(gate) * up when gate_up (W = [gate; up]). x and
        residual may be NormedStreams. next_norm: the weight of the norm that will read the result; a one-row
        streaming GEMV then returns a NormedStream for it (kernels/gemv), anything else a tensor."""
        if plan.view == "8bit" and self.w12 is not None and (_kernel_takes(x) or not stream_of(x).is_cuda):
            return self._project_view8(x, plan, norm_weight, eps, residual, gate_up)
        if self.fp8_applies(plan):
            return self._project_fp8(x, plan, norm_weight, eps, residual, gate_up)
        few = self.fewrow_weight(x, plan)
        if few is not None:
            return self._project_fewrow(few, x, plan, norm_weight, eps, residual, gate_up)
        if gemv_applies(x, plan):
            from specpilot.kernels.gemv.triton import gemv_triton

            with region("gemm"):
                return gemv_triton(x, self.weight, self.bias, plan=plan, norm_weight=norm_weight, eps=eps,
                                   residual=stream_of(residual), gate_up=gate_up, next_norm=next_norm)
        return self._project_unfused(self.weight, x, plan, norm_weight, eps, residual, gate_up)

    def _project_unfused(self, matrix: torch.Tensor, x, plan: KernelPlan, norm_weight, eps, residual,
                         gate_up: bool) -> torch.Tensor:
        """The norm, F.linear with `matrix` (cuBLAS on a GPU), the activation and the residual, one by one."""
        x, residual = stream_of(x), stream_of(residual)
        h = rms_norm(x, norm_weight, eps, plan) if norm_weight is not None else x
        with region("gemm"):
            y = F.linear(h, matrix, self.bias)
        if gate_up:
            y = silu_mul(y, plan)
        return y if residual is None else residual + y

    def fp8_applies(self, plan: KernelPlan) -> bool:
        """Whether the plan sends this weight's products to its FP8 form (weights=fp8, once attached): every row
        count, prefill's included, so that the FP8 model is one function."""
        return plan.weights == "fp8" and self.fp8 is not None

    def _project_fp8(self, x, plan: KernelPlan, norm_weight, eps, residual, gate_up: bool) -> torch.Tensor:
        """The norm, the W8A8 FP8 product (weights/fp8.product: the input quantized per row), the bias, the
        activation and the residual, one by one."""
        x, residual = stream_of(x), stream_of(residual)
        h = rms_norm(x, norm_weight, eps, plan) if norm_weight is not None else x
        with region("gemm"):
            n = self.fp8.shape[0]
            y = fp8_format.product(h.reshape(-1, h.shape[-1]), self.fp8).view(*h.shape[:-1], n)
            if self.bias is not None:
                y = y + self.bias
        if gate_up:
            y = silu_mul(y, plan)
        return y if residual is None else residual + y

    def fewrow_weight(self, x, plan: KernelPlan) -> fewrow.FewRowWeight | None:
        """The form the few-row kernel reads, when the plan sends this call there: W12 under weights=w12 (once
        attached), BF16 under fewrow; for 1..64 rows on a GPU that runs the kernel. Elsewhere (the CPU, a
        prefill's rows) the projection reads `weight`, whose bits the W12 form was checked to hold."""
        if not _kernel_takes(x):
            return None
        if plan.weights == "w12" and self.w12 is not None:
            return self.w12
        if plan.fewrow and self.weight.dtype == torch.bfloat16 and fewrow.fits(self.weight.shape[1]) is None:
            return fewrow.FewRowWeight.bf16(self.weight, self.bias)
        return None

    def _project_fewrow(self, few: fewrow.FewRowWeight, x, plan: KernelPlan, norm_weight, eps, residual,
                        gate_up: bool, view8: bool = False) -> torch.Tensor:
        x, residual = stream_of(x), stream_of(residual)
        h = rms_norm(x, norm_weight, eps, plan) if norm_weight is not None else x
        fused = residual is not None and not gate_up  # the kernel adds it after rounding, as `residual + y` does
        with region("gemm"):
            y = fewrow.product(h.reshape(-1, h.shape[-1]), few, residual=residual.reshape(-1, few.n) if fused else None,
                               view8=view8).view(*h.shape[:-1], few.n)
        if gate_up:
            y = silu_mul(y, plan)
        return y if residual is None or fused else residual + y

    def _project_view8(self, x, plan: KernelPlan, norm_weight, eps, residual, gate_up: bool) -> torch.Tensor:
        """The 8-bit view's projection: the few-row kernel where it runs; on the CPU a copy of the view in the
        weight's dtype (made once per weight). A GPU call the kernel cannot take (past 64 rows) reads the exact
        weights instead: a copy would cost the memory W12 saves, and the Q pass may be exact."""
        if _kernel_takes(x):
            return self._project_fewrow(self.w12, x, plan, norm_weight, eps, residual, gate_up, view8=True)
        form, cached = self.__dict__.get("_view8", (None, None))
        if form is not self.w12:  # made once per W12 form
            cached = self.w12.matrix(view8=True).to(self.weight.dtype)
            self.__dict__["_view8"] = (self.w12, cached)
        return self._project_unfused(cached, x, plan, norm_weight, eps, residual, gate_up)

    def reference(self, x: torch.Tensor, *, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                  residual: torch.Tensor | None = None, gate_up: bool = False) -> torch.Tensor:
        """What `project` computes, in plain PyTorch."""
        return gemv_naive(x, self.weight, self.bias, norm_weight=norm_weight, eps=eps, residual=residual,
                          gate_up=gate_up)

    def qkv_rope_applies(self, x, plan: KernelPlan, qk_norm: bool, head_dim: int) -> bool:
        return (qkv_rope_applies(x, plan, qk_norm, head_dim) and self.fewrow_weight(x, plan) is None
                and not (plan.view == "8bit" and self.w12 is not None) and not self.fp8_applies(plan))

    def qkv_rope(self, x, plan: KernelPlan, norm_weight, eps, positions, rope, k_cache, v_cache, slots,
                 num_heads: int, num_kv_heads: int, head_dim: int) -> torch.Tensor:
        """One row: q [1, 1, Hq, D], this row's K/V written at its slot, in one launch."""
        with region("gemm"):  # the weight's read dominates the fused launch
            return qkv_rope(x, self.weight, self.bias, norm_weight, eps, positions, rope.cos, rope.sin, k_cache,
                            v_cache, slots, num_heads, num_kv_heads, head_dim, plan=plan)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows `ids` selects (an embedding lookup)."""
        return F.embedding(ids, self.weight)
