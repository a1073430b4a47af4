"""Bad input a user can give, found by auditing the commands as a user would: each is refused in one line (exit 2)
before any work, and leaves nothing half-written."""

from __future__ import annotations

import json

import pytest
import torch

from specpilot.cli.common import check_output_folder
from specpilot.config import parse_system
from specpilot.deployment import PRESET_DIR, load_deployment
from specpilot.errors import UserError
from specpilot.fixtures.random_models import random_drafter, random_target, tiny_drafter_config, tiny_target_config
from specpilot.loop.rundir import RunDir
from specpilot.models.loading import save_drafter, save_target
from specpilot.results import folder_atomic
from tests.test_cli import assert_one_line_error, specpilot

TINY = ('tokenizer = "bytes"\n[target]\nrandom = { vocab_size = 300, hidden_size = 32, intermediate_size = 64, '
        'num_layers = 2, num_heads = 2, num_kv_heads = 1, head_dim = 16 }\n')


def test_user_text_in_an_error_is_not_read_as_markup():
    assert_one_line_error(specpilot("bench", "--preset", "[/x]"), "unknown preset", "[/x]")
    assert_one_line_error(specpilot("generate", "hi", "-s", "[bold]"), "unknown system", "[bold]")


@pytest.mark.parametrize("where, needle", [
    ("folder", "not a folder"),  # --json names an existing folder
    ("file/out.json", "is not a folder"),  # its parent is a file
])
def test_json_that_cannot_be_written_is_refused_before_the_run(tmp_path, where, needle):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("mine")
    proc = specpilot("bench", "--limit", "1", "--max-new-tokens", "2", "--json", str(tmp_path / where))
    assert_one_line_error(proc, needle)
    assert (tmp_path / "file").read_text() == "mine" and not any((tmp_path / "folder").iterdir())


@pytest.mark.parametrize("body, needle", [
    ('context = "abc"\n', "context must be an integer"),
    ("context = -1\n", "context must be positive"),
    ('budgets = "x"\n', "budgets must be a table"),
    ("datasets = 5\n", "datasets must be a list of strings"),
    ('datasets = "gsm8k"\n', "datasets must be a list of strings"),
    ('enable_thinking = "false"\n', "enable_thinking must be true or false"),
    ('device = "tpu"\n', "device 'tpu'"),
    ('tokenizer = "no/such/folder"\n', "tokenizer folder not found"),
    ('[budgets]\nmax_new_tokens = "lots"\n', "[budgets] max_new_tokens must be an integer"),
    ("[budgets]\nlimit = 0\n", "[budgets] limit must be positive"),
    ("[budgets]\nspeed = 3\n", "[budgets] takes max_new_tokens, limit; unknown: speed"),
])
def test_a_deployment_field_of_the_wrong_type_is_named(tmp_path, body, needle):
    path = tmp_path / "dep.toml"
    text = TINY.replace('tokenizer = "bytes"\n', "") if body.startswith("tokenizer") else TINY
    path.write_text(body + text if not body.startswith("[") else text + body)
    with pytest.raises(UserError) as info:
        load_deployment(None, path)
    assert needle in str(info.value), str(info.value)


def test_random_model_fields_are_typed(tmp_path):
    path = tmp_path / "dep.toml"
    path.write_text(TINY + '[drafter]\nrandom = { layers = "x" }\n')
    from specpilot.runtime.pair import build_pair

    with pytest.raises(UserError, match="random drafter field layers must be an integer"):
        build_pair(load_deployment(None, path))


@pytest.mark.parametrize("text, needle", [
    ("stock:nodes=4,nodes=8", "given twice"),
    ("stock:pad_us=inf", "finite"),
    ("stock:pad_us=nan", "finite"),
    ("stock:tree_accept=garbage", "tree_accept"),
])
def test_a_system_string_is_refused_whole(text, needle):
    with pytest.raises(UserError, match=needle):
        parse_system(text)


def test_an_option_only_another_builder_reads_is_refused_or_dropped():
    """Said when a user writes it; dropped when systems are composed (an option only eagle2 reads does not follow
    a move to best_first), so equal systems keep equal names."""
    from specpilot.config.system import with_options

    for text in ("stock:tree_k=2", "stock:tree=ddtree,nodes=8,tree_accept=0.5", "stock:tree=eagle2,tree_accept=0.5"):
        with pytest.raises(UserError, match="acts only with tree="):
            parse_system(text)
    moved = with_options(parse_system("stock:tree=eagle2,tree_k=2,nodes=8"), "tree=best_first")
    assert moved.name == "stock:nodes=8,tree=best_first"


def test_the_override_variable_is_named_in_its_errors(monkeypatch):
    monkeypatch.setenv("SPECPILOT_OPTIONS", "nosuch=1")
    assert_one_line_error(specpilot("generate", "hi"), "SPECPILOT_OPTIONS", "nosuch")


