"""Per-block timestamps of the one-row decode kernels: a diagnostic, off unless a `CtaTrace` is active.

A profiler gives one span per kernel, and with programmatic dependent launch that span includes the
time a kernel's blocks sit resident waiting for the previous kernel. To see where a step's DRAM idles
(drains, release latency after a wait, blocks placed late or unevenly over the SMs), every block of
a traced kernel writes one record: when it started, when its PDL wait returned, when its last weight
load was consumed, when it ended (`%globaltimer`, nanoseconds, one clock for all SMs; on the H200 it
advances in steps of about 0.26 us) and its SM.

While `tracing()` is active each launch of the streaming GEMV, the fused q/k/v + rope and the decode
attention takes the next rows of the record buffer (`slot`), in launch order, so a CUDA graph
captured inside it writes the same rows at every replay. Kernels compiled with TRACE off contain none
of this.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

FIELDS = ("start", "waited", "streamed", "end", "sm")  # a record's columns; kernels write them by index


@dataclass
class CtaTrace:
    """The record buffer ([capacity, 5] int64, one row per block) and the launches that took rows of it."""

    buf: torch.Tensor
    launches: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, first row, blocks)

    def slot(self, kind: str, blocks: int) -> torch.Tensor:
        first = self.launches[-1][1] + self.launches[-1][2] if self.launches else 0
        if first + blocks > self.buf.shape[0]:
            raise ValueError(f"the trace buffer holds {self.buf.shape[0]} blocks; launch {len(self.launches)} "
                             f"({kind}) needs rows {first}..{first + blocks}")
        self.launches.append((kind, first, blocks))
        return self.buf[first:first + blocks]

    def reset(self) -> None:
        """Forget the launches (a capture after this one takes the rows from the start again)."""
        self.launches.clear()
        self.buf.zero_()

    def records(self) -> list[dict]:
        """Per launch: kind and the blocks' fields as lists (read after the traced work finished)."""
        host = self.buf.cpu()
        return [{"kind": kind, **{name: host[first:first + n, i].tolist() for i, name in enumerate(FIELDS)}}
                for kind, first, n in self.launches]


_ACTIVE: list[CtaTrace | None] = [None]


@contextmanager
def tracing(capacity: int, device: torch.device | str = "cuda"):
    """Trace the decode kernels launched (or captured) inside the block."""
    if _ACTIVE[0] is not None:
        raise RuntimeError("tracing() does not nest")
    _ACTIVE[0] = CtaTrace(torch.zeros(capacity, len(FIELDS), dtype=torch.int64, device=device))
    try:
        yield _ACTIVE[0]
    finally:
        _ACTIVE[0] = None


def slot(kind: str, blocks: int, like: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(record rows, TRACE) for one launch of `blocks` blocks: rows of the active trace, or `like` (never
    written: the kernel is compiled without tracing) when none is active or `like` is not on a GPU."""
    trace = _ACTIVE[0]
    if trace is None or not like.is_cuda:
        return like, False
    return trace.slot(kind, blocks), True


@triton.jit
def now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def sm_id():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def stamp(rec_ptr, FIELD: tl.constexpr):
    """Write the time into this block's record (rec_ptr: the block's row)."""
    tl.store(rec_ptr + FIELD, now())


@triton.jit
def opening(rec_ptr):
    tl.store(rec_ptr + 0, now())  # START
    tl.store(rec_ptr + 4, sm_id().to(tl.int64))  # SM


def summarize(records: list[dict], nbytes: dict[str, int] | None = None) -> list[dict]:
    """One row per launch, times in microseconds from the first block's start:
      first_start, last_end   the launch's blocks, first to start and last to end;
      lead      how long before the previous launch's last block ended this launch's first block started
                (> 0: blocks resident early, streaming before their wait); early: the share of blocks that did;
      release   from the previous launch's last block's end to this launch's first block past its wait;
      busy      this launch's share of the step: its last end minus the previous launch's last end;
      tail      its last block's end minus its 90th-percentile block end;
      per_sm    most blocks any SM ran, and blocks per SM on average over the SMs used;
      tb_s      nbytes[kind] / busy, where the kind's bytes are given."""
    if not records:
        return []
    t0 = min(min(r["start"]) for r in records)
    rows, prev_end = [], None
    for r in records:
        start, waited, end = (torch.tensor(r[k], dtype=torch.float64) for k in ("start", "waited", "end"))
        first_start, last_end = (start.min().item() - t0) / 1e3, (end.max().item() - t0) / 1e3
        first_waited = (waited.min().item() - t0) / 1e3
        counts = torch.bincount(torch.tensor(r["sm"]))
        counts = counts[counts > 0]
        row = {"kind": r["kind"], "blocks": len(r["start"]), "first_start": first_start, "last_end": last_end,
               "lead": None if prev_end is None else prev_end - first_start,
               "early": None if prev_end is None else ((start - t0) / 1e3 < prev_end).double().mean().item(),
               "release": None if prev_end is None else first_waited - prev_end,
               "busy": last_end - (first_start if prev_end is None else prev_end),
               "tail": last_end - (torch.quantile(end, 0.9).item() - t0) / 1e3,
               "per_sm": [int(counts.max()), float(counts.float().mean())]}
        b = (nbytes or {}).get(r["kind"])
        row["tb_s"] = b / (row["busy"] * 1e6) if b and row["busy"] > 0 else None
        rows.append(row)
        prev_end = last_end
    return rows


def by_kind(rows: list[dict]) -> dict[str, dict]:
    """Medians of the per-launch rows of each kind, and the kind's summed busy time (ms)."""
    out: dict[str, dict] = {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]

        def med(key: str, mine=mine) -> float | None:
            vals = [r[key] for r in mine if r[key] is not None]
            return float(torch.tensor(vals).median()) if vals else None

        out[kind] = {"launches": len(mine), "busy_ms": sum(r["busy"] for r in mine) / 1e3,
                     **{k: med(k) for k in ("busy", "lead", "early", "release", "tail", "tb_s")},
                     "per_sm_max": max(r["per_sm"][0] for r in mine)}
    return out
