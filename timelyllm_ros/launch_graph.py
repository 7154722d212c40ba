"""The node graph as data: which executables a config starts, with which parameters.

Both the ROS 2 launch files (launch/*.launch.py) and the ``timelyllm``
command build their processes from :func:`node_specs`, so the two ways of
starting the stack cannot drift apart. :func:`fleet_launch` adds what a launch
takes from its command line (namespace, engine, policy, parameter overrides),
without importing launch, so it is tested as plain Python.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

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


# Launch arguments (``ros2 launch timelyllm_ros <file> name:=value``): name -> description. ``config`` and
# ``namespace`` for every launch file; the other two where the file starts the planner.
LAUNCH_ARGUMENTS = {
    "config": "ROS parameters file of the nodes (a path, or a name in the package's config/); override one "
              "parameter with <node>.<parameter>:=<value>, e.g. sim_fleet.time_scale:=0.5",
    "namespace": "ROS namespace of every node and of the fleet's names (/<namespace>/plan_task, "
                 "/<namespace>/<robot_id>/plan_segments, ...), so that two fleets share one ROS domain; '' = root",
    "engine_config": "engine YAML of the planner (a path, or a name in config/: engine_sim.yaml runs without "
                     "model weights); '' = the config's planner.engine_config",
    "policy": "scheduling policy (pud-shed, pud, fcfs, edf-seg, ...); '' = the config's scheduler.policy",
}
_PLANNER_ARGUMENTS = {"engine_config": ("planner", "engine_config"), "policy": ("scheduler", "policy")}
_NAME_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def ros_namespace(namespace: str) -> str:
    """``namespace:=`` as a fully qualified ROS namespace: "" for the root ("" or "/"), else "/a/b"."""
    ns = namespace.strip().strip("/")
    if not ns:
        return ""
    bad = [t for t in ns.split("/") if not _NAME_TOKEN.fullmatch(t)]
    if bad:
        raise ValueError(f"namespace:={namespace!r}: {bad[0]!r} is not a ROS name (letters, digits and '_', "
                         "not starting with a digit, separated by '/')")
    return "/" + ns


def launch_arguments(only: list[str] | None) -> list[str]:
    """The launch arguments of a launch file that starts ``only`` (None: every node of the config)."""
    planner = only is None or any(NODE_HOSTS[n] == "planner_node" for n in only)
    return [a for a in LAUNCH_ARGUMENTS if planner or a not in _PLANNER_ARGUMENTS]


def _parameter_value(key: str, text: str) -> Any:
    # As rcl reads `-p name:=value`: YAML, so 0.5 is a double, [a, b] a list and true a bool.
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{key}:={text!r} is not a YAML value: {e}") from None
    if value is None or isinstance(value, dict):
        raise ValueError(f"{key}:={text!r}: a parameter value is a number, a bool, a string or a list")
    return value


@dataclass(frozen=True)
class FleetLaunch:
    """What one ``ros2 launch`` starts: the processes, their namespace and the parameters file they share."""

    specs: list[NodeSpec]
    namespace: str  # "" (root) or "/fleet_a"
    parameters: dict[str, dict[str, dict[str, Any]]]  # "/fleet_a/planner" -> {"ros__parameters": {...}}

    def params_yaml(self) -> str:
        return yaml.safe_dump(self.parameters, sort_keys=False)


def fleet_launch(config: str | Path, only: list[str] | None = None, *, namespace: str = "",
                 arguments: Mapping[str, str] | None = None) -> FleetLaunch:
    """The processes and parameters of a launch of ``config`` with the launch ``arguments`` given.

    The config's parameters are re-keyed by each node's fully qualified name in the namespace (a node
    ``planner`` under ``namespace:=fleet_a`` reads ``/fleet_a/planner``: rcl matches a plain ``planner`` key only
    in the root namespace), then ``engine_config:=``, ``policy:=`` and every ``<node>.<parameter>:=<value>`` among
    ``arguments`` override them. Arguments whose part before the first '.' is no node of ours belong to someone
    else (an including launch file) and are left alone; one for a node that this launch does not start is an
    error, as is one for ``planner.autostart`` (the launch drives the planner's lifecycle)."""
    arguments = dict(arguments or {})
    ns = ros_namespace(namespace)
    specs = node_specs(config, only)
    data = load_yaml_file(resolve_config(config)) or {}
    started = {name for name, exe in NODE_HOSTS.items() if exe in {s.executable for s in specs}}
    overrides: dict[str, dict[str, Any]] = {}
    for key, text in arguments.items():
        node, dot, param = key.partition(".")
        if not dot or node not in NODE_HOSTS:
            continue
        if node not in started:
            raise ValueError(f"{key}:=...: this launch starts no {node!r} node (it starts {sorted(started)})")
        if not param:
            raise ValueError(f"{key}:=...: name a parameter after the '.' (<node>.<parameter>:=<value>)")
        overrides.setdefault(node, {})[param] = _parameter_value(key, text)
    for arg, (node, param) in _PLANNER_ARGUMENTS.items():
        text = str(arguments.get(arg, "")).strip()
        if not text or node not in started:
            continue
        given = overrides.get(node, {}).get(param)
        if given is not None and given != text:
            raise ValueError(f"{arg}:={text} and {node}.{param}:={given} disagree: give one")
        overrides.setdefault(node, {})[param] = text
    if "autostart" in overrides.get("planner", {}):
        raise ValueError("planner.autostart: the launch configures and activates the planner itself (leave it out)")
    parameters = {}
    for node in sorted(started, key=list(NODE_HOSTS).index):
        params = dict((data.get(node) or {}).get("ros__parameters") or {})
        params.update(overrides.get(node, {}))
        if node == "planner":
            params["autostart"] = False  # the launch drives the transitions (launch_description)
        if params:
            parameters[f"{ns}/{node}"] = {"ros__parameters": params}
    return FleetLaunch(specs=specs, namespace=ns, parameters=parameters)


def launch_description(only: list[str] | None = None, default_config: str = "fleet_demo.yaml"):
    """A ROS 2 LaunchDescription for the nodes of ``config:=...`` (launch is imported only here).

    The planner is a managed node: it is brought up in order, configure (loads the engine), then activate; the
    other nodes start once the planner is active. Every node runs in ``namespace:=`` and reads one parameters
    file, written for this launch by :func:`fleet_launch` and removed when the launch ends.
    """
    from launch.actions import DeclareLaunchArgument, EmitEvent, OpaqueFunction, RegisterEventHandler
    from launch.event_handlers import OnShutdown
    from launch.events import matches_action
    from launch_ros.actions import LifecycleNode, Node
    from launch_ros.event_handlers import OnStateTransition
    from launch_ros.events.lifecycle import ChangeState
    from lifecycle_msgs.msg import Transition

    from launch import LaunchDescription

    def nodes(context, *_):
        given = context.launch_configurations
        # namespace:= is relative to a namespace an including launch file pushed (PushRosNamespace), as in Nav2
        relative = ros_namespace(given.get("namespace", "")).lstrip("/")
        fleet = fleet_launch(given["config"], only, namespace=f"{given.get('ros_namespace', '')}/{relative}",
                             arguments=given)
        with tempfile.NamedTemporaryFile("w", prefix="timelyllm_params_", suffix=".yaml", delete=False) as f:
            f.write(fleet.params_yaml())
        params_file = Path(f.name)
        cleanup = RegisterEventHandler(OnShutdown(on_shutdown=lambda *_: params_file.unlink(missing_ok=True)))
        # Processes hosting one node get its name; the planner's process also hosts the scheduler, which
        # keeps its own name whatever the launch renames (see ros/spin.py ros_args_without_node_rename).
        others = [Node(package="timelyllm_ros", executable=s.executable, name=s.name, namespace=relative,
                       output="screen", parameters=[str(params_file)])
                  for s in fleet.specs if s.executable != "planner_node"]
        if not any(s.executable == "planner_node" for s in fleet.specs):
            return [cleanup, *others]
        planner = LifecycleNode(package="timelyllm_ros", executable="planner_node", name="planner", namespace=relative,
                                output="screen", parameters=[str(params_file)])

        def change(transition: int) -> EmitEvent:
            return EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(planner),
                                               transition_id=transition))

        return [
            cleanup,
            RegisterEventHandler(OnStateTransition(target_lifecycle_node=planner, start_state="configuring",
                                                   goal_state="inactive",
                                                   entities=[change(Transition.TRANSITION_ACTIVATE)],
                                                   handle_once=True)),
            RegisterEventHandler(OnStateTransition(target_lifecycle_node=planner, start_state="activating",
                                                   goal_state="active", entities=others, handle_once=True)),
            planner,
            change(Transition.TRANSITION_CONFIGURE),
        ]

    defaults = {"config": default_config}
    return LaunchDescription([
        *(DeclareLaunchArgument(name, default_value=defaults.get(name, ""), description=LAUNCH_ARGUMENTS[name])
          for name in launch_arguments(only)),
        OpaqueFunction(function=nodes)])
