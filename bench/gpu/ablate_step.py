"""Where the `gemv` decode step's time goes, measured by ablation inside the captured graph (issue 2).

A profiler lists kernel durations, but with programmatic dependent launch a kernel's duration includes
the time its blocks sit waiting for the previous kernel, and the cost that matters is what a piece
adds to the graph-replayed step. So this times the engine's AR step (random-weight 8B / 27B, bf16,
configs chosen by the engine's own step tuning) with pieces swapped out:
  full            the step as the engine runs it
  pdl_off         the same with SPECPILOT_PDL=0
  no_attention    attention replaced by passing q through (the output projection reads q)
  gemvs_only      also the rope: q/k/v projected by the plain streaming GEMV (no rotary, no cache
                  write)
  skip_<p>        one projection kind left out (o, gate_up, down, head: its output replaced by the
                  residual or zeros): the step's time minus this is what the projection costs in the
                  graph, its bytes over that its effective bandwidth
  gate_up_unfused a real alternative: gate/up as one plain projection, then the SiLU-mul kernel
  plain_gemvs     gemvs_only without the fusions (norm prologue, residual epilogue, SiLU-gated pair):
                  the chain of plain GEMVs that bench/gpu/gemv_pdl.py times alone
and the attention's split count at several cache positions. Kernels an ablation adds get their
configs by the same step tuning as the engine's. Apart from full and gate_up_unfused the ablations
compute garbage: only their times mean anything; `full` is checked against cuBLAS's tokens first.

Usage: SPECPILOT_COMMIT=<sha> PYTHONPATH=. python3 bench/gpu/ablate_step.py [--models dense-8b,dense-27b]
       [--only a,b | --options | --ring-sweep | --early | --steps | --greedy | --embed | --tail | --l2 | --epilogue
        | --attention-parts | --cluster]  (several paired flags: timed one after another on one tuned engine)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os

import torch

from bench.gpu.engine_core import CONTEXT, MODELS, bandwidth, provenance, step_weight_bytes
from specpilot.fixtures.random_models import random_target
from specpilot.kernels.attention.triton import ABLATIONS as ATTENTION_PARTS
from specpilot.kernels.gemv import L2_HINTS, choice, stream_of
from specpilot.kernels.swiglu import silu_mul
from specpilot.models import dense, layers
from specpilot.runtime.engine import Engine
from specpilot.runtime.graphs import StepGraph, median_ms, replay_ms
from specpilot.runtime.options import parse_system

AR = parse_system("ar")
POSITIONS = (128, 256, 512, 896)


def passthrough_attention(q, *args, **kwargs):
    return q


def q_only_rope(qkv, positions, cos, sin, qn, kn, eps, k_cache, v_cache, slots, hq, hkv, d, want_q=True, **kw):
    return qkv[..., : hq * d].reshape(*qkv.shape[:-1], hq, d)


REAL_PROJECT = layers.project


def kind_of(weight, gate_up: bool, residual) -> str:
    if gate_up:
        return "gate_up"
    if residual is not None:
        return "down" if weight.shape[1] == CURRENT["inter"] else "o"
    return "head" if weight.shape[0] == CURRENT["vocab"] else "qkv"


FUSIONS = ("norm", "res", "pair")


def project_variant(skip: str = "", unfuse_gate_up: bool = False, keep: tuple = FUSIONS):
    """keep: the fusions kept. Without "norm" no norm prologue and no hand-over to the next norm, without
    "res" no residual epilogue, without "pair" gate/up as one plain projection whose first half feeds the
    down projection (timing only; with none kept, the chain of plain GEMVs bench/gpu/gemv_pdl.py times)."""
    def project(x, weight, bias=None, *, norm_weight=None, eps=0.0, residual=None, gate_up=False, gemv=False,
                next_norm=None):
        if kind_of(weight, gate_up, residual) == skip:
            n = weight.shape[0] // (2 if gate_up else 1)
            return residual if residual is not None else stream_of(x).new_zeros(*stream_of(x).shape[:-1], n)
        if keep != FUSIONS:
            nw, nxt = (norm_weight, next_norm) if "norm" in keep else (None, None)
            x = x if "norm" in keep else stream_of(x)
            res = residual if "res" in keep else None
            if gate_up and "pair" not in keep:
                return REAL_PROJECT(x, weight, bias, norm_weight=nw, eps=eps, gemv=gemv)[..., : weight.shape[0] // 2]
            return REAL_PROJECT(x, weight, bias, norm_weight=nw, eps=eps, residual=res, gate_up=gate_up, gemv=gemv,
                                next_norm=nxt)
        if gate_up and unfuse_gate_up:
            return silu_mul(REAL_PROJECT(x, weight, bias, norm_weight=norm_weight, eps=eps, gemv=gemv))
        return REAL_PROJECT(x, weight, bias, norm_weight=norm_weight, eps=eps, residual=residual, gate_up=gate_up,
                            gemv=gemv, next_norm=next_norm)

    return project


CURRENT = {}  # the model's intermediate size and vocabulary, for kind_of
ONLY: set[str] = set()  # --only
OPTIONS: list[str] = []  # the paired flags given (--options, --ring-sweep, ...), in PAIRED's order
ABLATIONS = {
    "full": {},
    "pdl_off": {},
    "no_attention": {"attend": passthrough_attention},
    "gemvs_only": {"attend": passthrough_attention, "rope_qkv": q_only_rope,
                   "qkv_rope_applies": lambda *a, **k: False},
    **{f"skip_{p}": {"project": project_variant(skip=p)} for p in ("o", "gate_up", "down", "head")},
    "gate_up_unfused": {"project": project_variant(unfuse_gate_up=True)},
}
ABLATIONS["plain_gemvs"] = {**ABLATIONS["gemvs_only"], "project": project_variant(keep=())}
for _f in FUSIONS:  # plain GEMVs plus one fusion
    ABLATIONS[f"plain_plus_{_f}"] = {**ABLATIONS["gemvs_only"], "project": project_variant(keep=(_f,))}


def timed_step(eng: Engine, pos: int, reps: int = 30) -> float:
    def reset() -> None:
        eng.pos.fill_(pos)

    with torch.inference_mode():
        return min(replay_ms(eng._ar_step, reset, reps=reps) for _ in range(3))


def ablate(eng: Engine) -> dict:
    out = {}
    pos = CONTEXT // 4
    outer = os.environ.get("SPECPILOT_PDL", "")  # the caller's setting: every variant but pdl_off runs with it

    def reset() -> None:
        eng.pos.fill_(pos)

    for name, patches in ABLATIONS.items():
        if ONLY and name not in ONLY and name != "full":
            continue
        modules = [layers] + ([dense] if "project" in patches else [])  # the LM head's projection is in dense
        saved = [(m, k, getattr(m, k)) for m in modules for k in patches if hasattr(m, k)]
        os.environ["SPECPILOT_PDL"] = "0" if name == "pdl_off" else outer
        try:
            for m, k, _ in saved:
                setattr(m, k, patches[k])
            with torch.inference_mode():  # kernels this variant adds: configs by the engine's step tuning
                choice.tune_step(eng._ar_step, lambda step: replay_ms(step, reset))
            out[name] = timed_step(eng, pos)
        finally:
            for m, k, v in saved:
                setattr(m, k, v)
            os.environ["SPECPILOT_PDL"] = outer
    return out


def projection_costs(cfg, times: dict) -> dict:
    """Each projection kind's cost in the graph (full minus skip) and its effective bandwidth."""
    per_layer = {"o": cfg.q_dim * cfg.hidden_size, "gate_up": 2 * cfg.intermediate_size * cfg.hidden_size,
                 "down": cfg.intermediate_size * cfg.hidden_size}
    nbytes = {k: 2 * v * cfg.num_layers for k, v in per_layer.items()}
    nbytes["head"] = 2 * cfg.vocab_size * cfg.hidden_size
    out = {}
    for p, b in nbytes.items():
        cost = times["full"] - times[f"skip_{p}"]
        out[p] = {"bytes": b, "ms": cost, "tb_s": b / cost / 1e9 if cost > 0 else None}
    return out


