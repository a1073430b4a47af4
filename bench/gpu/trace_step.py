"""Block-level timeline of the `gemv` AR decode step (issue 2): where the step's DRAM idles.

Builds the random-weight model, lets the engine choose its one-row configs (step tuning), then for
each PDL mode (on, off) captures the AR step with every streaming GEMV, q/k/v + rope and
attention block stamping its start, PDL-wait return, last weight load and end (kernels/trace.py).
Correctness first: the traced graph gives the same next token as the untraced one. Then it times both
graphs (the stamps' own cost) and prints, per kernel kind, the medians over layers of the timeline
quantities `trace.summarize` defines (lead, release, busy, tail, blocks per SM, TB/s).

Usage: SPECPILOT_COMMIT=<sha> PYTHONPATH=. python3 bench/gpu/trace_step.py [--models dense-8b] [--out DIR]
       [--modes pdl,no_pdl]
"""

from __future__ import annotations

import argparse
import gc
import json
import os

import torch

from bench.gpu.engine_core import CONTEXT, MODELS, bandwidth, provenance, step_weight_bytes
from specpilot.fixtures.random_models import random_target
from specpilot.kernels.gemv import choice
from specpilot.kernels.trace import by_kind, summarize, tracing
from specpilot.runtime.engine import Engine
from specpilot.runtime.graphs import StepGraph, median_ms
from specpilot.runtime.options import parse_system

AR = parse_system("ar")
MODES = {"pdl": "", "no_pdl": "0"}
REPS = 50


def kind_bytes(cfg) -> dict[str, int]:
    """Weight bytes per launch of each traced kind (the kinds trace.slot names, and " ring" for
    gemv/staged.py's kernel)."""
    h, inter, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q = cfg.num_heads * d
    qkv = q + 2 * cfg.num_kv_heads * d
    out = {"qkv_rope": 2 * qkv * h, f"gemv {qkv}x{h}": 2 * qkv * h, f"gemv {h}x{q}": 2 * h * q,
           f"gemv {inter}x{h} gate_up": 4 * inter * h, f"gemv {h}x{inter}": 2 * h * inter,
           f"gemv {cfg.vocab_size}x{h}": 2 * cfg.vocab_size * h}
    return {**out, **{f"{k} ring": v for k, v in out.items() if k.startswith("gemv")}}


def middle_layer(rows: list[dict]) -> list[dict]:
    """The launches of a middle layer: from one layer's first q/k/v launch to the next one's."""
    starts = [i for i, r in enumerate(rows) if r["kind"] == "qkv_rope"]
    if len(starts) < 2:
        return rows
    mid = (len(starts) - 1) // 2
    return rows[starts[mid]:starts[mid + 1]]


def trace_mode(eng: Engine, pos: int, capacity: int) -> dict:
    def reset() -> None:
        eng.pos.fill_(pos)
        eng.token.fill_(7)

    with torch.inference_mode():
        plain = StepGraph(eng._ar_step, use_graph=True)
        reset()
        plain.prepare()
        reset()
        plain()
        want = eng.token.item()
        reset()
        plain_ms = median_ms(plain, REPS)
        with tracing(capacity) as trace:
            reset()
            eng._ar_step()  # compiles the traced kernels outside the capture
            torch.cuda.synchronize()
            trace.reset()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                eng._ar_step()
            reset()
            graph.replay()
            got = eng.token.item()
            reset()
            traced_ms = median_ms(graph.replay, REPS)
            reset()
            for _ in range(3):  # back to back, as in generation; the records keep the last replay
                graph.replay()
            torch.cuda.synchronize()
            records = trace.records()
    return {"same_token": got == want, "plain_ms": plain_ms, "traced_ms": traced_ms, "records": records}


