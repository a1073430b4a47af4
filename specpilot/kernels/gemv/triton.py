"""Weight-streaming GEMV for decode steps (a handful of rows): y[m, n] = sum_k x[m, k] W[n, k].

One row (the AR decode step) goes through `_stream_kernel`: each program owns BLOCK_N outputs and
streams their weight rows BLOCK_K at a time, multiply-accumulating in float32 on the CUDA cores (no
tensor-core padding). With programmatic dependent launch (Hopper; kernels/dispatch.pdl_on) it loads its first
PRE weight tiles (a step-tuned depth) before waiting for the previous kernel's output and lets the next
kernel start after its own last weight load, so weight streaming continues across kernel boundaries,
and through the latency-bound attention before the output projection. The norm prologue here is one
pass: the row's sum of squares accumulates beside the product and scales it at the end (exact in real
arithmetic; rounding differs from the reference's intermediate roundings). Better still, the kernel
that wrote the residual stream hands the norm its inputs (h * g and sums of squares, NormedStream),
and the weight loop is the plain one.

Two to four rows go through `_gemv_kernel`: each program owns BLOCK_N output columns and streams
their weight rows once, BLOCK_K at a time, for all rows of x together (rows padded to 16 so the
product runs on the tensor cores; the weight bytes are the cost, the arithmetic is free).

Optional fusions in both, each removing a launch and a round trip:
  * norm prologue: x is RMS-normalised on the fly (every program recomputes the row statistics from
    L2, a few KB), so no separate norm kernel runs before the projection;
  * gate/up: the program also streams the matching rows of the up half and writes silu(gate) * up;
  * residual epilogue: y = residual + x W^T, and (one row, next_norm) the hand-over to the next norm.
In `_gemv_kernel` rounding mirrors the references (normalised value, weight product, GEMM output,
silu, residual sum each rounded to the dtype), so the fused path computes what the unfused one does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specpilot.config.plan import KernelPlan
from specpilot.kernels.dispatch import interpreting, pdl_on
from specpilot.kernels.gemv import MAX_ROWS, NormedStream, norm_input, stream_of, weight_eviction
from specpilot.kernels.tuning.candidates import GEMV

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
def _stream_kernel(x_ptr, nw_ptr, w_ptr, b_ptr, r_ptr, y_ptr, g_ptr, xg_ptr, sq_ptr, parts_ptr, n_parts,
                   N, K, eps, HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                   GATE_UP: tl.constexpr, USE_GDC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PRE: tl.constexpr = 1,
                   NEXT: tl.constexpr = False, NPARTS: tl.constexpr = 0, AHEAD: tl.constexpr = False,
                   EVICT: tl.constexpr = "", EPI_EARLY: tl.constexpr = False):
    """NEXT: also write, for the norm (weight g) that reads y, y * g (in y's dtype: as an x the loop loads it
    like any other) and this block's sum of y^2 in float32 (the y stored, rounded). NPARTS (a power of
    two >= n_parts, or 0): x is such an h * g, its rstd comes from the n_parts sums at parts_ptr.
    AHEAD: loads one loop step ahead, EVICT: the weights' L2 eviction policy (_stream_open). EPI_EARLY: the
    epilogue's inputs (bias, residual, the next norm's weight) are requested right after the PDL wait, before
    the weight loop, so that their round trip is not added to the kernel's end (which the next kernel's wait
    waits for)."""
    dtype: tl.constexpr = y_ptr.dtype.element_ty
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    w_rows = w_ptr + n[:, None].to(tl.int64) * K
    up_rows = w_rows + N.to(tl.int64) * K  # the up rows sit N rows below the gate rows
    wp, wp2 = _stream_open(w_rows, up_rows, nmask, K, GATE_UP, USE_GDC, BLOCK_K, EVEN_N, EVEN_K, PRE, EVICT)
    if EPI_EARLY:
        bias, res, g = _epilogue_inputs(b_ptr, r_ptr, g_ptr, n, nmask, HAS_BIAS, HAS_RES, NEXT)
    out, out_up = _stream_rest(wp, wp2, x_ptr, nw_ptr, w_rows, up_rows, nmask, K, eps, HAS_NORM, GATE_UP, USE_GDC,
                               BLOCK_N, BLOCK_K, EVEN_N, EVEN_K, PRE, parts_ptr, n_parts, NPARTS, AHEAD, EVICT)
    if not EPI_EARLY:
        bias, res, g = _epilogue_inputs(b_ptr, r_ptr, g_ptr, n, nmask, HAS_BIAS, HAS_RES, NEXT)
    if HAS_BIAS:
        out += bias
    out = out.to(dtype).to(tl.float32)
    if GATE_UP:
        silu = (out / (1.0 + tl.exp(-out))).to(dtype).to(tl.float32)
        out = silu * out_up.to(dtype).to(tl.float32)
    if HAS_RES:
        out = out + res
    tl.store(y_ptr + n, out.to(dtype), mask=nmask)
    if NEXT:
        stored = tl.where(nmask, out.to(dtype).to(tl.float32), 0.0)
        tl.store(xg_ptr + n, (stored * g).to(dtype), mask=nmask)
        tl.store(sq_ptr + tl.program_id(0), tl.sum(stored * stored, axis=0))


@triton.jit
def _epilogue_inputs(b_ptr, r_ptr, g_ptr, n, nmask, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                     NEXT: tl.constexpr):
    """The one-row kernel's epilogue inputs in float32 (zeros where a flag is off): bias, residual, the next
    norm's weight."""
    zero = tl.zeros(n.shape, dtype=tl.float32)
    bias = tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32) if HAS_BIAS else zero
    res = tl.load(r_ptr + n, mask=nmask, other=0.0).to(tl.float32) if HAS_RES else zero
    g = tl.load(g_ptr + n, mask=nmask, other=0.0).to(tl.float32) if NEXT else zero
    return bias, res, g


