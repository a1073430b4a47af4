"""An agent's process, its jail and its backends: run_watched reads stdout as it comes, holds the wall-clock limit,
lets a watcher kill the group early, and leaves nothing behind (children in the group, and children that left it
but kept the environment mark); the jail covers protected folders with an overlay (the agent's writes land in a
scratch layer and are listed; the real files never change) but binds the worktree back writable, and its PID
namespace takes background children down with the agent; the backends resolve their programs, build the
documented command lines, and count turns and money from the streamed events."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specpilot.agents import jail
from specpilot.agents.backends import CLAUDE_TOOLS, Budget, Watch, backend
from specpilot.agents.process import MARK, marked, run_watched, sweep
from specpilot.errors import UserError

PY = sys.executable
TRUE = str(Path("/bin/true").resolve())


def dead(pid: int, within: float = 2.0) -> bool:
    """The process is gone or a zombie (polled for up to `within` seconds)."""
    end = time.monotonic() + within
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.02)


def after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


# ---- run_watched -------------------------------------------------------------------------------------------------

def test_lines_and_returncode(tmp_path):
    done = run_watched(["sh", "-c", "echo one; echo two; echo oops >&2; exit 3"], tmp_path, timeout=10)
    assert done.returncode == 3 and done.killed is None and done.stragglers == []
    assert done.stdout_tail == ["one", "two"]
    assert done.stderr_tail == "oops\n"
    assert done.to_json()["returncode"] == 3


def test_tail_keeps_the_last_lines_and_an_unterminated_one(tmp_path):
    done = run_watched(["sh", "-c", "seq 1 100; printf last"], tmp_path, timeout=10, tail=3)
    assert done.returncode == 0 and done.stdout_tail == ["99", "100", "last"]


def test_env_replaces_the_environment_but_keeps_the_mark(tmp_path):
    env = {"PATH": os.environ["PATH"], "FOO": "bar"}
    done = run_watched(["sh", "-c", 'echo "$FOO"; echo "${HOME:-unset}"; echo "${' + MARK + ':+marked}"'], tmp_path,
                       timeout=10, env=env)
    assert done.stdout_tail == ["bar", "unset", "marked"]


def test_wall_clock_limit_kills(tmp_path):
    done = run_watched(["sleep", "30"], tmp_path, timeout=1.0)
    assert done.returncode is None
    assert done.killed is not None and "wall-clock limit" in done.killed
    assert 0.9 <= done.seconds < 4


def test_child_left_in_the_group_is_reported_and_killed(tmp_path):
    done = run_watched(["sh", "-c", "sleep 30 & echo $!"], tmp_path, timeout=10)
    assert done.returncode == 0 and done.killed is None
    child = int(done.stdout_tail[-1])
    assert done.stragglers == [child]
    assert dead(child)
    assert done.seconds < 5


ESCAPE = """
import os
pid = os.fork()
if pid == 0:
    os.setsid()  # a session (and process group) of its own: killing the agent's group does not reach it
    grandchild = os.fork()
    if grandchild == 0:
        fd = os.open(os.devnull, os.O_RDWR)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.execvp("sleep", ["sleep", "30"])
    print(grandchild, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_child_that_left_the_group_is_found_by_its_mark(tmp_path):
    done = run_watched([PY, "-c", ESCAPE], tmp_path, timeout=10)
    assert done.returncode == 0 and done.killed is None
    escaped = int(done.stdout_tail[-1])
    assert escaped in done.stragglers
    assert dead(escaped)


def test_watch_kills_the_group_early(tmp_path):
    seen = []

    def watch(line):
        seen.append(line)
        return "enough" if line == "3" else None

    prog = "import time\nfor i in range(600):\n    print(i, flush=True)\n    time.sleep(0.05)\n"
    done = run_watched([PY, "-u", "-c", prog], tmp_path, timeout=60, watch=watch)
    assert done.killed == "enough" and done.returncode is None
    assert seen[:4] == ["0", "1", "2", "3"]
    assert "3" in done.stdout_tail and "50" not in done.stdout_tail
    assert done.seconds < 5


def test_stdin_is_dev_null_by_default(tmp_path):
    done = run_watched(["cat"], tmp_path, timeout=10)
    assert done.returncode == 0 and done.killed is None and done.stdout_tail == []
    assert done.seconds < 2


def test_stdin_file_is_read(tmp_path):
    (tmp_path / "in.txt").write_text("alpha\nbeta\n")
    done = run_watched(["cat"], tmp_path, timeout=10, stdin=tmp_path / "in.txt")
    assert done.returncode == 0 and done.stdout_tail == ["alpha", "beta"]


def test_marked_and_sweep(tmp_path):
    token = secrets.token_hex(8)
    proc = subprocess.Popen(["sleep", "30"], env={**os.environ, MARK: token})
    try:
        assert marked(token) == [proc.pid]
        assert marked(secrets.token_hex(8)) == []
        assert sweep(token) == [proc.pid]
        assert proc.wait(timeout=2) == -9
    finally:
        proc.kill()
        proc.wait()


# ---- jail --------------------------------------------------------------------------------------------------------

@pytest.fixture
def jailed():
    why = jail.available()
    if why is not None:
        pytest.skip(f"no jail here: {why}")


def in_jail(prog: str, protect, writable, stage, env=None):
    return subprocess.run(jail.wrap(["sh", "-c", prog], protect, writable, stage), capture_output=True, text=True,
                          timeout=20, env=env)


def test_jail_keeps_protected_files_but_the_worktree_writable(tmp_path, jailed):
    p = tmp_path / "pro tected"  # a space in the path: quoted through to the overlay's options
    w = p / "worktree"
    w.mkdir(parents=True)
    (p / "judge.py").write_text("honest\n")
    (p / "data.txt").write_text("sealed\n")
    stage = tmp_path / "stage"
    prog = (f'cd "{p}"; echo new > x; echo $?; cat x; echo cheat > judge.py; rm data.txt; echo $?; '
            'echo mine > worktree/y; echo $?')
    done = in_jail(prog, [p], [w], stage)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "new", "0", "0"]  # inside, the agent sees its own writes
    assert not (p / "x").exists()  # outside, the protected folder never changed
    assert (p / "judge.py").read_text() == "honest\n" and (p / "data.txt").read_text() == "sealed\n"
    assert (w / "y").read_text() == "mine\n"  # the worktree is the real one
    assert jail.written(stage) == ["0/data.txt", "0/judge.py", "0/x"]
    assert jail.protected_names(stage, [p]) == [str(p.resolve() / n) for n in ("data.txt", "judge.py", "x")]
    (p / "z").write_text("the mounts stay inside the jail\n")
    jail.clear(stage)
    assert not stage.exists()


