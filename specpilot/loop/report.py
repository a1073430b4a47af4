"""`specpilot report DIR`: a loop's run directory as Markdown (report.md, its chart beside it as report.png) and one
self-contained HTML page (report.html, the chart inlined), in the order a person reads it: the errors (if any),
a verdict (the best system, its sealed speedup over stock and over AR, the forcing evidence and its power, the
logic check), tokens/s across rounds with the bottleneck Phase 0 named in each, every candidate with its evidence
and every skipped direction with its reason, and links to the files behind each number.

The page is built from blocks (headings, paragraphs, tables, lists) rendered twice, as Markdown and as HTML; text
in a block uses `code`, **bold**, [links](path) and !!errors!! (red in the HTML). loop.json is read tolerantly:
runs written before round["search"], gate["logic"] or sealed["over_ar"] existed render with what they hold."""

from __future__ import annotations

import base64
import html
import io
import json
import re
from pathlib import Path

from specpilot.errors import UserError

FACTORS = ("tau", "kernel", "overhead", "lattice")
CHART = "report.png"


def load_summary(run_dir: Path) -> dict:
    path = Path(run_dir) / "loop.json"
    if Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise UserError(f"{run_dir} is not a folder: name a loop's run directory")
    if not path.is_file():
        how = (f"continue it with `specpilot loop --resume --run-dir {run_dir}`"
               if (Path(run_dir) / "steps").is_dir() else f"run `specpilot loop --run-dir {run_dir}`")
        raise UserError(f"{run_dir} holds no finished loop (no loop.json): {how}")
    try:
        summary = json.loads(path.read_text())
    except ValueError as exc:
        raise UserError(f"{path} is not JSON: {exc}") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("rounds"), list):
        raise UserError(f"{path} is not a loop's summary (no rounds)")
    return summary


# numbers and words


def _fmt(v, spec=".3f") -> str:
    return "-" if not isinstance(v, int | float) else format(v, spec)


def _pct(v) -> str:
    return _fmt(None if v is None else 100 * v, ".2f") + ("%" if isinstance(v, int | float) else "")


def _dir_name(d) -> str:
    """A direction as words: the new layout may name it as a string, the old one as {factor, mechanism}."""
    if isinstance(d, dict):
        return f"{d.get('factor', '?')}: {d.get('mechanism', '?')}"
    return str(d) if d else "-"


def _bounds(c: dict) -> str:
    seq = c.get("sequential") or {}
    looks = (f" ({len(seq['looks'])} looks, {seq['looks'][-1]['requests']} requests)"
             if len(seq.get("looks", [])) > 1 else "")
    return f"{_fmt(c.get('gain'))}x [{_fmt(c.get('lower'))}, {_fmt(c.get('upper'))}]{looks}"


# what the rounds hold, in either layout


def gates(r: dict) -> list[tuple[str, dict]]:
    """Every gate of a round with the direction or phase that asked for it (Phase 1's, then integration's and
    kernel tuning's, each once)."""
    search = r.get("search")
    if isinstance(search, dict):
        where = {e.get("system"): _dir_name(e.get("direction")) for e in search.get("ranked", [])}
        out = [(where.get(g.get("candidate"), "-"), g) for g in search.get("gated", [])]
    else:
        out = [(_dir_name(d.get("direction")), g) for d in r.get("directions", []) for g in d.get("gated", [])]
    seen = {(g.get("candidate"), g.get("start")) for _, g in out}
    extra = [("phase 2: integration", (r.get("integration") or {}).get("gated")),
             (f"phase 3: kernels of {(r.get('tuning') or {}).get('class')}", (r.get("tuning") or {}).get("gated"))]
    return out + [(w, g) for w, g in extra if g and (g.get("candidate"), g.get("start")) not in seen]