@triton.jit
def _stream_open(rows, rows2, nmask, K, TWO: tl.constexpr, USE_GDC: tl.constexpr, BLOCK_K: tl.constexpr,
                 EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PRE: tl.constexpr, EVICT: tl.constexpr):
    """The one-row weight stream, in two halves so that a caller can request its epilogue's inputs in between
    (after the wait, before the loop): this one, then _stream_rest with the tiles it returns.

    sum_k W[r, k] x'[k] for ROWS weight rows (and, with TWO, for a second set of ROWS rows), with
    x' = rms_norm(x) * norm weight when HAS_NORM (one pass: the row's rstd scales the sums at the end)
    or when NPARTS (x is x * norm weight already, the sums of squares come in n_parts pieces).
    The first PRE weight tiles (one wide tile; the host keeps PRE * BLOCK_K <= K where K is a multiple of
    BLOCK_K) stream before the PDL wait: no earlier kernel writes weights, so a kernel launched early
    streams while the one before it finishes. After the last weight load the next kernel may start.
    AHEAD: every step of the loop requests the next step's weight and x tiles before it computes on its
    own, and the loop's first tiles are requested before anything waits on x, so after the PDL wait the
    weight stream resumes at once instead of after x's round trip. Same arithmetic either way.
    EVICT: the weight loads' L2 eviction policy (kernels/gemv.weight_eviction).
    Returns the first tiles (the second row set's too: the first's again without TWO)."""
    kp = tl.arange(0, PRE * BLOCK_K)
    wp = _tile(rows, 0, kp, nmask, K, EVEN_N, EVEN_K, EVICT)
    wp2 = wp
    if TWO:
        wp2 = _tile(rows2, 0, kp, nmask, K, EVEN_N, EVEN_K, EVICT)
    if USE_GDC:  # from here on the previous kernel's writes (x, residual, sums) are complete and visible
        tl.extra.cuda.gdc_wait()
    return wp, wp2


