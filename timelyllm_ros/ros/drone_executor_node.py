"""Drone executors: one node per Tello (namespace ``/<robot_id>``), all in one process.

djitellopy binds UDP 8889 once per process and files replies by drone IP, so
one process serves the whole fleet: the process's node ``/drone_executor``
(:class:`DroneExecutorsNode`) reads ``robots`` and ``hosts`` (same length) and
starts a :class:`DroneExecutorNode` per drone. Perception reads
``/<robot_id>/scene`` (std_msgs/String with a ``Scene: [...]`` text,
transient-local) through the declared stand-in
:class:`~timelyllm_ros.robots.perception.ScriptedScene`; a real detector
publishes on the same topic.

    ros2 run timelyllm_ros drone_executor_node --ros-args --params-file config/drone_executor.yaml
    ros2 run timelyllm_ros drone_executor_node --ros-args \
        -p robots:="[drone_0, drone_1]" -p hosts:="[192.168.10.1, 192.168.10.2]"
"""

from __future__ import annotations

from rclpy.node import Node
from std_msgs.msg import String

from timelyllm_ros.robots.base import Interrupted, StopSignal
from timelyllm_ros.robots.interpreter import MiniSpecInterpreter
from timelyllm_ros.robots.perception import ScriptedScene
from timelyllm_ros.robots.tello_backend import TelloBackend
from timelyllm_ros.ros.diagnostics import RobotLink
from timelyllm_ros.ros.executor_base import RobotExecutorNode
from timelyllm_ros.ros.params import all_of, declare, distinct, non_empty
from timelyllm_ros.ros.spin import run_nodes
from timelyllm_ros.ros.topics import SCENE_QOS, scene_topic
from timelyllm_ros.skills.schema import SkillSet
from timelyllm_ros.skills.skill_files import load_skill_set


class _DroneRunner:
    """Connects lazily (a drone switched on after the executor is fine), then runs MiniSpec."""

    def __init__(self, node: DroneExecutorNode, backend: TelloBackend, scene: ScriptedScene,
                 skillset: SkillSet) -> None:
        self.node = node
        self.backend = backend
        self.stop = StopSignal()
        self.interp = MiniSpecInterpreter(skillset, backend, scene, stop=self.stop,
                                          on_log=lambda m: node.get_logger().info(f"{node.robot_id}: {m}"))

    def begin_task(self, task_id: str) -> None:
        self.interp.reset()

    def run(self, text: str, *, final: bool = False) -> str:
        """``final``: the plan ends with this segment, so it is refused (nothing runs) if blocks stay open."""
        self.interp.validate(text, final=final)  # refuse before even connecting
        self.backend.resume()  # a halt (preemption) stopped the previous segment's motions, not this one's
        if not self.backend.connected:
            bat = self.backend.connect()
            self.node.get_logger().info(f"{self.node.robot_id}: connected to Tello {self.backend.host}, "
                                        f"battery {bat} %")
        res = self.interp.execute_segment(text, final=final)
        self.stop.check()  # a stop that interrupted the last motion makes the segment fail
        return f"ran {res.executed}" + (f", skipped {res.skipped}" if res.skipped else "")

    def end_plan(self) -> None:
        """An end marker: the plan ended after the last segment that ran. RefusedError if blocks are still
        open (e.g. a loop whose repeats never came); nothing runs either way."""
        self.interp.validate("", final=True)

    def halt(self) -> None:
        if self.backend.connected:
            self.backend.halt()

    def emergency(self) -> str:
        if not self.backend.connected:
            return "not connected: nothing to stop"
        # Also on the ground: a take-off may be in flight, which only 'stop' cuts.
        return "motion stopped, landed" if self.backend.emergency_land() else "stopped (was on the ground)"


