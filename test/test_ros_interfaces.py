"""Every msg, srv and action of the package round-trips between two real rclpy nodes."""

from __future__ import annotations

import threading
import time

import pytest
from waiting import wait_until

rclpy = pytest.importorskip("rclpy", reason="rclpy missing: run scripts/setup.sh and `. env.sh`")
from builtin_interfaces.msg import Duration, Time  # noqa: E402
from rclpy.action import ActionServer, CancelResponse, GoalResponse  # noqa: E402
from rclpy.callback_groups import ReentrantCallbackGroup  # noqa: E402
from rclpy.qos import QoSDurabilityPolicy, QoSProfile, QoSReliabilityPolicy  # noqa: E402

from timelyllm_ros.action import PlanTask  # noqa: E402
from timelyllm_ros.msg import (  # noqa: E402
    EngineState,
    PlanResult,
    PlanSegment,
    QueuedGeneration,
    SchedulerState,
    SegmentDone,
    SkillCall,
    TaskRequest,
    TimeUtility,
)
from timelyllm_ros.ros.actions import SafeActionClient  # noqa: E402
from timelyllm_ros.ros.spin import PooledExecutor, Spinner  # noqa: E402
from timelyllm_ros.srv import EstimateExecTime, Plan  # noqa: E402

pytestmark = pytest.mark.ros

TIMEOUT = 10.0


@pytest.fixture()
def two_nodes():
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    a = rclpy.create_node("iface_test_a", context=ctx)
    b = rclpy.create_node("iface_test_b", context=ctx)
    ex = PooledExecutor(num_threads=4, context=ctx)
    ex.add_node(a)
    ex.add_node(b)
    t = Spinner(ex)
    t.start()
    yield a, b
    ex.shutdown()
    a.destroy_node()
    b.destroy_node()
    rclpy.shutdown(context=ctx)
    t.join(timeout=5)


def _wait(pred, timeout: float = TIMEOUT) -> bool:
    return wait_until(pred, timeout)


def _segment(i: int = 1) -> PlanSegment:
    call = SkillCall(name="mf", long_name="move_forward", raw="mf(50)", args=["50"], skillset_id="drone_minispec")
    return PlanSegment(
        task_id="t-1", robot_id="drone_3", segment_index=i, text="mf(50);", skills=[call], is_final=False,
        stamp_generated=Time(sec=12, nanosec=500), predicted_execution=Duration(sec=2, nanosec=174_400_000),
        next_segment_deadline=Time(sec=14, nanosec=0),
    )


def _roundtrip_topic(pub_node, sub_node, msg_type, msg, qos=10):
    got = []
    sub_node.create_subscription(msg_type, "/iface_test/" + msg_type.__name__, got.append, qos)
    pub = pub_node.create_publisher(msg_type, "/iface_test/" + msg_type.__name__, qos)
    assert _wait(lambda: pub.get_subscription_count() > 0), "subscriber never matched"
    # Publish until received: discovery of the reverse direction may lag.
    end = time.monotonic() + TIMEOUT
    while not got and time.monotonic() < end:
        pub.publish(msg)
        _wait(lambda: bool(got), 0.2)
    assert got, f"{msg_type.__name__} never arrived"
    return got[0]


