"""What every robot executor node shares: segment queue, SegmentDone, preemption, emergency stop.

One node per robot, in the robot's namespace (``/<robot_id>/...``). The delivery contract's robot side (the
segment subscription, writer and fleet-key checks, acks, heartbeats, reports) is ``ros/robot_endpoint.py``'s
:class:`~timelyllm_ros.ros.robot_endpoint.RobotEndpoint`, the simulated fleet's too; what is here is how a
segment runs:

* subscribes ``/<robot_id>/plan_segments`` (topics.segment_topic, RELIABLE) and runs the
  segments of one task in order in a worker thread (never in a callback);
* delivery contract: acknowledges every received copy on ``/segment_acks`` (SegmentAck, QoS
  REPORTS) -- duplicates, end markers and refused segments too, since the planner re-sends until
  acknowledged. The robot's :class:`~timelyllm_ros.transport.session.RobotSession` (the simulated
  fleet's too) drops duplicates by (task_id, segment_index), releases a task's segments strictly by
  index, holds early ones, and refuses held ones whose gap did not fill within the
  ``reorder_timeout_s`` parameter (default 30 s, the planner's delivery_timeout_s; checked by a
  timer). An end marker (is_final, empty
  text) closes the task once every earlier segment has run; it runs nothing and is reported only
  when the runner refuses to end the plan there (``end_plan``: e.g. MiniSpec blocks still open),
  with ``success=False`` and the reason;
* end of plan: the segment flagged ``is_final`` runs with ``final=True``, so the runner refuses it
  (nothing runs) when the plan would end incomplete;
* only the planner it serves: a segment counts only if its writer belongs to the node named by the
  ``planner_node`` parameter (default ``/planner``; '' = any node), checked by the publisher GID of each
  message against the ROS graph. Anything else (a rogue node publishing on the robot's topic) is neither
  run nor acknowledged, counted on /diagnostics and logged once per writer. A segment whose writer the graph
  does not know yet is not acknowledged either: the planner re-sends it (delivery contract). Without DDS
  security a node can take the planner's name; README "Threat model";
* heartbeat: while a segment runs, its ack is re-sent with ``running=true`` every ``heartbeat_period_s``
  (parameter, default 1 s; 0 = off). The planner calls a robot silent only when its heartbeats stop, so a
  skill slower than the execution-time model predicts (a first scan on a new robot) is not a failure;
* publishes ``/segment_done`` with the real start and finish wall times; a refused or failed
  segment is reported with ``success=False`` and the reason, and the task's later segments are
  reported failed too (the planner ends the task at the first failure). A segment that never
  reached the runner (refused on receipt, or dropped from the queue) carries a zero ``start``: it never
  started, and no utility is credited for it;
* preemption: segment 0 of a *different* task while a task is still active (executing, or waiting
  for its next segment) means the planner gave the robot to a more urgent task (it sends a busy
  robot another task's segment 0 only then; scheduler "one task per robot"): the robot stops at
  once (hover / hold), the running segment is reported failed with ``preempted by task <id>``, and
  the new task starts;
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

from timelyllm_ros.msg import PlanSegment
from timelyllm_ros.robots.base import ExecutionError, Interrupted, RefusedError, StopSignal
from timelyllm_ros.ros.diagnostics import ExecutorState, RobotLink, Status, attach_executor_diagnostics, executor_status
from timelyllm_ros.ros.params import declare
from timelyllm_ros.ros.robot_endpoint import RobotEndpoint
from timelyllm_ros.ros.topics import (
    DEFAULT_HEARTBEAT_PERIOD_S,
    PLANNER_NODE,
    emergency_stop_service,
    is_end_marker,
    reset_emergency_service,
)
from timelyllm_ros.transport.inbox import DEFAULT_REORDER_TIMEOUT_S
from timelyllm_ros.transport.session import Refusal, RobotSession

EMERGENCY = "emergency stop"


class SegmentRunner(Protocol):
    stop: StopSignal

    def begin_task(self, task_id: str) -> None: ...

    def run(self, text: str, *, final: bool = False) -> str: ...  # what ran, for the log; final: the plan ends here

    def end_plan(self) -> None: ...  # an end marker: RefusedError when the plan may not end after what ran

    def halt(self) -> None: ...  # from another thread: stop moving now, stay (hover / hold)

    def emergency(self) -> str: ...  # from another thread: stop and make safe; says what was done


class RobotExecutorNode(Node):
    """Base class; subclasses build ``self.runner`` and call :meth:`start_executor`."""

    def __init__(self, robot_id: str, node_name: str, **kw) -> None:
        super().__init__(node_name, namespace=f"/{robot_id}", **kw)
        self.robot_id = robot_id
        self.reorder_timeout_s = float(declare(
            self, "reorder_timeout_s", float(DEFAULT_REORDER_TIMEOUT_S),
            "seconds an early segment waits for the missing ones before it, then it is refused "
            "(default: the planner's delivery_timeout_s)", read_only=True, above=0.0))
        self.heartbeat_period_s = float(declare(
            self, "heartbeat_period_s", DEFAULT_HEARTBEAT_PERIOD_S, "while a segment runs, its ack is re-sent with "
            "running=true this often, so the planner tells a slow skill from a dead robot (0 = off; keep it well "
            "below the planner's robot_timeout_s)", read_only=True, min=0.0))
        self.planner_node = str(declare(
            self, "planner_node", PLANNER_NODE, "fully qualified name of the planner node whose segments this robot "
            "runs ('' = any node on the domain)", read_only=True))
        # the delivery contract's robot side (writer check, fleet key, acks, heartbeats, reports): the simulated
        # fleet's own
        self.endpoint = RobotEndpoint(self, self.planner_node)
        self.runner: SegmentRunner | None = None
        self._cv = threading.Condition()
        # the robot half of delivery (dedup, order, hold, one task, preemption), shared with the simulated fleet
        self.session = RobotSession(self.reorder_timeout_s)
        self._running: PlanSegment | None = None
        self._estopped = False
        self._closing = False
        self.history: deque[tuple[str, int, bool, str]] = deque(maxlen=10000)  # (task, index, ok, error)
        self.acks: deque[tuple[str, int]] = deque(maxlen=10000)  # (task, index) acknowledged, for tests and logs
        self.diagnostics = attach_executor_diagnostics(self)  # /diagnostics: link, battery, state, e-stop

    def start_executor(self) -> None:
        group = ReentrantCallbackGroup()  # the emergency service must run while segments arrive
        segments = MutuallyExclusiveCallbackGroup()  # arrivals and hold expiry, one at a time
        self.endpoint.subscribe(self.robot_id, self._received, self.acks, callback_group=segments)
        self.create_timer(min(0.1, self.reorder_timeout_s / 4), self._expire, callback_group=segments)
        self.endpoint.start_heartbeats(self.heartbeat_period_s, self._running_now,
                                       callback_group=MutuallyExclusiveCallbackGroup())
        self.create_service(Trigger, emergency_stop_service(self.robot_id), self._emergency_srv, callback_group=group)
        self.create_service(Trigger, reset_emergency_service(self.robot_id), self._reset_srv, callback_group=group)
        self._worker = threading.Thread(target=self._work, name=f"exec-{self.robot_id}", daemon=True)
        self._worker.start()

    # -- incoming segments (callback thread) ---------------------------------------
    @property
    def refused_segments(self) -> int:
        """Segments refused by the gate so far: written by another node than planner_node, or without a valid fleet
        key tag and fresh counter (/diagnostics)."""
        return self.endpoint.gate.refused

    def _received(self, msg: PlanSegment, now: float) -> None:
        """A copy the gate admitted (the endpoint acknowledges it after)."""
        with self._cv:
            self._receive(msg, now)
            self._cv.notify_all()

    def _receive(self, msg: PlanSegment, now: float) -> None:
        task, index = msg.task_id, msg.segment_index
        refuse = ""
        if msg.robot_id and msg.robot_id != self.robot_id:
            refuse = f"segment for {msg.robot_id!r} sent to {self.robot_id!r}"
        elif self._estopped:
            refuse = f"{EMERGENCY} active on {self.robot_id} (call /{self.robot_id}/reset_emergency)"
        arrival = self.endpoint.receive(self.robot_id, self.session, msg, now, refuse)
        if arrival.duplicate:
            self.get_logger().debug(f"{self.robot_id}: duplicate {task}[{index}] dropped")
            return
        if arrival.preempted:
            self._stop_running(arrival.preempted)
        self._refuse_all(arrival.refused)

    def _expire(self) -> None:
        with self._cv:
            self._refuse_all(self.session.expire(time.time()))

    def _stop_running(self, reason: str) -> None:
        """The active task was preempted (caller holds the lock): the segment running now stops, the robot stays."""
        self.get_logger().warning(f"{self.robot_id}: {reason}: stopping")
        if self._running is not None and self.runner is not None:
            self.runner.stop.set(reason)
            self.runner.halt()

    def _refuse_all(self, refusals: list[Refusal]) -> None:
        for r in refusals:
            self._refuse(r.payload, r.reason)

    def _refuse(self, msg: PlanSegment, reason: str) -> None:
        if is_end_marker(msg.text, msg.is_final):
            self.get_logger().info(f"{self.robot_id}: end marker {msg.task_id}[{msg.segment_index}] ignored: {reason}")
            return
        self.get_logger().warning(f"{self.robot_id}: refused {msg.task_id}[{msg.segment_index}]: {reason}")
        self._report(msg, None, time.time(), False, reason)

    # -- worker ---------------------------------------------------------------------
    def _work(self) -> None:
        current: str | None = None
        while True:
            with self._cv:
                while not self.session.queue and not self._closing:
                    self._cv.wait(0.5)
                if self._closing:
                    return
                msg = self.session.next()
                if is_end_marker(msg.text, msg.is_final):  # every earlier segment has run: the plan is over
                    self._end_plan(msg, current)
                    self._cv.notify_all()
                    continue
                self._running = msg
                if self.runner is not None:
                    self.runner.stop.clear()
            if msg.task_id != current:
                current = msg.task_id
                self.runner.begin_task(msg.task_id)
            start = time.time()
            ok, err = True, ""
            try:
                summary = self.runner.run(msg.text, final=msg.is_final)
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
                if not ok and self.runner.stop.is_set() and self.runner.stop.reason:
                    err = self.runner.stop.reason  # the stop, not its side effect, is the reason
                self._refuse_all(self.session.ran(msg.task_id, msg.segment_index, msg.is_final, ok, err))
                self._report(msg, start, finish, ok, err)
                self._cv.notify_all()
            if not ok:
                self.get_logger().warning(f"{self.robot_id}: {msg.task_id}[{msg.segment_index}] failed: {err}")

    def _end_plan(self, marker: PlanSegment, current: str | None) -> None:
        """An end marker reached the worker (caller holds the lock; ``end_plan`` is a check, no motion): close
        the task, and report the marker failed when the runner says the plan may not end after what ran."""
        self.session.reached_end(marker.task_id)
        if marker.task_id != current or self.runner is None:
            return  # nothing of the task ran here (its segment 0 always runs first): nothing to check
        start = time.time()
        try:
            self.runner.end_plan()
            return
        except RefusedError as e:
            err = f"refused end of plan: {e}"
        except Exception as e:  # noqa: BLE001 - a bug must still say why the plan did not end cleanly
            err = f"executor error at end of plan: {e!r}"
        self.get_logger().warning(f"{self.robot_id}: {marker.task_id}[{marker.segment_index}] (end of plan): {err}")
        self._report(marker, start, time.time(), False, err)

    def _report(self, msg: PlanSegment, start: float | None, finish: float, ok: bool, error: str) -> None:
        """``start`` None: the segment never started (a zero stamp on the wire)."""
        self.history.append((msg.task_id, msg.segment_index, ok, error))
        self.endpoint.report(self.robot_id, self.session, msg.task_id, msg.segment_index, start, finish, ok, error)

    def _running_now(self) -> list[tuple[str, str, int]]:
        """The segment running now, for the endpoint's heartbeat."""
        with self._cv:
            run = self._running
        return [] if run is None else [(self.robot_id, run.task_id, run.segment_index)]

    # -- diagnostics --------------------------------------------------------------------
    def diagnostic_status(self) -> Status:
        """This robot's status on /diagnostics (ros/diagnostics.py): state, emergency stop, and the link and
        battery of :meth:`robot_link`. A backend may extend it: ``st = super().diagnostic_status(); st.add(..)``."""
        with self._cv:
            run, last = self._running, self.history[-1] if self.history else None
            ses = self.session
            state = ExecutorState(estopped=self._estopped, task=ses.task if ses.task_open else None,
                                  running=(run.task_id, run.segment_index) if run is not None else None,
                                  queued=len(ses.queue), held=ses.inbox.held_count(), last=last,
                                  refused_segments=self.refused_segments,
                                  refused_recent=self.endpoint.gate.refused_recent(60.0))
        return executor_status(self, state, self.robot_link())

    def robot_link(self) -> RobotLink | None:
        """The link to the robot as the backend knows it (connected, last contact, battery); None: unknown."""
        return None

    # -- safety services ------------------------------------------------------------------
    def emergency_stop(self) -> str:
        with self._cv:
            self._estopped = True
            reason = f"{EMERGENCY} (/{self.robot_id}/emergency_stop)"
            self._refuse_all(self.session.end_all(reason))
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
