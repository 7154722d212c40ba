"""The planner node's intake of goals (issue 39: a flood must not starve a real goal, and every goal is answered):

* each goal is screened as it arrives (:meth:`PlannerService.screen`: the planner's state, the request's fields,
  the intake limits of ``planner/intake.py``); a refusal is answered at once with its reason, without a goal
  handle (``BatchedActionServer``'s ``screen``), so a flood costs a response per goal and nothing kept;
* the goals taken at one wake-up are handled robots the planner serves first, then by falling beta;
* every request, refused or not, is recorded on /plan_requests; refusals are logged once per robot id, within a
  line budget (rclpy's logger costs about a millisecond a line: logging each refusal was most of intake's time).
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any

from action_msgs.msg import GoalStatus

from timelyllm_ros.domain.types import TaskResult, TaskStatus
from timelyllm_ros.planner.service import PlannerService
from timelyllm_ros.planner.service_io import Accepted, GoalError, PlanRequest
from timelyllm_ros.ros import convert
from timelyllm_ros.ros.actions import complete_goal
from timelyllm_ros.transport.delivery import RejectedMessages, RobotLinks


class GoalIntake:
    """Requests into the service, for the planner node: a goal enters the planner here, at rclpy's two callbacks
    (:meth:`screen` before a goal handle exists, :meth:`accepted` once it does). ``record(msg)`` publishes a
    TaskRequest on /plan_requests; ``log`` is the node's logger; ``finish(handles, result)`` completes goal
    handles with a result (the node's, which every result goes out through)."""

    def __init__(self, service: PlannerService, robots: RobotLinks, bridge: convert.ClockBridge, record: Any,
                 log: Any, finish: Callable[[list[Any], TaskResult], None]) -> None:
        self._service, self._robots, self._bridge, self._record = service, robots, bridge, record
        self._log, self._finish = log, finish
        self.refused = RejectedMessages(log.warning)  # refused goals, counted per kind, logged once per robot id

    def order(self, goal: Any) -> tuple[int, float]:
        """A goal's place among those taken together: robots this planner serves first, then by falling beta."""
        try:
            beta = convert.tuf_request(goal.tuf).resolve().beta
        except ValueError:
            beta = 0.0
        known = self._robots.has(goal.robot_id) or goal.robot_id in self._service.intake.limits.robot_ids
        return (0 if known else 1, -beta)

    def screen(self, goal: Any) -> tuple[int, Any] | None:
        """None: the goal may be planned (the action server makes its handle); else its final answer (action status,
        PlanTask.Result), sent at once."""
        self._service.arrived(id(goal))  # its arrival: the earliest moment the goal is ours
        req, request = self._request(goal.task_id, goal.robot_id, goal.robot_type, goal.task, goal.tuf, None,
                                     goal.stamp)
        try:
            self._service.screen(request)
        except GoalError as e:
            self._service.arrival(id(goal))  # its stamp is not kept
            self._service.taken_in()  # (an idle engine gathering a burst no longer waits for it)
            self._refused(req, goal.robot_id, e, goal.task_id)
            return GoalStatus.STATUS_ABORTED, convert.refused_result(goal.task_id, e.status, str(e))
        return None

    def accepted(self, goal_handle: Any) -> None:
        """rclpy's handle_accepted callback for a goal :meth:`screen` let through: into the service. A refusal
        (INVALID or BUSY, with the reason), a failure, or a retry of a finished task's result goes back on the
        handle at once."""
        g = goal_handle.request
        try:
            acc = self.accept(g.task_id, g.robot_id, g.robot_type, g.task, g.tuf,
                              arrival=self._service.arrival(id(g)), stamp=g.stamp, goal=goal_handle, screened=True)
        except GoalError as e:
            self._service.taken_in()
            self._complete(goal_handle, convert.refused_result(g.task_id, e.status, str(e)), e.status)
            return
        except Exception as e:  # noqa: BLE001 - the robot must hear why, whatever broke
            self._service.taken_in()
            self._log.error(f"goal from {g.robot_id!r} failed before planning: {e!r}")
            self._complete(goal_handle, convert.refused_result(g.task_id, TaskStatus.FAILED, f"planner error: {e}"),
                           TaskStatus.FAILED)
            return
        self._service.taken_in()
        if acc.result is not None:  # a retry of a finished task: its result again
            self._finish([goal_handle], acc.result)

    def _complete(self, goal_handle: Any, out: Any, status: TaskStatus) -> None:
        complete_goal(goal_handle, out, succeeded=status is TaskStatus.DONE, cancelled=status is TaskStatus.CANCELLED,
                      log=self._log)

    def accept(self, task_id: str, robot_id: str, robot_type: str, task: str, tuf: Any, *,
               arrival: float | None = None, stamp: Any = None, goal: Any = None, waiter: queue.Queue | None = None,
               screened: bool = False) -> Accepted:
        """PlannerService.accept; every request, refused or not, is published on /plan_requests (a retry that joins
        its task is not a new request)."""
        req, request = self._request(task_id, robot_id, robot_type, task, tuf, arrival, stamp)
        try:
            acc = self._service.accept(request, goal=goal, waiter=waiter, screened=screened)
        except GoalError as e:
            self._refused(req, robot_id, e, e.task_id)
            raise
        if not acc.joined:
            req.task_id, req.accepted = acc.task_id, True
            self._record(req)
        return acc

    def _request(self, task_id: str, robot_id: str, robot_type: str, task: str, tuf: Any, arrival: float | None,
                 stamp: Any) -> tuple[Any, PlanRequest]:
        """The /plan_requests record and the service's request of one goal."""
        arrival = self._service.now() if arrival is None else arrival
        sent = stamp if stamp is not None and convert.started(stamp) else None
        req = convert.task_request_msg(self._bridge.to_msg(arrival), task_id, robot_id, robot_type, task, tuf, sent)
        return req, PlanRequest(task_id, robot_id, robot_type, task, convert.tuf_request(tuf), arrival,
                                None if sent is None else convert.time_s(sent))

    def _refused(self, req: Any, robot_id: str, e: GoalError, task_id: str) -> None:
        req.task_id, req.error, req.status = task_id, str(e), convert.status_code(e.status)
        self._record(req)
        self.refused.note("goal", robot_id, str(e))


__all__ = ["GoalIntake"]
