"""The node graph from config, and the launch files under the real `ros2 launch` and `ros2` CLI.

The first half is plain Python: launch_graph's specs and the parameters a launch hands its nodes. The second
runs README.md's "Using it in a ROS 2 workspace" commands, exactly as written there, with the real launch,
launch_ros, ros2launch and ros2cli wheels from ``../shared/ros2-tools`` (installed into a temporary overlay, never
into the venv), on the session's colcon workspace (test/colcon_ws.py) plus composition_interfaces, which launch_ros
imports. Where that folder is absent those tests skip and say so. Every engine is the simulated one: no weights.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import yaml
from colcon_ws import VENV, clean_env, colcon_build
from procs import Proc

from timelyllm_ros.launch_graph import (
    LAUNCH_ARGUMENTS,
    NODE_HOSTS,
    fleet_launch,
    launch_arguments,
    node_specs,
    ros_namespace,
)
from timelyllm_ros.ros import NODE_EXECUTABLES

ROOT = Path(__file__).resolve().parent.parent


def test_demo_config_names_only_known_nodes_and_executables():
    specs = node_specs("fleet_demo.yaml")
    assert {s.executable for s in specs} == {"planner_node", "exec_time_node", "sim_fleet_node"}
    for s in specs:
        assert s.executable in NODE_EXECUTABLES
        assert NODE_EXECUTABLES[s.executable].startswith(s.module + ":")
    assert [s.executable for s in node_specs("fleet_demo.yaml", ["sim_fleet"])] == ["sim_fleet_node"]
    # scheduler and planner share one process
    assert len(node_specs("fleet_demo.yaml", ["planner", "scheduler"])) == 1


def test_bad_configs_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        node_specs("nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"planner": {}, "plannr": {}}))
    with pytest.raises(ValueError, match="unknown node.*plannr"):
        node_specs(bad)
    with pytest.raises(ValueError, match="--only: unknown node 'x'"):
        node_specs("fleet_demo.yaml", ["x"])
    assert set(NODE_HOSTS) >= set(yaml.safe_load((ROOT / "config" / "fleet_demo.yaml").read_text()))


def test_launch_files_use_the_tested_graph():
    for f in (ROOT / "launch").glob("*.launch.py"):
        src = f.read_text()
        assert "def generate_launch_description" in src and "launch_description(" in src, f.name


def test_a_launch_keys_the_config_by_namespace_and_applies_the_command_line():
    demo = yaml.safe_load((ROOT / "config" / "fleet_demo.yaml").read_text())
    args = {"config": "fleet_demo.yaml", "engine_config": "engine_sim.yaml", "policy": "fcfs",
            "sim_fleet.time_scale": "0.5", "sim_fleet.robots": "[drone_0, drone_9]", "planner.warm_up": "false",
            "use_sim_time": "true", "nav2.speed": "3"}  # the last two: an including launch file's, left alone
    fleet = fleet_launch("fleet_demo.yaml", namespace="fleet_a", arguments=args)
    assert fleet.namespace == "/fleet_a"
    # rcl matches a plain "planner:" key only in the root namespace: the file names every node fully
    assert list(fleet.parameters) == ["/fleet_a/planner", "/fleet_a/scheduler", "/fleet_a/exec_time",
                                      "/fleet_a/sim_fleet"]
    p = {k.rsplit("/", 1)[1]: v["ros__parameters"] for k, v in fleet.parameters.items()}
    assert p["planner"]["engine_config"] == "engine_sim.yaml" and p["planner"]["warm_up"] is False
    assert p["planner"]["autostart"] is False  # the launch drives the lifecycle
    assert p["planner"]["max_active_tasks"] == demo["planner"]["ros__parameters"]["max_active_tasks"]
    assert p["scheduler"]["policy"] == "fcfs"
    assert p["sim_fleet"]["time_scale"] == 0.5 and p["sim_fleet"]["robots"] == ["drone_0", "drone_9"]
    assert p["exec_time"] == demo["exec_time"]["ros__parameters"]
    assert yaml.safe_load(fleet.params_yaml()) == fleet.parameters
    # the root namespace, and a launch of the fleet alone: the planner's arguments do not apply there
    root = fleet_launch("fleet_demo.yaml", ["sim_fleet"], namespace="/", arguments={"policy": "fcfs"})
    assert root.namespace == "" and list(root.parameters) == ["/sim_fleet"]
    assert launch_arguments(["sim_fleet"]) == ["config", "namespace"]
    assert launch_arguments(None) == launch_arguments(["planner", "exec_time"]) == list(LAUNCH_ARGUMENTS)


@pytest.mark.parametrize("namespace, arguments, error", [
    ("1fleet", {}, "'1fleet' is not a ROS name"),
    ("fleet a", {}, "'fleet a' is not a ROS name"),
    ("", {"planner.max_active_tasks": "10"}, r"starts no 'planner' node \(it starts \['sim_fleet'\]\)"),
    ("", {"sim_fleet.": "1"}, "name a parameter after the '.'"),
    ("", {"sim_fleet.robots": "{a: 1}"}, "a parameter value is a number, a bool, a string or a list"),
    ("", {"sim_fleet.robots": "[a"}, "is not a YAML value"),
])
def test_a_launch_of_the_fleet_refuses_bad_arguments_by_name(namespace, arguments, error):
    with pytest.raises(ValueError, match=error):
        fleet_launch("fleet_demo.yaml", ["sim_fleet"], namespace=namespace, arguments=arguments)


def test_a_launch_of_the_planner_refuses_conflicting_arguments():
    with pytest.raises(ValueError, match="policy:=fcfs and scheduler.policy:=pud disagree"):
        fleet_launch("fleet_demo.yaml", arguments={"policy": "fcfs", "scheduler.policy": "pud"})
    with pytest.raises(ValueError, match="planner.autostart: the launch configures and activates"):
        fleet_launch("fleet_demo.yaml", arguments={"planner.autostart": "true"})
    assert ros_namespace(" /fleet_a/east/ ") == "/fleet_a/east"


@pytest.mark.ros
def test_timelyllm_up_starts_processes_and_stops_cleanly_on_ctrl_c(tmp_path):
    """Real processes over DDS: the simulated fleet and the exec-time node come up, Ctrl-C ends both."""
    cfg = tmp_path / "graph.yaml"
    cfg.write_text(yaml.safe_dump({
        "exec_time": {"ros__parameters": {"learn": False}},
        "sim_fleet": {"ros__parameters": {"robots": ["drone_a"], "robot_type": "drone"}},
    }))
    proc = subprocess.Popen([sys.executable, "-m", "timelyllm_ros.cli", "up", "--config", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ.copy(),
                            start_new_session=True)
    import rclpy
    import rclpy.executors

    from timelyllm_ros.srv import EstimateExecTime

    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    try:
        node = rclpy.create_node("launch_probe", context=ctx)
        cli = node.create_client(EstimateExecTime, "/estimate_exec_time")
        assert cli.wait_for_service(timeout_sec=60), "exec_time node never came up"
        fut = cli.call_async(EstimateExecTime.Request(robot_type="drone", segment_text="mf(50);"))
        executor = rclpy.executors.SingleThreadedExecutor(context=ctx)
        rclpy.spin_until_future_complete(node, fut, executor=executor, timeout_sec=20)
        r = fut.result()
        assert r.ok and r.min_s == pytest.approx(0.0072 * 50 + 1.8144, rel=1e-6)
        names = set()
        end = time.monotonic() + 20
        # Node names travel on their own discovery topic: under load the exec_time node's name came after its
        # service did (CI), so wait for both names, not just the fleet's.
        while not {"sim_fleet", "exec_time"} <= names and time.monotonic() < end:
            names = {n for n, _ in node.get_node_names_and_namespaces()}
            time.sleep(0.2)
        assert "sim_fleet" in names and "exec_time" in names
        node.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group, as in a terminal
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "starting sim_fleet_node" in out and "starting exec_time_node" in out
    assert "killing" not in out


# -- README's ROS 2 workflow under the real ros2 launch and ros2 CLI ------------------------------------------------
ROS2_TOOLS = ROOT.parent / "shared" / "ros2-tools"
# The tools the README's commands use, installed in one pip call (a second --target install empties the ament
# index: ../shared/ros2-tools/README.md).
TOOL_WHEELS = ("launch", "launch_xml", "launch_yaml", "launch_ros", "ros2launch", "ros2cli", "ros2run", "ros2param",
               "ros2topic", "ros2node", "ros2service", "ros2action", "ros2lifecycle", "ros2pkg", "ros2interface",
               "rosidl_runtime_py", "osrf_pycommon")
VERIFIED = ("launch", "launch_ros", "ros2cli")  # the versions README.md names

# README.md runs these, in this order (test_readme_lists_exactly_the_commands_the_tests_run).
TASK = '--task "Scene: [] Task: [A] Could you find the cat?"'
LAUNCH_DEMO = "ros2 launch timelyllm_ros fleet_demo.launch.py engine_config:=engine_sim.yaml"
NODE_LIST = "ros2 node list"
LIFECYCLE_GET = "ros2 lifecycle get /planner"
ACTION_LIST = "ros2 action list"
PLAN = f"ros2 run timelyllm_ros plan_client --robot-id drone_0 {TASK}"
RESULTS_ECHO = "ros2 topic echo --once /plan_results"
POLICY_GET = "ros2 param get /scheduler policy"
POLICY_SET = "ros2 param set /scheduler policy fcfs"
STATE_ECHO = "ros2 topic echo --once --field policy /scheduler_state"
DEACTIVATE = "ros2 lifecycle set /planner deactivate"
WORKFLOW = (LAUNCH_DEMO, NODE_LIST, LIFECYCLE_GET, ACTION_LIST, PLAN, RESULTS_ECHO, POLICY_GET, POLICY_SET,
            STATE_ECHO, DEACTIVATE)
# Two fleets on one domain: the README's split launch files in the root namespace, and fleet_a beside them.
LAUNCH_PLANNER = "ros2 launch timelyllm_ros planner.launch.py engine_config:=engine_sim.yaml"
LAUNCH_FLEET = "ros2 launch timelyllm_ros sim_fleet.launch.py"
LAUNCH_FLEET_A = ("ros2 launch timelyllm_ros fleet_demo.launch.py config:=my_fleet.yaml namespace:=fleet_a "
                  "policy:=fcfs sim_fleet.time_scale:=0.5")
POLICY_GET_A = "ros2 param get /fleet_a/scheduler policy"
TIME_SCALE_GET_A = "ros2 param get /fleet_a/sim_fleet time_scale"
PLAN_A = (f"ros2 run timelyllm_ros plan_client --robot-id drone_9 --task-id fleet_a-1 {TASK} "
          "--ros-args -r __ns:=/fleet_a")
PLAN_ROOT = f"ros2 run timelyllm_ros plan_client --robot-id drone_0 --task-id root-1 {TASK}"
RESULT_OF_A_AT_ROOT = ('ros2 service call /get_plan_result timelyllm_ros/srv/GetPlanResult '
                       '"{task_id: fleet_a-1}"')
RESULT_OF_ROOT_AT_A = ('ros2 service call /fleet_a/get_plan_result timelyllm_ros/srv/GetPlanResult '
                       '"{task_id: root-1}"')
TOPIC_LIST = "ros2 topic list"
TWO_FLEETS = (LAUNCH_PLANNER, LAUNCH_FLEET, LAUNCH_FLEET_A, POLICY_GET_A, TIME_SCALE_GET_A, PLAN_A, PLAN_ROOT,
              RESULT_OF_A_AT_ROOT, RESULT_OF_ROOT_AT_A, TOPIC_LIST)
# my_fleet.yaml, as README.md shows it: the simulated engine, and a fleet with a robot the root fleet lacks
MY_FLEET = """\
planner:
  ros__parameters:
    engine_config: engine_sim.yaml
