"""EXPERIMENTAL, not yet run on a GPU: a one-row GEMV that stages weight tiles in shared memory before
its PDL wait (Gluon, Triton's lower-level language: plain Triton gives no hand on shared memory).

Why: the output projection's blocks are resident through the attention before it (the attention lets
the next kernel start at once), but registers hold only their PRE tiles (4 MB of the 8B's 33.5 MB), so
the DRAM idles through the attention (0.23 ms of the 8B step: BENCHMARKS.md). With STAGE tiles a
program copies STAGE * BLOCK_N * BLOCK_K weights into shared memory (cp.async) before it waits, streams
the rest after, then adds the staged part: two programs an SM at STAGE 4 of (16, 512) hold 128 KB,
16.8 MB of the 8B's output projection. Open question for the H200: whether that traffic delays the
attention's own loads as much as it saves (the L2 prefetches of earlier sessions did).

Scope: the plain projection with the residual epilogue and the norm hand-over (NEXT), the output and
down projections' flags; no in-loop norm, no gate/up pair, no bias. STAGE and the tile's sides are
powers of two (Gluon's shared layouts need them); K a multiple of BLOCK_K, N of BLOCK_N.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp


@gluon.jit
def _gdc(instr: gl.constexpr):
    gl.inline_asm_elementwise(instr, "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _staged_kernel(x_ptr, w_ptr, r_ptr, y_ptr, g_ptr, xg_ptr, sq_ptr, K,
                   BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGE: gl.constexpr, WARPS_N: gl.constexpr,
                   WARPS_K: gl.constexpr, HAS_RES: gl.constexpr, NEXT: gl.constexpr, USE_GDC: gl.constexpr):
    """y[n] = (r[n] +) sum_k W[n, k] x[k] for this program's BLOCK_N rows; the first STAGE tiles are
    copied into shared memory before the PDL wait. NEXT as in gemv/triton._stream_kernel."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS_N, WARPS_K], [1, 0])  # 16-byte chunks
    rows_l: gl.constexpr = gl.SliceLayout(1, layout)
    cols_l: gl.constexpr = gl.SliceLayout(0, layout)
    n = gl.program_id(0) * BLOCK_N + gl.arange(0, BLOCK_N, rows_l)
    k = gl.arange(0, BLOCK_K, cols_l)
    tiles = w_ptr + n[:, None].to(gl.int64) * K + k[None, :]
    staged = gl.allocate_shared_memory(w_ptr.dtype.element_ty, [STAGE * BLOCK_N, BLOCK_K],
                                       gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    for t in gl.static_range(STAGE):  # weights: no earlier kernel writes them
        cp.async_copy_global_to_shared(staged.slice(t * BLOCK_N, BLOCK_N), tiles + t * BLOCK_K)
    cp.commit_group()
    if USE_GDC:
        _gdc("griddepcontrol.wait; // dummy $0")
    acc = gl.zeros([BLOCK_N, BLOCK_K], gl.float32, layout)
    for i in range(STAGE, K // BLOCK_K):  # x is read as tiles of the weight tile's layout: no barrier
        x = gl.load(x_ptr + i * BLOCK_K + k).to(gl.float32)
        acc += gl.load(tiles + i * BLOCK_K).to(gl.float32) * x[None, :]
    if USE_GDC:
        _gdc("griddepcontrol.launch_dependents; // dummy $0")
    cp.wait_group(0)
    for t in gl.static_range(STAGE):
        x = gl.load(x_ptr + t * BLOCK_K + k).to(gl.float32)
        acc += staged.slice(t * BLOCK_N, BLOCK_N).load(layout).to(gl.float32) * x[None, :]
    dtype: gl.constexpr = y_ptr.dtype.element_ty
    out = gl.sum(acc, axis=1).to(dtype).to(gl.float32)
    if HAS_RES:
        out = out + gl.load(r_ptr + n).to(gl.float32)
    stored = out.to(dtype)
    gl.store(y_ptr + n, stored)
    if NEXT:
        h = stored.to(gl.float32)
        gl.store(xg_ptr + n, (h * gl.load(g_ptr + n).to(gl.float32)).to(dtype))
        gl.store(sq_ptr + gl.program_id(0), gl.sum(h * h, axis=0))


def staged_fits(n: int, k: int, config: dict, flags: dict, parts: int) -> bool:
    """Whether a one-row projection can take the staged kernel with this config."""
    bn, bk, stage = config["BLOCK_N"], config["BLOCK_K"], config.get("STAGE", 0)
    pow2 = all(v & (v - 1) == 0 for v in (bn, bk, stage))
    plain = not (flags["HAS_NORM"] or flags["GATE_UP"] or flags["HAS_BIAS"]) and parts == 0
    return stage > 0 and pow2 and plain and n % bn == 0 and k % bk == 0 and k // bk > stage


def staged_launch(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None, y: torch.Tensor,
                  handoff: tuple, config: dict, next_norm: bool, pdl: bool) -> None:
    """Launch _staged_kernel over the rows of `weight` (handoff: g, h * g, sums as _stream passes them)."""
    n, k = weight.shape
    warps = config.get("num_warps", 8)
    warps_k = min(warps, config["BLOCK_K"] // 256)  # a warp covers 256 columns of 16-byte chunks
    _staged_kernel[(triton.cdiv(n, config["BLOCK_N"]),)](
        x, weight, residual if residual is not None else y, y, *handoff, k,
        BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"], STAGE=config["STAGE"], WARPS_N=warps // warps_k,
        WARPS_K=warps_k, HAS_RES=residual is not None, NEXT=next_norm, USE_GDC=pdl, num_warps=warps,
        **({"launch_pdl": True} if pdl else {}))