def splits_by_position(eng: Engine, g: int, hkv: int) -> dict:
    key = ("attention", 1, hkv, g, 128, CONTEXT)
    kept = choice._CHOSEN.get(key)
    table = {}
    try:
        for cfg in choice.CANDIDATES["attention"]:
            if cfg.get("LATE"):  # a split count once (the early release, as before)
                continue
            choice._CHOSEN[key] = cfg
            table[cfg["NUM_SPLITS"]] = {p: timed_step(eng, p, reps=20) for p in POSITIONS}
    finally:
        if kept is not None:
            choice._CHOSEN[key] = kept
    return {"chosen": kept, "ms_by_splits_and_position": table}


def without_late(config: dict) -> dict:
    """The config with the attention's LATE release off (a no-op for other kernels' configs)."""
    return {f: v for f, v in config.items() if f != "LATE"}


def in_turn(eng: Engine, variants: dict[str, dict], rounds: int, pos: int) -> dict[str, list[float]]:
    """Each variant's configs timed in turn, `rounds` times, so that drift hits them alike; the configs
    chosen before are back after."""
    kept = dict(choice._CHOSEN)
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, configs in variants.items():
            choice._CHOSEN.clear()
            choice._CHOSEN.update(configs)
            times[name].append(timed_step(eng, pos))
    choice._CHOSEN.clear()
    choice._CHOSEN.update(kept)
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    """Each variant's median round."""
    return {n: sorted(t)[len(t) // 2] for n, t in times.items()}


def next_token(eng: Engine, pos: int) -> int:
    """The token one AR step gives from position pos and token 7 (the same state for every variant)."""
    with torch.inference_mode():
        eng.pos.fill_(pos)
        eng.token.fill_(7)
        eng._ar_step()
    return eng.token.item()


def without_rings(eng: Engine, pos: int, staged: list[tuple]) -> dict:
    """The configs chosen now with each key in `staged` (one that chose a STAGE ring) re-tuned, one round,
    over the configs without a ring; the choice before is back after."""
    chosen = dict(choice._CHOSEN)
    with _env(SPECPILOT_GEMV_STAGED="0"):
        for k in staged:
            del choice._CHOSEN[k]
        with torch.inference_mode():
            choice.tune_step(eng._ar_step, lambda step: replay_ms(step, lambda: eng.pos.fill_(pos)), rounds=1)
        retuned = dict(choice._CHOSEN)
    choice._CHOSEN.clear()
    choice._CHOSEN.update(chosen)
    return retuned


def options_paired(eng: Engine, rounds: int = 5) -> dict:
    """The step with the configs the tuning chose against the same without the attention's LATE release,
    without the shared-memory ring (each key that chose STAGE re-tuned over the other configs), and
    without both; the four timed in turn, `rounds` times, so that drift hits them alike."""
    pos = CONTEXT // 4
    chosen = dict(choice._CHOSEN)
    staged = [k for k, c in chosen.items() if c.get("STAGE")]
    no_late = {k: without_late(c) for k, c in chosen.items()}
    no_staged = without_rings(eng, pos, staged)
    neither = {k: without_late(c) for k, c in no_staged.items()}
    variants = {"chosen": chosen, "no_late": no_late, "no_staged": no_staged, "neither": neither}
    times = in_turn(eng, variants, rounds, pos)
    late = {repr(k): c for k, c in chosen.items() if c.get("LATE")}
    return {"median_ms": medians(times), "ms_by_round": times, "late_chosen": late,
            "staged_chosen": {repr(k): chosen[k] for k in staged},
            "replaced_by": {repr(k): no_staged[k] for k in staged}}


def with_early(config: dict, key: tuple, early: bool) -> dict:
    """A projection's or q/k/v's config with EARLY set or cleared; the attention's with its preload (AHEAD)
    on when early, so that the K/V it loads before its wait can arrive while q/k/v still streams."""
    if key[0] == "attention":
        return {f: v for f, v in config.items() if f != "AHEAD"} if early else config
    return {**{f: v for f, v in config.items() if f != "EARLY"}, **({"EARLY": True} if early else {})}


def early_paired(eng: Engine, rounds: int = 5) -> dict:
    """The tuning's choice against every kernel releasing its successor after its last weight load (no
    EARLY anywhere), every one releasing it at once (EARLY everywhere, the attention preloading), and
    only q/k/v releasing the attention early; timed in turn, `rounds` times."""
    pos = CONTEXT // 4
    chosen = dict(choice._CHOSEN)

    def variant(early) -> dict:
        return {k: with_early(c, k, early(k)) for k, c in chosen.items()}

    variants = {"chosen": chosen, "no_early": variant(lambda k: False), "all_early": variant(lambda k: True),
                "qkv_early": variant(lambda k: k[0] in ("qkv_rope", "attention")),
                "mlp_early": variant(lambda k: k[0] == "gemv" and dict(k[3:]).get("GATE_UP"))}
    times = in_turn(eng, variants, rounds, pos)
    return {"median_ms": medians(times), "ms_by_round": times,
            "early_chosen": [repr(k) for k, c in chosen.items() if c.get("EARLY")]}


def steps_paired(eng: Engine, rounds: int = 5) -> dict:
    """What a step costs outside its kernels (the graph's launch, its first kernel's start, the drain after
    its last): per token, one AR step a graph replayed alone (synchronised, as the tuning times it) or eight
    replays back to back (as generation runs them), against graphs of 2 and 4 steps; timed in turn."""
    pos = CONTEXT // 4

    def graph_of(k: int) -> StepGraph:
        graph = StepGraph(lambda: [eng._ar_step() for _ in range(k)], use_graph=True)
        eng.pos.fill_(pos)
        with torch.inference_mode():
            graph.prepare()
        return graph

    graphs = {k: graph_of(k) for k in (1, 2, 4)}
    ways = {"1 a graph": (1, 1), "1 a graph, 8 back to back": (1, 8), "2 a graph": (2, 1), "4 a graph": (4, 1),
            "4 a graph, 2 back to back": (4, 2)}
    times = {name: [] for name in ways}
    for _ in range(rounds):
        for name, (k, back) in ways.items():
            eng.pos.fill_(pos)  # every way covers the same 32 positions from pos
            ms = median_ms(lambda k=k, back=back: [graphs[k]() for _ in range(back)], 32 // (k * back))
            times[name].append(ms / (k * back))
    return {"median_ms": medians(times), "ms_by_round": times}


def switch_paired(eng: Engine, switch: str, ways: dict[str, str], rounds: int = 5) -> dict:
    """The step with an environment switch at each of its values (ways: name -> value); see env_paired."""
    return {"switch": switch, **env_paired(eng, {name: {switch: value} for name, value in ways.items()}, rounds)}


def env_paired(eng: Engine, ways: dict[str, dict[str, str]], rounds: int = 5) -> dict:
    """The step under each way's environment (ways: name -> variables), the configs the tuning chose (a
    kernel key only one way launches is tuned first, one round), timed in turn; first the next token each
    way from the same state."""
    pos = CONTEXT // 4
    tokens = {}
    for name, env in ways.items():
        with _env(**env):
            with torch.inference_mode():
                choice.tune_step(eng._ar_step, lambda step: replay_ms(step, lambda: eng.pos.fill_(pos)), rounds=1)
            tokens[name] = next_token(eng, pos)
    times = {name: [] for name in ways}
    for _ in range(rounds):
        for name, env in ways.items():
            with _env(**env):
                times[name].append(timed_step(eng, pos))
    return {"ways": ways, "median_ms": medians(times), "ms_by_round": times, "next_token": tokens,
            "same_token": len(set(tokens.values())) == 1}


def greedy_paired(eng: Engine) -> dict:
    """The step's tail as one kernel (kernels/greedy: argmax, token, position) against PyTorch's three
    launches."""
    return switch_paired(eng, "SPECPILOT_GREEDY_KERNEL", {"greedy kernel": "1", "torch argmax, copy, add": "0"})


def embed_paired(eng: Engine) -> dict:
    """The embedding kernel that hands the first layer's norm its inputs (kernels/embed) against PyTorch's
    gather with the norm in the first q/k/v's loop (its own tuned config)."""
    return switch_paired(eng, "SPECPILOT_EMBED_KERNEL", {"embed kernel": "1", "torch gather, norm in q/k/v": "0"})


def epilogue_paired(eng: Engine) -> dict:
    """The one-row kernels' epilogue inputs requested before the weight loop or after it (kernels/gemv.
    epilogue_early), each with the L2 hints on the weights and without (kernels/gemv.l2_hints)."""
    return env_paired(eng, {f"epilogue {e}, L2 {h}": {"SPECPILOT_EPILOGUE_EARLY": e_val, "SPECPILOT_L2_HINTS": h}
                            for e, e_val in (("early", "1"), ("late", "0")) for h in ("weights", "off")})


def tail_paired(eng: Engine, rounds: int = 5) -> dict:
    """The attention at the q/k/v kernel's tail (attention/tail.py) in 1, 2, 4 and 8 splits (and 8 at 8
    warps) against its own kernel, every other config as the tuning chose them (without ATTN offered, so
    that the attention kernel's config was tuned too); timed in turn, `rounds` times; first the next token
    each way from the same state."""
    pos = CONTEXT // 4
    chosen = dict(choice._CHOSEN)
    variants = {"attention kernel": chosen}
    for s in choice.ATTN_SPLITS:
        variants[f"tail {s}"] = {k: {**c, "ATTN": s} if k[0] == "qkv_rope" else c for k, c in chosen.items()}
    # at 4 warps ptxas spills the q/k/v kernel with the tail (tests/test_kernels_compile.py); at 8 it does not
    variants["tail 8, 8 warps"] = {k: {**c, "ATTN": 8, "num_warps": 8} if k[0] == "qkv_rope" else c
                                   for k, c in chosen.items()}
    tokens = {}
    for name, configs in variants.items():
        choice._CHOSEN.clear()
        choice._CHOSEN.update(configs)
        tokens[name] = next_token(eng, pos)
    choice._CHOSEN.clear()
    choice._CHOSEN.update(chosen)
    times = in_turn(eng, variants, rounds, pos)
    return {"median_ms": medians(times), "ms_by_round": times, "next_token": tokens,
            "same_token": len(set(tokens.values())) == 1, "keys": [repr(k) for k in chosen if k[0] == "qkv_rope"]}


def l2_paired(eng: Engine, rounds: int = 3) -> dict:
    """The L2 hints (kernels/gemv.l2_hints: off, on the weights, on the weights and the K/V cache) with the
    configs the tuning chose, and, where it gave a projection the shared-memory ring (whose cp.async copies
    carry no hint, so their lines still push the K/V out), with those keys re-tuned without it; each also
    with the attention loading its first K/V block before its wait (AHEAD), whose cost changes once K/V may
    come from the L2. Timed in turn, `rounds` times; first the next token each way from the same state."""
    pos = CONTEXT // 4
    chosen = dict(choice._CHOSEN)
    staged = [k for k, c in chosen.items() if c.get("STAGE")]
    base = {"": chosen}
    if staged:
        base[", no ring"] = without_rings(eng, pos, staged)
    configs = {}
    for suffix, cfg in base.items():
        configs[suffix] = cfg
        configs[suffix + ", attention preload"] = {k: {f: v for f, v in c.items() if f != "AHEAD"}
                                                   if k[0] == "attention" else c for k, c in cfg.items()}
    variants = {f"{mode}{suffix}": (mode, cfg) for mode in L2_HINTS for suffix, cfg in configs.items()}
    tokens, times = {}, {name: [] for name in variants}
    for r in range(rounds):
        for name, (mode, cfg) in variants.items():
            choice._CHOSEN.clear()
            choice._CHOSEN.update(cfg)
            with _env(SPECPILOT_L2_HINTS=mode):
                if r == 0:
                    tokens[name] = next_token(eng, pos)
                times[name].append(timed_step(eng, pos))
    choice._CHOSEN.clear()
    choice._CHOSEN.update(chosen)
    return {"median_ms": medians(times), "ms_by_round": times, "next_token": tokens,
            "same_token": len(set(tokens.values())) == 1, "staged_chosen": {repr(k): chosen[k] for k in staged},
            "attention_chosen": {repr(k): c for k, c in chosen.items() if k[0] == "attention"}}


def attention_parts_paired(eng: Engine, rounds: int = 5) -> dict:
    """What each piece of the decode attention adds to the step (kernels/attention/triton.ablation: timing
    only, the outputs are wrong): as run, its split counter bumped without ordering, no merge, no partials
    (every split writes its own output), no K/V read, and no attention kernel at all (the output projection
    reads q); the configs the tuning chose, timed in turn, `rounds` times."""
    pos = CONTEXT // 4
    ways = {"as run": "", **{mode: mode for mode in ATTENTION_PARTS[1:]}, "no attention kernel": None}
    times = {name: [] for name in ways}
    for _ in range(rounds):
        for name, mode in ways.items():
            with _env(SPECPILOT_ATTN_ABLATE=mode or ""), _patched(layers, "attend",
                                                                  passthrough_attention if mode is None else None):
                times[name].append(timed_step(eng, pos))
    return {"median_ms": medians(times), "ms_by_round": times,
            "attention_chosen": {repr(k): c for k, c in choice._CHOSEN.items() if k[0] == "attention"}}


def cluster_paired(eng: Engine, rounds: int = 5) -> dict:
    """The decode attention's splits merged in a thread-block cluster (kernels/attention/cluster.py) against
    the Triton kernel's merge through the L2, at 4 and 8 splits, LATE and not, every other config as the
    tuning chose; timed in turn, `rounds` times; first the next token each way from the same state."""
    pos = CONTEXT // 4
    chosen = dict(choice._CHOSEN)
    (key,) = [k for k in chosen if k[0] == "attention"]
    variants = {"chosen": chosen}
    for kind, field in (("triton", "NUM_SPLITS"), ("cluster", "CLUSTER")):
        for s in (4, 8):
            for late in (False, True):
                cfg = {field: s, "LATE": True} if late else {field: s}
                variants[f"{kind} {s}{' late' if late else ''}"] = {**chosen, key: cfg}
    tokens = {}
    for name, configs in variants.items():
        choice._CHOSEN.clear()
        choice._CHOSEN.update(configs)
        tokens[name] = next_token(eng, pos)
    choice._CHOSEN.clear()
    choice._CHOSEN.update(chosen)
    times = in_turn(eng, variants, rounds, pos)
    return {"median_ms": medians(times), "ms_by_round": times, "next_token": tokens,
            "same_token": len(set(tokens.values())) == 1, "attention_chosen": chosen[key]}


@contextlib.contextmanager
def _patched(module, name: str, value):
    """module.name set to value for the block (nothing done when value is None)."""
    saved = getattr(module, name)
    if value is not None:
        setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


# Rings the step tuning no longer offers (they lost here, 2026-12-01): six tiles, 96 and 192 KB a program.
BIG_RINGS = [{**choice.STAGED[0], "BLOCK_N": bn, "STAGE": 6} for bn in (16, 32)]


def ring_sweep(eng: Engine, rounds: int = 5) -> dict:
    """The output projection's ring size against the attention's release, jointly: the step tuning picks
    one key at a time, so a big ring that pays only with LATE (its copies streaming while the attention
    runs, not beside q/k/v's last loads) and LATE that pays only with a big ring can both lose there. Every
    STAGED config and the tuning's best config without a ring, each with the attention's chosen split
    count, LATE and not, all timed in turn, `rounds` times; also BIG_RINGS."""
    pos, cfg = CONTEXT // 4, eng.target.cfg
    chosen = dict(choice._CHOSEN)
    (o_key,) = [k for k in chosen if k[0] == "gemv" and k[1:3] == (cfg.hidden_size, cfg.num_heads * cfg.head_dim)]
    attn = [k for k in chosen if k[0] == "attention"]
    tuned = eng.gemv_tuning[repr(o_key)]["ms"]  # by choice.candidates(o_key), the last round
    plain = min((t, i) for i, t in enumerate(tuned) if "STAGE" not in choice.candidates(o_key)[i])[1]
    rings = {"no ring": choice.candidates(o_key)[plain],
             **{"ring {BLOCK_N}x{BLOCK_K}x{STAGE}".format(**c): c for c in choice.STAGED + BIG_RINGS}}
    variants = {"chosen": chosen}
    for late in (False, True):
        for name, ring in rings.items():
            configs = {**chosen, o_key: ring}
            for k in attn:
                configs[k] = without_late(chosen[k]) | ({"LATE": True} if late else {})
            variants[f"{'late' if late else 'early'} {name}"] = configs
    times = in_turn(eng, variants, rounds, pos)
    return {"median_ms": medians(times), "ms_by_round": times, "o_key": repr(o_key), "o_chosen": chosen[o_key],
            "attention_chosen": {repr(k): chosen[k] for k in attn},
            "configs": {n: rings[n.split(" ", 1)[1]] for n in variants if n != "chosen"}}


# The paired timings (--options, --ring-sweep, ...): each takes the tuned engine; what its flag's help says.
PAIRED = {
    "options": (options_paired, "paired timing of the tuning's options (attention LATE, STAGE rings)"),
    "ring_sweep": (ring_sweep, "paired timing of the output projection's ring sizes, with and without LATE"),
    "early": (early_paired, "paired timing of the kernels' early release (EARLY) as chosen, nowhere, everywhere, "
                            "q/k/v only, gate/up only"),
    "steps": (steps_paired, "per-token time of graphs of 1, 2 and 4 AR steps (alone and back to back)"),
    "greedy": (greedy_paired, "paired timing of the step's tail as one kernel against PyTorch's argmax"),
    "embed": (embed_paired, "paired timing of the embedding kernel's hand-over against PyTorch's gather"),
    "tail": (tail_paired, "paired timing of the attention at q/k/v's tail (1-8 splits) against its own kernel"),
    "l2": (l2_paired, "paired timing of the L2 hints (off, weights evict-first, also K/V evict-last), with and "
                      "without the ring and the attention's preload"),
    "attention_parts": (attention_parts_paired, "timing of the step with pieces of the attention left out "
                                                "(wrong outputs: diagnostics only)"),
    "cluster": (cluster_paired, "paired timing of the attention's splits merged in a cluster against the Triton "
                                "kernel's merge through the L2"),
    "epilogue": (epilogue_paired, "paired timing of the epilogue's inputs requested before / after the weight "
                                  "loop, with and without the L2 hints on the weights"),
}


@contextlib.contextmanager
def _env(**values: str):
    """Environment variables set for the block, restored after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_model(name: str, bw: dict) -> dict:
    cfg = MODELS[name]
    CURRENT.update(inter=cfg.intermediate_size, vocab=cfg.vocab_size)
    target = random_target(cfg, seed=0, dtype=torch.bfloat16, device="cuda", rope_length=CONTEXT + 1)
    wbytes = step_weight_bytes(target)
    floor = wbytes / (bw["copy_tb_s"] * 1e12) * 1e3
    prompt = torch.randint(0, cfg.vocab_size - 1, (128,), generator=torch.Generator().manual_seed(0)).tolist()
    ref = Engine(target, None, context=CONTEXT).generate(prompt, 16, (), AR).tokens  # cuBLAS, eager capture
    choice.forget()
    eng = Engine(target, None, context=CONTEXT, gemv=True)
    eng.warmup(AR)  # chooses the one-row configs and the attention split count
    same = eng.generate(prompt, 16, (), AR).tokens[:4] == ref[:4]
    if OPTIONS:  # one paired timing: its fields at the top; several (one engine, tuned once): one a name
        out = {}
        for option in OPTIONS:
            res = PAIRED[option][0](eng)
            print(f"[{name}] {option}: floor {floor:.3f} ms; " + "; ".join(
                f"{k} {v:.3f} ({100 * floor / v:.1f}%)" for k, v in res["median_ms"].items()))
            out.update(res if len(OPTIONS) == 1 else {option: res})
        return {"floor_ms": floor, "tokens_match_cublas_first_4": same, **out,
                "configs_chosen": {repr(k): c for k, c in choice._CHOSEN.items()}}
    times = ablate(eng)
    if ONLY:
        print(f"[{name}] floor {floor:.3f} ms; " + "; ".join(f"{k} {v:.3f} ({100 * floor / v:.1f}%)"
                                                              for k, v in times.items()))
        return {"floor_ms": floor, "step_ms": times, "only": sorted(ONLY)}
    costs = projection_costs(cfg, times)
    res = {"floor_ms": floor, "weight_bytes": wbytes, "full_tokens_match_cublas_first_4": same,
           "step_ms": times, "pct_of_floor": {k: 100 * floor / v for k, v in times.items()},
           "projection_costs": costs, "copy_tb_s": bw["copy_tb_s"],
           "splits": splits_by_position(eng, cfg.num_heads // cfg.num_kv_heads, cfg.num_kv_heads)}
    t = times
    print(f"[{name}] floor {floor:.3f} ms; full {t['full']:.3f} ({100 * floor / t['full']:.1f}%), PDL off "
          f"{t['pdl_off']:.3f}; attention costs {t['full'] - t['no_attention']:.3f} ms, rope/fused prologue "
          f"{t['no_attention'] - t['gemvs_only']:.3f}; GEMVs alone {t['gemvs_only']:.3f} ms = "
          f"{100 * floor / t['gemvs_only']:.1f}% of floor; tokens ok {same}")
    print(f"[{name}] in the graph: " + "; ".join(
        f"{p} {c['ms']:.3f} ms = {c['tb_s'] or float('nan'):.2f} TB/s" for p, c in costs.items())
          + f" (copy {bw['copy_tb_s']:.2f}); gate/up unfused + SiLU kernel: {t['gate_up_unfused']:.3f} ms; "
          f"plain GEMVs (no fusions) {t['plain_gemvs']:.3f} ms = {100 * floor / t['plain_gemvs']:.1f}% of floor")
    for s, row in res["splits"]["ms_by_splits_and_position"].items():
        print(f"[{name}] attention splits {s or 'heuristic'}: " + " ".join(f"pos {p}: {v:.3f}" for p, v in row.items()))
    del eng, target
    gc.collect()
    torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--only", default="", help="comma list of ablations to time (and full); no costs or splits")
    for name, (_, what) in PAIRED.items():
        ap.add_argument(f"--{name.replace('_', '-')}", action="store_true", help=f"only the {what}")
    args = ap.parse_args()
    ONLY.update(a for a in args.only.split(",") if a)
    for name in PAIRED:
        if getattr(args, name):
            OPTIONS.append(name)
    flags = f" --only {args.only}" * bool(args.only) + "".join(f" --{o.replace('_', '-')}" for o in OPTIONS)
    report = {**provenance(f"PYTHONPATH=. python3 bench/gpu/ablate_step.py --models {args.models}{flags}"),
              "context": CONTEXT,
              "position": CONTEXT // 4}
    report["bandwidth"] = bw = bandwidth()
    report["models"] = {m: run_model(m, bw) for m in args.models.split(",")}
    with open(os.path.join(args.out, "ablate_step.json"), "w") as f:
        json.dump(report, f, indent=1)
    if ONLY or OPTIONS:
        return
    print("\nmodel      floor   full  pdl_off  no_attn  gemvs_only   (ms per step, % of floor for full)")
    for m, r in report["models"].items():
        t = r["step_ms"]
        print(f"{m:10s} {r['floor_ms']:6.3f} {t['full']:6.3f} {t['pdl_off']:8.3f} {t['no_attention']:8.3f} "
              f"{t['gemvs_only']:10.3f}   {r['pct_of_floor']['full']:.1f}%")


if __name__ == "__main__":
    main()
