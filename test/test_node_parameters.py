"""Every node's parameters, with real rclpy: each has a description; config/*.yaml lists every one with the
value the node then holds when the file is loaded through rclpy's own ``--params-file``; a read-only or
out-of-range value set at run time is refused with a reason that names the parameter, a bad value at
start-up is a ValueError that names it, and nothing is clamped.

The planner and scheduler nodes (planner_node.py) are left out here: their parameters are being reworked.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import pkgutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

rclpy = pytest.importorskip("rclpy")
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402

import timelyllm_ros.ros as ros_pkg  # noqa: E402
from timelyllm_ros.ros import drone_executor_node  # noqa: E402
from timelyllm_ros.ros.arm_executor_node import ArmExecutorNode, ArmExecutorsNode  # noqa: E402
from timelyllm_ros.ros.drone_executor_node import DroneExecutorNode, DroneExecutorsNode  # noqa: E402
from timelyllm_ros.ros.exec_time_node import ExecTimeNode  # noqa: E402
from timelyllm_ros.ros.executor_base import RobotExecutorNode  # noqa: E402
from timelyllm_ros.ros.params import RCLPY_PARAMETERS, descriptors  # noqa: E402
from timelyllm_ros.ros.recorder_node import RecorderNode  # noqa: E402
from timelyllm_ros.ros.replay_node import ReplayNode  # noqa: E402
from timelyllm_ros.ros.sim_arm_controller_node import SimArmControllerNode  # noqa: E402
from timelyllm_ros.ros.sim_fleet_node import SimFleetNode  # noqa: E402
from timelyllm_ros.ros.workload_client import WorkloadClient  # noqa: E402

pytestmark = pytest.mark.ros

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config"
LRTRACE = str(ROOT / "data" / "lrtrace" / "drone-wid2")

NOT_HERE: set[str] = set()
NOT_HERE_SECTIONS: set[str] = set()


class FakeTello:
    """Stands in for TelloBackend: the drone executor node is built without a UDP socket."""

    def __init__(self, host: str, **_kw) -> None:
        self.host = host
        self.connected = self.flying = False

    def link_state(self) -> tuple[bool, float | None, int | None]:
        return False, None, None

    def halt(self) -> None: ...

    def close(self, land: bool = True) -> None: ...


@pytest.fixture()
def no_tello(monkeypatch):
    monkeypatch.setattr(drone_executor_node, "TelloBackend", FakeTello)


@contextlib.contextmanager
def ros(*args: str) -> Iterator[rclpy.Context]:
    """A fresh context, started with these command-line arguments (after --ros-args)."""
    ctx = rclpy.Context()
    rclpy.init(args=["--ros-args", *args] if args else None, context=ctx)
    try:
        yield ctx
    finally:
        rclpy.shutdown(context=ctx)


@contextlib.contextmanager
def built(make: Callable[[rclpy.Context], list[Node]], *args: str) -> Iterator[list[Node]]:
    with ros(*args) as ctx:
        nodes = make(ctx)
        try:
            yield nodes
        finally:
            for n in reversed(nodes):
                n.destroy_node()


def own_params(node: Node) -> dict:
    return descriptors(node)


def fqn(node: Node) -> str:
    return node.get_fully_qualified_name()


# One builder per node class of timelyllm_ros.ros: (context) -> the nodes it makes, this class's first.
def _drone_executor(ctx):
    return [DroneExecutorNode("drone_0", "192.168.10.1", context=ctx)]


def _drone_executors(ctx):
    p = DroneExecutorsNode(context=ctx)
    return [p, *p.build()]


def _arm_executors(ctx):
    p = ArmExecutorsNode(context=ctx)
    return [p, *p.build()]


def _replay(ctx, *over):
    return [ReplayNode(context=ctx, parameter_overrides=[Parameter("source", value=LRTRACE), *over])]


def _recorder(ctx, *over):
    return [RecorderNode(context=ctx, parameter_overrides=[Parameter("recording", value=False), *over])]


def _planner(ctx, overrides: bool = True) -> list[Node]:
    """Planner + scheduler, unconfigured (autostart off: no engine is loaded; from the file: EXTRA_ARGS)."""
    from timelyllm_ros.ros.planner_node import build_planner

    return list(build_planner([Parameter("autostart", value=False)] if overrides else [], context=ctx))


BUILDERS: dict[str, Callable[[rclpy.Context], list[Node]]] = {
    "RobotExecutorNode": lambda ctx: [RobotExecutorNode("bot_0", "fake_executor", context=ctx)],
    "DroneExecutorNode": _drone_executor,
    "DroneExecutorsNode": _drone_executors,
    "ArmExecutorNode": lambda ctx: [ArmExecutorNode("arm_0", context=ctx)],
    "ArmExecutorsNode": _arm_executors,
    "SimArmControllerNode": lambda ctx: [SimArmControllerNode(context=ctx)],
    "SimFleetNode": lambda ctx: [SimFleetNode(context=ctx)],
    "ExecTimeNode": lambda ctx: [ExecTimeNode(context=ctx)],
    "RecorderNode": _recorder,
    "ReplayNode": _replay,
    "WorkloadClient": lambda ctx: [WorkloadClient([], context=ctx)],
    "PlannerNode": lambda ctx: _planner(ctx),
    "SchedulerNode": lambda ctx: _planner(ctx)[::-1],
}


def node_classes() -> dict[str, type]:
    """Every Node subclass defined in timelyllm_ros.ros (every module imported)."""
    for m in pkgutil.iter_modules(ros_pkg.__path__):
        importlib.import_module(f"{ros_pkg.__name__}.{m.name}")
    found, todo = {}, list(Node.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("timelyllm_ros."):
            found[cls.__name__] = cls
    return found


# config file, section -> (the node class it configures, how to build it and the nodes around it, its fully
# qualified name). The context is started with the file only (plus EXTRA_ARGS).
YAML_SECTIONS = {
    ("fleet_demo.yaml", "planner"): ("PlannerNode", lambda ctx: _planner(ctx, False), "/planner"),
    ("fleet_demo.yaml", "scheduler"): ("SchedulerNode", lambda ctx: _planner(ctx, False), "/scheduler"),
    ("fleet_demo.yaml", "exec_time"): ("ExecTimeNode", lambda ctx: [ExecTimeNode(context=ctx)], "/exec_time"),
    ("fleet_demo.yaml", "sim_fleet"): ("SimFleetNode", lambda ctx: [SimFleetNode(context=ctx)], "/sim_fleet"),
    ("drone_executor.yaml", "drone_executor"): ("DroneExecutorsNode", _drone_executors, "/drone_executor"),
    ("drone_executor.yaml", "/*/drone_executor"): ("DroneExecutorNode", _drone_executors,
                                                   "/drone_0/drone_executor"),
    ("arm_executor.yaml", "arm_executor"): ("ArmExecutorsNode", _arm_executors, "/arm_executor"),
    ("arm_executor.yaml", "/*/arm_executor"): ("ArmExecutorNode", _arm_executors, "/arm_0/arm_executor"),
    ("sim_arm_controller.yaml", "sim_arm_controller"): (
        "SimArmControllerNode", lambda ctx: [SimArmControllerNode(context=ctx)], "/sim_arm_controller"),
    ("recorder.yaml", "recorder"): ("RecorderNode", lambda ctx: [RecorderNode(context=ctx)], "/recorder"),
    ("replay.yaml", "replay"): ("ReplayNode", lambda ctx: [ReplayNode(context=ctx)], "/replay"),
}
EXTRA_ARGS = {"replay.yaml": ["-p", f"source:={LRTRACE}"],  # the one required parameter has no default
              "fleet_demo.yaml": ["-p", "autostart:=false"]}  # the planner: no engine is loaded
# Node classes whose parameters are in the files through a subclass.
COVERED_BY = {"RobotExecutorNode": ("DroneExecutorNode", "ArmExecutorNode")}


def params_files() -> dict[str, dict]:
    """config/*.yaml that are ROS 2 parameters files (the engine configs are not)."""
    out = {}
    for f in sorted(CONFIG.glob("*.yaml")):
        data = yaml.safe_load(f.read_text())
        if isinstance(data, dict) and data and all(isinstance(v, dict) and "ros__parameters" in v
                                                    for v in data.values()):
            out[f.name] = data
    return out


# -- (a) descriptions, for every node class --------------------------------------------------------------

def test_every_node_class_is_covered_here():
    """A new node class fails here until it gets a builder (and with it the checks below)."""
    assert set(node_classes()) - NOT_HERE == set(BUILDERS)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_every_parameter_has_a_description_and_refuses_read_only_and_out_of_range_sets(name, no_tello, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    with built(BUILDERS[name]) as nodes:
        node = nodes[0]
        assert type(node).__name__ == name
        for pname, d in own_params(node).items():
            assert d.description.strip(), f"{name}: parameter {pname} has no description"
            before = node.get_parameter(pname).value
            if d.read_only:
                res = node.set_parameters([Parameter(pname, value=before)])[0]
                assert not res.successful and pname in res.reason, (pname, res.reason)
            for r in d.floating_point_range:
                if math.isfinite(r.from_value):
                    res = node.set_parameters([Parameter(pname, value=r.from_value - 1.0)])[0]
                    assert not res.successful and pname in res.reason, (pname, res.reason)
                for bad in (math.nan, math.inf):
                    res = node.set_parameters([Parameter(pname, value=bad)])[0]
                    assert not res.successful and pname in res.reason, (pname, bad, res.reason)
            for r in d.integer_range:
                res = node.set_parameters([Parameter(pname, value=r.from_value - 1)])[0]
                assert not res.successful and pname in res.reason, (pname, res.reason)
            assert node.get_parameter(pname).value == before  # refused, not clamped


def test_rclpys_own_parameters_are_the_only_undescribed_ones():
    with ros() as ctx:
        n = Node("bare", context=ctx)
        try:
            assert set(n.list_parameters([], 0).names) == RCLPY_PARAMETERS
        finally:
            n.destroy_node()


# -- (b) config/*.yaml: complete, and loaded by rclpy ------------------------------------------------------

def test_every_params_file_section_is_checked_here():
    sections = {(f, s) for f, data in params_files().items() for s in data}
    assert {(f, s) for f, s in sections if s not in NOT_HERE_SECTIONS} == set(YAML_SECTIONS)


def test_every_node_class_with_parameters_has_a_section(no_tello, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sectioned = {cls for cls, _, _ in YAML_SECTIONS.values()}
    assert all(set(subs) <= sectioned for subs in COVERED_BY.values())
    with_params = set()
    for name, make in BUILDERS.items():
        with built(make) as nodes:
            if own_params(nodes[0]):
                with_params.add(name)
    assert with_params - set(COVERED_BY) <= sectioned, with_params - set(COVERED_BY) - sectioned


def section_lines(text: str, section: str) -> list[str]:
    """The lines of one top-level section of a YAML file."""
    out, inside = [], False
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            inside = line.split("#")[0].strip().rstrip(":").strip() == section
        elif inside:
            out.append(line)
    return out


@pytest.mark.parametrize("key", sorted(YAML_SECTIONS), ids=lambda k: f"{k[0]}:{k[1]}")
def test_params_file_section_lists_every_parameter_and_loads_through_rclpy(key, no_tello, tmp_path, monkeypatch):
    file, section = key
    cls, make, node_fqn = YAML_SECTIONS[key]
    path = CONFIG / file
    values = yaml.safe_load(path.read_text())[section]["ros__parameters"]
    lines = [ln for ln in section_lines(path.read_text(), section) if ln.startswith("    ")]
    assert len(lines) == len(values) and all("#" in ln for ln in lines), f"{file} [{section}]: one commented " \
                                                                          f"line per parameter: {lines}"
    extra = EXTRA_ARGS.get(file, [])
    monkeypatch.chdir(tmp_path)  # the recorder opens a bag in output_dir (relative)
    with built(make, "--params-file", str(path), *extra) as nodes:
        [node] = [n for n in nodes if fqn(n) == node_fqn]
        assert type(node).__name__ == cls
        declared = set(own_params(node))
        assert declared == set(values), (f"{file} [{section}] vs {node_fqn}: missing {declared - set(values)}, "
                                         f"unknown {set(values) - declared}")
        overridden = {a.split(":=")[0] for a in extra if ":=" in a}
        for k, v in values.items():
            if k not in overridden:
                assert node.get_parameter(k).value == v, (k, node.get_parameter(k).value, v)


def test_params_file_values_reach_the_node(tmp_path, no_tello):
    """Not just the defaults: a file with other values sets them (here the per-drone wildcard section)."""
    f = tmp_path / "drones.yaml"
    f.write_text(yaml.safe_dump({
        "drone_executor": {"ros__parameters": {"robots": ["d1", "d2"], "hosts": ["10.0.0.1", "10.0.0.2"],
                                               "time_scale": 0.5, "retry_count": 2}},
        "/*/drone_executor": {"ros__parameters": {"reorder_timeout_s": 4.0}}}))
    with built(_drone_executors, "--params-file", str(f)) as nodes:
        assert [fqn(n) for n in nodes] == ["/drone_executor", "/d1/drone_executor", "/d2/drone_executor"]
        assert [n.backend.host for n in nodes[1:]] == ["10.0.0.1", "10.0.0.2"]
        assert nodes[0].time_scale == 0.5 and nodes[0].retry_count == 2
        assert [n.reorder_timeout_s for n in nodes[1:]] == [4.0, 4.0]


