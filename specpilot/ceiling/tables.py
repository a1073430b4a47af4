"""The ceiling report as rich tables: the factors per system, where each system's step goes, the what-ifs."""

from __future__ import annotations

from rich.table import Table


def _f(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def factors_table(report: dict) -> Table:
    t = Table(title="ceiling: S* = S x tau_best/tau x T_prof/T_floor x T_step/T_prof (speedups over AR)")
    for col in ("system", "tau", "tau_best", "S", "tau factor", "kernel", "overhead", "ceiling S*",
                "lattice (training)", "target"):
        t.add_column(col, justify="left" if col in ("system", "target") else "right")
    for name, s in report["systems"].items():
        f = s["factors"]
        t.add_row(name, _f(f["tau"]["tau"]), _f(f["tau"]["tau_best"]), _f(s["speedup"], ".3f"),
                  _f(f["tau"]["value"]), _f(f["kernel"]["value"]), _f(f["overhead"]["value"]),
                  _f(s["ceiling"], ".3f"), _f(f["lattice"]["value"]), s["target"])
    return t


def classes_table(name: str, rows: list[dict], t_step: float | None = None) -> Table:
    title = f"{name}: kernel time per step against its floor"
    if t_step is not None:
        title += f" (step wall time {1000 * t_step:.3f} ms)"
    t = Table(title=title)
    for col in ("class", "profiled ms", "floor ms", "x floor", "excess ms", "MB", "bound"):
        t.add_column(col, justify="left" if col in ("class", "bound") else "right")
    for r in rows:
        t.add_row(r["class"], _f(1000 * r["prof_s"], ".4f"), _f(1000 * r["floor_s"], ".4f"), _f(r["ratio"], ".1f"),
                  _f(1000 * r["excess_s"], ".4f"), _f(r["bytes"] / 1e6, ".2f"), r["bound"])
    return t


def what_if_table(report: dict) -> Table:
    t = Table(title="what-if (predicted speedup over the same AR)")
    for col in ("system", "weights share", "12-bit weights", "2nd draft round", "best node budget", "cost model check"):
        t.add_column(col, justify="left" if col == "system" else "right")
    for name, s in report["systems"].items():
        p = s["predicted"]
        nodes = p.get("nodes")
        check = s["cost_model"].get("this_run")
        t.add_row(name, _f(p["weight_share"], ".0%"), _f(p["w12"]["speedup"], ".3f"),
                  _f(p["second_round"]["speedup"], ".3f"),
                  f"N={nodes['best']}: {nodes['speedup']:.3f}" if nodes else "-",
                  f"{check['predicted']:.3f} vs {_f(check['measured'], '.3f')}" if check else "-")
    return t


def furthest_line(report_system: dict, n: int = 3) -> str:
    """The longest kernels of the classes furthest above their floor, one line."""
    items = [f"{k['name'][:48]} ({k['class']}, {1e6 * k['seconds']:.1f} us, {k['calls']:.0f}x)"
             for k in report_system["furthest"][:n]]
    return "furthest from their floor: " + "; ".join(items) if items else ""
