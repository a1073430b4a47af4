"""Continuous batching's scheduler (runtime/scheduler.py), driven by a simulated executor: every request finishes,
a slot holds one request at a time and is reused, prompts are prefilled in order within the chunk budget, and a
request decodes only once its whole prompt is in its slot."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.runtime.scheduler import Scheduler, batch_sizes, size_for

requests = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12), st.integers(0, 30)), min_size=1, max_size=25)


def simulate(sched: Scheduler, reqs: list[tuple[int, int, int]], max_steps: int = 10_000) -> dict:
    """Runs the plans as an executor would: a request whose prompt is in needs `new` tokens, one per decode step
    (its first from the prefill's last chunk). Returns what it saw."""
    left = {rid: new for rid, (_, new, _) in enumerate(reqs)}
    seen = {"slots": {rid: set() for rid in left}, "prefill": {rid: [] for rid in left},
            "decoded": {rid: 0 for rid in left}, "admitted_at": {}, "reused": 0}
    holding: dict[int, int] = {}  # slot -> the live request in it
    for _ in range(max_steps):
        if sched.finished:
            return seen
        plan = sched.plan()
        busy = [s for s in plan.decode] + [p[0] for p in plan.prefill]
        assert len(busy) == len(set(busy)), "a slot both prefilled and decoded, or twice, in one step"
        assert sum(end - first for _, _, first, end in plan.prefill) <= sched.chunk
        for rid in plan.admitted:
            seen["admitted_at"][rid] = sched.step - 1
            slot = sched.requests[rid].slot
            assert slot not in holding, f"request {rid} took slot {slot} while {holding.get(slot)} was in it"
            holding[slot] = rid
            seen["reused"] += slot in {s for r in seen["admitted_at"] if r != rid for s in seen["slots"][r]}
        work = [(slot, rid) for slot, rid, _, _ in plan.prefill] + list(plan.decode.items())
        assert all(holding.get(slot) == rid for slot, rid in work), "a step's work in a slot its request does not hold"
        for slot, rid, first, end in plan.prefill:
            seen["slots"][rid].add(slot)
            assert first == (seen["prefill"][rid][-1][1] if seen["prefill"][rid] else 0)  # in order, no gap
            seen["prefill"][rid].append((first, end))
            if end == reqs[rid][0]:  # the prompt is in: its first token
                left[rid] -= 1
                if left[rid] == 0:
                    sched.finish(rid)
                    del holding[slot]
        for slot, rid in plan.decode.items():
            seen["slots"][rid].add(slot)
            assert seen["prefill"][rid] and seen["prefill"][rid][-1][1] == reqs[rid][0]
            seen["decoded"][rid] += 1
            left[rid] -= 1
            if left[rid] == 0:
                sched.finish(rid)
                del holding[slot]
    raise AssertionError("the requests did not finish")


@settings(max_examples=60, deadline=None)
@given(reqs=requests, slots=st.integers(1, 6), chunk=st.integers(1, 50))
def test_every_request_finishes_alone_in_one_slot(reqs, slots, chunk):
    sched = Scheduler(slots, chunk)
    for rid, (prompt, _, arrival) in enumerate(reqs):
        sched.submit(rid, prompt, arrival)
    seen = simulate(sched, reqs)
    for rid, (prompt, new, arrival) in enumerate(reqs):
        assert len(seen["slots"][rid]) == 1  # one slot for its whole life
        assert seen["decoded"][rid] == new - 1  # the first token came from the prefill
        assert seen["prefill"][rid][-1][1] == prompt
        assert seen["admitted_at"][rid] >= arrival  # never before it arrived
    if len(reqs) > slots:
        assert seen["reused"]  # a slot a finished request held was taken again


@settings(max_examples=40, deadline=None)
@given(reqs=requests, slots=st.integers(1, 6), chunk=st.integers(1, 50), per_slot=st.integers(1, 8))
def test_with_a_cap_a_slot_every_prefilling_slot_gets_at_most_the_cap_and_every_request_finishes(reqs, slots, chunk,
                                                                                                per_slot):
    sched = Scheduler(slots, chunk, per_slot)  # prompt admission: a step's rows a slot
    for rid, (prompt, _, arrival) in enumerate(reqs):
        sched.submit(rid, prompt, arrival)
    seen = simulate(sched, reqs)
    for rid, (prompt, new, _) in enumerate(reqs):
        assert all(0 < end - first <= per_slot for first, end in seen["prefill"][rid])
        assert seen["prefill"][rid][-1][1] == prompt and seen["decoded"][rid] == new - 1


def test_arrival_order_is_kept_and_late_requests_wait():
    sched = Scheduler(1, 100)
    sched.submit(0, 3, arrival=5)
    sched.submit(1, 3, arrival=0)
    assert sched.plan().admitted == [1]
    sched.finish(1)
    for _ in range(4):  # steps 1..4
        assert sched.plan().idle  # request 0 has not arrived
    assert sched.plan().admitted == [0]


def test_a_long_prompt_is_prefilled_in_chunks_beside_decoding():
    sched = Scheduler(2, 4)
    sched.submit(0, 2)
    sched.submit(1, 10)
    first = sched.plan()
    assert first.prefill == [(0, 0, 0, 2), (1, 1, 0, 2)]
    second = sched.plan()
    assert second.decode == {0: 0} and second.prefill == [(1, 1, 2, 6)]


@pytest.mark.parametrize("bad", [(0, 4), (2, 0), (2, 4, 0)])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ValueError):
        Scheduler(*bad)


