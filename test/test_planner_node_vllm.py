"""The planner node with the real vLLM engine and the bundled model (CPU build here)."""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("vllm")

from test_planner_node import CAT, DOG, NORMAL, URGENT, Stack, _wait  # noqa: E402
from waiting import wait_until  # noqa: E402

from timelyllm_ros.action import PlanTask  # noqa: E402
from timelyllm_ros.skills.skill_files import load_skill_set  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.engine]


@pytest.fixture(scope="module")
def vllm_engine():
    from timelyllm_ros.engines.factory import planner_engine

    engine, constrained = planner_engine("engine_vllm_cpu.yaml")
    assert constrained  # the default: each task's grammar
    yield engine
    engine.close()


BUSY_FIRST = ("Scene: [ball x:0.45 y:0.50 width:0.10 height:0.10] Task: [E] You provided me with plan mf,120, but I "
              "encountered a failure because a ball is flying at me. Execution history: mf(40)")


def test_real_engine_streams_valid_segments_and_serves_urgent_first(vllm_engine):
    s = Stack(engine=vllm_engine, fleet_time_scale=1.0, constrained=True)  # as planner_engine says
    try:
        # warm-up: the first forward passes of a fresh engine are slow
        _, h = s.send("drone_3", CAT)
        s.result(h, timeout=120)
        # A normal-TUF task whose robot is busy with its first segment for a while (the model moves up 100 cm
        # first: 3 s predicted). On this CPU a segment takes ~1 s to write under load, and the suspended
        # generation resumes that long before its robot is predicted idle; after a 1.5 s scan it resumed
        # about when the urgent goal came in, and the two rightly ran side by side (CI under the hog).
        fb_n, h_n = s.send("drone_0", BUSY_FIRST, NORMAL, task_id="normal-1")
        assert _wait(lambda: len(fb_n) >= 1, 60)
        first = fb_n[0][1].segment
        busy_s = first.predicted_execution.sec + first.predicted_execution.nanosec * 1e-9
        assert busy_s >= 2.5, (first.text, busy_s)  # the premise: the model's plan starts with a long move
        fb_u, h_u = s.send("drone_1", DOG, URGENT, task_id="urgent-1")
        # The urgent generation goes into the engine at once, while the normal one stays suspended (its robot
        # is busy with its first segment, the generation resumes only just in time for it).
        core = s.planner.core
        assert wait_until(lambda: "urgent-1" in core.running_ids(), 30, interval=0.002), "the urgent task never ran"
        running, n_out = core.running_ids(), len(fb_n)
        assert "normal-1" not in running and n_out == 1, (running, [f.segment.text for _, f in fb_n])
        r_u, r_n = s.result(h_u, 120), s.result(h_n, 120)
        assert r_n.status == PlanTask.Result.STATUS_SUCCEEDED, r_n.message
        assert r_u.status == PlanTask.Result.STATUS_SUCCEEDED, r_u.message
        drone = load_skill_set("drone")
        for fb in (fb_n, fb_u):
            texts = [f.segment.text for _, f in fb]
            assert all(f.segment.skills or f.segment.is_final for _, f in fb), texts
            for t in texts:
                assert drone.validate(t) is None, t  # nothing unparsable reached the robot
        assert len(fb_n) >= 2, [f.segment.text for _, f in fb_n]
        # From the robots' side: the urgent robot got its first action before the normal one its second.
        t0 = fb_n[0][0]
        assert fb_u[0][0] < fb_n[1][0], ("the urgent first segment came after the normal task's second segment",
                                         [(round(t - t0, 3), f.segment.text) for t, f in fb_n],
                                         [(round(t - t0, 3), f.segment.text) for t, f in fb_u])
        # the suspended normal generation held no batch slot meanwhile and nothing is left running
        assert not vllm_engine.running_ids()
    finally:
        s.close()


def test_real_engine_cancel_frees_the_request(vllm_engine):
    s = Stack(engine=vllm_engine, fleet_time_scale=1.0, constrained=True)
    try:
        fb, h = s.send("drone_2", CAT)
        assert _wait(lambda: fb, 60)
        tid = fb[0][1].segment.task_id
        cancel = h.cancel_goal_async()
        assert _wait(cancel.done)
        r = s.result(h, 60)
        assert r.status == PlanTask.Result.STATUS_CANCELED
        assert _wait(lambda: tid not in vllm_engine.running_ids(), 10)
        assert not vllm_engine.backend_has_request(tid)
    finally:
        s.close()


def test_engine_state_and_diagnostics_say_the_dtype_why_and_the_speculation(vllm_engine):
    """The dtype is decided at configure from this CPU's flags (auto); operators see it, why, and whether
    speculative decoding is on, on /engine_state and /diagnostics."""
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.qos import QoSProfile, QoSReliabilityPolicy

    from timelyllm_ros.msg import EngineState
    from timelyllm_ros.ros import topics
    from timelyllm_ros.ros.diagnostics import DIAGNOSTICS_TOPIC

    info = vllm_engine.info
    assert info.dtype in ("bfloat16", "float32") and info.dtype_reason.startswith("auto: "), info
    s = Stack(engine=vllm_engine, constrained=True)
    try:
        states: list = []
        arrays: list = []
        s.client.create_subscription(EngineState, "/engine_state", states.append, topics.TELEMETRY)
        s.client.create_subscription(DiagnosticArray, DIAGNOSTICS_TOPIC, arrays.append,
                                     QoSProfile(depth=50, reliability=QoSReliabilityPolicy.RELIABLE))

        def engine_values() -> dict | None:
            for arr in reversed(list(arrays)):
                for st in arr.status:
                    if st.name.startswith("planner") and st.name.endswith("engine"):
                        return {kv.key: kv.value for kv in st.values}
            return None

        assert _wait(lambda: states and engine_values() is not None), "no /engine_state or /diagnostics"
        m = states[-1]
        assert (m.dtype, m.dtype_reason, m.speculative) == (info.dtype, info.dtype_reason, info.speculative)
        v = engine_values()
        assert (v["dtype"], v["dtype_reason"], v["speculative"]) == (info.dtype, info.dtype_reason,
                                                                    info.speculative or "off")
    finally:
        s.close()
