"""Can a weight-streaming Triton GEMV with programmatic dependent launch (PDL) beat cuBLAS's decode
projections back to back? (issue 2: the last 10% to the weight-pass floor)

The decode step of a dense model is a chain of dependent GEMVs (per layer qkv -> o -> gate_up -> down,
each reading the previous one's output). cuBLAS reaches ~88% of the copy bandwidth on that chain: each
kernel ramps up and drains on its own. With PDL a kernel's blocks start while the previous kernel's
last blocks still run; they stream their first weight tile (which no earlier kernel writes), then
wait (`griddepcontrol.wait`) before touching the activation vector. This script times, for the
projection chain of the 8B and 27B shapes (random bf16 weights, one graph per variant):
  cublas       F.linear on a [1, K] row (what the engine calls today)
  triton       the streaming GEMV below, ordinary launches
  triton_pdl   the same kernel, PDL launches with the weight prefetch before the wait
Correctness first: each kernel against F.linear (float32 reference) on fresh random inputs, and the
PDL chain's final vector bit-identical to the ordinary chain's (a race would read stale activations).
Table last; JSON to $OUT/gemv_pdl.json.

Usage: SPECPILOT_COMMIT=<sha> PYTHONPATH=. python3 bench/gpu/gemv_pdl.py [--models dense-8b,dense-27b]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from bench.gpu.engine_core import MODELS, bandwidth, capture, provenance, timed

# (BLOCK_N, BLOCK_K, num_warps, num_stages): few enough to compile in seconds, wide enough to find
# the bytes-in-flight each shape needs.
CONFIGS = [(bn, bk, w, s) for bn, bk, w in ((8, 512, 4), (16, 256, 4), (16, 512, 4), (16, 512, 8), (32, 256, 4),
                                            (32, 256, 8), (32, 512, 8), (64, 128, 4))
           for s in (2, 4)]


@triton.jit
def stream_gemv(x_ptr, w_ptr, y_ptr, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_GDC: tl.constexpr):
    """y[n] = sum_k W[n, k] x[k] for one row x; N % BLOCK_N == 0 and K % BLOCK_K == 0 (checked by the caller)."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + n[:, None].to(tl.int64) * K + k[None, :]
    if USE_GDC:  # let the next kernel's blocks take SM slots as ours retire
        tl.extra.cuda.gdc_launch_dependents()
    w0 = tl.load(w_ptrs)  # weights: never written by an earlier kernel, safe before the wait
    if USE_GDC:  # from here on the previous kernel's output (x) is complete and visible
        tl.extra.cuda.gdc_wait()
    acc = w0.to(tl.float32) * tl.load(x_ptr + k).to(tl.float32)[None, :]
    for i in range(1, K // BLOCK_K):
        w = tl.load(w_ptrs + i * BLOCK_K)
        acc += w.to(tl.float32) * tl.load(x_ptr + i * BLOCK_K + k).to(tl.float32)[None, :]
    tl.store(y_ptr + n, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty))