def ranked(r: dict) -> list[dict]:
    """Every candidate predicted in a round, best first (the old layout: by direction, each one's best first),
    with its status (the old layout's derived from its gates, or the error or pruning its evidence recorded)."""
    search = r.get("search")
    if isinstance(search, dict):
        return [{**e, "direction": _dir_name(e.get("direction"))} for e in search.get("ranked", [])]
    judged = {g.get("candidate"): g for _, g in gates(r)}
    groups = [(_dir_name(d.get("direction")), d.get("evidence") or {}) for d in r.get("directions", [])]
    tuning = r.get("tuning") or {}
    if tuning.get("evidence"):
        groups.append((f"phase 3: kernels of {tuning.get('class')}", tuning["evidence"]))
    rows = []
    for where, ev in groups:  # each direction's own candidates best first (phase 3's start is another system)
        for e in sorted(ev.get("evaluated", []), key=lambda e: -(e.get("speedup") or 0.0)):
            status = ("error: " + str(e["error"]) if "error" in e else "pruned: " + str(e["pruned"])
                      if "pruned" in e else "not reached: " + str(e["not_reached"]) if "not_reached" in e
                      else _decision(judged[e.get("system")]) if e.get("system") in judged else "not chosen")
            rows.append({**e, "direction": where, "status": status})
    return rows


def skipped(r: dict) -> list[tuple[str, str]]:
    """(direction or phase, why it was not searched) for a round."""
    search = r.get("search")
    if isinstance(search, dict):
        out = [(_dir_name(s.get("direction")), str(s.get("reason"))) for s in search.get("skipped", [])]
    else:
        out = [(_dir_name(d.get("direction")), str((d.get("evidence") or {}).get("skipped")
                                                   or (d.get("agent") or {}).get("skipped")))
               for d in r.get("directions", [])
               if (d.get("evidence") or {}).get("skipped") or (d.get("agent") or {}).get("skipped")]
    integ, tuning = r.get("integration") or {}, r.get("tuning") or {}
    if integ.get("refused"):
        out.append((f"phase 2: integration of {integ.get('combined')}", str(integ["refused"])))
    if tuning.get("refused") or tuning.get("skipped"):
        out.append((f"phase 3: kernels of {tuning.get('class')}", str(tuning.get("refused") or tuning["skipped"])))
    return out


def _decision(g: dict) -> str:
    """A gate's outcome in words: a worker that died is an error, not a verdict."""
    if g.get("error"):
        return f"!!error: {g['error']}!!"
    if g.get("promoted"):
        return "promoted"
    c, f = g.get("controller") or {}, g.get("forcing") or {}
    return "refused: " + str(g.get("refused") or c.get("reason") or f.get("reason") or "-")


def _logic(logic: dict | None) -> str:
    if not logic:
        return "-"
    ties = logic.get("ties") or []
    parts = [f"{logic.get('equal', '?')}/{logic.get('requests', '?')} requests equal" if "equal" in logic else None,
             f"{logic['tokens']} tokens" if logic.get("tokens") is not None else None,
             f"{len(ties)} tie(s)" if ties else None, f"exact {logic['exact']}" if logic.get("exact") else None]
    said = ", ".join(p for p in parts if p)
    return f"{logic.get('verdict', '?')}" + (f" ({said})" if said else "") + (
        f": {logic['reason']}" if logic.get("reason") else "")


def _forcing(f: dict | None) -> str:
    if not f:
        return "-"
    power = f.get("power") or {}
    met = {True: "met", False: "not met"}.get(power.get("met"), "not recorded")
    return (f"{f.get('verdict', '?')}; could detect an excess mismatch of {_pct(f.get('detectable_rate'))}"
            + (f" (power bound {_pct(power.get('bound'))}: {met})" if power else ""))


def _mechanism(m: dict | None) -> str:
    if not m:
        return "-"
    counters = ", ".join(f"{k}={v}" for k, v in m.items() if k not in ("ran", "what"))
    return (("ran" if m.get("ran") else "!!did not run!!") + f": {m.get('what', '?')}"
            + (f" ({counters})" if counters else ""))


# the verdict


def best_final(summary: dict) -> tuple[dict | None, dict | None]:
    """The round and sealed final that proved the best system against stock (the last that passed with it)."""
    for r in reversed(summary.get("rounds", [])):
        s = r.get("sealed") or {}
        if s.get("passed") and s.get("result") == summary.get("best") and s.get("controller"):
            return r, s
    return None, None


