"""Checks of a timed tree that may be lying, from the rows the controller's clock timed (compare, clock
"controller"): both look at B against A, so what the machine does to both sides cancels.

- reported: the time B's own code says its requests took (decode + prefill) against the wall time the controller
  measured around them. An honest worker's share is the same as A's (a few percent goes to the pipe and the
  tokenizer); a tree that makes up its timings reports much less than it took.
- repeat: how much faster B answers a request it has answered before (passes after the first) than the first
  time, against the same for A. A system computes every request anew; one that keeps outputs, or work it should
  redo, answers a repeat faster than its first sight. A's ratio raises the bar where A's repeats are faster too
  (warm-up), never lowers it below REPEAT_MAX: on a small CPU a request of tens of milliseconds takes 1x or 2x from
  pass to pass, and a first pass that happened to be fast put A at 0.55x and refused an honest B at 1.14x. With one
  pass there is nothing to compare: the sealed final (requests no one saw) is then what a cache cannot help.
"""

from __future__ import annotations

import statistics

REPORTED_MIN = 0.5  # B's reported share of its wall time under half of A's: refused
REPEAT_MAX = 1.5  # B's repeats over its first sight 1.5x beyond A's (or beyond 1, where A's are below): refused


def check(rows_a: list[dict], rows_b: list[dict]) -> dict:
    """-> {"reported": {...}, "repeat": {...}, "refused": reason or None}."""
    share_a, share_b = _share(rows_a), _share(rows_b)
    rep_a, rep_b = _repeat(rows_a), _repeat(rows_b)
    out = {"reported": {"a": share_a, "b": share_b, "min": REPORTED_MIN},
           "repeat": {"a": rep_a, "b": rep_b, "max": REPEAT_MAX}, "refused": None}
    if share_a and share_b is not None and share_b < REPORTED_MIN * share_a:
        out["refused"] = (f"its worker reported {100 * share_b:.0f}% of the wall time the controller measured around "
                          f"its requests (the start's: {100 * share_a:.0f}%): its timings are not its own")
    elif rep_a and rep_b and rep_b > REPEAT_MAX * max(rep_a, 1.0):
        out["refused"] = (f"it answered requests it had seen {rep_b:.2f}x faster than the first time (the start: "
                          f"{rep_a:.2f}x): it keeps outputs or work across requests")
    return out


def _share(rows: list[dict]) -> float | None:
    wall = sum(r.get("wall_s", 0.0) for r in rows)
    return sum(r["decode_s"] + r.get("prefill_s", 0.0) for r in rows) / wall if wall > 0 else None


def _repeat(rows: list[dict]) -> float | None:
    """Median over requests of (wall time of its first pass) / (median wall time of its later passes)."""
    per: dict[str, dict[int, float]] = {}
    for r in rows:
        rid = r["id"].split("#")[0]
        per.setdefault(rid, {})
        per[rid][r.get("rep", 0)] = per[rid].get(r.get("rep", 0), 0.0) + r.get("wall_s", 0.0)
    ratios = []
    for passes in per.values():
        first, later = passes.get(0), [v for k, v in passes.items() if k > 0]
        if first and later and statistics.median(later) > 0:
            ratios.append(first / statistics.median(later))
    return statistics.median(ratios) if ratios else None
