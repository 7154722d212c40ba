"""/diagnostics over real rclpy, read as a fleet operator reads it: a DiagnosticArray subscriber on its own node.

Planner: engine, queue, deadline-miss rate and journal statuses, thresholds crossed by setting parameters at run
time, an engine failure as ERROR. Executors: an arm (controller link, emergency stop) and an emulated Tello (link,
battery, emergency stop, a drone that is gone). No timing targets: every wait is a bounded poll.
"""

from __future__ import annotations

import threading

import pytest
from waiting import wait_until

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("diagnostic_msgs")
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy  # noqa: E402
from test_delivery import ControlledEngine, DStack  # noqa: E402
from test_executors_ros import Planner, needs_netns  # noqa: E402

from timelyllm_ros.msg import TimeUtility  # noqa: E402
from timelyllm_ros.ros.diagnostics import (  # noqa: E402
    DIAGNOSTICS_TOPIC,
    RollingOutcomes,
    Status,
    attach_planner_diagnostics,
    level_name,
)
from timelyllm_ros.ros.spin import PooledExecutor, Spinner  # noqa: E402

pytestmark = pytest.mark.ros

CAT = "Scene: [] Task: [A] Could you find the cat? If so, go to it."
ON_TIME = TimeUtility(level="", alpha=-1.0, beta=1.0, ert=1000.0)
LATE = TimeUtility(level="", alpha=-1.0, beta=1.0, ert=0.0)  # any response is after an ERT of 0
OPERATOR_QOS = QoSProfile(depth=200, reliability=QoSReliabilityPolicy.RELIABLE, history=QoSHistoryPolicy.KEEP_LAST)


class Operator:
    """A DiagnosticArray subscriber on ``node``: the latest status of each name, and every array received."""

    def __init__(self, node) -> None:
        self.arrays: list[DiagnosticArray] = []
        self.lock = threading.Lock()
        self.sub = node.create_subscription(DiagnosticArray, DIAGNOSTICS_TOPIC, self._on, OPERATOR_QOS)

    def _on(self, msg: DiagnosticArray) -> None:
        with self.lock:
            self.arrays.append(msg)
            del self.arrays[:-500]  # bounded

    def latest(self, name: str) -> DiagnosticStatus | None:
        with self.lock:
            for arr in reversed(self.arrays):
                for st in arr.status:
                    if st.name == name:
                        return st
        return None

    def wait_for(self, name: str, pred=lambda st, v: True, timeout: float = 20.0) -> tuple[DiagnosticStatus, dict]:
        """The first latest status of ``name`` for which ``pred(status, values)`` holds (bounded wait)."""
        got: list = []

        def check() -> bool:
            st = self.latest(name)
            if st is not None and pred(st, values(st)):
                got.append(st)
                return True
            return False

        if not wait_until(check, timeout, interval=0.05):
            st = self.latest(name)
            raise AssertionError(f"{name}: never matched; latest: "
                                 f"{None if st is None else (level_name(st.level), st.message, values(st))}")
        return got[0], values(got[0])


def values(st: DiagnosticStatus) -> dict[str, str]:
    return {kv.key: kv.value for kv in st.values}


def lvl(st: DiagnosticStatus) -> str:
    return level_name(st.level)


# -- planner ----------------------------------------------------------------------------------------------------

FAST = [Parameter("diagnostics_period_s", value=0.2)]


