"""A fleet of simulated robots: each executes its segments in order, taking a
duration sampled from the execution-time model, and reports SegmentDone.

Every segment is validated against the robot's skill set first (LLM output is
untrusted); one that does not parse is reported as failed, never executed.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from rclpy.node import Node

from timelyllm_ros.core.exec_model import ExecTimeModel
from timelyllm_ros.core.skills import load_skill_set
from timelyllm_ros.msg import PlanSegment, SegmentDone
from timelyllm_ros.ros.convert import time_msg
from timelyllm_ros.ros.planner_node import RELIABLE, segment_topic
from timelyllm_ros.ros.spin import run_nodes


@dataclass
class SimRobot:
    robot_id: str
    robot_type: str
    silent: bool = False  # never reports SegmentDone (tests the planner's fallback)
    queue: deque = field(default_factory=deque)
    busy_until: float | None = None
    executed: list = field(default_factory=list)  # (task_id, index, text, start, finish, ok)


class SimFleetNode(Node):
    def __init__(self, node_name: str = "sim_fleet", **kw) -> None:
        super().__init__(node_name, **kw)
        robots = list(self.declare_parameter("robots", ["drone_0", "drone_1", "drone_2"]).value)
        robot_type = self.declare_parameter("robot_type", "drone").value
        silent = set(self.declare_parameter("silent_robots", [""]).value) - {""}
        self.time_scale = float(self.declare_parameter("time_scale", 1.0).value)
        seed = int(self.declare_parameter("seed", 0).value)
        if not robots:
            raise ValueError("parameter robots: at least one robot id is needed")
        if self.time_scale <= 0:
            raise ValueError(f"parameter time_scale: must be > 0, got {self.time_scale}")
        self.skillset = load_skill_set(robot_type)
        self.model = ExecTimeModel(self.skillset, learn=False)
        self.rng = random.Random(seed)
        self.robots = {r: SimRobot(r, robot_type, silent=r in silent) for r in robots}
        self._done_pub = self.create_publisher(SegmentDone, "/segment_done", RELIABLE)
        for r in robots:
            self.create_subscription(PlanSegment, segment_topic(r), lambda m, r=r: self._received(r, m), RELIABLE)
        self._lock = threading.Condition()
        self._events: list[tuple[float, str]] = []  # (finish wall time, robot id)
        self._stop = False
        self._worker = threading.Thread(target=self._run, name="sim-fleet", daemon=True)
        self._worker.start()
        self.get_logger().info(f"{len(robots)} simulated {robot_type} robots: {', '.join(robots)}")

    def _received(self, robot_id: str, msg: PlanSegment) -> None:
        with self._lock:
            rob = self.robots[robot_id]
            rob.queue.append(msg)
            if rob.busy_until is None:
                self._start_next(rob, time.time())
            self._lock.notify()

    def _start_next(self, rob: SimRobot, now: float) -> None:
        while rob.queue:
            msg = rob.queue.popleft()
            try:
                calls = self.skillset.parse(msg.text) if msg.text.strip() else []
            except ValueError as e:  # refuse: never execute what does not parse
                self.get_logger().warning(f"{rob.robot_id}: refused segment {msg.task_id}[{msg.segment_index}]: {e}")
                self._report(rob, msg, now, now, False, f"invalid segment: {e}")
                continue
            dur = self.model.sample(calls, self.rng) * self.time_scale if calls else 0.0
            rob.busy_until = now + dur
            rob.executed.append([msg.task_id, msg.segment_index, msg.text, now, now + dur, True])
            heapq.heappush(self._events, (now + dur, rob.robot_id))
            return
        rob.busy_until = None

    def _report(self, rob: SimRobot, msg_or_entry, start: float, finish: float, ok: bool, error: str = "") -> None:
        if rob.silent:
            return
        task_id = msg_or_entry.task_id if isinstance(msg_or_entry, PlanSegment) else msg_or_entry[0]
        index = msg_or_entry.segment_index if isinstance(msg_or_entry, PlanSegment) else msg_or_entry[1]
        self._done_pub.publish(SegmentDone(task_id=task_id, robot_id=rob.robot_id, segment_index=index,
                                           start=time_msg(start), finish=time_msg(finish), success=ok, error=error))

    def _run(self) -> None:
        with self._lock:
            while not self._stop:
                if not self._events:
                    self._lock.wait(0.5)
                    continue
                t, rid = self._events[0]
                now = time.time()
                if t > now:
                    self._lock.wait(t - now)
                    continue
                heapq.heappop(self._events)
                rob = self.robots[rid]
                entry = rob.executed[-1]
                self._report(rob, entry, entry[3], entry[4], True)
                self._start_next(rob, now)

    def destroy_node(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()
        self._worker.join(timeout=2)
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    return run_nodes(lambda: [SimFleetNode()], args)


if __name__ == "__main__":
    import sys

    sys.exit(main())
