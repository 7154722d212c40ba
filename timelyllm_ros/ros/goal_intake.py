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
from typing import Any

from action_msgs.msg import GoalStatus

from timelyllm_ros.planner.service import PlannerService
from timelyllm_ros.planner.service_io import Accepted, GoalError, PlanRequest
from timelyllm_ros.ros import convert
from timelyllm_ros.transport.delivery import RejectedMessages, RobotLinks


class GoalIntake:
    """Requests into the service, for the planner node. ``record(msg)`` publishes a TaskRequest on /plan_requests;
    ``warn`` is the node's logger's warning."""

    def __init__(self, service: PlannerService, robots: RobotLinks, bridge: convert.ClockBridge, record: Any,
                 warn: Any) -> None:
        self._service, self._robots, self._bridge, self._record = service, robots, bridge, record
        self.refused = RejectedMessages(warn)  # refused goals, counted per kind, logged once per robot id

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
            self._refused(req, goal.robot_id, e, goal.task_id)
            return GoalStatus.STATUS_ABORTED, convert.refused_result(goal.task_id, e.status, str(e))
        return None

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
