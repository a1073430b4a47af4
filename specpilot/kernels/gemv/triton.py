"""Weight-streaming GEMV for decode steps (a handful of rows): y[m, n] = sum_k x[m, k] W[n, k].

Each program owns BLOCK_N output columns and streams their weight rows once, in BLOCK_K chunks, for
all M rows of x at once (M <= 4: the rows share every weight byte read). The SwiGLU variant owns
columns j of both halves of the fused gate/up weight and writes silu(gate) * up directly, so the
[M, 2I] intermediate never reaches memory and one launch disappears.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from specpilot.kernels.gemv import MAX_ROWS

_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
            for bn, bk, w, s in ((16, 512, 4, 4), (32, 256, 4, 4), (32, 512, 8, 3), (8, 1024, 4, 4))]


@triton.jit
def _dot_rows(acc0, acc1, acc2, acc3, x_ptr, stride_x, w, k, kmask, M: tl.constexpr):
    x0 = tl.load(x_ptr + k, mask=kmask, other=0.0).to(tl.float32)
    acc0 += tl.sum(w * x0[None, :], axis=1)
    if M > 1:
        x1 = tl.load(x_ptr + stride_x + k, mask=kmask, other=0.0).to(tl.float32)
        acc1 += tl.sum(w * x1[None, :], axis=1)
    if M > 2:
        x2 = tl.load(x_ptr + 2 * stride_x + k, mask=kmask, other=0.0).to(tl.float32)
        acc2 += tl.sum(w * x2[None, :], axis=1)
    if M > 3:
        x3 = tl.load(x_ptr + 3 * stride_x + k, mask=kmask, other=0.0).to(tl.float32)
        acc3 += tl.sum(w * x3[None, :], axis=1)
    return acc0, acc1, acc2, acc3


@triton.jit
def _stream(x_ptr, stride_x, w_ptr, n, nmask, K, M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    acc0 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * K + k[None, :], mask=nmask[:, None] & kmask[None, :],
                    other=0.0).to(tl.float32)
        acc0, acc1, acc2, acc3 = _dot_rows(acc0, acc1, acc2, acc3, x_ptr, stride_x, w, k, kmask, M)
    return acc0, acc1, acc2, acc3


@triton.jit
def _store_row(y_ptr, acc, b_ptr, n, nmask, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)
    tl.store(y_ptr + n, acc.to(y_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, stride_x, stride_y, M: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    acc0, acc1, acc2, acc3 = _stream(x_ptr, stride_x, w_ptr, n, nmask, K, M, BLOCK_N, BLOCK_K)
    _store_row(y_ptr, acc0, b_ptr, n, nmask, HAS_BIAS)
    if M > 1:
        _store_row(y_ptr + stride_y, acc1, b_ptr, n, nmask, HAS_BIAS)
    if M > 2:
        _store_row(y_ptr + 2 * stride_y, acc2, b_ptr, n, nmask, HAS_BIAS)
    if M > 3:
        _store_row(y_ptr + 3 * stride_y, acc3, b_ptr, n, nmask, HAS_BIAS)


@triton.jit
def _silu_mul_rows(y_ptr, g, u, n, nmask, dtype: tl.constexpr):
    s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)  # rounded as the reference rounds silu
    tl.store(y_ptr + n, (s * u.to(dtype).to(tl.float32)).to(dtype), mask=nmask)


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, y_ptr, I, K, stride_x, stride_y, M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < I
    g0, g1, g2, g3 = _stream(x_ptr, stride_x, w_ptr, n, nmask, K, M, BLOCK_N, BLOCK_K)
    u0, u1, u2, u3 = _stream(x_ptr, stride_x, w_ptr + I.to(tl.int64) * K, n, nmask, K, M, BLOCK_N, BLOCK_K)
    dtype: tl.constexpr = y_ptr.dtype.element_ty
    # gate and up are rounded to the dtype first, as the reference's separate GEMM output would be
    _silu_mul_rows(y_ptr, g0.to(dtype).to(tl.float32), u0, n, nmask, dtype)
    if M > 1:
        _silu_mul_rows(y_ptr + stride_y, g1.to(dtype).to(tl.float32), u1, n, nmask, dtype)
    if M > 2:
        _silu_mul_rows(y_ptr + 2 * stride_y, g2.to(dtype).to(tl.float32), u2, n, nmask, dtype)
    if M > 3:
        _silu_mul_rows(y_ptr + 3 * stride_y, g3.to(dtype).to(tl.float32), u3, n, nmask, dtype)


# Tuned per shape on the GPU at the first call (outside graph capture: the engine warms up first).
# Tests pass tune=False (one fixed config: compiling every config for every test shape takes minutes),
# and so does Triton's CPU interpreter, which cannot time configs.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_FIXED = {"BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 4}
_TUNED = {
    _gemv_kernel: triton.autotune(configs=_CONFIGS, key=["N", "K", "M"])(_gemv_kernel),
    _gate_up_kernel: triton.autotune(configs=_CONFIGS, key=["I", "K", "M"])(_gate_up_kernel),
}


def _launch(kernel, grid, args, tune: bool, **kw) -> None:
    if tune and not _INTERPRET:
        _TUNED[kernel][grid](*args, **kw)
    else:
        kernel[grid](*args, **kw, **_FIXED)


def _rows(x: torch.Tensor, k: int) -> torch.Tensor:
    x2 = x.reshape(-1, k)
    if x2.shape[0] > MAX_ROWS:
        raise ValueError(f"the GEMV kernel takes at most {MAX_ROWS} rows, got {x2.shape[0]}")
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  tune: bool = True) -> torch.Tensor:
    n, k = weight.shape
    x2 = _rows(x, k)
    y = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
    args = (x2, weight, bias if bias is not None else weight, y, n, k, x2.stride(0), y.stride(0))
    _launch(_gemv_kernel, grid, args, tune, M=x2.shape[0], HAS_BIAS=bias is not None)
    return y.view(*x.shape[:-1], n)


def gate_up_silu_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                        tune: bool = True) -> torch.Tensor:
    if bias is not None:
        raise ValueError("the fused gate/up GEMV has no bias path")
    two_i, k = weight.shape
    inter = two_i // 2
    x2 = _rows(x, k)
    y = torch.empty(x2.shape[0], inter, dtype=x.dtype, device=x.device)
    grid = lambda meta: (triton.cdiv(inter, meta["BLOCK_N"]),)  # noqa: E731
    _launch(_gate_up_kernel, grid, (x2, weight, y, inter, k, x2.stride(0), y.stride(0)), tune, M=x2.shape[0])
    return y.view(*x.shape[:-1], inter)
