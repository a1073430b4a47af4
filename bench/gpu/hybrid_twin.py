"""Issue 58's GPU Must on the hybrid twin (`smollm2-hybrid-twin`: SmolLM2 x8 with 90 Gated DeltaNet layers of a
27B-class hybrid's shape, ~59 GB; it measures cost, never correctness).

    python3 bench/gpu/hybrid_twin.py [verify] [memory] [single]      (PRESET=tiny-hybrid: a CPU dry run)

verify  one GDN layer's verify kernels at the twin's shape (32 value heads, 128 x 128 states; no model): N rows as
        a chain with snapshots (stock), as a best_first-shaped tree in one pass (recompute) and with a state per
        node (snapshot), each checked against the reference first, then timed per call inside a CUDA graph of 30
        calls (as a step runs them, one a layer); the tree with its paths built once and built every call

memory  each system on one request (MAX_NEW tokens): the bytes its GDN layers hold for the commit per step (stock's
        chain and hybrid_tree=snapshot: a state per row; recompute: the rows' inputs), counted on the GDN states,
        and on CUDA the peak memory above the models during the decode; AR beside them
single  `specpilot bench` of AR, stock (a chain with snapshots) and best_first at N = 8/16/24/32/48 with
        hybrid_tree=recompute, and N = 32 with snapshots (LIMIT requests per benchmark, MAX_NEW tokens): tau and
        speedup over AR, each system's outputs against AR's

Batched (8 and 32 in flight): `SYSTEMS="stock|stock:tree=best_first,nodes=32,hybrid_tree=recompute"
python3 bench/gpu/batch_sweep.py smollm2-hybrid-twin 1,8,32`. Correctness first: `single` reports each system's
mismatch against AR (bf16), `memory` the tokens of each system beside AR's. Writes $OUT/hybrid_twin.json after each
part (a timeout keeps what was measured)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the verify dry run's kernels, before triton is first imported

from specpilot.bench.harness import Runner
from specpilot.bench.run import BenchPlan, bench_report, collect_requests, plan_systems, run_bench
from specpilot.deployment import load_deployment
from specpilot.models.cache import GDNState
from specpilot.runtime.pair import build_pair

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TREES = [f"stock:tree=best_first,nodes={n},hybrid_tree=recompute" for n in (8, 16, 24, 32, 48)]
SYSTEMS = ["stock", *TREES, "stock:tree=best_first,nodes=32"]


def main() -> None:
    parts = sys.argv[1:] or ["verify", "memory", "single"]
    preset = os.environ.get("PRESET", "smollm2-hybrid-twin")
    out = Path(os.environ.get("OUT", "/tmp")) / "hybrid_twin.json"
    dep = load_deployment(preset, None)
    dep = dataclasses.replace(dep, context=int(os.environ.get("CONTEXT", str(min(dep.context, 1024)))))
    limit, max_new = int(os.environ.get("LIMIT", "1")), int(os.environ.get("MAX_NEW", "128"))
    if "verify" in parts:  # on the CPU a dry run: small heads under Triton's interpreter, wall-clock times
        rows = verify_kernels() if torch.cuda.is_available() else verify_kernels(4, 2, 8)
        (out.parent / "hybrid_verify.json").write_text(json.dumps({"date": time.strftime("%Y-%m-%d"),
                                                                   "device": DEV,
                                                                   "commit": os.environ.get("SPECPILOT_COMMIT"),
                                                                   "command": " ".join(["python3", *sys.argv]),
                                                                   "gpu": torch.cuda.get_device_name() if DEV ==
                                                                   "cuda" else None,
                                                                   "rows": rows}, indent=1))
    if parts == ["verify"]:
        return
    t0 = time.time()
    target, drafter, tok = build_pair(dep)
    head = {"date": time.strftime("%Y-%m-%d"), "commit": os.environ.get("SPECPILOT_COMMIT"), "preset": preset,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "context": dep.context,
            "limit": limit, "max_new_tokens": max_new, "command": " ".join(["python3", *sys.argv]),
            "target": {"layers": target.cfg.kinds.count("attention"), "gdn_layers": target.cfg.kinds.count("gdn"),
                       "parameters": sum(p.numel() for p in target.parameters()), "load_s": time.time() - t0}}
    print(f"{preset}: {head['target']}", flush=True)
    runner = Runner(target, drafter, tok, dep.context, max_engines=2)
    plan = BenchPlan(dep, plan_systems(SYSTEMS), dep.datasets, dep.split, limit, max_new)
    requests = collect_requests(plan)
    if "memory" in parts:
        head["memory"] = [memory(runner, s, requests[0], max_new) for s in plan.systems]
        out.write_text(json.dumps(head, indent=1))
    if "single" in parts:
        summaries = run_bench(plan, runner, requests)
        report = bench_report(plan, summaries)
        head["single"] = {name: {k: s.get(k) for k in ("tau", "speedup_vs_ar", "mismatch_vs_ar", "decode_tokens_per_s",
                                                       "decode_ms_per_step")} for name, s in summaries.items()}
        head["environment"] = {k: report[k] for k in ("date", "device", "commit", "dirty") if k in report}
        out.write_text(json.dumps(head, indent=1))
        for name, s in head["single"].items():
            print(f"{name:52s} tau {s['tau']:.2f}  speedup {s.get('speedup_vs_ar') or 1:.3f}x  "
                  f"mismatch vs AR {100 * (s.get('mismatch_vs_ar') or 0):.2f}%", flush=True)
    out.write_text(json.dumps(head, indent=1))


def verify_kernels(heads: int = 32, k_heads: int = 16, dim: int = 128) -> list[dict]:
    """Chain verify (snapshots) vs tree verify (one pass; a state per node) of N rows of one GDN layer."""
    gen = torch.Generator(device=DEV).manual_seed(0)
    return [_verify(n, gen, heads, k_heads, dim) for n in (8, 16, 24, 32, 48)]


RECORDED = Path(__file__).with_name("trees_best_first_48.json")  # real best_first trees (SmolLM2 pair, CPU)


def _trees(n: int, deep: bool) -> list[list[int]]:
    """Trees of n nodes: a deep synthetic one (each node's parent among the few before it: depth about n / 2), or
    four recorded best_first trees cut to their n best nodes (depths 2-7: what a verify pass meets)."""
    if deep:
        return [[-1] + [max(0, i - 1 - (i % 3)) for i in range(1, n)]]
    recorded = json.loads(RECORDED.read_text())["parents"]
    return [recorded[len(recorded) * k // 5][:n] for k in range(1, 5)]


def _verify(n: int, gen: torch.Generator, heads: int, k_heads: int, dim: int, calls: int = 30) -> dict:
    """Each kernel checked against the reference, then timed as the engine runs it: `calls` calls back to back in one
    CUDA graph (a step runs one a GDN layer), the graph's median replay over 50 divided by `calls`. The tree is
    timed with its paths built once for all calls (what a verify pass does since session 42) and built in every
    call (before), and the paths' build alone; on a deep synthetic tree and on recorded best_first trees (mean)."""
    import torch.nn.functional as F

    from specpilot.kernels.gdn import naive
    from specpilot.kernels.gdn import triton as kernels
    from specpilot.runtime.graphs import StepGraph, median_ms

    def randn(*shape):
        return torch.randn(*shape, device=DEV, generator=gen)

    q, k = randn(1, n, k_heads, dim).bfloat16(), randn(1, n, k_heads, dim).bfloat16()
    v, g = randn(1, n, heads, dim).bfloat16(), -F.softplus(randn(1, n, heads))
    beta, state = torch.rand(1, n, heads, device=DEV, generator=gen), 0.1 * randn(1, heads, dim, dim)
    args = (q, k, v, g, beta, state)

    def per_call(fn) -> float:
        if DEV == "cpu":  # the dry run: one call, wall clock
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        graph = StepGraph(lambda: [fn() for _ in range(calls)], use_graph=True)
        graph.prepare()
        return median_ms(graph, 50) / calls

    chain = kernels.recurrent_rows(*args, snapshots=True, final=False)[0]
    ref_chain = naive.chain_snapshots(q.float(), k.float(), v.float(), g, beta, state)[0]
    row = {"rows": n, "calls_per_graph": calls, "rel_err_chain": _rel(chain, ref_chain),
           "ms_per_call": {"chain_snapshots": per_call(lambda: kernels.recurrent_rows(*args, snapshots=True,
                                                                                      final=False))}}
    for shape in ("deep", "best_first"):
        t, errs = {}, []
        for tree in _trees(n, shape == "deep"):
            parents = torch.tensor([tree], device=DEV)
            paths = kernels.tree_paths(parents)
            errs.append(_rel(kernels.tree_rows(*args, parents, paths=paths),
                             naive.tree(q.float(), k.float(), v.float(), g, beta, state, parents)))
            times = {"tree_recompute": per_call(lambda p=parents, w=paths: kernels.tree_rows(*args, p, paths=w)),
                     "tree_recompute_paths_each_call": per_call(lambda p=parents: kernels.tree_rows(*args, p)),
                     "tree_paths_alone": per_call(lambda p=parents: kernels.tree_paths(p)),
                     "tree_snapshots": per_call(lambda p=parents, w=paths: kernels.tree_rows(*args, p, snapshots=True,
                                                                                            paths=w))}
            for key, ms in times.items():
                t.setdefault(key, []).append(ms)
        row[shape] = {"ms_per_call": {key: sum(v) / len(v) for key, v in t.items()}, "trees": len(errs),
                      "rel_err_tree": max(errs)}
        row[shape]["tree_over_chain"] = row[shape]["ms_per_call"]["tree_recompute"] / row["ms_per_call"][
            "chain_snapshots"]
    c, d, b = row["ms_per_call"]["chain_snapshots"], row["deep"], row["best_first"]
    print(f"verify {n:>2} rows, ms a layer: chain+snapshots {c:.4f}; tree (paths once) deep "
          f"{d['ms_per_call']['tree_recompute']:.4f} ({d['tree_over_chain']:.2f}x), best_first "
          f"{b['ms_per_call']['tree_recompute']:.4f} ({b['tree_over_chain']:.2f}x); paths each call "
          f"{b['ms_per_call']['tree_recompute_paths_each_call']:.4f}, the build alone "
          f"{b['ms_per_call']['tree_paths_alone']:.4f}; tree+snapshots {b['ms_per_call']['tree_snapshots']:.4f}; "
          f"rel. error <= {max(d['rel_err_tree'], b['rel_err_tree'], row['rel_err_chain']):.1e}", flush=True)
    return row


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got - want).abs().max().item() / want.abs().max().item()


