"""RMSNorm (optionally fused with the residual add before it) as one Triton kernel per call.

One program per row; a row is read in chunks (two passes: sum of squares, then scale), so any hidden
size works. Rounding follows the reference: the sum in float32, the normalised value rounded to the
input dtype before the weight multiplies it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, d_ptr, w_ptr, s_ptr, y_ptr, n_cols, eps,
                     HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n_cols
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        m = cols < n_cols
        v = tl.load(x_row + cols, mask=m, other=0.0)
        if HAS_DELTA:
            v = (v.to(tl.float32) + tl.load(d_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32))
            v = v.to(y_ptr.dtype.element_ty)
            tl.store(s_ptr + row * n_cols + cols, v, mask=m)
        v = v.to(tl.float32)
        acc += v * v
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    src = s_ptr if HAS_DELTA else x_ptr
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        m = cols < n_cols
        v = tl.load(src + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
        h = (v * rstd).to(y_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * n_cols + cols, (w * h).to(y_ptr.dtype.element_ty), mask=m)


def _launch(x, delta, weight, eps):
    n = x.shape[-1]
    x2 = x.contiguous()
    y = torch.empty_like(x2)
    s = torch.empty_like(x2) if delta is not None else y
    d = delta.contiguous() if delta is not None else x2
    rows = x2.numel() // n
    block = min(triton.next_power_of_2(n), 2048)
    _rms_norm_kernel[(rows,)](x2, d, weight, s, y, n, eps, HAS_DELTA=delta is not None, BLOCK=block,
                              num_warps=4 if block <= 1024 else 8)
    return s, y


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _launch(x, None, weight, eps)[1]


def add_rms_norm_triton(x, delta, weight, eps):
    return _launch(x, delta, weight, eps)
