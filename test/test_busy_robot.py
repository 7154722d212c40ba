"""One task per robot (scheduler docstring, docs/contract.md "Robots and safety"): a higher-beta task preempts, an equal
or lower one waits its turn; the simulator's robots follow the same rule, and the figures credit only
segments a robot started."""

import math

from test_scheduler import drain, make_core, spec

from timelyllm_ros.domain.clock import SimClock
from timelyllm_ros.domain.types import TaskStatus
from timelyllm_ros.measure.metrics import summarize, to_markdown
from timelyllm_ros.measure.records import SegRecord, TaskRecord
from timelyllm_ros.sim.simulator import Simulator
from timelyllm_ros.sim.workloads import Job, Workload


def on_robot(i, robot, **kw):
    s = spec(i, **kw)
    s.robot_id = robot
    return s


def step_until(core, clock, cond, limit=2000):
    for _ in range(limit):
        if cond():
            return
        rep = core.start_step()
        if rep is not None:
            clock.advance(rep.duration_s)
            core.complete_step(rep)
        else:
            clock.set(max(core.next_wakeup() or clock.now() + 0.1, clock.now()))
    raise AssertionError("condition never held")


def test_an_equal_task_waits_until_the_robot_reported_the_plan_in_progress():
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    core.submit(on_robot(0, "r", plan="mf(50);"))
    core.submit(on_robot(1, "r", plan="tc(30);"))
    drain(core, clock)
    # t0 generated and ended; t1 was not generated while the robot runs t0's plan.
    assert [(t, i) for t, i, _ in segs] == [("t0", 0)]
    assert [r.task_id for r in results] == ["t0"] and core.task_status("t1") is TaskStatus.QUEUED
    assert core.snapshot()["waiting_for_robot"] == 1
    clock.advance(3.0)
    core.report_segment_done("t0", 0, finish_time=clock.now())
    drain(core, clock)
    assert [(t, i) for t, i, _ in segs] == [("t0", 0), ("t1", 0)]
    t1 = next(r for r in results if r.task_id == "t1")
    assert t1.status is TaskStatus.DONE
    # its response time counts from its arrival, the wait for the robot included
    assert t1.response_time > 3.0 and t1.utility < 0


def test_an_urgent_task_preempts_a_normal_one_still_generating():
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    core.submit(on_robot(0, "r", plan="mf(50);tc(30);mu(20);"))
    step_until(core, clock, lambda: segs)  # t0's segment 0 is on the robot, the rest not generated
    core.submit(on_robot(1, "r", plan="mb(100);", level="urgent"))
    drain(core, clock)
    by_id = {r.task_id: r for r in results}
    assert by_id["t0"].status is TaskStatus.CANCELLED and "preempted by task t1" in by_id["t0"].reason
    assert by_id["t1"].status is TaskStatus.DONE
    assert [(t, i) for t, i, _ in segs] == [("t0", 0), ("t1", 0)]  # nothing more of t0 was sent


def test_an_urgent_task_revises_a_finished_plan_the_robot_reports_it_did_not_finish():
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    core.submit(on_robot(0, "r", plan="mf(50);"))
    drain(core, clock)
    assert results[-1].status is TaskStatus.DONE
    core.submit(on_robot(1, "r", plan="mb(100);", level="urgent"))
    drain(core, clock)
    assert core.result("t1").status is TaskStatus.DONE  # the robot went to t1 at once
    assert core.result("t0").status is TaskStatus.DONE  # no evidence yet that t0 did not run to the end
    # the robot reports the segment it dropped for t1: revised, with the preemption as the reason
    core.report_segment_done("t0", 0, success=False, error="preempted by task t1")
    revised = [r for r in results if r.task_id == "t0"]
    assert [r.status for r in revised] == [TaskStatus.CANCELLED, TaskStatus.CANCELLED]  # (one object, published twice)
    assert "preempted by task t1 (beta" in revised[-1].reason


def test_a_finished_plan_the_robot_ran_to_the_end_before_the_urgent_task_came_stays_done():
    """The robot had finished t0 when t1 arrived; its report was still on the way."""
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    core.submit(on_robot(0, "r", plan="mf(50);"))
    drain(core, clock)
    core.submit(on_robot(1, "r", plan="mb(100);", level="urgent"))
    drain(core, clock)
    core.report_segment_done("t0", 0, finish_time=clock.now() - 0.01)
    assert [r.status for r in results if r.task_id == "t0"] == [TaskStatus.DONE]
    assert core.result("t0").status is TaskStatus.DONE and core.result("t1").status is TaskStatus.DONE
    assert not core.ownership.preempted


def test_a_normal_task_waits_behind_an_urgent_one_and_a_cancel_while_waiting_answers():
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    core.submit(on_robot(0, "r", plan="mf(50);", level="urgent"))
    core.submit(on_robot(1, "r", plan="tc(30);"))
    core.submit(on_robot(2, "r", plan="tc(60);"))
    drain(core, clock)
    assert {t for t, _, _ in segs} == {"t0"}
    assert core.cancel("t1")
    assert core.result("t1").status is TaskStatus.CANCELLED
    core.report_segment_done("t0", 0, finish_time=clock.now() + 2.0)
    drain(core, clock)
    assert [t for t, _, _ in segs] == ["t0", "t2"]
    assert core.snapshot()["waiting_for_robot"] == 0


