"""The configs the step tuning times for each one-row kernel key, and which the plan offers.

Candidates per kernel kind: what the H200 chain runs picked per projection, plus neighbours, plus small
tiles for the fused gate/up, which streams two row sets: ptxas puts (16, 512, 4 warps) at 255 registers a
thread there (two blocks an SM), (8, 256, 4) near the plain kernel's ~75. PRE: weight tiles each program
streams before its PDL wait (1 unless said): deeper ones keep DRAM busy while the kernel before finishes,
above all the latency-bound attention before the output projection. Those chosen build without spills, at
<= 128 registers a thread for a plain projection (tests/test_kernels_compile.py); with gate/up's two row
sets PRE = 4 takes 168-181. (Removed after the H200 never chose them: bulk L2 prefetches of a block's weight
share before its PDL wait, bench/results/2026-11-30_engine_core_x_tiles_h200.json; tiles of 1024 columns,
slower on every key of both models, bench/results/2026-12-01_engine_core_8b_b27c904_h200.json; the kernels'
early release of their successor, bench/results/2026-12-01_early_paired_259dbf9_h200.json; the attention at
the q/k/v kernel's tail, 0.01-0.19 ms slower at every split count,
bench/results/2026-12-01_tail_paired_*_h200.json.)
"""

from __future__ import annotations

from specpilot.config.plan import KernelPlan

GEMV = [{"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": st, "PRE": pre}
        for bn, bk, w, st, pre in (
            (16, 512, 8, 2, 1), (16, 512, 4, 2, 1), (16, 256, 4, 4, 1), (8, 512, 4, 4, 1),
            (64, 128, 4, 4, 1), (32, 256, 8, 2, 1), (8, 256, 4, 4, 1), (8, 512, 8, 2, 1),
            (16, 256, 8, 2, 1), (8, 512, 8, 2, 2), (8, 512, 8, 2, 4), (16, 256, 8, 2, 4),
            (8, 256, 4, 4, 4))]
# Weight tiles through a ring of STAGE shared-memory slots, the first STAGE copied before the PDL wait
# (gemv/staged.py), for the plain and residual-writing projections: 32-128 KB a program, so that the output
# projection's blocks, resident beside the attention before it, keep the DRAM busy through it. On the H200
# the output projection chose two-tile rings (32-64 KB) on the 8B and 27B shapes. Six-tile ones made the 8B
# step 0.11-0.18 ms slower (bench/results/2026-12-01_ring_sweep_ecf1856_h200.json).
STAGED = [{"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": 8, "num_stages": 1, "PRE": 1, "STAGE": st}
          for bn, bk, st in ((16, 512, 4), (16, 256, 8), (32, 512, 2), (16, 512, 2), (32, 512, 4))]
# PAIRS: rotary pairs per program (2 x PAIRS weight rows): 4 gives the 8-row programs the plain projections
# chose on the H200, 8 half as many programs.
QKV_ROPE = [{"PAIRS": p, "BLOCK_K": bk, "num_warps": w, "num_stages": st, "PRE": pre}
            for p, bk, w, st, pre in ((8, 512, 4, 2, 1), (8, 512, 8, 2, 1), (8, 256, 4, 4, 1), (8, 1024, 8, 2, 1),
                                      (8, 256, 8, 2, 1), (4, 512, 8, 2, 1), (4, 512, 4, 2, 1), (4, 256, 4, 4, 1),
                                      (8, 512, 8, 2, 2), (4, 512, 8, 2, 4))]
# The decode attention's split count (0: the shape heuristic, kernels/attention/triton._config). Its best
# value depends on how much of the cache is filled, so the step is tuned at a quarter of the context.
# LATE: the attention lets the next kernel (the output projection) start only once it has passed its own
# wait, so that the weights that one loads before its wait (PRE, STAGE) stream while the attention runs.
ATTENTION = [{"NUM_SPLITS": s} for s in (0, 1, 2, 4, 8)] + [{"NUM_SPLITS": s, "LATE": True} for s in (1, 4, 8)]
# CLUSTER: the splits as one thread-block cluster that merges them in shared memory (attention/cluster.py),
# offered where its CUDA kernel can run (cuda-bindings, sm_90+).
CLUSTER = [{"CLUSTER": s, **late} for s in (4, 8) for late in ({}, {"LATE": True})]


def _cluster_runs() -> bool:
    from specpilot.kernels.nvrtc import bindings_available

    return bindings_available()


def candidates(key: tuple, plan: KernelPlan) -> list[dict]:
    """The configs tuned for a key under this plan: staged ones only where gemv/staged.py applies (no in-loop
    norm, no gate/up pair, no bias, no handed-over norm) and the plan offers them; the attention's late release
    and cluster kernel where the plan offers them."""
    if key[0] == "attention":
        cands = ATTENTION + (CLUSTER if plan.cluster and _cluster_runs() else [])
        return [c for c in cands if plan.attn_late or not c.get("LATE")]
    if key[0] == "qkv_rope":
        return QKV_ROPE
    flags = dict(key[3:])
    plain = plan.staged and not any(flags.get(f) for f in ("HAS_NORM", "GATE_UP", "HAS_BIAS", "PRENORM"))
    return GEMV + STAGED if plain else GEMV
