"""A known, lossless slowdown: an idle kernel of a fixed duration in every decode step.

It exists to test the controller (does it quantify a deliberate few-percent slowdown, and never
promote it?) and changes no output. On CUDA it is a spin kernel, so it is captured into the step's
graph like any other launch; on the CPU the step busy-waits.
"""

from __future__ import annotations

import time

import torch

_CYCLES_PER_US: dict[int, float] = {}


def _cycles_per_us(device: torch.device) -> float:
    """Measured once per GPU: the spin kernel counts clock cycles, whose rate the driver does not report
    reliably under boost clocks."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CYCLES_PER_US:
        cycles = 20_000_000
        torch.cuda._sleep(cycles)  # warm the clocks up before timing
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _CYCLES_PER_US[index] = cycles / (start.elapsed_time(end) * 1000.0)
    return _CYCLES_PER_US[index]


class Pad:
    def __init__(self, microseconds: float, device: torch.device):
        self.us = microseconds
        self.device = device
        self.cycles = int(microseconds * _cycles_per_us(device)) if microseconds > 0 and device.type == "cuda" else 0

    def __call__(self) -> None:
        if self.us <= 0:
            return
        if self.device.type == "cuda":
            torch.cuda._sleep(self.cycles)
            return
        until = time.perf_counter() + self.us * 1e-6
        while time.perf_counter() < until:
            pass