def stock_over_ar(summary: dict) -> float | None:
    """Stock's speedup over AR as Phase 0 measured it on the dev requests (the ceiling of stock)."""
    return next((r["ceiling"].get("speedup") for r in summary.get("rounds", [])
                 if (r.get("ceiling") or {}).get("system") == "stock"), None)


def _in_flight(summary: dict) -> int | None:
    """Requests served at once (the loop's --in-flight, regime batch), as Phase 0 recorded it; None: one."""
    return next((r["ceiling"].get("in_flight") for r in summary.get("rounds", []) if r.get("ceiling")), None)


def _units(summary: dict, count) -> str:
    """What the controller's count counts: requests, or under regime batch closed loops of that many."""
    n = _in_flight(summary)
    return f"{count} closed loops of {n} requests" if n else f"{count} requests"


def _over_ar(summary: dict, sealed: dict) -> str:
    o = sealed.get("over_ar")
    if isinstance(o, dict) and o.get("gain") is not None:
        return f"{_bounds(o)} over AR"
    s, gain = stock_over_ar(summary), (sealed.get("controller") or {}).get("gain")
    if s is None or gain is None:
        return "over AR not known (no ceiling of stock)"
    n = _in_flight(summary)
    ar = f"batched AR ({n} in flight)" if n else "AR"
    return (f"about {s * gain:.3f}x over {ar} (estimated from dev requests: stock's {s:.3f}x over {ar} in Phase 0 "
            f"times the sealed gain)")


def _forcing_sentence(f: dict | None) -> str:
    if not f:
        return "Token forcing: not run."
    tokens, mismatch = f.get("tokens") or {}, f.get("mismatch") or {}
    roles = "; ".join(f"{role} {_pct(mismatch.get(role))} mismatch over {tokens.get(role, '?')} tokens"
                      for role in sorted(set(tokens) | set(mismatch)))
    return (f"Token forcing: **{f.get('verdict', '?')}** ({f.get('reason', '-')})" + (f"; {roles}" if roles else "")
            + f"; {_forcing(f).split('; ', 1)[-1]}.")


def _promoting_gate(summary: dict) -> dict | None:
    return next((g for r in summary.get("rounds", []) for _, g in gates(r)
                 if g.get("promoted") and g.get("candidate") == summary.get("best")), None)


def _logic_sentence(sealed: dict, gate: dict | None) -> str:
    said = [f"sealed final {_logic(sealed.get('logic'))}" if sealed.get("logic") else None,
            f"at its gate {_logic(gate.get('logic'))}" if gate and gate.get("logic") else None]
    said = [s for s in said if s]
    return "Logic check: " + ("; ".join(said) if said else "not recorded for this run") + "."


def why_stock(summary: dict) -> str:
    """In plain words, why each round ended where it started (stock kept)."""
    said = []
    for r in summary.get("rounds", []):
        n, s, gated = r.get("round"), r.get("sealed") or {}, [g for _, g in gates(r)]
        if s.get("result") not in (None, r.get("start")) and not s.get("passed"):
            said.append(f"round {n}'s result `{s['result']}` failed the sealed final ({s.get('reason')})")
        elif not gated:
            said.append(f"round {n} gated no candidate (its candidates' statuses and skipped directions are below)")
        if r.get("unreached"):
            left = (f"left {r['unreached']} candidates unreached" if isinstance(r["unreached"], int) else
                    f"ran out: {r['unreached']}")
            said.append(f"round {n}'s share of the budget {left}, and round {n + 1} went on with its search from the "
                        "same start")
        elif not any(g.get("promoted") for g in gated):
            timed = [g for g in gated if (g.get("controller") or {}).get("gain") is not None]
            top = max(timed, key=lambda g: g["controller"]["gain"], default=None)
            said.append(f"round {n} gated {len(gated)} candidate(s) and none was proven faster than its start"
                        + (f" (the best, `{top['candidate']}`, gained {_fmt(top['controller']['gain'])}x with a "
                           f"lower bound of {_fmt(top['controller'].get('lower'))}, under the bar "
                           f"{_fmt(top['controller'].get('bar'))})" if top else ""))
    if summary.get("stopped"):
        said.append(f"the loop stopped early: {summary['stopped']}")
    return "; ".join(said) or "no round ran"