# -- (c) refusals with a reason, no clamping ---------------------------------------------------------------

def _refused(node: Node, name: str, value, *, named: bool = True) -> str:
    """``named``: the reason names the parameter (rclpy 9.1.2's wrong-type reason does not)."""
    before = node.get_parameter(name).value
    res = node.set_parameters([Parameter(name, value=value)])[0]
    assert not res.successful, f"{name}={value!r} was accepted"
    assert name in res.reason or not named, res.reason
    assert node.get_parameter(name).value == before
    return res.reason


def _accepted(node: Node, name: str, value) -> None:
    res = node.set_parameters([Parameter(name, value=value)])[0]
    assert res.successful, res.reason
    assert node.get_parameter(name).value == value


def test_sim_fleet_refuses_bad_values_and_applies_good_ones_at_run_time():
    with built(lambda ctx: [SimFleetNode(context=ctx, parameter_overrides=[
            Parameter("robots", value=["a", "b"]), Parameter("time_scale", value=0.5)])]) as [fleet]:
        assert "out of range" in _refused(fleet, "time_scale", -1.0)
        assert "must be > 0" in _refused(fleet, "time_scale", 0.0)
        assert "finite" in _refused(fleet, "time_scale", math.inf)
        assert "Wrong parameter type" in _refused(fleet, "time_scale", 2, named=False)  # an int is not converted
        assert fleet.time_scale == 0.5
        _accepted(fleet, "time_scale", 2.0)
        assert fleet.time_scale == 2.0
        assert "unknown robot(s) ['c']" in _refused(fleet, "silent_robots", ["b", "c"])
        assert not any(r.silent for r in fleet.robots.values())
        _accepted(fleet, "silent_robots", ["b"])
        assert [r.robot_id for r in fleet.robots.values() if r.silent] == ["b"]
        _accepted(fleet, "silent_robots", [""])
        assert not any(r.silent for r in fleet.robots.values())
        for name, value in (("robots", ["a"]), ("robot_type", "arm"), ("seed", 1), ("reorder_timeout_s", 5.0)):
            assert "read-only" in _refused(fleet, name, value)


