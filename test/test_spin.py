"""One raising callback must not stop an executor that serves a whole planner, and the executor must not
drown the callbacks it dispatches (PooledExecutor)."""

from __future__ import annotations

import threading
import time

import pytest
from waiting import wait_until

rclpy = pytest.importorskip("rclpy")
from rclpy.callback_groups import ReentrantCallbackGroup  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.task import Future  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from timelyllm_ros.ros.spin import PooledExecutor, Spinner  # noqa: E402

pytestmark = pytest.mark.ros


@pytest.fixture(params=[MultiThreadedExecutor, PooledExecutor])
def node_with_a_broken_timer(request):
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
    ex = request.param(num_threads=2, context=ctx)
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


@pytest.fixture()
def ros_context():
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    yield ctx
    rclpy.try_shutdown(context=ctx)


def _flood(ctx, executor_cls, *, topics_n: int = 4, per_topic: int = 40) -> tuple[int, list]:
    """Slow callbacks on several topics, two workers: handlers wait in the pool. Returns (callbacks run,
    the handler of every submission to the pool)."""
    node = rclpy.create_node("flood", context=ctx)
    group = ReentrantCallbackGroup()
    ran = []

    def slow(msg: String) -> None:
        time.sleep(0.005)
        ran.append(msg.data)

    pubs = []
    for i in range(topics_n):
        node.create_subscription(String, f"flood_{i}", slow, 1000, callback_group=group)
        pubs.append(node.create_publisher(String, f"flood_{i}", 1000))
    ex = executor_cls(num_threads=2, context=ctx)
    submitted: list = []
    # rclpy's thread pool: it offers no public hook to count what is submitted to it
    submit = ex._executor.submit

    def counting_submit(fn, *args, **kwargs):
        submitted.append(args[0] if args else fn)  # PooledExecutor passes the task; rclpy submits it itself
        return submit(fn, *args, **kwargs)

    ex._executor.submit = counting_submit
    ex.add_node(node)
    sp = Spinner(ex, name="flood")
    sp.start()
    try:
        assert wait_until(lambda: all(p.get_subscription_count() for p in pubs), 30)
        for k in range(per_topic):
            for p in pubs:
                p.publish(String(data=f"{p.topic_name}:{k}"))
        assert wait_until(lambda: len(ran) == topics_n * per_topic, 60), len(ran)
    finally:
        sp.stop()
        ex.shutdown(timeout_sec=5)
        node.destroy_node()
    return len(ran), submitted


def test_rclpy_multithreaded_executor_queues_a_waiting_handler_again_and_again(ros_context):
    """Why PooledExecutor exists (ros2/rclpy#1452): a handler that has not started is yielded and queued again
    at every wake-up."""
    ran, submitted = _flood(ros_context, MultiThreadedExecutor)
    assert len(submitted) > len(set(map(id, submitted))), "no handler was queued twice"


def test_pooled_executor_queues_each_handler_once_and_runs_every_callback(ros_context):
    ran, submitted = _flood(ros_context, PooledExecutor)
    assert ran == 4 * 40
    assert len(submitted) == len(set(map(id, submitted))), \
        f"{len(submitted) - len(set(map(id, submitted)))} handlers queued more than once"


def test_pooled_executor_resumes_a_coroutine_that_awaits(ros_context):
    """A coroutine callback waiting on a future leaves the pool and is resumed once the future is done."""
    node = rclpy.create_node("awaiting", context=ros_context)
    gate: Future = Future()
    got: list[str] = []

    async def waiter() -> None:
        got.append(await gate)

    ex = PooledExecutor(num_threads=2, context=ros_context)
    ex.add_node(node)
    task = ex.create_task(waiter)
    sp = Spinner(ex, name="awaiting")
    sp.start()
    try:
        time.sleep(0.3)
        assert not task.done()
        node.create_timer(0.05, lambda: None if gate.done() else gate.set_result("opened"))
        assert wait_until(task.done, 30)
        assert got == ["opened"]
    finally:
        sp.stop()
        ex.shutdown(timeout_sec=5)
        node.destroy_node()


def test_a_pooled_executor_shut_down_while_it_spins_raises_nothing_into_spin_once(ros_context):
    """rclpy's shutdown destroys the guard condition at once, in-flight handlers or not, and then runs what its
    thread pool still holds: those handlers must not run into it, and what ends once shutdown has begun is the
    teardown's, not a callback error raised into the thread that still spins."""
    node = rclpy.create_node("teardown", context=ros_context)
    group = ReentrantCallbackGroup()
    ticks = []

    def slow() -> None:
        time.sleep(0.2)
        ticks.append(1)

    for _ in range(4):  # more slow callbacks than workers: handlers wait in the pool
        node.create_timer(0.01, slow, callback_group=group)
    node.create_timer(0.005, lambda: ticks.append(0), callback_group=group)
    ex = PooledExecutor(num_threads=2, context=ros_context)
    ex.add_node(node)
    end = time.monotonic() + 30
    while len(ticks) < 5 and time.monotonic() < end:
        ex.spin_once(timeout_sec=0.05)
    assert len(ticks) >= 5 and ex.queued, "nothing was waiting in the pool"
    closer = threading.Thread(target=ex.shutdown, kwargs={"timeout_sec": 5})
    closer.start()
    raised = []
    while closer.is_alive():  # the spin thread of a node being torn down
        try:
            ex.spin_once(timeout_sec=0.01)
        except Exception as e:  # noqa: BLE001
            raised.append(e)
    closer.join()
    node.destroy_node()
    assert not raised, raised[0]