@triton.jit
def _stream_rest(wp, wp2, x_ptr, nw_ptr, rows, rows2, nmask, K, eps, HAS_NORM: tl.constexpr, TWO: tl.constexpr,
                 USE_GDC: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr,
                 EVEN_K: tl.constexpr, PRE: tl.constexpr, parts_ptr, n_parts, NPARTS: tl.constexpr,
                 AHEAD: tl.constexpr, EVICT: tl.constexpr):
    """The stream's second half (_stream_open), after the wait: the weight loop over the tiles after the
    first PRE (wp, wp2) and the sums."""
    kp = tl.arange(0, PRE * BLOCK_K)
    if NPARTS:  # loaded now, summed at the end: the load's latency hides behind the weight stream
        p = tl.arange(0, NPARTS)
        parts = tl.load(parts_ptr + p, mask=p < n_parts, other=0.0)
    k = tl.arange(0, BLOCK_K)
    n_tiles = tl.cdiv(K, BLOCK_K)
    xp_raw = _x_tile(x_ptr, 0, kp, K, EVEN_K, ROWS, True)
    if AHEAD:
        more = PRE < n_tiles
        wn = _tile_if(rows, PRE * BLOCK_K, k, nmask, K, EVEN_N, EVEN_K, more, EVICT)
        wn2 = wn
        if TWO:
            wn2 = _tile_if(rows2, PRE * BLOCK_K, k, nmask, K, EVEN_N, EVEN_K, more, EVICT)
        xn = _x_tile(x_ptr, PRE * BLOCK_K, k, K, EVEN_K, ROWS, more)
    xp, sqp = _x_values(xp_raw, nw_ptr, 0, kp, K, HAS_NORM, EVEN_K, ROWS)
    head = tl.sum(wp.to(tl.float32) * xp, axis=1)
    head2 = head
    if TWO:
        head2 = tl.sum(wp2.to(tl.float32) * xp, axis=1)
    acc = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
    acc2 = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
    ss = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
    for i in range(PRE, n_tiles):
        k0 = i * BLOCK_K
        if AHEAD:  # this step's tiles arrived during the last one; ask for the next step's now
            w = wn
            w2 = wn2
            xr = xn
            more = i + 1 < n_tiles
            wn = _tile_if(rows, k0 + BLOCK_K, k, nmask, K, EVEN_N, EVEN_K, more, EVICT)
            if TWO:
                wn2 = _tile_if(rows2, k0 + BLOCK_K, k, nmask, K, EVEN_N, EVEN_K, more, EVICT)
            xn = _x_tile(x_ptr, k0 + BLOCK_K, k, K, EVEN_K, ROWS, more)
            x, sq = _x_values(xr, nw_ptr, k0, k, K, HAS_NORM, EVEN_K, ROWS)
        else:
            w = _tile(rows, k0, k, nmask, K, EVEN_N, EVEN_K, EVICT)
            x, sq = _x_values(_x_tile(x_ptr, k0, k, K, EVEN_K, ROWS, True), nw_ptr, k0, k, K, HAS_NORM, EVEN_K,
                              ROWS)
        if HAS_NORM:
            ss += sq
        acc += w.to(tl.float32) * x
        if TWO:
            if not AHEAD:
                w2 = _tile(rows2, k0, k, nmask, K, EVEN_N, EVEN_K, EVICT)
            acc2 += w2.to(tl.float32) * x
    if USE_GDC:
        tl.extra.cuda.gdc_launch_dependents()
    out = tl.sum(acc, axis=1) + head
    out2 = tl.sum(acc2, axis=1) + head2
    if HAS_NORM:  # every row of ss (and sqp) holds the same squares: a per-row rstd, equal on all rows
        rstd = tl.rsqrt((tl.sum(ss, axis=1) + tl.sum(sqp, axis=1)) / K + eps)
        out = out * rstd
        out2 = out2 * rstd
    if NPARTS:
        rstd = tl.rsqrt(tl.sum(parts, axis=0) / K + eps)
        out = out * rstd
        out2 = out2 * rstd
    return out, out2


