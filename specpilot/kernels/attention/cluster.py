"""The one-row decode attention in thread-block clusters (cluster.cu): the `gemv` step's option on Hopper.

The Triton decode attention merges its splits through the L2: each split writes its partials and bumps
an arrival counter, and the last one reads them all back (kernels/attention/triton.py). Here they merge in
shared memory instead; on the H200 8B, a cluster of 8 made the tuned step 0.12-0.13 ms faster than the Triton
kernel's 8 splits on three GPUs (bench/results/2026-12-01_cluster_paired_*_h200.json, timed in turn with every
other config the same). Triton has no way to put the splits of one KV head into one cluster, so this
kernel is CUDA C++, compiled at run time by NVRTC and launched with cuda-bindings (both in the H200
image; neither is a runtime dependency of the package: without them the option is simply not offered; the
dev extras carry them so that the CPU tests build the kernel for sm_90). The step
tuning offers it as the attention configs {"CLUSTER": splits} (kernels/tuning/candidates.py).

Scope: one new row (T = 1), causal, no window, bf16 or fp16, head_dim 64 / 128 / 256, sm_90 or newer;
`eligible` says whether a call fits. The launch is captured into CUDA graphs like any other (the kernel
parameters are copied into the graph node).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specpilot.kernels import nvrtc

if TYPE_CHECKING:  # type hints only: Visibility is the step's type (speculative/, a layer up)
    from specpilot.core.contracts import Visibility

SOURCE = Path(__file__).with_name("cluster.cu")
WARPS = 8
SPLITS = (2, 4, 8)  # a cluster of 8 blocks is the largest every Hopper part must schedule
HEAD_DIMS = (64, 128, 256)
STATIC_SMEM = 48 * 1024
LOG2E = 1.4426950408889634


def smem_bytes(g: int, d: int, splits: int) -> int:
    """The kernel's static shared memory: the warps' and the splits' softmax states (m, l, acc)."""
    return 4 * (WARPS + splits) * g * (d + 2)


def eligible(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, vis: Visibility, splits: int) -> bool:
    """Whether this kernel can run this call (otherwise the Triton kernel does)."""
    b, t, hq, d = q.shape
    g = hq // k_cache.shape[1]
    return (q.is_cuda and t == 1 and vis.tree is None and not vis.window and splits in SPLITS
            and d in HEAD_DIMS and q.dtype in (torch.bfloat16, torch.float16)
            and k_cache.dtype == q.dtype and v_cache.dtype == q.dtype
            and vis.cache_len.dtype == torch.int64 and vis.start.dtype == torch.int64
            and all(x.stride(-1) == 1 for x in (q, k_cache, v_cache))
            and all(s % (d // 32) == 0 for x in (q, k_cache, v_cache) for s in x.stride()[:-1])
            and all(x.data_ptr() % 16 == 0 for x in (q, k_cache, v_cache))
            and smem_bytes(g, d, splits) <= STATIC_SMEM and nvrtc.bindings_available()
            and torch.cuda.get_device_capability(q.device)[0] >= 9)


def build(macros: dict[str, int], arch: str, verbose: bool = False) -> tuple[bytes, str]:
    """cluster.cu compiled by NVRTC for `arch` (kernels/nvrtc.build)."""
    return nvrtc.build(SOURCE, macros, arch, verbose)


def macros_for(g: int, d: int, splits: int, late: bool, preload: bool, half: bool) -> dict[str, int]:
    """The compile-time constants of one configuration (cluster.cu's header names them)."""
    return {"G": g, "D": d, "SPLITS": splits, "WARPS": WARPS, "LATE": int(late), "PRELOAD": int(preload),
            "HALF": int(half)}


@functools.cache
def _function(device: int, g: int, d: int, splits: int, late: bool, preload: bool, half: bool):
    """(module, function) for one configuration, loaded into the device's primary context (PyTorch's)."""
    module = nvrtc.load(device, build(macros_for(g, d, splits, late, preload, half), nvrtc.arch_of(device))[0])
    return module, nvrtc.function(module, "decode_attention")


def _attr(driver, kind: str, fill) -> object:
    attr = driver.CUlaunchAttribute()
    attr.id = getattr(driver.CUlaunchAttributeID, kind)
    fill(attr.value)
    return attr


def attend_cluster(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, vis: Visibility, scale: float,
                   splits: int, late: bool = False, preload: bool = True, pdl: bool = True) -> torch.Tensor:
    """q [B, 1, Hq, D]; k_cache, v_cache [B, Hkv, L, D]; `eligible` must hold. Returns [B, 1, Hq, D].
    late: the next kernel is released after this one's PDL wait, not at its start; preload: each warp's first
    committed K/V rows are loaded before that wait; pdl: launched as a programmatic dependent of the kernel
    before (which must then be PDL-aware, as the `gemv` step's are)."""
    from cuda.bindings import driver

    b, _, hq, d = q.shape
    hkv, length = k_cache.shape[1], k_cache.shape[2]
    device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    _, func = _function(device, hq // hkv, d, splits, late, preload, q.dtype == torch.float16)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)

    cfg = driver.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = b * hkv * splits, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = WARPS * 32, 1, 1
    cfg.sharedMemBytes = 0
    cfg.hStream = driver.CUstream(torch.cuda.current_stream(q.device).cuda_stream)

    def cluster(v):
        v.clusterDim.x, v.clusterDim.y, v.clusterDim.z = splits, 1, 1

    attrs = [_attr(driver, "CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION", cluster)]
    if pdl:
        attrs.append(_attr(driver, "CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION",
                           lambda v: setattr(v, "programmaticStreamSerializationAllowed", 1)))
    cfg.attrs, cfg.numAttrs = attrs, len(attrs)
    ptr, i64 = ctypes.c_void_p, ctypes.c_longlong
    cache_len, start = vis.cache_len.contiguous(), vis.start.contiguous()
    values = (q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), cache_len.data_ptr(), start.data_ptr(),
              out.data_ptr(), q.stride(0), q.stride(2), *k_cache.stride()[:3], *v_cache.stride()[:3],
              out.stride(0), out.stride(2), hkv, length, float(scale) * LOG2E)
    types = (ptr,) * 6 + (i64,) * 10 + (ctypes.c_int, ctypes.c_int, ctypes.c_float)
    nvrtc.check(driver.cuLaunchKernelEx(cfg, func, (values, types), 0), "cuLaunchKernelEx")
    return out

