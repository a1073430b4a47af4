"""The tree gate on the tiny deployment, fed by stand-in agents' frozen commits: a logit bias, an output cache and
made-up timings are each refused, with the reason (AR's outputs, the repeat check, the reported share of the
controller's clock), as is a checkout changed after its hash was taken. (The honest mechanism's promotion, sealed
final and memory entry: tests/test_agents_loop.py.)"""

import os

import pytest

from specpilot.agents.backends import Budget, backend
from specpilot.agents.guards import Seal
from specpilot.agents.session import AgentSetup, run_agent
from specpilot.agents.worktree import checkout, freeze, remove
from specpilot.bench.harness import Runner
from specpilot.controller.compare import REPO, Side
from specpilot.controller.worker import code_hash
from specpilot.datasets import load_requests
from specpilot.deployment import load_deployment
from specpilot.loop.gate import Gate, TreeGate
from specpilot.runtime.pair import build_pair
from tests.test_agents_gallery import drop_ref

pytestmark = pytest.mark.slow
BIN = REPO / "specpilot" / "fixtures" / "agents" / "bin"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The base commit, its checkout (the start's side), a gate over tiny's models, and a way to get a stand-in's
    candidate as a checked-out side."""
    root = tmp_path_factory.mktemp("judged")
    base = freeze(REPO, "HEAD", "tests: the agents' base").commit
    start = checkout(REPO, base, root / "start")
    dep = load_deployment("tiny")
    target, drafter, tok = build_pair(dep)
    requests = load_requests("builtin", "dev", None, 3)
    spec = {"preset": "tiny", "datasets": ["builtin"], "split": "dev", "limit": 3, "max_new_tokens": 32,
            "data_dir": None, "cpu": True, "threads": len(os.sched_getaffinity(0))}
    seal = Seal.take(REPO / "specpilot", [])
    runner = Runner(target, drafter, tok, dep.context)
    gate = Gate(spec, lambda: runner, requests, 32, alternating=True, reps=2, seal=seal)
    made = [start]

    def candidate(name):
        setup = AgentSetup(backend(f"command:{BIN / name}"), REPO, root / "agents", Budget(60, 5), seal, [],
                           use_jail=False)
        report = run_agent(setup, name, base, {"direction": {"factor": "tau", "mechanism": "m", "options": [],
                                                             "value": 1.0}, "target": "--preset tiny",
                                               "start": "stock", "ceiling": {}, "memory": []})
        remove(REPO, root / "agents" / name)
        drop_ref(report["frozen"]["commit"])
        (c,) = report["candidates"]
        path = checkout(REPO, c["commit"], root / c["commit"][:12])
        made.append(path)
        return report, c, Side(c["system"], path, code_hash(path / "specpilot"))

    yield base, Side("stock", start, code_hash(start / "specpilot")), TreeGate(gate), candidate
    for p in made:
        remove(REPO, p)


def test_a_logit_bias_is_refused_on_ar_s_outputs(world):
    _, start, gate, candidate = world
    _, _, side = candidate("lossy")
    g = gate.judge(start, side)
    assert not g["promoted"] and "differ from AR" in g["refused"]


def test_an_output_cache_is_refused_by_the_repeat_check(world):
    _, start, gate, candidate = world
    _, _, side = candidate("cache")
    g = gate.judge(start, side)
    assert not g["promoted"] and "faster than the first time" in g["refused"]
    assert g["tamper"]["repeat"]["b"] > 3 * g["tamper"]["repeat"]["a"]


def test_made_up_timings_are_refused_by_the_controller_s_clock(world):
    _, start, gate, candidate = world
    _, _, side = candidate("fake_timings")
    g = gate.judge(start, side)
    assert not g["promoted"] and "timings are not its own" in g["refused"]
    assert g["controller"]["gain"] < 1.2  # the controller's clock saw no gain at all


def test_a_worker_that_imports_other_code_than_the_checkout_is_refused(world, tmp_path):
    _, start, gate, candidate = world
    _, _, side = candidate("honest")
    (side.source / "specpilot" / "planted.py").write_text("X = 1\n")  # changed after the hash was taken
    g = gate.judge(start, side)
    assert not g["promoted"] and "code hash" in g["refused"]
