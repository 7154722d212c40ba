"""One raising callback must not stop an executor that serves a whole planner."""

from __future__ import annotations

import threading

import pytest
from waiting import wait_until

rclpy = pytest.importorskip("rclpy")
from rclpy.executors import MultiThreadedExecutor  # noqa: E402

from timelyllm_ros.ros.spin import Spinner  # noqa: E402

pytestmark = pytest.mark.ros


@pytest.fixture()
def node_with_a_broken_timer():
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    node = rclpy.create_node("spin_test", context=ctx)
    ticks = {"ok": 0, "broken": 0}

    def broken() -> None:
        ticks["broken"] += 1
        raise RuntimeError(f"broken callback #{ticks['broken']}")

    def ok() -> None:
        ticks["ok"] += 1

    node.create_timer(0.05, broken)
    node.create_timer(0.01, ok)
    ex = MultiThreadedExecutor(num_threads=2, context=ctx)
    ex.add_node(node)
    yield ex, ticks
    ex.shutdown(timeout_sec=5)
    node.destroy_node()
    rclpy.try_shutdown(context=ctx)


def test_rclpy_spin_stops_at_the_first_raising_callback(node_with_a_broken_timer):
    """Why Spinner exists: rclpy's own spin() re-raises and returns, and every other callback stops."""
    ex, ticks = node_with_a_broken_timer
    raised: list[BaseException] = []

    def spin() -> None:
        try:
            ex.spin()
        except RuntimeError as e:
            raised.append(e)

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    t.join(30)
    assert raised and "broken callback" in str(raised[0])


def test_spinner_logs_a_raising_callback_and_serves_the_others(node_with_a_broken_timer):
    ex, ticks = node_with_a_broken_timer
    sp = Spinner(ex, name="spin-test", max_errors=3)
    sp.start()
    try:
        assert wait_until(lambda: ticks["broken"] >= 5, 30), ticks
        ok_then = ticks["ok"]
        assert wait_until(lambda: ticks["ok"] > ok_then + 5, 30), "the healthy timer stopped"
        assert sp.is_alive()
    finally:
        sp.stop()
    assert not sp.is_alive()
    assert len(sp.errors) == 3  # bounded: only the last ones are kept
    assert all("RuntimeError: broken callback #" in e for e in sp.errors)
