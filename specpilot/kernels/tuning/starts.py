"""Where the step tuning's coordinate descent begins on GPUs it has run on (descent.tune_step's start).

From the autotuner's fallbacks the descent lands in different config sets from process to process: on the
H200 8B, nine sets tuned in six processes on four GPUs timed 3.87-4.00 ms a step when timed in turn in one
process, and that process's own tuning 3.925 ms (bench/results/2026-12-01_config_sets_63fd83c_h200.json).
The set a tuning found fastest there (plain tiles everywhere, the attention as a cluster of 8) starts the
descent on that GPU, which then keeps a key's config only where another times faster beside the others.
A start config no longer among a key's candidates (or one whose option is switched off) is skipped. The
plan's `tune_start=false` starts from the fallbacks.
"""

from __future__ import annotations

_FLAGS = ("GATE_UP", "HAS_BIAS", "HAS_NORM", "HAS_RES", "NEXT", "PRENORM")


def _gemv(n: int, k: int, on: tuple[str, ...]) -> tuple:
    return ("gemv", n, k, *((f, f in on) for f in _FLAGS))


def _tile(bn: int, bk: int, warps: int, stages: int, pre: int) -> dict:
    return {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages, "PRE": pre}


# The H200 8B (dense-8b of bench/gpu/engine_core.py: hidden 4096, 32 / 8 heads, MLP 14336, vocabulary
# 128256, context 1024): the set of bench/results/2026-12-01_cluster_paired_de16b83_h200.json.
H200_8B = {
    ("qkv_rope", 4096, 32, 8, 64, True, False, True): {"PAIRS": 8, "BLOCK_K": 512, "num_warps": 4, "num_stages": 2,
                                                       "PRE": 1},
    ("attention", 1, 8, 4, 128, 1024): {"CLUSTER": 8},
    _gemv(4096, 4096, ("HAS_RES", "NEXT")): _tile(8, 512, 8, 2, 4),
    _gemv(14336, 4096, ("GATE_UP", "PRENORM")): _tile(8, 256, 4, 4, 1),
    _gemv(4096, 14336, ("HAS_RES", "NEXT")): _tile(8, 512, 8, 2, 1),
    _gemv(128256, 4096, ("PRENORM",)): _tile(16, 256, 4, 4, 1),
}
TABLES = {"NVIDIA H200": H200_8B}


def start_for(device_name: str) -> dict[tuple, dict]:
    """The start table for a GPU of this name ({} for one not listed)."""
    return dict(TABLES.get(device_name, {}))
