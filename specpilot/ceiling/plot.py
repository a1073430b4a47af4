"""Where a step's time goes: per system, the profiled kernel time stacked by class beside the same classes' floors,
and the step's wall time (the gap above the profiled bar is the overhead factor)."""

from __future__ import annotations

from pathlib import Path

from specpilot.ceiling.floors import CLASSES
from specpilot.results import write_figure


def plot(report: dict, title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [("AR", report["ar"]["classes"], report["t_ar_s"])]
    bars += [(name, s["classes"], s["factors"]["overhead"]["t_step_s"]) for name, s in report["systems"].items()]
    colors = plt.get_cmap("tab10").colors
    fig, ax = plt.subplots(figsize=(2.2 + 2.0 * len(bars), 4.8))
    for i, (_, table, wall) in enumerate(bars):
        by = {r["class"]: r for r in table}
        for j, key in enumerate(("prof_s", "floor_s")):
            x, bottom = 3 * i + j, 0.0
            for c, cls in enumerate(CLASSES):
                ms = 1000 * by.get(cls, {}).get(key, 0.0)
                label = cls if i == 0 and j == 0 else None
                ax.bar(x, ms, bottom=bottom, color=colors[c % 10], label=label, alpha=1.0 if j == 0 else 0.45,
                       edgecolor="black", linewidth=0.3)
                bottom += ms
        ax.plot([3 * i - 0.4, 3 * i + 0.4], [1000 * wall] * 2, "k-", linewidth=2,
                label="step wall time" if i == 0 else None)
    ax.set_xticks([3 * i + 0.5 for i in range(len(bars))])
    ax.set_xticklabels([f"{name}\nprofiled | floor" for name, _, _ in bars], fontsize=7)
    ax.set_ylabel("ms per step")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    try:
        write_figure(path, fig, dpi=110)  # never a half-written PNG under the asked name
    finally:
        plt.close(fig)
    return path