def test_jail_kills_background_children(tmp_path, jailed):
    token = secrets.token_hex(8)
    in_jail("sleep 30 >/dev/null 2>&1 &", [], [], tmp_path / "stage", env={**os.environ, MARK: token})
    end = time.monotonic() + 2
    while marked(token) and time.monotonic() < end:
        time.sleep(0.02)
    assert marked(token) == []
    assert jail.survivors(tmp_path / "stage") == 1
    in_jail("true", [], [], tmp_path / "quiet")
    assert jail.survivors(tmp_path / "quiet") == 0
    # the same without the jail leaves the child running
    control = secrets.token_hex(8)
    subprocess.run(["sh", "-c", "sleep 30 >/dev/null 2>&1 &"], env={**os.environ, MARK: control}, timeout=20)
    assert len(sweep(control)) == 1


def test_jailed_run_leaves_no_stragglers(tmp_path, jailed):
    argv = jail.wrap(["sh", "-c", "sleep 30 & echo hi; exit 4"], [], [tmp_path], tmp_path / "stage")
    done = run_watched(argv, tmp_path, timeout=10)
    assert done.returncode == 4 and done.killed is None  # the agent's own status comes through
    assert done.stdout_tail == ["hi"] and done.stragglers == []
    assert done.seconds < 5


