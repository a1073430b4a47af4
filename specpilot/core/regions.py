"""Named regions of a step, for the ceiling's kernel profile (ceiling/profile.py): each projection, attention,
LM head, drafter and tree stage opens one, and every kernel launched inside is attributed to the innermost
regions around it. Off (the default) a region is a shared no-op context, so the engine pays one call and one
flag test per projection; a captured graph never sees them (regions are host-side ranges)."""

from __future__ import annotations

import contextlib

import torch

PREFIX = "sp:"
_NULL = contextlib.nullcontext()
_on = False


def region(name: str):
    """A named range around kernels launched inside it (only while `labelled()` is active)."""
    return torch.profiler.record_function(PREFIX + name) if _on else _NULL


@contextlib.contextmanager
def labelled():
    """Regions are recorded within this block (a profiler must be active to see them)."""
    global _on
    before, _on = _on, True
    try:
        yield
    finally:
        _on = before
