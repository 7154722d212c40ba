"""The planner node over real rclpy (loopback DDS) with the simulated engine (deterministic, no weights).

The same tests with the real vLLM engine are in test_planner_node_vllm.py.
"""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
from waiting import wait_until

rclpy = pytest.importorskip("rclpy")
from rclpy.parameter import Parameter  # noqa: E402

from timelyllm_ros.action import PlanTask  # noqa: E402
from timelyllm_ros.engines.sim_realtime import RealtimeSimEngine  # noqa: E402
from timelyllm_ros.msg import TimeUtility  # noqa: E402
from timelyllm_ros.ros.actions import SafeActionClient  # noqa: E402
from timelyllm_ros.ros.planner_node import build_planner  # noqa: E402
from timelyllm_ros.ros.sim_fleet_node import SimFleetNode  # noqa: E402
from timelyllm_ros.ros.spin import PooledExecutor, Spinner  # noqa: E402
from timelyllm_ros.skills.skill_files import load_skill_set  # noqa: E402

pytestmark = pytest.mark.ros

CAT = "Scene: [] Task: [A] Could you find the cat? If so, go to it."
DOG = ("Scene: [dog x:0.48 y:0.51 width:0.2 height:0.4] Task: [E] You provided me with plan ml,100, but I "
       "encountered a failure because a dog is attempting to catch me. Execution history: ml(50)")
NORMAL = TimeUtility(level="normal")
URGENT = TimeUtility(level="urgent")


class Stack:
    """Planner + scheduler + simulated fleet + a robot-side client node, in one process."""

    def __init__(self, policy: str = "pud", silent: tuple[str, ...] = (), robots: int = 4,
                 engine_time_scale: float = 1.0, fleet_time_scale: float = 0.2, engine=None,
                 sim_fleet: bool = True, constrained: bool = False) -> None:
        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx)
        kw = {"context": self.ctx}
        self.engine = engine or RealtimeSimEngine(time_scale=engine_time_scale)
        # build_planner creates nodes in the default context: give them ours.
        self.planner, self.sched = build_planner(
            [Parameter("policy", value=policy), Parameter("admission", value="latency")], engine=self.engine,
            constrained=constrained, context=self.ctx)
        self.fleet = None if not sim_fleet else SimFleetNode(context=self.ctx, parameter_overrides=[
            Parameter("robots", value=[f"drone_{i}" for i in range(robots)] + list(silent)),
            Parameter("silent_robots", value=list(silent) or [""]),
            Parameter("time_scale", value=fleet_time_scale)])
        self.client = rclpy.create_node("robot_client", **kw)
        self.action = SafeActionClient(self.client, PlanTask, "/plan_task")
        self.ex = PooledExecutor(num_threads=24, context=self.ctx)
        for n in self.nodes:
            self.ex.add_node(n)
        self.thread = Spinner(self.ex)
        self.thread.start()
        self._ready_or_close(lambda: self.action.wait_for_server(timeout_sec=30))

    def _ready_or_close(self, *ready) -> None:
        """A stack that never became ready is torn down before the test fails: left running, its planner
        would answer the goals of every later test in this process's ROS domain."""
        ok = False
        try:
            ok = all(r() for r in ready)
        finally:
            if not ok:
                self.close()
        assert ok, "the planner's action server (or service) never became visible"

    def send(self, robot: str, task: str, tuf=NORMAL, task_id: str = "", robot_type: str = "drone"):
        """Returns (feedback list with arrival times, result future getter)."""
        fb: list[tuple[float, PlanTask.Feedback]] = []
        goal = PlanTask.Goal(task_id=task_id, robot_id=robot, robot_type=robot_type, task=task, tuf=tuf)
        fut = self.action.send_goal_async(goal, feedback_callback=lambda m: fb.append((time.monotonic(), m.feedback)))
        assert _wait(fut.done), "goal response never came"
        handle = fut.result()
        assert handle.accepted
        return fb, handle

    def result(self, handle, timeout: float = 30.0):
        res = handle.get_result_async()
        assert _wait(res.done, timeout), "result never came"
        return res.result().result

    def close(self) -> None:
        self.planner.shutdown()
        self.thread.stop()  # before the executor's shutdown, which destroys what in-flight handlers still use
        self.ex.shutdown(timeout_sec=5)
        for n in reversed(self.nodes):
            n.destroy_node()
        rclpy.shutdown(context=self.ctx)
        # The spinner logs a raising callback and goes on (rclpy's spin would have stopped every node here)
        assert not self.thread.errors, f"{len(self.thread.errors)} callback(s) raised; first:\n{self.thread.errors[0]}"

    @property
    def nodes(self) -> list:
        return [n for n in (self.planner, self.sched, self.fleet, self.client) if n is not None]