def test_jail_script_binds_writable_around_the_overlays(tmp_path):
    p = tmp_path / "pro tected"
    inner = p / "inner"  # protected, but inside another protected folder: covered by the outer overlay
    w = p / "work"
    outside = tmp_path / "elsewhere"
    for d in (inner, w, outside):
        d.mkdir(parents=True)
    stage = tmp_path / "stage"
    text = jail.script([inner, p, tmp_path / "missing"], [w, outside], stage)
    lines = text.splitlines()
    keep_w, pro = shlex.quote(str(stage / "keep" / "0")), shlex.quote(str(p.resolve()))
    bound = f"mount --bind {shlex.quote(str(w.resolve()))} {keep_w}"
    keep = [i for i, line in enumerate(lines) if line.endswith(bound)]
    overlays = [i for i, line in enumerate(lines) if "mount -t overlay" in line]
    back = lines.index(f"mount --bind {keep_w} {shlex.quote(str(w.resolve()))}")
    assert lines[0] == "set -e" and '"$@" 3>&-' in lines and lines[-1] == "exit $rc"
    assert len(keep) == 1 and len(overlays) == 1 and keep[0] < overlays[0] < back
    assert f"lowerdir={p.resolve()}," in lines[overlays[0]] and lines[overlays[0]].endswith(pro)
    assert str(inner) not in text and "missing" not in text
    assert str(outside.resolve()) in text  # every writable folder is bound back, inside a protected one or not


def test_jail_script_refuses_commas(tmp_path):
    p = tmp_path / "a,b"
    p.mkdir()
    with pytest.raises(ValueError):
        jail.script([p], [], tmp_path / "stage")