def test_a_request_is_submitted_once_and_finished_once():
    sched = Scheduler(1, 8)
    sched.submit(0, 2)
    with pytest.raises(ValueError):
        sched.submit(0, 2)
    sched.plan()
    sched.finish(0)
    with pytest.raises(ValueError):
        sched.finish(0)


@given(st.integers(1, 300))
def test_batch_sizes_cover_every_slot_with_the_smallest_size_that_holds_it(slots):
    sizes = batch_sizes(slots)
    assert sizes[-1] == slots and list(sizes) == sorted(set(sizes)) and sizes[0] >= 1
    assert all(b - a <= 8 for a, b in zip(sizes, sizes[1:], strict=False))  # at most 7 idle rows a step
    for highest in range(slots):
        n = size_for(highest, sizes)
        assert n > highest and not any(highest < m < n for m in sizes)


@settings(max_examples=60, deadline=None)
@given(reqs=requests, slots=st.integers(1, 4), chunk=st.integers(1, 50), gone=st.data())
def test_a_cancelled_request_leaves_at_once_and_the_others_finish(reqs, slots, chunk, gone):
    sched = Scheduler(slots, chunk)
    for rid, (prompt, _, arrival) in enumerate(reqs):
        sched.submit(rid, prompt, arrival)
    cancel_at = {rid: gone.draw(st.integers(0, 30)) for rid in range(len(reqs)) if gone.draw(st.booleans())}
    left = {rid: new for rid, (_, new, _) in enumerate(reqs)}
    cancelled, holder = set(), {}
    for step in range(5000):
        if sched.finished:
            break
        for rid, at in cancel_at.items():
            if at == step and rid not in cancelled and not sched.requests[rid].done:
                slot = sched.cancel(rid)
                assert slot == holder.pop(rid, None)  # the slot it held, None where it waited
                cancelled.add(rid)
        plan = sched.plan()
        for rid in plan.admitted:
            assert rid not in cancelled
            holder[rid] = sched.requests[rid].slot
        for slot, rid, _, end in plan.prefill:
            assert rid not in cancelled and holder[rid] == slot
            if end == reqs[rid][0]:
                left[rid] -= 1
        for slot, rid in plan.decode.items():
            assert rid not in cancelled and holder[rid] == slot
            left[rid] -= 1
        assert len(holder) <= slots and len(set(holder.values())) == len(holder)  # a slot holds one request
        for rid in [r for r in holder if left[r] <= 0]:
            sched.finish(rid)
            del holder[rid]
    assert sched.finished
    assert all(left[rid] <= 0 for rid in range(len(reqs)) if rid not in cancelled)
    assert sched.cancel(0) is None  # done already: nothing to free
