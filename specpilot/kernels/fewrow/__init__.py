"""Few-row products y = x W^T (+ bias, + residual) for 1..64 rows of x on the tensor cores, with W in BF16 or in
W12 decoded in registers (fragment.cu says how). The one kernel serves a decode step (one row) and a verify step
(a tree's rows): a row's result does not depend on how many rows run with it (the K split is chosen from the
weight's shape alone), and nothing is added by atomics.

`FewRowWeight` is a weight as the kernel reads it; `product` runs it (CUDA, through NVRTC and cuda-bindings:
kernels/nvrtc.py); `reference` is the same product in PyTorch (float32 sums, the kernel's roundings) for the CPU
and the tests. `decode_pairs` is the kernel's W12 decode in integer PyTorch, held to the format's decode by
the tests."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from specpilot.kernels import nvrtc
from specpilot.w12.format import TILE_COLS, W12, decode, encode, escape_rows, tile

SOURCE = Path(__file__).with_name("fragment.cu")
WARPS = 4  # fragment.cu's __launch_bounds__
CHUNK = 128  # columns a warp takes per step
LANE_COLUMNS = 32  # K must be a multiple: a lane's share of a chunk is all in or all out
MAX_ROWS = 64
MIN_CHUNKS = 2  # the fewest chunks a K piece holds: shorter pieces cost more in partial sums than they spread
# (TILES, AHEAD, X_AHEAD) by the row tiles a launch needs (M_TILES = rows / 8, rounded up to a power of two);
# X_AHEAD: 0 X read as it goes, 1 its fragments loaded ahead (one row tile), 2 a ring in shared memory
# (fragment.cu). A row's arithmetic does not depend on them: they may differ between row counts.
LAYOUT = {1: (1, 1, 0), 2: (1, 1, 2), 4: (1, 1, 2), 8: (1, 1, 2)}
FUSED_SUM_ROWS = 8  # up to this many rows the last block of a split adds the pieces; past it, reduce_parts


@dataclass
class FewRowWeight:
    """W [n, k] as the kernel reads it: BF16 (`planes` is W itself) or W12 (`w12`, whose planes it reads, tiled or
    in rows)."""

    n: int
    k: int
    planes: torch.Tensor
    w12: W12 | None = None
    bias: torch.Tensor | None = None

    @classmethod
    def bf16(cls, w: torch.Tensor, bias: torch.Tensor | None = None) -> FewRowWeight:
        return cls(w.shape[0], w.shape[1], w.contiguous(), None, bias)

    @classmethod
    def of_w12(cls, f: W12, bias: torch.Tensor | None = None) -> FewRowWeight:
        return cls(f.shape[0], f.shape[1], f.byte_plane, f, bias)

    @property
    def bytes(self) -> int:
        return self.w12.bytes if self.w12 is not None else self.planes.numel() * self.planes.element_size()

    def matrix(self, view8: bool = False) -> torch.Tensor:
        """W in BF16 (decoded when W12; view8: W12's 8-bit view, w12/format.view8, in BF16)."""
        from specpilot.w12.format import view8_bf16

        if view8 and self.w12 is None:
            raise ValueError("the 8-bit view is W12's: this weight is BF16")
        if self.w12 is None:
            return self.planes
        return view8_bf16(self.w12) if view8 else decode(self.w12)


def runs() -> bool:
    """Whether the kernel can run here: cuda-bindings and NVRTC, a GPU of compute capability 9+."""
    return nvrtc.bindings_available()


def unavailable() -> str | None:
    """Why the kernel cannot run here (None when `runs`), in words for the user."""
    if runs():
        return None
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if major < 9:
        return f"the GPU's compute capability is {major}.{minor}, the kernel needs 9.0+"
    return "cuda-bindings (NVRTC and the driver API) is not installed"


def fits(k: int) -> str | None:
    """Why a weight with k columns cannot run here (None when it can)."""
    return None if k % LANE_COLUMNS == 0 else f"{k} columns is not a multiple of {LANE_COLUMNS}"


def m_tiles(rows: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, math.ceil(rows / 8)))))


