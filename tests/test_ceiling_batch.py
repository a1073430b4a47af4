"""Phase 0's cost model of a batched step (ceiling/batch.py): weights read once for all requests, everything else
once a request; where the speculative step turns from bytes-bound to FLOP-bound, speculation's ceiling over batched
AR falls; the loop's report says it."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.ceiling.batch import batch_model, batched, from_inputs, seconds, weight_bytes
from specpilot.ceiling.floors import StepShape, ar_batch, floors
from specpilot.fixtures.random_models import tiny_drafter_config, tiny_target_config
from specpilot.loop.report import _batch_model_lines

# an 8B-class target (Llama-3-8B's shape) and a one-layer drafter on it; H100-like rates (bytes/s, FLOP/s)
BIG = tiny_target_config(vocab=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                         num_kv_heads=8, head_dim=128)
DRAFTER = tiny_drafter_config(BIG, block_size=16, target_layer_ids=[1, 15, 29])
BW, FR = 3.0e12, 6.5e14
SHAPE = StepShape(rows=16, context=1024, draft_rows=16, ctx_rows=2.1, depth=15, width=8, tree=False)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 64), rows=st.integers(1, 64))
def test_many_requests_read_the_weights_once_and_all_else_once_each(n, rows):
    shape = dataclasses.replace(SHAPE, rows=rows)
    one = floors(BIG, DRAFTER, shape)
    weights = weight_bytes(BIG, DRAFTER, 2)
    many = batched(one, weights, n)
    for k, f in one.items():
        w = weights.get(k, 0.0)
        assert many[k].bytes == pytest.approx(w + n * (f.bytes - w)) and many[k].flops == pytest.approx(n * f.flops)
        assert f.bytes >= w  # a class reads at least its weights
    assert batched(one, weights, 1) == one
    ar = batched(floors(BIG, None, StepShape(1, 1024)), weight_bytes(BIG, None, 2), n)
    assert seconds(ar, BW, FR) == pytest.approx(seconds(ar_batch(BIG, n, 1024), BW, FR))  # floors' own AR batch


def test_past_some_concurrency_the_step_is_flop_bound_and_the_ceiling_falls():
    rows = batch_model(BIG, DRAFTER, SHAPE, 2.1, BW, FR)
    assert [r["in_flight"] for r in rows] == [1, 8, 16, 24, 32, 48, 64]
    assert rows[0]["bound"] == rows[0]["ar_bound"] == "bytes" and rows[-1]["bound"] == "flops"
    assert rows[-1]["ar_bound"] == "bytes"  # 64 rows of AR still read more than they compute
    ceilings = [r["speedup_ceiling"] for r in rows]
    assert ceilings == sorted(ceilings, reverse=True) and ceilings[0] > 1.5 > ceilings[-1]
    one = rows[0]
    assert one["speedup_ceiling"] == pytest.approx(2.1 * one["ar_floor_s"] / one["step_floor_s"])


def test_the_model_of_a_measured_system_at_the_deployments_concurrency_and_the_report_line():
    inputs = {"systems": {"stock": {"shape": dataclasses.asdict(SHAPE)}}, "bench": {"stock": {"tau": 2.1}},
              "machine": {"bytes_s": BW, "flop_s": FR}}
    m = from_inputs(inputs, "stock", BIG, DRAFTER, 20)
    assert [r["in_flight"] for r in m["rows"]] == [1, 8, 16, 20] and m["at"]["in_flight"] == 20
    summary = {"rounds": [{"round": 1, "ceiling": {"system": "stock", "speedup": 1.3, "batch_model": m}},
                          {"round": 2, "ceiling": {"system": "stock"}}]}
    (line,) = _batch_model_lines(summary)
    assert line.startswith("Round 1, 20 in flight: `stock`'s step of 320 rows") and "measured 1.300" in line
    assert f"{m['at']['speedup_ceiling']:.2f}x over batched AR at tau 2.10" in line