def verdict(summary: dict) -> tuple[str, bool]:
    """The verdict paragraph and whether the run can be trusted (no errors recorded)."""
    errors = summary.get("errors") or []
    lead = (f"!!This run is not trustworthy: {len(errors)} error(s) above (a worker died or ran out of memory); "
            "the numbers below may be missing or wrong.!! " if errors else "")
    best = summary.get("best")
    _, sealed = best_final(summary)
    if best in (None, "stock") or sealed is None:
        return lead + f"The loop kept **stock**: {why_stock(summary)}." + _ending(summary, ("converged",)), not errors
    c = sealed.get("controller") or {}
    commit = f" on commit {summary['best_commit'][:12]}" if summary.get("best_commit") else ""
    text = (f"Best: **`{best}`**{commit}. On the sealed requests it decodes {_fmt(c.get('b_rate'), '.0f')} tokens/s "
            f"against stock's {_fmt(c.get('a_rate'), '.0f')}: {_bounds(c)} over stock (the controller's bounds; "
            f"bar {_fmt(c.get('bar'))}, {_units(summary, c.get('requests', '?'))}), {_over_ar(summary, sealed)}. "
            f"{_forcing_sentence(sealed.get('forcing'))}{_let_through(sealed)} "
            f"{_logic_sentence(sealed, _promoting_gate(summary))}")
    return lead + text + _ending(summary), not errors


def _let_through(sealed: dict) -> str:
    """Why a sealed final whose forcing was inconclusive still passed (the gate's rule, loop/gate.forcing_refusal)."""
    f = sealed.get("forcing") or {}
    if f.get("verdict") != "inconclusive" or not sealed.get("passed"):
        return ""
    agree = f.get("agreement") or {}
    why = ("its outputs equal stock's token for token" if agree.get("requests") and agree.get("equal") ==
           agree.get("requests") else "it changes logic alone (stock's kernels and weights), which the float32 check "
           "decided token for token")
    return f" Forcing's inconclusive verdict let it through: {why}."


def _ending(summary: dict, keys=("converged", "stopped")) -> str:
    return "".join(f" {k.capitalize()}: {summary[k]}." for k in keys if summary.get(k))


# tokens/s and the chart


def rates(summary: dict) -> list[tuple[str, float]]:
    """Decode tokens/s: stock (its first sealed final), then each round's result from the sealed finals (the
    same requests and timing); a round whose final failed keeps its start's rate."""
    first = next((r["sealed"]["controller"]["a_rate"] for r in summary.get("rounds", [])
                  if ((r.get("sealed") or {}).get("controller") or {}).get("a_rate")), None)
    if first is None:
        return []
    out, now = [("stock", first)], first
    for r in summary["rounds"]:
        s = r.get("sealed") or {}
        b = (s.get("controller") or {}).get("b_rate")
        if r.get("result") == "stock":
            now = first
        elif s.get("passed") and s.get("result") == r.get("result") and b:
            now = b
        out.append((f"round {r.get('round')}", now))
    return out


def chart(summary: dict) -> bytes | None:
    points = rates(summary)
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = {f"round {r.get('round')}": r.get("target") for r in summary["rounds"]}
    labels = [p[0] + (f"\n(target: {targets[p[0]]})" if targets.get(p[0]) else "") for p in points]
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(points), 3.2))
    ax.bar(labels, [p[1] for p in points], color=["#999999"] + ["#4472c4"] * (len(points) - 1))
    ax.plot(labels, [p[1] for p in points], color="#c0504d", marker="o")
    for i, (_, v) in enumerate(points):
        ax.text(i, v, f"{v:.0f}", ha="center", va="bottom")
    ax.set_ylabel("decode tokens/s")
    ax.set_title("sealed finals: stock and each round's result")
    ax.margins(y=0.15)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


# the sections


def _header(summary: dict) -> list:
    return [("h1", f"SpecPilot loop: {summary.get('deployment', '?')}"),
            ("p", f"Agent {summary.get('agent', '?')}, {len(summary.get('rounds', []))} of "
                  f"{summary.get('rounds_asked', '?')} rounds, {summary.get('limit', '?')} dev request(s) per "
                  f"dataset, {summary.get('max_new_tokens', '?')} tokens each"
                  + (f" ({summary['sealed_tokens']} in the sealed forcing)" if summary.get("sealed_tokens") else "")
                  + (f", budget {summary['budget_s']:.0f} s" if summary.get("budget_s") else "")
                  + f"; commit {summary.get('commit', '?')}{' (dirty)' if summary.get('dirty') else ''}"
                  + (f"; {summary['date']}" if summary.get("date") else "") + ".")]


