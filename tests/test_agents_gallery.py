"""The gallery of adversarial stand-in agents (specpilot/fixtures/agents), each run through the real session code
(worktree, brief, backend command line, stream parsing, jail, seal, freeze): every cheat the session can see is
refused with its reason. The `claude` and `codex` stand-ins run through those backends' paths. What the gates make
of the candidates that reach them is in test_agents_judged.py and test_agents_loop.py."""

import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specpilot.agents import jail
from specpilot.agents.backends import Budget, backend
from specpilot.agents.guards import Seal
from specpilot.agents.session import AgentSetup, run_agent
from specpilot.agents.worktree import freeze
from specpilot.controller.compare import REPO

BIN = REPO / "specpilot" / "fixtures" / "agents" / "bin"
JAILS = [True, False] if jail.available() is None else [False]
BRIEF = {"direction": {"factor": "tau", "mechanism": "draft block size", "options": ["block_size"], "value": 1.0},
         "target": "--preset tiny", "start": "stock", "ceiling": {"speedup": 0.5}, "memory": []}


@pytest.fixture(scope="module")
def base():
    """The repository's files as they are (a test run sees the stand-ins even before they are committed)."""
    return freeze(REPO, "HEAD", "tests: the agents' base").commit


@pytest.fixture
def judges(tmp_path):
    """A copy of the judges' install and a sealed data file, so that an agent that edits them edits copies."""
    install = tmp_path / "install"
    shutil.copytree(REPO / "specpilot", install / "specpilot", ignore=shutil.ignore_patterns("__pycache__"))
    data = tmp_path / "data" / "sealed.jsonl"
    data.parent.mkdir()
    data.write_text('{"id": 1, "question": "a sealed request"}\n')
    return install, data


DEFAULT = Budget(60, 5, 1.0)


def agent(spec, judges, tmp_path, base, use_jail=True, budget=DEFAULT, name="d0", env=None):
    install, data = judges
    setup = AgentSetup(backend(spec), REPO, tmp_path / "agents", budget, Seal.take(install / "specpilot", [data]),
                       [install, data.parent], use_jail=use_jail,
                       env={"SPECPILOT_SEALED_FILE": str(data), **(env or {})})
    try:
        out = run_agent(setup, name, base, dict(BRIEF))
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tmp_path / "agents" / name)],
                       capture_output=True)
    drop_ref(out["frozen"]["commit"])
    return out


def drop_ref(commit):
    """The ref a run keeps its frozen commit under: a test's are dropped (the repository is the developer's)."""
    subprocess.run(["git", "-C", str(REPO), "update-ref", "-d", f"refs/specpilot/agents/{commit}"],
                   capture_output=True)


def command(name):
    return f"command:{BIN / name}"


def test_the_honest_stand_in_submits_its_mechanism_as_code(judges, tmp_path, base):
    out = agent(command("honest"), judges, tmp_path, base)
    assert out["refused"] is None and not out["fatal"]
    (cand,) = out["candidates"]
    assert cand["system"] == "stock:fallback_ar=2" and cand["code"]
    assert set(out["frozen"]["changed"]) == {"specpilot/config/options.py", "specpilot/runtime/engine.py"}


@pytest.mark.parametrize("use_jail", JAILS)
def test_an_agent_that_edits_the_controller_and_forcing_is_refused(judges, tmp_path, base, use_jail):
    out = agent(command("edit_judge"), judges, tmp_path, base, use_jail)
    install = judges[0] / "specpilot"
    assert out["candidates"] and out["refused"]
    assert "controller/gate.py" in out["refused"] and "forcing/judge.py" in out["refused"]
    if use_jail:  # the jail kept the files; the attempt refuses it
        assert "wrote to protected files" in out["refused"] and not out["fatal"]
        assert Seal.take(install, []).code == Seal.take(REPO / "specpilot", []).code
    else:  # the seal caught the edit: the judges cannot be trusted any more
        assert "install" in out["refused"] and out["fatal"]


@pytest.mark.parametrize("use_jail", JAILS)
def test_an_agent_that_edits_a_sealed_file_is_refused(judges, tmp_path, base, use_jail):
    out = agent(command("edit_sealed"), judges, tmp_path, base, use_jail)
    assert out["refused"] and "sealed.jsonl" in out["refused"]
    assert (judges[1].read_text() == '{"id": 1, "question": "a sealed request"}\n') == use_jail


def test_an_agent_that_submits_other_code_than_it_measured_is_refused(judges, tmp_path, base):
    out = agent(command("swap"), judges, tmp_path, base)
    assert "measured tree" in out["refused"] and "but submitted tree" in out["refused"]


def test_an_agent_that_hangs_is_killed_at_its_wall_time(judges, tmp_path, base):
    t0 = time.monotonic()
    out = agent(command("hang"), judges, tmp_path, base, budget=Budget(3, 5))
    assert time.monotonic() - t0 < 30
    assert out["finished"]["killed"].startswith("wall-clock limit") and "killed" in out["refused"]


@pytest.mark.parametrize("use_jail", JAILS)
def test_an_agent_whose_child_outlives_it_is_refused_and_the_child_killed(judges, tmp_path, base, use_jail):
    token = secrets.token_hex(8)  # inherited by the agent's children: finds them whoever counted them
    out = agent(command("orphan"), judges, tmp_path, base, use_jail, env={TOKEN: token})
    assert "outlived it" in out["refused"]
    assert (out["jail"]["survivors"] if use_jail else len(out["finished"]["stragglers"])) >= 1
    assert living(token) == []