@pytest.mark.parametrize(("over", "match"), [
    (("time_scale", 0.0), "parameter time_scale: must be > 0, got 0.0"),
    (("time_scale", -2.0), "parameter time_scale: .*out of range"),
    (("time_scale", 1), "parameter time_scale: .*expecting type 'DOUBLE'"),
    (("reorder_timeout_s", math.nan), "parameter reorder_timeout_s: .*out of range"),
    (("robots", [""]), "parameter robots: must name at least one entry"),
    (("robots", ["a", "a"]), r"parameter robots: must not repeat entries, got \['a'\]"),
    (("robot_type", "boat"), "parameter robot_type: no skill set 'boat'"),
    (("silent_robots", ["drone_9"]), r"parameter silent_robots: unknown robot\(s\) \['drone_9'\]"),
])
def test_sim_fleet_refuses_bad_start_up_values_with_a_value_error(over, match):
    with ros() as ctx, pytest.raises(ValueError, match=match):
        SimFleetNode(context=ctx, parameter_overrides=[Parameter(over[0], value=over[1])])


def test_exec_time_learn_applies_at_run_time():
    with built(lambda ctx: [ExecTimeNode(context=ctx)]) as [node]:
        model = node.model("drone")
        assert node.learn and model.learn
        _accepted(node, "learn", False)
        assert not node.learn and not model.learn
        assert "Wrong parameter type" in _refused(node, "learn", "no", named=False)
        _accepted(node, "learn", True)
        assert node.learn and model.learn and node.model("drone").learn