def _rounds_section(summary: dict, png: bytes | None) -> list:
    points = dict(rates(summary))
    stock = points.get("stock")
    rows = [["stock", "`stock`", "-", *["-"] * len(FACTORS), _fmt(stock_over_ar(summary)), _fmt(stock, ".0f"),
             "1.000", "-", "-"]] if stock else []
    for r in summary.get("rounds", []):
        label, f, s = f"round {r.get('round')}", (r.get("ceiling") or {}).get("factors") or {}, r.get("sealed") or {}
        rate = points.get(label)
        rows.append([label, f"`{r.get('start')}` -> `{r.get('result')}`", f"**{r.get('target', '-')}**",
                     *[_fmt((f.get(k) or {}).get("value"), ".2f") for k in FACTORS],
                     _fmt((r.get("ceiling") or {}).get("speedup")), _fmt(rate, ".0f"),
                     _fmt(rate / stock if rate and stock else None),
                     _sealed_cell(s),
                     _fmt(r.get("seconds"), ".0f")])
    out = [("h2", "Tokens/s across rounds")]
    if png:
        out.append(("img", "decode tokens/s of stock and each round's result (sealed finals)", CHART))
    out.append(("p", "Each round's target is the largest factor of its start's ceiling (Phase 0): the bottleneck "
                     "the round works on. Tokens/s are decode tokens per second in the sealed finals; S is the "
                     "start's speedup over AR that Phase 0 measured on the dev requests."))
    head = ["round", "start -> result", "target", *FACTORS, "S over AR (start)", "tokens/s", "over stock",
            "sealed final: gain over stock [bounds]", "seconds"]
    return out + [("table", head, rows)] + [("p", line) for line in _batch_model_lines(summary)]


def _batch_model_lines(summary: dict) -> list[str]:
    """Under regime batch: Phase 0's cost model of each round's start at the deployment's concurrency
    (ceiling/batch.py) beside what was measured."""
    out = []
    for r in summary.get("rounds", []):
        c = r.get("ceiling") or {}
        m = c.get("batch_model")
        if not m:
            continue
        at = m["at"]
        out.append(f"Round {r.get('round')}, {at['in_flight']} in flight: `{c.get('system')}`'s step of "
                   f"{at['rows']} rows at its floor costs {at['cost']:.2f}x batched AR's ({at['bound']}-bound; AR's "
                   f"{at['ar_bound']}-bound), so speculation's ceiling there is {at['speedup_ceiling']:.2f}x over "
                   f"batched AR at tau {m['tau']:.2f}; measured {_fmt(c.get('speedup'))}.")
    return out


def _sealed_cell(s: dict) -> str:
    c, reason = s.get("controller") or {}, s.get("reason") or "-"
    said = reason if reason in ("held", "the round kept stock") else (
        f"held: {reason}" if s.get("passed") else f"!!failed: {reason}!!")
    return (_bounds(c) + " " if c else "") + f"({said})"


def _candidates_section(summary: dict, files: dict) -> list:
    out = [("h2", "Candidates")]
    for r in summary.get("rounds", []):
        n = r.get("round")
        out.append(("h3", f"Round {n}: gated candidates"))
        g_rows = [_gate_row(where, g, r, files) for where, g in gates(r)]
        out.append(("table", ["candidate", "direction", "predicted S", "gain [lower, upper]", "bar", "logic check",
                              "forcing", "mechanism", "decision", "evidence"], g_rows) if g_rows else
                   ("p", "No candidate reached the gate."))
        rows = [[str(i + 1), f"`{e.get('system')}`", e.get("direction", "-"), _fmt(e.get("tau"), ".2f"),
                 str(e.get("tau_from") or "-"), _fmt(e.get("speedup")), _fmt(e.get("over_start")),
                 str(e.get("status") or "-")] for i, e in enumerate(ranked(r))]
        out.append(("h3", f"Round {n}: every candidate predicted"))
        out.append(("table", ["#", "candidate", "direction", "replay tau", "tau from", "S over AR", "over start",
                              "status"], rows) if rows else ("p", "No candidate was predicted in this round."))
        why = skipped(r)
        if why:
            out += [("h3", f"Round {n}: not searched"), ("list", [f"{w}: {reason}" for w, reason in why])]
    return out


