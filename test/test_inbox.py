"""SegmentInbox (pure Python): dedup, in-order release, holding, timeouts, end markers, bounded memory."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.transport.inbox import SegmentInbox


def _ran(segs):
    return [(s.task_id, s.index) for s in segs if not s.refused]


def test_in_order_segments_are_released_at_once_and_duplicates_are_dropped():
    box = SegmentInbox()
    assert _ran(box.offer("t", 0, "mf(10);", now=0)) == [("t", 0)]
    assert box.is_duplicate("t", 0) and not box.is_duplicate("t", 1)
    assert box.offer("t", 0, "mf(10);", now=1) == []
    assert _ran(box.offer("t", 1, "tc(90);", is_final=True, now=1)) == [("t", 1)]
    assert box.offer("t", 1, "tc(90);", is_final=True, now=2) == []


def test_an_early_segment_is_held_until_the_gap_fills_then_released_in_order():
    box = SegmentInbox()
    assert box.offer("t", 2, "c", now=0) == []
    assert box.offer("t", 1, "b", now=0.1) == []
    assert box.held_count() == 2 and box.is_duplicate("t", 2)
    out = box.offer("t", 0, "a", now=0.2, payload="msg0")
    assert [(s.index, s.text) for s in out] == [(0, "a"), (1, "b"), (2, "c")] and out[0].payload == "msg0"
    assert box.held_count() == 0 and box.next_deadline() is None


def test_segments_whose_segment_zero_never_arrives_are_refused_after_the_timeout_with_the_reason():
    box = SegmentInbox(reorder_timeout_s=5.0)
    box.offer("x", 2, "c", now=10.0)
    box.offer("x", 1, "b", now=11.0)
    assert box.next_deadline() == 15.0
    assert box.expired(14.9) == []
    out = box.expired(15.0)
    assert [s.index for s in out] == [1, 2]
    assert all(s.refused == "segment 0 of task x never arrived within 5.0 s" for s in out)
    late = box.offer("x", 0, "a", now=16.0)  # too late: refused, never run (and never preempts anything)
    assert _ran(late) == [] and late[0].refused == "segment 0 of task x never arrived within 5.0 s"
    assert box.offer("x", 1, "b", now=17.0) == []  # a re-sent copy of a refused segment: duplicate
    assert box.expired(100.0) == []


def test_the_hold_clock_restarts_when_the_gap_partly_fills():
    box = SegmentInbox(reorder_timeout_s=1.0)
    box.offer("t", 0, "a", now=0.0)
    box.offer("t", 3, "d", now=0.0)
    box.offer("t", 1, "b", now=0.9)  # progress: now waiting for 2 since 0.9
    assert box.expired(1.5) == []
    out = box.expired(2.0)
    assert [s.index for s in out] == [3] and out[0].refused == "segment 2 of task t never arrived within 1.0 s"


def test_an_end_marker_is_released_in_order_and_closes_the_plan():
    box = SegmentInbox()
    assert box.offer("t", 2, "", is_final=True, now=0) == []  # marker: the plan ended after segment 1
    assert box.offer("t", 1, "b", now=0) == []
    out = box.offer("t", 0, "a", now=0)
    assert [(s.index, s.is_end_marker) for s in out] == [(0, False), (1, False), (2, True)]
    assert box.offer("t", 2, "", is_final=True, now=1) == []  # re-sent marker
    beyond = box.offer("t", 3, "x", now=1)
    assert _ran(beyond) == [] and "after the end of its plan (segment 1 was its last)" in beyond[0].refused


def test_a_final_segment_refuses_held_segments_beyond_it():
    box = SegmentInbox()
    box.offer("t", 0, "a", now=0)
    assert box.offer("t", 3, "d", now=0) == []
    out = box.offer("t", 2, "c", is_final=True, now=0)
    assert [(s.index, bool(s.refused)) for s in out] == [(3, True)]
    assert _ran(box.offer("t", 1, "b", now=0)) == [("t", 1), ("t", 2)]


def test_ending_a_task_refuses_its_held_segments_and_its_later_ones_keeping_the_first_reason():
    box = SegmentInbox()
    box.offer("t", 0, "a", now=0)
    box.offer("t", 2, "c", now=0)
    out = box.end_task("t", "preempted by task u")
    assert [(s.index, s.refused) for s in out] == [(2, "preempted by task u")]
    assert box.end_task("t", "other") == [] and box.ended_reason("t") == "preempted by task u"
    assert [(s.index, s.refused) for s in box.offer("t", 1, "b", now=0)] == [(1, "preempted by task u")]
    assert box.offer("t", 1, "b", now=0) == []


def test_refuse_records_the_segment_and_ends_the_task():
    box = SegmentInbox()
    box.offer("t", 1, "b", now=0)
    out = box.refuse("t", 0, "emergency stop active")
    assert [(s.index, s.refused) for s in out] == [(1, "emergency stop active")]
    assert box.is_duplicate("t", 0) and box.offer("t", 0, "a", now=0) == []


def test_memory_is_bounded_and_forgotten_held_segments_are_refused():
    box = SegmentInbox(max_tasks=3, max_per_task=2)
    box.offer("a", 1, "held", now=0)
    for t in ("b", "c", "d"):
        box.offer(t, 0, "x", now=0)
    assert box.task_count() == 3 and box.next_deadline() == float("-inf")
    out = box.expired(0)
    assert [(s.task_id, s.index) for s in out] == [("a", 1)] and "forgotten" in out[0].refused
    box.offer("e", 1, "x", now=0)
    box.offer("e", 2, "x", now=0)
    over = box.offer("e", 3, "x", now=0)
    assert len(over) == 1 and "more than 2 segments held" in over[0].refused
    assert box.held_count() == 2


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="reorder_timeout_s"):
        SegmentInbox(reorder_timeout_s=0)
    with pytest.raises(ValueError, match="index"):
        SegmentInbox().offer("t", -1)


@st.composite
def _arrivals(draw):
    """Several tasks' segments (the last one final or followed by an end marker), shuffled, with re-sends."""
    plans = {}
    for t in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 6))
        marker = draw(st.booleans())
        segs = [(f"t{t}", i, f"s{t}.{i}", not marker and i == n - 1) for i in range(n)]
        if marker:
            segs.append((f"t{t}", n, "", True))
        plans[f"t{t}"] = segs
    copies = [s for segs in plans.values() for s in segs for _ in range(draw(st.integers(1, 3)))]
    return plans, draw(st.permutations(copies))


@settings(max_examples=300, deadline=None)
@given(_arrivals())
def test_any_arrival_order_with_duplicates_releases_each_segment_once_in_index_order(data):
    plans, arrivals = data
    box = SegmentInbox(reorder_timeout_s=1000.0)
    released = []
    for now, (task, index, text, final) in enumerate(arrivals):
        out = box.offer(task, index, text, final, now=float(now))
        assert not any(s.refused for s in out)
        released.extend(out)
    assert box.expired(float(len(arrivals))) == [] and box.held_count() == 0
    for task, segs in plans.items():
        got = [(s.index, s.text, s.is_final) for s in released if s.task_id == task]
        assert got == [(i, text, final) for _, i, text, final in segs]  # exactly once each, in index order
