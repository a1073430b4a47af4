"""What the commands read and write, as a user with bad input meets it: outputs that are links, devices or FIFOs,
prompts that are not text, a report that cannot be written, the version, and progress in a log."""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from rich.console import Console

from specpilot.cli import common
from specpilot.cli.common import check_output, progress, progress_bar
from specpilot.errors import UserError
from specpilot.results import folder_atomic, write_figure, write_json_atomic, write_text_atomic
from tests.test_cli import assert_one_line_error, specpilot

ROOT = Path(__file__).resolve().parents[1]
STAMP = re.compile(r"^\[ *\d+\.\d s\] ")


def test_a_symlinked_output_is_written_through_and_stays_a_link(tmp_path):
    target, link = tmp_path / "real.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    write_json_atomic(link, {"a": 1})
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text()) == {"a": 1}
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "new.json")  # a link to a file not made yet: the file is made
    write_text_atomic(dangling, "x")
    assert dangling.is_symlink() and (tmp_path / "new.json").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.json", "link.json", "new.json", "real.json"]


def test_a_symlink_into_a_missing_folder_is_refused_before_the_run(tmp_path):
    link = tmp_path / "out.json"
    link.symlink_to(tmp_path / "gone" / "out.json")
    with pytest.raises(UserError, match="gone does not exist"):
        check_output(link)


def test_a_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    check_output(fifo)  # must not open it: an open for writing waits for a reader
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    write_json_atomic(fifo, {"b": 2})
    reader.join(timeout=30)
    assert got and json.loads(got[0]) == {"b": 2}
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]  # no temporary file beside it


def _device(tmp_path: Path, name: str, minor: int) -> Path:
    """A copy of /dev/null (minor 3) or /dev/full (7) under tmp_path: a broken write replaces it, not the
    machine's. Where no device can be made here, /dev/null itself (safe: its writes are discarded)."""
    path = tmp_path / name
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
        with open(path, "rb"):  # a nodev mount refuses to open it
            pass
    except OSError:
        if minor != 3:
            pytest.skip("no device can be made here")
        return Path("/dev/null")
    return path


def test_a_device_output_stays_a_device(tmp_path):
    null = _device(tmp_path, "null", 3)
    proc = specpilot("w12", "inspect", "--preset", "tiny", "--json", null)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISCHR(os.stat(null).st_mode)
    write_text_atomic(null, "x")
    assert stat.S_ISCHR(os.stat(null).st_mode)


def test_a_full_device_is_one_line_and_stays_a_device(tmp_path):
    full = _device(tmp_path, "full", 7)
    proc = specpilot("bench", "--preset", "tiny", "-s", "ar", "--limit", "1", "--max-new-tokens", "2",
                     "--json", full)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr  # after the work: its log above
    assert proc.stderr.splitlines()[-1] == f"error: cannot write {full}: No space left on device"
    assert stat.S_ISCHR(os.stat(full).st_mode)