def _gate_row(where: str, g: dict, r: dict, files: dict) -> list[str]:
    c = g.get("controller") or {}
    predicted = g.get("predicted")
    if predicted is None:
        predicted = next((e.get("speedup") for e in ranked(r) if e.get("system") == g.get("candidate")), None)
    path = files.get(("gate", f"round-{r.get('round')}", g.get("start"), g.get("candidate")))
    name = f"`{g.get('candidate')}`" + (f" @ {g['commit'][:12]}" if g.get("commit") else "")
    return [name, where, _fmt(predicted), _bounds(c) if c else "-", _fmt(c.get("bar")), _logic(g.get("logic")),
            _forcing(g.get("forcing")), _mechanism(g.get("mechanism")), _decision(g),
            f"[gate]({path})" if path else "-"]


def step_files(run_dir: Path) -> dict[tuple, str]:
    """The steps that hold a verdict, relative to the run directory, read from the steps themselves so that any
    step layout links: ("gate", "round-N", start, candidate) and ("sealed", result) -> path."""
    out: dict[tuple, str] = {}
    steps = run_dir / "steps"
    for path in sorted(steps.rglob("*.json")) if steps.is_dir() else []:
        rel = path.relative_to(run_dir)
        if path.name != "gate.json" and rel.parts[1] != "sealed":
            continue
        try:
            step = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(step, dict) and "key" in step:  # a keyed step file (loop/rundir.py): its result inside
            step = step.get("result")
        if isinstance(step, dict):
            key = (("gate", rel.parts[1], step.get("start"), step.get("candidate")) if path.name == "gate.json"
                   else ("sealed", step.get("result")))
            out.setdefault(key, rel.as_posix())
    return out


def _files_section(summary: dict, run_dir: Path, files: dict) -> list:
    names = ["loop.json", "best.toml", "best.patch", CHART, "run.json", "log.jsonl"]
    items = [" ".join(f"[{n}]({n})" for n in names if (run_dir / n).is_file()) or "no summary files"]
    items += [f"round {r.get('round')}: " + "; ".join(_round_files(r, run_dir, files) or ["no files"])
              for r in summary.get("rounds", [])]
    return [("h2", "Files"), ("list", items)]


def _round_files(r: dict, run_dir: Path, files: dict) -> list[str]:
    """Links to a round's ceiling, its evidence steps, its sealed final and its memory entries."""
    out, ceiling = [], r.get("ceiling") or {}
    folder = ceiling.get("folder")
    if folder and (run_dir / folder).exists():
        out.append(f"ceiling of `{ceiling.get('system')}` [{folder}/]({folder}/)")
    steps = run_dir / "steps" / f"round-{r.get('round')}"
    evidence = sorted(steps.rglob("evidence.json")) if steps.is_dir() else []
    if evidence:
        out.append("evidence " + ", ".join(f"[{p.parent.relative_to(steps).as_posix()}]"
                                           f"({p.relative_to(run_dir).as_posix()})" for p in evidence))
    sealed = files.get(("sealed", (r.get("sealed") or {}).get("result")))
    if sealed:
        out.append(f"sealed final [{Path(sealed).name}]({sealed})")
    for entry in r.get("memory") or []:
        path = next((p for p in (f"memory/entries/{entry}/entry.json", f"memory/{entry}")
                     if (run_dir / p).exists()), None)
        out.append(f"memory entry [{entry}]({path})" if path else f"memory entry {entry} (!!not in this folder!!)")
    return out


def blocks(summary: dict, run_dir: Path, png: bytes | None) -> list:
    text, trusted = verdict(summary)
    errors = [str(e) for e in summary.get("errors") or []]
    out = _header(summary) + ([("errors", errors)] if errors else []) + [("verdict", text, trusted)]
    files = step_files(run_dir)
    return (out + _rounds_section(summary, png) + _candidates_section(summary, files) + _memory_section(summary)
            + _agents_section(summary) + _files_section(summary, run_dir, files))