def run_model(name: str, bw: dict) -> dict:
    cfg = MODELS[name]
    target = random_target(cfg, seed=0, dtype=torch.bfloat16, device="cuda", rope_length=CONTEXT + 1)
    floor = step_weight_bytes(target) / (bw["copy_tb_s"] * 1e12) * 1e3
    choice.forget()
    eng = Engine(target, None, context=CONTEXT, gemv=True)
    eng.warmup(AR)
    nbytes = kind_bytes(cfg)
    out = {"floor_ms": floor, "configs": eng.gemv_tuning, "modes": {}}
    saved = os.environ.get("SPECPILOT_PDL")
    try:
        for mode, env in MODES.items():
            os.environ["SPECPILOT_PDL"] = env
            t = trace_mode(eng, CONTEXT // 4, capacity=1 << 20)
            rows = summarize(t.pop("records"), nbytes)
            out["modes"][mode] = {**t, "pct_of_floor": 100 * floor / t["plain_ms"], "by_kind": by_kind(rows),
                                  "span_ms": rows[-1]["last_end"] / 1e3, "middle_layer": middle_layer(rows),
                                  "launches": rows}
            report_mode(name, mode, out["modes"][mode])
    finally:
        if saved is None:
            os.environ.pop("SPECPILOT_PDL", None)
        else:
            os.environ["SPECPILOT_PDL"] = saved
    del eng, target
    gc.collect()
    torch.cuda.empty_cache()
    return out


def report_mode(name: str, mode: str, m: dict) -> None:
    print(f"[{name} {mode}] same token traced/untraced {m['same_token']}; step {m['plain_ms']:.3f} ms "
          f"({m['pct_of_floor']:.1f}% of floor), traced {m['traced_ms']:.3f}, traced blocks span {m['span_ms']:.3f}")
    print(f"  {'kind':28s} {'n':>3s} {'busy ms':>8s} {'busy us':>8s} {'lead':>6s} {'early':>6s} {'release':>8s} "
          f"{'tail':>6s} {'SM max':>6s} {'TB/s':>6s}")
    for kind, k in m["by_kind"].items():
        cells = [f"{k[c]:{w}.2f}" if k[c] is not None else f"{'-':>{w}s}"
                 for c, w in (("busy", 8), ("lead", 6), ("early", 6), ("release", 8), ("tail", 6))]
        rate = f"{k['tb_s']:6.2f}" if k["tb_s"] else "     -"
        print(f"  {kind:28s} {k['launches']:3d} {k['busy_ms']:8.3f} {' '.join(cells)} {k['per_sm_max']:6d} {rate}")
    layer = m["middle_layer"]
    t0 = layer[0]["first_start"] if layer else 0.0
    print("  a middle layer (us from its first start): kind, blocks, first start, release, last end, lead")
    for r in layer:
        release = f"{r['release']:6.2f}" if r["release"] is not None else "     -"
        lead = f"{r['lead']:6.2f}" if r["lead"] is not None else "     -"
        print(f"    {r['kind']:28s} {r['blocks']:5d} {r['first_start'] - t0:8.2f} {release} "
              f"{r['last_end'] - t0:8.2f} {lead}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="dense-8b")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of PDL modes to trace (pdl, no_pdl)")
    args = ap.parse_args()
    for mode in set(MODES) - set(args.modes.split(",")):
        del MODES[mode]
    report = {**provenance(f"PYTHONPATH=. python3 bench/gpu/trace_step.py --models {args.models} "
                                f"--modes {args.modes}"),
              "context": CONTEXT, "position": CONTEXT // 4, "times": "microseconds unless named _ms"}
    report["bandwidth"] = bw = bandwidth()
    report["models"] = {m: run_model(m, bw) for m in args.models.split(",")}
    with open(os.path.join(args.out, "trace_step.json"), "w") as f:
        json.dump(report, f, indent=1)
    print("\nmodel      mode       step ms  %floor  traced ms  same token")
    for m, r in report["models"].items():
        for mode, x in r["modes"].items():
            print(f"{m:10s} {mode:10s} {x['plain_ms']:7.3f} {x['pct_of_floor']:6.1f}  {x['traced_ms']:9.3f}  "
                  f"{x['same_token']}")


if __name__ == "__main__":
    main()