@pytest.fixture()
def stacks():
    """test_delivery's DStack (planner + scheduler + simulated fleet + client, an engine the test can hold or
    fail), closed at the end."""
    made: list[DStack] = []

    def make(**kw) -> DStack:
        made.append(DStack(**kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _planner_diag(s: DStack):
    """The planner's diagnostics, attached here in case the node does not attach them itself."""
    return attach_planner_diagnostics(s.planner)


def _set(node, **params) -> None:
    results = node.set_parameters([Parameter(k, value=v) for k, v in params.items()])
    assert all(r.successful for r in results), [r.reason for r in results]


def test_planner_reports_engine_queue_deadlines_and_journal_with_thresholds_from_parameters(stacks):
    s = stacks(params=[*FAST, Parameter("diagnostics_miss_rate_warn", value=0.4),
                           Parameter("diagnostics_miss_rate_error", value=0.9)])
    handle = _planner_diag(s)
    assert attach_planner_diagnostics(s.planner) is handle, "a second attach must reuse the first"
    op = Operator(s.client)
    name = handle.diag.name

    # one /diagnostics writer on the planner node, however often it was attached
    assert wait_until(lambda: op.latest(name("engine")) is not None, 20)
    writers = [i for i in s.client.get_publishers_info_by_topic(DIAGNOSTICS_TOPIC) if i.node_name == "planner"]
    assert len(writers) == 1, writers
    with op.lock:
        arrays = list(op.arrays)
    for arr in arrays:  # each array carries each planner status once
        names = [st.name for st in arr.status if st.name.startswith("planner: ")]
        assert len(names) == len(set(names)), names

    st, v = op.wait_for(name("engine"))
    assert lvl(st) == "OK", st.message
    assert v["backend"] == "sim" and v["model"] == "simulated" and v["state"] == "serving"
    for key in ("batch", "max_batch", "waiting", "tokens_per_s", "step_time_s", "kv_cache_usage", "restarts"):
        assert key in v, key
    assert float(v["tokens_per_s"]) >= 0 and v["restarts"] == "0"
    # the step-time estimate admission runs on, and where it started (the simulated engine's own model)
    assert "simulated engine" in v["latency_seed"], v
    assert float(v["latency_decode_ms_b1"]) > 0 and float(v["latency_prefill_ms_per_token"]) > 0, v
    st, v = op.wait_for(name("queue"))
    assert lvl(st) == "OK" and v["queue_length"] == "0", (st.message, v)
    st, v = op.wait_for(name("journal"))
    assert lvl(st) == "OK" and v["state"] == "off", (st.message, v)
    st, v = op.wait_for(name("deadlines"))
    assert lvl(st) == "OK" and v["results"] == "0" and "ERT" in v["definition"], (st.message, v)

    # deadline-miss rate: one result on time, one after its ERT -> 50 %: above warn (0.4), not above error (0.9)
    _, h_ok = s.send_id("drone_0", CAT, tuf=ON_TIME, task_id="diag-on-time")
    _, h_late = s.send_id("drone_1", CAT, tuf=LATE, task_id="diag-late")
    for h in (h_ok, h_late):
        assert s.full_result(h)[1].status == 0
    st, v = op.wait_for(name("deadlines"), lambda st, v: v["results"] == "2")
    assert v["missed"] == "1" and v["late"] == "1" and v["on_time"] == "1" and v["miss_rate"] == "0.500", v
    assert lvl(st) == "WARN" and "1 of 2" in st.message and "diagnostics_miss_rate_warn" in st.message, st.message
    _set(s.planner, diagnostics_miss_rate_error=0.3)  # thresholds apply at the next publication
    st, _ = op.wait_for(name("deadlines"), lambda st, v: lvl(st) == "ERROR")
    assert "diagnostics_miss_rate_error" in st.message, st.message

    # queue length: hold the engine, queue goals past a tiny threshold -> WARN, then ERROR; release -> OK
    s.engine.gate.clear()
    _set(s.planner, diagnostics_queue_warn=1)
    held = [s.send_id("drone_0", CAT, tuf=ON_TIME, task_id="diag-q-0")[1]]
    # the engine thread waits in its step with this one: the next goals stay queued in the scheduler
    assert wait_until(lambda: s.planner.core.snapshot()["running"] == 1, 10)
    held += [s.send_id(f"drone_{i}", CAT, tuf=ON_TIME, task_id=f"diag-q-{i}")[1] for i in range(1, 4)]
    st, v = op.wait_for(name("queue"), lambda st, v: int(v["queue_length"]) > 1)
    assert lvl(st) == "WARN" and "diagnostics_queue_warn=1" in st.message, (st.message, v)
    _set(s.planner, diagnostics_queue_error=1)
    st, _ = op.wait_for(name("queue"), lambda st, v: lvl(st) == "ERROR")
    assert "diagnostics_queue_error=1" in st.message, st.message
    s.engine.gate.set()
    for h in held:
        assert s.full_result(h)[1].status == 0
    op.wait_for(name("queue"), lambda st, v: lvl(st) == "OK" and v["queue_length"] == "0")


def test_planner_engine_down_is_an_error_and_a_recent_restart_a_warning(stacks):
    restart_gate = threading.Event()

    def factory():  # the planner is "restarting its engine" until the test says
        restart_gate.wait(30)
        return ControlledEngine()

    s = stacks(held=True, engine_factory=factory,
                   params=[*FAST, Parameter("engine_restart_backoff_s", value=0.05)])
    try:
        name = _planner_diag(s).diag.name
        op = Operator(s.client)
        op.wait_for(name("engine"), lambda st, v: lvl(st) == "OK")
        _, h = s.send_id("drone_0", CAT, task_id="diag-crash")
        assert wait_until(lambda: s.planner.core.pending() == 1, 10)
        s.engine.fail_next_step("CUDA error: device lost (injected)")
        s.engine.gate.set()
        assert s.full_result(h)[1].status != 0
        st, v = op.wait_for(name("engine"), lambda st, v: lvl(st) == "ERROR")
        assert v["state"] == "down" and "device lost" in v["error"] and "engine down" in st.message, (st.message, v)
    finally:
        restart_gate.set()
    st, v = op.wait_for(name("engine"), lambda st, v: v["restarts"] == "1" and v["state"] == "serving")
    assert lvl(st) == "WARN" and "restarted 1x" in st.message, st.message
    # the task the failure ended counts as a deadline miss
    st, v = op.wait_for(name("deadlines"), lambda st, v: v["results"] == "1")
    assert v["failed"] == "1" and v["missed"] == "1" and lvl(st) == "ERROR", (st.message, v)
    _set(s.planner, diagnostics_window_s=1.0)  # the restart and the failure leave the window
    op.wait_for(name("engine"), lambda st, v: lvl(st) == "OK")
    op.wait_for(name("deadlines"), lambda st, v: lvl(st) == "OK" and v["results"] == "0")


# -- executors --------------------------------------------------------------------------------------------------

class _Spun:
    """Nodes spun in a context of their own, and an operator node beside them."""

    def __init__(self, make_nodes) -> None:
        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx)
        self.nodes = list(make_nodes(self.ctx))
        self.op_node = rclpy.create_node("operator", context=self.ctx)
        self.op = Operator(self.op_node)
        self.ex = PooledExecutor(num_threads=4, context=self.ctx)
        for n in [*self.nodes, self.op_node]:
            self.ex.add_node(n)
        self.spin = Spinner(self.ex)
        self.spin.start()

    def add(self, node) -> None:
        self.nodes.append(node)
        self.ex.add_node(node)

    def close(self) -> None:
        self.spin.stop()  # before the executor's shutdown, which destroys what in-flight handlers still use
        self.ex.shutdown(timeout_sec=5)
        for n in reversed([*self.nodes, self.op_node]):
            n.destroy_node()
        rclpy.shutdown(context=self.ctx)
        assert not self.spin.errors, self.spin.errors[0]


def test_arm_executor_reports_its_controller_link_state_and_emergency_stop():
    from timelyllm_ros.ros.arm_executor_node import ArmExecutorNode
    from timelyllm_ros.ros.sim_arm_controller_node import SimArmControllerNode

    sp = _Spun(lambda ctx: [ArmExecutorNode("arm_d", time_scale=0.05, context=ctx,
                                            parameter_overrides=FAST,
                                            scene="Scene: [red_box x:0.40 y:0.10, tray x:0.30 y:-0.40]")])
    planner = None
    try:
        arm = sp.nodes[0]
        name = arm.diagnostics.name("robot")
        assert name == "arm_d/arm_executor: robot"
        st, v = sp.op.wait_for(name)  # no controller yet: the arm cannot move
        assert lvl(st) == "ERROR" and st.hardware_id == "arm_d", (st.message, v)
        assert v["link"] == "down" and "no controller" in st.message and v["state"] == "idle", v
        assert v["emergency_stop"] == "clear" and "battery_pct" not in v
        sp.add(SimArmControllerNode(context=sp.ctx, parameter_overrides=[Parameter("robots", value=["arm_d"])]))
        st, v = sp.op.wait_for(name, lambda st, v: lvl(st) == "OK")
        assert v["link"] == "up" and "controller on /arm_d/joint_trajectory" in v["link_detail"], v

        planner = Planner(["arm_d"])
        planner.send("arm_d", "t-diag", 0, "move_to('red_box');", final=True)
        planner.wait_done(1)
        st, v = sp.op.wait_for(name, lambda st, v: "last_segment" in v)
        assert v["last_segment"] == "t-diag[0] succeeded" and v["state"] == "idle", v

        assert planner.call("/arm_d/emergency_stop").success
        st, v = sp.op.wait_for(name, lambda st, v: lvl(st) == "ERROR")
        assert v["emergency_stop"] == "active" and "/arm_d/reset_emergency" in st.message, (st.message, v)
        assert planner.call("/arm_d/reset_emergency").success
        st, v = sp.op.wait_for(name, lambda st, v: lvl(st) == "OK")
        assert v["emergency_stop"] == "clear"
    finally:
        if planner is not None:
            planner.close()
        sp.close()


@needs_netns
def test_tello_executor_reports_link_battery_emergency_stop_and_a_drone_that_is_gone(tmp_path):
    from devtools.emulated_fleet import start_emulated_fleet

    with start_emulated_fleet(["drone_g"], speed=0.02, log_dir=tmp_path) as fleet:
        node = fleet.nodes["drone_g"]
        op_ctx_nodes = _Spun(lambda ctx: [])
        planner = None
        try:
            op = op_ctx_nodes.op
            name = node.diagnostics.name("robot")
            assert name == "drone_g/drone_executor: robot"
            st, v = op.wait_for(name)
            assert lvl(st) == "OK" and st.hardware_id == "drone_g", (st.message, v)
            assert v["link"] == "not connected" and v["state"] == "idle" and v["emergency_stop"] == "clear", v

            planner = Planner(["drone_g"])
            planner.send("drone_g", "t-g", 0, "mf(50);", final=True)
            planner.wait_done(1)
            st, v = op.wait_for(name, lambda st, v: v["link"] == "up" and "last_segment" in v)
            assert lvl(st) == "OK" and v["battery_pct"] == "87.000", (st.message, v)  # the emulator's battery
            assert float(v["last_contact_age_s"]) >= 0 and v["last_segment"] == "t-g[0] succeeded", v

            _set(node, diagnostics_battery_warn_pct=90.0)  # 87 % is now low
            st, _ = op.wait_for(name, lambda st, v: lvl(st) == "WARN")
            assert "battery 87 %" in st.message and "diagnostics_battery_warn_pct" in st.message, st.message
            _set(node, diagnostics_battery_warn_pct=30.0)

            resp = planner.call("/drone_g/emergency_stop")
            assert resp.success, resp.message
            st, v = op.wait_for(name, lambda st, v: lvl(st) == "ERROR")
            assert v["emergency_stop"] == "active" and "emergency stop active" in st.message, (st.message, v)
            assert planner.call("/drone_g/reset_emergency").success
            op.wait_for(name, lambda st, v: lvl(st) == "OK")

            _set(node, diagnostics_link_warn_s=0.5, diagnostics_link_error_s=1.5)
            fleet.drones["drone_g"].kill()  # power loss: no more state packets
            st, v = op.wait_for(name, lambda st, v: lvl(st) == "ERROR")
            assert "silent" in st.message and float(v["last_contact_age_s"]) > 1.5, (st.message, v)
        finally:
            if planner is not None:
                planner.close()
            op_ctx_nodes.close()


# -- pure parts ---------------------------------------------------------------------------------------------------

def test_rolling_outcomes_are_bounded_drop_old_entries_and_count_a_revised_result_once():
    w = RollingOutcomes(maxlen=3)
    w.add("a", "on_time", 0.0)
    w.add("b", "late", 1.0)
    w.add("a", "robot_failed", 2.0)  # a revision replaces a's outcome
    assert w.counts(60.0, 2.0) == {"robot_failed": 1, "late": 1}
    for i, t in enumerate((3.0, 4.0, 5.0)):
        w.add(f"c{i}", "on_time", t)
    assert len(w) == 3 and w.counts(60.0, 5.0) == {"on_time": 3}
    assert w.counts(1.5, 5.0) == {"on_time": 2}  # c0 (t=3) left the window


def test_status_takes_the_worst_level_and_its_reasons():
    st = Status("x: y", "hw", summary="all fine").add("n", 1).add("f", 0.5).add("b", True)
    assert st.to_msg().level == DiagnosticStatus.OK and st.message == "all fine"
    st.raise_to(1, "a warning").raise_to(2, "an error").raise_to(1, "another warning")
    msg = st.to_msg()
    assert msg.level == DiagnosticStatus.ERROR and msg.message == "an error" and msg.hardware_id == "hw"
    assert values(msg) == {"n": "1", "f": "0.500", "b": "true"}


def test_an_engine_pool_reports_each_member_and_warns_while_one_is_down():
    from timelyllm_ros.engines.pool import EnginePool
    from timelyllm_ros.engines.sim_engine import SimEngine
    from timelyllm_ros.ros.diagnostics import ERROR, WARN, add_pool_members

    pool = EnginePool([SimEngine(), SimEngine()], names=["a", "b"], background_probes=False)
    st = add_pool_members(Status("planner: engine"), pool.stats())
    v = dict(st.values)
    assert st.level == 0 and (v["member_0_name"], v["member_0_state"], v["member_1_state"]) == ("a", "up", "up")
    assert v["member_1_max_batch"] == "256" and v["pool_failovers"] == "0"
    pool.mark_down(1, "the server died")
    st = add_pool_members(Status("planner: engine"), pool.stats())
    assert st.level == WARN and "1 of 2 members down (b)" in st.message
    assert dict(st.values)["member_1_down_reason"] == "the server died"
    pool.mark_down(0, "hung")
    st = add_pool_members(Status("planner: engine"), pool.stats())
    assert st.level == ERROR and "no member is up" in st.message