@triton.jit
def _x_tile(x_ptr, k0, k, K, EVEN_K: tl.constexpr, ROWS: tl.constexpr, pred):
    """x[k0 + k] as it is stored, as a [ROWS, len(k)] tile whose rows all read the same addresses (L1
    hits): the weight tile's layout. A [len(k)] vector broadcast over the rows instead went through
    shared memory with two barriers every loop step, up to six with the norm (PTX of the sm_90 build),
    and made the 8B step 3.6% slower, the 27B 5.8% (bench/results/2026-11-30_engine_core_x_tiles_h200.json).
    pred: load at all (a scalar; False gives zeros)."""
    offs = k0 + k[None, :] + tl.zeros([ROWS], dtype=tl.int32)[:, None]
    if EVEN_K:
        return tl.load(x_ptr + offs, mask=pred, other=0.0)
    return tl.load(x_ptr + offs, mask=pred & (offs < K), other=0.0)


@triton.jit
def _x_values(xr, nw_ptr, k0, k, K, HAS_NORM: tl.constexpr, EVEN_K: tl.constexpr, ROWS: tl.constexpr):
    """An x tile (_x_tile) in float32, times the norm weight when HAS_NORM, and its squares (the row's rstd)."""
    x = xr.to(tl.float32)
    sq = x * x
    if HAS_NORM:
        offs = k0 + k[None, :] + tl.zeros([ROWS], dtype=tl.int32)[:, None]
        if EVEN_K:
            x = x * tl.load(nw_ptr + offs).to(tl.float32)
        else:
            x = x * tl.load(nw_ptr + offs, mask=offs < K, other=0.0).to(tl.float32)
    return x, sq


@triton.jit
def _tile_if(rows, k0, k, nmask, K, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, pred, EVICT: tl.constexpr = ""):
    """_tile, loaded only when pred (a scalar; else zeros): AHEAD's request for the next loop step."""
    if EVEN_N and EVEN_K:
        return tl.load(rows + k0 + k[None, :], mask=pred, other=0.0, eviction_policy=EVICT)
    return tl.load(rows + k0 + k[None, :], mask=pred & nmask[:, None] & (k0 + k < K)[None, :], other=0.0,
                   eviction_policy=EVICT)


@triton.jit
def _tile(rows, k0, k, nmask, K, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, EVICT: tl.constexpr = ""):
    """A [len(rows), len(k)] weight tile at column k0 (EVICT: its L2 eviction policy, kernels/gemv.weight_eviction)."""
    if EVEN_N and EVEN_K:
        return tl.load(rows + k0 + k[None, :], eviction_policy=EVICT)
    return tl.load(rows + k0 + k[None, :], mask=nmask[:, None] & (k0 + k < K)[None, :], other=0.0,
                   eviction_policy=EVICT)


# Triton's autotuner is the fallback when no config was chosen in a captured step (kernels/tuning); same
# candidates.
_STREAM_CONFIGS = [triton.Config({"BLOCK_N": c["BLOCK_N"], "BLOCK_K": c["BLOCK_K"]}, num_warps=c["num_warps"],
                                 num_stages=c["num_stages"]) for c in GEMV if c["PRE"] == 1]