scheduler:
  ros__parameters:
    policy: pud-shed
exec_time:
  ros__parameters:
    learn: true
sim_fleet:
  ros__parameters:
    robots: [drone_0, drone_9]
"""

UP_TIMEOUT_S = 180  # liveness bounds on a busy machine: the launch comes up in ~4 s when idle
CLI_TIMEOUT_S = 120
STOP_S = 10  # the bound: Ctrl-C stops every process within 10 s


def _readme_ros2_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Using it in a ROS 2 workspace")
    return text[start:text.index("\n## ", start + 1)]


def _readme_ros2_commands() -> list[str]:
    """The ``ros2 ...`` lines of the section's code blocks, without their trailing comments."""
    blocks = re.findall(r"```bash\n(.*?)```", _readme_ros2_section(), flags=re.S)
    lines = [re.sub(r"\s+#\s.*$", "", line).strip() for b in blocks for line in b.splitlines()]
    return [" ".join(line.split()) for line in lines if line.startswith("ros2 ")]


def test_readme_lists_exactly_the_commands_the_tests_run():
    assert _readme_ros2_commands() == [*WORKFLOW, *TWO_FLEETS]
    assert MY_FLEET in _readme_ros2_section(), "README.md's my_fleet.yaml differs from the one the test runs"


class Ros2:
    """The README's shell: a workspace's install/setup.bash sourced, then the ros2-tools overlay on top."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env, self.cwd = env, cwd
        self.launches: list[Proc] = []

    def _env(self) -> dict[str, str]:
        # the module's domain (conftest); rcl's log files in the test's folder, not ~/.ros
        return {**self.env, "ROS_DOMAIN_ID": os.environ["ROS_DOMAIN_ID"], "ROS_LOG_DIR": str(self.cwd / "ros_log")}

    def run(self, command: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
        proc = subprocess.Popen(shlex.split(command), cwd=self.cwd, env=self._env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # `ros2 run` and the executable it started
            out, err = proc.communicate()
            pytest.fail(f"`{command}` still running after {timeout} s\n{out}\n{err}\n{self.report()}")
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def out(self, command: str) -> str:
        """The output (stripped) of ``command``'s first run that succeeds. A query made while discovery is still
        going on fails ("Node not found": ros2 lifecycle lists only nodes whose get_state service it has seen);
        a user runs it again (../shared/ros2-tools/README.md, "Pitfalls"), and so does the test."""
        return self.until(command, lambda r: r.returncode == 0).stdout.strip()

    def until(self, command: str, ok: Callable[[subprocess.CompletedProcess], bool],
              timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
        """Run ``command`` until ``ok`` holds for its result (discovery takes a while); fail after ``timeout``."""
        end = time.monotonic() + timeout
        while True:
            r = self.run(command, timeout=max(10.0, end - time.monotonic()))
            if ok(r):
                return r
            if time.monotonic() > end:
                pytest.fail(f"`{command}` never gave what was expected within {timeout} s; last: exit "
                            f"{r.returncode}\n{r.stdout}\n{r.stderr}\n{self.report()}")
            time.sleep(0.5)  # a retry's pace, not a synchronisation

    def launch(self, command: str, log_dir: Path) -> Proc:
        """Start ``command`` in a session of its own (a terminal's Ctrl-C is SIGINT to its process group)."""
        name = f"launch{len(self.launches)}"
        p = Proc(name, shlex.split(command), env={**self._env(), "ROS_LOG_DIR": str(log_dir / name)},
                 log_dir=log_dir, cwd=str(self.cwd))
        self.launches.append(p.start())
        return p

    def report(self) -> str:
        return "\n".join(f"----- {p.name}: {shlex.join(p.cmd)} -----\n{p.tail(40)}" for p in self.launches)

    def close(self) -> None:
        for p in self.launches:
            p.stop(timeout=STOP_S)
        self.launches.clear()
        self.run("ros2 daemon stop")  # started by the first query; it would outlive the test


def _composition_interfaces(ws: Path) -> None:
    """launch_ros imports composition_interfaces, a compiled package: build it in the same workspace."""
    src = ws / "src" / "composition_interfaces"
    if not (ws / "install" / "composition_interfaces").is_dir():
        shutil.copytree(ROS2_TOOLS / "src" / "composition_interfaces", src, dirs_exist_ok=True)
        for d, _, _ in os.walk(src):  # shared/ is read-only; its copy is ours to delete
            os.chmod(d, 0o755)
        colcon_build(ws, "composition_interfaces", "-DBUILD_TESTING=OFF")


def _overlay_env(ws: Path, overlay: Path) -> dict[str, str]:
    """The environment after ``. ws/install/setup.bash`` and the overlay's three exports (ros2-tools README)."""
    out = subprocess.run(["bash", "-c", '. "$1" && env -0', "_", str(ws / "install" / "setup.bash")],
                         env=clean_env(), capture_output=True, check=True, timeout=60).stdout
    env = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    for var in ("PYTHONPATH", "AMENT_PREFIX_PATH"):
        env[var] = os.pathsep.join(p for p in (str(overlay), env.get(var, "")) if p)
    env["PATH"] = os.pathsep.join([str(overlay / "bin"), env["PATH"]])
    env["PYTHONUNBUFFERED"] = "1"  # launch's and the nodes' lines as they are written
    return env


@pytest.fixture(scope="module")
def ros2_setup(request, tmp_path_factory) -> tuple[dict[str, str], dict[str, str]]:
    if not (ROS2_TOOLS / "wheels").is_dir():
        pytest.skip(f"{ROS2_TOOLS} is absent: no real launch / ros2cli wheels to run the README's ROS 2 workflow "
                    "with (they are not on the package index)")
    colcon_ws = request.getfixturevalue("colcon_ws")  # built only where the tools are
    _composition_interfaces(colcon_ws)
    overlay = tmp_path_factory.mktemp("ros2-overlay")
    pip = subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index",
                          "--no-deps", "--find-links", str(ROS2_TOOLS / "wheels"), "--target", str(overlay),
                          *TOOL_WHEELS], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, f"pip install into {overlay} failed:\n{pip.stdout}\n{pip.stderr}"
    versions = dict(d.name.removesuffix(".dist-info").split("-", 1) for d in overlay.glob("*.dist-info"))
    return _overlay_env(colcon_ws, overlay), versions


