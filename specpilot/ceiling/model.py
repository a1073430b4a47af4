"""The cost model and the ceiling factors (pure arithmetic over measured inputs; ceiling/run.py gathers them).

S = tau / c with c = T_step / T_AR. The ceiling S* = tau_best * T_AR / T_floor factors as
    S* = S x (tau_best / tau) x (T_prof / T_floor) x (T_step / T_prof)
         tokens  (a better tree)   kernels (to their floor)   overhead (gaps, host work)
and a fourth factor, tau_ideal / tau_best, looks past the lattice (what a better drafter could buy; it needs
training, not engine work). The largest of the first three names the round's target.
"""

from __future__ import annotations

from specpilot.ceiling.floors import CLASSES, WEIGHT_CLASSES, Floor

FACTORS = ("tau", "kernel", "overhead")
W12_BYTES = 12 / 16  # a lossless 12-bit format's weight bytes against bf16's

# What each factor points the loop at: the mechanisms, the engine options that reach them today ("built": the
# option exists in `specpilot options`), and what the rest needs.
CANDIDATES = {
    "tau": [
        {"mechanism": "tree builder over the lattice", "options": ["tree"], "built": True},
        {"mechanism": "node budget", "options": ["nodes"], "built": True},
        {"mechanism": "draft block size", "options": ["block_size"], "built": True},
    ],
    "kernel": [
        {"mechanism": "smaller exact weight format (12-bit)", "options": [], "built": False},
        {"mechanism": "fused few-row kernels (norm, rope, residual, argmax inside the projections)",
         "options": ["gemv", "embed_kernel", "greedy_kernel"], "built": True},
        {"mechanism": "a hybrid's Gated DeltaNet state under a tree: recomputed along root paths, no state per node",
         "options": ["hybrid_tree"], "built": True},
        {"mechanism": "kernel configurations (the step tuning)", "options": ["tune_rounds", "staged", "attn_late",
                                                                             "cluster", "l2"], "built": True},
    ],
    "overhead": [
        {"mechanism": "CUDA-graph capture of the step", "options": ["graphs"], "built": True},
        {"mechanism": "host work off the critical path (steps enqueued ahead)", "options": ["lookahead"],
         "built": True},
        {"mechanism": "fewer launches (programmatic dependent launch, fused kernels)", "options": ["pdl"],
         "built": True},
    ],
    "lattice": [
        {"mechanism": "a better drafter (distillation: more steps, closer prompts)", "options": [], "built": False,
         "needs": "training"},
    ],
}


def class_table(prof: dict[str, float], fl: dict[str, Floor], bandwidth: float, flop_rate: float) -> list[dict]:
    """Per kernel class: profiled and floor seconds per step, their ratio and the excess, largest excess first."""
    rows = []
    for name in CLASSES + tuple(k for k in prof if k not in CLASSES):  # e.g. kernels no region claimed
        f = fl.get(name, Floor(0.0, 0.0))
        floor_s = f.seconds(bandwidth, flop_rate)
        t = prof.get(name, 0.0)
        rows.append({"class": name, "prof_s": t, "floor_s": floor_s, "ratio": t / floor_s if floor_s else None,
                     "excess_s": t - floor_s, "bytes": f.bytes, "flops": f.flops,
                     "bound": "flops" if f.flops / flop_rate > f.bytes / bandwidth else "bytes"})
    return sorted(rows, key=lambda r: -r["excess_s"])


def factors(*, tau: float, tau_best: float, tau_ideal: float | None, t_step: float, t_ar: float, t_prof: float,
            t_floor: float) -> dict:
    """The four factors, the measured S, and the ceiling they multiply to (times in seconds per step/token)."""
    s = tau * t_ar / t_step
    out = {
        "tau": {"value": tau_best / tau, "tau": tau, "tau_best": tau_best},
        "kernel": {"value": t_prof / t_floor, "t_prof_s": t_prof, "t_floor_s": t_floor},
        "overhead": {"value": t_step / t_prof, "t_step_s": t_step, "t_prof_s": t_prof},
        "lattice": {"value": tau_ideal / tau_best if tau_ideal else None, "tau_ideal": tau_ideal,
                    "tau_best": tau_best, "needs_training": True},
    }
    ceiling = s * out["tau"]["value"] * out["kernel"]["value"] * out["overhead"]["value"]
    return {"factors": out, "speedup": s, "ceiling": ceiling, "t_ar_s": t_ar,
            "target": max(FACTORS, key=lambda k: out[k]["value"])}


def what_if(*, tau: float, t_step: float, t_ar: float, classes: dict[str, float], drafter_s: float,
            full_share: float, curve: list[dict] | None = None) -> dict:
    """Predicted speedups over the same AR baseline, each from the measured step:
    - w12: the weight classes' kernel time scaled by 12/16 (weight-bound GEMMs take time in proportion to bytes);
    - second_round: one more draft round per exact pass; only steps that accepted the whole block gain, as many
      drafts again as an average step (tau - 1), and every step pays the drafter stage once more;
    - nodes: each node budget's S = tau(N) / c(N) from replay and the step's timing at N (`curve`)."""
    weights = sum(classes.get(c, 0.0) for c in WEIGHT_CLASSES)
    t_w12 = t_step - (1 - W12_BYTES) * weights
    tau2 = tau + full_share * (tau - 1)
    out = {
        "weight_share": weights / sum(classes.values()) if classes else None,
        "w12": {"t_step_s": t_w12, "speedup": tau * t_ar / t_w12},
        "second_round": {"tau": tau2, "t_step_s": t_step + drafter_s, "speedup": tau2 * t_ar / (t_step + drafter_s),
                         "full_share": full_share},
    }
    if curve:
        best = max(curve, key=lambda p: p["speedup"])
        out["nodes"] = {"points": curve, "best": best["nodes"], "speedup": best["speedup"]}
    return out


def node_curve(taus: dict[int, float], step_s: dict[int, float], ar_s: float) -> list[dict]:
    """S(N) = tau(N) / c(N), c(N) = T_step(N) / T_AR, for the budgets with both a replayed tau and a timing."""
    return [{"nodes": n, "tau": taus[n], "c": step_s[n] / ar_s, "speedup": taus[n] * ar_s / step_s[n]}
            for n in sorted(set(taus) & set(step_s))]


def validation(predicted: float, measured: float | None) -> dict:
    err = predicted / measured - 1 if measured else None
    return {"predicted": predicted, "measured": measured, "error": err,
            "within_5pct": abs(err) <= 0.05 if err is not None else None}
