"""Weight-streaming GEMV for decode steps (a handful of rows): y[m, n] = sum_k x[m, k] W[n, k].

Each program owns BLOCK_N output columns and streams their weight rows once, BLOCK_K at a time, for
all rows of x together (rows padded to 16 so the product runs on the tensor cores; the weight bytes
are the cost, the arithmetic is free). Optional fusions, each removing a launch and a round trip:
  * norm prologue: x is RMS-normalised on the fly (every program recomputes the row statistics from
    L2, a few KB), so no separate norm kernel runs before the projection;
  * gate/up: the program also streams the matching rows of the up half and writes silu(gate) * up;
  * residual epilogue: y = residual + x W^T.
Rounding mirrors the references (normalised value, weight product, GEMM output, silu, residual sum
each rounded to the dtype), so the fused path computes what the unfused one does.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from specpilot.kernels.gemv import MAX_ROWS

ROWS = tl.constexpr(16)  # rows padded to the smallest tensor-core tile
_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
            for bn, bk, w, s in ((16, 512, 4, 4), (32, 256, 4, 4), (32, 512, 8, 3), (64, 256, 8, 3))]


@triton.jit
def _rows_rstd(x_ptr, stride_x, rows, rmask, K, eps, BLOCK_K: tl.constexpr):
    ss = tl.zeros([ROWS], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * stride_x + k[None, :], mask=rmask[:, None] & (k < K)[None, :],
                    other=0.0).to(tl.float32)
        ss += tl.sum(x * x, axis=1)
    return tl.rsqrt(ss / K + eps)


@triton.jit
def _gemv_kernel(x_ptr, nw_ptr, w_ptr, b_ptr, r_ptr, y_ptr, M, N, K, eps, stride_x, stride_r, stride_y,
                 HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, GATE_UP: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    dtype: tl.constexpr = y_ptr.dtype.element_ty
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    rows = tl.arange(0, ROWS)
    rmask = rows < M
    rstd = tl.full([ROWS], 1.0, dtype=tl.float32)
    if HAS_NORM:
        rstd = _rows_rstd(x_ptr, stride_x, rows, rmask, K, eps, BLOCK_K)
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    w_rows = n[:, None].to(tl.int64) * K
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        x = tl.load(x_ptr + rows[:, None] * stride_x + k[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        if HAS_NORM:
            h = (x.to(tl.float32) * rstd[:, None]).to(dtype).to(tl.float32)
            x = (h * tl.load(nw_ptr + k, mask=kmask, other=0.0).to(tl.float32)[None, :]).to(dtype)
        wmask = nmask[:, None] & kmask[None, :]
        w = tl.load(w_ptr + w_rows + k[None, :], mask=wmask, other=0.0)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        if GATE_UP:  # the up rows sit N rows below the gate rows in the fused weight
            w_up = tl.load(w_ptr + w_rows + N.to(tl.int64) * K + k[None, :], mask=wmask, other=0.0)
            acc_up += tl.dot(x, tl.trans(w_up), input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)[None, :]
    out = acc.to(dtype).to(tl.float32)
    if GATE_UP:
        silu = (out / (1.0 + tl.exp(-out))).to(dtype).to(tl.float32)
        out = silu * acc_up.to(dtype).to(tl.float32)
    if HAS_RES:
        out = out + tl.load(r_ptr + rows[:, None] * stride_r + n[None, :], mask=rmask[:, None] & nmask[None, :],
                            other=0.0).to(tl.float32)
    tl.store(y_ptr + rows[:, None] * stride_y + n[None, :], out.to(dtype), mask=rmask[:, None] & nmask[None, :])


# Tuned per shape on the GPU at the first call (outside graph capture: the engine warms up first).
# Tests pass tune=False (one fixed config: compiling every config for every test shape takes minutes),
# and so does Triton's CPU interpreter, which cannot time configs.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_FIXED = {"BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 4}
_TUNED = triton.autotune(configs=_CONFIGS, key=["N", "K", "M", "HAS_NORM", "GATE_UP"])(_gemv_kernel)


def _rows(x: torch.Tensor, k: int) -> torch.Tensor:
    x2 = x.reshape(-1, k)
    if x2.shape[0] > MAX_ROWS:
        raise ValueError(f"the GEMV kernel takes at most {MAX_ROWS} rows, got {x2.shape[0]}")
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def gemv_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                norm_weight: torch.Tensor | None = None, eps: float = 0.0, residual: torch.Tensor | None = None,
                gate_up: bool = False, tune: bool = True, config: dict | None = None) -> torch.Tensor:
    """[.., K] -> [.., N] (N = weight rows, or half of them for gate_up); see the module docstring.
    tune: autotune per shape; else `config` (BLOCK_N, BLOCK_K, num_warps, num_stages) or a fixed one."""
    rows_w, k = weight.shape
    n = rows_w // 2 if gate_up else rows_w
    x2 = _rows(x, k)
    y = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
    r2 = residual.reshape(-1, n) if residual is not None else y
    args = (x2, norm_weight if norm_weight is not None else x2, weight, bias if bias is not None else weight, r2, y,
            x2.shape[0], n, k, eps, x2.stride(0), r2.stride(0), y.stride(0))
    flags = dict(HAS_NORM=norm_weight is not None, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
                 GATE_UP=gate_up)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
    if config is not None:
        _gemv_kernel[grid](*args, **flags, **config)
    elif tune and not _INTERPRET:
        _TUNED[grid](*args, **flags)
    else:
        _gemv_kernel[grid](*args, **flags, **_FIXED)
    return y.view(*x.shape[:-1], n)
