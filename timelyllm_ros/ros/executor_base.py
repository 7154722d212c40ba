"""What every robot executor node shares: segment queue, SegmentDone, preemption, emergency stop.

One node per robot, in the robot's namespace (``/<robot_id>/...``):

* subscribes ``/<robot_id>/plan_segments`` (planner_node.segment_topic, RELIABLE) and runs the
  segments of one task in order in a worker thread (never in a callback);
* publishes ``/segment_done`` with the real start and finish wall times; a refused or failed
  segment is reported with ``success=False`` and the reason, and the task's later segments are
  reported failed too (the planner ends the task at the first failure);
* preemption: segment 0 of a *different* task while a task is still active (executing, or waiting
  for its next segment) means "urgent task": the robot stops at once (hover / hold), the running
  segment is reported failed with ``preempted by task <id>``, and the new task starts;
* ``/<robot_id>/emergency_stop`` (std_srvs/Trigger): stops the robot at once (drone: SDK ``stop``
  then ``land``; arm: an empty trajectory), drops everything queued, reports the running and queued
  segments failed with ``emergency stop``; later segments are refused until
  ``/<robot_id>/reset_emergency`` is called.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Protocol

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.node import Node
from std_srvs.srv import Trigger

from timelyllm_ros.executors.base import ExecutionError, Interrupted, RefusedError, StopSignal
from timelyllm_ros.msg import PlanSegment, SegmentDone
from timelyllm_ros.ros.convert import time_msg
from timelyllm_ros.ros.planner_node import RELIABLE, segment_topic

EMERGENCY = "emergency stop"


class SegmentRunner(Protocol):
    stop: StopSignal

    def begin_task(self, task_id: str) -> None: ...

    def run(self, text: str) -> str: ...  # what ran, for the log

    def halt(self) -> None: ...  # from another thread: stop moving now, stay (hover / hold)

    def emergency(self) -> str: ...  # from another thread: stop and make safe; says what was done


class RobotExecutorNode(Node):
    """Base class; subclasses build ``self.runner`` and call :meth:`start_executor`."""

    def __init__(self, robot_id: str, node_name: str, **kw) -> None:
        super().__init__(node_name, namespace=f"/{robot_id}", **kw)
        self.robot_id = robot_id
        self.runner: SegmentRunner | None = None
        self._cv = threading.Condition()
        self._queue: deque[PlanSegment] = deque()
        self._task: str | None = None  # task whose segments are accepted now
        self._task_open = False  # its final segment has not been executed yet
        self._ended: dict[str, str] = {}  # task id -> why its later segments are refused
        self._running: PlanSegment | None = None
        self._estopped = False
        self._closing = False
        self.history: list[tuple[str, int, bool, str]] = []  # (task, index, ok, error), for tests and logs
        self._done_pub = self.create_publisher(SegmentDone, "/segment_done", RELIABLE)

    def start_executor(self) -> None:
        group = ReentrantCallbackGroup()  # the emergency service must run while segments arrive
        self.create_subscription(PlanSegment, segment_topic(self.robot_id), self._received, RELIABLE,
                                 callback_group=MutuallyExclusiveCallbackGroup())
        self.create_service(Trigger, f"/{self.robot_id}/emergency_stop", self._emergency_srv, callback_group=group)
        self.create_service(Trigger, f"/{self.robot_id}/reset_emergency", self._reset_srv, callback_group=group)
        self._worker = threading.Thread(target=self._work, name=f"exec-{self.robot_id}", daemon=True)
        self._worker.start()

    # -- incoming segments (callback thread) ---------------------------------------
    def _received(self, msg: PlanSegment) -> None:
        with self._cv:
            if msg.robot_id and msg.robot_id != self.robot_id:
                self._report(msg, time.time(), time.time(), False, f"segment for {msg.robot_id!r} sent to "
                             f"{self.robot_id!r}")
                return
            if self._estopped:
                self._refuse(msg, f"{EMERGENCY} active on {self.robot_id} (call /{self.robot_id}/reset_emergency)")
                return
            if msg.task_id in self._ended:
                self._refuse(msg, self._ended[msg.task_id])
                return
            if msg.task_id == self._task:
                self._queue.append(msg)
            elif msg.segment_index == 0:
                if self._task is not None and self._task_open:
                    self._preempt(msg.task_id)
                self._task, self._task_open = msg.task_id, True
                self._queue.append(msg)
            else:
                self._refuse(msg, f"segment {msg.segment_index} of task {msg.task_id!r}, whose segment 0 this "
                             "robot never started")
                return
            self._cv.notify_all()

    def _preempt(self, new_task: str) -> None:
        old = self._task
        reason = f"preempted by task {new_task}"
        self.get_logger().warning(f"{self.robot_id}: task {old} {reason}: stopping")
        self._ended[old] = reason
        for m in self._queue:
            self._report(m, time.time(), time.time(), False, reason)
        self._queue.clear()
        if self._running is not None and self.runner is not None:
            self.runner.stop.set(reason)
            self.runner.halt()

    def _refuse(self, msg: PlanSegment, reason: str) -> None:
        self.get_logger().warning(f"{self.robot_id}: refused {msg.task_id}[{msg.segment_index}]: {reason}")
        now = time.time()
        self._report(msg, now, now, False, reason)

    # -- worker ---------------------------------------------------------------------
    def _work(self) -> None:
        current: str | None = None
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait(0.5)
                if self._closing:
                    return
                msg = self._queue.popleft()
                self._running = msg
                if self.runner is not None:
                    self.runner.stop.clear()
            if msg.task_id != current:
                current = msg.task_id
                self.runner.begin_task(msg.task_id)
            start = time.time()
            ok, err = True, ""
            try:
                summary = self.runner.run(msg.text)
                self.get_logger().info(f"{self.robot_id}: {msg.task_id}[{msg.segment_index}] {msg.text!r} -> "
                                       f"{summary} in {time.time() - start:.2f} s")
            except Interrupted as e:
                ok, err = False, str(e)
            except RefusedError as e:
                ok, err = False, f"refused: {e}"
                self.get_logger().warning(f"{self.robot_id}: refused {msg.task_id}[{msg.segment_index}] "
                                          f"{msg.text!r}: {e}")
            except ExecutionError as e:
                ok, err = False, str(e)
            except Exception as e:  # noqa: BLE001 - a bug must still end the task with a reason
                ok, err = False, f"executor error: {e!r}"
            finish = time.time()
            with self._cv:
                self._running = None
                if not ok:
                    if self.runner.stop.is_set() and self.runner.stop.reason:
                        err = self.runner.stop.reason  # the stop, not its side effect, is the reason
                    self._ended.setdefault(msg.task_id, f"task ended at segment {msg.segment_index}: {err}")
                    if self._task == msg.task_id:
                        self._task_open = False
                        for m in self._queue:
                            self._report(m, finish, finish, False, self._ended[msg.task_id])
                        self._queue.clear()
                elif msg.is_final and self._task == msg.task_id:
                    self._task_open = False
                self._report(msg, start, finish, ok, err)
                self._cv.notify_all()
            if not ok:
                self.get_logger().warning(f"{self.robot_id}: {msg.task_id}[{msg.segment_index}] failed: {err}")

    def _report(self, msg: PlanSegment, start: float, finish: float, ok: bool, error: str) -> None:
        self.history.append((msg.task_id, msg.segment_index, ok, error))
        self._done_pub.publish(SegmentDone(task_id=msg.task_id, robot_id=self.robot_id,
                                           segment_index=msg.segment_index, start=time_msg(start),
                                           finish=time_msg(finish), success=ok, error=error))

    # -- safety services ------------------------------------------------------------------
    def emergency_stop(self) -> str:
        with self._cv:
            self._estopped = True
            reason = f"{EMERGENCY} (/{self.robot_id}/emergency_stop)"
            if self._task is not None and self._task_open:
                self._ended[self._task] = reason
                self._task_open = False
            for m in self._queue:
                self._report(m, time.time(), time.time(), False, reason)
            self._queue.clear()
            self.runner.stop.set(reason)
        done = self.runner.emergency()  # outside the lock: it waits for the motion to end
        self.get_logger().error(f"{self.robot_id}: {EMERGENCY}: {done}")
        return done

    def _emergency_srv(self, _req: Trigger.Request, resp: Trigger.Response) -> Trigger.Response:
        try:
            resp.message = f"{self.robot_id}: {EMERGENCY}: {self.emergency_stop()}"
            resp.success = True
        except Exception as e:  # noqa: BLE001 - the caller must learn that the stop may not have worked
            resp.success, resp.message = False, f"{self.robot_id}: {EMERGENCY} FAILED: {e}"
        return resp

    def _reset_srv(self, _req: Trigger.Request, resp: Trigger.Response) -> Trigger.Response:
        with self._cv:
            was = self._estopped
            self._estopped = False
        resp.success, resp.message = True, f"{self.robot_id}: {'emergency stop cleared' if was else 'was not stopped'}"
        return resp

    def destroy_node(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if self.runner is not None:
            self.runner.stop.set("executor shutting down")
        if hasattr(self, "_worker"):
            self._worker.join(timeout=5)
        super().destroy_node()
