"""Block configs of the one-row kernels, chosen by timing the whole captured decode step.

Triton's autotuner times each kernel alone, where ramp-up and drain dominate; in a step the kernels
run back to back and what counts is the step. `tune_step` walks the kernels a step launches (recorded
by key: kernel kind, shape, fusions) and, one key at a time with the others held, gives the key the
candidate config under which the captured step replays fastest. The choice is process-wide, like
Triton's own autotuning cache; kernels whose key has no choice fall back to the autotuner.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from specpilot.kernels.gemv import ahead_on

_CHOSEN: dict[tuple, dict] = {}
_SEEN: list[tuple] = []
_RECORDING = [False]

# Candidates per kernel kind: what the H200 chain runs picked per projection, plus neighbours, plus
# small tiles for the fused gate/up, which streams two row sets: ptxas puts (16, 512, 4 warps) at 255
# registers a thread there (two blocks an SM), (8, 256, 4) near the plain kernel's ~75. PRE: weight
# tiles each program streams before its PDL wait (1 unless said): deeper ones keep DRAM busy while the
# kernel before finishes, above all the latency-bound attention before the output projection. Those
# chosen build without spills, at <= 128 registers a thread for a plain projection
# (tests/test_kernels_compile.py); with gate/up's two row sets PRE = 4 takes 168-181. (Candidates that
# bulk-prefetched a block's whole weight share into the L2 before its PDL wait were never chosen on the
# H200 and were removed: bench/results/2026-11-30_engine_core_x_tiles_h200.json. So were tiles of 1024
# columns, twice the bytes in flight a program, offered for grids with few programs an SM: on every key of
# both models the best of them made the step slower than the key's choice, by 0.01-0.53 ms on the 8B and
# 0.03-1.33 ms on the 27B:
# bench/results/2026-12-01_engine_core_8b_b27c904_h200.json, ..._27b_...)
CANDIDATES = {
    "gemv": [{"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": st, "PRE": pre}
             for bn, bk, w, st, pre in (
                 (16, 512, 8, 2, 1), (16, 512, 4, 2, 1), (16, 256, 4, 4, 1), (8, 512, 4, 4, 1),
                 (64, 128, 4, 4, 1), (32, 256, 8, 2, 1), (8, 256, 4, 4, 1), (8, 512, 8, 2, 1),
                 (16, 256, 8, 2, 1), (8, 512, 8, 2, 2), (8, 512, 8, 2, 4), (16, 256, 8, 2, 4),
                 (8, 256, 4, 4, 4))],
    # PAIRS: rotary pairs per program (2 x PAIRS weight rows): 4 gives the 8-row programs the plain
    # projections chose on the H200, 8 half as many programs.
    "qkv_rope": [{"PAIRS": p, "BLOCK_K": bk, "num_warps": w, "num_stages": st, "PRE": pre}
                 for p, bk, w, st, pre in ((8, 512, 4, 2, 1), (8, 512, 8, 2, 1), (8, 256, 4, 4, 1), (8, 1024, 8, 2, 1),
                                           (8, 256, 8, 2, 1), (4, 512, 8, 2, 1), (4, 512, 4, 2, 1), (4, 256, 4, 4, 1),
                                           (8, 512, 8, 2, 2), (4, 512, 8, 2, 4))],
}


# Weight tiles through a ring of STAGE shared-memory slots, the first STAGE copied before the PDL wait
# (gemv/staged.py), for the plain and residual-writing projections: 32-128 KB a program, so that the
# output projection's blocks, resident beside the attention before it, keep the DRAM busy through it.
# On the H200 the output projection chose two-tile rings (32-64 KB) on the 8B and 27B shapes. Bigger rings
# lose: six-tile ones (96 and 192 KB, 73% of the 8B's output projection in flight before the attention is
# done) made the 8B step 0.11-0.18 ms slower, with the attention's LATE release or without
# (bench/gpu/ablate_step.py --ring-sweep, bench/results/2026-12-01_ring_sweep_ecf1856_h200.json).
STAGED = [{"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": 8, "num_stages": 1, "PRE": 1, "STAGE": st}
          for bn, bk, st in ((16, 512, 4), (16, 256, 8), (32, 512, 2), (16, 512, 2), (32, 512, 4))]
CANDIDATES["gemv"] += STAGED


# ATTN: the q/k/v + rope kernel ends with the new row's attention, in this many splits
# (attention/tail.py), so that the layer has no attention kernel of its own. On the H200 8B it made the step
# 0.01-0.19 ms slower at every split count (bench/results/2026-12-01_tail_paired_*_h200.json): timed only
# with SPECPILOT_QKV_ATTN=1.
ATTN_SPLITS = (1, 2, 4, 8)
_OFF_BY_DEFAULT = ("EARLY", "ATTN")

_OPTION_ENV = {"STAGE": "SPECPILOT_GEMV_STAGED", "LATE": "SPECPILOT_ATTN_LATE", "EARLY": "SPECPILOT_GEMV_EARLY",
               "ATTN": "SPECPILOT_QKV_ATTN", "CLUSTER": "SPECPILOT_ATTN_CLUSTER"}


def offered(option: str) -> bool:
    """SPECPILOT_GEMV_STAGED=0 / SPECPILOT_ATTN_LATE=0 / SPECPILOT_ATTN_CLUSTER=0 keep the configs with STAGE /
    LATE / CLUSTER out of the step tuning (the runs that measure what each option gains). EARLY and ATTN are
    timed only with SPECPILOT_GEMV_EARLY=1 / SPECPILOT_QKV_ATTN=1: on the H200 8B neither paid
    (bench/results/2026-12-01_early_paired_259dbf9_h200.json, ATTN_SPLITS above)."""
    return os.environ.get(_OPTION_ENV[option], "0" if option in _OFF_BY_DEFAULT else "1") != "0"


def _cluster_runs() -> bool:
    from specpilot.kernels.attention.cluster import bindings_available

    return bindings_available()


def candidates(key: tuple) -> list[dict]:
    """The configs tuned for a key: staged ones only where gemv/staged.py applies (no in-loop norm, no
    gate/up pair, no bias, no handed-over norm)."""
    if key[0] == "attention":
        cands = CANDIDATES["attention"] + (CLUSTER_CANDIDATES if offered("CLUSTER") and _cluster_runs() else [])
        return [c for c in cands if offered("LATE") or not c.get("LATE")]
    if key[0] != "gemv":
        return CANDIDATES[key[0]]
    flags = dict(key[3:])
    plain = offered("STAGE") and not any(flags.get(f) for f in ("HAS_NORM", "GATE_UP", "HAS_BIAS", "PRENORM"))
    return [c for c in CANDIDATES["gemv"] if plain or "STAGE" not in c]


# The decode attention's split count (0: the shape heuristic, kernels/attention/triton._config). Its best
# value depends on how much of the cache is filled, so the step is tuned at a quarter of the context.
# (Candidates where the attention, once its K/V were read, bulk-prefetched half or all of the output
# projection's weight into the L2 were never chosen and were removed:
# bench/results/2026-11-30_engine_core_attn_prefetch_b37bb7a_h200.json.)
# LATE: the attention lets the next kernel (the output projection) start only once it has passed its own
# wait, so that the weights that one loads before its wait (PRE, STAGE) stream while the attention runs,
# not beside the q/k/v projection's last loads.
CANDIDATES["attention"] = [{"NUM_SPLITS": s} for s in (0, 1, 2, 4, 8)] + [{"NUM_SPLITS": s, "LATE": True}
                                                                          for s in (1, 4, 8)]
# CLUSTER: the splits as one thread-block cluster that merges them in shared memory (attention/cluster.py),
# offered where its CUDA kernel can run (cuda-bindings, sm_90+) unless SPECPILOT_ATTN_CLUSTER=0.
CLUSTER_CANDIDATES = [{"CLUSTER": s, **late} for s in (4, 8) for late in ({}, {"LATE": True})]


def step_config(key: tuple) -> dict | None:
    """The config chosen for this kernel key, if any (and note the key while a step is recorded)."""
    if _RECORDING[0] and key not in _SEEN:
        _SEEN.append(key)
    return _CHOSEN.get(key)


def forget() -> None:
    _CHOSEN.clear()


def record_keys(step: Callable[[], None]) -> list[tuple]:
    """The one-row kernel keys one eager run of `step` launches, in launch order."""
    _SEEN.clear()
    _RECORDING[0] = True
    try:
        step()
    finally:
        _RECORDING[0] = False
    return list(_SEEN)


def tune_rounds() -> int:
    """Rounds of the step tuning: SPECPILOT_TUNE_ROUNDS (1 to 4), default 2."""
    raw = os.environ.get("SPECPILOT_TUNE_ROUNDS", "").strip() or "2"
    if raw not in ("1", "2", "3", "4"):
        raise ValueError(f"SPECPILOT_TUNE_ROUNDS={raw!r}: expected 1 to 4 (default 2)")
    return int(raw)


def tune_step(step: Callable[[], None], measure: Callable[[Callable[[], None]], float],
              rounds: int | None = None, start: dict[tuple, dict] | None = None) -> dict:
    """Coordinate descent over the keys `step` launches: each key gets the candidate under which
    `measure(step)` (milliseconds of the whole step) is lowest. The first round tunes each key while the
    keys after it still run their fallbacks (on the H200 8B a step ~30% slower than the tuned one); each
    later round times every key's candidates again with all the others at their choices. Returns
    {key: {config, ms by candidate in the last round, and in the first}}. rounds: tune_rounds() unless given.
    Loading one loop step ahead (kernels/gemv.ahead_on) is chosen per key too: each round times its winner
    once more with AHEAD False (on the H200, loading ahead everywhere made the 8B's step 0.06-0.10 ms
    faster; on the 27B's it was within the run-to-run spread, either way). So is the early release of the
    next kernel (EARLY, the projections and q/k/v only: gemv/triton._stream_open) where it is offered
    (SPECPILOT_GEMV_EARLY=1): the kept winner once more with EARLY, kept if the step is faster. And so is the
    attention at q/k/v's tail (ATTN, with SPECPILOT_QKV_ATTN=1): the kept winner with each split count, kept
    if the step is faster; the attention's own key is then not launched (its choice is moot). start: configs the
    keys not chosen yet begin from (the later keys of the first round run them, not the autotuner's)."""
    keys = [key for key in record_keys(step) if key not in _CHOSEN]  # not tuned by an earlier engine
    begun = {key: start[key] for key in keys if start and key in start and _startable(key, start[key])}
    _CHOSEN.update(begun)  # where the descent begins: the start table's configs, else the autotuner's fallback
    report = {repr(key): {"start": cfg} for key, cfg in begun.items()}
    for _ in range(rounds or tune_rounds()):
        for key in keys:
            times = []
            for i, cfg in enumerate(candidates(key)):
                _CHOSEN[key] = cfg
                times.append((measure(step), i))
            best_ms, best = min(times)
            _CHOSEN[key] = winner = candidates(key)[best]
            entry = report.setdefault(repr(key), {})
            entry.setdefault("ms_first_round", [t for t, _ in times])
            entry.update(ms=[t for t, _ in times])
            if ahead_on():  # the winner once more without loading ahead: it did not pay on every kernel
                _CHOSEN[key] = {**winner, "AHEAD": False}
                entry["ms_without_ahead"] = measure(step)
                if entry["ms_without_ahead"] >= best_ms:
                    _CHOSEN[key] = winner
                best_ms = min(best_ms, entry["ms_without_ahead"])
            if key[0] in ("gemv", "qkv_rope") and offered("EARLY"):
                kept = _CHOSEN[key]
                _CHOSEN[key] = {**kept, "EARLY": True}
                entry["ms_early"] = measure(step)
                if entry["ms_early"] >= best_ms:
                    _CHOSEN[key] = kept
                best_ms = min(best_ms, entry["ms_early"])
            if key[0] == "qkv_rope" and offered("ATTN"):
                best_ms = _try_attention_tail(key, step, measure, best_ms, entry)
            entry["config"] = _CHOSEN[key]
    return report


def _startable(key: tuple, cfg: dict) -> bool:
    """A start config is used only if it is one of the key's candidates now (loading ahead or not)."""
    return {f: v for f, v in cfg.items() if f != "AHEAD"} in candidates(key)


def _try_attention_tail(key: tuple, step, measure, best_ms: float, entry: dict) -> float:
    """The kept q/k/v config (timed without) with the attention at its tail in each ATTN_SPLITS count: the
    fastest stays. Returns the best step time."""
    best_cfg = kept = _CHOSEN[key]
    entry["ms_attention_tail"] = {}
    for splits in ATTN_SPLITS:
        _CHOSEN[key] = cfg = {**kept, "ATTN": splits}
        ms = entry["ms_attention_tail"][splits] = measure(step)
        if ms < best_ms:
            best_ms, best_cfg = ms, cfg
    _CHOSEN[key] = best_cfg
    return best_ms
