"""EstimateExecTime service over the execution-time model; learns from SegmentDone.

Learning needs the skills of each finished segment: the node keeps the
segments it saw on the fleet-wide /plan_segments topic and matches each
SegmentDone report to one by (task_id, segment_index). A segment carries no
robot type: it is the ``robot_type`` of the skill set its calls were validated
against (``SkillCall.skillset_id``, e.g. ``drone_minispec`` -> ``drone``). A
segment without skill calls (``};``, an end-of-plan marker) has nothing to
learn from and is not kept.

Callbacks never raise: a report that cannot be learned from is logged at
WARNING and dropped (an exception would stop the executor spinning the node).
"""

from __future__ import annotations

import threading
import traceback
from collections import OrderedDict
from typing import Any

from rclpy.node import Node

from timelyllm_ros.msg import PlanSegment, SegmentDone
from timelyllm_ros.ros.convert import time_s
from timelyllm_ros.ros.params import declare, on_change
from timelyllm_ros.ros.spin import run_nodes
from timelyllm_ros.ros.topics import ALL_SEGMENTS, ESTIMATE_EXEC_TIME_SERVICE, RELIABLE, SEGMENT_DONE, in_fleet
from timelyllm_ros.skills.exec_model import ExecTimeModel
from timelyllm_ros.skills.skill_files import load_skill_set
from timelyllm_ros.srv import EstimateExecTime


class ExecTimeNode(Node):
    def __init__(self, *, models: Any = None, node_name: str = "exec_time", **kw) -> None:
        """``models``: callable robot_type -> ExecTimeModel to share (e.g. the planner core's)."""
        super().__init__(node_name, **kw)
        self.learn = declare(self, "learn", True, "learn execution times from SegmentDone reports (the node's "
                             "own models; a model shared with the planner learns in the planner); settable at "
                             "run time")
        self._own: dict[str, ExecTimeModel] = {}  # skill set id -> model
        self._models = models or self.model
        self._seen: OrderedDict[tuple[str, int], tuple[str, str]] = OrderedDict()  # -> (skillset_id, text)
        self._lock = threading.Lock()
        # Segments seen, and what became of the SegmentDone reports (diagnostics, tests).
        self.stats = {"segments": 0, "segments_without_skills": 0,
                      "learned": 0, "unmatched": 0, "skipped": 0, "failed": 0}
        service = self.create_service(EstimateExecTime, in_fleet(ESTIMATE_EXEC_TIME_SERVICE), self._estimate)
        if models is None:  # a shared model already learns inside the planner core
            self.create_subscription(PlanSegment, in_fleet(ALL_SEGMENTS), self._segment, RELIABLE)
            self.create_subscription(SegmentDone, in_fleet(SEGMENT_DONE), self._done, RELIABLE)
        on_change(self, {"learn": self._set_learn})
        self.get_logger().info(f"execution-time estimates on {service.service_name} (learn: {bool(self.learn)})")

    def _set_learn(self, value: bool) -> None:
        with self._lock:
            self.learn = bool(value)
            for m in self._own.values():
                m.learn = self.learn

    def model(self, robot_type: str) -> ExecTimeModel:
        """The model of a robot type or skill set id: one per skill set, so that
        ``drone`` and ``drone_minispec`` share what is learned."""
        ss = load_skill_set(robot_type)  # FileNotFoundError / SkillSetError (a ValueError) if unknown
        with self._lock:
            m = self._own.get(ss.id)
            if m is None:
                m = self._own[ss.id] = ExecTimeModel(ss, learn=self.learn)
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
        skillset_id = next((c.skillset_id for c in msg.skills if c.skillset_id), "")
        with self._lock:
            self.stats["segments"] += 1
            if not skillset_id:  # no skill calls ('};', end-of-plan marker): nothing to learn
                self.stats["segments_without_skills"] += 1
                return
            self._seen[(msg.task_id, msg.segment_index)] = (skillset_id, msg.text)
            while len(self._seen) > 10_000:
                self._seen.popitem(last=False)

    def _done(self, msg: SegmentDone) -> None:
        where = f"task {msg.task_id!r} segment {msg.segment_index}"
        try:
            outcome = self._learn(msg)
        except (ValueError, LookupError, OSError) as e:  # unknown skill set, unparsable text, ...
            outcome = "failed"
            self.get_logger().warning(f"not learning from {where}: {type(e).__name__}: {e}")
        except Exception as e:  # a callback that raises would stop the executor spinning this node
            outcome = "failed"
            self.get_logger().warning(f"not learning from {where}: unexpected {type(e).__name__}: {e}\n"
                                      f"{traceback.format_exc()}")
        with self._lock:
            self.stats[outcome] += 1

    def _learn(self, msg: SegmentDone) -> str:
        with self._lock:
            seen = self._seen.pop((msg.task_id, msg.segment_index), None)
        if seen is None:  # a segment without skills, or one this node never saw
            return "unmatched"
        took = time_s(msg.finish) - time_s(msg.start)
        if not msg.success or not self.learn or took <= 0:
            return "skipped"
        skillset_id, text = seen
        model = self._models(load_skill_set(skillset_id).robot_type)
        model.observe(model.skillset.parse(text), took)
        return "learned"


def main(args: list[str] | None = None) -> int:
    return run_nodes(lambda: [ExecTimeNode()], args)


if __name__ == "__main__":
    import sys

    sys.exit(main())
