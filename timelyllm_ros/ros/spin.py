"""One way to run a process's nodes until Ctrl-C / SIGTERM, shared by every executable."""

from __future__ import annotations

import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import rclpy
import rclpy.logging
from rclpy.action import ActionServer
from rclpy.executors import (
    ConditionReachedException,
    Executor,
    ExternalShutdownException,
    MultiThreadedExecutor,
    ShutdownException,
    SingleThreadedExecutor,
    TimeoutException,
)
from rclpy.node import Node
from rclpy.service import Service
from rclpy.signals import SignalHandlerOptions
from rclpy.subscription import Subscription
from rclpy.task import Task
from rclpy.timer import Timer


class PooledExecutor(MultiThreadedExecutor):
    """rclpy's ``MultiThreadedExecutor`` without its collapse under load (ros2/rclpy#1452, fixed upstream in
    #1547, after the rclpy 9.1.2 we run). Every multi-threaded executor of ours is one of these.

    rclpy keeps a handler in its task list until the handler has run and yields every task that has not
    started yet at each wake-up: a handler still waiting in the thread pool is queued again and again, the
    wake-up returns at once instead of waiting, and each one scans the whole list of queued duplicates
    (thousands with 1000 goals open: a third of the process's CPU, while the callbacks waited for the GIL).

    Here a handler leaves the task list when it is queued and is queued once; a coroutine that awaits goes
    back on the list after its turn, to be resumed at a later wake-up as rclpy does. The spin thread also
    waits for the workers to start what is queued before it rebuilds the wait set. A callback's exception
    is raised from ``spin_once``, as rclpy does.
    """

    def __init__(self, num_threads: int | None = None, *, context=None) -> None:
        super().__init__(num_threads, context=context)
        self._queued: set[Task] = set()
        self._started = threading.Condition(self._tasks_lock)
        self._ended: deque[Task] = deque()

    @property
    def queued(self) -> int:
        """Handlers submitted to the thread pool that have not started yet (tests check the pool was saturated)."""
        return len(self._queued)

    def _run(self, task: Task, entity, node) -> None:
        with self._started:
            self._queued.discard(task)
            self._started.notify_all()
        if self._is_shutdown:  # queued before shutdown, whose guard condition the handler would trigger
            task.cancel()
            return
        task()
        if task.done():
            self._ended.append(task)
        elif not task.cancelled():  # a coroutine awaiting something: resumed at a later wake-up, as rclpy does
            with self._tasks_lock:
                self._tasks.append((task, entity, node))

    def _spin_once_impl(self, timeout_sec=None, wait_condition: Callable[[], bool] = lambda: False) -> None:
        # Hand the GIL to the workers until they have started what is queued: each wake-up rebuilds the whole
        # wait set, and a spin thread that wakes for every trigger starves the callbacks it dispatches.
        with self._started:
            self._started.wait_for(lambda: not self._queued, timeout=0.05)
        try:
            task, entity, node = self.wait_for_ready_callbacks(timeout_sec, None, wait_condition)
        except (ExternalShutdownException, ShutdownException, TimeoutException, ConditionReachedException):
            pass
        else:
            with self._tasks_lock:
                # The wake-up's snapshot of the task list may still hold a task that is already queued.
                fresh = task not in self._queued
                if fresh:
                    self._queued.add(task)
                    self._tasks = [t for t in self._tasks if t[0] is not task]
            if fresh:
                self._executor.submit(self._run, task, entity, node)
        for task in self._take_ended():
            if self._is_shutdown:  # shutdown destroys the guard condition that in-flight handlers still trigger
                self._teardown_error(task)
            else:
                task.result()  # raises what the callback raised

    def _take_ended(self) -> Iterator[Task]:
        while True:  # shutdown() may drain it from another thread while this one still spins
            try:
                yield self._ended.popleft()
            except IndexError:
                return

    def shutdown(self, timeout_sec: float | None = None, *, wait_for_threads: bool = True) -> bool:
        done = super().shutdown(timeout_sec, wait_for_threads=wait_for_threads)
        for task in self._take_ended():  # ended after the last spin, e.g. cut short by the teardown itself
            self._teardown_error(task)
        return done

    @staticmethod
    def _teardown_error(task: Task) -> None:
        if (e := task.exception()) is not None:
            rclpy.logging.get_logger("timelyllm.spin").warning(f"a callback raised during shutdown: {e!r}")


