"""The node graph as data: which executables a config starts, with which parameters.

Both the ROS 2 launch files (launch/*.launch.py) and the ``timelyllm``
command build their processes from :func:`node_specs`, so the two ways of
starting the stack cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from timelyllm_ros.paths import config_dir
from timelyllm_ros.ros import NODE_EXECUTABLES

# ROS node name in the parameters file -> executable that hosts it.
# The scheduler node lives in the planner's process (decision path in-process).
NODE_HOSTS = {
    "planner": "planner_node",
    "scheduler": "planner_node",
    "exec_time": "exec_time_node",
    "sim_fleet": "sim_fleet_node",
}


@dataclass(frozen=True)
class NodeSpec:
    executable: str  # in lib/timelyllm_ros (see NODE_EXECUTABLES)
    module: str  # python -m target, for starting without ros2
    name: str
    params_file: Path


def resolve_config(config: str | Path) -> Path:
    p = Path(config)
    if not p.is_file():
        p = config_dir() / config
    if not p.is_file():
        raise FileNotFoundError(f"config {config!r} not found (as a path or in {config_dir()})")
    return p


def node_specs(config: str | Path, only: list[str] | None = None) -> list[NodeSpec]:
    """One spec per process for the nodes configured in ``config``."""
    path = resolve_config(config)
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of node names to ros__parameters")
    unknown = set(data) - set(NODE_HOSTS)
    if unknown:
        raise ValueError(f"{path}: unknown node(s) {sorted(unknown)}; known: {sorted(NODE_HOSTS)}")
    wanted = only or list(data)
    specs: dict[str, NodeSpec] = {}
    for name in wanted:
        if name not in NODE_HOSTS:
            raise ValueError(f"--only: unknown node {name!r}; known: {sorted(NODE_HOSTS)}")
        exe = NODE_HOSTS[name]
        if exe not in specs:
            target = NODE_EXECUTABLES[exe]
            specs[exe] = NodeSpec(executable=exe, module=target.split(":")[0], name=name, params_file=path)
    return list(specs.values())


def launch_description(only: list[str] | None = None, default_config: str = "fleet_demo.yaml"):
    """A ROS 2 LaunchDescription for the nodes of ``config:=...`` (launch is imported only here)."""
    from launch.actions import DeclareLaunchArgument, OpaqueFunction
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    from launch import LaunchDescription

    def nodes(context, *_):
        config = LaunchConfiguration("config").perform(context)
        return [Node(package="timelyllm_ros", executable=s.executable, name=s.name, output="screen",
                     parameters=[str(s.params_file)]) for s in node_specs(config, only)]

    return LaunchDescription([DeclareLaunchArgument("config", default_value=default_config),
                              OpaqueFunction(function=nodes)])
