"""`specpilot ceiling`, the computing half: from measured inputs (ceiling/run.py) and the recorded lattices, each
system's factors, target, candidates, what-ifs and the cost model's check, as one JSON-ready report."""

from __future__ import annotations

from specpilot.ceiling.floors import Floor
from specpilot.ceiling.model import CANDIDATES, class_table, factors, node_curve, validation, what_if
from specpilot.replay.record import TurnLattices
from specpilot.replay.run import policies
from specpilot.replay.walk import replay
from specpilot.speculative.sequoia import parse_accept

SCHEMA = 1


def compute(inputs: dict, recordings: dict[str, list[TurnLattices]], sweep: dict | None = None) -> dict:
    """sweep: an optional `bench --json` report of the same deployment whose systems the node curve predicts."""
    rates = inputs["machine"]
    bw, fr = rates["bytes_s"], rates["flop_s"]
    ar_bench = next(v for k, v in inputs["bench"].items() if k not in inputs["systems"])
    t_ar = ar_bench["decode_ms_per_token"] / 1000
    out = {"schema": SCHEMA, "machine": rates, "t_ar_s": t_ar, "ar_step_s": inputs["ar"]["step_s"],
           "ar": {"classes": class_table(_with_unlinked(inputs["ar"]["profile"]), _floors(inputs["ar"]["floors"]),
                                         bw, fr),
                  "kernels": inputs["ar"]["profile"]["kernels"][:12]},
           "systems": {}}
    for name, s in inputs["systems"].items():
        out["systems"][name] = system_report(name, s, inputs["bench"][name], t_ar, inputs["ar"]["step_s"],
                                             recordings.get(name, []), bw, fr, sweep)
    return out


def system_report(name: str, s: dict, bench: dict, t_ar: float, ar_step_s: float, turns: list[TurnLattices],
                  bw: float, fr: float, sweep: dict | None) -> dict:
    fl = _floors(s["floors"])
    prof = s["profile"]
    table = class_table(_with_unlinked(prof), fl, bw, fr)
    t_prof = sum(r["prof_s"] for r in table)
    t_floor = sum(r["floor_s"] for r in table)
    t_step = bench["decode_ms_per_step"] / 1000
    taus, tau_best = replay_curve(turns, s, sorted(int(n) for n in s["step_s"]))
    f = factors(tau=bench["tau"], tau_best=tau_best, tau_ideal=s["ideal"]["tau_ideal"], t_step=t_step, t_ar=t_ar,
                t_prof=t_prof, t_floor=t_floor)
    curve = node_curve(taus, {int(n): v for n, v in s["step_s"].items()}, ar_step_s)
    own = next((p for p in curve if p["nodes"] == s["rows"]), None)
    checks = {"this_run": validation(own["speedup"], bench.get("speedup_vs_ar")) if own else None}
    if sweep is not None:
        checks["sweep"] = sweep_check(sweep, s["builder"], curve, s["block"])
    return {
        **f, "system": name, "config": s["config"], "rows": s["rows"], "shape": s["shape"],
        "classes": table, "furthest": _furthest(prof["kernels"], table),
        "stages": prof["stages"], "ideal": s["ideal"],
        "candidates": [{"factor": k, "value": f["factors"][k]["value"], **c}
                       for k in sorted(CANDIDATES, key=lambda k: -(f["factors"][k]["value"] or 0))
                       for c in CANDIDATES[k]],
        "predicted": what_if(tau=bench["tau"], t_step=t_step, t_ar=t_ar, classes=prof["classes"],
                             drafter_s=prof["stages"].get("drafter", 0.0), full_share=full_share(turns),
                             curve=curve),
        "cost_model": checks,
    }


def _with_unlinked(profile: dict) -> dict[str, float]:
    """The profile's classes, plus the kernels no region claimed as `unattributed` (their floor unknown: 0)."""
    unlinked = profile.get("unlinked_s", 0.0)
    return {**profile["classes"], **({"unattributed": unlinked} if unlinked > 0 else {})}


def _floors(d: dict) -> dict[str, Floor]:
    return {k: Floor(**v) for k, v in d.items()}


def full_share(turns: list[TurnLattices]) -> float:
    """Share of recorded steps that accepted every drafted position (committed depth + 1 tokens)."""
    full = sum(sum(1 for n in t.live if n == t.tokens.shape[1] + 1) for t in turns)
    steps = sum(len(t.live) for t in turns)
    return full / steps if steps else 0.0


def replay_curve(turns: list[TurnLattices], s: dict, budgets: list[int]) -> tuple[dict[int, float], float]:
    """tau(N) of the system's builder at each budget replayed at the recorded anchors (replay/walk.py; a chain's
    budgets stop at its block), and tau_best at the system's own rows."""
    if not turns:
        return {}, float("nan")
    opts = s["config"]["options"]
    result = replay(turns, policies([s["builder"]], budgets, s["block"]), opts.get("tree_k", 4),
                    parse_accept(opts.get("tree_accept", "")))
    return {row["nodes"]: row["tau"] for row in result["replayed"].values()}, result["tau_best"][str(s["rows"])]


def sweep_check(sweep: dict, builder: str, curve: list[dict], block: int) -> list[dict]:
    """The node curve's predicted S(N) against a bench sweep's measured speedup of the same builder at N (a
    budget of 0 is the block)."""
    at = {p["nodes"]: p["speedup"] for p in curve}
    rows = []
    for name, s in sweep.get("systems", {}).items():
        config = s.get("config", {})
        opts = config.get("options", {})
        if config.get("base") != "stock" or opts.get("tree") != builder:
            continue
        n = opts.get("nodes") or block
        if n in at:
            rows.append({"system": name, "nodes": n, **validation(at[n], s.get("speedup_vs_ar"))})
    return rows


def _furthest(kernels: list[dict], table: list[dict], n: int = 8) -> list[dict]:
    """The kernels of the classes furthest above their floor (by excess), longest first."""
    order = {r["class"]: i for i, r in enumerate(table)}
    ranked = sorted(kernels, key=lambda k: (order.get(k["class"], 99), -k["seconds"]))
    return ranked[:n]

