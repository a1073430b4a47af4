"""`specpilot report`: the verdict first, tokens/s across rounds with each round's target, every candidate with its
evidence, links that resolve; from run directories of both loop.json layouts (round["search"] and without)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from specpilot.errors import UserError
from specpilot.loop import report
from specpilot.loop.report import load_summary, rates, write_report

R1, R2 = "stock:nodes=64,tree=best_first", "stock:gemv=true,nodes=64,tree=best_first"


def _factors(tau, kernel, overhead):
    return {"tau": {"value": tau}, "kernel": {"value": kernel}, "overhead": {"value": overhead},
            "lattice": {"value": 4.2}}


def _ceiling(system, target, factors, speedup):
    return {"system": system, "folder": f"ceilings/{system.replace(':', '-').replace(',', '-')}", "target": target,
            "factors": factors, "speedup": speedup, "classes": [], "candidates": [], "predicted": {}, "ceiling": 3.0}


def _forcing(verdict="pass"):
    return {"verdict": verdict, "reason": "mismatch 1.2% vs reference 1.3%", "exact": "float32", "delta": 0.5,
            "detectable_rate": 0.0213, "power": {"bound": 0.01, "met": False, "requests": 3},
            "agreement": {"requests": 3, "equal": 3}, "tests": {},
            "mismatch": {"reference": 0.013, "candidate": 0.012, "ar": 0.02},
            "tokens": {"reference": 933, "candidate": 1177, "ar": 1040}, "events": {}}


def _logic(verdict="pass"):
    return {"verdict": verdict, "reason": "outputs equal AR's", "requests": 3, "tokens": 96, "equal": 3,
            "ties": [{"request": 1, "position": 7}], "exact": "float32"}


def _controller(gain, lower, upper, a_rate=None, b_rate=None, verdict="promote"):
    return {"verdict": verdict, "reason": f"lower bound {lower} > 1.03" if verdict == "promote" else
            f"not proven: lower bound {lower} <= 1.03", "gain": gain, "lower": lower, "upper": upper,
            "noise": 0.004, "bar": 1.03, "requests": 5, "a_rate": a_rate, "b_rate": b_rate}


def _gate(cand, start, gain, lower, upper, promoted=True, **more):
    return {"candidate": cand, "start": start, "promoted": promoted,
            "controller": _controller(gain, lower, upper, verdict="promote" if promoted else "reject"),
            **({"forcing": _forcing(), "logic": _logic()} if promoted else {}), **more}


def _sealed(result, gain, lower, upper, a_rate, b_rate, **more):
    return {"passed": True, "result": result, "reason": "held",
            "controller": _controller(gain, lower, upper, a_rate, b_rate), "forcing": _forcing(), **more}


def _round_new(n, start, result, target, factors, speedup, gated, ranked, skipped, sealed, memory):
    return {"round": n, "start": start, "target": target, "ceiling": _ceiling(start, target, factors, speedup),
            "directions": [], "search": {"ranked": ranked, "skipped": skipped, "gated": gated},
            "integration": {"parts": [], "combined": None, "result": result}, "tuning": {"class": None},
            "sealed": sealed, "result": result, "promoted": [g["candidate"] for g in gated if g["promoted"]],
            "seconds": 120.0 + n, "memory": memory}


def _ranked(system, direction, speedup, status, tau=2.5):
    return {"system": system, "direction": direction, "tau": tau, "tau_from": "replay of the recorded lattices",
            "step_s": 0.017, "ar_step_s": 0.0145, "speedup": speedup, "over_start": speedup / 1.75,
            "status": status}


def new_summary(errors=None) -> dict:
    """Three rounds of the new layout: 184 -> 270 -> 416 tok/s, the bottleneck moving tau -> kernel -> overhead."""
    mech = {"ran": True, "what": "best-first tree of 64 nodes", "trees_built": 412, "nodes_mean": 63.5}
    r1 = _round_new(
        1, "stock", R1, "tau", _factors(1.59, 1.15, 1.01), 1.757,
        [_gate(R1, "stock", 1.47, 1.40, 1.55, mechanism=mech, predicted=2.32),
         _gate("stock:block_size=6", "stock", 0.99, 0.96, 1.03, promoted=False, predicted=1.95),
         {"candidate": "stock:nodes=48,tree=eagle2", "start": "stock", "promoted": False,
          "error": "the timing worker died: CUDA out of memory", "predicted": 2.2}],
        [_ranked(R1, "tau: tree builder over the lattice", 2.32, "promoted"),
         _ranked("stock:nodes=48,tree=eagle2", "tau: tree builder over the lattice", 2.2, "error: worker died"),
         _ranked("stock:block_size=6", "tau: draft block size", 1.95, "below the bar"),
         _ranked("stock:nodes=4,tree=chain", "tau: tree builder over the lattice", 1.1, "not reached: budget")],
        [{"direction": "overhead: CUDA graphs", "reason": "the ceiling bounds overhead at 1.77x, under 2.32x"}],
        _sealed(R1, 1.468, 1.39, 1.55, 184.0, 270.0), ["7f5a47b8b7ff"])
    r2 = _round_new(
        2, R1, R2, "kernel", _factors(1.12, 1.54, 1.08), 2.43,
        [_gate(R2, R1, 1.52, 1.45, 1.60, predicted=3.1, mechanism={"ran": False, "what": "gemv kernel"})],
        [_ranked(R2, "kernel: target_gemm's kernels", 3.1, "promoted")], [],
        _sealed(R2, 2.261, 2.12, 2.40, 184.0, 416.0, logic=_logic(),
                over_ar={"gain": 3.71, "lower": 3.5, "upper": 3.9}), ["2d49276164a0"])
    r3 = _round_new(3, R2, R2, "overhead", _factors(1.10, 1.05, 1.31), 3.7, [], [],
                    [{"direction": "overhead: host launch", "reason": "no candidate predicted above the bar"}],
                    _sealed(R2, 2.261, 2.12, 2.40, 184.0, 416.0, logic=_logic(),
                            over_ar={"gain": 3.71, "lower": 3.5, "upper": 3.9}), [])
    return {"deployment": "smollm2-twin", "agent": "builtin", "rounds_asked": 3, "limit": 3, "max_new_tokens": 64,
            "sealed_tokens": 256, "budget_s": 3600, "commit": "abc1234", "rounds": [r1, r2, r3], "best": R2,
            "best_commit": None, "converged": "round 3 kept its start; the next round would repeat its search",
            "stopped": None, **({"errors": errors} if errors else {})}


def _slug(system: str) -> str:
    return re.sub(r"[^a-z0-9._=-]+", "-", system.lower()).strip("-")


def write_run(root: Path, summary: dict) -> Path:
    """A run directory as the loop leaves it: loop.json, best.toml, each gate and sealed final as a step, the
    ceilings' folders and the memory entries."""
    root.mkdir(parents=True)
    (root / "loop.json").write_text(json.dumps(summary))
    (root / "best.toml").write_text(f'system = "{summary["best"]}"\n')
    for r in summary["rounds"]:
        n = r["round"]
        gated = r.get("search", {}).get("gated") or [g for d in r["directions"] for g in d["gated"]]
        for i, g in enumerate(gated):
            path = root / "steps" / f"round-{n}" / "phase-1" / f"d{i}" / _slug(g["candidate"]) / "gate.json"
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps(g))
        folder = root / r["ceiling"]["folder"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "inputs.json").write_text("{}")
        sealed = root / "steps" / "sealed" / f"{_slug(r['sealed']['result'])}.json"
        sealed.parent.mkdir(parents=True, exist_ok=True)
        sealed.write_text(json.dumps(r["sealed"]))
        for entry in r.get("memory") or []:
            (root / "memory" / "entries" / entry).mkdir(parents=True)
            (root / "memory" / "entries" / entry / "entry.json").write_text("{}")
    return root


