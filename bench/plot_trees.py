"""Issue 25's curves from committed results: tau(N), c(N), speedup(N) per builder, the best N, as a PNG and JSON.

Usage: python bench/plot_trees.py SWEEP.json REPLAY.json TITLE OUT_STEM
Writes OUT_STEM.png and OUT_STEM.json (the curves and each builder's best node budget).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specpilot.replay.budget import curves, plot


def main() -> None:
    sweep_path, replay_path, title, stem = sys.argv[1:5]
    replay = json.loads(Path(replay_path).read_text())
    result = curves(json.loads(Path(sweep_path).read_text()), replay["depth"] + 1, replay)
    result["sources"] = [sweep_path, replay_path]
    Path(stem + ".json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, title, Path(stem + ".png"))
    for builder, entry in sorted(result["builders"].items()):
        pts = " ".join(f"N={p['nodes']}:{p['tau']:.2f}/{p['c']:.2f}/{p['speedup']:.3f}x" for p in entry["points"])
        print(f"{builder:11s} best N={entry['best']:3d}  {pts}")


if __name__ == "__main__":
    main()
