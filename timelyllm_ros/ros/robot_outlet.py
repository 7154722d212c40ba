"""The planner node's ROS end of each robot's link: the segment writers (:class:`RosOutlet`, the
``transport/delivery.py`` ``RobotOutlet`` a segment leaves through) and the acks, heartbeats and reports that come
back (:class:`RobotReports`, checked against the fleet key before the service hears of them). The bookkeeping of
links, readiness and re-sends is ``transport/delivery.py``'s ``Outbound``; nothing of it lives here.
"""

from __future__ import annotations

from typing import Any

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.event_handler import PublisherEventCallbacks
from rclpy.node import Node

from timelyllm_ros.msg import PlanSegment, SegmentAck, SegmentDone
from timelyllm_ros.planner.service import PlannerService
from timelyllm_ros.ros import convert, topics
from timelyllm_ros.ros.fleet_auth import FleetAuth
from timelyllm_ros.ros.topics import in_fleet
from timelyllm_ros.transport.delivery import RejectedMessages


class RosOutlet:
    """A robot's link is a RELIABLE PlanSegment writer on its segment topic; every segment is signed as it goes."""

    def __init__(self, node: Node, auth: FleetAuth) -> None:
        self._node, self._auth = node, auth

    def open(self, robot_id: str) -> Any:
        # No QoS event callbacks: with hundreds of robots their waitables slow the whole executor.
        return self._node.create_publisher(PlanSegment, in_fleet(topics.segment_topic(robot_id)), topics.RELIABLE,
                                           event_callbacks=PublisherEventCallbacks(use_default_callbacks=False))

    def ready(self, link: Any) -> bool:
        return link.get_subscription_count() > 0

    def present(self, robot_id: str) -> bool:
        return self._node.count_subscribers(topics.segment_topic(robot_id)) > 0

    def publish(self, robot_id: str, link: Any, msg: PlanSegment) -> None:
        topics.publish_or_log(link, self._auth.sign(msg), self._node.get_logger(),
                              f"segment {msg.segment_index} of {msg.task_id} to {robot_id}")

    def release(self, link: Any) -> None:
        self._node.destroy_publisher(link)


class RobotReports:
    """The robots' acks, heartbeats and SegmentDone reports, to the service. With a fleet key a message without a
    valid tag, or with a counter taken before, is refused and counted (/diagnostics: refused_<kind>_fleet_key),
    logged once per claimed sender."""

    def __init__(self, service: PlannerService, auth: FleetAuth, rejected: RejectedMessages) -> None:
        self._service, self._auth, self._rejected = service, auth, rejected

    def subscribe(self, node: Node) -> list[Any]:
        """The two subscriptions (the node destroys them with its configured state). Reports and acks in groups of
        their own: a burst of one never queues behind the other."""
        return [node.create_subscription(SegmentDone, in_fleet(topics.SEGMENT_DONE), self.segment_done,
                                         topics.REPORTS_IN, callback_group=MutuallyExclusiveCallbackGroup()),
                node.create_subscription(SegmentAck, in_fleet(topics.SEGMENT_ACKS), self.segment_ack,
                                         topics.REPORTS_IN, callback_group=MutuallyExclusiveCallbackGroup())]

    def segment_done(self, msg: SegmentDone) -> None:
        if self._refused_by_key(msg, "report"):
            return
        self._service.segment_done(msg.task_id, msg.segment_index, msg.robot_id, msg.success, msg.error,
                                   convert.time_s(msg.start) if convert.started(msg.start) else None,
                                   convert.time_s(msg.finish) if convert.started(msg.finish) else None)

    def segment_ack(self, msg: SegmentAck) -> None:
        if self._refused_by_key(msg, "heartbeat" if msg.running else "ack"):
            return
        self._service.segment_ack(msg.task_id, msg.segment_index, msg.robot_id, msg.running,
                                  convert.time_s(msg.stamp) if convert.started(msg.stamp) else None)

    def _refused_by_key(self, msg: SegmentDone | SegmentAck, kind: str) -> bool:
        why = self._auth.check(msg)
        if why is not None:
            self._rejected.note(f"{kind}_fleet_key", msg.robot_id, f"fleet key: {why}")
        return why is not None


__all__ = ["RobotReports", "RosOutlet"]
