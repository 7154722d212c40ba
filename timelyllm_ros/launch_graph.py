"""The node graph as data: which executables a config starts, with which parameters.

Both the ROS 2 launch files (launch/*.launch.py) and the ``timelyllm``
command build their processes from :func:`node_specs`, so the two ways of
starting the stack cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from timelyllm_ros.paths import config_dir
from timelyllm_ros.ros import NODE_EXECUTABLES
from timelyllm_ros.yamlfile import load_yaml_file

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
    data = load_yaml_file(path) or {}
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
    """A ROS 2 LaunchDescription for the nodes of ``config:=...`` (launch is imported only here).

    The planner is a managed node: it is launched with ``autostart:=false`` and brought up in order,
    configure (loads the engine), then activate; the other nodes start once the planner is active.
    """
    from launch.actions import DeclareLaunchArgument, EmitEvent, OpaqueFunction, RegisterEventHandler
    from launch.events import matches_action
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import LifecycleNode, Node
    from launch_ros.event_handlers import OnStateTransition
    from launch_ros.events.lifecycle import ChangeState
    from lifecycle_msgs.msg import Transition

    from launch import LaunchDescription

    def nodes(context, *_):
        config = LaunchConfiguration("config").perform(context)
        specs = node_specs(config, only)
        # Processes hosting one node get its name; the planner's process also hosts the scheduler, which
        # keeps its own name whatever the launch renames (see ros/spin.py ros_args_without_node_rename).
        others = [Node(package="timelyllm_ros", executable=s.executable, name=s.name, output="screen",
                       parameters=[str(s.params_file)]) for s in specs if s.executable != "planner_node"]
        planner_spec = next((s for s in specs if s.executable == "planner_node"), None)
        if planner_spec is None:
            return others
        planner = LifecycleNode(package="timelyllm_ros", executable="planner_node", name="planner", namespace="",
                                output="screen", parameters=[str(planner_spec.params_file), {"autostart": False}])

        def change(transition: int) -> EmitEvent:
            return EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(planner),
                                               transition_id=transition))

        return [
            RegisterEventHandler(OnStateTransition(target_lifecycle_node=planner, start_state="configuring",
                                                   goal_state="inactive",
                                                   entities=[change(Transition.TRANSITION_ACTIVATE)],
                                                   handle_once=True)),
            RegisterEventHandler(OnStateTransition(target_lifecycle_node=planner, start_state="activating",
                                                   goal_state="active", entities=others, handle_once=True)),
            planner,
            change(Transition.TRANSITION_CONFIGURE),
        ]

    return LaunchDescription([DeclareLaunchArgument("config", default_value=default_config),
                              OpaqueFunction(function=nodes)])
