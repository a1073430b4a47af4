"""Forcing's outputs made elsewhere give the same report as made in this process: by worker processes
(forcing/parallel.py), or kept by an earlier run in a folder (forcing/outputs.py)."""

import json

import pytest
import torch

from specpilot.bench.harness import Runner, TurnRecord
from specpilot.datasets import load_requests
from specpilot.deployment import load_deployment
from specpilot.forcing import parallel
from specpilot.forcing.outputs import OutputStore, described
from specpilot.forcing.parallel import pool_for
from specpilot.forcing.run import force
from specpilot.runtime.pair import build_pair


@pytest.fixture(scope="module")
def tiny():
    dep = load_deployment("tiny")
    target, drafter, tok = build_pair(dep)
    return dep, target, drafter, tok, load_requests("builtin", "dev", None, 3)


@pytest.mark.slow
def test_workers_give_the_same_report_as_this_process(tiny, tmp_path, monkeypatch):
    """One request at a time to whichever of two workers is free; each request's records kept as they come."""
    dep, target, drafter, tok, requests = tiny
    monkeypatch.setattr(parallel, "CHUNK", 1)
    here = force(Runner(target, drafter, tok, dep.context), "stock", "stock:block_size=2", requests, 12)
    store = OutputStore(tmp_path, described(dep))
    with pool_for(2, "tiny", None, ["stock", "stock:block_size=2", "ar"], requests) as procs:
        turns = []
        there = force(Runner(target, drafter, tok, dep.context), "stock", "stock:block_size=2", requests, 12,
                      progress=lambda: turns.append(1), generate=procs.generate, store=store)
    assert there["systems"] == here["systems"] and there["verdict"] == here["verdict"]
    assert there["systems"]["candidate"]["tokens"] > 0 and len(turns) == 3 * len(requests)
    roles = {"reference": "stock", "candidate": "stock:block_size=2", "ar": "ar"}
    assert all(len(store.get(r, s, 12)) == len(requests) for r, s in roles.items())
    assert pool_for(1, "tiny", None, ["stock"], requests) is None
    # two systems on a CPU: the workers do not warm up the controller's lockstep timing (it needs a budget they lack)
    with pool_for(2, "tiny", None, ["ar", "ar:graphs=false", "ar"], requests[:1]) as procs:
        got = procs.generate("ar:graphs=false", requests[:1], 4)
    assert [len(r.tokens) for r in got[requests[0].id]] == [4] * len(requests[0].turns)


def test_a_second_run_takes_the_kept_outputs_and_scores_them_again(tiny, tmp_path):
    dep, target, drafter, tok, requests = tiny
    store = OutputStore(tmp_path, described(dep))
    first = force(Runner(target, drafter, tok, dep.context), "stock", "stock:block_size=2", requests, 12,
                  store=store)
    runner = Runner(target, drafter, tok, dep.context)
    runner.run = lambda *a, **k: pytest.fail("a kept output was made again")
    turns = []
    again = force(runner, "stock", "stock:block_size=2", requests, 12, progress=lambda: turns.append(1),
                  store=OutputStore(tmp_path, described(dep)))
    assert again["systems"] == first["systems"] and len(turns) == 3 * len(requests)
    # other code, another deployment or budget: nothing is found
    assert OutputStore(tmp_path, described(dep), code="other").get("reference", "stock", 12) == {}
    assert OutputStore(tmp_path, "another", code=store.code).get("reference", "stock", 12) == {}
    assert store.get("reference", "stock", 13) == {} and len(store.get("reference", "stock", 12)) == len(requests)


def test_a_pool_starts_no_worker_when_every_output_is_kept(tiny, tmp_path):
    """Scoring kept outputs again (under another exact target, say) costs no worker start-up."""
    dep, target, drafter, tok, requests = tiny
    store = OutputStore(tmp_path, described(dep))
    first = force(Runner(target, drafter, tok, dep.context), "stock", "stock:block_size=2", requests, 12,
                  store=store)
    with pool_for(2, "tiny", None, ["stock", "stock:block_size=2", "ar"], requests) as procs:
        again = force(Runner(target, drafter, tok, dep.context), "stock", "stock:block_size=2", requests, 12,
                      generate=procs.generate, store=OutputStore(tmp_path, described(dep)))
        assert procs.workers == []
    assert again["systems"] == first["systems"]


