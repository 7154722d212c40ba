"""ros/convert.py, the one home of our messages and status mappings (test_package: test_*_have_one_home): the
mappings answer as the code they replaced did, message by message (no DDS)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("rclpy")
from builtin_interfaces.msg import Duration, Time  # noqa: E402

from timelyllm_ros.domain.types import STATUS_CODE, TaskStatus  # noqa: E402
from timelyllm_ros.msg import PlanResult, TimeUtility  # noqa: E402
from timelyllm_ros.planner.service_io import EndMarker  # noqa: E402
from timelyllm_ros.ros import convert  # noqa: E402
from timelyllm_ros.srv import GetPlanResult, Plan  # noqa: E402


def test_plan_refusals_keep_their_codes():
    """/plan: BUSY for a planner that cannot take the call now, REJECTED for a refused request, FAILED when the
    planner broke."""
    cases = {TaskStatus.BUSY: Plan.Response.STATUS_BUSY, TaskStatus.INVALID: Plan.Response.STATUS_REJECTED,
             TaskStatus.OVERDUE: Plan.Response.STATUS_REJECTED, TaskStatus.FAILED: Plan.Response.STATUS_FAILED}
    for status, code in cases.items():
        resp = convert.plan_refusal(Plan.Response(), status, f"why {status}")
        assert (resp.status, resp.error) == (code, f"why {status}")


def test_diagnostics_count_each_result_code_as_before():
    before = {PlanResult.STATUS_OVERDUE: "overdue", PlanResult.STATUS_FAILED: "failed",  # diagnostics.py's table
              PlanResult.STATUS_ROBOT_FAILED: "robot_failed", PlanResult.STATUS_REJECTED: "rejected",
              PlanResult.STATUS_BUSY: "busy", PlanResult.STATUS_CANCELED: "cancelled", 200: "failed"}
    for code, kind in before.items():
        assert convert.outcome_kind(PlanResult(status=code), ert=1.0) == kind
    done = PlanResult(status=STATUS_CODE[TaskStatus.DONE], response_time=Duration(sec=1, nanosec=500_000_000))
    assert convert.outcome_kind(done, ert=None) == "on_time"
    assert convert.outcome_kind(done, ert=1.5) == "on_time"
    assert convert.outcome_kind(done, ert=1.4) == "late"


def test_lookup_states_read_as_the_planner_names_them():
    for state, name in ((GetPlanResult.Response.STATE_DONE, "done"), (GetPlanResult.Response.STATE_ACTIVE, "active"),
                        (GetPlanResult.Response.STATE_UNKNOWN, "unknown"), (77, "unknown")):
        assert convert.lookup_state(GetPlanResult.Response(state=state)) == name


def test_goals_and_results_carry_every_field():
    tuf = convert.tuf_msg("urgent", -0.5, 2.0, 3.0)
    assert tuf == TimeUtility(level="urgent", alpha=-0.5, beta=2.0, ert=3.0)
    g = convert.goal_msg("t", "drone_0", "drone", "find the cat", tuf, Time(sec=5))
    assert (g.task_id, g.robot_id, g.robot_type, g.task, g.tuf, g.stamp) == ("t", "drone_0", "drone",
                                                                             "find the cat", tuf, Time(sec=5))
    bare = convert.goal_msg("t", "drone_0")
    assert (bare.robot_type, bare.task, bare.tuf, bare.stamp) == ("", "", TimeUtility(), Time())
    assert convert.result_request("t").task_id == "t"
    pr = PlanResult(status=5, message="m", task_id="t", plan_text="p", response_time=Duration(sec=2),
                    response_time_from_send=2.5, utility=0.25, num_segments=3)
    r = convert.result_from_plan_result(pr)
    assert (r.status, r.message, r.task_id, r.plan_text, r.response_time, r.response_time_from_send, r.utility,
            list(r.segments)) == (5, "m", "t", "p", Duration(sec=2), 2.5, 0.25, [])


def test_scheduler_state_reads_the_ranked_queue():
    queue = [{"task_id": "a", "robot_id": "r", "k": 0, "priority": 1.5, "slack_s": math.inf, "waiting_s": 0.25},
             {"task_id": "b", "robot_id": "s", "k": 2, "priority": -math.inf, "slack_s": -1.0, "waiting_s": math.nan}]
    msg = convert.scheduler_state_msg(Time(sec=3), "pud", queue, ["a"], {"tasks": 2, "done": 7}, [0.1, 0.002])
    assert (msg.stamp, msg.policy, list(msg.running_task_ids), msg.tasks_active, msg.tasks_done) == (
        Time(sec=3), "pud", ["a"], 2, 7)
    assert msg.last_decision_time_s == 0.002
    a, b = msg.queue
    assert (a.task_id, a.robot_id, a.segment_index, a.suspended, a.priority, a.slack_s, a.waiting_s) == (
        "a", "r", 0, False, 1.5, 0.0, 0.25)  # an infinite figure reads 0: every reader gets a finite field
    assert (b.segment_index, b.suspended, b.priority, b.slack_s, b.waiting_s) == (2, True, 0.0, -1.0, 0.0)
    assert convert.scheduler_state_msg(Time(), "fifo", [], [], {"tasks": 0, "done": 0}, []).last_decision_time_s == 0


# -- one PlanSegment builder: a segment journaled by a planner that died goes out again as it went out live -------
def test_one_plan_segment_builder():
    """Segments, end markers, results' and /get_plan_result's segments, live or from the journal: one constructor
    fills every field (the journaled copy once lacked the stamp and the deadline)."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(convert.__file__).read_text())
    made = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "PlanSegment"]
    assert len(made) == 1, made
    marker = convert.end_marker_msg("t", "r", 3, Time(sec=9))
    assert (marker.segment_index, marker.text, list(marker.skills), marker.is_final, marker.stamp_generated,
            marker.predicted_execution, marker.next_segment_deadline) == (3, "", [], True, Time(sec=9), Duration(),
                                                                          Time())


