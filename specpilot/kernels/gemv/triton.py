"""Weight-streaming GEMV for decode steps (a handful of rows): y[m, n] = sum_k x[m, k] W[n, k].

One row (the AR decode step) goes through `_stream_kernel`: each program owns BLOCK_N outputs and
streams their weight rows BLOCK_K at a time, multiply-accumulating in float32 on the CUDA cores (no
tensor-core padding). With programmatic dependent launch (Hopper; kernels/dispatch.pdl_on) it loads its first
PRE weight tiles (a step-tuned depth) before waiting for the previous kernel's output and lets the next
kernel start after its own last weight load, so weight streaming continues across kernel boundaries,
and through the latency-bound attention before the output projection; with L2PRE (step-tuned too) it
first asks the L2 for all its weight rows, which no register budget limits. The norm prologue
here is one pass: the row's sum of squares accumulates beside the product and scales it at the end
(exact in real arithmetic; rounding differs from the reference's intermediate roundings).

Two to four rows go through `_gemv_kernel`: each program owns BLOCK_N output columns and streams
their weight rows once, BLOCK_K at a time, for all rows of x together (rows padded to 16 so the
product runs on the tensor cores; the weight bytes are the cost, the arithmetic is free).

Optional fusions in both, each removing a launch and a round trip:
  * norm prologue: x is RMS-normalised on the fly (every program recomputes the row statistics from
    L2, a few KB), so no separate norm kernel runs before the projection;
  * gate/up: the program also streams the matching rows of the up half and writes silu(gate) * up;
  * residual epilogue: y = residual + x W^T.
In `_gemv_kernel` rounding mirrors the references (normalised value, weight product, GEMM output,
silu, residual sum each rounded to the dtype), so the fused path computes what the unfused one does.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from specpilot.kernels.dispatch import pdl_on
from specpilot.kernels.gemv import MAX_ROWS
from specpilot.kernels.gemv.choice import CANDIDATES, step_config
from specpilot.kernels.trace import opening, stamp
from specpilot.kernels.trace import slot as trace_slot

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


@triton.jit
def _stream_kernel(x_ptr, nw_ptr, w_ptr, b_ptr, r_ptr, y_ptr, trace_ptr, N, K, eps,
                   HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, GATE_UP: tl.constexpr,
                   USE_GDC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PRE: tl.constexpr = 1, TRACE: tl.constexpr = False,
                   X2D: tl.constexpr = True, L2PRE: tl.constexpr = 0):
    dtype: tl.constexpr = y_ptr.dtype.element_ty
    rec = trace_ptr + tl.program_id(0) * 5  # this block's record (kernels/trace.py) when TRACE
    if TRACE:
        opening(rec)
    if L2PRE:  # before the PDL wait: weights only (see _l2_prefetch_rows)
        n0 = tl.program_id(0) * BLOCK_N
        _l2_prefetch_rows(w_ptr, n0, N, K, BLOCK_N)
        if GATE_UP:
            _l2_prefetch_rows(w_ptr + N.to(tl.int64) * K, n0, N, K, BLOCK_N)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    w_rows = w_ptr + n[:, None].to(tl.int64) * K
    up_rows = w_rows + N.to(tl.int64) * K  # the up rows sit N rows below the gate rows
    out, out_up = _stream_rows(x_ptr, nw_ptr, w_rows, up_rows, nmask, K, eps, HAS_NORM, GATE_UP, USE_GDC,
                               BLOCK_N, BLOCK_K, EVEN_N, EVEN_K, PRE, rec, TRACE, X2D)
    if HAS_BIAS:
        out += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)
    out = out.to(dtype).to(tl.float32)
    if GATE_UP:
        silu = (out / (1.0 + tl.exp(-out))).to(dtype).to(tl.float32)
        out = silu * out_up.to(dtype).to(tl.float32)
    if HAS_RES:
        out = out + tl.load(r_ptr + n, mask=nmask, other=0.0).to(tl.float32)
    tl.store(y_ptr + n, out.to(dtype), mask=nmask)
    if TRACE:
        stamp(rec, 3)  # END


@triton.jit
def _l2_prefetch_rows(w_ptr, n0, N, K, BLOCK_N: tl.constexpr):
    """Ask the L2 for weight rows n0 .. n0 + BLOCK_N - 1 (those below N), one bulk prefetch a row from one
    thread (no registers held, nothing to wait for). A block launched before the previous kernel ends,
    like the output projection's during the attention, so keeps DRAM busy while it waits, far beyond the
    PRE tiles its registers hold; its loads after the wait then hit the L2. Rows must start 16-byte
    aligned (the host checks K)."""
    nbytes = (K * (w_ptr.dtype.element_ty.primitive_bitwidth // 8)).to(tl.int32)
    for r in tl.static_range(BLOCK_N):
        if n0 + r < N:
            row = (w_ptr + (n0 + r).to(tl.int64) * K).to(tl.int64, bitcast=True)
            tl.inline_asm_elementwise(
                "{ .reg .pred p; .reg .b32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
                "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
                "=r,l,r", [row, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _stream_rows(x_ptr, nw_ptr, rows, rows2, nmask, K, eps, HAS_NORM: tl.constexpr, TWO: tl.constexpr,
                 USE_GDC: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr,
                 EVEN_K: tl.constexpr, PRE: tl.constexpr, rec, TRACE: tl.constexpr, X2D: tl.constexpr):
    """sum_k W[r, k] x'[k] for ROWS weight rows (and, with TWO, for a second set of ROWS rows), with
    x' = rms_norm(x) * norm weight when HAS_NORM (one pass: the row's rstd scales the sums at the end).
    The first PRE weight tiles (one wide tile; the host keeps PRE * BLOCK_K <= K where K is a multiple of
    BLOCK_K) stream before the PDL wait: no earlier kernel writes weights, so a kernel launched early
    streams while the one before it finishes. After the last weight load the next kernel may start.
    X2D: x comes as a [ROWS, BLOCK_K] tile (see _row_tile); else as a vector broadcast over the rows."""
    kp = tl.arange(0, PRE * BLOCK_K)
    wp = _tile(rows, 0, kp, nmask, K, EVEN_N, EVEN_K)
    wp2 = wp
    if TWO:
        wp2 = _tile(rows2, 0, kp, nmask, K, EVEN_N, EVEN_K)
    if USE_GDC:  # from here on the previous kernel's writes (x, residual) are complete and visible
        tl.extra.cuda.gdc_wait()
    if TRACE:
        stamp(rec, 1)  # WAITED
    xp, sqp = _row_tile(x_ptr, nw_ptr, 0, kp, K, HAS_NORM, EVEN_K, ROWS, X2D)
    head = tl.sum(wp.to(tl.float32) * xp, axis=1)
    head2 = head
    if TWO:
        head2 = tl.sum(wp2.to(tl.float32) * xp, axis=1)
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
    acc2 = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
    ss = tl.zeros([ROWS if X2D else 1, BLOCK_K], dtype=tl.float32)
    for i in range(PRE, tl.cdiv(K, BLOCK_K)):
        k0 = i * BLOCK_K
        w = _tile(rows, k0, k, nmask, K, EVEN_N, EVEN_K)
        x, sq = _row_tile(x_ptr, nw_ptr, k0, k, K, HAS_NORM, EVEN_K, ROWS, X2D)
        if HAS_NORM:
            ss += sq
        acc += w.to(tl.float32) * x
        if TWO:
            acc2 += _tile(rows2, k0, k, nmask, K, EVEN_N, EVEN_K).to(tl.float32) * x
    if TRACE:
        stamp(rec, 2)  # STREAMED
    if USE_GDC:
        tl.extra.cuda.gdc_launch_dependents()
    out = tl.sum(acc, axis=1) + head
    out2 = tl.sum(acc2, axis=1) + head2
    if HAS_NORM:  # every row of ss (and sqp) holds the same squares: a per-row rstd, equal on all rows
        rstd = tl.rsqrt((tl.sum(ss, axis=1) + tl.sum(sqp, axis=1)) / K + eps)
        out = out * rstd
        out2 = out2 * rstd
    return out, out2


@triton.jit
def _row_tile(x_ptr, nw_ptr, k0, k, K, HAS_NORM: tl.constexpr, EVEN_K: tl.constexpr, ROWS: tl.constexpr,
              X2D: tl.constexpr):
    """x[k0 + k] in float32 (times the norm weight when HAS_NORM) and its squares, for the row's rstd,
    shaped to multiply a [ROWS, len(k)] weight tile. X2D: loaded as a [ROWS, len(k)] tile whose rows
    all read the same addresses (L1 hits), so it takes the weight tile's layout; a [len(k)] vector
    broadcast over the rows instead goes through shared memory with two barriers every loop step,
    up to six with the norm (PTX of the sm_90 build), which stalls a kernel whose whole job is keeping
    loads in flight. Else that vector, as [1, len(k)] (SPECPILOT_GEMV_X=1d, for comparison)."""
    if X2D:
        offs = k0 + k[None, :] + tl.zeros([ROWS], dtype=tl.int32)[:, None]
    else:
        offs = k0 + k
    if EVEN_K:
        x = tl.load(x_ptr + offs).to(tl.float32)
    else:
        x = tl.load(x_ptr + offs, mask=offs < K, other=0.0).to(tl.float32)
    sq = x * x
    if HAS_NORM:
        if EVEN_K:
            x = x * tl.load(nw_ptr + offs).to(tl.float32)
        else:
            x = x * tl.load(nw_ptr + offs, mask=offs < K, other=0.0).to(tl.float32)
    if not X2D:
        x = x[None, :]
        sq = sq[None, :]
    return x, sq


@triton.jit
def _tile(rows, k0, k, nmask, K, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr):
    if EVEN_N and EVEN_K:
        return tl.load(rows + k0 + k[None, :])
    return tl.load(rows + k0 + k[None, :], mask=nmask[:, None] & (k0 + k < K)[None, :], other=0.0)


# Triton's autotuner is the fallback when no config was chosen in a captured step (choice.py); same candidates.
_STREAM_CONFIGS = [triton.Config({"BLOCK_N": c["BLOCK_N"], "BLOCK_K": c["BLOCK_K"]}, num_warps=c["num_warps"],
                                 num_stages=c["num_stages"]) for c in CANDIDATES["gemv"]
                   if c["PRE"] == 1 and not c["L2PRE"]]
_EVEN = triton.heuristics({"EVEN_N": lambda a: a["N"] % a["BLOCK_N"] == 0,
                           "EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0})
_STREAM = _EVEN(_stream_kernel)
_STREAM_TUNED = triton.autotune(configs=_STREAM_CONFIGS, key=["N", "K", "HAS_NORM", "GATE_UP"])(_STREAM)


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
    if x2.shape[0] == 1:
        _stream(args, flags, grid, x, tune, config)
    elif config is not None:  # PRE and L2PRE belong to the one-row kernel
        _gemv_kernel[grid](*args, **flags, **{key: v for key, v in config.items() if key not in ("PRE", "L2PRE")})
    elif tune and not _INTERPRET:
        _TUNED[grid](*args, **flags)
    else:
        _gemv_kernel[grid](*args, **flags, **_FIXED)
    return y.view(*x.shape[:-1], n)


def pre_clamped(config: dict, k: int) -> dict:
    """The config with PRE (weight tiles streamed before the PDL wait, one tile of PRE * BLOCK_K) cut to
    the tiles K holds whole, rounded down to a power of two (a tile's width must be one)."""
    if config.get("PRE", 1) == 1:
        return config
    pre = max(1, min(config["PRE"], k // config["BLOCK_K"]))
    return {**config, "PRE": 1 << (pre.bit_length() - 1)}


def x_tiles() -> bool:
    """How the one-row kernels read x: as tiles shaped like the weight tile (default) or, with
    SPECPILOT_GEMV_X=1d, as a vector broadcast over the rows (the earlier kernels; see _row_tile)."""
    mode = os.environ.get("SPECPILOT_GEMV_X", "").strip().lower()
    if mode not in ("", "2d", "1d"):
        raise ValueError(f"SPECPILOT_GEMV_X={mode!r}: expected 2d (the default) or 1d")
    return mode != "1d"


def _stream(args: tuple, flags: dict, grid, x: torch.Tensor, tune: bool, config: dict | None) -> None:
    x2, nw, w, b, r2, y, _, n, k, eps = args[:10]
    pdl = pdl_on(x, default=True)  # the one-row kernel runs only in the `gemv` decode step
    config = config or step_config(("gemv", n, k, *sorted(flags.items())))
    if config is not None:
        config = pre_clamped(config, k)
        if config.get("L2PRE") and not (pdl and (k * w.element_size()) % 16 == 0):
            config = {**config, "L2PRE": 0}  # nothing to overlap without PDL; rows must be 16-byte aligned
        rec, traced = trace_slot(f"gemv {n}x{k}{' gate_up' if flags['GATE_UP'] else ''}",
                                 triton.cdiv(n, config["BLOCK_N"]), y)
        _STREAM[grid](x2, nw, w, b, r2, y, rec, n, k, eps, **flags, USE_GDC=pdl, TRACE=traced, X2D=x_tiles(),
                      **config, **({"launch_pdl": True} if pdl else {}))
        return
    call = (x2, nw, w, b, r2, y, y, n, k, eps)  # untraced (the trace needs the chosen config's grid)
    launch = {"launch_pdl": True} if pdl else {}
    if tune and not _INTERPRET:
        _STREAM_TUNED[grid](*call, **flags, USE_GDC=pdl, X2D=x_tiles(), **launch)
    else:
        _STREAM[grid](*call, **flags, USE_GDC=pdl, X2D=x_tiles(), **_FIXED, **launch)
