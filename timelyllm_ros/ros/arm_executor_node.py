"""Arm executors: one node per arm (namespace ``/<robot_id>``), all in one process.

Each skill call becomes a trajectory_msgs/JointTrajectory on
``/<robot_id>/joint_trajectory`` (RELIABLE); the controller answers on
``/<robot_id>/trajectory_status`` with a std_msgs/Header whose ``stamp``
echoes the trajectory's ``header.stamp`` (its id) and whose ``frame_id`` is
``succeeded``, ``stopped`` or ``aborted: <reason>``. An empty trajectory
means "stop now" (the joint_trajectory_controller convention). The scene
(object positions on the table) comes from ``/<robot_id>/scene`` like the
drones'.

    ros2 run timelyllm_ros arm_executor_node --ros-args --params-file config/arm_executor.yaml
    ros2 run timelyllm_ros arm_executor_node --ros-args -p robots:="[arm_0]" -p time_scale:=1.0
"""

from __future__ import annotations

import random
import threading
import time

from builtin_interfaces.msg import Duration
from rclpy.node import Node
from std_msgs.msg import Header, String
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from timelyllm_ros.robots.arm_backend import ArmExecutor, TrajectoryPlan
from timelyllm_ros.robots.base import ExecutionError, StopSignal
from timelyllm_ros.robots.perception import ScriptedScene
from timelyllm_ros.ros.convert import time_msg
from timelyllm_ros.ros.diagnostics import RobotLink
from timelyllm_ros.ros.executor_base import RobotExecutorNode
from timelyllm_ros.ros.params import all_of, declare, distinct, non_empty
from timelyllm_ros.ros.spin import run_nodes
from timelyllm_ros.ros.topics import RELIABLE, SCENE_QOS, scene_topic, trajectory_status_topic, trajectory_topic
from timelyllm_ros.skills.skill_files import load_skill_set


def trajectory_msg(plan: TrajectoryPlan, stamp: float) -> JointTrajectory:
    msg = JointTrajectory()
    msg.header.stamp = time_msg(stamp)
    msg.header.frame_id = plan.label
    msg.joint_names = list(plan.joint_names)
    for pos, t in plan.points:
        sec = int(t)
        msg.points.append(JointTrajectoryPoint(positions=list(pos),
                                               time_from_start=Duration(sec=sec, nanosec=int((t - sec) * 1e9))))
    return msg


class _ArmRunner:
    def __init__(self, node: ArmExecutorNode, time_scale: float, seed: int) -> None:
        self.node = node
        self.stop = StopSignal()
        self.arm = ArmExecutor(load_skill_set("arm"), node.scene, node.follow, time_scale=time_scale,
                               rng=random.Random(seed), stop=self.stop,
                               on_log=lambda m: node.get_logger().info(f"{node.robot_id}: {m}"))

    def begin_task(self, task_id: str) -> None:
        self.arm.begin_task()

    def run(self, text: str, *, final: bool = False) -> str:
        return f"ran {self.arm.run_segment(text)}"  # flat calls: no block can be left open at the end

    def end_plan(self) -> None:
        """Nothing to check: a plan of flat calls is complete after any of them."""

    def halt(self) -> None:
        self.node.send_stop()

    def emergency(self) -> str:
        self.node.send_stop()
        return "stop trajectory sent, arm holding position"


class ArmExecutorNode(RobotExecutorNode):
    def __init__(self, robot_id: str, *, time_scale: float = 1.0, scene: str = "", seed: int = 0,
                 status_timeout_s: float = 5.0, **kw) -> None:
        super().__init__(robot_id, "arm_executor", **kw)
        self.scene = ScriptedScene(scene)
        self.status_timeout_s = status_timeout_s
        self._traj_pub = self.create_publisher(JointTrajectory, trajectory_topic(robot_id), RELIABLE)
        self._status: dict[tuple[int, int], str] = {}
        self._status_cv = threading.Condition()
        self.create_subscription(Header, trajectory_status_topic(robot_id), self._on_status, RELIABLE)
        self.create_subscription(String, scene_topic(robot_id), lambda m: self.scene.set_scene(m.data), SCENE_QOS)
        self.runner = _ArmRunner(self, time_scale, seed)
        self.start_executor()

    def _on_status(self, msg: Header) -> None:
        with self._status_cv:
            self._status[(msg.stamp.sec, msg.stamp.nanosec)] = msg.frame_id
            self._status_cv.notify_all()

    def robot_link(self) -> RobotLink:
        """/diagnostics: up while a controller reads this arm's trajectory topic (it answers only per trajectory,
        so there is no contact age to judge; no battery)."""
        topic = trajectory_topic(self.robot_id)
        if self._traj_pub.get_subscription_count() > 0:
            return RobotLink(True, f"controller on {topic}")
        return RobotLink(False, f"no controller subscribed to {topic}")

    def follow(self, plan: TrajectoryPlan, stop: StopSignal) -> None:
        """Send one trajectory and wait for the controller (bounded: duration + status_timeout_s)."""
        msg = trajectory_msg(plan, time.time())
        key = (msg.header.stamp.sec, msg.header.stamp.nanosec)
        self._traj_pub.publish(msg)
        budget = plan.duration + self.status_timeout_s
        deadline = time.monotonic() + budget
        with self._status_cv:
            while key not in self._status:
                stop.check()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ExecutionError(f"{plan.label}: no answer from the arm controller on "
                                         f"{trajectory_status_topic(self.robot_id)} within {budget:.1f} s")
                self._status_cv.wait(min(left, 0.05))
            status = self._status.pop(key)
        stop.check()
        if status != "succeeded":
            raise ExecutionError(f"{plan.label}: controller says {status}")

    def send_stop(self) -> None:
        stop = JointTrajectory()
        stop.header.stamp = time_msg(time.time())
        self._traj_pub.publish(stop)  # empty trajectory: stop and hold (controller convention)


class ArmExecutorsNode(Node):
    """The process's node ``/arm_executor``: its parameters say which arms it serves; :meth:`build` makes
    one :class:`ArmExecutorNode` per arm (``/<robot_id>/arm_executor``, whose own parameter is
    ``reorder_timeout_s``). All are read at start-up (read-only)."""

    def __init__(self, node_name: str = "arm_executor", **kw) -> None:
        super().__init__(node_name, **kw)
        self.robots = list(declare(self, "robots", ["arm_0"], "robot ids: one executor node each, in "
                                   "/<robot_id>", read_only=True, check=all_of(non_empty, distinct),
                                   constraints="non-empty, distinct"))
        self.time_scale = float(declare(self, "time_scale", 1.0, "trajectory durations are multiplied by this "
                                        "(< 1: faster than real time)", read_only=True, above=0.0))

    def build(self) -> list[ArmExecutorNode]:
        return [ArmExecutorNode(r, time_scale=self.time_scale, seed=i, context=self.context)
                for i, r in enumerate(self.robots)]


def _build() -> list[Node]:
    params = ArmExecutorsNode()
    return [params, *params.build()]


def main(args: list[str] | None = None) -> int:
    return run_nodes(_build, args, num_threads=4)


if __name__ == "__main__":
    import sys

    sys.exit(main())