CAT = "Scene: [] Task: [A] Could you find the cat?"
DOOR = "Scene: [] Task: [E] go to the door"
WIRE = ("task_id", "robot_id", "segment_index", "text", "is_final", "predicted_execution")


def _same_segment(live, again, *, deadline: bool = True) -> None:
    for f in WIRE:
        assert getattr(again, f) == getattr(live, f), (f, getattr(live, f), getattr(again, f))
    assert [(c.name, list(c.args), c.skillset_id) for c in again.skills] == \
        [(c.name, list(c.args), c.skillset_id) for c in live.skills]
    # the same instants; a restarted planner maps them through its own clock offset (a float's last bits)
    for f in ("stamp_generated", "next_segment_deadline") if deadline else ("stamp_generated",):
        assert convert.started(getattr(live, f)), (f, "unset on the live segment")
        assert abs(convert.time_s(getattr(again, f)) - convert.time_s(getattr(live, f))) < 1e-6, f


def _finished(stack, task_id: str) -> bool:
    return any(r.task_id == task_id and r.status is TaskStatus.DONE for r in list(stack.sender.results))


def _answer(stack, task_id: str) -> list:
    """/get_plan_result's segments for ``task_id``."""
    found = stack.service.lookup(task_id)
    return convert.fill_plan_result(GetPlanResult.Response(), task_id, found, stack.bridge, Time()).segments


def test_the_segments_a_restarted_planner_sends_again_carry_their_stamp_and_deadline(tmp_path):
    """Re-sent from the journal after a restart, a segment is the PlanSegment that went out live (its stamp and
    next-segment deadline too), and /get_plan_result answers from the journal with the segments it gave before."""
    from service_stack import ServiceStack
    from waiting import wait_until

    params = dict(state_dir=str(tmp_path / "state"), robot_timeout_s=0.0, delivery_timeout_s=600.0)
    first = ServiceStack(bridge=convert.ClockBridge(), **params)
    try:
        first.send(first.request("drone_0", CAT, task_id="t-run"))
        first.send(first.request("drone_1", CAT, task_id="t-over"))
        first.send(first.request("drone_2", DOOR, task_id="t-end"))  # its plan ends with an end marker
        assert wait_until(lambda: all(_finished(first, t) for t in ("t-run", "t-over", "t-end")), 30)
        markers = [convert.end_marker_msg(tid, "drone_2", i, first.bridge.to_msg(at))
                   for tid, i, at in first.sender.end_markers if tid == "t-end"]
        assert len(markers) == 1
        live = {seg.index: convert.segment_msg(tid, "drone_0", seg, first.bridge, sid)
                for tid, seg, sid in first.sender.sent if tid == "t-run"}
        assert live and sorted(live) == list(range(len(live)))
        first.service.segment_ack("t-run", 0, "drone_0", False, None)  # received, not reported: the robot runs it
        # t-over: every segment reported, each when predicted (one reported later moves the predictions after it
        # in the restored chain, while a finished task's live result keeps those its segments were sent with)
        for seg in [s for tid, s, _ in first.sender.sent if tid == "t-over"]:
            end = first.core.result("t-over").segments[seg.index].pred_end
            first.service.segment_done("t-over", seg.index, "drone_1", True, "", first.bridge.to_wall(end - 0.5),
                                       first.bridge.to_wall(end))
        answered = _answer(first, "t-over")
    finally:
        first.close()
    second = ServiceStack(bridge=convert.ClockBridge(), **params)  # a new process: its own clock offset
    try:
        again = {seg.index: convert.segment_msg(tid, "drone_0", seg, second.bridge, sid)
                 for tid, seg, sid in second.sender.resent_journaled if tid == "t-run"}
        marker_again = [convert.end_marker_msg(tid, "drone_2", m.index, second.bridge.to_msg(m.generated))
                        for tid, m, _ in second.sender.resent_journaled if isinstance(m, EndMarker)]
        assert len(marker_again) == 1
        _same_segment(markers[0], marker_again[0], deadline=False)
        assert marker_again[0].next_segment_deadline == markers[0].next_segment_deadline == Time()  # none follows
        assert sorted(again) == sorted(live)[1:]  # the ones never acknowledged
        for i, msg in again.items():
            _same_segment(live[i], msg)
        assert second.core.result("t-over") is None  # all reported: not re-adopted, known to the journal alone
        journaled = _answer(second, "t-over")
        assert len(journaled) == len(answered) > 0
        for before, after in zip(answered, journaled, strict=True):
            _same_segment(before, after)
    finally:
        second.close()