class DroneExecutorNode(RobotExecutorNode):
    def __init__(self, robot_id: str, host: str, *, time_scale: float = 1.0, retry_count: int = 3,
                 scene: str = "", **kw) -> None:
        super().__init__(robot_id, "drone_executor", **kw)
        self.scene = ScriptedScene(scene)
        skillset = load_skill_set("drone")  # one skill set: the interpreter runs it, the backend times by it
        self.backend = TelloBackend(host, retry_count=retry_count, time_scale=time_scale, skillset=skillset)
        self.runner = _DroneRunner(self, self.backend, self.scene, skillset)
        self.create_subscription(String, scene_topic(robot_id), self._scene, SCENE_QOS)
        self.start_executor()
        self.get_logger().info(f"{robot_id}: Tello executor for {host} (time_scale={time_scale})")

    def _scene(self, msg: String) -> None:
        try:
            self.scene.set_scene(msg.data)
        except ValueError as e:
            self.get_logger().warning(f"{self.robot_id}: bad scene {msg.data!r}: {e}")

    def robot_link(self) -> RobotLink:
        """/diagnostics: the Tello's link (age of its latest reply or state packet) and battery."""
        connected, age, battery = self.backend.link_state()
        if not connected and age is None:  # the executor connects at the drone's first segment
            return RobotLink(None, f"Tello {self.backend.host}: not connected yet (connects at the first segment)")
        return RobotLink(connected, f"Tello {self.backend.host}", age, battery)

    def destroy_node(self) -> None:
        super().destroy_node()
        backend = getattr(self, "backend", None)  # None: construction failed before it existed (its error stands)
        if backend is None:
            return
        try:
            backend.close(land=True)
        except Interrupted:
            pass


def build_drone_executors(robots: list[str], hosts: list[str], *, time_scale: float = 1.0, retry_count: int = 3,
                          scenes: dict[str, str] | None = None, context=None) -> list[DroneExecutorNode]:
    if not robots or len(robots) != len(hosts):
        raise ValueError(f"robots and hosts must be non-empty and of the same length, got {robots} / {hosts}")
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"hosts must differ (djitellopy tells drones apart by IP): {hosts}")
    return [DroneExecutorNode(r, h, time_scale=time_scale, retry_count=retry_count,
                              scene=(scenes or {}).get(r, ""), context=context)
            for r, h in zip(robots, hosts, strict=True)]


class DroneExecutorsNode(Node):
    """The process's node ``/drone_executor``: its parameters say which drones it serves; :meth:`build`
    makes one :class:`DroneExecutorNode` per drone (``/<robot_id>/drone_executor``, whose own parameter is
    ``reorder_timeout_s``). All are read at start-up (read-only)."""

    def __init__(self, node_name: str = "drone_executor", **kw) -> None:
        super().__init__(node_name, **kw)
        self.robots = list(declare(self, "robots", ["drone_0"], "robot ids: one executor node each, in "
                                   "/<robot_id>", read_only=True, check=all_of(non_empty, distinct),
                                   constraints="non-empty, distinct"))
        self.hosts = list(declare(self, "hosts", ["192.168.10.1"], "Tello IP address of each robot, in the "
                                  "order of robots", read_only=True, check=distinct,
                                  constraints="one per robot, distinct (djitellopy tells drones apart by IP)"))
        if len(self.hosts) != len(self.robots):
            raise ValueError(f"parameter hosts: one per robot, got {len(self.hosts)} hosts for "
                             f"{len(self.robots)} robots {self.robots}")
        self.time_scale = float(declare(self, "time_scale", 1.0, "expected motion durations are multiplied by "
                                        "this to time out a command (< 1: an emulator faster than real time)",
                                        read_only=True, above=0.0))
        self.retry_count = int(declare(self, "retry_count", 3, "times djitellopy sends a command that gets no "
                                       "answer", read_only=True, min=1))

    def build(self) -> list[DroneExecutorNode]:
        return build_drone_executors(self.robots, self.hosts, time_scale=self.time_scale,
                                     retry_count=self.retry_count, context=self.context)


def _build() -> list[Node]:
    params = DroneExecutorsNode()
    return [params, *params.build()]


def main(args: list[str] | None = None) -> int:
    return run_nodes(_build, args, num_threads=4)


if __name__ == "__main__":
    import sys

    sys.exit(main())