def old_summary() -> dict:
    """Two rounds of the layout before round["search"]: the first's result fails its sealed final, so the loop
    keeps stock."""
    d_tau = {"direction": {"factor": "tau", "mechanism": "tree builder over the lattice", "options": ["tree"]},
             "evidence": {"evaluated": [{"system": R1, "tau": 2.8, "tau_from": "replay", "step_s": 0.017,
                                         "ar_step_s": 0.014, "speedup": 2.32},
                                        {"system": "stock:nodes=4,tree=sequoia", "error": "cannot place 4 rows"},
                                        {"system": "stock:nodes=8,tree=sequoia", "pruned": "below the start"}],
                          "chosen": [R1]},
             "gated": [_gate(R1, "stock", 1.36, 1.30, 1.44)]}
    d_kernel = {"direction": {"factor": "kernel", "mechanism": "attention kernels", "options": ["attn_late"]},
                "evidence": {"skipped": "the ceiling bounds kernel at 1.9x, under 2.3x", "evaluated": [],
                             "chosen": []}, "gated": []}
    failed = {"passed": False, "result": R1, "reason": "forcing rejected it: excess mismatch",
              "controller": _controller(1.2, 1.1, 1.3, 180.0, 216.0), "forcing": _forcing("reject")}
    r1 = {"round": 1, "start": "stock", "target": "tau", "ceiling": _ceiling("stock", "tau", _factors(1.6, 1.1, 1.0),
                                                                             1.75),
          "directions": [d_tau, d_kernel], "integration": {"parts": [R1], "combined": None, "result": R1},
          "tuning": {"class": "target_gemm", "evidence": {"evaluated": [
              {"system": "stock:l2=off,nodes=64,tree=best_first", "tau": 2.8, "tau_from": "replay",
               "speedup": 2.4}], "chosen": ["stock:l2=off,nodes=64,tree=best_first"]},
                     "gated": _gate("stock:l2=off,nodes=64,tree=best_first", R1, 1.01, 0.99, 1.02, promoted=False)},
          "sealed": failed, "result": "stock", "promoted": [R1], "memory": []}
    return {"deployment": "tiny", "agent": "builtin", "rounds_asked": 2, "limit": 3, "max_new_tokens": 16,
            "rounds": [r1], "best": "stock", "converged": "round 1 kept its start; the next round would repeat "
            "its search", "stopped": None}


