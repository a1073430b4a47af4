"""The node budget as a tuned parameter: from one bench run of every builder at several budgets (and the replay
of the same requests), tau(N), c(N) = T_step(N) / T_AR, S(N) = tau(N) / c(N) and the N that maximises it, per
builder; and their plots."""

from __future__ import annotations

from pathlib import Path


def curves(sweep: dict, block: int, replay: dict | None = None) -> dict:
    """sweep: a `bench --json` report with AR and stock systems; block: the drafter's block (stock's rows).
    Returns {builder: {"points": [{nodes, tau, speedup, ms_step, c, s}], "best": nodes of the largest measured
    speedup}, "ar_ms_token": ..., "tau_best": {nodes: ...}} (tau_best from the replay, when given)."""
    systems = sweep["systems"]
    ar = next(v for v in systems.values() if v["config"]["base"] == "ar")
    t_ar = ar["decode_ms_per_token"]
    out: dict = {"ar_ms_token": t_ar, "builders": {}}
    for name, s in systems.items():
        opts = s["config"]["options"]
        if s["config"]["base"] != "stock" or s.get("decode_ms_per_step") is None:
            continue
        nodes = opts["nodes"] or block
        c = s["decode_ms_per_step"] / t_ar
        point = {"system": name, "nodes": nodes, "tau": s["tau"], "speedup": s.get("speedup_vs_ar"),
                 "ms_step": s["decode_ms_per_step"], "c": c, "s": s["tau"] / c}
        out["builders"].setdefault(opts["tree"], {"points": []})["points"].append(point)
    for entry in out["builders"].values():
        entry["points"].sort(key=lambda p: p["nodes"])
        entry["best"] = max(entry["points"], key=lambda p: p["speedup"] or 0)["nodes"]
    if replay is not None:
        out["tau_best"] = {k: v for k, v in replay["tau_best"].items() if k != "any"}
        out["replayed"] = {k: v["tau"] for k, v in replay["replayed"].items()}
    return out


def plot(result: dict, title: str, path: Path) -> Path:
    """tau(N), c(N) and speedup(N) per builder side by side (matplotlib, PNG)."""
    import matplotlib

    from specpilot.results import write_figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for builder, entry in sorted(result["builders"].items()):
        xs = [p["nodes"] for p in entry["points"]]
        style = {"marker": "o", "label": builder}
        axes[0].plot(xs, [p["tau"] for p in entry["points"]], **style)
        axes[1].plot(xs, [p["c"] for p in entry["points"]], **style)
        axes[2].plot(xs, [p["speedup"] for p in entry["points"]], **style)
    if result.get("tau_best"):
        xs = sorted(int(n) for n in result["tau_best"])
        axes[0].plot(xs, [result["tau_best"][str(n)] for n in xs], "k--", label="tau_best (replay)")
    for ax, label in zip(axes, ("tau (tokens per target pass)", "c(N) = T_step / T_AR", "speedup over AR"),
                         strict=True):
        ax.set_xlabel("N (rows verified per step)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    try:
        write_figure(path, fig, dpi=110)
    finally:
        plt.close(fig)
    return path
