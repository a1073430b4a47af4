"""Can the project launch a CUDA C++ kernel in thread-block clusters, beside its Triton kernels? (issue 2)

A question for the H200 image before any cluster kernel is written: the decode attention's splits now merge
through the L2 (an arrival counter, then the partials read back); in a cluster they could merge through
distributed shared memory. This compiles a small kernel with NVRTC (cuda-bindings, in the image), whose
clusters of 8 blocks each store a value into block 0's shared memory (`mapa` + `st.shared::cluster`), meet at
a cluster barrier, and block 0 writes the sum; it launches it with `cuLaunchKernelEx` (cluster dimension and
programmatic stream serialization attributes) eagerly, then after a Triton kernel inside a captured CUDA
graph, and checks the sums each time. Prints one line per step, writes probe_cluster.json.

Usage: PYTHONPATH=. python3 bench/gpu/probe_cluster.py [--out DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import traceback

import torch
import triton
import triton.language as tl

from bench.gpu.engine_core import provenance

SOURCE = r"""
extern "C" __global__ void cluster_sum(const float* in, float* out) {
    __shared__ float slots[8];
    asm volatile("griddepcontrol.wait;" ::: "memory");
    unsigned rank, cid;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(cid));
    float v = in[blockIdx.x] * 2.0f;
    if (threadIdx.x == 0) {
        unsigned local, remote;
        asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(local) : "l"(&slots[rank]));
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(0));
        asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(remote), "f"(v) : "memory");
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    if (rank == 0 && threadIdx.x == 0) {
        float s = 0.0f;
        for (int i = 0; i < 8; i++) s += slots[i];
        out[cid] = s;
    }
}
"""


@triton.jit
def _double(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(x_ptr + offs, x * 2.0, mask=offs < n)


def check(res, what: str):
    """cuda-bindings calls return (status, *values): raise on a failing status."""
    err, *vals = res if isinstance(res, tuple) else (res,)
    if int(err) != 0:
        raise RuntimeError(f"{what}: {err}")
    return vals[0] if len(vals) == 1 else vals


def compile_kernel():
    from cuda.bindings import driver, nvrtc

    prog = check(nvrtc.nvrtcCreateProgram(SOURCE.encode(), b"cluster_sum.cu", 0, [], []), "nvrtcCreateProgram")
    major, minor = torch.cuda.get_device_capability()
    opts = [f"--gpu-architecture=sm_{major}{minor}".encode(), b"-default-device"]
    err = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
    size = check(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    if int(err) != 0:
        raise RuntimeError(f"nvrtc: {err}: {log.decode(errors='replace')}")
    size = check(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
    cubin = b" " * size
    check(nvrtc.nvrtcGetCUBIN(prog, cubin), "cubin")
    check(driver.cuInit(0), "cuInit")
    module = check(driver.cuModuleLoadData(cubin), "cuModuleLoadData")
    return check(driver.cuModuleGetFunction(module, b"cluster_sum"), "cuModuleGetFunction")


def launch(func, inp: torch.Tensor, out: torch.Tensor, clusters: int, pdl: bool) -> None:
    from cuda.bindings import driver

    cfg = driver.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = 8 * clusters, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = 128, 1, 1
    cfg.sharedMemBytes = 0
    cfg.hStream = driver.CUstream(torch.cuda.current_stream().cuda_stream)
    cluster = driver.CUlaunchAttribute()
    cluster.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    cluster.value.clusterDim.x, cluster.value.clusterDim.y, cluster.value.clusterDim.z = 8, 1, 1
    attrs = [cluster]
    if pdl:
        serial = driver.CUlaunchAttribute()
        serial.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        serial.value.programmaticStreamSerializationAllowed = 1
        attrs.append(serial)
    cfg.attrs, cfg.numAttrs = attrs, len(attrs)
    args = ((inp.data_ptr(), out.data_ptr()), (ctypes.c_void_p, ctypes.c_void_p))
    check(driver.cuLaunchKernelEx(cfg, func, args, 0), "cuLaunchKernelEx")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    out_dir = ap.parse_args().out
    report = {**provenance("PYTHONPATH=. python3 bench/gpu/probe_cluster.py"), "steps": {}}
    steps = report["steps"]
    clusters = 16
    try:
        import cuda.bindings
        steps["cuda_bindings"] = getattr(cuda.bindings, "__version__", "?")
        func = compile_kernel()
        steps["compile"] = "ok"
        inp = torch.randn(8 * clusters, device="cuda")
        out = torch.zeros(clusters, device="cuda")
        launch(func, inp, out, clusters, pdl=False)
        torch.cuda.synchronize()
        want = (2 * inp).view(clusters, 8).sum(1)
        steps["eager"] = bool(torch.allclose(out, want))
        # in a graph, after a Triton kernel that doubles the input, with the PDL attribute
        x = inp.clone()
        out.zero_()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            _double[(1,)](x, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
            launch(func, x, out, clusters, pdl=True)
        x.copy_(inp)
        graph.replay()
        torch.cuda.synchronize()
        steps["graph_pdl"] = bool(torch.allclose(out, (4 * inp).view(clusters, 8).sum(1)))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(100):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        steps["graph_us_per_replay"] = start.elapsed_time(end) * 10
    except Exception as e:  # a probe: what failed is the result
        steps["error"] = f"{type(e).__name__}: {e}"
        steps["traceback"] = traceback.format_exc()
    for k, v in steps.items():
        print(f"{k}: {v}")
    with open(os.path.join(out_dir, "probe_cluster.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
