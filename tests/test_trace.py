"""The per-block trace of the decode kernels (kernels/trace.py): row bookkeeping here, real records on a GPU."""

import os

import pytest
import torch

if not torch.cuda.is_available():  # as in test_kernels.py: Triton decides at import whether it interprets
    os.environ.setdefault("TRITON_INTERPRET", "1")

from specpilot.kernels.trace import FIELDS, CtaTrace, slot, tracing  # noqa: E402

CUDA = torch.cuda.is_available()


def test_launches_take_consecutive_rows_and_a_reset_starts_over():
    trace = CtaTrace(torch.zeros(10, len(FIELDS), dtype=torch.int64))
    a, b = trace.slot("gemv", 4), trace.slot("attention", 6)
    a.fill_(1)
    b.fill_(2)
    assert trace.buf[:4].eq(1).all() and trace.buf[4:].eq(2).all()  # views of the buffer, no overlap
    with pytest.raises(ValueError, match="holds 10 blocks"):
        trace.slot("gemv", 1)
    recs = trace.records()
    assert [r["kind"] for r in recs] == ["gemv", "attention"] and recs[1]["end"] == [2] * 6
    trace.reset()
    assert trace.launches == [] and trace.buf.eq(0).all() and trace.slot("x", 10).data_ptr() == trace.buf.data_ptr()


def test_slot_is_off_outside_tracing_and_for_cpu_tensors():
    like = torch.ones(3)
    assert slot("gemv", 5, like) == (like, False)
    with tracing(8, device="cpu") as trace:
        rows, traced = slot("gemv", 5, like)  # a CPU tensor: the interpreter cannot read %globaltimer
        assert rows is like and not traced and trace.launches == []
        with pytest.raises(RuntimeError, match="nest"), tracing(8, device="cpu"):
            pass
    assert slot("gemv", 5, like) == (like, False)


@pytest.mark.skipif(not CUDA, reason="the records come from a GPU's clocks")
@pytest.mark.parametrize("ring", [False, True])
def test_traced_gemv_records_ordered_times_on_real_sms(ring):
    """The streaming GEMV, and (ring) gemv/staged.py's shared-memory ring, which takes bf16 weights."""
    from specpilot.kernels.gemv import choice
    from specpilot.kernels.gemv.triton import gemv_triton

    dtype = torch.bfloat16 if ring else torch.float32
    # K 4096: eight 512-column steps, more than the ring's STAGE (a ring as long as K falls back to Triton)
    x, w = torch.randn(1, 4096, device="cuda", dtype=dtype), torch.randn(4096, 4096, device="cuda", dtype=dtype)
    key = ("gemv", 4096, 4096, ("GATE_UP", False), ("HAS_BIAS", False), ("HAS_NORM", False), ("HAS_RES", False),
           ("NEXT", False), ("PRENORM", False))
    config = choice.STAGED[0] if ring else choice.CANDIDATES["gemv"][0]
    choice._CHOSEN[key] = config
    try:
        want = gemv_triton(x, w)
        with tracing(4096) as trace:
            got = gemv_triton(x, w)
            torch.cuda.synchronize()
            (rec,) = trace.records()
    finally:
        choice._CHOSEN.pop(key)
    assert torch.equal(got, want)  # tracing changes when things are written down, not what is computed
    blocks = 4096 // config["BLOCK_N"]
    assert len(rec["start"]) == blocks and rec["kind"] == "gemv 4096x4096" + (" ring" if ring else "")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for i in range(blocks):
        assert 0 < rec["start"][i] <= rec["waited"][i] <= rec["streamed"][i] <= rec["end"][i], i
        assert 0 <= rec["sm"][i] < sms


def test_summary_reads_lead_release_busy_and_rate_off_the_records():
    from specpilot.kernels.trace import by_kind, summarize

    us = 1000  # records are in nanoseconds
    a = {"kind": "gemv", "start": [0, 0, 1 * us], "waited": [0, 0, 1 * us], "streamed": [9 * us] * 3,
         "end": [10 * us, 9 * us, 10 * us], "sm": [0, 1, 0]}
    # the next launch: one block starts at 8 us (2 us early), the other at 11; the first passes its wait at 11 us
    b = {"kind": "attention", "start": [8 * us, 11 * us], "waited": [11 * us, 12 * us], "streamed": [11 * us] * 2,
         "end": [14 * us, 15 * us], "sm": [2, 3]}
    rows = summarize([a, b], {"gemv": 40_000_000})
    assert rows[0]["busy"] == 10 and rows[0]["lead"] is None and rows[0]["per_sm"] == [2, 1.5]
    assert rows[0]["tb_s"] == 4.0  # 40 MB in 10 us
    assert rows[1]["early"] == 0.5 and rows[0]["early"] is None
    assert rows[1]["lead"] == 2 and rows[1]["release"] == 1 and rows[1]["busy"] == 5 and rows[1]["tb_s"] is None
    assert 0 < rows[1]["tail"] < 1  # the 90th-percentile end sits between 14 and 15 us
    kinds = by_kind(rows + rows[1:])
    assert kinds["attention"]["launches"] == 2 and kinds["attention"]["busy_ms"] == 0.01
    assert kinds["gemv"]["per_sm_max"] == 2