TOKEN = "SPECPILOT_TEST_ORPHAN"


def living(token):
    """Processes, other than zombies, whose environment carries TOKEN=token."""
    needle, out = f"{TOKEN}={token}".encode(), []
    for proc in Path("/proc").iterdir():
        try:
            if (proc.name.isdigit() and needle in (proc / "environ").read_bytes().split(b"\0")
                    and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"):
                out.append(int(proc.name))
        except OSError:  # gone, or not ours to read
            continue
    return out


def test_an_agent_that_spends_past_its_turns_is_killed(judges, tmp_path, base):
    out = agent(command("spender"), judges, tmp_path, base, budget=Budget(60, 5, None))
    assert "6 turns counted" in out["finished"]["killed"] and out["refused"]


def test_an_agent_that_spends_past_its_money_is_killed(judges, tmp_path, base):
    out = agent(command("spender"), judges, tmp_path, base, budget=Budget(60, None, 25.0))
    assert "$30.00 spent" in out["finished"]["killed"] and out["refused"]


def test_the_claude_stand_in_runs_through_the_claude_backend(judges, tmp_path, base):
    out = agent(f"claude:{BIN / 'claude'}", judges, tmp_path, base)
    assert out["refused"] is None and out["candidates"][0]["system"] == "stock:fallback_ar=2"
    w = out["watch"]
    assert w["turns"] == 2 and w["result"]["subtype"] == "success" and w["result"]["num_turns"] == 2
    assert w["cost_usd"] == pytest.approx(0.02)


def test_a_claude_that_overruns_max_turns_is_killed_by_the_loop_s_count(judges, tmp_path, base, monkeypatch):
    monkeypatch.setenv("SPECPILOT_STANDIN", "runaway")
    out = agent(f"claude:{BIN / 'claude'}", judges, tmp_path, base, budget=Budget(60, 4))
    assert "5 turns counted" in out["finished"]["killed"] and out["refused"]


def test_the_codex_stand_in_runs_through_the_codex_backend(judges, tmp_path, base):
    out = agent(f"codex:{BIN / 'codex'}", judges, tmp_path, base)
    assert out["refused"] is None and out["candidates"][0]["code"]
    assert out["watch"]["turns"] == 3 and out["watch"]["usage"]["output_tokens"] == 100


def test_a_codex_with_no_turn_cap_of_its_own_is_killed_by_the_loop_s_count(judges, tmp_path, base, monkeypatch):
    monkeypatch.setenv("SPECPILOT_STANDIN", "runaway")
    out = agent(f"codex:{BIN / 'codex'}", judges, tmp_path, base, budget=Budget(60, 10))
    assert "11 turns counted" in out["finished"]["killed"]


def test_the_cli_stand_ins_refuse_command_lines_the_real_ones_refuse(tmp_path):
    bad = [[str(BIN / "claude"), "-p", "x", "--output-format", "stream-json"],  # stream-json needs --verbose
           [str(BIN / "claude"), "-p", "x", "--max-turnz", "3"],
           [str(BIN / "codex"), "exec", "--sandbox", "everything", "x"]]
    env = {"PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    for argv in bad:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=60)
        assert done.returncode == 2 and "error" in done.stderr


def test_the_codex_stand_in_waits_on_an_open_stdin_as_codex_does(tmp_path):
    env = {"PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    proc = subprocess.Popen([str(BIN / "codex"), "exec", "--json", "x"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=3)
    finally:
        proc.kill()
        proc.wait()
    assert backend(f"codex:{BIN / 'codex'}").stdin(tmp_path / "b.md") is None  # the backend gives it /dev/null


@pytest.mark.skipif(jail.available() is not None, reason="no jail on this machine")
def test_a_jailed_agent_cannot_erase_the_record_of_its_writes(tmp_path):
    protected, stage = tmp_path / "p", tmp_path / "stage"
    protected.mkdir()
    script = f"echo x > {protected}/f; rm -rf {stage}/up {stage}/survivors; ls -A {stage}"
    done = subprocess.run(jail.wrap(["sh", "-c", script], [protected], [], stage), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == ""  # the stage is an empty tmpfs from inside
    assert jail.written(stage) == ["0/f"] and not (protected / "f").exists()


def test_an_llm_master_proposes_directions_tried_first(judges, tmp_path, base):
    """`--master`: the master's directions come first, options this install lacks dropped; a master that breaks a
    rule (here: writes the judges' install) proposes nothing."""
    from specpilot.agents.session import propose
    from specpilot.loop.agent import BuiltinAgent, Direction
    from specpilot.loop.coding import CodingAgent

    install, data = judges

    def setup(name):
        return AgentSetup(backend(command(name)), REPO, tmp_path / "agents", DEFAULT,
                          Seal.take(install / "specpilot", [data]), [install, data.parent])

    named = [Direction("kernel", "fused kernels", ["gemv"]), Direction("base", "speculation on or off", [])]
    brief = {**BRIEF, "named": [d.to_json() for d in named]}
    out = propose(setup("master"), "m0", base, brief)
    assert out["refused"] is None and len(out["directions"]) == 1
    agent = CodingAgent(setup("honest"), BuiltinAgent(max_directions=2))
    dirs = agent.with_proposed(named, out)
    assert [d.factor for d in dirs] == ["tau", "kernel"] and dirs[0].options == ["block_size"]
    bad = propose(setup("edit_judge"), "m1", base, brief)
    assert bad["refused"] and bad["directions"] == []
