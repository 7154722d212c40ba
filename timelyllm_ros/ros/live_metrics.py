"""Live metrics of a running planner: the same RecordBuilder as the bag analysis, fed from the topics.

    live = LiveMetrics(node)       # node spun by your executor
    ...                            # run the workload
    rows = live.summary()          # == timelyllm_ros.bags.records.bag_metrics(<bag of the same run>)
"""

from __future__ import annotations

import threading

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node

from timelyllm_ros.bags.records import RecordBuilder
from timelyllm_ros.bags.typestore import REQUESTS, SEGMENT_DONE, SEGMENTS
from timelyllm_ros.measure.metrics import Summary, summarize
from timelyllm_ros.measure.records import TaskRecord
from timelyllm_ros.msg import PlanSegment, SegmentDone, TaskRequest
from timelyllm_ros.ros.topics import DEEP, REPORTS_KEPT


class LiveMetrics:
    """Subscribes to /plan_requests, /plan_segments and /segment_done on ``node``."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._builder = RecordBuilder()
        self._lock = threading.Lock()
        self.received = 0
        group = MutuallyExclusiveCallbackGroup()
        # Reports with the robots' kept history: a robot can run (and report) its first segment before its
        # report writer has matched this reader.
        self._subs = [node.create_subscription(t, spec.name, self._on_msg, qos, callback_group=group)
                      for t, spec, qos in ((TaskRequest, REQUESTS, DEEP), (PlanSegment, SEGMENTS, DEEP),
                                           (SegmentDone, SEGMENT_DONE, REPORTS_KEPT))]

    def _on_msg(self, msg) -> None:  # noqa: ANN001 - any of the three message types
        with self._lock:
            self._builder.add(msg)
            self.received += 1

    def records(self) -> list[TaskRecord]:
        with self._lock:
            return self._builder.records()

    def summary(self) -> list[Summary]:
        return summarize(self.records())

    def destroy(self) -> None:
        for s in self._subs:
            self.node.destroy_subscription(s)
        self._subs = []


__all__ = ["LiveMetrics"]
