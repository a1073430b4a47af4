"""W12: every BF16 weight of a [rows, cols] matrix stored exactly in 12 bits (plus a few escapes).

BF16 is [sign | 8-bit exponent e | 7-bit mantissa m]. Each row keeps a base exponent b (one byte) and its weights
are split into two planes:
- the byte plane, one byte per weight: [s | c3 c2 c1 c0 | m6 m5 m4] with c = e - b in 1..15;
- the nibble plane, half a byte per weight: m3 m2 m1 m0, eight columns to a little-endian 32-bit word whose
  nibble i (bits 4i..4i+3) holds column 2i for i < 4 and column 2(i-4)+1 for i >= 4 (the last word zero-padded):
  a kernel holding a pair of adjacent columns in the two 16-bit halves of a register gets their nibbles into
  the same halves with one shift and one mask, (word >> 4p) & 0x000F000F (kernels/fewrow).
c = 0 is the escape: the weight's exact 16 bits are kept in the row's escape list (CSR: a row pointer, the
column, the bits) and the planes hold a benign value there (c = 0 decodes to 2^(b-127) x 1.m, below the window,
never NaN). Escapes are what the window cannot hold: zeros of both signs, subnormals, outliers on either side,
and (c = 15, m6..m4 = 111), kept free so the byte plane read alone is FP8 E4M3 times 2^(b - 120) (no NaN code):
the 8-bit view two-level verification reads.

The base of a row is the 15-wide window of exponents holding most of its weights (ties: the highest). Bits per
weight: 12 + (8 per row for the base + 32 per row for the pointer + 48 per escape: a u32 column and the bits)
/ weights. Decoding is exact for every bit pattern (the tests run all 65,536 and random matrices).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

WINDOW = 15  # exponent codes 1..15 above the row's base; 0 is the escape
TILE_ROWS, TILE_COLS = 16, 128  # the tiled layout (tile()): what one warp of the few-row kernel reads a step


@dataclass
class W12:
    shape: tuple[int, int]
    base: torch.Tensor  # uint8 [rows]
    byte_plane: torch.Tensor  # uint8 [rows, cols]
    nibble_plane: torch.Tensor  # uint8 [rows, 4 * ceil(cols / 8)]
    esc_ptr: torch.Tensor  # int32 [rows + 1]: row r's escapes are esc_col/esc_bits[ptr[r]:ptr[r+1]]
    esc_col: torch.Tensor  # int32 [escapes]
    esc_bits: torch.Tensor  # int16 [escapes]: the exact BF16 bit patterns
    tiled: bool = False  # planes stored by tile (tile(): flat, 16 rows x 128 columns contiguous, zero-padded)

    @property
    def escapes(self) -> int:
        return int(self.esc_col.numel())

    @property
    def bytes(self) -> int:
        """Bytes the format stores (planes, bases, escape lists)."""
        return sum(t.numel() * t.element_size() for t in (self.base, self.byte_plane, self.nibble_plane,
                                                          self.esc_ptr, self.esc_col, self.esc_bits))

    @property
    def bits_per_weight(self) -> float:
        rows, cols = self.shape
        return 8 * self.bytes / (rows * cols)


def bits_of(w: torch.Tensor) -> torch.Tensor:
    """A BF16 tensor's bit patterns as int32 in 0..65535."""
    if w.dtype != torch.bfloat16:
        raise TypeError(f"W12 stores BF16 weights, got {w.dtype}")
    return w.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF


def choose_base(exponent: torch.Tensor) -> torch.Tensor:
    """Per row, the base b whose window b+1..b+15 holds the most exponents; uint8 [rows]. Ties (a row whose
    exponents fit in fewer than 15) take the highest b: its largest exponents then sit below code 15, whose top
    mantissas (E4M3's NaN code) would escape."""
    rows = exponent.shape[0]
    counts = torch.zeros(rows, 256, dtype=torch.int64, device=exponent.device)
    counts.scatter_add_(1, exponent.long(), torch.ones_like(exponent, dtype=torch.int64))
    csum = torch.cat([torch.zeros(rows, 1, dtype=torch.int64, device=exponent.device), counts.cumsum(1)], 1)
    starts = torch.arange(1, 256 - WINDOW + 1, device=exponent.device)  # window start e = b + 1, b = 0..240
    held = csum[:, starts + WINDOW] - csum[:, starts]  # exponents starts..starts+14
    return (held.shape[1] - 1 - held.flip(1).argmax(1)).to(torch.uint8)  # the last maximum: the highest b


def encode(w: torch.Tensor) -> W12:
    """The exact 12-bit form of a BF16 [rows, cols] matrix."""
    if w.dim() != 2:
        raise ValueError(f"W12 encodes matrices, got shape {tuple(w.shape)}")
    bits = bits_of(w)
    rows, cols = bits.shape
    sign, exponent, mantissa = bits >> 15, (bits >> 7) & 0xFF, bits & 0x7F
    base = choose_base(exponent)
    code = exponent - base.to(torch.int32)[:, None]
    escape = (code < 1) | (code > WINDOW) | ((code == WINDOW) & ((mantissa >> 4) == 7))
    code = torch.where(escape, torch.zeros_like(code), code)
    byte_plane = ((sign << 7) | (code << 3) | (mantissa >> 4)).to(torch.uint8)
    nibble_plane = pack_nibbles(mantissa & 0xF)
    r, c = escape.nonzero(as_tuple=True)  # row-major order: CSR by row
    esc_ptr = torch.zeros(rows + 1, dtype=torch.int32, device=w.device)
    esc_ptr[1:] = torch.bincount(r, minlength=rows).cumsum(0).to(torch.int32)
    esc_bits = bits[r, c].to(torch.int16)  # 0..65535 wraps into int16: the same 16 bits
    return W12((rows, cols), base, byte_plane, nibble_plane, esc_ptr, c.to(torch.int32), esc_bits)


