"""The machine's achievable rates, measured in the same run as the profile they judge: memory bandwidth (the
faster of a large copy and a large reduction) and the matrix FLOP rate of the model's dtype."""

from __future__ import annotations

import time

import torch


def _seconds(fn, device: torch.device, reps: int) -> float:
    """Median seconds of fn() (CUDA events on the GPU, a wall clock on the CPU), after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1000)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def bandwidth(device: torch.device, mib: int | None = None, reps: int = 10) -> dict:
    """Bytes/s of a copy (read + write) and of a sum (read) over a buffer far larger than any cache."""
    mib = mib or (2048 if device.type == "cuda" else 128)
    src = torch.empty(mib * 2**20 // 2, dtype=torch.bfloat16, device=device).uniform_()
    dst = torch.empty_like(src)
    nbytes = src.numel() * 2
    copy = 2 * nbytes / _seconds(lambda: dst.copy_(src), device, reps)
    read = nbytes / _seconds(lambda: src.sum(dtype=torch.float32), device, reps)
    return {"copy_bytes_s": copy, "read_bytes_s": read, "bytes_s": max(copy, read), "buffer_mib": mib}


def flop_rate(device: torch.device, dtype: torch.dtype, n: int | None = None, reps: int = 10) -> dict:
    """FLOP/s of an n x n x n matrix product in the models' dtype."""
    n = n or (8192 if device.type == "cuda" else 512)
    dt = dtype if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    return {"flop_s": 2 * n**3 / _seconds(lambda: a @ b, device, reps), "n": n, "dtype": str(dt)}


def measure(device: torch.device, dtype: torch.dtype) -> dict:
    out = bandwidth(device)
    out.update(flop_rate(device, dtype))
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out