def carried(summary: dict) -> list[dict]:
    """Each memory entry the loop was given: where it was made, and what became of it here: the candidates it gave,
    round by round, with their statuses (promoted: it carried; re-tuned and re-tested here, never a discovery)."""
    out = []
    for entry in summary.get("memory_given") or []:
        system = entry["registry"]["system"]
        seen = [(r.get("round"), e) for r in summary.get("rounds", []) for e in ranked(r)
                if system in (e.get("entries") or [])]
        promoted = [(n, e) for n, e in seen if e.get("status") == "promoted"]
        also = lambda e: "" if e.get("reused") else f" (also a move of {e.get('direction')})"  # noqa: E731
        fate = (f"carried: `{promoted[0][1]['system']}` promoted in round {promoted[0][0]}{also(promoted[0][1])}"
                if promoted else
                "did not carry: " + "; ".join(f"`{e['system']}` in round {n}: {e.get('status')}" for n, e in seen)
                if seen else "did not carry: no move from any round's start (its base differs, or the start holds it)")
        out.append({"id": entry.get("id"), "system": system, "made_on": entry.get("fingerprint") or {},
                    "same": (entry.get("fingerprint") or {}) == summary.get("fingerprint"), "fate": fate,
                    "carried": bool(promoted)})
    return out


def _memory_section(summary: dict) -> list:
    rows = [[f"`{c['id']}`", f"`{c['system']}`", _made_on(c["made_on"]) + (" (this deployment)" if c["same"] else ""),
             c["fate"]] for c in carried(summary)]
    if not rows:
        return []
    return [("h2", "Memory"), ("p", "The memory's entries, each made on some deployment: the candidates they gave here "
                               "were re-tuned and re-tested like any other, and one promoted is reuse, not a "
                               "discovery."), ("table", ["entry", "system", "made on", "here"], rows)]


def _made_on(fp: dict) -> str:
    return ", ".join(str(fp.get(k)) for k in ("target", "drafter", "gpu", "dtype") if fp.get(k) is not None) or "-"


def _agents_section(summary: dict) -> list:
    """A coding agent's work per direction (time, turns, money, jail, files changed, what it submitted), and what an
    LLM master proposed; nothing for the builtin agent."""
    out: list = []
    for r in summary["rounds"]:
        m = r.get("master")
        if m:
            proposed = "; ".join(f"{d['factor']}: {d['mechanism']}" for d in m.get("directions", [])) or "none"
            out.append(("p", f"Round {r['round']}'s LLM master ({m.get('agent')}) proposed: {proposed}"
                        + (f" (refused: {m['refused']})" if m.get("refused") else "")))
    rows = [_agent_row(r["round"], d["direction"], d["agent"]) for r in summary["rounds"]
            for d in r.get("directions", []) if "agent" in d]
    if rows:
        out += [("h2", "Agents"), ("table", ["round", "direction", "seconds", "turns", "cost", "jail", "changed",
                                             "submitted", "refused"], rows)]
    return out


def _agent_row(rnd: int, d: dict, a: dict) -> list:
    where = f"{d['factor']}: {d['mechanism']}"
    if "skipped" in a:
        return [rnd, where, "-", "-", "-", "-", "-", "-", a["skipped"]]
    cost = a.get("watch", {}).get("cost_usd")
    jail = a.get("jail", {})
    submitted = ", ".join(f"`{c['system']}`" for c in a.get("candidates", [])) or "-"
    return [rnd, where, _fmt(a.get("finished", {}).get("seconds"), ".0f"), a.get("watch", {}).get("turns", "-"),
            "-" if cost is None else f"${cost:.2f}", "yes" if jail.get("used") else f"no ({jail.get('why_not')})",
            f"{len(a.get('frozen', {}).get('changed', []))} files", submitted, a.get("refused") or "-"]


# rendering