def _wait(pred, timeout: float = 15.0) -> bool:
    return wait_until(pred, timeout)


@pytest.fixture()
def stack():
    s = Stack()
    yield s
    s.close()


def test_goal_streams_segments_then_result(stack):
    fb, handle = stack.send("drone_0", CAT)
    r = stack.result(handle)
    assert r.status == PlanTask.Result.STATUS_SUCCEEDED, r.message
    assert len(fb) >= 2, [f.segment.text for _, f in fb]
    drone = load_skill_set("drone")
    for i, (_, f) in enumerate(fb):
        assert f.segment.segment_index == i and f.segment.robot_id == "drone_0"
        # every segment but a syntax-only remainder ('};') carries a complete skill
        assert f.segment.skills or (f.segment.is_final and i > 0), f"segment {f.segment.text!r} carries no skill"
        assert [c.raw for c in f.segment.skills] == [c.raw for c in drone.parse(f.segment.text)]
    assert "".join(f.segment.text for _, f in fb) == r.plan_text == "?s('cat')==True{g('cat')};"
    assert r.segments[-1].is_final
    assert r.response_time.sec == 0 and r.response_time.nanosec > 0
    assert math.isfinite(r.utility) and r.utility <= 1.0


def test_urgent_goal_overtakes_the_next_segment_of_a_normal_plan(stack):
    fb_n, h_n = stack.send("drone_0", CAT, NORMAL)
    assert _wait(lambda: len(fb_n) >= 1)
    fb_u, h_u = stack.send("drone_1", DOG, URGENT)
    assert stack.result(h_u).status == PlanTask.Result.STATUS_SUCCEEDED
    assert stack.result(h_n).status == PlanTask.Result.STATUS_SUCCEEDED
    assert len(fb_n) >= 2 and fb_u
    assert fb_u[0][0] < fb_n[1][0], "the urgent task's first segment came after the normal task's second"


def test_cancel_aborts_the_generation(stack):
    fb, handle = stack.send("drone_2", CAT)
    assert _wait(lambda: fb)
    tid = fb[0][1].segment.task_id
    cancel = handle.cancel_goal_async()
    assert _wait(cancel.done)
    r = stack.result(handle)
    assert r.status == PlanTask.Result.STATUS_CANCELED
    assert tid not in stack.engine.running_ids()
    assert stack.planner.core.task_status(tid).terminal


