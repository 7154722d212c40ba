"""Emulated Tello drones behind real drone executor nodes, for tests and the demo (needs root).

    with start_emulated_fleet(["drone_0", "drone_1"], speed=0.05) as fleet:
        ...  # the planner publishes on /drone_0/plan_segments; executors report /segment_done
        fleet.drones["drone_0"].commands()  # ['command', 'battery?', 'takeoff', 'forward 50', ...]

Each drone is a Tello emulator process in a network namespace of its own
(executors.netns); the executor nodes run in THIS process (djitellopy binds
UDP 8889 once per process, so all drones of a process share one client
socket), on their own rclpy context and executor thread. Everything is torn
down on exit, also when start-up fails half-way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import rclpy
from std_msgs.msg import String

from devtools.netns import EmulatedDrone, emulated_drones
from timelyllm_ros.ros.drone_executor_node import DroneExecutorNode, build_drone_executors
from timelyllm_ros.ros.spin import PooledExecutor, Spinner
from timelyllm_ros.ros.topics import SCENE_QOS, scene_topic


@dataclass
class EmulatedFleet:
    robot_ids: list[str]
    drones: dict[str, EmulatedDrone]  # robot id -> emulator (host, log, commands(), kill())
    nodes: dict[str, DroneExecutorNode]  # robot id -> executor node (history of SegmentDone reports)
    context: rclpy.Context

    def hosts(self) -> dict[str, str]:
        return {r: d.host for r, d in self.drones.items()}

    def set_scene(self, robot_id: str, scene: str) -> None:
        """Give a drone's stand-in detector a ``Scene: [...]`` text (also settable on /<robot_id>/scene)."""
        self.nodes[robot_id].scene.set_scene(scene)


@contextlib.contextmanager
def start_emulated_fleet(robot_ids: Sequence[str], *, speed: float = 0.05, retry_count: int = 3,
                         log_dir: str | Path | None = None, scenes: dict[str, str] | None = None,
                         drop: dict[str, list[str]] | None = None, context: rclpy.Context | None = None
                         ) -> Iterator[EmulatedFleet]:
    """Namespaces + Tello emulators + one DroneExecutorNode per robot id; torn down on exit.

    ``speed`` scales every modelled duration (emulator and executor timeouts alike); ``drop`` injects
    lost packets per robot id (``["forward:1"]``, see the emulator). ``context``: run the executors on this
    (initialised) rclpy context, which the caller shuts down; None: a context of their own."""
    robot_ids = list(robot_ids)
    if not robot_ids or len(set(robot_ids)) != len(robot_ids):
        raise ValueError(f"robot_ids must be non-empty and distinct, got {robot_ids}")
    drop_by_index = {robot_ids.index(r): v for r, v in (drop or {}).items()}
    with emulated_drones(len(robot_ids), speed=speed, log_dir=log_dir, drop=drop_by_index) as emus:
        own = context is None
        ctx = rclpy.Context() if own else context
        if own:
            rclpy.init(context=ctx)
        nodes: list[DroneExecutorNode] = []
        ex = PooledExecutor(num_threads=4, context=ctx)
        spinner = Spinner(ex, name="emulated-fleet")
        try:
            nodes = build_drone_executors(robot_ids, [e.host for e in emus], time_scale=speed,
                                          retry_count=retry_count, scenes=scenes, context=ctx)
            for n in nodes:
                ex.add_node(n)
            spinner.start()
            yield EmulatedFleet(robot_ids, dict(zip(robot_ids, emus, strict=True)),
                                {n.robot_id: n for n in nodes}, ctx)
        finally:
            for n in nodes:
                n.destroy_node()  # lands drones still flying (bounded by the SDK timeouts)
            ex.shutdown(timeout_sec=5)
            if own:
                rclpy.shutdown(context=ctx)
            spinner.join(timeout=5)


def publish_scene(node, robot_id: str, scene: str) -> None:
    """Publish a scene for a drone's stand-in detector from any node (transient-local: late executors get it)."""
    pub = node.create_publisher(String, scene_topic(robot_id), SCENE_QOS)
    pub.publish(String(data=scene))


__all__ = ["EmulatedFleet", "publish_scene", "start_emulated_fleet"]
