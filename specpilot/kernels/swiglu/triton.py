"""silu(gate) * up in one pass over the fused [gate | up] projection output, rounded like the reference
(silu rounded to the dtype, then the product rounded)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < inter
    g = tl.load(gu_ptr + row * 2 * inter + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * inter + inter + cols, mask=m, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * inter + cols, (s * u).to(out_ptr.dtype.element_ty), mask=m)


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    gu = gate_up.contiguous()
    inter = gu.shape[-1] // 2
    out = torch.empty(*gu.shape[:-1], inter, dtype=gu.dtype, device=gu.device)
    rows = gu.numel() // (2 * inter)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(inter, block))](gu, out, inter, BLOCK=block, num_warps=4)
    return out
