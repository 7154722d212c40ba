"""After a restart, a task whose robot may still be running its plan is adopted again (issue 39, item 8): the
planner had refused that robot's heartbeats and reports ('unknown task'), so a later failure could not revise the
task's result. A PlannerService without ROS (test/service_stack.py) over the real journal."""

from __future__ import annotations

from service_stack import ServiceStack
from waiting import wait_until

from timelyllm_ros.domain.types import TaskStatus

CAT = "Scene: [] Task: [A] Could you find the cat?"


def _published(stack: ServiceStack, task_id: str) -> bool:
    """The task ended DONE and its result went out (after every segment it was sent: one callback queue)."""
    return any(r.task_id == task_id and r.status is TaskStatus.DONE for r in list(stack.sender.results))


def test_a_task_that_ended_done_while_its_robot_ran_it_is_readopted_after_a_restart(tmp_path):
    state = tmp_path / "state"
    params = dict(state_dir=str(state), robot_timeout_s=0.0, delivery_timeout_s=600.0)
    first = ServiceStack(**params)
    try:
        tid, refusal = first.send(first.request("drone_0", CAT, task_id="t-run"))
        assert refusal is None
        # generation ended DONE; the robot acknowledged its first segment and runs it (no report yet)
        assert wait_until(lambda: _published(first, "t-run"), 30)
        sent = [i for t, _, i, _ in first.sender.segments if t == "t-run"]
        assert sent and sent == list(range(len(sent))), sent
        first.service.segment_ack("t-run", 0, "drone_0", False, None)
    finally:
        first.close()  # the planner goes away: what it journaled is what a restarted one finds
    second = ServiceStack(**params)
    try:
        # the robot's heartbeat and then its report of a failure count: the result is revised
        second.service.segment_ack("t-run", 0, "drone_0", True, None)
        second.service.segment_done("t-run", 0, "drone_0", False, "motor failure", None, None)
        assert second.rejected.snapshot() == {}, second.rejected.snapshot()
        assert second.core.result("t-run").status is TaskStatus.ROBOT_FAILED
        revised = [r for r in second.sender.results if r.task_id == "t-run"]
        assert [r.status for r in revised] == [TaskStatus.ROBOT_FAILED], revised  # its DONE not published again
        assert "motor failure" in revised[0].reason
        assert second.journal_status("t-run") == TaskStatus.ROBOT_FAILED.value
        # a report from another robot for it still counts for nothing
        second.service.segment_done("t-run", 1, "mallory", True, "", None, None)
        assert second.rejected.snapshot() == {"report": 1}
    finally:
        second.close()


def test_a_task_whose_robot_reported_everything_is_not_readopted(tmp_path):
    params = dict(state_dir=str(tmp_path / "state"), robot_timeout_s=0.0, delivery_timeout_s=600.0)
    first = ServiceStack(**params)
    try:
        first.send(first.request("drone_1", CAT, task_id="t-over"))
        assert wait_until(lambda: _published(first, "t-over"), 30)
        for _, _, i, _ in [x for x in first.sender.segments if x[0] == "t-over"]:
            first.service.segment_done("t-over", i, "drone_1", True, "", None, None)
    finally:
        first.close()
    second = ServiceStack(**params)
    try:
        assert second.core.task_status("t-over") is None  # nothing more to hear of it: only journaled
        assert second.service.lookup("t-over").state == "done"
    finally:
        second.close()
