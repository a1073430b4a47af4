"""`specpilot report DIR`: a loop's run directory as Markdown (report.md, plots beside it) and one self-contained
HTML page (report.html, plots inlined): tokens/s per round, the ceiling factors per round, every candidate with
its prediction, verdict and evidence, the forcing results, the memory entries written."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from specpilot.errors import UserError

FACTORS = ("tau", "kernel", "overhead", "lattice")


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


def candidate_rows(summary: dict) -> list[dict]:
    """Every candidate that reached a check or the gate: round, phase, direction, prediction, verdicts."""
    rows = []
    for r in summary["rounds"]:
        for d in r["directions"]:
            predicted = {e["system"]: e.get("speedup") for e in d.get("evidence", {}).get("evaluated", [])}
            for g in d["gated"]:
                rows.append(_row(r["round"], "1", f"{d['direction']['factor']}: {d['direction']['mechanism']}",
                                 g, predicted.get(g["candidate"])))
        if "gated" in r["integration"]:
            rows.append(_row(r["round"], "2", "integration", r["integration"]["gated"], None))
        if "gated" in r["tuning"]:
            predicted = {e["system"]: e.get("speedup") for e in r["tuning"]["evidence"]["evaluated"]}
            rows.append(_row(r["round"], "3", f"kernels of {r['tuning']['class']}", r["tuning"]["gated"],
                             predicted.get(r["tuning"]["gated"]["candidate"])))
    return rows


def _row(rnd: int, phase: str, direction: str, g: dict, predicted: float | None) -> dict:
    c, f = g.get("controller", {}), g.get("forcing", {})
    verdict = "promoted" if g.get("promoted") else (g.get("refused") or (g.get("error") and f"error: {g['error']}")
                                                    or c.get("reason") or f.get("reason", "-"))
    name = g["candidate"] if not g.get("commit") else f"{g['candidate']} @ {g['commit'][:12]}"
    return {"round": rnd, "phase": phase, "direction": direction, "candidate": name,
            "predicted": predicted, "gain": c.get("gain"), "lower": c.get("lower"), "bar": c.get("bar"),
            "forcing": f.get("verdict", "-"), "verdict": verdict}


def _fmt(v, spec=".3f") -> str:
    return "-" if v is None else format(v, spec)


def rates(summary: dict) -> list[tuple[str, float]]:
    """Decode tokens/s: stock, then each round's result, from the sealed finals (the same requests and timing)."""
    out: list[tuple[str, float]] = []
    for r in summary["rounds"]:
        c = r["sealed"].get("controller")
        if c and c.get("a_rate") and not out:
            out.append(("stock", c["a_rate"]))
        if c and c.get("b_rate"):
            out.append((f"round {r['round']}", c["b_rate"] if r["result"] == r["sealed"]["result"] else c["a_rate"]))
    return out


