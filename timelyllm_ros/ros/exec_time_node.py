"""EstimateExecTime service over the execution-time model; learns from SegmentDone.

Learning needs the skills of each finished segment: the node keeps the
segments it saw on the fleet-wide /plan_segments topic and matches each
SegmentDone report to one by (task_id, segment_index).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from rclpy.node import Node

from timelyllm_ros.core.exec_model import ExecTimeModel
from timelyllm_ros.core.skills import load_skill_set
from timelyllm_ros.msg import PlanSegment, SegmentDone
from timelyllm_ros.ros.convert import time_s
from timelyllm_ros.ros.planner_node import RELIABLE
from timelyllm_ros.ros.spin import run_nodes
from timelyllm_ros.srv import EstimateExecTime

ALL_SEGMENTS_TOPIC = "/plan_segments"


class ExecTimeNode(Node):
    def __init__(self, *, models: Any = None, node_name: str = "exec_time", **kw) -> None:
        """``models``: callable robot_type -> ExecTimeModel to share (e.g. the planner core's)."""
        super().__init__(node_name, **kw)
        self.learn = self.declare_parameter("learn", True).value
        self._own: dict[str, ExecTimeModel] = {}
        self._models = models or self._own_model
        self._seen: OrderedDict[tuple[str, int], tuple[str, str]] = OrderedDict()  # -> (robot_type, text)
        self._lock = threading.Lock()
        self.create_service(EstimateExecTime, "estimate_exec_time", self._estimate)
        if models is None:  # a shared model already learns inside the planner core
            self.create_subscription(PlanSegment, ALL_SEGMENTS_TOPIC, self._segment, RELIABLE)
            self.create_subscription(SegmentDone, "/segment_done", self._done, RELIABLE)

    def _own_model(self, robot_type: str) -> ExecTimeModel:
        m = self._own.get(robot_type)
        if m is None:
            m = self._own[robot_type] = ExecTimeModel(load_skill_set(robot_type), learn=self.learn)
        return m

    def _estimate(self, req: EstimateExecTime.Request, resp: EstimateExecTime.Response) -> EstimateExecTime.Response:
        try:
            est = self._models(req.robot_type).estimate_text(req.segment_text)
        except (ValueError, KeyError, FileNotFoundError) as e:
            resp.ok, resp.error = False, f"{type(e).__name__}: {e}"
            return resp
        resp.ok, resp.min_s, resp.typical_s, resp.max_s = True, est.min_s, est.typical_s, est.max_s
        return resp

    def _segment(self, msg: PlanSegment) -> None:
        robot_type = msg.skills[0].skillset_id if msg.skills else ""
        with self._lock:
            self._seen[(msg.task_id, msg.segment_index)] = (robot_type, msg.text)
            while len(self._seen) > 10_000:
                self._seen.popitem(last=False)

    def _done(self, msg: SegmentDone) -> None:
        with self._lock:
            seen = self._seen.pop((msg.task_id, msg.segment_index), None)
        if seen is None or not msg.success or not self.learn:
            return
        robot_type, text = seen
        took = time_s(msg.finish) - time_s(msg.start)
        if took <= 0:
            return
        try:
            model = self._models(robot_type)
            model.observe(model.skillset.parse(text), took)
        except ValueError as e:
            self.get_logger().debug(f"not learning from {msg.task_id}[{msg.segment_index}]: {e}")


def main(args: list[str] | None = None) -> int:
    return run_nodes(lambda: [ExecTimeNode()], args)


if __name__ == "__main__":
    import sys

    sys.exit(main())