def markdown(parts: list) -> str:
    lines: list[str] = []
    for kind, *rest in parts:
        if kind in ("h1", "h2", "h3"):
            lines += ["#" * int(kind[1]) + " " + rest[0], ""]
        elif kind == "p":
            lines += [_md(rest[0]), ""]
        elif kind == "verdict":
            lines += ["> **Verdict.** " + _md(rest[0]), ""]
        elif kind == "errors":
            lines += ["> **⚠ Errors**", ">"] + [f"> - {_md(e)}" for e in rest[0]] + [""]
        elif kind == "list":
            lines += [f"- {_md(item)}" for item in rest[0]] + [""]
        elif kind == "img":
            lines += [f"![{rest[0]}]({rest[1]})", ""]
        elif kind == "table":
            head, rows = rest
            lines += [_md_row(head), "|" + "---|" * len(head)] + [_md_row(row) for row in rows] + [""]
    return "\n".join(lines)


def _md(text: str) -> str:
    return re.sub(r"!!(.+?)!!", r"**⚠ \1**", text)


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(_md(str(c)).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1240px;margin:1.5em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ddd}
h3{font-size:1.05em;margin-top:1.2em}
.verdict{border-left:6px solid #2e7d32;background:#f1f8e9;padding:.8em 1.1em;margin:1em 0;font-size:1.02em}
.verdict.untrusted{border-left-color:#c62828;background:#ffebee}
.errors{border:2px solid #c62828;background:#ffebee;color:#b71c1c;padding:.5em 1.1em;margin:1em 0}
.error{color:#c62828;font-weight:bold}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0 1.2em;width:100%}
th{background:#37474f;color:#fff;text-align:left;font-weight:600}
td,th{border:1px solid #cfd8dc;padding:4px 7px;vertical-align:top}
tr:nth-child(even) td{background:#f5f7f8}
code{background:#eceff1;padding:0 3px;border-radius:3px;font-size:.95em}
img{max-width:100%;border:1px solid #eee}a{color:#1565c0}
"""


def to_html(parts: list, pngs: dict[str, bytes]) -> str:
    body = []
    for kind, *rest in parts:
        if kind in ("h1", "h2", "h3", "p"):
            body.append(f"<{kind}>{_html(rest[0])}</{kind}>")
        elif kind == "verdict":
            body.append(f'<div id="verdict" class="verdict{"" if rest[1] else " untrusted"}"><p>'
                        f"<b>Verdict.</b> {_html(rest[0])}</p></div>")
        elif kind == "errors":
            body.append('<div id="errors" class="errors"><b>Errors</b><ul>'
                        + "".join(f"<li>{_html(e)}</li>" for e in rest[0]) + "</ul></div>")
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li>{_html(i)}</li>" for i in rest[0]) + "</ul>")
        elif kind == "img" and rest[1] in pngs:
            body.append(f'<img alt="{html.escape(rest[0])}" src="data:image/png;base64,'
                        f'{base64.b64encode(pngs[rest[1]]).decode()}">')
        elif kind == "table":
            head, rows = rest
            body.append("<table><tr>" + "".join(f"<th>{_html(h)}</th>" for h in head) + "</tr>" + "".join(
                "<tr>" + "".join(f"<td>{_html(str(c))}</td>" for c in row) + "</tr>" for row in rows) + "</table>")
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>SpecPilot loop</title><style>{STYLE}</style>'
            "</head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _html(text: str) -> str:
    out = html.escape(text, quote=True)
    out = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', out)
    out = re.sub(r"!!(.+?)!!", r'<span class="error">\1</span>', out)
    out = "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(out.split("`")))
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(out.split("**")))


def _write(path: Path, data: str | bytes) -> None:
    """The one place the report's files are written: each whole or as it was (a failure is one line)."""
    from specpilot.results import write_bytes_atomic

    write_bytes_atomic(path, data.encode() if isinstance(data, str) else data)


def write_report(run_dir: Path) -> tuple[Path, Path]:
    run_dir = Path(run_dir)
    summary = load_summary(run_dir)
    png = chart(summary)
    if png:
        _write(run_dir / CHART, png)
    parts = blocks(summary, run_dir, png)
    _write(run_dir / "report.md", markdown(parts))
    _write(run_dir / "report.html", to_html(parts, {CHART: png} if png else {}))
    return run_dir / "report.md", run_dir / "report.html"