_EVEN = triton.heuristics({"EVEN_N": lambda a: a["N"] % a["BLOCK_N"] == 0,
                           "EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0})
_STREAM = _EVEN(_stream_kernel)
_STREAM_TUNED = triton.autotune(configs=_STREAM_CONFIGS, key=["N", "K", "HAS_NORM", "GATE_UP", "NPARTS"])(_STREAM)


# Tuned per shape on the GPU at the first call (outside graph capture: the engine warms up first).
# Tests pass tune=False (one fixed config: compiling every config for every test shape takes minutes),
# and so does Triton's CPU interpreter, which cannot time configs.
_FIXED = {"BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 4}
_TUNED = triton.autotune(configs=_CONFIGS, key=["N", "K", "M", "HAS_NORM", "GATE_UP"])(_gemv_kernel)


def _rows(x: torch.Tensor, k: int) -> torch.Tensor:
    x2 = x.reshape(-1, k)
    if x2.shape[0] > MAX_ROWS:
        raise ValueError(f"the GEMV kernel takes at most {MAX_ROWS} rows, got {x2.shape[0]}")
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def gemv_triton(x, weight: torch.Tensor, bias: torch.Tensor | None = None, *, plan: KernelPlan,
                norm_weight: torch.Tensor | None = None, eps: float = 0.0, residual: torch.Tensor | None = None,
                gate_up: bool = False, tune: bool = True, config: dict | None = None,
                next_norm: torch.Tensor | None = None):
    """[.., K] -> [.., N] (N = weight rows, or half of them for gate_up); see the module docstring.
    tune: autotune per shape; else `config` (BLOCK_N, BLOCK_K, num_warps, num_stages) or a fixed one.
    x may be a NormedStream (kernels/gemv): when norm_weight is its norm's, its handed-over h * g and sums
    replace the norm prologue. next_norm: a one-row call returns a NormedStream for that norm (unless the
    plan's `handoff` is off). The plan also gives the launch (PDL), the load schedule (`ahead`,
    `epilogue_early`), the L2 hints and, from its tuning table, the chosen config of a one-row key. The
    weight must be contiguous: the kernels step K elements a row."""
    rows_w, k = weight.shape
    n = rows_w // 2 if gate_up else rows_w
    h = stream_of(x)
    xin, sumsq = norm_input(x, norm_weight)
    handed = sumsq is not None
    x2 = _rows(xin, k)
    if not weight.is_contiguous():
        raise ValueError("the GEMV kernels take a contiguous weight")
    y = torch.empty(x2.shape[0], n, dtype=h.dtype, device=h.device)
    r2 = residual.reshape(-1, n) if residual is not None else y
    nw = norm_weight if norm_weight is not None and not handed else x2
    flags = dict(HAS_NORM=norm_weight is not None and not handed, HAS_BIAS=bias is not None,
                 HAS_RES=residual is not None, GATE_UP=gate_up)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
    if x2.shape[0] == 1:
        out = _stream((x2, nw, weight, bias if bias is not None else weight, r2, y), n, k, eps, flags, tune, config,
                      sumsq, next_norm if plan.handoff else None, plan)
        shape = (*h.shape[:-1], n)
        if isinstance(out, tuple):
            return NormedStream(y.view(shape), out[0].view(shape), out[1], next_norm)
        return y.view(shape)
    args = (x2, nw, weight, bias if bias is not None else weight, r2, y, x2.shape[0], n, k, eps, x2.stride(0),
            r2.stride(0), y.stride(0))
    if config is not None:  # PRE and AHEAD belong to the one-row kernel
        _gemv_kernel[grid](*args, **flags, **{key: v for key, v in config.items()
                                              if key not in ("PRE", "AHEAD", "STAGE")})
    elif tune and not interpreting():
        _TUNED[grid](*args, **flags)
    else:
        _gemv_kernel[grid](*args, **flags, **_FIXED)
    return y.view(*h.shape[:-1], n)


def ahead_fits(rows: int, config: dict, in_loop_norm: bool, plan: KernelPlan) -> bool:
    """Whether the loop loads one step ahead (the plan's `ahead`, and the config's AHEAD, the step tuning's
    choice) for a program streaming `rows` weight rows (both sets) in tiles of config's BLOCK_K: only where a
    thread's share of a step's tiles, weights and (with the in-loop norm) norm weights, is at most 64
    elements. Holding two steps of larger shares spilled registers in the sm_90 build (gate/up at 4 warps
    and 512 columns: tests/test_kernels_compile.py)."""
    share = rows * config["BLOCK_K"] * (2 if in_loop_norm else 1) // (32 * config.get("num_warps", 4))
    return plan.ahead and config.get("AHEAD", True) and share <= 64


def launch_config(config: dict) -> dict:
    """A chosen config as launch arguments: AHEAD, the step tuning's choice, goes through ahead_fits."""
    return {key: v for key, v in config.items() if key != "AHEAD"}


def pre_clamped(config: dict, k: int) -> dict:
    """The config with PRE (weight tiles streamed before the PDL wait, one tile of PRE * BLOCK_K) cut to
    the tiles K holds whole, rounded down to a power of two (a tile's width must be one)."""
    if config.get("PRE", 1) == 1:
        return config
    pre = max(1, min(config["PRE"], k // config["BLOCK_K"]))
    return {**config, "PRE": 1 << (pre.bit_length() - 1)}


def parts_args(sumsq: torch.Tensor | None, like: torch.Tensor) -> tuple[tuple, int]:
    """(parts_ptr, n_parts) and NPARTS for a kernel that reads a NormedStream's sums (0: none)."""
    if sumsq is None:
        return (like, 0), 0
    return (sumsq, sumsq.numel()), triton.next_power_of_2(sumsq.numel())


def _stream(tensors: tuple, n: int, k: int, eps: float, flags: dict, tune: bool, config: dict | None,
            sumsq: torch.Tensor | None, next_norm: torch.Tensor | None, plan: KernelPlan):
    """Launch the one-row kernel; with next_norm also the hand-over to the next norm: returns (h * g, sums)
    then, else None. The hand-over needs the grid, so before the step tuning has chosen a config it runs
    the fixed one, not the autotuner: the step's first eager run then launches the hand-over's readers,
    whose keys the tuning records (TuningTable.record) and tunes like the rest."""
    y = tensors[5]
    pdl = pdl_on(y, plan, default=True)  # the one-row kernel runs only in the `gemv` decode step
    parts, nparts = parts_args(sumsq, y)
    key_flags = {**flags, "NEXT": next_norm is not None, "PRENORM": sumsq is not None}
    config = config or plan.table.config(("gemv", n, k, *sorted(key_flags.items())))
    launch = {"launch_pdl": True} if pdl else {}
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
    interpreted = interpreting()
    if config is None and tune and not interpreted and next_norm is None:
        _STREAM_TUNED[grid](*tensors, y, y, y, *parts, n, k, eps, **flags, USE_GDC=pdl, NPARTS=nparts,
                            EVICT=weight_eviction(plan), **launch)
        return None
    config = pre_clamped(config or _FIXED, k)
    blocks = triton.cdiv(n, config["BLOCK_N"])
    handoff = (y, y, y)
    if next_norm is not None:
        handoff = (next_norm, torch.empty(n, dtype=y.dtype, device=y.device),
                   torch.empty(blocks, dtype=torch.float32, device=y.device))
    if config.get("STAGE"):  # weight tiles through a ring in shared memory (gemv/staged.py)
        from specpilot.kernels.gemv.staged import staged_fits, staged_launch

        if staged_fits(n, k, config, flags, nparts, tensors[2].element_size()) and not interpreted:
            staged_launch(tensors[0], tensors[2], tensors[4] if flags["HAS_RES"] else None, y, handoff, config,
                          next_norm is not None, pdl)
            return handoff[1:] if next_norm is not None else None
        config = {key: v for key, v in config.items() if key != "STAGE"}
    _STREAM[grid](*tensors, *handoff, *parts, n, k, eps, **flags, USE_GDC=pdl,
                  NEXT=next_norm is not None, NPARTS=nparts, EVICT=weight_eviction(plan),
                  EPI_EARLY=plan.epilogue_early, **launch_config(config), **launch,
                  AHEAD=ahead_fits(config["BLOCK_N"] * (2 if flags["GATE_UP"] else 1), config, flags["HAS_NORM"],
                                   plan))
    return handoff[1:] if next_norm is not None else None