@pytest.mark.parametrize("goal, field", [
    (dict(robot_type="submarine"), "robot_type"),
    (dict(task="   "), "task"),
    (dict(tuf=TimeUtility(level="", alpha=float("nan"), beta=1.0, ert=1.0)), "tuf.alpha"),
    (dict(tuf=TimeUtility(level="", alpha=-2.0, beta=-1.0, ert=1.0)), "beta"),
    (dict(tuf=TimeUtility(level="", alpha=2.0, beta=1.0, ert=1.0)), "alpha"),
    (dict(tuf=TimeUtility(level="panic")), "tuf.level"),
    (dict(task="find the cat " * 400), "max_task_chars"),
    (dict(robot_id=""), "robot_id"),
    # not a ROS topic name: refused at acceptance, not failed when the segment publisher is made
    (dict(robot_id="drone-0"), "robot_id: 'drone-0' has '-' at position 5"),
    (dict(robot_id="1abc"), "robot_id: '1abc': '1abc' starts with a digit"),
])
def test_bad_goals_are_rejected_with_a_clear_message(stack, goal, field):
    args = dict(robot="drone_3", task=CAT, tuf=NORMAL)
    args.update({("robot" if k == "robot_id" else k): v for k, v in goal.items() if k != "robot_type"})
    fb, handle = stack.send(args["robot"], args["task"], args["tuf"], robot_type=goal.get("robot_type", "drone"))
    r = stack.result(handle)
    assert r.status == PlanTask.Result.STATUS_REJECTED
    assert field in r.message, r.message
    # the node keeps serving
    fb, handle = stack.send("drone_3", CAT)
    assert stack.result(handle).status == PlanTask.Result.STATUS_SUCCEEDED


def test_context_overflow_and_duplicate_task_id_are_rejected(stack):
    declared = stack.engine.info
    stack.engine.info = dataclasses.replace(declared, max_model_len=64)  # a tiny context: the prompt does not fit
    _, handle = stack.send("drone_0", "find the cat " * 40)
    r = stack.result(handle)
    assert r.status == PlanTask.Result.STATUS_REJECTED and "context" in r.message, r.message
    stack.engine.info = declared
    _, h1 = stack.send("drone_0", CAT, task_id="same-id")
    _, h2 = stack.send("drone_1", CAT, task_id="same-id")
    r1, r2 = stack.result(h1), stack.result(h2)
    assert sorted([r1.status, r2.status]) == [PlanTask.Result.STATUS_SUCCEEDED, PlanTask.Result.STATUS_REJECTED]
    assert "task_id" in (r1.message + r2.message)


def test_engine_state_names_the_declared_backend_and_model(stack):
    from timelyllm_ros.msg import EngineState
    from timelyllm_ros.ros import topics

    got: list = []
    sub = stack.client.create_subscription(EngineState, "/engine_state", got.append, topics.TELEMETRY)
    try:
        assert _wait(lambda: got), "no /engine_state"
    finally:
        stack.client.destroy_subscription(sub)
    assert (got[-1].backend, got[-1].model) == (stack.engine.info.name, stack.engine.info.model) == ("sim", "simulated")


def test_engine_state_reports_each_member_of_an_engine_pool():
    from timelyllm_ros.engines.pool import EnginePool
    from timelyllm_ros.msg import EngineState
    from timelyllm_ros.ros import topics

    s = Stack(engine=EnginePool([RealtimeSimEngine(), RealtimeSimEngine()], names=["a", "b"]))
    try:
        _, h = s.send("drone_0", CAT)
        assert s.result(h).status == PlanTask.Result.STATUS_SUCCEEDED
        got: list = []
        s.client.create_subscription(EngineState, "/engine_state", got.append, topics.TELEMETRY)
        assert _wait(lambda: got), "no /engine_state"
        m = got[-1]
        assert (m.backend, [(x.index, x.name, x.backend, x.up) for x in m.members]) == \
            ("pool", [(0, "a", "sim", True), (1, "b", "sim", True)])
        assert all(x.max_batch > 0 and x.down_reason == "" for x in m.members)
        assert m.max_batch == sum(x.max_batch for x in m.members)
    finally:
        s.close()