class _Page(HTMLParser):
    """Tags, links and the text inside elements of a class (verdict, errors, error)."""

    def __init__(self):
        super().__init__()
        self.tags, self.hrefs, self.text, self._open = [], [], {}, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        self.hrefs += [a["href"]] if tag == "a" else []
        if tag not in ("img", "meta", "br"):  # void elements: no end tag closes them
            self._open.append(a.get("id") or a.get("class"))

    def handle_endtag(self, tag):
        self._open.pop()

    def handle_data(self, data):
        for key in filter(None, self._open):
            self.text[key] = self.text.get(key, "") + data


def _page(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text())
    return page


def test_the_verdict_comes_first_with_the_sealed_evidence(tmp_path):
    md, html_path = write_report(write_run(tmp_path / "run", new_summary()))
    text = md.read_text()
    verdict = next(line for line in text.splitlines() if line.startswith("> **Verdict.**"))
    assert text.index(verdict) < text.index("## Tokens/s")
    for needle in (R2, "416 tokens/s", "stock's 184", "2.261x [2.120, 2.400] over stock", "bar 1.030",
                   "3.710x [3.500, 3.900] over AR", "**pass**", "2.13%", "power bound 1.00%: not met",
                   "candidate 1.20% mismatch over 1177 tokens", "Logic check: sealed final pass (3/3 requests equal",
                   "1 tie(s)", "Converged: round 3"):
        assert needle in verdict, needle
    assert "estimated from dev requests" not in verdict and "not trustworthy" not in verdict
    page = _page(html_path)
    assert "not trustworthy" not in page.text["verdict"] and "errors" not in page.text
    assert page.tags.index("div") < page.tags.index("table")  # the verdict box above every table


