"""ros/convert.py, the one home of our messages and status mappings (test_package: test_*_have_one_home): the
mappings answer as the code they replaced did, message by message (no DDS)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("rclpy")
from builtin_interfaces.msg import Duration, Time  # noqa: E402

from timelyllm_ros.domain.types import STATUS_CODE, TaskStatus  # noqa: E402
from timelyllm_ros.msg import PlanResult, TimeUtility  # noqa: E402
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
