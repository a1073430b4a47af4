"""One copy of the target per device: the loop's gate times its own install's candidates in its own process (the
controller's rules, its card), releases its models before another tree's workers start, and a worker that dies is
an error the loop reports (loop.json, exit status 3), never a refusal."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import weakref
from types import SimpleNamespace

import pytest
import torch

import specpilot.loop.gate as gate_mod
from specpilot.config.env import parse
from specpilot.controller import compare as compare_mod
from specpilot.controller.compare import REPO, Side, WorkerDied, _flat, compare, measure
from specpilot.datasets import load_requests
from specpilot.errors import UserError
from specpilot.loop.rounds import errors_of
from tests.test_controller_compare import SPEC, _tiny_runner
from tests.test_loop import PLANTED, FakeGate, synthetic_loop

PAD = "stock:pad_us=20000"  # 20 ms more per step: far slower than stock on any machine


def test_in_process_timing_gives_the_worker_s_card_and_verdicts():
    """Stock against itself in the loop's process: a card with every field a worker's card has (the same code
    hash, configuration and requests), not promoted; stock against a padded stock is rejected as slower, on the
    GPU's request-by-request path and the CPU's lockstep alike."""
    runner = _tiny_runner()
    runner.warmup(parse("ar"))  # an engine the comparison does not need: dropped before timing
    mine = compare(Side("stock", REPO), Side("stock", REPO), SPEC, timeout=300, alternating=True, runner=runner)
    theirs = compare(Side("stock", REPO), Side("stock", REPO), SPEC, timeout=300, alternating=True)
    assert sorted(mine) == sorted(theirs) and sorted(mine["ab"]) == sorted(theirs["ab"])
    assert sorted(mine["aa"]) == sorted(theirs["aa"]) and sorted(mine["decision"]) == sorted(theirs["decision"])
    assert mine["ab"]["in_process"] and not theirs["ab"]["in_process"]
    for k in ("a", "b"):
        assert mine["ab"][k]["code_hash"] == theirs["ab"][k]["code_hash"] == Side("stock", REPO).expected_hash
        assert _flat(mine["ab"][k]["config"]) == _flat(theirs["ab"][k]["config"])
    assert mine["ab"]["requests"] == theirs["ab"]["requests"] and len(mine["ab"]["rows_a"]) == 4
    assert mine["ab"]["outputs_equal"] and mine["decision"]["verdict"] == "reject"
    assert sorted(runner._engines) == ["stock", "stock#1"]  # A/A: slot 1 for side B; ar's engine was dropped
    for spec in (SPEC, {**SPEC, "cpu": True}):
        card = compare(Side("stock", REPO), Side(PAD, REPO), spec, timeout=300, alternating=True, runner=runner,
                       noise=0.01, reps=3)
        assert card["ab"]["mode"] == ("lockstep" if spec.get("cpu") else "alternating")
        assert card["decision"]["verdict"] == "reject" and card["decision"]["reason"].startswith("slower")
        assert card["decision"]["upper"] < 1


def test_in_process_timing_is_only_for_the_install_s_own_systems_on_one_device(tmp_path):
    runner = _tiny_runner()
    with pytest.raises(UserError, match="controller's own install"):
        measure(Side("stock", tmp_path), Side("stock", tmp_path), SPEC, 1, None, 300, alternating=True,
                runner=runner)
    with pytest.raises(UserError, match="controller's own install"):
        measure(Side("ar", REPO), Side("stock", REPO), SPEC, 1, None, 300, runner=runner)  # two workers' mode
    with pytest.raises(UserError, match="paired"):
        compare(Side("ar", REPO), Side("stock", REPO), SPEC, noise=0.01, gpus=["0", "1"], runner=runner)


def test_an_aa_run_of_a_worker_does_not_stand_for_an_in_process_one():
    from specpilot.controller.compare import aa_mismatch

    aa = {"mode": "alternating", "clock": "worker", "in_process": False}
    assert "in a worker process" in aa_mismatch(aa, Side("stock", REPO), SPEC, "alternating", "worker", True)


def test_out_of_memory_in_process_is_an_error_and_frees_the_attempt(monkeypatch):
    """An OutOfMemoryError while timing in the loop's process: the gate's result is an error (not a refusal), and the
    engines the failed attempt built are gone once the memory was handed back."""
    import specpilot.bench.harness as harness
    import specpilot.controller.worker as worker

    runner = _tiny_runner()
    freed, engines = [], []

    def oom(cmd, runner, *a):
        engines.extend(weakref.ref(e) for e in runner._engines.values())
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(worker, "serve", oom)
    monkeypatch.setattr(harness, "free_gpu", lambda: freed.append(gc.collect()))
    gate = gate_mod.Gate(SPEC, lambda: runner, load_requests("builtin", "dev", None, 4), 8, alternating=True, reps=1,
                         in_process=True)
    got = gate.judge("stock", "stock:nodes=4")
    assert not got["promoted"] and "refused" not in got and "controller" not in got
    assert "ran out of GPU memory" in got["error"] and "CUDA out of memory" in got["error"]
    assert "stock vs stock" in got["error"]  # the A/A run was the attempt that died
    assert freed and engines and all(ref() is None for ref in engines) and runner._engines == {}


class _Exits(compare_mod.Worker):
    """A worker process that runs `code` instead of the worker script (the real Worker reads and closes it)."""

    code = ""

    def __init__(self, side, spec, gpu, timeout, also=None):
        self.side, self.timeout, self.systems = side, timeout, [side.system]
        self.proc = subprocess.Popen([sys.executable, "-c", self.code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.hello = self._read()


@pytest.mark.parametrize(("code", "timeout", "error"), [
    ("import sys; sys.stderr.write('torch.OutOfMemoryError: CUDA out of memory\\n'); sys.exit(1)", 60,
     "died (exit 1): torch.OutOfMemoryError: CUDA out of memory"),
    ("import os; os.kill(os.getpid(), 9)", 60, "died (killed by signal 9)"),
    ("import time; time.sleep(30)", 1, "timed out after 1s"),
    ("print('{\"refused\": \"verify=tlv cannot run here\"}')", 60, None),
])
def test_a_worker_that_dies_is_an_error_and_one_that_refuses_is_a_refusal(monkeypatch, code, timeout, error):
    monkeypatch.setattr(_Exits, "code", code)
    monkeypatch.setattr(compare_mod, "Worker", _Exits)
    gate = gate_mod.Gate(SPEC, lambda: None, [], 8, alternating=True, reps=1, timeout=timeout)
    got = gate.judge("stock", "stock:nodes=4")
    assert not got["promoted"] and "controller" not in got
    if error is None:
        assert "error" not in got and "refused it: verify=tlv cannot run here" in got["refused"]
    else:
        assert "refused" not in got and error in got["error"], got


class _Models:
    """The loop's models() on a GPU deployment: each build counted, each runner's close() recorded."""

    def __init__(self):
        self.built, self.closed = [], []

    def __call__(self):
        weight = torch.zeros(1, dtype=torch.bfloat16)
        runner = SimpleNamespace(target=SimpleNamespace(embed=SimpleNamespace(weight=weight)))
        runner.close = lambda r=runner: self.closed.append(r)
        self.built.append(runner)
        return runner


def _gpu_loop(tmp_path, models, gate_factory):
    loop, run, _ = synthetic_loop(tmp_path)
    loop._runner, loop.models, loop.gate_factory = None, models, gate_factory
    loop.plan = SimpleNamespace(dep=SimpleNamespace(torch_device=lambda: torch.device("cuda")))
    return loop, run


def test_the_loop_releases_its_models_for_another_tree_s_workers_and_builds_them_again(tmp_path, monkeypatch):
    """The gate asks the loop for the runner each time: after a release it gets the one built anew, never the old
    one. Another tree's workers (its outputs, the timing) and a worker timing the install's candidates start only
    while the loop holds no models; on a CPU nothing is released."""
    models = _Models()
    loop, run = _gpu_loop(tmp_path, models, lambda runner, release: gate_mod.Gate(
        SPEC, runner, [], 8, alternating=True, reps=1, release=release))
    gate = loop.gate
    assert models.built == [] and gate.runner is loop.runner and len(models.built) == 1
    first = gate.runner
    held = []

    def worker(*a, **k):  # what the loop holds while a worker loads its copy
        held.append(loop._runner)
        raise WorkerDied("worker for stock:x died (exit 1): CUDA out of memory")

    monkeypatch.setattr(gate_mod, "foreign_outputs", lambda *a, **k: held.append(loop._runner) or {})
    monkeypatch.setattr(gate_mod, "compare", worker)
    tree = gate_mod.TreeGate(gate).judge(Side("stock", tmp_path), Side("stock:x", tmp_path, "0" * 64),
                                         load_requests("builtin", "dev", None, 1), 4)
    assert held == [None, None] and models.closed == [first]
    assert tree["error"].endswith("CUDA out of memory") and not tree["promoted"] and "refused" not in tree
    again = gate.runner
    assert again is not first and again is loop.runner and len(models.built) == 2
    assert gate.judge("stock", "stock:nodes=4")["error"] and held[-1] is None  # a worker for the install's own
    cpu = _Models()
    loop, run = _gpu_loop(tmp_path / "cpu", cpu, lambda runner, release: None)
    loop.plan = SimpleNamespace(dep=SimpleNamespace(torch_device=lambda: torch.device("cpu")))
    kept = loop.runner
    loop.release()
    assert loop.runner is kept and cpu.closed == [] and len(cpu.built) == 1


def test_errors_of_finds_every_gate_s_error_wherever_the_round_keeps_it():
    gated = {"candidate": "stock:nodes=4", "promoted": False, "error": "worker died"}
    round_ = {"round": 1, "search": {"gated": [gated, {"candidate": "x", "refused": "slower"}]},
              "directions": [{"evidence": {"evaluated": [{"system": "y", "error": "cannot run"}]}, "gated": []}],
              "integration": {"gated": {"candidate": "c", "error": "timed out"}}, "tuning": {"error": 3}}
    assert errors_of(round_) == ["worker died", "timed out"]  # an evaluated system's error is not a gate's


def _failing_gate(gate: FakeGate, who: str) -> FakeGate:
    real = gate.judge

    def judge(start, cand):
        if who in cand:
            return {"candidate": cand, "start": start, "promoted": False, "error": f"worker for {cand} died"}
        return real(start, cand)

    gate.judge = judge
    return gate


def test_a_round_with_failed_gates_is_not_converged_and_a_resumed_run_measures_them_again(tmp_path):
    """Every gate fails: round 1 keeps its start, and says its gates failed instead of claiming convergence; no
    round 2. Resumed with working workers, the failed gates are measured again and the planted best is found."""
    loop, run, gate = synthetic_loop(tmp_path, rounds=3)
    _failing_gate(gate, "stock")
    with run:
        out = loop.loop()
    assert out["converged"] is None and [r["round"] for r in out["rounds"]] == [1] and out["best"] == "stock"
    assert out["errors"] and all(e.startswith("worker for stock") for e in out["errors"])
    assert out["stopped"].startswith(f"round 1 kept its start, but {len(out['errors'])} gates failed: worker for")
    loop, run, gate = synthetic_loop(tmp_path, rounds=3, resume=True)
    with run:
        again = loop.loop()
    assert again["errors"] == [] and again["best"] == PLANTED
    # the failed gates are measured again, from the top of the ranking down to the first promotion
    assert any(name.endswith("/gate") and "eagle2" in name for name in run.ran)


def test_the_loop_command_writes_its_report_and_exits_3_when_gates_failed(tmp_path, monkeypatch):
    import specpilot.loop.main as main_mod
    from tests.test_cli import specpilot

    loop, run, gate = synthetic_loop(tmp_path, rounds=2)
    _failing_gate(gate, "stock")
    monkeypatch.setattr(main_mod, "build_loop", lambda a, say: (loop, run))
    proc = specpilot("loop", "--preset", "tiny", "--run-dir", tmp_path / "run", "--rounds", "2")
    assert proc.returncode == 3, proc.stderr
    summary = json.loads((tmp_path / "run" / "loop.json").read_text())
    assert summary["errors"] and summary["converged"] is None and "gates failed" in summary["stopped"]
    assert (tmp_path / "run" / "report.md").is_file() and "error: worker for" in (tmp_path / "run" / "report.md"
                                                                                 ).read_text()
    assert "gate failed: worker for" in proc.stderr and "Traceback" not in proc.stderr
    assert "3 when a gate's timing failed" in specpilot("loop", "--help").stdout.replace("\n", " ").replace(
        "│", "").replace("  ", " ")


def test_a_sealed_final_whose_worker_dies_stops_the_loop_with_the_error(tmp_path):
    loop, run, gate = synthetic_loop(tmp_path, rounds=2)

    def timing(a, b, split=None):
        raise WorkerDied(f"worker for {b} died (killed by signal 9): no output")

    gate.timing = timing
    with run:
        out = loop.loop()
    assert out["rounds"] == [] and out["converged"] is None and out["best"] == "stock"
    assert out["errors"] == [f"worker for {PLANTED} died (killed by signal 9): no output"]
    assert out["stopped"] == f"round 1 failed: {out['errors'][0]}"
    assert not any(name.startswith("sealed/") for name in run.ran)  # nothing kept: a resumed run measures it again


def test_running_out_of_memory_in_the_float32_check_or_forcing_is_an_error_not_a_crash(monkeypatch):
    """The float32 check and forcing run in the loop's process: CUDA out of memory there is reported as a worker's
    death is (the judgement an error, the sealed final's WorkerDied), never a traceback that ends the loop."""
    import torch

    import specpilot.loop.gate as gate_mod
    from specpilot.controller.compare import WorkerDied

    class Logic:
        def __init__(self, fail):
            self.fail = fail

        def check(self, candidate, requests, tokens):
            if self.fail:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return {"verdict": "pass", "reason": "equal"}

    card = {"decision": {"verdict": "promote", "reason": "planted", "gain": 1.5, "lower": 1.4, "upper": 1.6,
                         "noise": 0.01, "bar": 1.03, "requests": 4},
            "ab": {"outputs_equal": False, "mode": "alternating", "rows_a": [], "rows_b": [], "seconds": 1.0},
            "aa": {}}
    monkeypatch.setattr(gate_mod, "compare", lambda *a, **k: card)

    def force(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")

    monkeypatch.setattr(gate_mod, "force", force)
    for fail_logic, where in ((True, "the float32 check"), (False, "token forcing")):
        g = gate_mod.Gate({"split": "dev"}, lambda: None, [object()] * 4, 16, alternating=True, reps=1,
                          logic=Logic(fail_logic))
        out = g.judge("stock", "stock:tree=best_first,nodes=32")
        assert not out["promoted"] and "refused" not in out
        assert out["error"].startswith(f"{where} of stock:tree=best_first,nodes=32 ran out of GPU memory: CUDA out")
    with pytest.raises(WorkerDied, match="token forcing .* ran out of GPU memory"):  # the sealed final's path
        g.forcing("stock:tree=best_first,nodes=32")


def test_two_trees_on_one_gpu_are_timed_one_worker_at_a_time(monkeypatch):
    """compare of two trees with spec one_copy (the TreeGate on a GPU): A's worker times every request and is
    closed before B's starts, so the device never holds the target twice; the controller's clock times each
    request; the mode an earlier A/A run must share is "one at a time"."""
    import specpilot.controller.compare as compare_mod

    alive, log = [], []

    class OneAtATime:
        def __init__(self, side, spec, gpu, timeout, also=None):
            assert not alive, f"{side.system}'s worker started while {alive[0]}'s held the device"
            alive.append(side.system)
            self.side = side
            self.hello = {"code_hash": side.expected_hash, "requests": ["r0", "r1", "r2"], "config": {}}

        def run(self, ids, side=0):
            log.append((self.side.system, ids[0]))
            return [{"id": ids[0], "tokens": list(range(9)), "decode_s": 0.1, "prefill_s": 0.01, "steps": 8}]

        def close(self):
            alive.remove(self.side.system)

    monkeypatch.setattr(compare_mod, "Worker", OneAtATime)
    a, b = Side("stock", REPO), Side("stock:tree=best_first,nodes=32", REPO)
    got = measure(a, b, {"one_copy": True}, 4, None, 60, reps=2, clock="controller")
    assert got["mode"] == "one at a time" and not alive
    assert log == [("stock", r) for r in ("r0", "r1", "r2")] * 2 + [(b.system, r) for r in ("r0", "r1", "r2")] * 2
    assert got["requests"] == ["r0", "r1", "r2"] and got["passes"] == 2
    assert all("wall_s" in r for r in got["rows_a"] + got["rows_b"])  # the controller's own clock


@pytest.mark.parametrize("gpu", [True, False])
def test_the_tree_gate_times_one_worker_at_a_time_on_a_gpu(monkeypatch, gpu):
    import specpilot.loop.gate as gate_mod
    from specpilot.datasets import load_requests

    specs = []

    def compare(a, b, spec, **kw):
        specs.append(spec)
        raise WorkerDied("stop here")

    monkeypatch.setattr(gate_mod, "compare", compare)
    monkeypatch.setattr(gate_mod, "foreign_outputs", lambda *a, **k: {})
    monkeypatch.setattr(gate_mod, "exact_arithmetic", lambda runner: False)
    gate = gate_mod.Gate(SPEC, lambda: None, [], 8, alternating=True, reps=1, in_process=gpu)
    out = gate_mod.TreeGate(gate).judge(Side("stock", REPO), Side("stock:x", REPO, "0" * 64),
                                        load_requests("builtin", "dev", None, 1), 4)
    assert out["error"] == "stop here" and specs[0].get("one_copy", False) is gpu