@pytest.mark.parametrize("args, needle", [
    (["--noise", "-1"], "--noise"),
    (["--noise", "nan"], "--noise"),
    (["--timeout", "0"], "--timeout"),
    (["--gpu", "0"], "runs on the CPU"),
    (["--b-source", "/no/such/thing"], "neither a folder nor a commit"),
])
def test_compare_refuses_what_would_bend_its_verdict(args, needle):
    assert_one_line_error(specpilot("compare", "--preset", "tiny", "--limit", "3", "--max-new-tokens", "4", *args),
                          needle)


def test_generate_runs_one_system():
    assert_one_line_error(specpilot("generate", "hi", "-s", "ar", "-s", "stock"), "one system")


def test_a_cpu_refuses_compiled_triton_kernels(monkeypatch):
    import specpilot.runtime.engine as engine_mod

    monkeypatch.setattr(engine_mod, "interpreting", lambda: False)  # the tests may have turned the interpreter on
    target = random_target(tiny_target_config(), seed=0)
    with pytest.raises(UserError, match="kernels=triton needs a CUDA device"):
        engine_mod.Engine(target, None, parse_system("ar:kernels=triton"), context=64)


def test_a_request_too_long_for_the_context_is_named(tmp_path):
    path = tmp_path / "dep.toml"
    path.write_text("context = 24\n" + TINY)
    proc = specpilot("bench", "--deployment", path, "--system", "ar", "--limit", "1", "--max-new-tokens", "8")
    last = proc.stderr.strip().splitlines()[-1]  # after the models' loading line
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    for needle in ("error: request builtin/", "does not fit the context", "raise the deployment's `context`"):
        assert needle in last, last


