"""A one-row GEMV whose weight tiles stream through a ring of shared-memory slots (cp.async), the first
ring's worth requested before its PDL wait (Gluon, Triton's lower-level language: plain Triton gives no
hand on shared memory).

Why: the output projection's blocks are resident through the attention before it (the attention lets the
next kernel start at once, or with LATE once past its own wait), but the Triton kernel's registers hold
only its PRE tiles (4 MB of the 8B's 33.5 MB), so the DRAM idles through the attention (0.23 ms of the 8B
step: bench/HISTORY.md). With a ring of STAGE slots a program has STAGE * BLOCK_N * BLOCK_K weights on the
way before it waits (two programs an SM at STAGE 2 of (16, 512): 64 KB, 8.4 MB of the 8B's output
projection), and after it keeps STAGE tiles in flight: each step waits for its tile, reads it and refills
the slot with the tile STAGE steps on. Whether that traffic saves more than it delays the attention's own
loads depends on the model; the step tuning decides per projection. On the H200 it chose two-tile rings
for the output projection: 0.30 ms a step on the 27B shapes, 0.04 ms on the 8B's together with the
attention's late release (bench/HISTORY.md, 2026-12-01).

Scope: the plain projection with the residual epilogue and the norm hand-over (NEXT), the output and
down projections' flags; no in-loop norm, no gate/up pair, no bias. The tile's sides are powers of two
(Gluon's shared layouts need them; the slot count STAGE need not be); K a multiple of BLOCK_K, N of
BLOCK_N; 16-bit weights.
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
    """y[n] = (r[n] +) sum_k W[n, k] x[k] for this program's BLOCK_N rows, the weight tiles streamed through
    a ring of STAGE shared-memory slots, the first STAGE requested before the PDL wait. NEXT as in
    gemv/triton._stream_kernel."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS_N, WARPS_K], [1, 0])  # 16-byte chunks
    n = gl.program_id(0) * BLOCK_N + gl.arange(0, BLOCK_N, gl.SliceLayout(1, layout))
    k = gl.arange(0, BLOCK_K, gl.SliceLayout(0, layout))
    tiles = w_ptr + n[:, None].to(gl.int64) * K + k[None, :]
    ring = gl.allocate_shared_memory(w_ptr.dtype.element_ty, [STAGE, BLOCK_N, BLOCK_K],
                                     gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    steps = K // BLOCK_K  # > STAGE (staged_fits)
    for t in gl.static_range(STAGE):  # weights: no earlier kernel writes them. One copy group a tile.
        cp.async_copy_global_to_shared(ring.index(t), tiles + t * BLOCK_K)
        cp.commit_group()
    if USE_GDC:
        _gdc("griddepcontrol.wait; // dummy $0")
    acc = gl.zeros([BLOCK_N, BLOCK_K], gl.float32, layout)
    x = gl.load(x_ptr + k)
    for i in range(steps):
        x_next = gl.load(x_ptr + (i + 1) % steps * BLOCK_K + k)  # x one step ahead (the last wraps: unused)
        cp.wait_group(STAGE - 1)  # tile i is in: the groups complete in order
        slot = ring.index(i % STAGE)
        acc += slot.load(layout).to(gl.float32) * x.to(gl.float32)[None, :]
        # Each thread reads back only the chunks it copied itself (one layout for both), so the refill needs
        # no barrier (Gluon's analysis still puts a bar.sync before the read and one before the refill).
        more = gl.full([BLOCK_N, BLOCK_K], i + STAGE, gl.int32, layout) < steps
        cp.async_copy_global_to_shared(slot, tiles + (i + STAGE) * BLOCK_K, mask=more)
        cp.commit_group()  # empty past the last tile, so that the count above holds
        x = x_next
    if USE_GDC:
        _gdc("griddepcontrol.launch_dependents; // dummy $0")
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


def staged_fits(n: int, k: int, config: dict, flags: dict, parts: int, itemsize: int) -> bool:
    """Whether a one-row projection can take the staged kernel with this config (16-bit weights: a
    thread's chunk of 8 is one 16-byte copy)."""
    bn, bk, stage = config["BLOCK_N"], config["BLOCK_K"], config.get("STAGE", 0)
    pow2 = all(v & (v - 1) == 0 for v in (bn, bk)) and bk >= 256  # a warp's row: 32 copies of 16 bytes
    plain = not (flags["HAS_NORM"] or flags["GATE_UP"] or flags["HAS_BIAS"]) and parts == 0
    return stage > 0 and pow2 and plain and n % bn == 0 and k % bk == 0 and k // bk > stage and itemsize == 2


def staged_launch(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None, y: torch.Tensor,
                  handoff: tuple, config: dict, next_norm: bool, pdl: bool) -> None:
    """Launch _staged_kernel over the rows of `weight` (handoff: g, h * g, sums as _stream passes them)."""
    n, k = weight.shape
    warps = config.get("num_warps", 8)
    warps_k = min(warps, config["BLOCK_K"] // 256)  # a warp covers 256 columns of 16-byte chunks
    _staged_kernel[(triton.cdiv(n, config["BLOCK_N"]),)](
        x, weight, residual if residual is not None else y, y, *handoff, k,
        BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"], STAGE=config["STAGE"], WARPS_N=warps // warps_k,
        WARPS_K=warps_k, HAS_RES=residual is not None, NEXT=next_norm, USE_GDC=pdl,
        num_warps=warps,
        **({"launch_pdl": True} if pdl else {}))