@pytest.fixture
def ros2(ros2_setup, tmp_path):
    sh = Ros2(ros2_setup[0], tmp_path)
    try:
        yield sh
    finally:
        sh.close()


def test_readme_names_the_verified_tool_versions(ros2_setup):
    _, versions = ros2_setup
    section = _readme_ros2_section()
    for pkg in VERIFIED:
        assert f"{pkg} {versions[pkg]}" in section, f"README.md does not say {pkg} {versions[pkg]} ran"


_LOG = re.compile(r"\[(?:INFO|WARN|ERROR)\] \[(\d+\.\d+)\] \[([\w.]+)\]: (.*)")


def _logged_at(launch: Proc, node: str, text: str) -> float:
    """The rcutils wall-clock stamp of the node's first output line that starts with ``text``."""
    line = launch.wait_for(rf"\] \[{re.escape(node)}\]: {re.escape(text)}", UP_TIMEOUT_S)
    m = _LOG.search(line)
    assert m, line
    return float(m.group(1))


def _started_at(launch: Proc, executable: str) -> float:
    """When launch spawned ``executable``: the stamp of its "process started" line in launch's own log file."""
    log_dir = launch.wait_for(r"All log files can be found below ", 30).split("below ", 1)[1].strip()
    started = re.compile(rf"\[{executable}-\d+\]: process started")
    launch.wait_for(started.pattern, UP_TIMEOUT_S)
    end = time.monotonic() + 30  # the file handler writes the record just after the screen's
    while time.monotonic() < end:
        for line in (Path(log_dir) / "launch.log").read_text().splitlines():
            if started.search(line):
                return float(line.split()[0])
        time.sleep(0.1)
    raise AssertionError(f"no 'process started' line for {executable} in {log_dir}/launch.log")