def launch(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, cfg: tuple, pdl: bool) -> None:
    bn, bk, warps, stages = cfg
    n, k = w.shape
    assert n % bn == 0 and k % bk == 0 and x.numel() >= k and y.numel() >= n
    stream_gemv[(n // bn,)](x, w, y, k, BLOCK_N=bn, BLOCK_K=bk, USE_GDC=pdl, num_warps=warps, num_stages=stages,
                            launch_pdl=pdl)


def layer_shapes(cfg) -> dict[str, tuple[int, int]]:
    h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {"qkv": (q + 2 * kv, h), "o": (h, q), "gate_up": (2 * cfg.intermediate_size, h),
            "down": (h, cfg.intermediate_size)}


class Chain:
    """Per layer qkv -> o -> gate_up -> down, then the LM head; each step reads the previous output."""

    def __init__(self, cfg):
        shapes = layer_shapes(cfg)
        gen = torch.Generator(device="cuda").manual_seed(0)

        def weight(n, k):
            return (torch.randn(n, k, generator=gen, device="cuda") / k ** 0.5).to(torch.bfloat16)

        self.steps = [(name, weight(*shapes[name])) for _ in range(cfg.num_layers) for name in shapes]
        self.steps.append(("head", weight(cfg.vocab_size, cfg.hidden_size)))
        self.bytes = sum(w.numel() * w.element_size() for _, w in self.steps)
        self.x0 = torch.randn(cfg.hidden_size, generator=gen, device="cuda").to(torch.bfloat16)
        # one output buffer per projection kind; reuse across layers is safe: every write follows the wait
        self.out = {name: torch.empty(w.shape[0], dtype=torch.bfloat16, device="cuda") for name, w in self.steps}
        self.kind_of = {w.data_ptr(): name for name, w in self.steps}

    def run(self, gemv) -> torch.Tensor:
        x = self.x0
        for name, w in self.steps:
            y = self.out[name]
            gemv(x[: w.shape[1]], w, y)
            x = y
        return x


def check_kernels(chain: Chain, configs: dict) -> dict:
    """Each projection kind against a float32 reference on a fresh random row, with its chosen config."""
    worst = 0.0
    for name, w in {n: w for n, w in chain.steps}.items():
        x = torch.randn(w.shape[1], device="cuda").to(torch.bfloat16)
        y = torch.empty(w.shape[0], dtype=torch.bfloat16, device="cuda")
        for pdl in (False, True):
            launch(x, w, y, configs[name], pdl)
            ref = F.linear(x.float()[None], w.float())[0]
            err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
            worst = max(worst, err)
    return {"max_rel_err": worst, "ok": worst < 2e-2}


def tune(chain: Chain) -> dict[str, dict]:
    """Per projection kind, the config whose 32-layer run (distinct weights, one graph) is fastest."""
    best = {}
    kinds = {}
    for name, w in chain.steps:
        kinds.setdefault(name, []).append(w)
    for name, ws in kinds.items():
        x = torch.randn(max(w.shape[1] for w in ws), device="cuda").to(torch.bfloat16)
        y = torch.empty(ws[0].shape[0], dtype=torch.bfloat16, device="cuda")
        nbytes = sum(w.numel() * 2 for w in ws)
        rows = []
        for cfg in CONFIGS:
            if ws[0].shape[0] % cfg[0] or ws[0].shape[1] % cfg[1]:
                continue
            for w in ws[:1]:
                launch(x, w, y, cfg, False)  # compile outside capture
            ms = timed(capture(lambda cfg=cfg, x=x, y=y, ws=ws: [launch(x, w, y, cfg, False) for w in ws]).replay,
                       reps=10)
            rows.append((ms, cfg))
        ms, cfg = min(rows)
        best[name] = {"config": list(cfg), "tb_s_alone": nbytes / ms / 1e9}
        print(f"  [tune] {name:8s} {ws[0].shape[0]}x{ws[0].shape[1]} x{len(ws)}: {cfg} {nbytes / ms / 1e9:.2f} TB/s")
    return best


def bench_model(name: str, bw: dict) -> dict:
    chain = Chain(MODELS[name])
    print(f"[{name}] chain of {len(chain.steps)} projections, {chain.bytes / 1e9:.2f} GB")
    tuned = tune(chain)
    configs = {k: tuple(v["config"]) for k, v in tuned.items()}
    report = {"bytes": chain.bytes, "tuned": tuned, "check_kernels": check_kernels(chain, configs)}
    variants = {
        "cublas": lambda x, w, y: torch.mm(x[None], w.t(), out=y[None]),
        "triton": lambda x, w, y: launch(x, w, y, configs[chain.kind_of[w.data_ptr()]], False),
        "triton_pdl": lambda x, w, y: launch(x, w, y, configs[chain.kind_of[w.data_ptr()]], True),
    }
    finals = {}
    for variant, fn in variants.items():
        graph = capture(lambda fn=fn: chain.run(fn))
        graph.replay()
        finals[variant] = chain.out["head"].clone()
        ms = timed(graph.replay, reps=30)
        rate = chain.bytes / ms / 1e9
        report[variant] = {"ms": ms, "tb_s": rate, "pct_of_copy_bw": 100 * rate / bw["copy_tb_s"]}
        print(f"  {variant:10s} {ms:7.3f} ms  {rate:.2f} TB/s  {100 * rate / bw['copy_tb_s']:.1f}% of copy")
    report["pdl_equals_plain"] = bool(torch.equal(finals["triton"], finals["triton_pdl"]))
    return report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="dense-8b,dense-27b")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    report = {**provenance("PYTHONPATH=. python3 bench/gpu/gemv_pdl.py --models " + args.models),
              "triton": triton.__version__}
    report["bandwidth"] = bw = bandwidth()
    torch.cuda.empty_cache()
    print(f"[bw] copy {bw['copy_tb_s']:.2f} TB/s, read {bw['read_tb_s']:.2f} TB/s")
    report["models"] = {}
    for m in args.models.split(","):
        report["models"][m] = bench_model(m, bw)
        torch.cuda.empty_cache()
        with open(os.path.join(args.out, "gemv_pdl.json"), "w") as f:
            json.dump(report, f, indent=1)
    print("\nmodel       cublas %copy  triton %copy  triton_pdl %copy  kernels ok  pdl==plain")
    for m, r in report["models"].items():
        pct = {v: r[v]["pct_of_copy_bw"] for v in ("cublas", "triton", "triton_pdl")}
        print(f"{m:10s} {pct['cublas']:12.1f} {pct['triton']:13.1f} {pct['triton_pdl']:17.1f}  "
              f"{str(r['check_kernels']['ok']):10s}  {r['pdl_equals_plain']}")


if __name__ == "__main__":
    main()
