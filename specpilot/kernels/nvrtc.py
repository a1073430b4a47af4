"""CUDA C++ kernels compiled at run time by NVRTC and launched through the driver API (cuda-bindings): the
cluster decode attention (kernels/attention/cluster.cu) and the few-row tensor-core products
(kernels/fewrow/fragment.cu). Both libraries are in the H200 image and in the dev extras (so that the CPU tests
build every kernel for sm_90 and read ptxas's report), never runtime dependencies: without them the cluster
attention is not offered, and an engine asked for the few-row options on a GPU says why it cannot run them
(weights/dense.few_row_path). Launches are captured into CUDA graphs like any other (the driver copies the
parameters into the graph node)."""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import torch


@functools.cache
def bindings_available() -> bool:
    """cuda-bindings (the driver API and NVRTC) imports, and a CUDA device of compute capability 9+ is there."""
    try:
        from cuda.bindings import driver, nvrtc  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def check(res, what: str):
    """cuda-bindings calls return (status, *values): raise on a failing status, else the value(s)."""
    err, *vals = res if isinstance(res, tuple) else (res,)
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err}")
    return vals[0] if len(vals) == 1 else vals


def cache_dir() -> Path:
    """Where built cubins are kept, by a hash of the source, macros and architecture: ~/.cache/specpilot/cubin.
    A GPU run may be handed cubins built elsewhere by copying them here (bench/gpu/prebuild.py)."""
    return Path.home() / ".cache" / "specpilot" / "cubin"


def build(source: Path, macros: dict[str, int], arch: str, verbose: bool = False) -> tuple[bytes, str]:
    """`source` compiled by NVRTC for `arch` (e.g. sm_90; no GPU needed): (cubin, NVRTC's log), from the cache
    when it holds this build (the log is then empty). verbose: always compiled; the log holds ptxas's report
    (registers, spills, shared memory), which the CPU tests read."""
    cached = cache_path(source, macros, arch)
    if not verbose and cached.exists():
        return cached.read_bytes(), ""
    cubin, log = _compile(source, macros, arch, verbose)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(cubin)
        tmp.replace(cached)
    except OSError:  # a read-only home: compile again next time
        pass
    return cubin, log


def cache_path(source: Path, macros: dict[str, int], arch: str) -> Path:
    key = hashlib.sha256(source.read_bytes() + repr((sorted(macros.items()), arch)).encode()).hexdigest()[:32]
    return cache_dir() / f"{source.stem}-{key}.cubin"


def _compile(source: Path, macros: dict[str, int], arch: str, verbose: bool) -> tuple[bytes, str]:
    from cuda.bindings import nvrtc

    prog = check(nvrtc.nvrtcCreateProgram(source.read_bytes(), source.name.encode(), 0, [], []),
                 "nvrtcCreateProgram")
    opts = [f"--gpu-architecture={arch}".encode(), b"-default-device", b"-std=c++17",
            *(f"-D{k}={v}".encode() for k, v in macros.items()), *([b"--ptxas-options=-v"] if verbose else [])]
    try:
        err = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
        log = b" " * check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        nvrtc.nvrtcGetProgramLog(prog, log)
        log = log.decode(errors="replace").rstrip(" \0")
        if int(err) != 0:
            raise RuntimeError(f"NVRTC could not compile {source.name} ({macros}): {log}")
        cubin = b" " * check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return cubin, log


def load(device: int, cubin: bytes):
    """The cubin loaded into the device's primary context (PyTorch's): the module."""
    from cuda.bindings import driver

    check(driver.cuInit(0), "cuInit")
    ctx = check(driver.cuDevicePrimaryCtxRetain(check(driver.cuDeviceGet(device), "cuDeviceGet")),
                "cuDevicePrimaryCtxRetain")
    check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return check(driver.cuModuleLoadData(cubin), "cuModuleLoadData")


def function(module, name: str):
    from cuda.bindings import driver

    return check(driver.cuModuleGetFunction(module, name.encode()), "cuModuleGetFunction")


def arch_of(device: int) -> str:
    """NVRTC's architecture for the device, e.g. sm_90."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"
