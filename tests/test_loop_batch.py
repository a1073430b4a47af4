"""The loop under regime batch: the controller times closed loops of the deployment's requests in flight, the
float32 check and forcing run the candidate batched, the batch's verify rows are searched, and the survey
measures each candidate at concurrency."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.bench.harness import Runner, closed_generate, run_closed
from specpilot.config.env import parse
from specpilot.controller.compare import REPO, Side, measure
from specpilot.controller.worker import serve, slots, units
from specpilot.datasets import Request, load_requests
from specpilot.deployment import load_deployment
from specpilot.errors import UserError
from specpilot.forcing.logic import LogicCheck
from specpilot.loop.agent import BATCH, BuiltinAgent, batch_moves
from specpilot.loop.evidence import BatchEvidence
from specpilot.loop.main import check_units
from specpilot.runtime.pair import build_pair

SPEC = {"preset": "tiny", "datasets": ["builtin"], "limit": 6, "max_new_tokens": 8}


def _batch(n: int = 2):
    dep = dataclasses.replace(load_deployment("tiny"), regime="batch", in_flight=n)
    return dep, Runner(*build_pair(dep), dep.context, slots=n)


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.sampled_from("abc"), st.integers(0, 9), min_size=1), st.integers(1, 6))
def test_units_cover_every_request_once_mixing_the_datasets(sizes, n):
    requests = {f"{d}/{i}": Request(f"{d}/{i}", d, ("x",), "dev") for d, k in sizes.items() for i in range(k)}
    got = units(requests, n)
    flat = [rid for ids in got.values() for rid in ids]
    assert sorted(flat) == sorted(requests)  # every request once
    if n == 1:
        assert got == {rid: [rid] for rid in requests}
        return
    assert all(1 <= len(ids) <= n for ids in got.values()) and all(len(ids) == n for ids in list(got.values())[:-1])
    first = next(iter(got.values()), [])  # the datasets taken in turn: the first unit holds as many as it can
    assert len({rid.split("/")[0] for rid in first}) == min(len(first), sum(1 for k in sizes.values() if k))


def test_a_worker_times_each_unit_as_one_closed_loop_of_its_requests():
    """A batch unit's row is its requests' closed loop: their tokens in order (those of the same closed loop run
    here) over its wall time; an A/A pair answers alike from two engines."""
    _, runner = _batch(2)
    requests = {r.id: r for r in load_requests("builtin", "dev", None, 4)}
    names = ["stock", "stock"]
    sides = [(parse(n), s) for n, s in zip(names, slots(names), strict=True)]
    uid, ids = next(iter(units(requests, 2).items()))
    rows = [serve({"run": [uid], "side": k}, runner, names, sides, requests, 8)["rows"] for k in (0, 1)]
    records, _ = run_closed(runner, parse("stock"), [requests[i] for i in ids], 8)
    for (row,) in rows:
        assert row["id"] == uid and row["tokens"] == [t for r in records for t in r.tokens] and row["decode_s"] > 0
    assert sorted(runner._engines) == ["stock", "stock#1"]
    out = serve({"outputs": ids, "system": "stock", "max_new_tokens": 8}, runner, names, sides, requests, 8)["rows"]
    assert [r["tokens"] for r in out] == [r.tokens for r in records]


def test_in_process_timing_of_a_batch_pairs_units_not_requests():
    _, runner = _batch(2)
    got = measure(Side("ar", REPO), Side("stock", REPO), SPEC, block=1, gpu=None, timeout=300, alternating=True,
                  runner=runner)
    assert got["requests"] == ["batch-000", "batch-001", "batch-002"]  # 6 requests, 2 in flight
    assert len(got["ratios"]) == 3 and got["outputs_equal"]  # float32: stock's batch answers as AR's does


def test_the_float32_check_runs_the_candidate_batched_against_single_request_ar(monkeypatch):
    import specpilot.forcing.logic as logic

    dep, runner = _batch(3)
    requests = load_requests("builtin", "dev", None, 5)
    groups = []
    real = logic.run_closed
    monkeypatch.setattr(logic, "run_closed", lambda r, s, reqs, n: groups.append(len(reqs)) or real(r, s, reqs, n))
    check = LogicCheck(dep, lambda: runner)
    out = check.check("stock:tree=best_first,nodes=8", requests, 12)
    assert out["verdict"] == "pass" and out["requests"] == 5 and groups == [3, 2]
    assert check.check("stock:fault=topk_truncate", requests, 12)["verdict"] == "reject"


def test_forcing_outputs_are_made_batched_and_kept_per_request():
    _, runner = _batch(2)
    requests = load_requests("builtin", "dev", None, 3)
    kept = {}
    got = closed_generate(runner)("stock", requests, 8, None, kept.__setitem__)
    records, _ = run_closed(runner, parse("stock"), requests, 8)
    assert list(got) == [r.id for r in requests] == list(kept)
    assert [rec.tokens for r in requests for rec in got[r.id]] == [rec.tokens for rec in records]


def test_a_closed_loop_never_times_the_making_of_an_engine(monkeypatch):
    """An engine dropped for another under max_engines is made again by the next closed loop: it is warmed (graphs
    captured, step costs timed) before the clock starts, each time it is made."""
    from specpilot.runtime.engine import Engine

    dep = dataclasses.replace(load_deployment("tiny"), regime="batch", in_flight=2)
    runner = Runner(*build_pair(dep), dep.context, max_engines=1, slots=2)
    events, real = [], Engine.warmup
    monkeypatch.setattr(Engine, "warmup", lambda self: (events.append(("warm", self.system.name)), real(self))[1])
    timed = run_closed.__globals__["time"].perf_counter

    def clock():
        events.append(("clock", None))
        return timed()

    monkeypatch.setattr(run_closed.__globals__["time"], "perf_counter", clock)
    requests = load_requests("builtin", "dev", None, 2)
    for name in ("stock", "ar", "stock"):  # one engine at a time: each loop makes its engine again
        before = len(events)
        run_closed(runner, parse(name), requests, 4)
        first_clock = next(i for i in range(before, len(events)) if events[i][0] == "clock")
        assert ("warm", name) in events[before:first_clock], events[before:]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["stock", "stock:tree=best_first,nodes=24", "stock:tree=ddtree,nodes=32",
                        "stock:tree=eagle2,nodes=16", "stock:batch_rows=auto", "ar"]),
       st.integers(1, 32), st.sampled_from([8, 16]))
def test_batch_moves_respect_the_options_rules(start, in_flight, block):
    moves = batch_moves(parse(start), in_flight, block)
    if in_flight < 2 or start == "ar":
        assert moves == []
        return
    assert len({m.name for m in moves}) == len(moves) and start not in {m.name for m in moves}
    for m in moves:
        parse(m.name)  # the engine's parser takes it
        budget, rows = m.get("batch_budget"), m.get("nodes") or block
        assert not (budget and m.get("batch_rows") == "auto")  # the two are exclusive
        if budget:
            assert m.get("tree") in ("best_first", "ddtree", "chain") and in_flight < budget < in_flight * rows
    assert any(m.get("admit") for m in moves)  # prompts carried in the verify passes
    auto = [m for m in moves if m.get("batch_rows") == "auto" and not m.get("admit")]
    assert any(m.get("tree") in ("best_first", "ddtree") for m in auto)  # a budget chosen each step
    assert any(m.get("tree") == parse(start).get("tree") for m in auto) == (start != "stock:batch_rows=auto")


def test_an_eagle3_stock_is_batched_as_the_tree_it_runs():
    """An EAGLE-3 drafter's stock is its release's eagle2 tree (Engine.tree), not a chain: no batch_budget over it
    (the engine refuses a budget over eagle2), best_first trees instead; every move builds an engine."""
    dep = dataclasses.replace(load_deployment("tiny-eagle3"), regime="batch", in_flight=2)
    runner = Runner(*build_pair(dep), dep.context, slots=2)
    ev = BatchEvidence(runner, [], 8, [], parse("stock"))
    runs = ev.runs(parse("stock"))
    assert runs[0] == "eagle2" and runs[1] > runner.engine(parse("stock")).block
    moves = BuiltinAgent().candidates(BATCH, parse("stock"), "cpu", runner.engine(parse("stock")).block,
                                      in_flight=2, runs=runs)
    assert not any(m.get("batch_budget") and m.get("tree") == "chain" for m in moves)
    assert any(m.get("batch_budget") and m.get("tree") == "best_first" for m in moves)
    for m in moves:
        runner.engine(m)  # none refused
    _, dflash = _batch(2)  # a DFlash drafter's systems run as their options say: the same moves either way
    ev = BatchEvidence(dflash, [], 8, [], parse("stock"))
    block = dflash.engine(parse("stock")).block
    for name in ("stock", "stock:nodes=4", "stock:tree=best_first,nodes=24"):
        start = parse(name)
        assert ({m.name for m in batch_moves(start, 2, block, ev.runs(start))} ==
                {m.name for m in batch_moves(start, 2, block)})
    assert any(m.get("batch_budget") and m.get("tree") == "chain" for m in batch_moves(parse("stock"), 2, block,
                                                                                        ev.runs(parse("stock"))))


def test_the_batch_direction_comes_first_only_with_requests_in_flight():
    agent = BuiltinAgent()
    factors = {"tau": {"value": 2.0}, "kernel": {"value": 1.5}, "overhead": {"value": 1.1}}
    assert agent.directions(factors, parse("stock"), speedup=1.5, in_flight=8)[0] == BATCH
    assert BATCH not in agent.directions(factors, parse("stock"), speedup=1.5)


def test_batch_evidence_measures_each_candidate_at_concurrency():
    _, runner = _batch(2)
    requests = load_requests("builtin", "dev", None, 4)
    ev = BatchEvidence(runner, requests, 8, [], parse("stock"), repeats=2)
    got = ev.predict(parse("stock:batch_rows=auto"))
    assert got["tau_from"] == "a closed loop of the dev requests, 2 in flight" and not ev.replayable(parse("stock"))
    assert got["speedup"] == pytest.approx(got["tokens_per_s"] / got["ar_tokens_per_s"]) and got["tau"] >= 1
    assert ev.noise(parse("ar")) >= 0 and ev.predict(parse("ar"))["speedup"] == 1.0


def test_too_few_requests_for_three_units_is_a_clear_error():
    dep = dataclasses.replace(load_deployment("tiny"), regime="batch", in_flight=4)
    reqs = [Request(f"builtin/{i}", "builtin", ("x",), "dev") for i in range(12)]
    check_units(dep, reqs, reqs, 12)  # three units of four: enough
    with pytest.raises(UserError, match="raise --limit to 12"):
        check_units(dep, reqs[:8], reqs, 8)
    with pytest.raises(UserError, match="datasets hold no more"):
        check_units(dep, reqs, reqs[:5], 12)
    check_units(load_deployment("tiny"), reqs[:1], reqs[:1], 1)  # regime single: the controller's own rule


def test_the_loop_cli_refuses_a_bad_in_flight(tmp_path):
    from tests.test_cli import specpilot

    for n, why in (("0", "--in-flight must be at least 1"), ("4", "raise --limit to 12")):
        out = specpilot("loop", "--preset", "tiny", "--in-flight", n, "--limit", "4", "--run-dir", tmp_path / "r")
        assert out.returncode == 2 and why in out.stderr and "Traceback" not in out.stderr
        assert not (tmp_path / "r" / "loop.json").exists()


@pytest.mark.slow
def test_a_loop_at_two_in_flight_runs_every_phase(tmp_path):
    """The tiny pair served two at a time: the batch direction is surveyed by closed loops, a gate times closed loops
    and checks the candidate batched in float32, and the sealed final stands on closed loops of sealed requests."""
    from tests.test_cli import specpilot

    run = tmp_path / "run"
    out = specpilot("loop", "--preset", "tiny", "--in-flight", "2", "--rounds", "1", "--budget", "400",
                    "--run-dir", run)
    assert out.returncode == 0, out.stderr
    summary = json.loads((run / "loop.json").read_text())
    first = summary["rounds"][0]
    assert first["ceiling"]["in_flight"] == 2 and "batch" in first["ceiling"]
    assert set(first["ceiling"]["batch_runs"]) == {"stock", "ar"}  # measured once: the survey reads them back
    model = first["ceiling"]["batch_model"]  # Phase 0's cost model of the batched step, at 1 and 2 in flight
    assert [r["in_flight"] for r in model["rows"]] == [1, 2] and model["at"]["in_flight"] == 2
    assert "2 in flight: `stock`'s step of" in (run / "report.md").read_text()
    assert first["search"]["start"]["speedup"] == first["ceiling"]["batch"]["speedup"]
    ranked = first["search"]["ranked"]
    assert all(e.get("tau_from", "").endswith("2 in flight") for e in ranked if "speedup" in e)
    assert any(e["direction"] == BATCH.mechanism for e in ranked)
    gated = first["search"]["gated"]
    assert gated  # each timed as three closed loops of two (6 dev requests), whole, not step by step
    assert all(g["controller"]["requests"] == 3 and g["controller"]["mode"] == "alternating" for g in gated)
    assert all(g["logic"]["verdict"] == "pass" for g in gated)  # every builder is lossless batched in float32
    if summary["best"] != "stock":
        assert "closed loops of 2 requests" in (run / "report.md").read_text()