def test_a_silent_robot_does_not_stall_the_others():
    s = Stack(silent=("drone_mute",))
    try:
        fb_m, h_m = s.send("drone_mute", CAT)
        fb_a, h_a = s.send("drone_0", CAT)
        r_a = s.result(h_a)
        r_m = s.result(h_m)
        assert r_a.status == PlanTask.Result.STATUS_SUCCEEDED
        # the silent robot's plan is still delivered, on predicted finish times, and ends with a status
        assert r_m.status == PlanTask.Result.STATUS_SUCCEEDED, r_m.message
        assert len(fb_m) == len(fb_a) >= 2
    finally:
        s.close()


def test_every_accepted_goal_ends_when_the_planner_shuts_down():
    s = Stack(fleet_time_scale=1.0)
    handles = [s.send(f"drone_{i % 4}", CAT)[1] for i in range(6)]
    results = []
    try:
        time.sleep(0.3)
        s.planner.shutdown()
        for h in handles:
            res = h.get_result_async()
            assert _wait(res.done, 15), "a goal was left hanging at shutdown"
            results.append(res.result())
    finally:
        s.ex.shutdown(timeout_sec=5)
        for n in reversed(s.nodes):
            n.destroy_node()
        rclpy.shutdown(context=s.ctx)
    for r in results:
        assert r.status in (4, 6), r  # SUCCEEDED or ABORTED (action_msgs GoalStatus)
        if r.status == 6:
            assert r.result.message == "planner shutting down"


def test_journaled_statuses_read_back_through_the_one_status_table():
    from timelyllm_ros.domain.types import STATUS_CODE, TERMINAL_STATUSES, TaskStatus
    from timelyllm_ros.planner.recovery import task_result_from_record
    from timelyllm_ros.ros.convert import plan_result_from_record

    for st in TERMINAL_STATUSES:
        assert task_result_from_record("t", {"status": st.value}).status is st
        assert plan_result_from_record({"task_id": "t", "status": st.value}).status == STATUS_CODE[st]
    # journals from before OVERDUE and INVALID were split wrote the overdue policy's refusals as "rejected"
    assert task_result_from_record("t", {"status": "rejected"}).status is TaskStatus.OVERDUE
    assert task_result_from_record("t", {"status": "?"}).status is TaskStatus.FAILED


def test_a_busy_robot_runs_one_task_at_a_time_and_only_an_urgent_one_preempts():
    """docs/contract.md "Robots and safety", from the robot's side (the simulated fleet's execution log)."""
    s = Stack(fleet_time_scale=1.0)
    try:
        log = s.fleet.robots["drone_0"].executed
        fb_a, h_a = s.send("drone_0", CAT, NORMAL, task_id="busy-a")
        assert _wait(lambda: fb_a)
        fb_b, h_b = s.send("drone_0", CAT, NORMAL, task_id="busy-b")  # waits its turn
        assert s.result(h_a, 60).status == PlanTask.Result.STATUS_SUCCEEDED
        assert _wait(lambda: any(e[0] == "busy-b" for e in list(log)), 60)
        a_end = max(e[4] for e in list(log) if e[0] == "busy-a")
        b_start = min(e[3] for e in list(log) if e[0] == "busy-b")
        assert b_start >= a_end, "the second normal task started before the robot finished the first"
        assert all(e[5] for e in list(log) if e[0] == "busy-a"), "the first task was interrupted"
        fb_u, h_u = s.send("drone_0", DOG, URGENT, task_id="busy-u")  # preempts busy-b
        assert s.result(h_u, 60).status == PlanTask.Result.STATUS_SUCCEEDED
        assert _wait(lambda: (r := s.planner.core.result("busy-b")) is not None
                     and r.status.value == "cancelled" and "preempted by task busy-u" in r.reason, 30)
        u_start = min(e[3] for e in list(log) if e[0] == "busy-u")
        assert all(e[3] < u_start for e in list(log) if e[0] == "busy-b"), "busy-b ran after it was preempted"
        spans = sorted((e[3], e[4]) for e in list(log))
        assert all(x[1] <= y[0] + 1e-6 for x, y in zip(spans, spans[1:], strict=False)), spans
    finally:
        s.close()