def memory(runner: Runner, system, request, max_new: int) -> dict:
    """One request: the GDN layers' bytes kept for the commit in a step (all layers, the largest step), and on
    CUDA the peak memory above what was allocated before (the engine's cache and graphs included: AR's row is the
    reference)."""
    pending: dict[int, int] = {}  # GDN layer -> the most bytes it held for one commit
    commit = GDNState.commit

    def counting(self, *a, **kw):  # a step's shapes are fixed: what a captured step holds, its capture held
        if self.pending:
            held = sum(t.numel() * t.element_size() for t in self.pending.values() if isinstance(t, torch.Tensor))
            pending[id(self)] = max(pending.get(id(self), 0), held)
        return commit(self, *a, **kw)

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    GDNState.commit = counting
    try:
        t0 = time.time()
        records = runner.run(system, request, max_new)
    finally:
        GDNState.commit = commit
    layers = runner.target.cfg.kinds.count("gdn")
    row = {"system": system.name, "tokens": sum(len(r.tokens) for r in records), "seconds": time.time() - t0,
           "pending_bytes_per_step": sum(pending.values()), "gdn_layers": layers,
           "state_bytes_per_sequence": sum(s.ssm.numel() * 4 + s.conv.numel() * s.conv.element_size()
                                           for s in runner.engine(system).cache.layers if isinstance(s, GDNState))}
    if cuda:
        row["peak_above_bytes"] = torch.cuda.max_memory_allocated() - before
    print(f"{system.name:52s} {json.dumps({k: v for k, v in row.items() if k != 'system'})}", flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
