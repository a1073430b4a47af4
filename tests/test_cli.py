"""The `specpilot` command end to end: the bench JSON, and one-line errors with nothing half-written."""

import contextlib
import io
import json
import subprocess
import sys
import traceback

import pytest
import torch

from specpilot import cli
from specpilot.deployment import load_deployment
from specpilot.errors import UserError
from specpilot.fixtures.random_models import random_drafter, random_target, tiny_drafter_config, tiny_target_config
from specpilot.models.loading import save_drafter, save_target
from specpilot.results import write_json_atomic
from specpilot.runtime.pair import build_pair


def specpilot(*args, cwd=None):
    """The command as a user runs it, in this process (a fresh interpreter per call costs seconds of imports):
    its exit status and everything it printed; an exception the command lets escape becomes a traceback on
    stderr and status 1, as the interpreter would report it."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        argv, sys.argv = sys.argv, ["specpilot", *map(str, args)]
        try:
            cli.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Exception:  # noqa: BLE001 (reported as the interpreter would)
            err.write(traceback.format_exc())
            code = 1
        finally:
            sys.argv = argv
    return subprocess.CompletedProcess(["specpilot", *args], code, out.getvalue(), err.getvalue())


def assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:")
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in proc.stderr


def test_bench_writes_every_figure(tmp_path):
    out = tmp_path / "out.json"
    proc = specpilot("bench", "--preset", "tiny", "--system", "ar", "--system", "stock", "--limit", "3",
                     "--max-new-tokens", "12", "--oracle", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "stock" in proc.stdout
    report = json.loads(out.read_text())
    stock = report["systems"]["stock"]  # one benchmark here: its breakdown is the overall figure
    assert stock["by_dataset"] == {"builtin": {"n_requests": 3, "tau": stock["tau"],
                                               "speedup_vs_ar": pytest.approx(stock["speedup_vs_ar"])}}
    assert stock["oracle_by_dataset"]["builtin"] == {"replay_chain_tau": stock["replay_chain_tau"],
                                                     "oracle_tau_top16": stock["oracle_tau_top16"]}
    for key in ("date", "commit", "device", "command", "systems"):
        assert key in report
    for name in ("ar", "stock"):
        s = report["systems"][name]
        for key in ("tau", "speedup_vs_ar", "decode_tokens_per_s", "mismatch_vs_ar", "requests", "tau_histogram"):
            assert key in s, key
        assert len(s["requests"]) == 3
        assert s["tau"] >= 1.0 and s["decode_tokens_per_s"] > 0
    # float32 on the CPU: stock is lossless against AR, token for token
    assert report["systems"]["stock"]["mismatch_vs_ar"] == 0.0
    ar_rows = {r["id"]: r["tokens"] for r in report["systems"]["ar"]["requests"]}
    for row in report["systems"]["stock"]["requests"]:
        assert row["tokens"] == ar_rows[row["id"]]
        assert sum(row["accepted"]) == len(row["tokens"]) - 1


@pytest.mark.parametrize("args,needles", [
    (["bench", "--preset", "nope"], ["unknown preset", "tiny"]),
    (["bench", "--system", "stock:warp=9"], ["unknown system option", "warp"]),
    (["bench", "--system", "turbo"], ["unknown system", "turbo"]),
    (["bench", "--max-new-tokens", "0"], ["--max-new-tokens must be positive, got 0"]),
    (["generate", "hi", "--max-new-tokens", "-3"], ["--max-new-tokens must be positive, got -3"]),
    (["replay", "runs/never", "--record", "--max-new-tokens", "0"], ["--max-new-tokens must be positive"]),
    (["ceiling", "runs/never", "--measure", "--max-new-tokens", "0"], ["--max-new-tokens must be positive"]),
    (["force", "--candidate", "ar", "--max-new-tokens", "5000"], ["--max-new-tokens must be in 1..4096, got 5000"]),
    (["compare", "--max-new-tokens", "0"], ["--max-new-tokens must be positive"]),
    (["bench", "--limit", "-1"], ["--limit"]),
    (["bench", "--dataset", "trivia"], ["unknown dataset", "trivia"]),
    (["generate", "   "], ["empty prompt"]),
])
def test_user_mistakes_are_one_line(args, needles):
    assert_one_line_error(specpilot(*args), *needles)


def test_missing_data_file_says_where_to_get_it(tmp_path):
    out = tmp_path / "out.json"
    proc = specpilot("bench", "--dataset", "mbpp", "--data-dir", str(tmp_path), "--json", str(out))
    assert_one_line_error(proc, "sanitized-mbpp.json", "google-research")
    assert not out.exists()


def test_json_into_a_missing_folder(tmp_path):
    proc = specpilot("bench", "--limit", "1", "--json", str(tmp_path / "no" / "out.json"))
    assert_one_line_error(proc, "does not exist")


def test_atomic_json_leaves_nothing_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "out.json"

    def broken(*_):
        raise OSError("disk full")

    monkeypatch.setattr("specpilot.results.os.replace", broken)
    with pytest.raises(UserError, match="cannot write .*out.json: disk full"):  # one line, not a traceback
        write_json_atomic(path, {"a": 1})
    assert list(tmp_path.iterdir()) == []


def _deployment(tmp_path, body: str):
    path = tmp_path / "dep.toml"
    path.write_text(body)
    return load_deployment(None, path)


def _pair_folders(tmp_path, target_vocab=300, drafter_vocab=300, drafter_hidden=64):
    tc = tiny_target_config(vocab=target_vocab)
    save_target(random_target(tc, seed=0), tmp_path / "target")
    dc = tiny_drafter_config(tiny_target_config(vocab=drafter_vocab, hidden_size=drafter_hidden, head_dim=16),
                             mask_token_id=5)
    dc.num_target_layers = tc.num_layers
    save_drafter(random_drafter(dc, seed=1), tmp_path / "drafter")
    return tmp_path


@pytest.mark.parametrize("kwargs,needle", [
    ({"drafter_vocab": 400}, "vocabularies differ"),
    ({"drafter_hidden": 32}, "hidden sizes differ"),
])
def test_mismatched_pair(tmp_path, kwargs, needle):
    _pair_folders(tmp_path, **kwargs)
    dep = _deployment(tmp_path, 'tokenizer = "bytes"\ndevice = "cpu"\n[target]\npath = "target"\n'
                                '[drafter]\npath = "drafter"\n')
    with pytest.raises(UserError, match=needle):
        build_pair(dep)


def test_mask_token_outside_vocabulary(tmp_path):
    dep = _deployment(tmp_path, 'device = "cpu"\n[target]\nrandom = { vocab_size = 300, hidden_size = 32, '
                                'intermediate_size = 64, num_layers = 2, num_heads = 2, num_kv_heads = 1, '
                                'head_dim = 16 }\n[drafter]\nrandom = { mask_token_id = 300 }\n')
    with pytest.raises(UserError, match="outside the target vocabulary"):
        build_pair(dep)


def test_deployment_file_errors(tmp_path):
    with pytest.raises(UserError, match="unknown deployment field"):
        _deployment(tmp_path, "speed = 3\n[target]\npath = 'x'\n")
    with pytest.raises(UserError, match="invalid TOML"):
        _deployment(tmp_path, "[target\n")
    with pytest.raises(UserError, match="exactly one of path"):
        _deployment(tmp_path, "[target]\nseed = 1\n")
    with pytest.raises(UserError, match="deployment file not found"):
        load_deployment(None, tmp_path / "none.toml")


def test_tiny_preset_builds_on_cpu():
    target, drafter, tok = build_pair(load_deployment("tiny"))
    assert target.embed.weight.dtype == torch.float32
    assert drafter.cfg.layer.vocab_size == target.cfg.vocab_size
    assert tok.decode(tok.chat_prompt([{"role": "user", "content": "hi"}])).count("hi") == 1


@pytest.mark.parametrize("candidate,bound,code,verdict,exact", [
    ("stock:fault=logit_bias", "0.001", 1, "reject", "deployment"), ("stock", "0", 0, "pass", "float32"),
    ("stock", "0.001", 1, "inconclusive", "auto")])
def test_force_exit_code_and_evidence(tmp_path, candidate, bound, code, verdict, exact):
    out = tmp_path / "force.json"
    proc = specpilot("force", "--preset", "tiny", "--reference", "stock", "--candidate", candidate, "--limit", "2",
                     "--max-limit", "3", "--power-bound", bound, "--max-new-tokens", "16", "--exact", exact,
                     "--json", str(out))
    assert proc.returncode == code, proc.stderr
    report = json.loads(out.read_text())
    # auto on a float32 deployment: its own target is the float32 function (forcing/run.exact_mode)
    assert report["verdict"] == verdict and verdict in proc.stdout
    assert report["exact"] == {"auto": "deployment"}.get(exact, exact)
    for role in ("reference", "candidate", "ar"):
        assert {"mismatch_rate", "large_margin_events", "margins"} <= set(report["systems"][role])
    # the evidence: the noise calibration, the three comparisons (with the margin test), the power
    noise = report["calibration"]["noise"]
    assert noise["positions"] > 0 and report["delta"] > 0 and set(noise["perturbations"]) == {"rows=1", "rows=4",
                                                                                              "rows=16"}
    three = {"candidate_vs_reference", "reference_vs_exact", "candidate_vs_exact"}
    assert set(report["tests"]) == (three | {"ar_vs_float32"} if exact == "float32" else three)
    assert "margins_p" in report["tests"]["candidate_vs_reference"] and report["detectable_rate"] > 0
    if verdict == "inconclusive":  # a pass short of the bound: it doubled to every request it may use
        assert report["power"] == {"bound": 0.001, "requests": 3, "met": False}
    if exact == "float32":  # a float32 deployment: AR in float32 is the same function in the same precision
        fp32, ar = report["systems"]["ar_float32"], report["systems"]["ar"]
        assert fp32["tokens"] == ar["tokens"] > 0 and fp32["mismatches"] == ar["mismatches"]
        assert fp32["requests"] == 2  # the first requests only (at most forcing/run.EXACT_AR_REQUESTS)


def test_force_rejects_bad_names_before_loading():
    assert_one_line_error(specpilot("force", "--candidate", "stock:fault=typo"), "fault")


@pytest.mark.parametrize("args, needle", [
    (["--gpus", "0"], "two different devices"),
    (["--gpus", "1,1"], "two different devices"),
    (["--gpus", "0,1", "--gpu", "0"], "not both"),
    (["--limit", "2"], "at least 3"),
    (["--a-source", "."], "inside the tree it was asked to time"),
    (["--aa-card", "no-such-card.json"], "no such file"),
    (["--aa-card", "pyproject.toml"], "not an evidence card with an A/A run"),
])
def test_compare_bad_input_is_one_line(args, needle):
    assert_one_line_error(specpilot("compare", "--preset", "tiny", "--max-new-tokens", "8", *args), needle)


def test_compare_refuses_an_aa_card_of_another_side_a_or_budget(tmp_path):
    """--aa-card's A/A run gives its noise only to a run of the same side A, code, deployment and budget: another
    is one line, before any worker starts."""
    import os

    from specpilot.controller.compare import REPO
    from specpilot.controller.worker import code_hash

    budget = int(torch.randint(9, 32, (1,)))
    aa = {"mode": "lockstep", "clock": "worker", "requests": ["r0", "r1", "r2"], "ratios": [1.0, 1.01, 0.99],
          "estimate": {"gain": 1.0, "lower": 0.98, "upper": 1.02, "requests": 3},
          "a": {"system": "stock", "code_hash": code_hash(REPO / "specpilot"), "config": None},
          "setup": {"preset": "tiny", "deployment": None, "deployment_sha256": None, "max_new_tokens": budget,
                    "threads": len(os.sched_getaffinity(0))}}
    card = tmp_path / "card.json"
    card.write_text(json.dumps({"aa": aa}))
    args = ("compare", "--preset", "tiny", "--aa-card", card)
    assert_one_line_error(specpilot(*args, "--max-new-tokens", budget + 1),
                          f"max_new_tokens {budget} (now {budget + 1})", "drop --aa-card")
    assert_one_line_error(specpilot(*args, "--max-new-tokens", budget, "--a", "ar", "--b", "ar"),
                          "side A is 'stock', this run's is 'ar'")
    card.write_text(json.dumps({"aa": {k: v for k, v in aa.items() if k != "setup"}}))
    assert_one_line_error(specpilot(*args, "--max-new-tokens", budget), "records no deployment")


def test_the_pytest_script_collects_what_python_m_pytest_does():
    """`pytest` (the console script) does not put the repository on sys.path as `python -m pytest` does; the
    project's pytest config does, so tests that import tests.conftest or bench.gpu collect either way."""
    import os
    from pathlib import Path

    script = Path(sys.executable).parent / "pytest"
    if not script.exists():
        pytest.skip("no pytest console script beside this interpreter")
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    files = ["tests/test_smollm2.py", "tests/test_bench_provenance.py"]  # import tests.test_lossless, bench.gpu
    done = subprocess.run([str(script), "--co", "-q", *files], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "error" not in done.stdout.lower()


def test_ctrl_c_in_bench_says_what_was_kept_and_exits_130(tmp_path, monkeypatch, capsys):
    import specpilot.bench.run as run_mod
    from specpilot import cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_mod, "run_bench", interrupted)
    out = tmp_path / "r.json"
    monkeypatch.setattr(sys, "argv", ["specpilot", "bench", "--preset", "tiny", "--limit", "1", "--json", str(out)])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 130
    err = " ".join(capsys.readouterr().err.split())
    assert "interrupted" in err and "nothing was written" in err and str(out.name) in err
    assert not out.exists()


def test_tables_are_not_cut_when_piped():
    """Piped (not a terminal), the summary table keeps its columns instead of folding them at 80."""
    proc = subprocess.run([sys.executable, "-m", "specpilot.cli", "bench", "--preset", "tiny", "--limit", "1",
                           "--max-new-tokens", "4"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-1000:]
    header = next(line for line in proc.stdout.splitlines() if "system" in line and "tau" in line)
    assert "mismatch vs AR" in header and len(header) > 80