def test_the_key_names_the_machine_the_outputs_were_made_on(tiny, monkeypatch):
    """`device = "auto"` reads the same everywhere: what it resolves to here, and the torch, are in the key."""
    dep = tiny[0]
    here = json.loads(described(dep))["resolved"]
    assert here == {"device": "cpu", "dtype": str(dep.torch_dtype()), "torch": torch.__version__}
    before = described(dep)
    monkeypatch.setattr(torch, "__version__", "0.0-other")
    assert described(dep) != before


def test_a_torn_last_line_is_skipped_and_the_next_one_kept(tmp_path):
    store = OutputStore(tmp_path, "d", code="c")
    rec = TurnRecord("r1#turn1", "builtin", 1, [1, 2], [3, 4], 0.0, 0.5, [1, 1])
    store.put("ar", "ar", 8, "r1", [rec])
    path = store.path("ar", "ar", 8)
    with path.open("a") as f:
        f.write('{"request": "r2", "tur')  # a kill in the middle of a write
    later = OutputStore(tmp_path, "d", code="c")
    assert list(later.get("ar", "ar", 8)) == ["r1"] and later.get("ar", "ar", 8)["r1"] == [rec]
    later.put("ar", "ar", 8, "r3", [rec])
    assert list(OutputStore(tmp_path, "d", code="c").get("ar", "ar", 8)) == ["r1", "r3"]
    assert json.loads(path.with_suffix(".key.json").read_text())["system"] == "ar"


@pytest.mark.slow
def test_the_force_command_with_workers_and_no_deployment_named(tmp_path):
    """`force --workers 2` alone: the workers load the deployment the command defaults to (tiny), as it does."""
    from tests.test_cli import specpilot

    proc = specpilot("force", "--candidate", "stock:block_size=2", "--limit", "1", "--max-new-tokens", "4",
                     "--workers", "2", "--power-bound", "0", "--json", tmp_path / "f.json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "f.json").read_text())
    assert report["systems"]["candidate"]["tokens"] > 0
    # what ran: the budget, the requests' selection and each role's complete system
    dep = load_deployment("tiny")
    assert report["max_new_tokens"] == 4 and report["limit"] == 1 and report["power_bound"] == 0
    assert report["datasets"] == list(dep.datasets) and report["split"] == dep.split
    records = report["system_records"]
    assert [records[r]["system"] for r in ("reference", "candidate", "ar")] == ["stock", "stock:block_size=2", "ar"]
    assert records["candidate"]["options"]["block_size"] == 2 and records["candidate"]["changed"] == ["block_size"]
    assert "plan" in records["ar"] and records["reference"]["changed"] == []


def test_a_candidate_named_as_its_reference_never_reads_the_reference_s_outputs(tiny, tmp_path):
    """`force --reference X --candidate X --outputs DIR`: the role is in the key, so the candidate is a second run
    of X, kept apart; never the reference's kept outputs fed back to it. The reference's file here holds another
    system's outputs (a logit bias): read as the candidate's, they would agree with the reference everywhere."""
    from specpilot.config.env import parse

    dep, target, drafter, tok, requests = tiny
    runner = Runner(target, drafter, tok, dep.context)
    store = OutputStore(tmp_path, described(dep))
    planted = {r.id: runner.run(parse("stock:fault=logit_bias"), r, 8) for r in requests}
    own = {r.id: runner.run(parse("stock"), r, 8) for r in requests}
    assert any([t.tokens for t in planted[i]] != [t.tokens for t in own[i]] for i in own)  # the premise
    for rid, recs in planted.items():
        store.put("reference", "stock", 8, rid, recs)
    report = force(runner, "stock", "stock", requests, 8, store=store)
    assert report["agreement"]["equal"] < len(requests)
    kept = OutputStore(tmp_path, described(dep))
    assert {i: [t.tokens for t in r] for i, r in kept.get("candidate", "stock", 8).items()} == {
        i: [t.tokens for t in r] for i, r in own.items()}
    assert {i: [t.tokens for t in r] for i, r in kept.get("reference", "stock", 8).items()} == {
        i: [t.tokens for t in r] for i, r in planted.items()}
    assert kept.path("reference", "stock", 8) != kept.path("candidate", "stock", 8)
    assert json.loads(kept.path("candidate", "stock", 8).with_suffix(".key.json").read_text())["role"] == "candidate"