def layout_for(n: int, row_tiles: int, sms: int) -> tuple[int, int, int]:
    """LAYOUT's entry, with two weight tiles a warp at one row tile when one tile a warp would need more than
    four blocks a multiprocessor (more bytes in flight per warp; H200: 1.11-1.25x on the 43008-, 151936- and
    248320-row weights, slower on the others and at more rows: bench/HISTORY.md)."""
    tiles, ahead, x_ahead = LAYOUT[row_tiles]
    if row_tiles == 1 and math.ceil(n / (16 * WARPS)) > 4 * sms:
        tiles = 2
    return tiles, ahead, x_ahead


def split_for(n: int, k: int, sms: int) -> int:
    """K pieces for an [n, k] weight: enough blocks for about four per multiprocessor at one row tile a warp,
    each piece at least MIN_CHUNKS chunks. From the shape and the GPU alone, so that every row count adds a
    row's pieces in the same order."""
    blocks = math.ceil(n / (16 * WARPS))
    return max(1, min(math.ceil(k / CHUNK) // MIN_CHUNKS, math.ceil(4 * sms / blocks)))


# ---------------------------------------------------------------- references (CPU)

def decode_pairs(byte_plane: torch.Tensor, nibble_plane: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """fragment.cu's `pair` in integer PyTorch: the BF16 bits (int32 [rows, cols]) the kernel multiplies, escapes
    as the planes hold them. cols must be a multiple of 8."""
    rows, cols = byte_plane.shape
    b = byte_plane.to(torch.int64).reshape(rows, -1, 4)  # bytes of a 32-bit word
    h = torch.stack([b[..., 0] | b[..., 1] << 16, b[..., 2] | b[..., 3] << 16], 2).reshape(rows, -1, 4)
    nw = nibble_plane.to(torch.int64).reshape(rows, -1, 4)
    nw = nw[..., 0] | nw[..., 1] << 8 | nw[..., 2] << 16 | nw[..., 3] << 24  # one word per 8 columns
    base = base.to(torch.int64)[:, None, None]
    n = ((nw[..., None] >> (4 * torch.arange(4))) & 0x000F000F) | (base << 7) | (base << 23)
    w = (h * 16 + (h & 0x00800080) * 240 + n) & 0xFFFFFFFF  # [rows, cols / 8, 4 pairs]
    return torch.stack([w & 0xFFFF, w >> 16], 3).reshape(rows, cols).to(torch.int32)


def reference(x: torch.Tensor, w: FewRowWeight, residual: torch.Tensor | None = None,
              view8: bool = False) -> torch.Tensor:
    """What `product` computes, in PyTorch: float32 sums of x W^T, the bias added before the rounding to x's
    dtype, the residual after it."""
    y = x.float() @ w.matrix(view8).float().t()
    if w.bias is not None:
        y = y + w.bias.float()
    y = y.to(x.dtype)
    return y if residual is None else (y.float() + residual.float()).to(x.dtype)


# ---------------------------------------------------------------- CUDA

def macros(w12: bool, row_tiles: int, tiles: int, ahead: int, x_ahead: int, view8: bool = False,
           tiled: bool = False) -> dict[str, int]:
    return {"WEIGHTS_W12": int(w12), "M_TILES": row_tiles, "TILES": tiles, "AHEAD": ahead,
            "X_AHEAD": 0 if x_ahead == 1 and row_tiles > 1 else x_ahead, "VIEW8": int(view8),
            "TILED": int(w12 and tiled)}


@functools.cache
def _module(device: int, w12: bool, row_tiles: int, layout: tuple[int, int, int], view8: bool = False,
            tiled: bool = False):
    cubin, _ = nvrtc.build(SOURCE, macros(w12, row_tiles, *layout, view8=view8, tiled=tiled),
                           nvrtc.arch_of(device))
    module = nvrtc.load(device, cubin)
    return module, {name: nvrtc.function(module, name) for name in ("few_row_product", "reduce_parts", "w12_decode")}


@functools.cache
def _arrivals(device: int) -> torch.Tensor:
    """The split products' arrival counters (one per block column; each last block resets its own), shared by
    every launch on the device: launches on one stream never overlap."""
    return torch.zeros(1 << 16, dtype=torch.int32, device=f"cuda:{device}")


def blocks_per_sm(device: int, w12: bool, row_tiles: int, layout: tuple[int, int, int], tiled: bool = True) -> int:
    """How many of the product's blocks a multiprocessor holds at once (the driver's occupancy calculator)."""
    from cuda.bindings import driver

    _, fn = _module(device, w12, row_tiles, layout, False, tiled)
    return nvrtc.check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn["few_row_product"], 32 * WARPS, 0),
                       "occupancy")


@functools.cache
def _sms(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _launch(func, grid: tuple[int, int], threads: int, values: tuple, types: tuple, device: torch.device) -> None:
    from cuda.bindings import driver

    stream = driver.CUstream(torch.cuda.current_stream(device).cuda_stream)
    nvrtc.check(driver.cuLaunchKernel(func, grid[0], grid[1], 1, threads, 1, 1, 0, stream, (values, types), 0),
                "cuLaunchKernel")


def product(x: torch.Tensor, w: FewRowWeight, residual: torch.Tensor | None = None, *, split: int | None = None,
            layout: tuple[int, int, int] | None = None, view8: bool = False) -> torch.Tensor:
    """x [M, K] (M <= 64, bf16, rows contiguous) times W^T (+ bias, + residual [M, N]) on the GPU: [M, N] bf16.
    split: K pieces (default split_for; a row's result depends on it); layout: (TILES, AHEAD, X_AHEAD) (default
    layout_for; the same result). view8: W12's 8-bit view (the byte plane alone; escapes exact)."""
    import ctypes

    m, k = x.shape
    if m > MAX_ROWS or k != w.k or x.dtype != torch.bfloat16 or fits(k):
        raise ValueError(f"few-row product of x {tuple(x.shape)} {x.dtype} with W [{w.n}, {w.k}]")
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:  # the kernel reads x 16 bytes at a time
        x = torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)
    if residual is not None and residual.stride(1) != 1:
        residual = residual.contiguous()
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    mt = m_tiles(m)
    layout = layout or layout_for(w.n, mt, _sms(device))
    tiles = layout[0]
    if view8 and w.w12 is None:
        raise ValueError("the 8-bit view is W12's: this weight is BF16")
    _, fn = _module(device, w.w12 is not None, mt, layout, view8, w.w12 is not None and w.w12.tiled)
    s = split or split_for(w.n, w.k, _sms(device))
    y = torch.empty(m, w.n, dtype=x.dtype, device=x.device)
    parts = torch.empty(s, m, w.n, dtype=torch.float32, device=x.device) if s > 1 else None
    ptr, i32 = ctypes.c_void_p, ctypes.c_int
    f = w.w12
    epi = ((f.base.data_ptr(), f.esc_ptr.data_ptr(), f.esc_col.data_ptr(), f.esc_bits.data_ptr()) if f is not None
           else (0, 0, 0, 0))
    epi += (w.bias.data_ptr() if w.bias is not None else 0, residual.data_ptr() if residual is not None else 0,
            residual.stride(0) if residual is not None else 0)
    epi_types = (ptr,) * 6 + (i32,)
    planes = w.planes.data_ptr()
    nibbles = f.nibble_plane.data_ptr() if f is not None else 0
    blocks = math.ceil(w.n / (16 * tiles * WARPS))
    fused = parts is not None and m <= FUSED_SUM_ROWS and blocks <= _arrivals(device).numel()
    _launch(fn["few_row_product"], (blocks, s), 32 * WARPS,
            (planes, nibbles, *epi, x.data_ptr(), x.stride(0), y.data_ptr(), y.stride(0),
             parts.data_ptr() if parts is not None else 0, _arrivals(device).data_ptr() if fused else 0, m, w.n, k),
            (ptr, ptr, *epi_types, ptr, i32, ptr, i32, ptr, ptr, i32, i32, i32), x.device)
    if parts is not None and not fused:
        _launch(fn["reduce_parts"], (math.ceil(m * w.n / 256), 1), 256,
                (parts.data_ptr(), s, *epi, x.data_ptr(), x.stride(0), y.data_ptr(), y.stride(0), m, w.n),
                (ptr, i32, *epi_types, ptr, i32, ptr, i32, i32, i32), x.device)
    return y


def decode_on_device(f: W12) -> torch.Tensor:
    """The W12 planes decoded by the kernel's own routine on the GPU, read in the layout the product reads them
    (tiled or in rows): int32 [rows, cols] BF16 bits (escapes as the planes hold them), what `check_w12`
    compares."""
    out = _decode_words(f)
    return torch.stack([out & 0xFFFF, (out >> 16) & 0xFFFF], 2).reshape(*f.shape)


def dense_matrix(f: W12) -> torch.Tensor:
    """W in BF16, decoded from its W12 form, escapes patched in: on the GPU by the kernel's decode straight into
    the matrix (no copy of it in wider integers), elsewhere by the format's decode. What a projection whose BF16
    copy was dropped (weights/dense.py) multiplies by past the few-row kernel's rows."""
    if not f.byte_plane.is_cuda:
        return decode(f)
    m = _decode_words(f).view(torch.bfloat16)  # little-endian: a word's low half is the even column
    m.view(torch.int16)[escape_rows(f), f.esc_col.long()] = f.esc_bits
    return m


def _decode_words(f: W12) -> torch.Tensor:
    """The kernel's w12_decode: int32 [rows, cols / 2], two BF16 bit patterns a word (even column low)."""
    import ctypes

    rows, cols = f.shape
    device = f.byte_plane.device.index if f.byte_plane.device.index is not None else torch.cuda.current_device()
    _, fn = _module(device, True, 1, LAYOUT[1], False, f.tiled)
    out = torch.empty(rows, cols // 2, dtype=torch.int32, device=f.byte_plane.device)
    threads = rows * (cols // 8)
    ptr = ctypes.c_void_p
    _launch(fn["w12_decode"], (math.ceil(threads / 256), 1), 256,
            (f.byte_plane.data_ptr(), f.nibble_plane.data_ptr(), f.base.data_ptr(), out.data_ptr(), rows, cols),
            (ptr, ptr, ptr, ptr, ctypes.c_int, ctypes.c_int), f.byte_plane.device)
    return out


def kernel_planes(f: W12) -> tuple[torch.Tensor, torch.Tensor]:
    """The byte plane [rows, cols] and nibble plane [rows, cols / 2] gathered at the addresses the kernel reads
    (fragment.cu's tile_line when tiled), not through untile(): a fault in the tiling shows here as the kernel
    would see it. cols must be a multiple of 8."""
    if not f.tiled:
        return f.byte_plane, f.nibble_plane
    rows, cols = f.shape
    r = torch.arange(rows, device=f.base.device)[:, None]
    c = torch.arange(cols, device=f.base.device)[None, :]
    line = ((r >> 4) * -(-cols // CHUNK) + c // CHUNK) * 16 + (r & 15)  # tile_line(row, chunk, K)
    byte = f.byte_plane[line * CHUNK + c % CHUNK]
    pairs = line[:, 0::2] * (CHUNK // 2) + (c[:, 0::2] % CHUNK) // 2  # one nibble byte per two columns
    return byte, f.nibble_plane[pairs]


def check_w12(f: W12, original: torch.Tensor, on_device: bool) -> bool:
    """The load-time check, of the form the kernel will read (tiled or in rows): its planes, decoded by the
    kernel's routine (on the GPU when on_device, else its PyTorch twin on the planes gathered as the kernel
    addresses them), give the original's bits wherever there is no escape, and the escapes hold the original's
    bits at their columns."""
    from specpilot.w12.format import bits_of

    bits = bits_of(original)
    if tuple(bits.shape) != tuple(f.shape):
        return False
    dec = decode_on_device(f) if on_device else decode_pairs(*kernel_planes(f), f.base)
    rows, cols = escape_rows(f), f.esc_col.long()
    escaped = torch.zeros_like(bits, dtype=torch.bool)
    escaped[rows, cols] = True
    planes_ok = torch.equal(torch.where(escaped, 0, dec), torch.where(escaped, 0, bits))
    return planes_ok and torch.equal(bits[rows, cols], f.esc_bits.to(torch.int32) & 0xFFFF)


class DecodeMismatch(RuntimeError):
    """A W12 form that does not decode to its original's bits (w12/attach.py keeps that weight BF16)."""


def encode_checked(w: torch.Tensor, bias: torch.Tensor | None = None) -> FewRowWeight:
    """W12 of a BF16 weight, tiled (w12/format.tile: what the kernel streams best) when its columns fill whole
    tiles, else in rows (padding would cost more); the form the kernel will read is the one checked, as
    `check_w12` says, before the original may go."""
    f = encode(w)
    form = tile(f) if f.shape[1] % TILE_COLS == 0 else f
    if not check_w12(form, w, on_device=w.is_cuda):
        layout = "tiled" if form.tiled else "in rows"
        raise DecodeMismatch(f"its W12 form ({layout}) does not decode to its original bits")
    return FewRowWeight.of_w12(form, bias)