def _planner_up_in_order(launch: Proc, ns: str = "", others: tuple[str, ...] = ("exec_time", "sim_fleet")) -> None:
    """configure, then activate, then the other nodes: launch spawned each only after the planner was active."""
    planner = f"{ns.strip('/').replace('/', '.')}.planner".lstrip(".")
    configured = _logged_at(launch, planner, "planner configured")
    active = _logged_at(launch, planner, "planner ready: active")
    assert configured <= active
    for node in others:
        spawned = _started_at(launch, f"{node}_node")
        assert spawned > active, f"{node}_node was started {active - spawned:.3f} s before the planner was active"


def _stop_all(ros2: Ros2) -> None:
    """Ctrl-C (SIGINT to each launch's process group): every process ends within STOP_S, none left behind."""
    nodes = {p.name: psutil.Process(p.pid).children() for p in ros2.launches}
    assert all(nodes.values()), nodes  # each launch's nodes are running
    tree = {p.name: [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)] for p in ros2.launches}
    t0 = time.monotonic()
    for p in ros2.launches:
        os.killpg(p.pid, signal.SIGINT)
    for p in ros2.launches:
        _, alive = psutil.wait_procs(tree[p.name], timeout=max(0.0, t0 + STOP_S - time.monotonic()))
        assert not alive, f"{p.name}: still running {STOP_S} s after Ctrl-C: {alive}\n{ros2.report()}"
        assert p.proc.wait(timeout=5) == 0, ros2.report()
        p.stop()  # reaps the reader; nothing is left to signal
        out = "\n".join(p.lines)
        assert "process has died" not in out, ros2.report()
        assert out.count("process has finished cleanly") == len(nodes[p.name]), ros2.report()
    print(f"Ctrl-C stopped {sum(map(len, tree.values()))} processes in {time.monotonic() - t0:.1f} s")
    ros2.launches.clear()