def test_recorder_refuses_bad_values(tmp_path):
    with built(lambda ctx: _recorder(ctx, Parameter("output_dir", value=str(tmp_path)))) as [rec]:
        assert "output_dir: must not be empty" in _refused(rec, "output_dir", " ")
        assert "exists already" in _refused(rec, "bag_path", str(tmp_path))
        assert "read-only" in _refused(rec, "topics", ["/plan_requests"])
        _accepted(rec, "bag_path", str(tmp_path / "b1"))
        _accepted(rec, "recording", True)
        assert rec.recorder.path == tmp_path / "b1"
        _accepted(rec, "recording", False)
    with ros() as ctx:
        with pytest.raises(ValueError, match="parameter topics: topic '/nope': unknown"):
            RecorderNode(context=ctx, parameter_overrides=[Parameter("topics", value=["/nope"])])
        with pytest.raises(ValueError, match="parameter bag_path: .* exists already"):
            RecorderNode(context=ctx, parameter_overrides=[Parameter("bag_path", value=str(tmp_path))])


@pytest.mark.parametrize(("over", "match"), [
    (("source", ""), "parameter source: a bag or LRTrace workload is required"),
    (("speed", 0.0), "parameter speed: must be > 0"),
    (("speed", -1.0), "parameter speed: .*out of range"),
    (("timeout_s", math.inf), "parameter timeout_s: must be a finite number"),
    (("action", ""), "parameter action: must not be empty"),
])
def test_replay_refuses_bad_start_up_values(over, match):
    with ros() as ctx, pytest.raises(ValueError, match=match):
        ReplayNode(context=ctx, parameter_overrides=[Parameter("source", value=LRTRACE),
                                                     Parameter(over[0], value=over[1])])