def test_every_message_roundtrips(two_nodes):
    a, b = two_nodes
    tuf = TimeUtility(level="urgent", alpha=-6.67, beta=2.0, ert=0.2)
    assert _roundtrip_topic(a, b, TimeUtility, tuf) == tuf
    seg = _segment()
    got = _roundtrip_topic(a, b, PlanSegment, seg)
    assert got == seg and got.skills[0].raw == "mf(50)" and got.predicted_execution.nanosec == 174_400_000
    done = SegmentDone(task_id="t-1", robot_id="drone_3", segment_index=1, start=Time(sec=3), finish=Time(sec=5),
                       success=False, error="connection lost")
    assert _roundtrip_topic(a, b, SegmentDone, done) == done
    q = QueuedGeneration(task_id="t-2", robot_id="drone_4", segment_index=0, suspended=False, priority=12.5,
                         slack_s=0.3, waiting_s=0.1)
    state = SchedulerState(stamp=Time(sec=1), policy="pud", queue=[q], running_task_ids=["t-1"], tasks_active=2,
                           tasks_done=7, last_decision_time_s=4e-5)
    assert _roundtrip_topic(a, b, SchedulerState, state) == state
    latched = QoSProfile(depth=1, reliability=QoSReliabilityPolicy.RELIABLE,
                         durability=QoSDurabilityPolicy.TRANSIENT_LOCAL)
    eng = EngineState(stamp=Time(sec=2), backend="vllm", model="SmolLM2-135M-Instruct", running=3, waiting=1,
                      max_batch=8, tokens_per_second=88.0, step_time_s=0.034, kv_cache_usage=0.12)
    assert _roundtrip_topic(a, b, EngineState, eng, latched) == eng
    assert _roundtrip_topic(a, b, SkillCall, seg.skills[0]) == seg.skills[0]
    req = TaskRequest(stamp=Time(sec=7), task_id="t-3", robot_id="drone_2", robot_type="drone", task="find the cat",
                      tuf=tuf, accepted=False, error="tuf.beta must be > 0")
    assert _roundtrip_topic(a, b, TaskRequest, req) == req


def test_services_roundtrip(two_nodes):
    a, b = two_nodes

    def plan_cb(req, resp):
        resp.status = Plan.Response.STATUS_OK if req.task else Plan.Response.STATUS_REJECTED
        resp.error = "" if req.task else "task: must not be empty"
        resp.plan_text = f"tc({int(req.tuf.ert * 100)});"
        resp.segments = [_segment(0)]
        return resp

    def est_cb(req, resp):
        resp.ok, resp.min_s, resp.typical_s, resp.max_s = True, 1.0, 2.0, 3.0 + len(req.segment_text)
        return resp

    a.create_service(Plan, "/iface_test/plan", plan_cb)
    a.create_service(EstimateExecTime, "/iface_test/estimate", est_cb)
    plan_cli = b.create_client(Plan, "/iface_test/plan")
    est_cli = b.create_client(EstimateExecTime, "/iface_test/estimate")
    assert plan_cli.wait_for_service(timeout_sec=TIMEOUT) and est_cli.wait_for_service(timeout_sec=TIMEOUT)

    req = Plan.Request(robot_id="drone_1", robot_type="drone", task="find the cat",
                       tuf=TimeUtility(level="normal", alpha=-2.0, beta=1.0, ert=1.0))
    fut = plan_cli.call_async(req)
    assert _wait(fut.done)
    resp = fut.result()
    assert resp.status == Plan.Response.STATUS_OK and resp.plan_text == "tc(100);"
    assert resp.segments[0].text == "mf(50);"
    fut = plan_cli.call_async(Plan.Request(robot_id="drone_1", robot_type="drone", task=""))
    assert _wait(fut.done) and fut.result().status == Plan.Response.STATUS_REJECTED
    fut = est_cli.call_async(EstimateExecTime.Request(robot_type="drone", segment_text="mf(50);"))
    assert _wait(fut.done)
    r = fut.result()
    assert r.ok and (r.min_s, r.typical_s, r.max_s) == (1.0, 2.0, 10.0)


def _action_server(node, release: threading.Event):
    group = ReentrantCallbackGroup()

    def execute(goal_handle):
        for i in range(3):
            if goal_handle.is_cancel_requested:
                goal_handle.canceled()
                return PlanTask.Result(status=PlanTask.Result.STATUS_CANCELED, message="canceled by client",
                                       task_id=goal_handle.request.task_id)
            fb = PlanTask.Feedback(segment=_segment(i), utility_estimate=1.0 - 0.1 * i)
            goal_handle.publish_feedback(fb)
            if i == 0:
                release.wait(TIMEOUT)  # hold here so a client can cancel mid-plan
        goal_handle.succeed()
        return PlanTask.Result(status=PlanTask.Result.STATUS_SUCCEEDED, message="ok",
                               task_id=goal_handle.request.task_id, plan_text="mf(50);mf(50);mf(50);",
                               segments=[_segment(i) for i in range(3)],
                               response_time=Duration(sec=0, nanosec=300_000_000), utility=1.0)

    return ActionServer(node, PlanTask, "/iface_test/plan_task", execute_callback=execute,
                        goal_callback=lambda g: GoalResponse.ACCEPT if g.task else GoalResponse.REJECT,
                        cancel_callback=lambda g: CancelResponse.ACCEPT, callback_group=group)