def test_of_the_tasks_waiting_for_a_robot_the_urgent_one_goes_first():
    """Had the urgent one arrived when the normal one owned the robot, it would have preempted it."""
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    core.submit(on_robot(0, "r", plan="mf(50);", level="urgent"))
    core.submit(on_robot(1, "r", plan="tc(30);"))  # waits (lower beta)
    core.submit(on_robot(2, "r", plan="mb(100);", level="urgent"))  # waits (equal beta), arrived later
    drain(core, clock)
    core.report_segment_done("t0", 0, finish_time=clock.now() + 1.0)
    drain(core, clock)
    assert [t for t, _, _ in segs] == ["t0", "t2"]
    core.report_segment_done("t2", 0, finish_time=clock.now() + 1.0)
    drain(core, clock)
    assert [t for t, _, _ in segs] == ["t0", "t2", "t1"]
    assert core.snapshot()["waiting_for_robot"] == 0


def test_restored_after_a_restart_the_task_that_had_the_robot_keeps_it():
    """The journal restores tasks oldest first: an older task that was waiting must not take the robot from
    the later one whose plan was already on it."""
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    core.submit(on_robot(0, "r", plan="tc(30);mf(50);", level="urgent"))
    step_until(core, clock, lambda: segs)
    restored_segments = list(core.generation("t0").segments)  # what was on the robot when the planner died
    core2, segs2, results2 = make_core(clock=clock)
    core2.restore(on_robot(1, "r", plan="mb(100);"), [])  # older, waiting when the planner died
    core2.restore(on_robot(0, "r", plan="tc(30);mf(50);", level="urgent"), restored_segments)
    drain(core2, clock)
    assert {t for t, _, _ in segs2} == {"t0"}, segs2  # t1 was not generated behind t0's back
    assert core2.snapshot()["waiting_for_robot"] == 1
    for seg in core2.result("t0").segments:
        core2.report_segment_done("t0", seg.index, finish_time=clock.now() + 1.0)
    drain(core2, clock)
    assert [t for t, _, _ in segs2][-1] == "t1"


def test_other_robots_are_not_held_back():
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    core.submit(on_robot(0, "a", plan="mf(50);"))
    core.submit(on_robot(1, "b", plan="mf(50);"))
    drain(core, clock)
    assert sorted(t for t, _, _ in segs) == ["t0", "t1"]


def _job(jid, t, agent, trace_id, tuf):
    return Job(job_id=jid, trigger_time=t, agent_id=agent, trace_id=trace_id, task_input=f"task {jid}",
               exe_time_detail=[], tuf=tuf)


def test_simulated_robot_stops_for_an_urgent_task_and_the_preempted_segments_never_count():
    # find_cat (normal, beta 1) on agent 0, then prevent_collision (urgent, beta 2) on the same agent while it runs.
    wl = Workload("busy", [_job(0, 0.0, 0, 0, [1.0, 1.0, 1.5]), _job(1, 3.0, 0, 6, [2.0, 0.2, 0.5]),
                           _job(2, 3.5, 0, 1, [1.0, 1.0, 1.5])], {})
    res = Simulator(wl).run()
    normal, urgent, later = res.records
    assert normal.status == "cancelled" and urgent.status == "done" and later.status == "done"
    assert normal.served  # its first segment ran before the urgent task came
    cut = [s for s in normal.segments if s.preempted]
    assert cut and all(s.preempted == "preempted by task j1" for s in cut)
    assert all(not s.started or s.end <= urgent.segments[0].start for s in normal.segments)
    # the robot ran one task at a time: no two started segments overlap
    spans = sorted((s.start, s.end) for r in res.records for s in r.ran)
    assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:], strict=False))
    # the later normal task waited for the urgent plan to end
    assert later.segments[0].start >= urgent.ran[-1].end
    assert "nan" not in to_markdown(summarize(res.records))


def test_a_task_none_of_whose_segments_started_is_a_miss_with_no_utility():
    rec = TaskRecord(0, 7, "evade_animal", "drone", "urgent", 0, arrival=0.0, alpha=-2.0 / 0.3, beta=2.0, ert=0.2,
                     status="cancelled")
    rec.segments.append(SegRecord(0, "d(3);", 1, dispatch=0.1, recv=0.11, preempted="preempted by task x"))
    assert not rec.served and rec.missed
    assert rec.utility() is None and rec.total_utility() is None and rec.utility_all() == 0.0
    assert rec.response_time is None and rec.completion_time is None
    (row, *_) = summarize([rec])
    assert row.served == 0 and row.miss_rate == 1.0 and math.isnan(row.utility)
    table = to_markdown(summarize([rec]))
    assert "nan" not in table and "| - |" in table
