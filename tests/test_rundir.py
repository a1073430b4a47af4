"""The loop's run directory: a resumed run redoes no finished measurement, whichever phase it was killed in."""

from __future__ import annotations

import json

import pytest

from specpilot.errors import UserError
from specpilot.loop.rundir import BudgetSpent, RunDir

PHASES = ["round-1/phase-0/ceiling", "round-1/phase-1/tau/replay", "round-1/phase-1/tau/compare",
          "round-1/phase-2/integration", "round-1/phase-3/tuning", "round-1/phase-4/sealed"]


class Killed(Exception):
    pass


def run_rounds(root, calls: list, kill_at: str | None = None, resume: bool = False) -> dict:
    """A loop of measured steps; the step named kill_at dies in the middle of its measurement."""
    with RunDir(root, resume=resume) as rd:
        out = {}
        for name in PHASES:
            def measure(name=name):
                calls.append(name)
                if name == kill_at:
                    raise Killed(name)
                return {"step": name, "value": len(name)}
            out[name] = rd.once(name, measure)
        return {"results": out, "ran": rd.ran, "reused": rd.reused}


@pytest.mark.parametrize("kill_at", PHASES)
def test_resume_after_a_kill_redoes_nothing_finished(tmp_path, kill_at):
    calls: list = []
    with pytest.raises(Killed):
        run_rounds(tmp_path / "run", calls, kill_at=kill_at)
    k = PHASES.index(kill_at)
    assert calls == PHASES[: k + 1]
    calls.clear()
    resumed = run_rounds(tmp_path / "run", calls, resume=True)
    assert calls == PHASES[k:]  # the killed step again, then the rest; nothing finished is measured twice
    assert resumed["reused"] == PHASES[:k] and resumed["ran"] == PHASES[k:]
    assert resumed["results"] == run_rounds(tmp_path / "fresh", [])["results"]
    events = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert sum(e["event"] == "done" for e in events) == len(PHASES)


def test_the_run_directory_refuses_what_it_should(tmp_path):
    run_rounds(tmp_path / "run", [])
    with pytest.raises(UserError, match="--resume"):
        RunDir(tmp_path / "run")
    with pytest.raises(UserError, match="no run to resume"):
        RunDir(tmp_path / "empty", resume=True)
    with RunDir(tmp_path / "run", resume=True), pytest.raises(UserError, match="another loop"):
        RunDir(tmp_path / "run", resume=True)


def test_the_budget_stops_between_steps(tmp_path):
    with RunDir(tmp_path / "run", budget_s=0.0) as rd:
        with pytest.raises(BudgetSpent):
            rd.once("round-1/phase-0/ceiling", lambda: {"x": 1})
        assert not rd.done("round-1/phase-0/ceiling")