def test_folder_outputs_never_replace_what_the_command_did_not_write(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("important")
    for command in (["distill", "--templates", "8", "--heldout", "2"], ["train-drafter", "--steps", "1"]):
        assert_one_line_error(specpilot(*command, "--out", mine), "refusing to replace", "new or empty folder")
    assert [p.name for p in mine.iterdir()] == ["thesis.txt"]
    (tmp_path / "file").write_text("x")
    assert_one_line_error(specpilot("distill", "--templates", "8", "--heldout", "2", "--out", tmp_path / "file"),
                          "it is a file")


def test_twin_checks_both_models_before_writing_anything(tmp_path):
    tc = tiny_target_config(vocab=300)
    save_target(random_target(tc, seed=0), tmp_path / "small")
    other = tiny_drafter_config(tiny_target_config(vocab=300, hidden_size=32, head_dim=16), mask_token_id=5)
    save_drafter(random_drafter(other, seed=1), tmp_path / "foreign")
    for drafter, needle in (("missing", "not found"), ("foreign", "is not a drafter of")):
        proc = specpilot("twin", "--target", tmp_path / "small", "--drafter", tmp_path / drafter, "--width", "2",
                         "--out", tmp_path / "twin")
        assert_one_line_error(proc, needle)
        assert not (tmp_path / "twin").exists()
    ok = specpilot("twin", "--target", tmp_path / "small", "--width", "2", "--out", tmp_path / "twin")
    assert ok.returncode == 0, ok.stderr
    assert sorted(p.name for p in (tmp_path / "twin").iterdir()) == ["target"]


def test_a_folder_written_atomically_is_whole_or_as_it_was(tmp_path):
    out = tmp_path / "out"
    with folder_atomic(out) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(RuntimeError), folder_atomic(out) as tmp:
        (tmp / "b").write_text("2")
        raise RuntimeError("crash half way")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and [p.name for p in out.iterdir()] == ["a"]
    with folder_atomic(out) as tmp:
        (tmp / "c").write_text("3")
    assert [p.name for p in out.iterdir()] == ["c"]  # replaced as a whole: nothing of the last one mixed in


def test_a_folder_swap_that_fails_midway_keeps_the_old_copy(tmp_path, monkeypatch):
    """The old folder is renamed away before the new one goes in: a failure there must put the old one back."""
    out = tmp_path / "out"
    with folder_atomic(out) as tmp:
        (tmp / "a").write_text("old")
    real = type(out).rename

    def rename(self, target):
        if self.name == "out.partial":  # the new folder's rename into place fails (disk, signal, ...)
            raise OSError("rename failed")
        return real(self, target)

    monkeypatch.setattr(type(out), "rename", rename)
    with pytest.raises(OSError), folder_atomic(out) as tmp:
        (tmp / "b").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (out / "a").read_text() == "old"


def test_a_swap_that_died_between_its_renames_is_put_back(tmp_path):
    """A kill (no handler runs) after the old folder was renamed away: the next write finds the hidden copy and
    puts it back first, so even a failing write leaves the last complete folder in place."""
    out = tmp_path / "out"
    with folder_atomic(out) as tmp:
        (tmp / "a").write_text("old")
    out.rename(tmp_path / ".out.replaced")  # the state a kill between the two renames leaves
    with pytest.raises(RuntimeError), folder_atomic(out) as tmp:
        raise RuntimeError("crash")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (out / "a").read_text() == "old"
    out.rename(tmp_path / ".out.replaced")
    with folder_atomic(out) as tmp:
        (tmp / "b").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and [p.name for p in out.iterdir()] == ["b"]


OUTPUT_FOLDERS = {  # commands that write a folder at the end of their work, "{out}" where it goes
    "loop": ["loop", "--preset", "tiny", "--limit", "3", "--max-new-tokens", "4", "--run-dir", "{out}"],
    "replay": ["replay", "{out}", "--record", "--preset", "tiny", "--limit", "1", "--max-new-tokens", "4"],
    "ceiling": ["ceiling", "{out}", "--measure", "--preset", "tiny", "--limit", "1", "--max-new-tokens", "4"],
}


@pytest.mark.parametrize("command, where, needle", [
    *[(c, "file/a/b", "file is a file") for c in OUTPUT_FOLDERS],  # a file on the way: no folder can be made
    *[(c, "file", "it is a file") for c in OUTPUT_FOLDERS],
    ("replay", "mine", "refusing to replace"),  # another's folder the result would replace (a loop's: RunDir's)
    ("ceiling", "mine", "refusing to replace"),
])
def test_an_output_folder_that_cannot_be_written_is_refused_before_any_work(tmp_path, monkeypatch, command, where,
                                                                           needle):
    import specpilot.loop.main as loop_main
    import specpilot.runtime.pair as pair

    def work(*args, **kwargs):
        raise AssertionError("the work started")

    monkeypatch.setattr(pair, "build_pair", work)
    monkeypatch.setattr(loop_main, "run_loop", work)
    (tmp_path / "file").write_text("kept")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.txt").write_text("kept")
    args = [str(tmp_path / where) if a == "{out}" else a for a in OUTPUT_FOLDERS[command]]
    assert_one_line_error(specpilot(*args), needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "mine"]
    assert (tmp_path / "file").read_text() == "kept" and [p.name for p in (tmp_path / "mine").iterdir()] == [
        "thesis.txt"]


def test_a_recording_may_go_under_folders_not_made_yet(tmp_path):
    check_output_folder(tmp_path / "new" / "deeper" / "run", "lattices.pt", make_parents=True)  # the write makes them
    with pytest.raises(UserError, match="does not exist"):
        check_output_folder(tmp_path / "new" / "run", "meta.json")  # the training outputs still want the parent


@pytest.mark.parametrize("args, needle", [
    (["--budget", "-5"], "--budget"),
    (["--budget", "nan"], "--budget"),
    (["--sealed-tokens", "5000"], "at most 4096"),
    (["--directions", "0"], "--directions must be positive"),
])
def test_loop_arguments_are_checked_before_it_starts(tmp_path, args, needle):
    run = tmp_path / "run"
    proc = specpilot("loop", "--preset", "tiny", "--limit", "3", "--max-new-tokens", "4", "--run-dir", run, *args)
    assert_one_line_error(proc, needle)
    assert not run.exists()


def test_the_loop_needs_a_drafter(tmp_path):
    path = tmp_path / "dep.toml"
    path.write_text(TINY)
    assert_one_line_error(specpilot("loop", "--deployment", path, "--run-dir", tmp_path / "run"), "has no drafter",
                          "train-drafter")
    assert not (tmp_path / "run").exists()


def test_the_loop_refuses_a_batch_deployment_its_data_cannot_time(tmp_path):
    """Eight in flight need three closed loops of eight a split: the built-in prompts hold 11 sealed ones."""
    path = tmp_path / "dep.toml"
    path.write_text('name = "b"\nregime = "batch"\nin_flight = 8\n' + TINY.replace('tokenizer = "bytes"\n', "")
                    .replace("[target]", 'tokenizer = "bytes"\n[drafter]\nrandom = { block_size = 4 }\n[target]'))
    assert_one_line_error(specpilot("loop", "--deployment", path, "--run-dir", tmp_path / "run"),
                          "8 requests in flight", "24 requests a split", "11 sealed", "serve fewer requests in flight")
    assert not (tmp_path / "run").exists()


def test_a_resume_under_another_set_up_is_refused(tmp_path):
    with RunDir(tmp_path / "run") as rd:
        rd.same_run({"deployment": {"seed": 0}, "limit": 3})
    with RunDir(tmp_path / "run", resume=True) as rd:
        rd.same_run({"deployment": {"seed": 0}, "limit": 3})  # the same: resumes
    with RunDir(tmp_path / "run", resume=True) as rd, pytest.raises(UserError, match="deployment differ"):
        rd.same_run({"deployment": {"seed": 1}, "limit": 3})


def test_ctrl_c_while_starting_is_not_silent(monkeypatch):
    import specpilot.deployment as dep_mod

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dep_mod, "load_deployment", interrupted)
    proc = specpilot("bench", "--limit", "1")
    assert proc.returncode == 130 and "interrupted while starting" in proc.stderr