@pytest.mark.ros
@pytest.mark.colcon
def test_readme_ros2_workflow_under_the_real_launch_and_cli(ros2, tmp_path):
    t0 = time.monotonic()
    launch = ros2.launch(LAUNCH_DEMO, tmp_path)
    _planner_up_in_order(launch)
    ros2.until(NODE_LIST, lambda r: {"/planner", "/scheduler", "/exec_time", "/sim_fleet"} <= set(r.stdout.split()))
    assert ros2.out(LIFECYCLE_GET) == "active [3]"
    assert "/plan_task" in ros2.out(ACTION_LIST).split()
    r = ros2.run(PLAN)
    assert r.returncode == 0 and "result: done (done)" in r.stdout, (r.stdout, r.stderr)
    task_id = re.search(r"drone_0 (\S+) #0:", r.stdout).group(1)
    echoed = yaml.safe_load(ros2.out(RESULTS_ECHO).split("\n---")[0])  # a late reader gets the result
    assert echoed["task_id"] == task_id and echoed["robot_id"] == "drone_0" and echoed["status"] == 0, echoed  # DONE
    assert ros2.out(POLICY_GET) == "String value is: pud-shed"
    assert ros2.out(POLICY_SET) == "Set parameter successful"
    ros2.until(STATE_ECHO, lambda r: r.stdout.split("\n---")[0].strip() == "fcfs")  # a period later
    assert ros2.out(DEACTIVATE) == "Transitioning successful"
    r = ros2.run(PLAN)
    assert r.returncode == 1 and "result: busy (planner not active" in r.stdout, (r.stdout, r.stderr)
    _stop_all(ros2)
    print(f"README workflow: {time.monotonic() - t0:.1f} s")


