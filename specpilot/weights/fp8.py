"""`weights=fp8`: the target's projections as W8A8 FP8 (E4M3), in the style of vLLM's FP8 linear layer.

What runs:
  weights      quantized offline, at engine build, from the loaded (BF16) weights: per output channel (row of
               W [N, K]) to `torch.float8_e4m3fn` with a float32 scale, scale = amax(|row|) / 448 (E4M3's largest
               finite value; a row of zeros gets scale 1 and stays zeros);
  activations  quantized dynamically per token: each row of the projection's input (after the norm) gets its own
               float32 scale, amax(|row|) / 448, the same rule;
  the product  on a GPU of compute capability 9.0+ with a BF16 model, `torch._scaled_mm(a_fp8, w_fp8.t(),
               scale_a [M, 1], scale_b [1, N], out_dtype=bf16)` (cuBLASLt's FP8 GEMM, row-wise scales applied
               to its float32 accumulation; fast accumulation off), for weights whose N and K are multiples of 16
               (the others take the reference on every call, decided once per weight);
               elsewhere (the CPU, an older GPU, a float32 model) the reference `reference_mm`: the FP8 operands
               converted exactly to float64 and multiplied there, then scaled by scale_a[i] * scale_b[j] and
               rounded once to the model's dtype. Every product of two E4M3 values is a multiple of 2^-18 below
               448^2, so for K < 2^17 every partial sum is exact in float64: the reference's dot products are
               exact whatever order the BLAS adds in (the exact dequantize-then-multiply, rounded once).
Bias, activation (SwiGLU) and residual follow as on the dense path, in the model's dtype.

Which weights: every projection of the target's layers (attention q/k/v, o and the Qwen3.5 output gate; MLP
gate/up and down; a hybrid's Gated DeltaNet in/out projections, all DenseWeights). Not the embedding, the norms or
the LM head (the drafter reads the head and the embedding too), and nothing of the drafter: those stay in the
model's dtype.

Row independence (what makes speculative decoding lossless against this target): the activation scales are per
row and the quantization is elementwise, so each row's quantized input and scale depend on that row alone,
bitwise, however many rows a call holds. The reference's dot products are exact (above), so on the CPU a row's
output is bitwise the same alone or in any block of rows: verifying a draft of T rows gives each token the value
a one-row AR step gives it. On a GPU, `_scaled_mm` rounds its float32 accumulation in an order cuBLASLt may choose
by the row count (tiles, split-K), exactly as cuBLAS's BF16 GEMM does on the stock path: row independence holds
there up to the GEMM's own row invariance, which is not guaranteed (near-ties can part, as they can on BF16).

"Lossless" with weights=fp8 means relative to the FP8 target: the FP8 model IS the target function, and a system
with weights=fp8 is held to AR with weights=fp8, not to the BF16 model (which it differs from by the
quantization; forcing/logic.py calls it a precision change that float32 cannot run).

Memory: by default the BF16 copies stay beside the FP8 forms (other systems on the same target, the bench's plain
AR among them, read them; the FP8 system itself reads only the FP8 forms, prefill included): `fp8_dense=drop`
frees the layers' copies, 1 + 4/K bytes a weight held instead of 2 + 1 + 4/K (BF16: 2), and such a system runs in
a process of its own (w12/attach.claim). weights/fp8_attach.py makes the forms at engine build and reports the
bytes per weight (`weight_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # torch.finfo(float8_e4m3fn).max
MAX_K = 2 ** 17  # past this many columns the reference's float64 sums could round (see the docstring)
_TINY = torch.finfo(torch.float32).tiny


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (q [..., K] float8_e4m3fn, scale [...] float32): q * scale approximates x, per row, with
    scale = amax(|row|) / 448 (1 for a row of zeros). Elementwise but for the row's own max: each row's result is
    its own, bitwise, whatever else x holds."""
    xf = x.float()
    amax = xf.abs().amax(-1)
    scale = torch.where(amax > 0, (amax / E4M3_MAX).clamp_min(_TINY), torch.ones_like(amax))
    q = (xf / scale.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q * scale per row, exactly: in float64 (a 4-bit E4M3 significand times a 24-bit float32 one fits 53 bits)."""
    return q.double() * scale.double().unsqueeze(-1)


def reference_mm(a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                 out_dtype: torch.dtype) -> torch.Tensor:
    """(a_q * a_scale) @ (w_q * w_scale)^T for a_q [M, K], w_q [N, K]: the FP8 values summed exactly in float64,
    scaled, rounded once to out_dtype. Row i depends on row i of a alone, bitwise."""
    if a_q.shape[-1] >= MAX_K:
        raise ValueError(f"the FP8 reference sums exactly for fewer than {MAX_K} columns, got {a_q.shape[-1]}")
    acc = a_q.double() @ w_q.double().t()
    return (acc * a_scale.double()[:, None] * w_scale.double()[None, :]).to(out_dtype)


def scaled_mm_runs(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why `torch._scaled_mm` (row-wise scales, BF16 out) cannot run the products here, or None when it can."""
    if device.type != "cuda":
        return f"the {device.type} runs the reference"
    if not hasattr(torch, "_scaled_mm"):
        return "this torch has no _scaled_mm"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        return f"the GPU's compute capability is {major}.{minor}; row-wise FP8 scaling needs 9.0+"
    if dtype != torch.bfloat16:
        return f"the model is {str(dtype).removeprefix('torch.')}; _scaled_mm's row-wise scaling writes BF16"
    return None


@dataclass
class Fp8Weight:
    """W [N, K] as FP8: q float8_e4m3fn [N, K] and a float32 scale per output channel [N]; fast: its products run
    `torch._scaled_mm` (decided once, at quantization: every call of this weight takes the same path)."""

    q: torch.Tensor
    scale: torch.Tensor
    fast: bool = False

    @classmethod
    def of(cls, w: torch.Tensor) -> Fp8Weight:
        """The FP8 form of w [N, K] (any float dtype), on w's device."""
        if w.dim() != 2 or not w.is_floating_point():
            raise ValueError(f"an FP8 weight is a floating-point matrix, got {tuple(w.shape)} {w.dtype}")
        q, scale = quantize_rows(w.detach())
        n, k = w.shape
        fast = scaled_mm_runs(w.device, w.dtype) is None and n % 16 == 0 and k % 16 == 0
        return cls(q, scale, fast)

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def bytes(self) -> int:
        return self.q.numel() * self.q.element_size() + self.scale.numel() * self.scale.element_size()

    def matrix(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W as this form holds it (q * scale), in dtype."""
        return dequantize(self.q, self.scale).to(dtype)


def product(x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """x [M, K] @ W^T -> [M, N] in x's dtype: x quantized per row, then `_scaled_mm` (w.fast, a BF16 x on the
    GPU) or the reference."""
    a_q, a_scale = quantize_rows(x)
    if w.fast and x.is_cuda and x.dtype == torch.bfloat16:
        return torch._scaled_mm(a_q, w.q.t(), scale_a=a_scale[:, None].contiguous(),
                                scale_b=w.scale[None, :].contiguous(), out_dtype=torch.bfloat16)
    return reference_mm(a_q, a_scale, w.q, w.scale, x.dtype)


def path(device: torch.device, dtype: torch.dtype) -> str:
    """What runs weights=fp8's products here, for the record."""
    why = scaled_mm_runs(device, dtype)
    if why is None:
        return "torch._scaled_mm (cuBLASLt FP8, row-wise scales); the reference for weights whose N or K is not a " \
               "multiple of 16"
    return f"the reference (FP8 operands summed exactly in float64; {why})"