def test_reading_commands_refuse_what_they_cannot_read(tmp_path):
    assert_one_line_error(specpilot("memory", "list", "--dir", tmp_path / "none"), "no memory folder")
    assert_one_line_error(specpilot("memory", "replay", "--dir", tmp_path / "none"), "no memory folder")
    (tmp_path / "file").write_text("x")
    assert_one_line_error(specpilot("report", tmp_path / "file"), "is not a folder")
    (tmp_path / "loop").mkdir()
    (tmp_path / "loop" / "loop.json").write_text("{}")
    assert_one_line_error(specpilot("report", tmp_path / "loop"), "not a loop's summary")
    (tmp_path / "run" / "steps").mkdir(parents=True)
    assert_one_line_error(specpilot("report", tmp_path / "run"), "--resume")
    (tmp_path / "rec").mkdir()
    torch.save({"not": "a recording"}, tmp_path / "rec" / "lattices.pt")
    assert_one_line_error(specpilot("replay", tmp_path / "rec"), "record format")
    (tmp_path / "rec" / "lattices.pt").write_bytes(b"\x80garbage")
    assert_one_line_error(specpilot("replay", tmp_path / "rec"), "no readable recording")
    (tmp_path / "ceil").mkdir()
    (tmp_path / "ceil" / "inputs.json").write_text(json.dumps({"other": 1}))
    assert_one_line_error(specpilot("ceiling", tmp_path / "ceil"), "not a ceiling measurement")


def test_plain_ar_is_the_reference_whatever_ar_variant_is_named(tmp_path):
    """A lossy AR variant named beside stock is measured like any system, never taken as the reference."""
    out = tmp_path / "b.json"
    proc = specpilot("bench", "-s", "stock", "-s", "ar:fault=near_tie", "--limit", "2", "--max-new-tokens", "24",
                     "--json", out)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["reference"] == "ar" and list(report["systems"])[0] == "ar"
    assert report["systems"]["stock"]["mismatch_vs_ar"] == 0.0  # float32 on the CPU: stock is AR's tokens
    assert report["systems"]["ar:fault=near_tie"]["mismatch_vs_ar"] > 0


@pytest.mark.parametrize("system, needle", [
    ("stock:nodes=64", "tree=chain holds 2..8 nodes"),  # was run as 8 rows under the name nodes=64
    ("stock:nodes=1", "tree=chain holds 2..8 nodes"),
    ("stock:tree=ddtree,nodes=250,verify=tlv", "verify=tlv doubles"),
])
def test_rows_a_step_that_cannot_run_as_named_are_refused(tmp_path, system, needle):
    dep = tmp_path / "tiny-bf16.toml"  # tiny in BF16: verify=tlv's 8-bit pass has its W12 forms (float32 refuses it)
    dep.write_text((PRESET_DIR / "tiny.toml").read_text().replace('dtype = "auto"', 'dtype = "bfloat16"'))
    assert_one_line_error(specpilot("generate", "hi", "-d", dep, "-s", system, "--max-new-tokens", "4"), needle)


@pytest.mark.parametrize("override, needle", [
    ("nodes=abc", "takes an integer"),  # a value for stock only, checked when only AR runs
    ("tree_k=99", "must be <= 64"),
    ("nodes", "needs a value"),
])
def test_override_values_are_checked_even_where_they_do_not_apply(monkeypatch, override, needle):
    monkeypatch.setenv("SPECPILOT_OPTIONS", override)
    assert_one_line_error(specpilot("generate", "hi", "-s", "ar", "--max-new-tokens", "2"), "SPECPILOT_OPTIONS", needle)


@pytest.mark.slow  # 13 s on two cores (make test-slow, which CI runs too)
def test_triton_kernels_run_under_the_interpreter_the_error_points_to():
    """TRITON_INTERPRET=1, which the CPU's refusal of kernels=triton suggests, runs every Triton kernel (a fresh
    process: the interpreter's loop fix must come from the engine, not from a test module's import)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "specpilot.cli", "generate", "hi", "-s", "ar:kernels=triton",
                           "--max-new-tokens", "2"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 tokens" in done.stderr