@pytest.mark.ros
@pytest.mark.colcon
def test_two_fleets_on_one_domain_each_serve_their_own_goals(ros2, tmp_path):
    """fleet_a (namespace:=fleet_a, with my_fleet.yaml and overrides) beside the README's split launch files in the
    root namespace: each planner holds only its own tasks, and each fleet's robots have topics of their own."""
    t0 = time.monotonic()
    (tmp_path / "my_fleet.yaml").write_text(MY_FLEET)
    planner, fleet, fleet_a = (ros2.launch(c, tmp_path) for c in (LAUNCH_PLANNER, LAUNCH_FLEET, LAUNCH_FLEET_A))
    _planner_up_in_order(planner, others=("exec_time",))
    _planner_up_in_order(fleet_a, ns="/fleet_a")
    fleet.wait_for(r"\[sim_fleet\]: 8 simulated drone robots", UP_TIMEOUT_S)
    fleet_a.wait_for(r"\[fleet_a.sim_fleet\]: 2 simulated drone robots: drone_0, drone_9", UP_TIMEOUT_S)
    nodes = {f"{ns}/{n}" for ns in ("", "/fleet_a") for n in ("planner", "scheduler", "exec_time", "sim_fleet")}
    ros2.until(NODE_LIST, lambda r: nodes <= set(r.stdout.split()))
    assert ros2.out(POLICY_GET_A) == "String value is: fcfs"  # policy:= over my_fleet.yaml's
    assert ros2.out(POLICY_GET) == "String value is: pud-shed"
    assert ros2.out(TIME_SCALE_GET_A) == "Double value is: 0.5"
    for command in (PLAN_A, PLAN_ROOT):
        r = ros2.run(command)
        assert r.returncode == 0 and "result: done (done)" in r.stdout, (command, r.stdout, r.stderr)
    for command in (RESULT_OF_A_AT_ROOT, RESULT_OF_ROOT_AT_A):  # the other fleet's planner never saw the task
        r = ros2.run(command)
        assert r.returncode == 0 and "GetPlanResult_Response(state=0" in r.stdout, (command, r.stdout, r.stderr)
    # drone_0 is in both fleets, each on its own topic (absolute names would give one /drone_0/plan_segments)
    topics = {"/drone_0/plan_segments", "/fleet_a/drone_0/plan_segments"}
    ros2.until(TOPIC_LIST, lambda r: topics <= set(r.stdout.split()))
    _stop_all(ros2)
    print(f"two fleets: {time.monotonic() - t0:.1f} s")
