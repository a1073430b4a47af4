"""The decode-step projections of the 8B and 27B shapes: cuBLAS against each Triton GEMV config.

Correctness first (each config against cuBLAS on random bf16 inputs), then times (median of CUDA
events), a table last, JSON to $OUT/gemv_sweep.json. Weights are 25-600 MB each, far past the 60 MB
L2, so every call streams from HBM.

Usage: PYTHONPATH=. python3 bench/gpu/gemv_sweep.py
"""

from __future__ import annotations

import functools
import json
import os

import torch

from bench.gpu.engine_core import MODELS, bandwidth, provenance, timed
from specpilot.kernels.gemv import project
from specpilot.kernels.gemv.triton import _CONFIGS, gemv_triton


def shapes(cfg) -> dict[str, tuple[int, int]]:
    return {"qkv": (cfg.q_dim + 2 * cfg.kv_dim, cfg.hidden_size), "o": (cfg.hidden_size, cfg.q_dim),
            "gate_up": (2 * cfg.intermediate_size, cfg.hidden_size), "down": (cfg.hidden_size, cfg.intermediate_size),
            "head": (cfg.vocab_size, cfg.hidden_size)}


def run_config(conf, x, w, gate_up: bool):
    config = dict(conf.kwargs, num_warps=conf.num_warps, num_stages=conf.num_stages)
    fn = functools.partial(gemv_triton, x, w, gate_up=gate_up, config=config)
    return fn(), fn


def main() -> None:
    bw = bandwidth()
    rows = []
    report = {**provenance("PYTHONPATH=. python3 bench/gpu/gemv_sweep.py"), "bandwidth": bw}
    for model in ("dense-8b", "dense-27b"):
        for name, (n, k) in shapes(MODELS[model]).items():
            gen = torch.Generator(device="cuda").manual_seed(n + k)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) / k ** 0.5
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            gate_up = name == "gate_up"
            cublas = functools.partial(project, x, w, gate_up=gate_up)  # cuBLAS (+ the silu kernel)
            ref = cublas()
            base_ms = timed(cublas, reps=50)
            best = (None, float("inf"))
            for conf in _CONFIGS:
                y, fn = run_config(conf, x, w, gate_up)
                err = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
                if not err < 2e-2:
                    raise SystemExit(f"{model} {name} {conf}: relative error {err}")
                ms = timed(fn, reps=50)
                best = min(best, (str(conf), ms), key=lambda b: b[1])
            tb = n * k * 2 / 1e9
            rows.append({"model": model, "proj": name, "n": n, "k": k, "cublas_ms": base_ms, "triton_ms": best[1],
                         "triton_config": best[0], "cublas_tb_s": tb / base_ms, "triton_tb_s": tb / best[1]})
    report["rows"] = rows
    with open(os.path.join(os.environ.get("OUT", "."), "gemv_sweep.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"copy bandwidth {bw['copy_tb_s']:.2f} TB/s")
    print("model      proj      N x K            cuBLAS TB/s  Triton TB/s  best config")
    for r in rows:
        print(f"{r['model']:10s} {r['proj']:8s} {r['n']:6d} x {r['k']:6d}  {r['cublas_tb_s']:10.2f}  "
              f"{r['triton_tb_s']:10.2f}  {r['triton_config']}")


if __name__ == "__main__":
    main()
