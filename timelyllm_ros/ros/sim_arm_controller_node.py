"""A simulated joint-trajectory controller for arms: follows each trajectory over time.

Subscribes ``/<robot_id>/joint_trajectory`` for every robot in ``robots``;
a trajectory runs until its last point's ``time_from_start`` (interpolating
the joint positions, kept in ``positions``), then ``succeeded`` is published
on ``/<robot_id>/trajectory_status`` (std_msgs/Header, stamp = the
trajectory's stamp). A new trajectory replaces the running one (``aborted:
replaced``); an empty one stops it (``stopped``) and holds the position.

    ros2 run timelyllm_ros sim_arm_controller_node --ros-args --params-file config/sim_arm_controller.yaml
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from rclpy.node import Node
from std_msgs.msg import Header
from trajectory_msgs.msg import JointTrajectory

from timelyllm_ros.ros.params import all_of, declare, distinct, non_empty
from timelyllm_ros.ros.spin import run_nodes
from timelyllm_ros.ros.topics import RELIABLE, trajectory_status_topic, trajectory_topic


@dataclass
class _Arm:
    robot_id: str
    positions: dict[str, float] = field(default_factory=dict)
    active: JointTrajectory | None = None
    started: float = 0.0
    start_pos: dict[str, float] = field(default_factory=dict)
    followed: list[str] = field(default_factory=list)  # labels (header.frame_id), for tests


class SimArmControllerNode(Node):
    def __init__(self, node_name: str = "sim_arm_controller", rate_hz: float = 50.0, **kw) -> None:
        super().__init__(node_name, **kw)
        robots = list(declare(self, "robots", ["arm_0"], "arms to control: /<robot_id>/joint_trajectory each",
                              read_only=True, check=all_of(non_empty, distinct), constraints="non-empty, distinct"))
        self.arms = {r: _Arm(r) for r in robots}
        self._lock = threading.Lock()
        self._pubs = {r: self.create_publisher(Header, trajectory_status_topic(r), RELIABLE) for r in robots}
        for r in robots:
            self.create_subscription(JointTrajectory, trajectory_topic(r), lambda m, r=r: self._received(r, m),
                                     RELIABLE)
        self.create_timer(1.0 / rate_hz, self._tick)
        self.get_logger().info(f"simulated arm controller for {', '.join(robots)}")

    def _status(self, arm: _Arm, traj: JointTrajectory, text: str) -> None:
        self._pubs[arm.robot_id].publish(Header(stamp=traj.header.stamp, frame_id=text))

    def _received(self, robot_id: str, msg: JointTrajectory) -> None:
        with self._lock:
            arm = self.arms[robot_id]
            if arm.active is not None:
                self._status(arm, arm.active, "stopped" if not msg.points else "aborted: replaced")
                self._hold(arm, time.monotonic())
                arm.active = None
            if not msg.points:
                return
            if any(len(p.positions) != len(msg.joint_names) for p in msg.points):
                self._status(arm, msg, "aborted: a point's positions do not match joint_names")
                return
            arm.active, arm.started, arm.start_pos = msg, time.monotonic(), dict(arm.positions)
            arm.followed.append(msg.header.frame_id)

    def _hold(self, arm: _Arm, now: float) -> None:
        if arm.active is not None:
            arm.positions.update(self._sample(arm, now - arm.started))

    def _sample(self, arm: _Arm, t: float) -> dict[str, float]:
        """Joint positions at time t along the active trajectory (linear between points)."""
        traj = arm.active
        first = traj.points[0].positions
        prev_t, prev = 0.0, [arm.start_pos.get(n, p) for n, p in zip(traj.joint_names, first, strict=True)]
        for p in traj.points:
            pt = p.time_from_start.sec + p.time_from_start.nanosec * 1e-9
            if t <= pt:
                a = 0.0 if pt <= prev_t else (t - prev_t) / (pt - prev_t)
                return {n: x0 + a * (x1 - x0) for n, x0, x1 in zip(traj.joint_names, prev, p.positions, strict=True)}
            prev_t, prev = pt, list(p.positions)
        return dict(zip(traj.joint_names, prev, strict=True))

    def _tick(self) -> None:
        now = time.monotonic()
        with self._lock:
            for arm in self.arms.values():
                if arm.active is None:
                    continue
                last = arm.active.points[-1].time_from_start
                if now - arm.started >= last.sec + last.nanosec * 1e-9:
                    self._hold(arm, now)
                    self._status(arm, arm.active, "succeeded")
                    arm.active = None


def main(args: list[str] | None = None) -> int:
    return run_nodes(lambda: [SimArmControllerNode()], args)


if __name__ == "__main__":
    import sys

    sys.exit(main())