def decode(f: W12) -> torch.Tensor:
    """The BF16 matrix back, bit for bit (the reference every kernel's decode is held to)."""
    f = untile(f)
    return _assemble(f, unpack_nibbles(f.nibble_plane, f.shape[1]))


def tile(f: W12) -> W12:
    """The planes in the tiled layout the few-row kernel streams (kernels/fewrow): rows padded to 16 and columns
    to 128 with zeros, then each tile of 16 rows x 128 columns stored contiguously (byte plane: 2 KB, nibble
    plane: 1 KB), the tiles of a row band in column order. A warp's step reads one tile of each plane whole,
    where row-major planes gave it 128 and 64 bytes of each of 16 rows."""
    if f.tiled:
        return f
    return dataclasses.replace(f, byte_plane=_tiles(f.byte_plane, TILE_COLS),
                               nibble_plane=_tiles(f.nibble_plane, TILE_COLS // 2), tiled=True)


def untile(f: W12) -> W12:
    """The planes back in rows (tile() inverted; padding dropped)."""
    if not f.tiled:
        return f
    rows, cols = f.shape
    return dataclasses.replace(f, byte_plane=_rows(f.byte_plane, rows, cols, TILE_COLS),
                               nibble_plane=_rows(f.nibble_plane, rows, 4 * -(-cols // 8), TILE_COLS // 2),
                               tiled=False)


def _tiles(plane: torch.Tensor, span: int) -> torch.Tensor:
    rows, width = plane.shape
    padded = torch.zeros(-(-rows // TILE_ROWS) * TILE_ROWS, -(-width // span) * span, dtype=plane.dtype,
                         device=plane.device)
    padded[:rows, :width] = plane
    t, c = padded.shape[0] // TILE_ROWS, padded.shape[1] // span
    return padded.reshape(t, TILE_ROWS, c, span).permute(0, 2, 1, 3).contiguous().reshape(-1)


def _rows(tiles: torch.Tensor, rows: int, width: int, span: int) -> torch.Tensor:
    t, c = -(-rows // TILE_ROWS), -(-width // span)
    return tiles.reshape(t, c, TILE_ROWS, span).permute(0, 2, 1, 3).reshape(t * TILE_ROWS, c * span)[:rows, :width]


def pack_nibbles(low: torch.Tensor) -> torch.Tensor:
    """int32 [rows, cols] values 0..15 -> the nibble plane (the module docstring's word order)."""
    rows, cols = low.shape
    pad = -cols % 8
    if pad:
        low = torch.cat([low, torch.zeros(rows, pad, dtype=low.dtype, device=low.device)], 1)
    words = low.reshape(rows, -1, 8)
    seq = torch.cat([words[..., 0::2], words[..., 1::2]], 2)  # nibble order: the even columns, then the odd
    return (seq[..., 0::2] | (seq[..., 1::2] << 4)).to(torch.uint8).reshape(rows, -1)


def unpack_nibbles(plane: torch.Tensor, cols: int) -> torch.Tensor:
    """The nibble plane -> int32 [rows, cols] (pack_nibbles inverted)."""
    b = plane.to(torch.int32).reshape(plane.shape[0], -1, 4)
    seq = torch.stack([b & 0xF, b >> 4], 3).reshape(plane.shape[0], -1, 8)
    return torch.stack([seq[..., :4], seq[..., 4:]], 3).reshape(plane.shape[0], -1)[:, :cols]


def view8(f: W12) -> torch.Tensor:
    """The 8-bit view (two-level verification's cheap pass): the byte plane with the nibble at its midpoint
    (0b1000), escapes patched exactly; float32 [rows, cols]. 4 significant bits: a relative error of at most
    2^-4 on every in-window weight."""
    return view8_bf16(f).float()


def view8_bf16(f: W12) -> torch.Tensor:
    """The 8-bit view as BF16 (exactly representable: 4 significant bits)."""
    return _assemble(untile(f), 0x8)


def escape_rows(f: W12) -> torch.Tensor:
    """Each escape's row (the CSR pointer expanded): int64 [escapes], beside esc_col."""
    return torch.repeat_interleave(torch.arange(f.shape[0], device=f.esc_ptr.device),
                                   (f.esc_ptr[1:] - f.esc_ptr[:-1]).long())


def _assemble(f: W12, low: torch.Tensor | int) -> torch.Tensor:
    """BF16 from the byte plane and the given low mantissa bits, escapes patched with their exact bits."""
    byte = f.byte_plane.to(torch.int32)
    exponent = ((byte >> 3) & 0xF) + f.base.to(torch.int32)[:, None]
    bits = ((byte >> 7) << 15) | (exponent << 7) | ((byte & 0x7) << 4) | low
    if f.escapes:
        bits[escape_rows(f), f.esc_col.long()] = f.esc_bits.to(torch.int32) & 0xFFFF
    return bits.to(torch.int16).view(torch.bfloat16)
