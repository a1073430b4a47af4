"""Warm the L2 cache with the next projection's weights while a latency-bound kernel runs.

A decode step's attention reads a few MB of K/V and spends most of its few microseconds waiting on
round trips, so DRAM idles while it runs. The attention kernel can fill that gap: its programs issue
`prefetch.global.L2` for the output projection's weight rows (no registers held, nothing waited on),
and the projection that follows then streams them from L2. The weights still cross DRAM once per
step, so the weight-pass floor is unchanged; the prefetch only moves part of that traffic into the
bubble. How much to prefetch is a fraction of the L2 (SPECPILOT_PREFETCH, default below), since
lines pushed out before the projection reads them are read twice.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

LINE = 128  # bytes per L2 line the prefetch instruction fills
DEFAULT_FRACTION = 0.5


@triton.jit
def l2_prefetch(ptr, lines, part, parts, LINE_ELEMS: tl.constexpr, CHUNK: tl.constexpr):
    """Program `part` of `parts` prefetches its share of the first `lines` lines at ptr."""
    per = tl.cdiv(lines, parts)
    lo = part * per
    hi = tl.minimum(lo + per, lines)
    for l0 in range(lo, hi, CHUNK):
        line = tl.minimum(l0 + tl.arange(0, CHUNK), hi - 1)  # past the end: repeat the last line
        addr = ptr + line.to(tl.int64) * LINE_ELEMS
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [addr], dtype=tl.int32,
                                  is_pure=False, pack=1)


@functools.cache
def _l2_bytes(index: int) -> int:
    return torch.cuda.get_device_properties(index).L2_cache_size


def prefetch_lines(weight: torch.Tensor | None) -> int:
    """How many leading lines of `weight` to prefetch: 0 unless on CUDA (not the interpreter), the
    weight is contiguous and SPECPILOT_PREFETCH (a fraction of the L2; 0 turns it off) allows."""
    if weight is None or not weight.is_cuda or not weight.is_contiguous():
        return 0
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return 0
    raw = os.environ.get("SPECPILOT_PREFETCH", "").strip()
    try:
        fraction = float(raw) if raw else DEFAULT_FRACTION
    except ValueError:
        raise ValueError(f"SPECPILOT_PREFETCH={raw!r}: expected a fraction of the L2 cache, e.g. 0.5") from None
    index = weight.device.index if weight.device.index is not None else torch.cuda.current_device()
    budget = int(max(0.0, fraction) * _l2_bytes(index))
    return min(weight.numel() * weight.element_size(), budget) // LINE
