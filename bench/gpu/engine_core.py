"""Engine-core figures on one GPU (issue 2): correctness first, then timings, a table last.

1. Correctness: a tiny float32 pair on CUDA — stock == AR token for token, graphs == eager; on the 8B
   model (bf16) graph-captured AR == eager AR.
2. Bandwidth: device copy (bytes read + written) and a read-only reduction, measured in this run.
3. AR decode of random-weight dense models (~8B, ~27B; bf16, single request, CUDA graphs) against the
   weight-pass floor = bytes of the weights one decode step reads / measured bandwidth.
4. Target verify time for 1..64 rows, and the stock step (draft + verify + accept) with a 5-layer
   DFlash-style drafter of block 16.

Usage (repository root): SPECPILOT_COMMIT=<sha> PYTHONPATH=. python bench/gpu/engine_core.py [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from bench.gpu.shapes import MODELS, drafter_for
from specpilot.config import parse_system
from specpilot.config.plan import TuningTable
from specpilot.core.contracts import Forward, Visibility
from specpilot.fixtures.random_models import (
    random_drafter,
    random_target,
    tiny_drafter_config,
    tiny_target_config,
)
from specpilot.models.config import DenseConfig
from specpilot.models.dense import Mode
from specpilot.results import system_record
from specpilot.runtime.engine import Engine
from specpilot.runtime.graphs import StepGraph, median_ms

AR, STOCK = parse_system("ar"), parse_system("stock")
AR_EAGER = parse_system("ar:graphs=false")

WIDTHS = (1, 2, 4, 8, 16, 32, 48, 64)
CONTEXT = 1024
PROMPT, NEW = 128, 256
RUNS = 3  # generations of the request per engine: the figure is their median


def timed(fn, reps: int = 20, warm: int = 3) -> float:
    """Median milliseconds of fn() by CUDA events."""
    for _ in range(warm):
        fn()
    return median_ms(fn, reps)


def provenance(command: str) -> dict:
    """The header every GPU result JSON carries: when, which code (SPECPILOT_COMMIT), which GPU (and its state:
    gpu_state), how run."""
    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": os.environ.get("SPECPILOT_COMMIT"), "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "command": command, "gpu_state": gpu_state()}


# What tells the leases' GPUs apart: the same code's 8B step took 3.91 ms on some and 4.00 on others
# (bench/HISTORY.md, session 12), cuBLAS's alike, so a result should say which physical GPU and in what state.
GPU_FIELDS = ("serial", "uuid", "pci.bus_id", "clocks.sm", "clocks.max.sm", "clocks.mem", "temperature.gpu",
              "power.draw", "power.limit", "clocks_event_reasons.active")


def gpu_state() -> dict:
    """The current GPU's nvidia-smi fields (GPU_FIELDS) at this moment, one query each so that a field this
    driver does not know costs only itself (None); {} where nvidia-smi is missing. A diagnostic: whatever
    goes wrong ends up in the dict, never in the benchmark."""
    try:
        return _gpu_state(_gpu_index())
    except Exception as exc:  # noqa: BLE001 - see the docstring
        return {"error": repr(exc)[:300]}


def _gpu_index() -> str:
    """What `nvidia-smi -i` calls the current device: its UUID, else the first visible device."""
    try:
        uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    except Exception:  # noqa: BLE001 - no CUDA, or a torch without the field
        return os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"


def _gpu_state(index: str) -> dict:
    state = {}
    for field in GPU_FIELDS:
        try:
            out = subprocess.run(["nvidia-smi", "-i", index, f"--query-gpu={field}", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return state
        state[field] = out.stdout.strip() if out.returncode == 0 else None
    return state


def bandwidth() -> dict:
    n = 1 << 31  # 4 GiB of bf16: far past the 60 MB L2
    a = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    copy_ms = timed(lambda: b.copy_(a))
    read_ms = timed(lambda: a.sum(dtype=torch.float32))
    return {"copy_tb_s": 2 * n * 2 / copy_ms / 1e9, "read_tb_s": n * 2 / read_ms / 1e9}


def step_weight_bytes(target) -> int:
    """Bytes one decode step must read: every layer weight, final norm and LM head; one embedding row."""
    total = sum(p.numel() * p.element_size() for n, p in target.named_parameters() if not n.startswith("embed"))
    if target.cfg.tie_word_embeddings:
        total += target.embed.weight.numel() * target.embed.weight.element_size()
    return total


def decode_ms(eng: Engine, prompt: list[int], runs: int = RUNS) -> tuple:
    """The request (PROMPT tokens in, NEW out) `runs` times: (the first generation, the median ms per decoded
    token, every run's)."""
    gens = [eng.generate_one(prompt, NEW) for _ in range(runs)]
    per = [1000 * g.decode_s / g.decode_tokens for g in gens]
    return gens[0], statistics.median(per), per


def replays(eng: Engine) -> dict:
    """The AR step graph from position PROMPT: the median of 100 replays, each timed alone (the host waits
    for each), and NEW replays enqueued back to back with no host read, their mean (what the GPU takes for
    the request's steps; the generation's time per token over this is the host's share)."""
    eng.pos.fill_(PROMPT)
    alone = timed(eng._ar.graph.replay, reps=100)
    eng.pos.fill_(PROMPT)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(NEW):
        eng._ar.graph.replay()
    b.record()
    b.synchronize()
    return {"ar_graph_replay_ms": alone, "ar_back_to_back_ms": a.elapsed_time(b) / NEW}


def check_tiny() -> dict:
    cfg = tiny_target_config()
    t = random_target(cfg, seed=0, device="cuda")
    d = random_drafter(tiny_drafter_config(cfg, block_size=8, selector_rank=16, selector_top_k=8), device="cuda")
    eng = Engine(t, d, STOCK, context=256)
    eager = Engine(t, d, parse_system("stock:graphs=false"), context=256)
    prompt = list(range(3, 40))
    ar = eng.generate_one(prompt, 64, (), "ar").tokens
    st = eng.generate_one(prompt, 64, (), "stock").tokens
    st_eager = eager.generate_one(prompt, 64, (), "stock").tokens
    ok = ar == st == st_eager
    print(f"[check] tiny fp32 cuda: stock==ar {ar == st}, graph==eager {st == st_eager}")
    return {"stock_equals_ar": ar == st, "graph_equals_eager": st == st_eager, "ok": ok}


def verify_ms(target, n: int, context: int = CONTEXT) -> float:
    """One captured target verify of n chain rows after 512 committed tokens."""
    cache = target.new_cache(1, context)
    start = torch.tensor([512], device="cuda")
    tokens = torch.randint(0, target.cfg.vocab_size, (1, n), device="cuda")
    positions = (start + torch.arange(n, device="cuda"))[None]
    vis = Visibility(cache_len=start, start=start)

    def step():
        target(tokens, Forward(positions, positions, vis), cache, Mode.VERIFY)

    return timed(capture(step).replay)


# (name, options on top of `ar:gemv=true`): the first is the step-tuning run and the headline (the kernels'
# defaults: PDL on, norms handed over by the projection that writes the stream, loads one loop step ahead);
# no_ahead: each loop step of the one-row kernels loads its own tiles, the attention its first K/V block after
# the PDL wait (same arithmetic); no_handoff: every normed projection recomputes its norm in the weight loop
# (kernels/gemv.NormedStream).
GEMV_VARIANTS = (("pdl", ""), ("no_pdl", "pdl=off"), ("no_handoff", "handoff=false"), ("no_ahead", "ahead=false"),
                 ("one_round", "tune_rounds=1"), ("no_staged", "staged=false"), ("no_late", "attn_late=false"),
                 ("neither", "staged=false,attn_late=false"), ("three_rounds", "tune_rounds=3"),
                 ("l2_kv", "l2=weights_kv"), ("l2_off", "l2=off"), ("late_epilogue", "epilogue_early=false"),
                 ("no_cluster", "cluster=false"), ("no_start", "tune_start=false"), ("lookahead_2", "lookahead=2"))
# Loading ahead changes which tiles are fastest (registers, loads in flight): no_ahead gets configs tuned for it,
# one_round configs from a one-round step tuning, no_staged / no_late / neither configs tuned without the
# shared-memory ring / the attention's late release / both, three_rounds from a three-round step tuning, l2_*
# configs tuned with those L2 hints, no_cluster configs tuned without the cluster attention, no_start configs
# tuned from the autotuner's fallbacks, not from kernels/tuning/starts.py's table. Every other variant starts
# from a copy of the headline's table (keys it adds are tuned); lookahead_2 keeps the headline's configs, the
# host two steps ahead of the one it reads (runtime/graphs.Lookahead).
RETUNED = ("no_ahead", "one_round", "no_staged", "no_late", "neither", "three_rounds", "l2_kv", "l2_off",
           "no_cluster", "no_start")


def variant_system(options: str):
    return parse_system("ar:gemv=true" + (f",{options}" if options else ""))


def gemv_ar(target, prompt: list[int], reference: list[int], floor_ms: float, variants=GEMV_VARIANTS) -> dict:
    """AR with the few-row projections through the Triton GEMV, in each of GEMV_VARIANTS. The one-row
    kernels' configs (and the attention's split count) are chosen by timing the captured step in the
    first variant's warm-up; a later variant starts from a copy of them and tunes only kernels it adds
    (no_handoff's in-loop norms), except the RETUNED ones, tuned afresh. PDL and loading ahead change when
    kernels run and load, never what they compute (equal tokens under equal configs); without the norm
    hand-over the squares sum in another order and h * g is not rounded (tokens may differ after a near-tie)."""
    out, tokens = {}, {}
    headline = None
    for name, options in variants:
        system = variant_system(options)
        plan = system.plan()
        if headline is not None and name not in RETUNED:
            plan = dataclasses.replace(plan, table=TuningTable(headline.chosen))
        eng = Engine(target, None, system, context=CONTEXT, plan=plan)
        t0 = time.perf_counter()
        eng.warmup()
        warm_s = time.perf_counter() - t0
        headline = headline or eng.plan.table
        gen, ms, runs = decode_ms(eng, prompt)
        out[name] = {"system": system_record(eng), "ar_ms_per_token": ms, "ar_ms_per_token_runs": runs,
                     "pct_of_floor_copy_bw": 100 * floor_ms / ms, **replays(eng), "warmup_s": warm_s}
        if eng.tuning and "note" not in eng.tuning:
            out[name]["configs_chosen_in_the_step"] = eng.tuning
        tokens[name] = gen.tokens
        del eng
        gc.collect()
    default = variants[0][0]  # the headline is the default variant, not the fastest
    first = tokens[default]
    same = next((i for i, (a, b) in enumerate(zip(first, reference, strict=False)) if a != b), len(reference))
    for name, _ in variants:
        out[name]["same_tokens_as_headline"] = tokens[name] == first
    return {"variants": {n: out[n] for n, _ in variants}, "headline": default,
            "ar_ms_per_token": out[default]["ar_ms_per_token"],
            "pct_of_floor_copy_bw": out[default]["pct_of_floor_copy_bw"],
            "configs_chosen_in_the_step": out[default].get("configs_chosen_in_the_step"),
            "pdl_variants_same_tokens": tokens["no_pdl"] == first if "no_pdl" in tokens else None,
            "tokens_equal_to_cublas_ar_before_first_divergence": same}


def capture(step) -> torch.cuda.CUDAGraph:
    """step captured as a CUDA graph the way the engine captures its steps (warm-up on a side stream)."""
    graph = StepGraph(step, use_graph=True)
    with torch.inference_mode():
        graph.prepare()
    return graph.graph


def projections_only(target, bw: dict) -> dict:
    """The decode step's GEMVs alone (every layer's qkv, o, gate_up, down, then the LM head), back to back
    in one graph with no other kernel between them: what cuBLAS reaches without the small kernels, as
    F.linear on a [1, K] row (what the model calls) and as torch.mv."""
    weights = [w for layer in target.layers
               for w in (layer.attn.wqkv.weight, layer.attn.wo.weight, layer.mlp.w13.weight, layer.mlp.w2.weight)]
    weights.append(target.head_weight)
    xs = {k: torch.randn(1, k, dtype=torch.bfloat16, device="cuda") for k in {w.shape[1] for w in weights}}
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    out = {"bytes": nbytes}
    for variant in ("linear", "mv"):
        def step(variant=variant):
            for w in weights:
                x = xs[w.shape[1]]
                torch.nn.functional.linear(x, w) if variant == "linear" else torch.mv(w, x[0])
        ms = timed(capture(step).replay, reps=50)
        rate = nbytes / ms / 1e9
        out[variant] = {"ms": ms, "tb_s": rate, "pct_of_copy_bw": 100 * rate / bw["copy_tb_s"]}
    return out


def bench_model(name: str, cfg: DenseConfig, bw: dict, parts: set[str], variants=GEMV_VARIANTS) -> dict:
    t0 = time.perf_counter()
    target = random_target(cfg, seed=0, dtype=torch.bfloat16, device="cuda", rope_length=CONTEXT + 1)
    params = sum(p.numel() for p in target.parameters())
    wbytes = step_weight_bytes(target)
    print(f"[{name}] {params / 1e9:.2f}B params, {wbytes / 1e9:.2f} GB read per step, built in "
          f"{time.perf_counter() - t0:.1f}s")
    prompt = torch.randint(0, cfg.vocab_size - 1, (PROMPT,), generator=torch.Generator().manual_seed(0)).tolist()
    ar = Engine(target, None, AR, context=CONTEXT)
    ar.warmup()
    gen, ar_ms, ar_runs = decode_ms(ar, prompt)
    eager = Engine(target, None, AR_EAGER, context=CONTEXT).generate_one(prompt, 32)
    same = eager.tokens == gen.tokens[:32]
    rep = replays(ar)
    replay_ms = rep["ar_graph_replay_ms"]
    floor_copy = wbytes / (bw["copy_tb_s"] * 1e12) * 1e3
    floor_read = wbytes / (bw["read_tb_s"] * 1e12) * 1e3
    print(f"[{name}] AR {ar_ms:.3f} ms/token (graph replay alone {replay_ms:.3f}); floor {floor_copy:.3f} ms at copy "
          f"bandwidth -> {100 * floor_copy / ar_ms:.1f}% of floor; graph==eager {same}")
    out = {
        "params": params, "weight_bytes_per_step": wbytes, "ar_ms_per_token": ar_ms, "ar_ms_per_token_runs": ar_runs,
        **rep,
        "floor_ms_copy_bw": floor_copy, "floor_ms_read_bw": floor_read,
        "pct_of_floor_copy_bw": 100 * floor_copy / ar_ms, "pct_of_floor_read_bw": 100 * floor_read / ar_ms,
        "graph_equals_eager_32_tokens": same, "context": CONTEXT, "prompt_tokens": PROMPT, "new_tokens": NEW,
    }
    del ar
    gc.collect()
    if "gemv" in parts:
        try:  # a kernel that fails to build costs this part, not the rest of the run
            g = out["gemv"] = gemv_ar(target, prompt, gen.tokens, floor_copy, variants)
        except Exception as exc:  # noqa: BLE001 - recorded in the JSON and printed
            out["gemv"] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            print(f"[{name}] AR with Triton GEMV failed: {out['gemv']['error'][:300]}")
        else:
            for v, r in g["variants"].items():
                runs = " ".join(f"{x:.3f}" for x in r["ar_ms_per_token_runs"])
                print(f"[{name}] AR with Triton GEMV, {v}: {r['ar_ms_per_token']:.3f} ms/token (runs {runs}) -> "
                      f"{r['pct_of_floor_copy_bw']:.1f}% of floor; graph replay alone {r['ar_graph_replay_ms']:.3f}, "
                      f"back to back {r['ar_back_to_back_ms']:.3f}; tokens as {g['headline']}: "
                      f"{r['same_tokens_as_headline']}")
            print(f"[{name}] PDL on / off give the same tokens: {g['pdl_variants_same_tokens']}; same tokens as "
                  f"cuBLAS AR for {g['tokens_equal_to_cublas_ar_before_first_divergence']}")
    if "ceiling" in parts:
        c = out["projections_only"] = projections_only(target, bw)
        print(f"[{name}] projections alone in one graph: F.linear {c['linear']['tb_s']:.2f} TB/s "
              f"({c['linear']['pct_of_copy_bw']:.1f}% of copy), torch.mv {c['mv']['tb_s']:.2f} TB/s "
              f"({c['mv']['pct_of_copy_bw']:.1f}%)")
    if "verify" in parts:
        out["verify_ms"] = {n: verify_ms(target, n) for n in WIDTHS}
        print(f"[{name}] verify ms: " + " ".join(f"{n}:{v:.3f}" for n, v in out["verify_ms"].items()))
    if "stock" in parts:
        out.update(stock_step(target, cfg, prompt, gen.tokens, ar_ms, name))
    del target
    gc.collect()
    torch.cuda.empty_cache()
    return out


def stock_step(target, cfg: DenseConfig, prompt: list[int], reference: list[int], ar_ms: float, name: str) -> dict:
    dcfg = drafter_for(cfg)
    drafter = random_drafter(dcfg, seed=1, dtype=torch.bfloat16, device="cuda", rope_length=CONTEXT + 1)
    spec = Engine(target, drafter, STOCK, context=CONTEXT)
    spec.warmup()
    sgen = spec.generate_one(prompt, NEW)
    step_ms = 1000 * sgen.decode_s / len(sgen.accepted)
    print(f"[{name}] stock step (block 16, 5-layer drafter) {step_ms:.3f} ms = {step_ms / ar_ms:.2f} x AR step; "
          f"mismatch vs AR {sum(a != b for a, b in zip(sgen.tokens, reference, strict=False))}/{len(reference)}")
    return {"stock_step_ms": step_ms, "stock_step_over_ar": step_ms / ar_ms,
            "stock_tau_random_drafter": sum(sgen.accepted) / len(sgen.accepted)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--parts", default="gemv,verify,stock,ceiling", help="what to time beside AR")
    ap.add_argument("--gemv-variants", default="pdl,no_pdl,no_handoff,no_ahead,one_round",
                    help="which of GEMV_VARIANTS the gemv part runs (the first, pdl, always; also "
                         + ", ".join(n for n, _ in GEMV_VARIANTS[5:]) + ")")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    report = provenance(" ".join(["PYTHONPATH=. python3 bench/gpu/engine_core.py", *sys.argv[1:]]))
    report["check_tiny"] = check_tiny()
    report["bandwidth"] = bw = bandwidth()
    torch.cuda.empty_cache()
    print(f"[bw] copy {bw['copy_tb_s']:.2f} TB/s, read {bw['read_tb_s']:.2f} TB/s")
    parts = set(args.parts.split(","))
    report["parts"] = sorted(parts)
    names = set(args.gemv_variants.split(",")) | {GEMV_VARIANTS[0][0]}
    variants = tuple(v for v in GEMV_VARIANTS if v[0] in names)
    report["models"] = {m: bench_model(m, MODELS[m], bw, parts, variants) for m in args.models.split(",")}
    report["gpu_state_after"] = gpu_state()
    path = os.path.join(args.out, "engine_core.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print("\nmodel      AR ms/tok  floor ms  %floor  GEMV ms  %floor  stock step  verify ms by rows")
    for m, r in report["models"].items():
        g = r.get("gemv", {})
        print(f"{m:10s} {r['ar_ms_per_token']:9.3f} {r['floor_ms_copy_bw']:9.3f} {r['pct_of_floor_copy_bw']:6.1f}  "
              f"{g.get('ar_ms_per_token', float('nan')):7.3f} {g.get('pct_of_floor_copy_bw', float('nan')):6.1f}  "
              f"{r.get('stock_step_ms', float('nan')):10.3f}  "
              + " ".join(f"{n}:{v:.2f}" for n, v in r.get("verify_ms", {}).items()))


if __name__ == "__main__":
    main()