def test_stdout_redirected_to_a_file_keeps_what_is_printed_after(tmp_path):
    """/dev/stdout as `> file` made it is written through the descriptor: replacing the file would cut off the
    shell's redirection, and a fresh open would write from its start, under what the command prints next."""
    out = tmp_path / "out.txt"
    code = ("import sys; from specpilot.results import write_text_atomic; print('before', flush=True); "
            "write_text_atomic('/dev/stdout', 'json\\n'); print('after')")
    with open(out, "w") as f:
        subprocess.run([sys.executable, "-c", code], stdout=f, check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.read_text() == "before\njson\nafter\n"


def test_a_regular_file_is_whole_or_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    path.write_text("old")

    def no_rename(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(UserError, match="cannot write .*out.json: No space left on device"):
        write_json_atomic(path, {"c": 3})
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_a_folder_output_through_a_symlink_keeps_the_link(tmp_path):
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    (real / "old").write_text("old")
    link.symlink_to(real)
    with folder_atomic(link) as tmp:
        (tmp / "new").write_text("new")
    assert link.is_symlink() and sorted(p.name for p in real.iterdir()) == ["new"]
    (tmp_path / "file").write_text("mine")
    with pytest.raises(UserError, match="not a folder"), folder_atomic(tmp_path / "file"):
        pass
    assert (tmp_path / "file").read_text() == "mine"


def test_a_plot_is_written_through_a_symlink(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target, link = tmp_path / "real.png", tmp_path / "plot.png"
    link.symlink_to(target)
    fig = plt.figure()
    write_figure(link, fig)
    plt.close(fig)
    assert link.is_symlink() and target.read_bytes().startswith(b"\x89PNG")


def _no_models(monkeypatch):
    import specpilot.runtime.pair as pair

    def refuse(*args, **kwargs):
        raise AssertionError("a model loaded before the prompt was checked")

    monkeypatch.setattr(pair, "build_pair", refuse)


def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_a_prompt_that_is_not_utf8_is_refused_before_any_model_loads(monkeypatch):
    _no_models(monkeypatch)
    assert_one_line_error(specpilot("generate", "caf\udce9"), "not UTF-8", "0xe9")  # argv's surrogateescape
    _stdin(monkeypatch, b"caf\xe9\n")
    assert_one_line_error(specpilot("generate", "-"), "the prompt on stdin is not UTF-8", "0xe9 at offset 3")
    _stdin(monkeypatch, b"\n")
    assert_one_line_error(specpilot("generate", "-"), "empty prompt on stdin")


def test_a_prompt_of_raw_bytes_on_the_command_line_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "specpilot.cli", "generate", b"caf\xe9"], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert_one_line_error(proc, "the prompt is not UTF-8 text (byte 0xe9 at character 3)")


def test_generate_reads_the_prompt_from_stdin(monkeypatch):
    args = ("--preset", "tiny", "--max-new-tokens", "6")
    given = specpilot("generate", "hello there", *args)
    assert given.returncode == 0, given.stderr
    _stdin(monkeypatch, b"hello there\n")  # the newline a file or `echo` ends with is not part of it
    piped = specpilot("generate", "-", *args)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == given.stdout
    _stdin(monkeypatch, b"hello here\n")
    assert specpilot("generate", "-", *args).stdout != given.stdout  # the model did read stdin
    assert "stdin" in specpilot("generate", "--help").stdout


SUMMARY = {"deployment": "tiny", "agent": "builtin", "rounds_asked": 1, "limit": 1, "max_new_tokens": 8,
           "best": "stock", "stopped": None, "rounds": []}


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "loop.json").write_text(json.dumps(SUMMARY))
    return run


def test_a_report_is_written_whole(tmp_path):
    run = _run_dir(tmp_path)
    proc = specpilot("report", run)
    assert proc.returncode == 0, proc.stderr
    assert "# SpecPilot loop: tiny" in (run / "report.md").read_text()
    assert sorted(p.name for p in run.iterdir()) == ["loop.json", "report.html", "report.md"]  # no temp left


def test_a_report_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    run = _run_dir(tmp_path)
    (run / "report.html").mkdir()
    assert_one_line_error(specpilot("report", run), "report.html: it is a folder")
    (run / "report.html").rmdir()
    (run / "report.md").write_text("earlier")

    def read_only(self, data):  # a read-only folder (root writes into a chmod 555 one, so it is made to fail)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "write_bytes", read_only)
    assert_one_line_error(specpilot("report", run), "cannot write", "report.md: Permission denied")
    assert (run / "report.md").read_text() == "earlier"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_report_into_a_read_only_folder_is_one_line(tmp_path):
    run = _run_dir(tmp_path)
    run.chmod(0o555)
    try:
        assert_one_line_error(specpilot("report", run), "report.md: Permission denied")
    finally:
        run.chmod(0o755)


def test_version_is_the_package_version():
    proc = specpilot("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"specpilot {importlib.metadata.version('specpilot')}\n"


def _log() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, width=200), buf


def _clock(monkeypatch, start: float) -> list[float]:
    now = [start]
    monkeypatch.setattr(common.time, "monotonic", lambda: now[0])
    return now


def test_progress_prints_a_stamped_line_per_step_off_a_terminal(monkeypatch):
    console, buf = _log()
    now = _clock(monkeypatch, 100.0)
    with progress(console) as say:
        now[0] = 112.3
        say("phase 0: ceiling of stock [x]")  # user text: brackets printed as given
    assert buf.getvalue().splitlines() == ["[  12.3 s] phase 0: ceiling of stock [x]"]


def test_progress_on_a_terminal_is_a_spinner_not_lines():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=80)
    with progress(console) as say:
        say("phase 0: ceiling of stock")
    assert not any(STAMP.match(line) for line in buf.getvalue().splitlines())


def test_a_progress_bar_off_a_terminal_prints_at_most_a_line_a_second_and_the_end(monkeypatch):
    console, buf = _log()
    now = _clock(monkeypatch, 0.0)
    with progress_bar(console, "2 requests x 2 systems", 8) as advance:
        for now[0] in (0.2, 0.4, 1.5, 1.6):
            advance()
    assert buf.getvalue().splitlines() == ["[   1.5 s] 2 requests x 2 systems: 3/8",
                                           "[   1.6 s] 2 requests x 2 systems: 4/8"]


def test_the_loop_logs_a_line_per_step_when_stderr_is_not_a_terminal(tmp_path, monkeypatch):
    import specpilot.loop.main as loop_main
    import specpilot.loop.report as loop_report

    def run_loop(args, say):
        say("phase 0: ceiling of stock")
        say("phase 1: direction 1 of 2")
        return {"rounds": [], "stopped": None, "best": None}

    monkeypatch.setattr(loop_main, "run_loop", run_loop)
    monkeypatch.setattr(loop_report, "write_report", lambda folder: (folder / "report.md", folder / "report.html"))
    proc = specpilot("loop", "--preset", "tiny", "--run-dir", tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if STAMP.match(line)]
    assert [STAMP.sub("", line) for line in lines] == ["phase 0: ceiling of stock", "phase 1: direction 1 of 2"]


def test_bench_logs_its_progress_when_stderr_is_not_a_terminal():
    proc = specpilot("bench", "--preset", "tiny", "-s", "ar", "--limit", "2", "--max-new-tokens", "2")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^\[ *\d+\.\d s\] 2 requests x 1 systems: 2/2$", proc.stderr, re.M), proc.stderr