def test_action_goal_feedback_result(two_nodes):
    a, b = two_nodes
    release = threading.Event()
    release.set()
    _server = _action_server(a, release)  # noqa: F841 - must stay alive
    client = SafeActionClient(b, PlanTask, "/iface_test/plan_task")
    assert client.wait_for_server(timeout_sec=TIMEOUT)
    feedback = []
    goal = PlanTask.Goal(task_id="t-1", robot_id="drone_3", robot_type="drone", task="find the cat",
                         tuf=TimeUtility(level="normal"))
    send = client.send_goal_async(goal, feedback_callback=lambda m: feedback.append(m.feedback))
    assert _wait(send.done)
    handle = send.result()
    assert handle.accepted
    res = handle.get_result_async()
    assert _wait(res.done)
    result = res.result().result
    assert result.status == PlanTask.Result.STATUS_SUCCEEDED and len(result.segments) == 3
    assert result.response_time.nanosec == 300_000_000
    assert _wait(lambda: len(feedback) == 3)
    assert [f.segment.segment_index for f in feedback] == [0, 1, 2]

    bad = client.send_goal_async(PlanTask.Goal(robot_id="drone_3", robot_type="drone", task=""))
    assert _wait(bad.done) and not bad.result().accepted


def test_action_cancel(two_nodes):
    a, b = two_nodes
    release = threading.Event()
    _server = _action_server(a, release)  # noqa: F841
    client = SafeActionClient(b, PlanTask, "/iface_test/plan_task")
    assert client.wait_for_server(timeout_sec=TIMEOUT)
    feedback = []
    send = client.send_goal_async(PlanTask.Goal(task_id="t-9", robot_id="arm_1", robot_type="arm", task="stack"),
                                  feedback_callback=lambda m: feedback.append(m))
    assert _wait(send.done)
    handle = send.result()
    assert _wait(lambda: feedback), "no feedback before cancel"
    cancel = handle.cancel_goal_async()
    assert _wait(cancel.done) and len(cancel.result().goals_canceling) == 1
    release.set()
    res = handle.get_result_async()
    assert _wait(res.done)
    assert res.result().result.status == PlanTask.Result.STATUS_CANCELED
    assert res.result().status == 5  # action_msgs GoalStatus.STATUS_CANCELED


# The message constant each terminal status travels as (names differ where the wire predates the enum).
_WIRE_NAME = {"done": "STATUS_SUCCEEDED", "invalid": "STATUS_REJECTED", "failed": "STATUS_FAILED",
              "cancelled": "STATUS_CANCELED", "overdue": "STATUS_OVERDUE", "robot_failed": "STATUS_ROBOT_FAILED",
              "busy": "STATUS_BUSY"}


@pytest.mark.parametrize("msg_cls", [PlanResult, PlanTask.Result], ids=["PlanResult", "PlanTask.Result"])
def test_status_table_matches_the_message_constants(msg_cls):
    from timelyllm_ros.domain.types import STATUS_CODE, STATUS_FROM_CODE, TERMINAL_STATUSES, TaskStatus
    from timelyllm_ros.ros.convert import status_code, status_from_code, status_name

    consts = {k: v for k, v in vars(msg_cls).items() if k.startswith("STATUS_")}
    assert set(_WIRE_NAME) == {s.value for s in STATUS_CODE} == {s.value for s in TERMINAL_STATUSES}
    # status -> code: every terminal status has the code of its constant
    for st, code in STATUS_CODE.items():
        assert consts[_WIRE_NAME[st.value]] == code, st
        assert status_code(st) == code and status_name(code) == st.value
    # code -> status: every constant of the message has exactly one status, and it maps back
    assert sorted(consts.values()) == sorted(STATUS_FROM_CODE) == sorted(STATUS_CODE.values())
    for name, code in consts.items():
        st = STATUS_FROM_CODE[code]
        assert _WIRE_NAME[st.value] == name and STATUS_CODE[st] == code and status_from_code(code) is st
    # nothing that is not terminal goes out as success
    assert status_code(TaskStatus.RUNNING) == consts["STATUS_FAILED"] and status_from_code(250) is None
