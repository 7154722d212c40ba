"""The robot's end of the delivery contract (``docs/contract.md``), one implementation for every node that runs
segments: an executor (its own robot) and the simulated fleet (all of its robots). They keep only what differs: how
a segment is run.

* the segment subscription of each robot (``/<robot_id>/plan_segments``, RELIABLE), every copy admitted through the
  :class:`~timelyllm_ros.ros.segment_gate.SegmentGate` first (the planner's writer, the fleet key): a refused one is
  neither handled nor acknowledged;
* an ack on ``/segment_acks`` for every admitted copy (duplicates, end markers and refused segments too: the planner
  re-sends until acknowledged), whatever handling it did;
* a duplicate of a segment already reported is answered with the same report again (the planner re-sent it: it has
  no report for it, e.g. it restarted);
* heartbeats: while a segment runs its ack is re-sent with ``running=true`` every ``heartbeat_period_s``;
* SegmentDone reports, signed, kept in the robot's :class:`~timelyllm_ros.transport.session.RobotSession` for
  re-sent copies.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from rclpy.node import Node

from timelyllm_ros.msg import PlanSegment, SegmentAck, SegmentDone
from timelyllm_ros.ros.convert import segment_ack_msg, segment_done_msg
from timelyllm_ros.ros.fleet_auth import PARAMETER as FLEET_KEY
from timelyllm_ros.ros.fleet_auth import PARAMETER_DOC as FLEET_KEY_DOC
from timelyllm_ros.ros.fleet_auth import FleetAuth
from timelyllm_ros.ros.params import declare
from timelyllm_ros.ros.segment_gate import ADMIT, SegmentGate
from timelyllm_ros.ros.topics import (
    RELIABLE,
    REPORTS,
    REPORTS_KEPT,
    SEGMENT_ACKS,
    SEGMENT_DONE,
    publish_or_log,
    segment_topic,
)
from timelyllm_ros.transport.session import Arrival, RobotSession


class RobotEndpoint:
    """The delivery contract's robot side for ``node``. Declares ``fleet_key_file`` (read-only); ``planner_node``:
    whose segments run (SegmentGate); ``topic``: how a topic name is passed to rclpy (the executors' absolute names,
    the fleet's ``in_fleet``)."""

    def __init__(self, node: Node, planner_node: str, *, topic: Callable[[str], str] = str) -> None:
        self._node, self._topic, self._log = node, topic, node.get_logger()
        self.auth = FleetAuth.from_file(str(declare(node, FLEET_KEY, "", FLEET_KEY_DOC, read_only=True)))
        self.gate = SegmentGate(node, planner_node, self._log.error, self._log.debug, self.auth)
        self._done_pub = node.create_publisher(SegmentDone, topic(SEGMENT_DONE), REPORTS_KEPT)
        self._ack_pub = node.create_publisher(SegmentAck, topic(SEGMENT_ACKS), REPORTS)

    def subscribe(self, robot_id: str, handle: Callable[[PlanSegment, float], None], acks: deque[tuple[str, int]],
                  **kw: Any) -> Any:
        """``robot_id``'s segments: each copy the gate admits goes to ``handle(msg, received wall time)`` and is then
        acknowledged, even if ``handle`` raised; ``acks`` records what was acknowledged. ``kw``: to
        ``create_subscription`` (callback group, event callbacks)."""

        def received(msg: PlanSegment, info: dict) -> None:  # two parameters: rclpy passes MessageInfo
            now = time.time()
            if self.gate.check(robot_id, msg, info) != ADMIT:
                return  # neither run nor acknowledged: the planner re-sends what is really its own
            try:
                handle(msg, now)
            finally:  # every received copy is acknowledged: duplicates, end markers and refused ones too
                acks.append((msg.task_id, msg.segment_index))
                ack = segment_ack_msg(msg.task_id, robot_id, msg.segment_index, now)
                publish_or_log(self._ack_pub, self.auth.sign(ack), self._log,
                               f"{robot_id}'s ack of {msg.task_id}[{msg.segment_index}]")

        return self._node.create_subscription(PlanSegment, self._topic(segment_topic(robot_id)), received, RELIABLE,
                                              **kw)

    def receive(self, robot_id: str, session: RobotSession, msg: PlanSegment, now: float, refuse: str = "") -> Arrival:
        """``session.receive`` of an admitted copy; a duplicate already reported is answered with its report again."""
        arrival = session.receive(msg.task_id, msg.segment_index, msg.text, msg.is_final, now, msg, refuse=refuse)
        if arrival.duplicate and arrival.report is not None:
            self._publish_report(robot_id, arrival.report)
        return arrival

    def start_heartbeats(self, period_s: float, running: Callable[[], list[tuple[str, str, int]]], **kw: Any) -> None:
        """Every ``period_s`` (0 = off) each (robot, task, index) of ``running()`` re-sends its ack with
        ``running=true``, so the planner tells a slow skill from a dead robot. ``kw``: to ``create_timer``."""
        if period_s > 0:
            self._node.create_timer(period_s, lambda: self._heartbeats(running()), **kw)

    def _heartbeats(self, running: list[tuple[str, str, int]]) -> None:
        now = time.time()
        for robot_id, task_id, index in running:
            publish_or_log(self._ack_pub, self.auth.sign(segment_ack_msg(task_id, robot_id, index, now, running=True)),
                           self._log, f"{robot_id}'s heartbeat of {task_id}[{index}]")

    def report(self, robot_id: str, session: RobotSession, task_id: str, index: int, start: float | None,
               finish: float, ok: bool, error: str) -> None:
        """SegmentDone with the real start and finish wall times (``start`` None: it never started, a zero stamp on
        the wire), kept in ``session`` for a re-sent copy."""
        report = segment_done_msg(task_id, robot_id, index, start, finish, ok, error)
        session.reports.put(task_id, index, report)
        self._publish_report(robot_id, report)

    def _publish_report(self, robot_id: str, report: SegmentDone) -> None:
        publish_or_log(self._done_pub, self.auth.sign(report), self._log,
                       f"{robot_id}'s report of {report.task_id}[{report.segment_index}]")


__all__ = ["RobotEndpoint"]