def _plots(summary: dict) -> dict[str, bytes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pngs = {}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    points = rates(summary)
    if points:
        ax1.bar([p[0] for p in points], [p[1] for p in points], color="#4472c4")
        for i, (_, v) in enumerate(points):
            ax1.text(i, v, f"{v:.0f}", ha="center", va="bottom")
    ax1.set_title("decode tokens/s (sealed final)")
    rounds = summary["rounds"]
    width = 0.8 / len(FACTORS)
    for k, f in enumerate(FACTORS):
        vals = [r["ceiling"]["factors"].get(f, {}).get("value") or 0 for r in rounds]
        ax2.bar([i + k * width for i in range(len(rounds))], vals, width, label=f)
    ax2.set_xticks([i + 0.4 - width / 2 for i in range(len(rounds))], [f"round {r['round']}" for r in rounds])
    ax2.set_yscale("log")
    ax2.set_title("ceiling factors at each round's start")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    pngs["report.png"] = buf.getvalue()
    return pngs


def markdown(summary: dict, image: str | None) -> str:
    lines = [f"# SpecPilot loop: {summary['deployment']}", "",
             f"Agent {summary['agent']}, {len(summary['rounds'])} of {summary['rounds_asked']} rounds, "
             f"{summary['limit']} dev request(s) per dataset, {summary['max_new_tokens']} tokens each"
             + (f" ({summary['sealed_tokens']} in the sealed forcing)" if summary.get("sealed_tokens") else "")
             + (f", budget {summary['budget_s']:.0f} s" if summary.get("budget_s") else "") + "; "
             f"commit {summary.get('commit')}"
             f"{' (dirty)' if summary.get('dirty') else ''}; {summary.get('date', '')}.", "",
             f"**Best: `{summary['best']}`**"
             + (f" on commit {summary['best_commit'][:12]} (its code: best.patch)" if summary.get("best_commit")
                else "")
             + (f" (stopped: {summary['stopped']})" if summary["stopped"] else "")
             + (f" (converged: {summary['converged']})" if summary.get("converged") else ""), ""]
    if image:
        lines += [f"![tokens/s and ceiling factors]({image})", ""]
    lines += ["## Rounds", "", "| round | start | target | factors (tau / kernel / overhead / lattice) | promoted | "
              "result | sealed gain over stock | sealed forcing | memory | seconds |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rounds"]:
        f = r["ceiling"]["factors"]
        s = r["sealed"]
        lines.append(f"| {r['round']} | `{r['start']}` | {r['target']} | "
                     + " / ".join(_fmt(f.get(k, {}).get("value"), ".2f") for k in FACTORS)
                     + f" | {len(r['promoted'])} | `{r['result']}` | "
                     f"{_fmt(s.get('controller', {}).get('gain'))} | {s.get('forcing', {}).get('verdict', '-')} "
                     f"({s['reason']}) | {', '.join(r.get('memory', [])) or '-'} | {_fmt(r.get('seconds'), '.0f')} |")
    lines += ["", "## Candidates", "", "| round | phase | direction | candidate | predicted S | gain | lower bound "
              "| bar | forcing | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in candidate_rows(summary):
        lines.append(f"| {c['round']} | {c['phase']} | {c['direction']} | `{c['candidate']}` | "
                     f"{_fmt(c['predicted'])} | {_fmt(c['gain'])} | {_fmt(c['lower'])} | {_fmt(c['bar'])} | "
                     f"{c['forcing']} | {c['verdict']} |")
    agents = [(r["round"], d["direction"], d["agent"]) for r in summary["rounds"] for d in r["directions"]
              if "agent" in d]
    masters = [(r["round"], r["master"]) for r in summary["rounds"] if r.get("master")]
    for n, m in masters:
        lines += ["", f"Round {n}'s LLM master ({m['agent']}): "
                  + ("; ".join(f"{d['factor']}: {d['mechanism']}" for d in m["directions"]) or "no directions")
                  + (f" (refused: {m['refused']})" if m["refused"] else "")]
    if agents:
        lines += ["", "## Agents", "", "| round | direction | seconds | turns | cost | jail | changed | submitted | "
                  "refused |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [_agent_row(n, d, a) for n, d, a in agents]
    skipped = [(r["round"], d["direction"], d["evidence"]["skipped"]) for r in summary["rounds"]
               for d in r["directions"] if d.get("evidence", {}).get("skipped")]
    if skipped:
        lines += ["", "## Directions not searched (the ceiling rules them out, or the budget)", ""]
        lines += [f"- round {n}, {d['factor']}: {d['mechanism']}: {why}" for n, d, why in skipped]
    return "\n".join(lines) + "\n"


def _agent_row(rnd: int, d: dict, a: dict) -> str:
    if "skipped" in a:
        return f"| {rnd} | {d['factor']}: {d['mechanism']} | - | - | - | - | - | - | {a['skipped']} |"
    cost = a["watch"].get("cost_usd")
    jail = "yes" if a["jail"]["used"] else f"no ({a['jail']['why_not']})"
    submitted = ", ".join("`" + c["system"] + "`" for c in a["candidates"]) or "-"
    return (f"| {rnd} | {d['factor']}: {d['mechanism']} | {a['finished']['seconds']:.0f} | {a['watch']['turns']} | "
            f"{'-' if cost is None else f'${cost:.2f}'} | {jail} | {len(a['frozen']['changed'])} files | "
            f"{submitted} | {a['refused'] or '-'} |")


def to_html(md: str, png: bytes | None) -> str:
    """The Markdown's tables and text as HTML (a small converter for what markdown() writes), plot inlined."""
    body, table = [], []

    def flush() -> None:
        if table:
            head, *rest = table
            cells = lambda r, t: "".join(f"<{t}>{_inline(c)}</{t}>" for c in r)  # noqa: E731
            body.append("<table><tr>" + cells(head, "th") + "</tr>" + "".join(
                "<tr>" + cells(r, "td") + "</tr>" for r in rest) + "</table>")
            table.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if not all(set(c) <= {"-"} for c in cells):
                table.append(cells)
            continue
        flush()
        if line.startswith("!["):
            if png:
                body.append(f'<img alt="tokens/s and ceiling factors" src="data:image/png;base64,'
                            f'{base64.b64encode(png).decode()}">')
        elif line.startswith("## "):
            body.append(f"<h2>{_inline(line[3:])}</h2>")
        elif line.startswith("# "):
            body.append(f"<h1>{_inline(line[2:])}</h1>")
        elif line.strip():
            body.append(f"<p>{_inline(line)}</p>")
    flush()
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse;"
             "font-size:90%}td,th{border:1px solid #ccc;padding:3px 6px}code{background:#f4f4f4}")
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>SpecPilot loop</title><style>{style}"
            "</style></head><body>" + "\n".join(body) + "</body></html>\n")


def _inline(text: str) -> str:
    out = html.escape(text)
    parts = out.split("`")
    out = "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))
    parts = out.split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


def write_report(run_dir: Path) -> tuple[Path, Path]:
    run_dir = Path(run_dir)
    summary = load_summary(run_dir)
    pngs = _plots(summary) if summary["rounds"] else {}
    for name, data in pngs.items():
        (run_dir / name).write_bytes(data)
    md = markdown(summary, "report.png" if pngs else None)
    (run_dir / "report.md").write_text(md)
    (run_dir / "report.html").write_text(to_html(md, pngs.get("report.png")))
    return run_dir / "report.md", run_dir / "report.html"
