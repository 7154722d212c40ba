"""A PlanTask client a robot can trust, and the ``plan_client`` command built on it.

    ros2 run timelyllm_ros plan_client --robot-id drone_0 --task "Task: find the cat" --urgency urgent
    ros2 run timelyllm_ros plan_client ... --ros-args -r __ns:=/fleet_a   # the fleet launched with namespace:=fleet_a

:class:`PlanClient` wraps the ``/plan_task`` action with the planner's delivery contract:

* every goal gets a ``task_id`` (a uuid when the caller left it empty) and a send ``stamp`` before it
  leaves, so a retry is the *same* request: the planner joins it to the open task (or answers a finished
  task's result at once) and plans the task once;
* a goal response that does not come within ``goal_response_timeout`` is re-sent, at most
  ``max_attempts`` times in all, with exponential backoff; a goal answered "not accepted" is an explicit
  failure;
* every segment reaches ``on_segment`` exactly once and in index order: from feedback as it arrives
  (held back while an earlier index is missing) and, when the result comes, whatever feedback missed from
  the result's ``segments`` list (rclpy drops the feedback of a goal whose result arrives at the same time);
* when the action connection breaks (the server disappears, a new server instance appears, a result
  request fails or returns an unknown goal, or nothing happens for ``stale_after`` seconds and the planner
  says the task is over), the client falls back to ``/plan_results`` (RELIABLE + TRANSIENT_LOCAL, filtered
  by task_id), polls ``/get_plan_result`` (whose answer for a finished task carries every segment) and keeps
  streaming segments from the fleet-wide ``/plan_segments``, until a terminal state or the goal's timeout.
  Once ``/get_plan_result`` says the (restarted) planner has the task open (or publishes its result while
  segments are missing), the client re-sends the same goal once: it joins the task, so the rest of the plan
  comes as feedback and the whole segment list with the result (never a second plan: a task the planner does
  not hold is not re-sent);
* nothing blocks underneath: futures, callbacks and one timer per client, so one node can keep hundreds
  of goals open. :meth:`PlanClient.send` is the asynchronous API for a node that already spins in an
  executor; :meth:`PlanClient.plan` the blocking one for scripts (it spins the node itself).

Example (script)::

    rclpy.init()
    node = rclpy.create_node("my_robot")
    planner = PlanClient(node)
    result = planner.plan(PlanTask.Goal(robot_id="drone_0", robot_type="drone", task="...",
                                        tuf=TimeUtility(level="urgent")),
                          timeout=60, on_segment=lambda seg: print(seg.segment_index, seg.text))

Example (node spinning in an executor)::

    handle = planner.send(goal, on_segment=execute_segment, on_done=lambda h: log(h.status_name))

The handle, the goal's bookkeeping and the client-side errors are in :mod:`timelyllm_ros.ros.plan_handle`
(importable from here too).
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import rclpy
from action_msgs.msg import GoalStatus
from rclpy.action import ActionClient
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.utilities import remove_ros_args

from timelyllm_ros.action import PlanTask
from timelyllm_ros.domain.types import TaskStatus
from timelyllm_ros.msg import PlanResult, PlanSegment
from timelyllm_ros.planner.hygiene import check_text
from timelyllm_ros.ros import topics
from timelyllm_ros.ros.actions import ActionServerWatch, SafeActionClient
from timelyllm_ros.ros.convert import (
    duration_s,
    feedback_msg,
    goal_msg,
    lookup_state,
    result_from_plan_result,
    result_request,
    status_from_code,
    status_name,
    time_msg,
    tuf_msg,
)
from timelyllm_ros.ros.plan_handle import (  # the errors and the handle are part of this module's API too
    ERR_CLOSED,
    ERR_LOST,
    ERR_NO_RESPONSE,
    ERR_NO_SERVER,
    ERR_NOT_ACCEPTED,
    ERR_TIMEOUT,
    PHASE_ACCEPTED,
    PHASE_DONE,
    PHASE_FALLBACK,
    PHASE_SENDING,
    PHASE_WAIT_SERVER,
    Attempt,
    PlanClientError,
    PlanHandle,
    PlanTimeoutError,
)
from timelyllm_ros.srv import GetPlanResult

__all__ = [
    "ERR_CLOSED", "ERR_LOST", "ERR_NO_RESPONSE", "ERR_NO_SERVER", "ERR_NOT_ACCEPTED", "ERR_TIMEOUT", "SOURCE_ACTION",
    "SOURCE_RESULTS_TOPIC", "SOURCE_SERVICE", "PlanClient", "PlanClientError", "PlanHandle", "PlanTimeoutError",
    "check_goal", "main", "send_task",
]

# Where a terminal result came from.
SOURCE_ACTION = "action"
SOURCE_RESULTS_TOPIC = "plan_results"
SOURCE_SERVICE = "get_plan_result"


def check_goal(goal: PlanTask.Goal) -> None:
    """ValueError naming the field, the character and its position for a goal the planner would refuse for its
    text, or could not see as sent: rclpy cuts a string at its first NUL before it leaves this process, so a task
    with NUL would arrive cut short and be planned as if nothing were wrong. Every client of ours checks here."""
    check_text("task_id", goal.task_id, single_line=True)
    check_text("robot_id", goal.robot_id, single_line=True)
    check_text("robot_type", goal.robot_type, single_line=True)
    check_text("task", goal.task)


class PlanClient:
    """PlanTask goals with retries, exactly-once in-order segments and a result fallback (module doc)."""

    # Relative default names: the planner of the node's own namespace (interfaces.in_fleet).
    def __init__(self, node: Node, action_name: str = topics.in_fleet(topics.PLAN_TASK_ACTION), *,
                 results_topic: str = topics.in_fleet(topics.PLAN_RESULTS),
                 result_service: str = topics.in_fleet(topics.GET_PLAN_RESULT_SERVICE),
                 segments_topic: str = topics.in_fleet(topics.ALL_SEGMENTS), action_client: ActionClient | None = None,
                 callback_group=None, server_timeout: float = 10.0, goal_response_timeout: float = 5.0,
                 max_attempts: int = 4, retry_backoff: float = 0.5, max_backoff: float = 8.0,
                 default_timeout: float = 120.0, poll_period: float = 1.0, poll_timeout: float = 3.0,
                 stale_after: float = 10.0, result_grace: float = 2.0, server_lost_grace: float = 2.0,
                 unknown_limit: int = 3, tick: float = 0.1, cancel_on_timeout: bool = True) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        for name, v in (("server_timeout", server_timeout), ("goal_response_timeout", goal_response_timeout),
                        ("default_timeout", default_timeout), ("poll_period", poll_period), ("tick", tick)):
            if not v > 0:
                raise ValueError(f"{name} must be > 0, got {v}")
        self.node = node
        self.server_timeout = float(server_timeout)
        self.goal_response_timeout = float(goal_response_timeout)
        self.max_attempts = int(max_attempts)
        self.retry_backoff, self.max_backoff = float(retry_backoff), float(max_backoff)
        self.default_timeout = float(default_timeout)
        self.poll_period, self.poll_timeout = float(poll_period), float(poll_timeout)
        self.stale_after, self.result_grace = float(stale_after), float(result_grace)
        self.server_lost_grace, self.unknown_limit = float(server_lost_grace), int(unknown_limit)
        self.cancel_on_timeout = cancel_on_timeout
        self._results_topic, self._segments_topic = results_topic, segments_topic
        self._group = callback_group or ReentrantCallbackGroup()
        self._own_action = action_client is None
        self._action = action_client or SafeActionClient(
            node, PlanTask, action_name, callback_group=self._group, goal_service_qos_profile=topics.DEEP,
            result_service_qos_profile=topics.DEEP, cancel_service_qos_profile=topics.DEEP,
            feedback_sub_qos_profile=topics.DEEP)
        self._srv = node.create_client(GetPlanResult, result_service, qos_profile=topics.DEEP,
                                       callback_group=self._group)
        self._lock = threading.RLock()
        self._open: dict[int, PlanHandle] = {}           # id(handle) -> handle, until done
        self._by_task: dict[str, list[PlanHandle]] = {}  # task_id -> open handles
        self._subs: list = []                            # fallback subscriptions, created on first need
        self._server = ActionServerWatch(node, self._action, action_name)
        self._closed = False
        self._timer = node.create_timer(tick, self._tick, callback_group=self._group,
                                        clock=Clock(clock_type=ClockType.STEADY_TIME))
        self.stats = {"attempts": 0, "retries": 0, "fallbacks": 0, "polls": 0, "rejoins": 0}

    # -- public API ----------------------------------------------------------------------------
    def wait_for_server(self, timeout: float | None = None) -> bool:
        """Block (without spinning) until the action server is discovered."""
        ok = self._action.wait_for_server(timeout_sec=self.server_timeout if timeout is None else timeout)
        self._server.update(time.monotonic())
        return ok

    def prepare(self, goal: PlanTask.Goal) -> PlanTask.Goal:
        """A copy of ``goal`` with a task_id (uuid if empty) and a send stamp (now, if zero)."""
        g = goal_msg(goal.task_id, goal.robot_id, goal.robot_type, goal.task, goal.tuf, goal.stamp)
        if not g.task_id:
            g.task_id = f"{g.robot_id[:64]}-{uuid.uuid4().hex}"
        if not (g.stamp.sec or g.stamp.nanosec):
            g.stamp = time_msg(time.time())
        return g

    def send(self, goal: PlanTask.Goal, on_segment: Callable[[PlanSegment], Any] | None = None,
             on_done: Callable[[PlanHandle], Any] | None = None, *, timeout: float | None = None) -> PlanHandle:
        """Send ``goal`` (non-blocking) and return its handle.

        ``on_segment(PlanSegment)`` gets each segment once, in index order; ``on_done(handle)`` once, at the
        end (result, or client-side error). Both run in the node's executor; keep them short.
        """
        if self._closed:
            raise RuntimeError("PlanClient is destroyed")
        check_goal(goal)
        h = PlanHandle(self, self.prepare(goal), on_segment, on_done,
                       self.default_timeout if timeout is None else float(timeout))
        with self._lock:
            self._open[id(h)] = h
            self._by_task.setdefault(h.task_id, []).append(h)
        now = time.monotonic()
        if self._server.update(now):
            with h.tracking.lock:
                if h.tracking.phase == PHASE_WAIT_SERVER:
                    self._send_attempt(h, now)
        return h

    def track(self, task_id: str, on_segment: Callable[[PlanSegment], Any] | None = None,
              on_done: Callable[[PlanHandle], Any] | None = None, *, timeout: float | None = None,
              robot_id: str = "") -> PlanHandle:
        """Follow a task sent earlier (e.g. by this robot before it restarted) by its id alone, through
        /plan_results, /get_plan_result and /plan_segments. Segments sent before this call are not seen."""
        goal = goal_msg(task_id, robot_id)
        h = PlanHandle(self, goal, on_segment, on_done, self.default_timeout if timeout is None else float(timeout))
        h.sent_wall = math.nan
        with self._lock:
            self._open[id(h)] = h
            self._by_task.setdefault(task_id, []).append(h)
        with h.tracking.lock:
            h.tracking.next = -1  # accept whatever index comes first
            self._enter_fallback(h, "tracking a task by id", time.monotonic())
        return h

    def plan(self, goal: PlanTask.Goal, timeout: float | None = None,
             on_segment: Callable[[PlanSegment], Any] | None = None, *, spin: bool | None = None) -> PlanTask.Result:
        """Send ``goal`` and block until its result; raises PlanClientError / PlanTimeoutError.

        ``spin``: spin the node here (scripts); None = unless the node is already in an executor (then another
        thread must be spinning it).
        """
        h = self.send(goal, on_segment, timeout=timeout)
        self.wait(h, spin=spin)
        return h.result_or_raise()

    def wait(self, handle: PlanHandle, *, spin: bool | None = None) -> bool:
        """Block until ``handle`` is done, spinning the node if needed (see :meth:`plan`)."""
        limit = handle.tracking.deadline + self.poll_timeout + 5.0
        ex = self.node.executor
        in_executor = ex is not None and self.node in ex.get_nodes()
        if spin is None:
            spin = not in_executor
        if not spin:
            return handle.wait(max(0.0, limit - time.monotonic()))
        own = None
        if not in_executor:
            ex = own = SingleThreadedExecutor(context=self.node.context)
            own.add_node(self.node)
        try:
            while not handle.done() and time.monotonic() < limit and self.node.context.ok():
                ex.spin_once(timeout_sec=0.05)
        finally:
            if own is not None:
                own.remove_node(self.node)
                own.shutdown(timeout_sec=1.0)
        return handle.done()

    @property
    def action_client(self) -> ActionClient:
        """The rclpy action client the goals go through (given to the constructor, or this client's own)."""
        return self._action

    def open_handles(self) -> list[PlanHandle]:
        with self._lock:
            return list(self._open.values())

    def destroy(self) -> None:
        """Stop the timer, end open handles (ERR_CLOSED) and free what this client created."""
        self._closed = True
        for h in self.open_handles():
            with h.tracking.lock:
                self._fail(h, ERR_CLOSED, "the PlanClient was destroyed")
        self.node.destroy_timer(self._timer)
        self.node.destroy_client(self._srv)
        for s in self._subs:
            self.node.destroy_subscription(s)
        self._subs.clear()
        if self._own_action:
            self._action.destroy()

    def _count(self, what: str) -> None:
        with self._lock:
            self.stats[what] += 1

    # -- sending -----------------------------------------------------------------------------------
    def _send_attempt(self, h: PlanHandle, now: float, *, rejoin: bool = False) -> None:
        att = Attempt(len(h.tracking.attempt_list) + 1, now, rejoin)
        h.tracking.attempt_list.append(att)
        if rejoin:
            h.rejoins += 1
            h.tracking.rejoined_epoch = self._server.epoch
            self._count("rejoins")
        else:
            h.attempts += 1
            self._count("attempts")
            if h.attempts > 1:
                self._count("retries")
            h.tracking.phase = PHASE_SENDING
            h.tracking.next_send_at = None
            h.tracking.response_deadline = now + self.goal_response_timeout
        try:
            att.future = self._action.send_goal_async(h.goal, feedback_callback=lambda m, h=h: self._on_feedback(h, m))
        except Exception as e:  # noqa: BLE001 - e.g. the context is shutting down
            att.broken = True
            if not rejoin:
                self._fail(h, ERR_NO_RESPONSE, f"task {h.task_id}: could not send the goal: {e!r}")
            return
        att.future.add_done_callback(lambda f, h=h, att=att: self._on_goal_response(h, att, f))

    def _on_goal_response(self, h: PlanHandle, att: Attempt, fut) -> None:
        try:
            gh = fut.result()
        except Exception:  # noqa: BLE001
            gh = None
        with h.tracking.lock:
            if gh is None:
                return
            att.responded = True
            att.goal_handle = gh
            h.responses += 1
            if h.tracking.phase == PHASE_DONE:
                return
            if not gh.accepted:
                if not h.accepted and not att.rejoin:
                    self._fail(h, ERR_NOT_ACCEPTED, f"task {h.task_id}: the action server did not accept the goal")
                return
            first = not h.accepted
            h.accepted = True
            h.tracking.last_progress = time.monotonic()
            if att.rejoin:
                pass
            elif first:
                h.tracking.epoch = self._server.epoch
                h.tracking.response_deadline = math.inf
                h.tracking.next_send_at = None
                if h.tracking.phase == PHASE_SENDING:
                    h.tracking.phase = PHASE_ACCEPTED
                h.tracking.probe_due = h.tracking.last_progress + self.stale_after
            cancel = h.tracking.cancel_requested
            try:
                att.result_future = gh.get_result_async()
            except Exception as e:  # noqa: BLE001 - the action connection is gone
                att.broken = True
                self._action_broken(h, f"result request failed: {e!r}")
                return
            att.result_future.add_done_callback(lambda f, h=h, att=att: self._on_result_response(h, att, f))
        if cancel:
            gh.cancel_goal_async()

    def _on_result_response(self, h: PlanHandle, att: Attempt, fut) -> None:
        try:
            resp = fut.result()
        except Exception:  # noqa: BLE001
            resp = None
        with h.tracking.lock:
            if h.tracking.phase == PHASE_DONE:
                return
            if resp is None or resp.status == GoalStatus.STATUS_UNKNOWN:
                att.broken = True
                self._action_broken(h, "the action server does not know the goal (restarted?)" if resp is not None
                                    else "result request failed")
                return
            if att.rejoin and status_from_code(resp.result.status) is TaskStatus.INVALID:
                # a rejoin is only sent for a task the planner knows: a refusal says nothing about the task
                att.broken = True
                self.node.get_logger().warning(f"task {h.task_id}: re-sent goal refused ({resp.result.message}); "
                                               "following the task through /get_plan_result")
                return
            self._finish(h, resp.result, SOURCE_ACTION)

    def _action_broken(self, h: PlanHandle, why: str) -> None:
        """One attempt's action connection broke: fall back unless another attempt may still answer."""
        if any(a.goal_handle is not None and a.goal_handle.accepted and not a.broken and not a.rejoin
               for a in h.tracking.attempt_list):
            return
        self._enter_fallback(h, why, time.monotonic())

    # -- segments ------------------------------------------------------------------------------------
    def _on_feedback(self, h: PlanHandle, msg) -> None:
        self._offer(h, msg.feedback.segment, "feedback")

    def _offer(self, h: PlanHandle, seg: PlanSegment, how: str) -> None:
        with h.tracking.lock:
            if h.tracking.phase == PHASE_DONE:
                return
            if h.tracking.next < 0:  # tracking: start wherever the stream is
                h.tracking.next = seg.segment_index
            h.tracking.last_progress = time.monotonic()
            if seg.segment_index < h.tracking.next or seg.segment_index in h.tracking.held:
                return
            h.tracking.held[seg.segment_index] = seg
            self._flush(h, how)

    def _flush(self, h: PlanHandle, how: str, *, final: bool = False) -> None:
        """Deliver the held segments that continue the delivered prefix. ``final``: the task is over; what
        is held beyond a gap is never delivered (a robot must not run a plan with a hole in it): the gap goes
        to ``missing``, the held segments to ``undelivered``."""
        while h.tracking.next in h.tracking.held:
            seg = h.tracking.held.pop(h.tracking.next)
            h.tracking.next += 1
            self._deliver(h, seg, how)
        if final and h.tracking.held:
            held = h.tracking.held
            h.missing.extend(i for i in range(max(h.tracking.next, 0), max(held)) if i not in held)
            h.undelivered = [held[i] for i in sorted(held)]
            held.clear()

    def _deliver(self, h: PlanHandle, seg: PlanSegment, how: str) -> None:
        h.segments.append(seg)
        if how == "feedback":
            h.from_feedback += 1
        elif how == "result":
            h.from_result += 1
        elif how == SOURCE_SERVICE:
            h.from_service += 1
        else:
            h.from_topic += 1
        if h.t_first_segment is None:
            h.t_first_segment = time.monotonic()
        if h.on_segment is not None:
            try:
                h.on_segment(seg)
            except Exception as e:  # noqa: BLE001 - a user callback must not break delivery
                self.node.get_logger().error(f"on_segment of task {h.task_id} raised {e!r}")

    def _on_topic_segment(self, msg: PlanSegment) -> None:
        for h in self._handles_of(msg.task_id):
            if h.tracking.phase == PHASE_FALLBACK:
                self._offer(h, msg, "topic")

    # -- results --------------------------------------------------------------------------------------
    def _finish(self, h: PlanHandle, result: PlanTask.Result, source: str) -> None:
        for s in result.segments:
            if s.segment_index >= h.tracking.next and s.segment_index not in h.tracking.held:
                h.tracking.held[s.segment_index] = s
        self._flush(h, "result", final=True)
        if source != SOURCE_ACTION:
            result.segments = list(h.segments)
        n = self._planned_segments(h, result)
        hi = max((x.segment_index for x in h.undelivered), default=h.tracking.next - 1)
        h.missing.extend(range(hi + 1, n))
        h.complete = not h.missing and not h.undelivered and len(h.segments) >= n
        h.result, h.source = result, source
        self._close(h)

    def _planned_segments(self, h: PlanHandle, result: PlanTask.Result) -> int:
        if h.tracking.candidate_n is not None:
            return h.tracking.candidate_n
        return len(result.segments)

    def _fail(self, h: PlanHandle, kind: str, message: str) -> None:
        if h.tracking.phase == PHASE_DONE:
            return
        self._flush(h, "feedback", final=True)
        h.error_kind, h.error = kind, message
        if kind == ERR_TIMEOUT and self.cancel_on_timeout:
            for a in h.tracking.attempt_list:
                if a.goal_handle is not None and a.goal_handle.accepted:
                    try:
                        a.goal_handle.cancel_goal_async()
                    except Exception:  # noqa: BLE001
                        pass
        self._close(h)

    def _close(self, h: PlanHandle) -> None:
        h.tracking.phase = PHASE_DONE
        h.t_done = time.monotonic()
        if h.tracking.poll_future is not None:
            self._srv.remove_pending_request(h.tracking.poll_future)
            h.tracking.poll_future = None
        with self._lock:
            self._open.pop(id(h), None)
            lst = self._by_task.get(h.task_id)
            if lst is not None:
                lst[:] = [x for x in lst if x is not h]
                if not lst:
                    del self._by_task[h.task_id]
        h.tracking.event.set()
        if h.on_done is not None:
            try:
                h.on_done(h)
            except Exception as e:  # noqa: BLE001
                self.node.get_logger().error(f"on_done of task {h.task_id} raised {e!r}")

    def _handles_of(self, task_id: str) -> list[PlanHandle]:
        with self._lock:
            return list(self._by_task.get(task_id, ()))

    def _on_plan_result(self, msg: PlanResult) -> None:
        for h in self._handles_of(msg.task_id):
            with h.tracking.lock:
                self._offer_result(h, msg, SOURCE_RESULTS_TOPIC)

    def _offer_result(self, h: PlanHandle, msg: PlanResult, source: str) -> None:
        """A result that did not come through the action (it carries no segment list). It becomes the
        candidate outcome; :meth:`_settle` decides when to take it."""
        if h.tracking.phase == PHASE_DONE:
            return
        now = time.monotonic()
        if h.tracking.candidate is None:
            h.tracking.candidate = (msg, source, now + self.result_grace)
        if h.tracking.phase == PHASE_FALLBACK and source == SOURCE_RESULTS_TOPIC and len(h.segments) < msg.num_segments:
            # published by the running planner, which keeps the result: a rejoin gets every segment
            self._maybe_rejoin(h, now)
        self._settle(h, now)

    def _settle(self, h: PlanHandle, now: float) -> None:
        """Take the candidate result, or wait for better: the action's own result (every segment) usually
        follows within ``result_grace``; a rejoin's within ``goal_response_timeout``. While the action still
        looks alive, a candidate with segments missing turns into a fallback (and a rejoin) first."""
        if h.tracking.candidate is None or h.tracking.phase == PHASE_DONE:
            return
        msg, source, until = h.tracking.candidate
        missing = len(h.segments) < msg.num_segments
        if h.tracking.phase != PHASE_FALLBACK:
            if now < until:
                return
            if missing:
                self._enter_fallback(h, "the planner finished the task; its action result did not come", now)
                h.tracking.candidate = (msg, source, now + self.goal_response_timeout + self.result_grace)
                return
        elif now < until and (missing or self._rejoin_pending(h)):
            return
        self._finish_from(h, msg, source)

    def _rejoin_pending(self, h: PlanHandle) -> bool:
        """A rejoin attempt that may still bring the action result (with every segment)."""
        now = time.monotonic()
        for a in h.tracking.attempt_list:
            if not a.rejoin or a.broken:
                continue
            if a.result_future is not None:
                if not a.result_future.done():
                    return True
            elif not a.responded and now - a.sent_at < self.goal_response_timeout:
                return True
        return False

    def _maybe_rejoin(self, h: PlanHandle, now: float) -> None:
        """The planner holds the task: re-send the same goal to join it (once per server instance, again only if
        that re-send went unanswered, e.g. sent before the new server's endpoints matched ours)."""
        if (h.tracking.phase != PHASE_FALLBACK or not h.goal.robot_id or not self._server.ready
                or self._rejoin_pending(h)):
            return
        if h.tracking.rejoined_epoch == self._server.epoch and (h.tracking.rejoins_in_epoch >= 3 or any(
                a.rejoin and a.responded and not a.broken for a in h.tracking.attempt_list)):
            return
        if h.tracking.rejoined_epoch == self._server.epoch:
            h.tracking.rejoins_in_epoch += 1
        else:
            h.tracking.rejoins_in_epoch = 1
        self._send_attempt(h, now, rejoin=True)
        if h.tracking.candidate is not None:  # give the joined goal's result (every segment) time to come
            msg, source, until = h.tracking.candidate
            h.tracking.candidate = (msg, source, max(until, now + self.goal_response_timeout))

    def _finish_from(self, h: PlanHandle, msg: PlanResult, source: str) -> None:
        h.tracking.candidate_n = int(msg.num_segments)
        self._finish(h, result_from_plan_result(msg), source)

    # -- fallback ------------------------------------------------------------------------------------
    def _enter_fallback(self, h: PlanHandle, why: str, now: float) -> None:
        if h.tracking.phase in (PHASE_DONE, PHASE_FALLBACK):
            return
        h.tracking.phase = PHASE_FALLBACK
        h.fallback_reason = why
        h.tracking.poll_due = now
        self._count("fallbacks")
        self._ensure_fallback_subs()

    def _ensure_fallback_subs(self) -> None:
        with self._lock:
            if self._subs or self._closed:
                return
            self._subs.append(self.node.create_subscription(
                PlanResult, self._results_topic, self._on_plan_result, topics.RESULTS_QOS,
                callback_group=self._group))
            self._subs.append(self.node.create_subscription(
                PlanSegment, self._segments_topic, self._on_topic_segment, topics.REPORTS,
                callback_group=self._group))

    def _poll(self, h: PlanHandle, now: float) -> None:
        if h.tracking.poll_future is not None:
            if now - h.tracking.poll_sent_at < self.poll_timeout:
                return
            self._srv.remove_pending_request(h.tracking.poll_future)  # the planner went away with our request
            h.tracking.poll_future = None
        if now < h.tracking.poll_due or not self._srv.service_is_ready():
            return
        h.tracking.poll_sent_at = now
        h.polls += 1
        self._count("polls")
        fut = self._srv.call_async(result_request(h.task_id))
        h.tracking.poll_future = fut
        fut.add_done_callback(lambda f, h=h: self._on_poll(h, f))

    def _on_poll(self, h: PlanHandle, fut) -> None:
        try:
            resp = fut.result()
        except Exception:  # noqa: BLE001
            resp = None
        with h.tracking.lock:
            if h.tracking.poll_future is fut:
                h.tracking.poll_future = None
            if h.tracking.phase == PHASE_DONE or resp is None:
                return
            now = time.monotonic()
            state = lookup_state(resp)
            if state == "done":
                h.tracking.unknown = 0
                for seg in resp.segments:  # every segment the planner sent: the fallback's gaps close here
                    if seg.segment_index >= max(h.tracking.next, 0) and seg.segment_index not in h.tracking.held:
                        h.tracking.held[seg.segment_index] = seg
                if h.tracking.next < 0 and h.tracking.held:
                    h.tracking.next = min(h.tracking.held)
                self._flush(h, SOURCE_SERVICE)
                # No rejoin here: a result the planner only has in its journal (the task ended before a restart)
                # is not joined by a repeated goal but planned again (planner/service.py, PlannerService._join).
                self._offer_result(h, resp.result, SOURCE_SERVICE)
                h.tracking.poll_due = now + self.poll_period
                return
            if state == "active":
                h.tracking.unknown = 0
                h.tracking.last_progress = now
                if h.tracking.phase == PHASE_ACCEPTED:
                    h.tracking.probe_due = now + self.stale_after
                else:
                    self._maybe_rejoin(h, now)
                    h.tracking.poll_due = now + self.poll_period
                return
            # "unknown"
            if h.tracking.phase == PHASE_ACCEPTED:  # the planner forgot a goal its action server accepted: restarted
                self._enter_fallback(h, "the planner does not know the task (restarted?)", now)
                h.tracking.unknown = 1
                h.tracking.poll_due = now + self.poll_period
                return
            h.tracking.unknown += 1
            if h.tracking.unknown >= self.unknown_limit:
                if h.accepted:
                    self._fail(h, ERR_LOST, f"task {h.task_id}: accepted, then unknown to the planner "
                                            f"(restarted without its journal?)")
                elif h.attempts:
                    self._fail(h, ERR_NO_RESPONSE, f"task {h.task_id}: no goal response after {h.attempts} "
                                                   f"attempts and the planner does not know the task")
                else:
                    self._fail(h, ERR_LOST, f"task {h.task_id}: unknown to the planner")
            else:
                h.tracking.poll_due = now + self.poll_period

    # -- the timer -----------------------------------------------------------------------------------
    def _tick(self) -> None:
        if self._closed or not self._open:
            return
        now = time.monotonic()
        ready = self._server.update(now)
        down_since = self._server.down_since
        down_for = 0.0 if down_since is None else now - down_since
        for h in self.open_handles():
            with h.tracking.lock:
                try:
                    self._step(h, now, ready, down_for)
                except Exception as e:  # noqa: BLE001 - one bad handle must not stop the others
                    self.node.get_logger().error(f"PlanClient: task {h.task_id}: {e!r}")

    def _step(self, h: PlanHandle, now: float, ready: bool, down_for: float) -> None:
        ph = h.tracking.phase
        if ph == PHASE_DONE:
            return
        if now >= h.tracking.deadline:
            self._fail(h, ERR_TIMEOUT, f"task {h.task_id}: no result within {h.timeout:g} s "
                                       f"({h.attempts} attempts, phase {ph})")
            return
        if h.tracking.candidate is not None:
            self._settle(h, now)
            ph = h.tracking.phase
            if ph == PHASE_DONE:
                return
        if ph == PHASE_WAIT_SERVER:
            if ready:
                self._send_attempt(h, now)
            elif now >= h.tracking.server_deadline:
                self._fail(h, ERR_NO_SERVER, f"no PlanTask action server within {self.server_timeout:g} s "
                                             "(is the planner running?)")
        elif ph == PHASE_SENDING:
            if h.tracking.next_send_at is None and now >= h.tracking.response_deadline:
                if h.attempts >= self.max_attempts:
                    self._enter_fallback(h, f"no goal response after {h.attempts} attempts", now)
                    return
                backoff = min(self.retry_backoff * 2 ** (h.attempts - 1), self.max_backoff)
                h.tracking.next_send_at = now + backoff
                h.tracking.server_deadline = now + backoff + self.server_timeout
            if h.tracking.next_send_at is not None and now >= h.tracking.next_send_at:
                if ready:
                    self._send_attempt(h, now)
                elif now >= h.tracking.server_deadline:
                    self._enter_fallback(h, "the action server disappeared while re-sending", now)
        elif ph == PHASE_ACCEPTED:
            if (not ready and down_for >= self.server_lost_grace) or (ready and self._server.epoch != h.tracking.epoch):
                self._enter_fallback(h, "the action server went away", now)
            elif now >= h.tracking.probe_due:  # no news for a while: ask whether the planner still knows the task
                h.tracking.probe_due = now + self.stale_after
                h.tracking.poll_due = now
                self._poll(h, now)
        if h.tracking.phase == PHASE_FALLBACK:
            self._poll(h, now)


def send_task(node: Node, client: ActionClient, goal: PlanTask.Goal, *, timeout: float = 120.0,
              on_feedback=None) -> PlanTask.Result:
    """Send one goal and wait for its result (spinning ``node``): the compatible wrapper of
    :meth:`PlanClient.plan`. Raises TimeoutError (no server / no response / no result) or RuntimeError
    (not accepted, lost)."""
    pc = PlanClient(node, action_client=client, server_timeout=min(timeout, 30.0), default_timeout=timeout)
    try:
        on_segment = None
        if on_feedback is not None:
            on_segment = lambda s: on_feedback(feedback_msg(s))
        return pc.plan(goal, timeout=timeout, on_segment=on_segment)
    finally:
        pc.destroy()


def _nul_in_argv(argv: list[str]) -> str | None:
    """Why an argument holding NUL is refused, naming its option (``--task`` -> ``task``), or None."""
    for i, a in enumerate(argv):
        if "\x00" not in a:
            continue
        if a.startswith("--") and "=" in a:
            name, value = a.split("=", 1)
        else:
            name, value = (argv[i - 1] if i > 0 and argv[i - 1].startswith("--") else f"argument {i}"), a
        try:
            check_text(name.lstrip("-").replace("-", "_"), value)
        except ValueError as e:
            return str(e)
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv if argv is None else argv
    ap = argparse.ArgumentParser(prog="plan_client", description=__doc__.splitlines()[0])
    ap.add_argument("--robot-id", default="drone_0")
    ap.add_argument("--robot-type", default="drone")
    ap.add_argument("--task", required=True, help="scene and instruction, as in the LRTrace traces")
    ap.add_argument("--urgency", default="normal", help="named level (normal, urgent) or '' for custom")
    ap.add_argument("--alpha", type=float, default=0.0)
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--ert", type=float, default=0.0)
    ap.add_argument("--task-id", default="", help="reuse an id (a retry of the same request); default: a uuid")
    ap.add_argument("--action", default=topics.in_fleet(topics.PLAN_TASK_ACTION),
                    help="PlanTask action name (relative: in the node's namespace, --ros-args -r __ns:=/fleet_a)")
    ap.add_argument("--timeout", type=float, default=120.0)
    if (why := _nul_in_argv(argv)) is not None:  # before rcl reads argv: it would cut the text at the NUL
        print(f"error: {why}", file=sys.stderr)
        return 2
    args = ap.parse_args(remove_ros_args(argv)[1:])

    rclpy.init(args=argv)
    node = rclpy.create_node("plan_client")
    pc = PlanClient(node, args.action, server_timeout=min(args.timeout, 30.0), default_timeout=args.timeout)
    t0 = time.monotonic()

    def show(s: PlanSegment) -> None:
        print(f"[{time.monotonic() - t0:7.3f}s] {s.robot_id} {s.task_id} #{s.segment_index}: {s.text!r}"
              f"{'  (final)' if s.is_final else ''}", flush=True)

    goal = goal_msg(args.task_id, args.robot_id, args.robot_type, args.task,
                    tuf_msg(args.urgency, args.alpha, args.beta, args.ert))
    try:
        try:
            r = pc.plan(goal, timeout=args.timeout, on_segment=show)
        except (PlanClientError, ValueError) as e:  # ValueError: a field refused before anything was sent
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"result: {status_name(r.status)} ({r.message}); plan {r.plan_text!r}; "
              f"response {duration_s(r.response_time):.3f}s; utility {r.utility:.3f}")
        return 0 if status_from_code(r.status) is TaskStatus.DONE else 1
    finally:
        pc.destroy()
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())