def test_over_ar_is_estimated_from_the_dev_ceiling_where_the_final_did_not_measure_it(tmp_path):
    summary = new_summary()
    for r in summary["rounds"]:
        r["sealed"].pop("over_ar", None)
    text = write_report(write_run(tmp_path / "run", summary))[0].read_text()
    # stock's 1.757x over AR (round 1's ceiling of stock) times the sealed gain 2.261
    assert f"about {1.757 * 2.261:.3f}x over AR (estimated from dev requests" in text


def test_tokens_per_second_across_rounds_and_the_bottleneck_each_round_targets(tmp_path):
    summary = new_summary()
    assert rates(summary) == [("stock", 184.0), ("round 1", 270.0), ("round 2", 416.0), ("round 3", 416.0)]
    md, html_path = write_report(write_run(tmp_path / "run", summary))
    rows = {line.split(" | ")[0].strip("| "): line for line in md.read_text().splitlines()
            if re.match(r"\| (stock|round \d) \|", line)}
    assert " | 184 | 1.000 |" in rows["stock"]
    assert "**tau** | 1.59 | 1.15 | 1.01" in rows["round 1"] and " | 270 | 1.467 |" in rows["round 1"]
    assert "**kernel** | 1.12 | 1.54 | 1.08" in rows["round 2"] and " | 416 | 2.261 |" in rows["round 2"]
    assert "**overhead**" in rows["round 3"] and " | 416 | " in rows["round 3"]
    png = (tmp_path / "run" / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG") and "![" in md.read_text()
    assert 'src="data:image/png;base64,' in html_path.read_text()  # self-contained


def test_a_failed_final_keeps_the_start_rate():
    summary = new_summary()
    summary["rounds"][1]["sealed"] = {**summary["rounds"][1]["sealed"], "passed": False}
    summary["rounds"][1]["result"] = R1
    assert [v for _, v in rates(summary)][:3] == [184.0, 270.0, 270.0]


def test_every_candidate_with_its_evidence_and_every_skip_with_its_reason(tmp_path):
    md, html_path = write_report(write_run(tmp_path / "run", new_summary()))
    text = md.read_text()
    for r in new_summary()["rounds"]:
        for e in r["search"]["ranked"]:
            row = next(line for line in text.splitlines() if f"`{e['system']}` | {e['direction']}" in line
                       and line.endswith(f"| {e['status']} |"))
            assert f"| {e['speedup']:.3f} | {e['over_start']:.3f} |" in row
        for s in r["search"]["skipped"]:
            assert f"- {s['direction']}: {s['reason']}" in text
    gate = next(line for line in text.splitlines() if line.startswith(f"| `{R1}` | tau: tree builder"))
    for needle in ("| 2.320 | 1.470x [1.400, 1.550] | 1.030 |", "pass (3/3 requests equal, 96 tokens, 1 tie(s)",
                   "pass; could detect an excess mismatch of 2.13%",
                   "ran: best-first tree of 64 nodes (trees_built=412, nodes_mean=63.5)", "| promoted |",
                   f"[gate](steps/round-1/phase-1/d0/{_slug(R1)}/gate.json)"):
        assert needle in gate, needle
    assert "did not run" in text  # round 2's mechanism counters say its kernel never ran
    page = _page(html_path)
    assert "error: the timing worker died: CUDA out of memory" in page.text["error"]  # red, not a verdict


def test_errors_come_first_in_red_and_the_run_is_not_trusted(tmp_path):
    errors = ["slot 1 (cuda:1) died: CUDA out of memory", "worker of round 2 exited with status -9"]
    md, html_path = write_report(write_run(tmp_path / "run", new_summary(errors)))
    text = md.read_text()
    assert text.index("⚠ Errors") < text.index("**Verdict.**") and all(e in text for e in errors)
    page = _page(html_path)
    assert all(e in page.text["errors"] for e in errors)
    assert "This run is not trustworthy: 2 error(s)" in page.text["verdict"]
    assert 'class="verdict untrusted"' in html_path.read_text()


def test_the_old_layout_and_a_kept_stock_in_plain_words(tmp_path):
    md, html_path = write_report(write_run(tmp_path / "run", old_summary()))
    text = md.read_text()
    verdict = next(line for line in text.splitlines() if line.startswith("> **Verdict.**"))
    assert "The loop kept **stock**" in verdict
    assert f"round 1's result `{R1}` failed the sealed final (forcing rejected it: excess mismatch)" in verdict
    assert f"| 1 | `{R1}` | tau: tree builder over the lattice | 2.80 | replay | 2.320 | - | promoted |" in text
    assert "error: cannot place 4 rows" in text and "pruned: below the start" in text
    assert "- kernel: attention kernels: the ceiling bounds kernel at 1.9x, under 2.3x" in text
    assert "| `stock:l2=off,nodes=64,tree=best_first` | phase 3: kernels of target_gemm | 2.400 |" in text
    assert "refused: not proven: lower bound 0.99 <= 1.03" in text
    rounds = next(line for line in text.splitlines() if line.startswith("| round 1 |"))
    assert "!!" not in rounds and "**⚠ failed: forcing rejected it" in rounds
    assert " | 180 | 1.000 | " in rounds  # the round kept stock: stock's rate


@pytest.mark.parametrize("make", [new_summary, old_summary])
def test_every_link_resolves_inside_the_run_directory(tmp_path, make):
    run = write_run(tmp_path / "run", make())
    _, html_path = write_report(run)
    hrefs = _page(html_path).hrefs
    assert {"loop.json", "best.toml", "report.png"} <= set(hrefs)
    assert any(h.startswith("steps/sealed/") for h in hrefs) and any(h.startswith("ceilings/") for h in hrefs)
    if make is new_summary:
        assert "memory/entries/7f5a47b8b7ff/entry.json" in hrefs
    for h in hrefs:
        assert not h.startswith(("/", "file:", "http")) and (run / h).exists(), h


def test_a_memory_entry_missing_from_the_folder_is_said_so(tmp_path):
    run = write_run(tmp_path / "run", new_summary())
    (run / "memory" / "entries" / "2d49276164a0" / "entry.json").unlink()
    (run / "memory" / "entries" / "2d49276164a0").rmdir()
    text = write_report(run)[0].read_text()
    assert "memory entry 2d49276164a0 (**⚠ not in this folder**)" in text


def test_every_file_is_written_by_one_function(tmp_path, monkeypatch):
    """The report's files go through _write (where they are made atomic)."""
    written = []
    monkeypatch.setattr(report, "_write", lambda path, data: written.append((path.name, type(data))))
    run = write_run(tmp_path / "run", new_summary())
    write_report(run)
    assert written == [("report.png", bytes), ("report.md", str), ("report.html", str)]
    assert not any((run / n).exists() for n in ("report.png", "report.md", "report.html"))


def test_a_folder_without_a_finished_loop_is_one_line(tmp_path):
    (tmp_path / "steps").mkdir()
    with pytest.raises(UserError, match="--resume"):
        load_summary(tmp_path)
    (tmp_path / "loop.json").write_text("[1]")
    with pytest.raises(UserError, match="no rounds"):
        load_summary(tmp_path)


@pytest.mark.parametrize("equal, why", [(3, "its outputs equal stock's token for token"),
                                        (1, "it changes logic alone (stock's kernels and weights)")])
def test_the_verdict_says_why_an_inconclusive_forcing_let_the_best_through(tmp_path, equal, why):
    summary = new_summary()
    final = summary["rounds"][-1]["sealed"]
    final["forcing"] = {**_forcing("inconclusive"), "agreement": {"requests": 3, "equal": equal}}
    text = write_report(write_run(tmp_path / "run", summary))[0].read_text()
    verdict = next(line for line in text.splitlines() if line.startswith("> **Verdict.**"))
    assert f"Forcing's inconclusive verdict let it through: {why}" in verdict
    passed = write_report(write_run(tmp_path / "pass", new_summary()))[0].read_text()
    assert "let it through" not in passed
