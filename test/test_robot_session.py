"""RobotSession (pure Python): the robot half of delivery that the executors and the simulated fleet share."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.transport.session import RobotSession


@dataclass(frozen=True)
class Seg:  # what a host offers as payload (the PlanSegment message's fields the session reads)
    task_id: str
    segment_index: int
    text: str
    is_final: bool = False


def offer(ses: RobotSession, task: str, index: int, text: str, final: bool = False, now: float = 0.0, **kw):
    return ses.receive(task, index, text, final, now, Seg(task, index, text, final), **kw)


def drain(ses: RobotSession) -> list[tuple[str, int]]:
    """Run everything queued, each segment succeeding, as a host's worker would."""
    ran = []
    while (p := ses.next()) is not None:
        if p.is_final and not p.text:
            ses.reached_end(p.task_id)
            continue
        ran.append((p.task_id, p.segment_index))
        assert ses.ran(p.task_id, p.segment_index, p.is_final, True) == []
    return ran


def test_a_plan_runs_in_order_once_and_a_duplicate_gets_its_report_again():
    ses = RobotSession()
    assert offer(ses, "t", 1, "tc(90);", final=True).refused == []
    assert drain(ses) == []  # held: segment 0 has not come
    offer(ses, "t", 0, "mf(10);")
    assert drain(ses) == [("t", 0), ("t", 1)] and not ses.task_open
    ses.reports.put("t", 0, "report-0")
    dup = offer(ses, "t", 0, "mf(10);")
    assert dup.duplicate and dup.report == "report-0" and ses.next() is None


def test_segment_zero_of_another_task_preempts_the_active_one_and_refuses_its_rest():
    ses = RobotSession()
    offer(ses, "old", 0, "mf(10);")
    offer(ses, "old", 1, "mf(10);")
    assert ses.next().segment_index == 0  # running when the urgent task comes
    out = offer(ses, "new", 0, "mu(50);")
    assert out.preempted == "preempted by task new"
    assert [(r.payload.task_id, r.payload.segment_index, r.reason) for r in out.refused] == [
        ("old", 1, "preempted by task new")]
    late = offer(ses, "old", 2, "mf(10);", final=True)  # the old task's later segments are refused
    assert [r.payload.segment_index for r in late.refused] == [2] and not late.preempted
    assert drain(ses) == [("new", 0)]


def test_a_task_whose_plan_ran_to_its_end_is_not_preempted():
    ses = RobotSession()
    offer(ses, "a", 0, "mf(10);")
    offer(ses, "a", 1, "", final=True)  # an end marker: the plan ended after segment 0
    assert drain(ses) == [("a", 0)] and not ses.task_open
    out = offer(ses, "b", 0, "mf(10);")
    assert not out.preempted and out.refused == []
    assert not offer(ses, "c", 0, "", final=True).preempted  # an empty plan preempts nothing


def test_a_failed_segment_ends_its_task_and_an_emergency_refuses_what_is_queued():
    ses = RobotSession()
    for i in range(3):
        offer(ses, "t", i, "mf(10);")
    offer(ses, "t", 4, "mf(10);", final=True)  # held behind the missing 3
    p = ses.next()
    refused = ses.ran(p.task_id, p.segment_index, False, False, "motor fault")
    assert [r.payload.segment_index for r in refused] == [4, 1, 2]  # the held one, then the queue
    assert all("motor fault" in r.reason for r in refused) and not ses.task_open and ses.next() is None
    offer(ses, "u", 0, "mf(10);")
    offer(ses, "u", 1, "mf(10);")
    assert [r.payload.segment_index for r in ses.end_all("emergency stop")] == [0, 1] and not ses.task_open
    assert ses.end_all("emergency stop") == []  # nothing active, nothing queued


def test_the_failure_of_a_preempted_segment_does_not_end_the_task_that_preempted_it():
    """The executor's worker reports the running segment of a preempted task failed after the new task took the
    robot: that must not end the new one."""
    ses = RobotSession()
    offer(ses, "old", 0, "mf(10);")
    running = ses.next()
    offer(ses, "new", 0, "mu(50);")
    offer(ses, "new", 1, "mu(50);", final=True)
    assert ses.ran(running.task_id, running.segment_index, False, False, "preempted by task new") == []
    assert ses.task == "new" and ses.task_open and drain(ses) == [("new", 0), ("new", 1)]


def test_a_refused_segment_zero_of_another_task_neither_preempts_nor_takes_the_robot():
    ses = RobotSession()
    offer(ses, "a", 0, "mf(10);")
    out = offer(ses, "b", 0, "mu(50);", refuse="emergency stop active")
    assert not out.preempted and [r.payload.task_id for r in out.refused] == ["b"]
    assert ses.task == "a" and ses.task_open and drain(ses) == [("a", 0)]


def test_a_queued_end_marker_of_a_preempted_task_is_refused_with_it():
    ses = RobotSession()
    offer(ses, "a", 0, "mf(10);")
    offer(ses, "a", 1, "", final=True)  # queued behind segment 0, which runs
    ses.next()
    out = offer(ses, "b", 0, "mu(50);")
    assert [(r.payload.task_id, r.payload.segment_index) for r in out.refused] == [("a", 1)]


def test_a_segment_the_host_refuses_ends_the_task_with_the_reason():
    ses = RobotSession()
    out = offer(ses, "t", 0, "mf(10);", refuse="emergency stop active")
    assert [r.reason for r in out.refused] == ["emergency stop active"] and ses.next() is None
    assert [r.payload.segment_index for r in offer(ses, "t", 1, "mf(10);").refused] == [1]


def test_held_segments_of_a_gap_that_never_fills_are_refused_after_the_timeout():
    ses = RobotSession(reorder_timeout_s=5.0)
    offer(ses, "t", 1, "mf(10);", now=10.0)
    assert ses.expire(14.0) == []
    (r,) = ses.expire(15.5)
    assert r.payload.segment_index == 1 and "segment 0" in r.reason and "never arrived" in r.reason


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 3), st.sampled_from(["", "run", "fail"])),
                max_size=40))
def test_every_segment_is_run_refused_or_still_waiting_exactly_once(ops):
    """Any interleaving of copies of three tasks' segments (duplicates, gaps, preemptions with work queued,
    failures), the robot running one queued segment now and then: every distinct (task, index) offered is run,
    refused or still held or queued -- exactly one of these -- and a task's run segments are in index order."""
    ses = RobotSession()
    ran, refused = [], []
    for task, index, then in ops:
        out = offer(ses, task, index, "mf(10);", final=index == 3)
        refused += [(r.payload.task_id, r.payload.segment_index) for r in out.refused]
        if then and (p := ses.next()) is not None:
            ran.append((p.task_id, p.segment_index))
            refused += [(r.payload.task_id, r.payload.segment_index)
                        for r in ses.ran(p.task_id, p.segment_index, p.is_final, then == "run", "fault")]
    waiting = [(p.task_id, p.segment_index) for p in ses.queue]
    seen = set(ran) | set(refused) | set(waiting)
    waiting += [(t, i) for t in "abc" for i in range(4)
                if (t, i) not in seen and ses.inbox.is_duplicate(t, i)]  # held: known to the inbox, not released
    offered = {(t, i) for t, i, _ in ops}
    assert sorted(ran + refused + waiting) == sorted(offered)  # each exactly once
    for task in "abc":
        idx = [i for t, i in ran if t == task]
        assert idx == sorted(idx)