def test_written_and_protected_names(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
    stage = tmp_path / "stage"
    assert jail.written(stage) == [] and jail.survivors(stage) == 0
    (stage / "up" / "0" / "sub").mkdir(parents=True)
    (stage / "up" / "0" / "sub" / "f").write_text("")
    (stage / "up" / "1").mkdir()
    (stage / "up" / "1" / "g").write_text("")
    assert jail.written(stage) == ["0/sub/f", "1/g"]
    assert jail.protected_names(stage, [b, a]) == [str(a.resolve() / "sub" / "f"), str(b.resolve() / "g")]


def test_wrap_runs_the_script_then_the_program(tmp_path):
    stage = tmp_path / "stage"
    argv = jail.wrap(["prog", "arg"], [tmp_path], [], stage)
    assert stage.is_dir()
    assert argv[-2:] == ["prog", "arg"] and argv[-3] == "jail"
    assert argv[-4] == jail.script([tmp_path], [], stage) and argv[-6:-4] == ["sh", "-c"]
    assert "--pid" in argv and "--kill-child" in argv


# ---- backends ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["claude", "codex", "command"])
def test_backend_resolves(kind):
    b = backend(f"{kind}:/bin/true")
    assert b.kind == kind and b.exe == TRUE
    assert b.name == (kind if kind != "command" else f"command:{TRUE}")


def test_backend_finds_a_name_on_path():
    assert backend("command:true").exe == str(Path(shutil.which("true")).resolve())


@pytest.mark.parametrize("spec", ["gpt:/bin/true", "builtin", "", "command", "command:", "claude:/no/such/exe",
                                  "codex:/no/such/exe", "command:no-such-program-xyz"])
def test_backend_refuses(spec):
    with pytest.raises(UserError):
        backend(spec)


def test_claude_argv(tmp_path):
    b = backend("claude:/bin/true")
    argv = b.argv(tmp_path, tmp_path / "BRIEF.md", "do it", "RULES", Budget(60, turns=7))
    assert argv[0] == TRUE and after(argv, "-p") == "do it"
    assert after(argv, "--output-format") == "stream-json" and "--verbose" in argv
    assert after(argv, "--max-turns") == "7"
    i = argv.index("--allowedTools")
    assert tuple(argv[i + 1:i + 1 + len(CLAUDE_TOOLS)]) == CLAUDE_TOOLS
    assert after(argv, "--append-system-prompt") == "RULES"
    assert after(argv, "--permission-mode") == "acceptEdits"
    assert "--max-budget-usd" not in argv
    capped = b.argv(tmp_path, tmp_path / "BRIEF.md", "do it", "RULES", Budget(60, turns=None, usd=2.5))
    assert after(capped, "--max-budget-usd") == "2.5"
    assert after(capped, "--max-turns") == "50"
    assert b.stdin(tmp_path / "BRIEF.md") is None


def test_codex_argv(tmp_path):
    b = backend("codex:/bin/true")
    argv = b.argv(tmp_path / "wt", tmp_path / "BRIEF.md", "do it", "RULES", Budget(60, turns=7, usd=1.0))
    assert argv[:3] == [TRUE, "exec", "--json"]
    assert after(argv, "--sandbox") == "workspace-write"
    assert after(argv, "--ask-for-approval") == "never"
    assert after(argv, "-C") == str(tmp_path / "wt")
    assert argv[-1] == "do it"
    assert b.stdin(tmp_path / "BRIEF.md") is None


def test_command_argv(tmp_path):
    b = backend("command:/bin/true")
    brief = tmp_path / "BRIEF.md"
    assert b.argv(tmp_path, brief, "do it", "RULES", Budget(60)) == [TRUE, str(brief)]
    assert b.stdin(brief) == brief


# ---- watching the stream -----------------------------------------------------------------------------------------

def ev(**kw) -> str:
    return json.dumps(kw)


def test_claude_stream():
    w = backend("claude:/bin/true").watch(Budget(60, turns=5, usd=1.0))
    assert w.line(ev(type="system", subtype="init")) is None
    for _ in range(3):
        assert w.line(ev(type="assistant", message={"content": []})) is None
    assert w.line(ev(type="user")) is None
    assert w.turns == 3 and w.cost_usd is None
    assert w.line(ev(type="result", subtype="success", is_error=False, num_turns=3, total_cost_usd=0.5,
                     usage={"input_tokens": 10})) is None
    assert w.cost_usd == 0.5 and w.result["num_turns"] == 3 and w.result["subtype"] == "success"
    assert w.usage == {"input_tokens": 10}
    assert w.to_json()["turns"] == 3


def test_claude_older_cost_key():
    w = Watch("claude", Budget(60))
    w.line(ev(type="result", num_turns=1, cost_usd=0.25))
    assert w.cost_usd == 0.25


def test_turn_cap():
    w = Watch("claude", Budget(60, turns=2))
    assert w.line(ev(type="assistant")) is None
    assert w.line(ev(type="assistant")) is None  # at the cap: still allowed
    reason = w.line(ev(type="assistant"))
    assert isinstance(reason, str) and "3 turns" in reason and "2" in reason


def test_money_cap():
    w = Watch("claude", Budget(60, usd=0.5))
    assert w.line(ev(type="result", total_cost_usd=0.5)) is None
    reason = w.line(ev(type="result", total_cost_usd=0.75))
    assert isinstance(reason, str) and "$0.75" in reason and "$0.50" in reason


def test_unparsed_lines_never_crash():
    w = Watch("command", Budget(60, turns=1))
    for text in ["plain output", "", "{not json", "[1, 2]", "3", "null", '"a string"']:
        assert w.line(text) is None
    assert w.unparsed == 3 and w.turns == 0
    assert w.line(ev(type="assistant")) is None and w.turns == 1  # a command's own events count too


def test_codex_stream():
    w = backend("codex:/bin/true").watch(Budget(60, turns=3))
    assert w.line(ev(type="thread.started", thread_id="t")) is None
    assert w.line(ev(type="turn.started")) is None
    for kind in ("reasoning", "command_execution", "reasoning", "file_change", "agent_message"):
        assert w.line(ev(type="item.completed", item={"id": "i", "type": kind})) is None
    assert w.line(ev(type="item.started", item={"type": "command_execution"})) is None
    assert w.turns == 3
    w.line(ev(type="turn.completed", usage={"input_tokens": 10, "output_tokens": 5}))
    w.line(ev(type="turn.completed", usage={"input_tokens": 7, "cached_input_tokens": 2}))
    assert w.usage == {"input_tokens": 17, "output_tokens": 5, "cached_input_tokens": 2}
    reason = w.line(ev(type="item.completed", item={"type": "command_execution"}))
    assert isinstance(reason, str) and "over the cap of 3" in reason


def test_codex_ignores_claude_events():
    w = Watch("codex", Budget(60))
    w.line(ev(type="assistant"))
    w.line(ev(type="result", total_cost_usd=9.0))
    assert w.turns == 0 and w.cost_usd is None
