"""Executor nodes over real DDS: emulated Tello fleet, emergency stop, preemption, arm + simulated controller,
and the delivery contract (acks, duplicates, reordering, end markers) of the executors and the simulated fleet."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from devtools.netns import netns_unavailable_reason

rclpy = pytest.importorskip("rclpy")
from std_srvs.srv import Trigger  # noqa: E402
from waiting import wait_until  # noqa: E402

from timelyllm_ros.msg import PlanSegment, SegmentAck, SegmentDone  # noqa: E402
from timelyllm_ros.ros.spin import PooledExecutor, Spinner  # noqa: E402
from timelyllm_ros.ros.topics import RELIABLE, REPORTS, SEGMENT_ACKS, segment_topic  # noqa: E402

pytestmark = pytest.mark.ros
_WHY = netns_unavailable_reason()
needs_netns = pytest.mark.skipif(_WHY is not None, reason=f"emulated Tellos need network namespaces: {_WHY}")


PROBE = "_probe-"  # task ids of the stand-in's handshake end markers


class Planner:
    """Stands in for the planner's publishing side: same topics, message and QoS. ``context``: the executors'
    (one DDS participant for both sides, as the planner and its executors of one process share in the demos);
    two participants of one process lost each other in CI after the emulated fleets' network namespaces had
    added and removed host interfaces ("never acknowledged a probe")."""

    def __init__(self, robots: list[str], extra_nodes=(), context=None, auth=None) -> None:
        self.auth = auth  # a FleetAuth: every segment it sends is signed with it (probes too)
        self._own_ctx = context is None
        self.ctx = rclpy.Context() if self._own_ctx else context
        if self._own_ctx:
            rclpy.init(context=self.ctx)
        self.node = rclpy.create_node("planner", context=self.ctx)  # the name executors take segments from
        self.pubs = {r: self.node.create_publisher(PlanSegment, segment_topic(r), RELIABLE) for r in robots}
        self.done: list[SegmentDone] = []
        self._subs = [self.node.create_subscription(SegmentDone, "/segment_done", self.done.append, RELIABLE)]
        self.acks: list[SegmentAck] = []
        self.heartbeats: list[SegmentAck] = []  # acks re-sent with running=true while a segment runs
        self.probe_acks: set[str] = set()
        self._subs.append(self.node.create_subscription(SegmentAck, SEGMENT_ACKS, self._on_ack, REPORTS))
        self.ex = PooledExecutor(num_threads=2, context=self.ctx)
        self.ex.add_node(self.node)
        for n in extra_nodes:
            self.ex.add_node(n)
        self.thread = Spinner(self.ex)
        self.thread.start()
        end = time.monotonic() + 20
        while any(p.get_subscription_count() == 0 for p in self.pubs.values()) and time.monotonic() < end:
            time.sleep(0.05)
        assert all(p.get_subscription_count() for p in self.pubs.values()), "executors never subscribed"
        self._handshake(robots, end)

    def _handshake(self, robots: list[str], end: float) -> None:
        """Acks and reports are VOLATILE and this stand-in never re-sends (the real planner does): each robot's
        writers must have matched our readers before the first segment goes out, or its ack is gone (CI: all
        nine acks of a test lost). Our reader seeing their writer does not prove their writer sees our reader
        (discovery is per side), so ask the robot: an end marker of a task of its own (an empty plan: acked,
        never run nor reported) until its ack comes back. The report reader was announced before the ack
        reader, on the same reliable discovery stream, so a robot that acks has matched both."""
        pending = set(robots)
        while pending and time.monotonic() < end:
            for r in pending:
                self.pubs[r].publish(self._signed(PlanSegment(task_id=f"{PROBE}{r}", robot_id=r, segment_index=0,
                                                              text="", is_final=True)))
            time.sleep(0.2)
            pending -= self.probe_acks
        assert not pending, f"robots {sorted(pending)} never acknowledged a probe: their writers never matched"

    def _on_ack(self, msg: SegmentAck) -> None:
        if msg.task_id.startswith(PROBE):
            self.probe_acks.add(msg.robot_id)
        elif msg.running:
            self.heartbeats.append(msg)
        else:
            self.acks.append(msg)

    def send(self, robot: str, task: str, index: int, text: str, final: bool = False) -> PlanSegment:
        msg = self._signed(PlanSegment(task_id=task, robot_id=robot, segment_index=index, text=text, is_final=final))
        self.pubs[robot].publish(msg)
        return msg

    def _signed(self, msg: PlanSegment) -> PlanSegment:
        return self.auth.sign(msg) if self.auth is not None else msg

    def wait_done(self, n: int, timeout: float = 20.0, task: str | None = None) -> list[SegmentDone]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = [d for d in self.done if task is None or d.task_id == task]
            if len(got) >= n:
                return got
            time.sleep(0.02)
        raise AssertionError(f"only {[(d.task_id, d.segment_index, d.success, d.error) for d in self.done]}")

    def call(self, name: str, timeout: float = 20.0) -> Trigger.Response:
        cli = self.node.create_client(Trigger, name)
        assert cli.wait_for_service(timeout_sec=10), f"{name} not available"
        fut = cli.call_async(Trigger.Request())
        end = time.monotonic() + timeout
        while not fut.done() and time.monotonic() < end:
            time.sleep(0.02)
        assert fut.done(), f"{name} did not answer"
        return fut.result()

    def close(self) -> None:
        self.ex.shutdown(timeout_sec=5)
        self.node.destroy_node()
        if self._own_ctx:
            rclpy.shutdown(context=self.ctx)
        self.thread.join(timeout=5)


def _auth(key_file: str):
    from timelyllm_ros.ros.fleet_auth import FleetAuth

    return FleetAuth.from_file(key_file) if key_file else None


@contextlib.contextmanager
def _context():
    """An rclpy context for the executors under test and the Planner stand-in together."""
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    try:
        yield ctx
    finally:
        rclpy.shutdown(context=ctx)


@needs_netns
def test_a_fleet_of_emulated_drones_is_served_at_once_and_invalid_skills_never_reach_a_drone(tmp_path):
    from devtools.emulated_fleet import start_emulated_fleet

    robots = ["drone_a", "drone_b", "drone_c"]
    with _context() as ctx, start_emulated_fleet(robots, speed=0.1, scenes={"drone_b": "Scene: [cat x:0.5 y:0.5]"},
                                                 log_dir=tmp_path, context=ctx) as fleet:
        planner = Planner(robots, context=ctx)
        try:
            planner.send("drone_a", "t-a", 0, "mf(100);")
            planner.send("drone_a", "t-a", 1, "tc(90);", final=True)
            planner.send("drone_b", "t-b", 0, "?iv('cat')==True{")
            planner.send("drone_b", "t-b", 1, "mu(50);")
            planner.send("drone_b", "t-b", 2, "};", final=True)
            planner.send("drone_c", "t-c", 0, "mf(100);")
            planner.send("drone_c", "t-c", 1, "mf(600);")  # out of bounds: refused
            planner.send("drone_c", "t-c", 2, "tc(90);", final=True)  # the task has ended: refused
            done = planner.wait_done(8, timeout=30)
        finally:
            planner.close()
        ok = {(d.task_id, d.segment_index): (d.success, d.error) for d in done}
        assert all(ok[("t-a", i)][0] for i in (0, 1)) and all(ok[("t-b", i)][0] for i in (0, 1, 2))
        assert ok[("t-c", 0)] == (True, "")
        assert not ok[("t-c", 1)][0] and "refused" in ok[("t-c", 1)][1] and "500" in ok[("t-c", 1)][1]
        assert not ok[("t-c", 2)][0] and "task ended at segment 1" in ok[("t-c", 2)][1]
        for d in done:  # real start and finish times; a zero start for a segment that never started
            never = [("t-c", 2)]  # t-c 1 reached the runner (which refused it): it started
            start = (d.start.sec, d.start.nanosec)
            assert (d.finish.sec, d.finish.nanosec) >= start and (start == (0, 0)) == ((d.task_id, d.segment_index)
                                                                                        in never), d
    cmds = {r: fleet.drones[r].commands() for r in robots}  # after shutdown: the landings are in
    connect = ["command", "battery?", "takeoff"]
    assert cmds["drone_a"] == connect + ["forward 100", "cw 90", "land"]  # land: executor shutdown
    assert cmds["drone_b"] == connect + ["up 50", "land"]
    assert cmds["drone_c"] == connect + ["forward 100", "land"]
    # served at once: the drones' flights overlap in time (each from its take-off to its last motion)
    spans = []
    for r in robots:
        log = [e for e in fleet.drones[r].log() if e.get("reply") is not None]
        t_off = next(e["t"] for e in log if e["cmd"] == "takeoff")
        t_last = max(e["t"] for e in log if e["cmd"].split()[0] in ("forward", "up", "cw"))
        spans.append((t_off, t_last))
    assert max(a for a, _ in spans) < min(b for _, b in spans), spans


@needs_netns
def test_emergency_stop_lands_the_drone_at_once_and_ends_the_task(tmp_path):
    from devtools.emulated_fleet import start_emulated_fleet

    with _context() as ctx, start_emulated_fleet(["drone_e"], speed=0.5, log_dir=tmp_path, context=ctx) as fleet:
        planner = Planner(["drone_e"], context=ctx)
        try:
            planner.send("drone_e", "t-e", 0, "mf(500);")  # 5.4 s * 0.5
            planner.send("drone_e", "t-e", 1, "tc(90);", final=True)
            end = time.monotonic() + 20
            while not _moving(fleet.drones["drone_e"]) and time.monotonic() < end:
                time.sleep(0.05)
            time.sleep(0.3)
            resp = planner.call("/drone_e/emergency_stop")
            assert resp.success and "landed" in resp.message, resp.message
            done = planner.wait_done(2)
            planner.send("drone_e", "t-f", 0, "mf(20);", final=True)
            refused = planner.wait_done(1, task="t-f")[0]
            assert planner.call("/drone_e/reset_emergency").success
        finally:
            planner.close()
        by_index = {d.segment_index: d for d in done if d.task_id == "t-e"}
        assert not by_index[0].success and "emergency stop" in by_index[0].error
        assert not by_index[1].success and "emergency stop" in by_index[1].error
        assert not refused.success and "emergency stop active" in refused.error
    cmds = fleet.drones["drone_e"].commands()
    assert cmds == ["command", "battery?", "takeoff", "forward 500", "stop", "land"]
    # "at once": the stop cut the 500 cm move short (its reply came with the stop, before the move's
    # modelled end), whatever the machine's load made the service round trip cost
    t = {e["cmd"]: e["t"] for e in fleet.drones["drone_e"].log() if e.get("reply") is not None}
    modelled = (0.0072 * 500 + 1.8144) * 0.5
    assert t["forward 500"] - t["takeoff"] < modelled, (t, modelled)
    assert t["stop"] <= t["forward 500"]


def _moving(drone) -> bool:
    """Took off and is in its first motion (a command is logged once it is answered)."""
    log = sorted(drone.log(), key=lambda e: e["t"])
    return bool(log) and log[-1]["cmd"] == "takeoff"


@needs_netns
def test_segment_zero_of_another_task_preempts_the_running_one(tmp_path):
    from devtools.emulated_fleet import start_emulated_fleet

    with _context() as ctx, start_emulated_fleet(["drone_p"], speed=0.5, log_dir=tmp_path, context=ctx) as fleet:
        planner = Planner(["drone_p"], context=ctx)
        try:
            planner.send("drone_p", "normal-1", 0, "mf(500);")
            end = time.monotonic() + 20
            while not _moving(fleet.drones["drone_p"]) and time.monotonic() < end:
                time.sleep(0.05)
            time.sleep(0.3)
            t0 = time.monotonic()
            planner.send("drone_p", "urgent-1", 0, "tc(90);", final=True)
            done = planner.wait_done(2)
            switch_s = time.monotonic() - t0
            planner.send("drone_p", "normal-1", 1, "mf(20);", final=True)  # the planner had it in flight
            late = planner.wait_done(2, task="normal-1")
        finally:
            planner.close()
        res = {(d.task_id, d.segment_index): d for d in done + late}
        assert not res[("normal-1", 0)].success and res[("normal-1", 0)].error == "preempted by task urgent-1"
        assert res[("urgent-1", 0)].success
        assert not res[("normal-1", 1)].success and "preempted by task urgent-1" in res[("normal-1", 1)].error
        assert switch_s < 2.5  # far less than the 2.7 s the forward 500 still needed
    cmds = fleet.drones["drone_p"].commands()
    assert cmds == ["command", "battery?", "takeoff", "forward 500", "stop", "cw 90", "land"]


@needs_netns
def test_a_plan_ended_with_blocks_open_is_refused_and_a_balanced_one_runs(tmp_path):
    """The planner's side through the public topics, a real drone executor and an emulated Tello: the end of
    the plan (its segment flagged is_final, or an end marker after it) with a block still open is refused."""
    from devtools.emulated_fleet import start_emulated_fleet

    reports: dict[str, list[tuple[int, bool, str]]] = {}
    scenes = {"drone_f": "Scene: [cat x:0.5 y:0.5]"}
    with _context() as ctx, start_emulated_fleet(["drone_f"], speed=0.02, scenes=scenes, log_dir=tmp_path,
                                                 context=ctx) as fleet:
        planner = Planner(["drone_f"], context=ctx)

        def plan(task: str, segments: list[str], *, marker: bool, reported: int) -> None:
            """Send one plan (its end: the last segment's is_final, or an end marker) and wait for its reports
            (one task at a time: segment 0 of the next would otherwise preempt it)."""
            for i, text in enumerate(segments):
                planner.send("drone_f", task, i, text, final=not marker and i == len(segments) - 1)
            if marker:
                planner.send("drone_f", task, len(segments), "", final=True)
            planner.wait_done(reported, task=task)
            reports[task] = _done_of(planner, task)

        try:
            plan("open-final", ["mf(50);", "?iv('cat')==True{", "mu(20);"], marker=False, reported=3)
            plan("open-marker", ["2{", "tc(90);"], marker=True, reported=3)
            plan("closed-final", ["?iv('cat')==True{", "mf(20);", "};"], marker=False, reported=3)
            plan("closed-marker", ["2{", "tu(30);", "}"], marker=True, reported=3)
            plan("last", ["d(0);"], marker=False, reported=1)  # after every marker above was handled
            _acked(planner, 3 + 3 + 3 + 4 + 1)
        finally:
            planner.close()
        history = list(fleet.nodes["drone_f"].history)
    unclosed = "unclosed '{' (1 block(s) of earlier text still open)"
    # a final segment that leaves a block open is refused as a whole: its mu(20) never flew
    assert reports["open-final"][:2] == [(0, True, ""), (1, True, "")]
    idx, ok, err = reports["open-final"][2]
    assert (idx, ok) == (2, False) and err.startswith("refused: invalid segment: ") and unclosed in err, err
    # an end marker after an open loop: the body ran once as it came, the plan's end is refused on the marker
    assert reports["open-marker"][:2] == [(0, True, ""), (1, True, "")]
    idx, ok, err = reports["open-marker"][2]
    assert (idx, ok) == (2, False) and err.startswith("refused end of plan: ") and unclosed in err, err
    assert reports["closed-final"] == [(0, True, ""), (1, True, ""), (2, True, "")]
    assert reports["closed-marker"] == [(0, True, ""), (1, True, ""), (2, True, "")]  # the marker: no report
    assert reports["last"] == [(0, True, "")]
    assert [h for h in history if h[0] == "closed-marker"] == [("closed-marker", i, True, "") for i in range(3)]
    assert fleet.drones["drone_f"].commands() == ["command", "battery?", "takeoff", "forward 50", "cw 90",
                                                  "forward 20", "ccw 30", "ccw 30", "land"]


def test_arm_executor_drives_the_simulated_controller_and_stops_on_emergency():
    from rclpy.parameter import Parameter

    from timelyllm_ros.ros.arm_executor_node import ArmExecutorNode
    from timelyllm_ros.ros.sim_arm_controller_node import SimArmControllerNode

    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    ctrl = SimArmControllerNode(context=ctx, parameter_overrides=[Parameter("robots", value=["arm_x"])])
    arm = ArmExecutorNode("arm_x", time_scale=0.05, context=ctx,
                          scene="Scene: [red_box x:0.40 y:0.10, tray x:0.30 y:-0.40]")
    ex = PooledExecutor(num_threads=3, context=ctx)
    ex.add_node(ctrl)
    ex.add_node(arm)
    spin = Spinner(ex)
    spin.start()
    planner = Planner(["arm_x"], context=ctx)
    try:
        planner.send("arm_x", "t-arm", 0, "move_to('red_box');")
        planner.send("arm_x", "t-arm", 1, "pick('red_box');")
        planner.send("arm_x", "t-arm", 2, "place('tray');", final=True)
        done = planner.wait_done(3)
        assert [(d.segment_index, d.success) for d in done] == [(0, True), (1, True), (2, True)], done
        pick = done[1]
        took = (pick.finish.sec - pick.start.sec) + (pick.finish.nanosec - pick.start.nanosec) * 1e-9
        assert 3.0 * 0.05 <= took < 3.0  # followed over time: U(3, 4.2) s scaled
        assert ctrl.arms["arm_x"].followed == ["move_to('red_box')", "pick('red_box')", "place('tray')"]
        assert ctrl.arms["arm_x"].positions["gripper"] == pytest.approx(0.04)

        arm2 = ArmExecutorNode("arm_x", time_scale=1.0, context=ctx)  # slow, to stop it midway
        ex.remove_node(arm)
        arm.destroy_node()
        ex.add_node(arm2)
        time.sleep(0.5)
        planner.send("arm_x", "t-arm2", 0, "move_to(0.5, 0.2);move_to(0.3, -0.2);", final=True)
        time.sleep(0.5)
        resp = planner.call("/arm_x/emergency_stop")
        assert resp.success
        d = planner.wait_done(1, task="t-arm2")[0]
        assert not d.success and "emergency stop" in d.error
        time.sleep(0.2)
        assert ctrl.arms["arm_x"].active is None  # the controller stopped at once
        assert ctrl.arms["arm_x"].followed[-1] == "move_to(0.5, 0.2)"
    finally:
        planner.close()
        ex.shutdown(timeout_sec=5)
        for n in list(ex.get_nodes()):
            n.destroy_node()
        rclpy.shutdown(context=ctx)
        spin.join(timeout=5)


# -- delivery contract: acks, duplicates, reordering, end markers (no network namespaces needed) -------------------

class _Runner:
    """A robot that records what it ran; ``slow`` blocks until ``gate`` is set or the robot is stopped;
    ``refuse_end`` (a reason) makes it refuse to end a plan at an end marker."""

    def __init__(self) -> None:
        from timelyllm_ros.robots.base import StopSignal

        self.stop = StopSignal()
        self.ran: list[str] = []
        self.finals: list[bool] = []  # the final flag of each run
        self.ends = 0  # end markers reached
        self.refuse_end = ""
        self.begun: list[str] = []
        self.gate = threading.Event()
        self.in_slow = threading.Event()

    def begin_task(self, task_id: str) -> None:
        self.begun.append(task_id)

    def run(self, text: str, *, final: bool = False) -> str:
        self.ran.append(text)
        self.finals.append(final)
        if text == "slow":
            self.in_slow.set()
            end = time.monotonic() + 60  # bounded: a broken test must not hang
            while not self.gate.wait(0.01) and time.monotonic() < end:
                self.stop.check()
        self.stop.check()
        return "ok"

    def end_plan(self) -> None:
        from timelyllm_ros.robots.base import RefusedError

        self.ends += 1
        if self.refuse_end:
            raise RefusedError(self.refuse_end)

    def halt(self) -> None:
        pass

    def emergency(self) -> str:
        return "stopped"


@contextlib.contextmanager
def _robot(robot_id: str, reorder_timeout_s: float | None = None, key_file: str = ""):
    """A RobotExecutorNode with a recording runner, spun in its own context, and a Planner stand-in (``key_file``:
    the fleet key of both)."""
    from rclpy.parameter import Parameter

    from timelyllm_ros.ros.executor_base import RobotExecutorNode

    class FakeExecutor(RobotExecutorNode):
        def __init__(self, **kw) -> None:
            super().__init__(robot_id, "fake_executor", **kw)
            self.runner = _Runner()
            self.start_executor()

    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    over = [] if reorder_timeout_s is None else [Parameter("reorder_timeout_s", value=reorder_timeout_s)]
    over += [Parameter("fleet_key_file", value=key_file)] if key_file else []
    node = FakeExecutor(context=ctx, parameter_overrides=over)
    ex = PooledExecutor(num_threads=2, context=ctx)
    ex.add_node(node)
    spin = Spinner(ex)
    spin.start()
    planner = None
    try:
        planner = Planner([robot_id], context=ctx, auth=_auth(key_file))
        yield node, planner
    finally:
        node.runner.gate.set()
        if planner is not None:
            planner.close()
        ex.shutdown(timeout_sec=5)
        node.destroy_node()
        rclpy.shutdown(context=ctx)
        spin.join(timeout=5)


def _acked(planner: Planner, n: int) -> None:
    assert wait_until(lambda: len(planner.acks) >= n, timeout=20), [(a.task_id, a.segment_index) for a in planner.acks]


def _done_of(planner: Planner, task: str) -> list[tuple[int, bool, str]]:
    """One entry per execution. A robot answers a re-sent copy of a segment it already finished with the
    same report again (identical start and finish stamps), so the planner never misses it: one execution."""
    seen, out = set(), []
    for d in planner.done:
        key = (d.segment_index, d.start.sec, d.start.nanosec, d.finish.sec, d.finish.nanosec, d.success, d.error)
        if d.task_id == task and key not in seen:
            seen.add(key)
            out.append((d.segment_index, d.success, d.error))
    return out


def test_executor_acks_every_copy_runs_each_segment_once_in_index_order_and_an_end_marker_closes_the_task():
    with _robot("bot_d") as (node, planner):
        sent = [(2, "c", False), (0, "a", False), (0, "a", False), (1, "b", False), (2, "c", False),
                (3, "", True), (3, "", True), (1, "b", False)]  # 3: end marker (the plan ended after 2)
        for i, text, final in sent:
            planner.send("bot_d", "t-dup", i, text, final=final)
        _acked(planner, len(sent))
        planner.wait_done(3, task="t-dup")
        # the marker closed the task: segment 0 of a new task starts it without preempting anything
        planner.send("bot_d", "t-next", 0, "d", final=True)
        planner.wait_done(1, task="t-next")
        _acked(planner, len(sent) + 1)
        assert node.runner.ran == ["a", "b", "c", "d"]
        assert _done_of(planner, "t-dup") == [(0, True, ""), (1, True, ""), (2, True, "")]  # once each, no marker
        assert _done_of(planner, "t-next") == [(0, True, "")]
        acks = [(a.task_id, a.segment_index) for a in planner.acks]
        assert sorted(acks) == sorted([("t-dup", i) for i, _, _ in sent] + [("t-next", 0)])
        assert all(a.robot_id == "bot_d" and (a.stamp.sec, a.stamp.nanosec) > (0, 0) for a in planner.acks)


def test_the_final_flag_reaches_the_runner_and_a_refused_end_marker_is_reported_on_its_index():
    with _robot("bot_f") as (node, planner):
        planner.send("bot_f", "t-fin", 0, "a")
        planner.send("bot_f", "t-fin", 1, "b", final=True)
        planner.wait_done(2, task="t-fin")
        node.runner.refuse_end = "1 block(s) still open"
        planner.send("bot_f", "t-open", 0, "c")
        planner.send("bot_f", "t-open", 1, "", final=True)  # end marker: the runner refuses to end the plan there
        planner.wait_done(2, task="t-open")
        planner.send("bot_f", "t-open", 1, "", final=True)  # re-sent: its report again, no second check
        assert wait_until(lambda: len([d for d in planner.done if d.task_id == "t-open"]) >= 3, timeout=20)
        node.runner.refuse_end = ""
        planner.send("bot_f", "t-after", 0, "d", final=True)
        planner.wait_done(1, task="t-after")
        _acked(planner, 6)
        assert node.runner.ran == ["a", "b", "c", "d"] and node.runner.finals == [False, True, False, True]
        assert node.runner.ends == 1  # only the marker asks the runner to end the plan
        assert _done_of(planner, "t-fin") == [(0, True, ""), (1, True, "")]
        assert _done_of(planner, "t-open") == [(0, True, ""), (1, False, "refused end of plan: 1 block(s) still open")]
        assert _done_of(planner, "t-after") == [(0, True, "")]


def test_a_late_or_duplicate_segment_of_an_old_task_never_preempts_nor_restarts_anything():
    with _robot("bot_l") as (node, planner):
        planner.send("bot_l", "old", 0, "a", final=True)
        planner.wait_done(1, task="old")
        planner.send("bot_l", "cur", 0, "slow")
        assert node.runner.in_slow.wait(20)
        planner.send("bot_l", "old", 0, "a", final=True)  # re-sent: a duplicate
        planner.send("bot_l", "old", 1, "x")  # after the old plan's end: refused, preempts nothing
        planner.send("bot_l", "cur", 0, "slow")  # duplicate of the running segment: no restart
        assert wait_until(lambda: len(_done_of(planner, "old")) >= 2, timeout=20), planner.done
        _acked(planner, 5)
        node.runner.gate.set()
        planner.send("bot_l", "cur", 1, "", final=True)
        planner.wait_done(1, task="cur")
        _acked(planner, 6)
        assert node.runner.ran == ["a", "slow"] and node.runner.begun == ["old", "cur"]
        old = _done_of(planner, "old")
        assert old[0] == (0, True, "") and len(old) == 2
        assert old[1][:2] == (1, False) and "after the end of its plan" in old[1][2]
        assert _done_of(planner, "cur") == [(0, True, "")]


def test_segments_of_a_task_whose_segment_zero_never_arrives_are_refused_after_reorder_timeout_s():
    with _robot("bot_z", reorder_timeout_s=0.5) as (node, planner):
        planner.send("bot_z", "t-z", 2, "c")
        planner.send("bot_z", "t-z", 1, "b")
        planner.send("bot_z", "t-z", 3, "", final=True)  # end marker: acknowledged, never reported
        done = planner.wait_done(2, task="t-z")
        planner.send("bot_z", "t-z", 0, "a")  # too late: refused, never run
        planner.send("bot_z", "t-ok", 0, "d", final=True)  # an unrelated task still runs
        planner.wait_done(3, task="t-z")
        planner.wait_done(1, task="t-ok")
        _acked(planner, 5)
        why = "segment 0 of task t-z never arrived within 0.5 s"
        assert sorted((d.segment_index, d.success, d.error) for d in done) == [(1, False, why), (2, False, why)]
        assert sorted(_done_of(planner, "t-z")) == [(0, False, why), (1, False, why), (2, False, why)]
        assert node.runner.ran == ["d"]


def test_reorder_timeout_s_must_be_positive():
    from rclpy.parameter import Parameter

    from timelyllm_ros.ros.executor_base import RobotExecutorNode
    from timelyllm_ros.ros.sim_fleet_node import SimFleetNode

    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    try:
        for make in (lambda o: RobotExecutorNode("bot_bad", "fake_executor", context=ctx, parameter_overrides=o),
                     lambda o: SimFleetNode(context=ctx, parameter_overrides=o)):
            with pytest.raises(ValueError, match="parameter reorder_timeout_s: must be > 0"):
                make([Parameter("reorder_timeout_s", value=0.0)])
    finally:
        rclpy.shutdown(context=ctx)


def test_sim_fleet_dedups_reorders_and_acks_and_a_silent_robot_acks_without_reporting():
    from rclpy.parameter import Parameter

    from timelyllm_ros.ros.sim_fleet_node import SimFleetNode

    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    fleet = SimFleetNode(context=ctx, parameter_overrides=[
        Parameter("robots", value=["sim_a", "sim_mute"]), Parameter("silent_robots", value=["sim_mute"]),
        Parameter("time_scale", value=0.01), Parameter("reorder_timeout_s", value=0.5)])
    ex = PooledExecutor(num_threads=2, context=ctx)
    ex.add_node(fleet)
    spin = Spinner(ex)
    spin.start()
    planner = Planner(["sim_a", "sim_mute"], context=ctx)
    try:
        sent = [(1, "tc(90);", False), (0, "mf(20);", False), (0, "mf(20);", False), (2, "", True),
                (1, "tc(90);", False), (2, "", True)]
        for i, text, final in sent:
            planner.send("sim_a", "s-a", i, text, final=final)
        planner.send("sim_mute", "s-m", 0, "mf(20);", final=True)
        planner.send("sim_mute", "s-m", 0, "mf(20);", final=True)
        planner.send("sim_a", "s-z", 1, "mf(20);")  # segment 0 never comes: refused after the timeout
        _acked(planner, len(sent) + 3)
        planner.wait_done(2, task="s-a")
        planner.wait_done(1, task="s-z")
        mute = fleet.robots["sim_mute"]
        assert wait_until(lambda: len(mute.executed) == 1 and mute.busy_until is None, timeout=20)
        planner.send("sim_a", "s-end", 0, "mf(20);", final=True)  # reported after anything the mute one did
        planner.wait_done(1, task="s-end")
    finally:
        planner.close()
        ex.shutdown(timeout_sec=5)
        fleet.destroy_node()
        rclpy.shutdown(context=ctx)
        spin.join(timeout=5)
    assert _done_of(planner, "s-a") == [(0, True, ""), (1, True, "")]  # once each, in order, no marker
    starts = [(d.start.sec, d.start.nanosec) for d in planner.done if d.task_id == "s-a"]
    assert starts == sorted(starts)
    assert [e[:3] for e in fleet.robots["sim_a"].executed] == [
        ["s-a", 0, "mf(20);"], ["s-a", 1, "tc(90);"], ["s-end", 0, "mf(20);"]]
    assert _done_of(planner, "s-z") == [(1, False, "segment 0 of task s-z never arrived within 0.5 s")]
    assert not [d for d in planner.done if d.robot_id == "sim_mute"]  # silent: never reports
    acks = sorted((a.robot_id, a.task_id, a.segment_index) for a in planner.acks)
    assert acks == sorted([("sim_a", "s-a", i) for i, _, _ in sent] + [("sim_mute", "s-m", 0)] * 2
                          + [("sim_a", "s-z", 1), ("sim_a", "s-end", 0)])
    assert [e[:2] for e in mute.executed] == [["s-m", 0]]  # the duplicate ran once


@contextlib.contextmanager
def _sim_fleet(robots: list[str], **params):
    """A SimFleetNode spun in its own context with a Planner stand-in (the node ``planner``) in the same one."""
    from rclpy.parameter import Parameter

    from timelyllm_ros.ros.sim_fleet_node import SimFleetNode

    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    fleet = SimFleetNode(context=ctx, parameter_overrides=[Parameter("robots", value=robots)] + [
        Parameter(k, value=v) for k, v in params.items()])
    ex = PooledExecutor(num_threads=2, context=ctx)
    ex.add_node(fleet)
    spin = Spinner(ex)
    spin.start()
    planner = None
    try:
        planner = Planner(robots, context=ctx, auth=_auth(params.get("fleet_key_file", "")))
        yield fleet, planner
    finally:
        if planner is not None:
            planner.close()
        ex.shutdown(timeout_sec=5)
        fleet.destroy_node()
        rclpy.shutdown(context=ctx)
        spin.join(timeout=5)


def test_the_simulated_fleet_runs_no_segment_from_another_node_than_the_planner():
    """Issue 39: a rogue PlanSegment mf(500) on /drone_1/plan_segments got 17 heartbeats and a SegmentDone
    success=True from the simulated fleet, which every demo and benchmark uses. It now admits segments through the
    executors' own gate: the rogue's are neither run nor acknowledged, and counted."""
    with _sim_fleet(["sim_r"], time_scale=0.01) as (fleet, planner):
        rogue = rclpy.create_node("mallory", context=planner.ctx)
        pub = rogue.create_publisher(PlanSegment, segment_topic("sim_r"), RELIABLE)
        planner.ex.add_node(rogue)
        assert wait_until(lambda: pub.get_subscription_count() > 0, timeout=20)
        for i in range(5):
            pub.publish(PlanSegment(task_id=f"evil-{i}", robot_id="sim_r", segment_index=0, text="mf(500);",
                                    is_final=True))
        # the planner's own segment still runs; it goes out after the rogue's were taken (one subscription, one
        # callback at a time) and the fleet reports in order, so a report of anything the rogue sent would be in
        assert wait_until(lambda: fleet.robots["sim_r"].acks or fleet.endpoint.gate.refused >= 5, timeout=20)
        planner.send("sim_r", "t-real", 0, "mf(20);", final=True)
        assert [(d.segment_index, d.success) for d in planner.wait_done(1, task="t-real")] == [(0, True)]
        evil = [m for m in planner.done + planner.acks + planner.heartbeats if m.task_id.startswith("evil")]
        assert not evil, evil
        assert [e[:3] for e in fleet.robots["sim_r"].executed] == [["t-real", 0, "mf(20);"]]
        assert fleet.endpoint.gate.refused == 5


def test_a_running_segment_sends_heartbeats_until_it_ends():
    """The planner tells a slow skill from a dead robot by these (README "Delivery guarantees")."""
    with _robot("bot_h") as (node, planner):
        planner.send("bot_h", "t-slow", 0, "slow", final=True)
        assert node.runner.in_slow.wait(20)
        assert wait_until(lambda: len(planner.heartbeats) >= 2, timeout=20)  # default period 1 s
        assert {(h.task_id, h.segment_index, h.robot_id) for h in planner.heartbeats} == {("t-slow", 0, "bot_h")}
        node.runner.gate.set()
        planner.wait_done(1, task="t-slow")
        time.sleep(0.3)
        n = len(planner.heartbeats)
        time.sleep(1.5)
        assert len(planner.heartbeats) == n  # none once it ended


def test_a_segment_from_another_node_than_the_planner_is_neither_run_nor_acknowledged():
    """Issue 23: a PlanSegment published on /<robot>/plan_segments by any node was executed, preempting the real
    task. An executor runs only what the planner it serves (parameter planner_node) wrote."""
    with _robot("bot_r") as (node, planner):
        rogue = rclpy.create_node("mallory", context=planner.ctx)
        pub = rogue.create_publisher(PlanSegment, segment_topic("bot_r"), RELIABLE)
        planner.ex.add_node(rogue)
        assert wait_until(lambda: pub.get_subscription_count() > 0, timeout=20)
        planner.send("bot_r", "t-real", 0, "slow", final=True)
        assert node.runner.in_slow.wait(20)
        for _ in range(5):  # segment 0 of another task: it would preempt the real one
            pub.publish(PlanSegment(task_id="evil", robot_id="bot_r", segment_index=0, text="x", is_final=True))
            time.sleep(0.1)
        assert wait_until(lambda: node.refused_segments >= 1, timeout=20)
        node.runner.gate.set()
        done = planner.wait_done(1, task="t-real")
        assert [(d.segment_index, d.success) for d in done] == [(0, True)]  # not preempted
        time.sleep(0.5)
        assert node.runner.ran == ["slow"]
        assert not [a for a in planner.acks + planner.heartbeats if a.task_id == "evil"]
        assert not [d for d in planner.done if d.task_id == "evil"]
        st = node.diagnostic_status()
        assert dict(st.values)["segments_from_other_nodes"] == str(node.refused_segments), st.values
        assert st.level == 1 and "other than the planner" in st.message, st.message


# -- the fleet key (issue 39, item 9) -------------------------------------------------------------------------------
def _key_file(tmp_path, name: str = "fleet.key", key: bytes = b"0123456789abcdef0123456789abcdef") -> str:
    path = tmp_path / name
    path.write_bytes(key + b"\n")
    return str(path)


def _forgeries(robot: str, wrong_key_file: str) -> list[PlanSegment]:
    """What a node that took the planner's name (so it passes the writer check) can send without the key: a
    segment without a tag, one signed with another key, and a copy of a segment the robot took (a replay)."""
    from timelyllm_ros.ros.fleet_auth import FleetAuth

    plain = PlanSegment(task_id="evil-0", robot_id=robot, segment_index=0, text="mf(500);", is_final=True)
    wrong = FleetAuth.from_file(wrong_key_file).sign(
        PlanSegment(task_id="evil-1", robot_id=robot, segment_index=0, text="mf(500);", is_final=True))
    return [plain, wrong]


def test_with_a_fleet_key_the_simulated_fleet_runs_only_segments_signed_with_it_and_no_replay(tmp_path):
    """Issue 39, item 9: without SROS2 a node can take the planner's name, and the writer check believes it. With a
    fleet key the simulated fleet runs a segment only with a valid tag and a counter it has not taken: one without a
    tag, one signed with another key and a replayed copy are neither run nor acknowledged, and counted; its own
    acks and reports carry the key's tag."""
    from timelyllm_ros.ros.fleet_auth import FleetAuth

    key = _key_file(tmp_path)
    with _sim_fleet(["sim_k"], time_scale=0.01, fleet_key_file=key) as (fleet, planner):
        real = planner.send("sim_k", "t-real", 0, "mf(20);", final=True)
        assert [(d.segment_index, d.success) for d in planner.wait_done(1, task="t-real")] == [(0, True)]
        for msg in [*_forgeries("sim_k", _key_file(tmp_path, "other.key", b"another key, 16+ bytes")),
                    real]:  # the last: the planner's own segment again, counter and tag as they were (a replay)
            planner.pubs["sim_k"].publish(msg)
        assert wait_until(lambda: fleet.endpoint.gate.refused >= 3, timeout=20), fleet.endpoint.gate.refused
        time.sleep(0.5)
        assert fleet.endpoint.gate.refused == 3
        assert [e[:3] for e in fleet.robots["sim_k"].executed] == [["t-real", 0, "mf(20);"]]
        assert [(a.task_id, a.segment_index) for a in planner.acks] == [("t-real", 0)]  # the replay is not acked
        assert not [m for m in planner.done + planner.heartbeats if m.task_id.startswith("evil")]
        check = FleetAuth.from_file(key)
        assert [check.check(m) for m in planner.acks + planner.done[:1]] == [None, None]


def test_with_a_fleet_key_an_executor_runs_only_segments_signed_with_it_and_no_replay(tmp_path):
    """Issue 39, item 9, on an executor: the same forgeries are refused before anything runs or is acknowledged."""
    key = _key_file(tmp_path)
    with _robot("bot_k", key_file=key) as (node, planner):
        real = planner.send("bot_k", "t-real", 0, "a", final=True)
        assert [(d.segment_index, d.success) for d in planner.wait_done(1, task="t-real")] == [(0, True)]
        for msg in [*_forgeries("bot_k", _key_file(tmp_path, "other.key", b"another key, 16+ bytes")),
                    real]:
            planner.pubs["bot_k"].publish(msg)
        assert wait_until(lambda: node.refused_segments >= 3, timeout=20), node.refused_segments
        time.sleep(0.5)
        assert node.refused_segments == 3 and node.runner.ran == ["a"]
        assert [(a.task_id, a.segment_index) for a in planner.acks] == [("t-real", 0)]


def test_a_fleet_key_file_that_is_missing_or_short_is_refused_naming_the_parameter(tmp_path):
    from rclpy.parameter import Parameter

    from timelyllm_ros.ros.sim_fleet_node import SimFleetNode

    short = tmp_path / "short.key"
    short.write_bytes(b"abc")
    with _context() as ctx:
        for path, words in ((str(tmp_path / "none.key"), "cannot read"), (str(short), "3 bytes")):
            with pytest.raises(ValueError, match=f"fleet_key_file: .*{words}"):
                SimFleetNode(context=ctx, parameter_overrides=[Parameter("fleet_key_file", value=path)])