def test_replay_parameters_are_read_only():
    with built(_replay) as [node]:
        assert "read-only" in _refused(node, "speed", 2.0)
        assert node.replayer.speed == 1.0


@pytest.mark.parametrize(("over", "match"), [
    ([("time_scale", 0.0)], "parameter time_scale: must be > 0"),
    ([("retry_count", 0)], "parameter retry_count: .*out of range"),
    ([("robots", ["d1", "d2"])], r"parameter hosts: one per robot, got 1 hosts for 2 robots"),
    ([("robots", ["d1", "d2"]), ("hosts", ["10.0.0.1", "10.0.0.1"])], "parameter hosts: must not repeat"),
])
def test_drone_executors_refuse_bad_start_up_values(over, match):
    with ros() as ctx, pytest.raises(ValueError, match=match):
        DroneExecutorsNode(context=ctx, parameter_overrides=[Parameter(n, value=v) for n, v in over])


@pytest.mark.parametrize(("make", "bad", "match"), [
    (lambda ctx, o: RobotExecutorNode("bot_bad", "fake_executor", context=ctx, parameter_overrides=o),
     ("reorder_timeout_s", -1.0), "parameter reorder_timeout_s: .*out of range"),
    (lambda ctx, o: RobotExecutorNode("bot_bad", "fake_executor", context=ctx, parameter_overrides=o),
     ("reorder_timeout_s", 0.0), "parameter reorder_timeout_s: must be > 0, got 0.0"),
    (lambda ctx, o: ArmExecutorsNode(context=ctx, parameter_overrides=o),
     ("time_scale", 0.0), "parameter time_scale: must be > 0"),
    (lambda ctx, o: ArmExecutorsNode(context=ctx, parameter_overrides=o),
     ("robots", ["x", "x"]), "parameter robots: must not repeat"),
    (lambda ctx, o: SimArmControllerNode(context=ctx, parameter_overrides=o),
     ("robots", [""]), "parameter robots: must name at least one entry"),
], ids=["executor-negative", "executor-zero", "arm_executors-time_scale", "arm_executors-robots",
        "sim_arm_controller-robots"])
def test_robot_nodes_refuse_bad_start_up_values(make, bad, match):
    with ros() as ctx, pytest.raises(ValueError, match=match):
        make(ctx, [Parameter(bad[0], value=bad[1])])


@pytest.mark.parametrize(("make", "read_only"), [
    (_drone_executors, {"/drone_executor": ["robots", "hosts", "time_scale", "retry_count"],
                        "/drone_0/drone_executor": ["reorder_timeout_s"]}),
    (_arm_executors, {"/arm_executor": ["robots", "time_scale"], "/arm_0/arm_executor": ["reorder_timeout_s"]}),
    (lambda ctx: [SimArmControllerNode(context=ctx)], {"/sim_arm_controller": ["robots"]}),
], ids=["drone", "arm", "sim_arm_controller"])
def test_what_robot_nodes_read_at_start_up_is_read_only(make, read_only, no_tello):
    with built(make) as nodes:
        for node in nodes:
            for name in read_only[fqn(node)]:
                assert "read-only" in _refused(node, name, node.get_parameter(name).value)
