"""The loop's run directory: a resumed run redoes no finished measurement, whichever phase it was killed in."""

from __future__ import annotations

import json

import pytest

import specpilot.loop.main as loop_main
from specpilot.deployment import load_deployment
from specpilot.errors import UserError
from specpilot.loop.main import LoopArgs, build_loop
from specpilot.loop.rounds import slug
from specpilot.loop.rundir import BudgetSpent, RunDir
from tests.test_cli import assert_one_line_error, specpilot
from tests.test_loop import CEILING, FakeGate, Planted

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


def events(root, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (root / "log.jsonl").read_text().splitlines()]
    return [e for e in rows if e["event"] == kind]


def test_a_step_stored_under_another_key_runs_again_and_the_log_says_why(tmp_path):
    root, key = tmp_path / "run", {"code": "a1", "deployment": {"dtype": "float32"}, "limit": 3}
    with RunDir(root, key=key) as rd:
        rd.once("s/kept", lambda: {"v": 1})
        rd.once("s/budget", lambda: {"v": 2})
    moved = {**key, "deployment": {"dtype": "bfloat16"}, "limit": 5}
    with RunDir(root, resume=True, key=moved) as rd:
        assert not rd.done("s/budget") and rd.read("s/budget") is None
        assert rd.once("s/budget", lambda: {"v": 3}) == {"v": 3}
        assert rd.done("s/budget") and rd.read("s/budget") == {"v": 3} and rd.ran == ["s/budget"]
    assert events(root, "stale") == [{**events(root, "stale")[0], "step": "s/budget",
                                      "why": "measured under another deployment.dtype, limit"}]
    with RunDir(root, resume=True, key={**moved, "code": "b2"}) as rd:  # another install's code
        assert rd.once("s/budget", lambda: {"v": 4}) == {"v": 4} and rd.reused == []
    assert events(root, "stale")[-1]["why"] == "measured under another code"
    with RunDir(root, resume=True, key={**moved, "code": "b2"}) as rd:  # the same key: read back
        assert rd.once("s/budget", lambda: pytest.fail("measured again")) == {"v": 4} and rd.reused == ["s/budget"]


def test_a_step_written_without_a_key_runs_again(tmp_path):
    """A step file of a run before steps carried keys (its result alone) is not trusted."""
    with RunDir(tmp_path / "run", key={"code": "a1"}) as rd:
        rd.path("s/old").parent.mkdir(parents=True)
        rd.path("s/old").write_text(json.dumps({"v": 1}))
        assert not rd.done("s/old") and rd.once("s/old", lambda: {"v": 2}) == {"v": 2}
    assert events(tmp_path / "run", "stale")[0]["why"].startswith("written without a key")
    assert json.loads((tmp_path / "run" / "steps" / "s" / "old.json").read_text()) == {"key": {"code": "a1"},
                                                                                     "result": {"v": 2}}


@pytest.mark.parametrize("text, needle", [("{\"key\": {\"code\"", "is not JSON"), ("[1, 2]", "not a JSON object"),
                                          ("{\"key\": {}}", "its key or result is missing"),
                                          ("{\"key\": 3, \"result\": {}}", "its key or result"),
                                          (b"\xff\xfe", "is not JSON")])
def test_a_step_file_that_is_no_record_is_a_user_error_naming_it(tmp_path, text, needle):
    with RunDir(tmp_path / "run") as rd:
        path = rd.path("round-1/x/gate")
        path.parent.mkdir(parents=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        for look in (lambda: rd.once("round-1/x/gate", lambda: pytest.fail("re-ran a corrupt step")),
                     lambda: rd.done("round-1/x/gate")):
            with pytest.raises(UserError, match=needle) as err:
                look()
            assert str(path) in str(err.value) and "delete it" in str(err.value) and "\n" not in str(err.value)
        assert path.read_bytes() == (text if isinstance(text, bytes) else text.encode())  # left as it was


def planted_loop(tmp_path, **kw) -> tuple:
    """The loop `specpilot loop --preset tiny` builds (its run directory and step keys), its measurements planted
    (test_loop.py's synthetic deployment: a ceiling step, the evidence, the gate), so that nothing loads models."""
    kw = {"rounds": 1, "agent": "builtin", "limit": 3, "max_new_tokens": 8, **kw}
    a = LoopArgs(load_deployment("tiny"), {"preset": "tiny"}, tmp_path / "run", **kw)
    loop, run = build_loop(a, lambda s: None)
    gate, ev = FakeGate(), Planted()
    loop.gate_factory = lambda runner, release: gate
    loop.ceiling = lambda system: run.once(f"ceilings/{slug(system)}", lambda: {**CEILING, "system": system})
    loop._runner, loop.evidence, loop._block, loop._width = object(), lambda ceiling: ev, lambda: 8, lambda: 16
    with run:
        out = loop.loop()
    return out, run


def test_a_resume_reuses_no_step_of_other_settings_or_code_with_or_without_run_json(tmp_path, monkeypatch):
    first, run = planted_loop(tmp_path)
    measured = sorted(run.ran)
    assert len(measured) > 3 and run.key["code"] == loop_main.code_hash(loop_main.REPO / "specpilot")
    (tmp_path / "run" / "run.json").unlink()
    again, run = planted_loop(tmp_path, resume=True)  # the same settings and code: everything read back
    assert run.ran == [] and sorted(run.reused) == measured and again == first
    (tmp_path / "run" / "run.json").unlink()  # what a resume used to trust alone
    _, run = planted_loop(tmp_path, resume=True, max_new_tokens=12)
    assert run.reused == [] and sorted(run.ran) == measured
    assert {e["why"] for e in events(tmp_path / "run", "stale")} == {
        "measured under another max_new_tokens, sealed_tokens"}  # (the sealed outputs follow: 4x)
    monkeypatch.setattr(loop_main, "code_hash", lambda path: "0" * 64)  # another install's code, same settings
    _, run = planted_loop(tmp_path, resume=True, max_new_tokens=12)
    assert run.reused == [] and sorted(run.ran) == measured
    assert events(tmp_path / "run", "stale")[-1]["why"] == "measured under another code"


def test_a_corrupt_step_file_stops_a_resume_with_one_line_naming_it(tmp_path):
    step = tmp_path / "run" / "steps" / "ceilings" / "stock.json"
    step.parent.mkdir(parents=True)
    step.write_text('{"key": {"code": "ab')  # a write cut short (write_json_atomic never leaves one; a disk might)
    proc = specpilot("loop", "--preset", "tiny", "--limit", "3", "--max-new-tokens", "4", "--run-dir",
                     tmp_path / "run", "--resume")
    assert_one_line_error(proc, str(step), "is not JSON", "delete it", "--resume")
    assert step.read_text() == '{"key": {"code": "ab'