def spin_until(ex: Executor, stop: Callable[[], bool] = lambda: False, *,
               on_error: Callable[[str], None] | None = None, period_s: float = 0.2) -> None:
    """Spin ``ex`` until ``stop()``, the executor's shutdown or its context's.

    rclpy's ``spin()`` re-raises an exception of any one callback and returns: every node of the executor
    then stops answering (a planner that silently drops all goals). Here the traceback goes to ``on_error``
    (default: the log) and the executor goes on serving the other callbacks.
    """
    log = on_error or rclpy.logging.get_logger("timelyllm.spin").error
    # rclpy's own spin() reads the same private flag: spin_once after shutdown returns at once.
    while not stop() and ex.context.ok() and not getattr(ex, "_is_shutdown", False):
        try:
            ex.spin_once(timeout_sec=period_s)  # bounded waits: ``stop`` is seen within period_s
        except ExternalShutdownException:
            return
        except Exception:  # noqa: BLE001 - one broken callback must not stop the others
            log(f"a callback raised (the executor goes on):\n{traceback.format_exc()}")


class Spinner(threading.Thread):
    """A daemon thread spinning ``ex`` with :func:`spin_until`; ``errors`` keeps the last tracebacks.

    Stop it before ``ex.shutdown()``: shutdown destroys the executor's guard condition, which handlers
    already handed to its thread pool still trigger (rclpy's own executor raises that into the next
    spin_once; a PooledExecutor logs it once shutdown has begun)."""

    def __init__(self, ex: Executor, name: str = "timelyllm-spin", max_errors: int = 100) -> None:
        super().__init__(name=name, daemon=True)
        self.ex = ex
        self.errors: deque[str] = deque(maxlen=max_errors)
        self._stop_event = threading.Event()
        self._log = rclpy.logging.get_logger(f"timelyllm.{name}")

    def _record(self, text: str) -> None:
        self.errors.append(text)
        self._log.error(text)

    def run(self) -> None:
        spin_until(self.ex, self._stop_event.is_set, on_error=self._record)

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout)


def run_nodes(build: Callable[[], Sequence[Node]], args: list[str] | None = None, *, num_threads: int = 1,
              before_destroy: Callable[[Sequence[Node]], None] | None = None) -> int:
    """rclpy.init, build the nodes, spin them until SIGINT / SIGTERM / shutdown, then tear everything down.

    ``before_destroy`` runs first on the way out, while the context is still valid, so that it can still
    answer open goals and publish final results. That is why rclpy's own signal handlers are off here: they
    shut the context down *before* our code runs, and every last publish would then fail. A node executable's
    ``main``: once it returns, the process ignores SIGINT and SIGTERM (it is exiting; see the end).
    """
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    main = threading.current_thread() is threading.main_thread()
    if main:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    nodes: Sequence[Node] = ()
    ex = SingleThreadedExecutor() if num_threads <= 1 else PooledExecutor(num_threads=num_threads)
    try:
        nodes = build()
        for n in nodes:
            ex.add_node(n)
        spin_until(ex, stop.is_set)  # a signal is seen within 0.2 s
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if before_destroy is not None and nodes:
            before_destroy(nodes)
            # What before_destroy queued on the executor (e.g. final action results) still goes out.
            end = time.monotonic() + 2.0
            while rclpy.ok() and time.monotonic() < end:
                ex.spin_once(timeout_sec=0.05)
        ex.shutdown(timeout_sec=5)
        for n in reversed(nodes):
            n.destroy_node()
        rclpy.try_shutdown()
        if main:
            # Ctrl-C reaches every process of the terminal's group and `ros2 launch` then sends its own SIGINT:
            # one arriving while the interpreter exits (which restores the default handlers, not an ignore)
            # would kill the finished process by signal ("process has died ... exit code -2").
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
    return 0


def destroy_entities(node: Node, entities: Sequence[Any]) -> None:
    """Destroy a node's action servers, services, subscriptions and timers, each apart: one half-built entity that
    fails to close must not keep the rest alive (it is logged)."""
    for ent in entities:
        try:
            if isinstance(ent, ActionServer):
                ent.destroy()
            elif isinstance(ent, Subscription):
                node.destroy_subscription(ent)
            elif isinstance(ent, Timer):
                node.destroy_timer(ent)
            elif isinstance(ent, Service):
                node.destroy_service(ent)
            else:
                raise TypeError(f"unknown entity {ent!r}")
        except Exception as e:  # noqa: BLE001
            node.get_logger().warning(f"closing {ent!r}: {e!r}")


def ros_args_without_node_rename(argv: list[str]) -> list[str]:
    """The process's ROS arguments for a second node of the process, without a rename of the node.

    ``ros2 launch`` starts a process as its node with ``-r __node:=<name>``, which rcl applies to every node of
    the process: a second node (the planner's scheduler) would be renamed too and miss its parameters. So it
    ignores the global arguments and takes these instead."""
    out: list[str] = []
    ros = False
    it = iter(argv)
    for a in it:
        if a == "--ros-args":
            ros = True
            continue
        if a == "--":
            ros = False
            continue
        if not ros:
            continue
        if a in ("-r", "--remap"):
            rule = next(it, "")
            if rule.split(":=")[0].split(":")[-1] not in ("__node", "__name"):
                out += [a, rule]
            continue
        out.append(a)
    return ["--ros-args", *out] if out else []
