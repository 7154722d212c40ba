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

The handle and the client-side errors are in :mod:`timelyllm_ros.ros.plan_handle`, the goal's state machine
and its one vocabulary (:class:`~timelyllm_ros.ros.goal_tracking.GoalOutcome`: the phases of an open goal, the
planner's results, the client-side failures) in :mod:`timelyllm_ros.ros.goal_tracking` (importable from here too).
"""

from __future__ import annotations

import argparse
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
from timelyllm_ros.ros.goal_tracking import (  # the outcome vocabulary is part of this module's API too
    SOURCE_ACTION,
    SOURCE_RESULTS_TOPIC,
    SOURCE_SERVICE,
    Attempt,
    GoalIO,
    GoalOutcome,
)
from timelyllm_ros.ros.plan_handle import PlanClientError, PlanHandle, PlanTimeoutError  # also this module's API
from timelyllm_ros.srv import GetPlanResult

__all__ = [
    "SOURCE_ACTION", "SOURCE_RESULTS_TOPIC", "SOURCE_SERVICE", "GoalOutcome", "PlanClient", "PlanClientError",
    "PlanHandle", "PlanTimeoutError", "check_goal", "main", "send_task",
]


def check_goal(goal: PlanTask.Goal) -> None:
    """ValueError naming the field, the character and its position for a goal the planner would refuse for its
    text, or could not see as sent: rclpy cuts a string at its first NUL before it leaves this process, so a task
    with NUL would arrive cut short and be planned as if nothing were wrong. Every client of ours checks here."""
    check_text("task_id", goal.task_id, single_line=True)
    check_text("robot_id", goal.robot_id, single_line=True)
    check_text("robot_type", goal.robot_type, single_line=True)
    check_text("task", goal.task)


class PlanClient:
    """PlanTask goals with retries, exactly-once in-order segments and a result fallback (module doc). Each goal's
    transitions are its GoalTracker's (``handle.tracking``); this class does the I/O they ask for."""

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
        self.server = ActionServerWatch(node, self._action, action_name)  # the goals' trackers read it
        self._closed = False
        self._timer = node.create_timer(tick, self._tick, callback_group=self._group,
                                        clock=Clock(clock_type=ClockType.STEADY_TIME))
        self.stats = {"attempts": 0, "retries": 0, "fallbacks": 0, "polls": 0, "rejoins": 0}
        self.io = GoalIO(count=self._count, send_goal=self._send_goal, get_result=self._get_result,
                         send_poll=self._send_poll, drop_poll=self._drop_poll, fallback_subs=self._ensure_fallback_subs,
                         unregister=self._unregister, log=self._log, to_result=result_from_plan_result)

    # -- public API ----------------------------------------------------------------------------
    def wait_for_server(self, timeout: float | None = None) -> bool:
        """Block (without spinning) until the action server is discovered."""
        ok = self._action.wait_for_server(timeout_sec=self.server_timeout if timeout is None else timeout)
        self.server.update(time.monotonic())
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
        h = self._register(PlanHandle(self, self.prepare(goal), on_segment, on_done,
                                      self.default_timeout if timeout is None else float(timeout)))
        now = time.monotonic()
        if self.server.update(now):
            h.tracking.start(now)
        return h

    def track(self, task_id: str, on_segment: Callable[[PlanSegment], Any] | None = None,
              on_done: Callable[[PlanHandle], Any] | None = None, *, timeout: float | None = None,
              robot_id: str = "") -> PlanHandle:
        """Follow a task sent earlier (e.g. by this robot before it restarted) by its id alone, through
        /plan_results, /get_plan_result and /plan_segments. Segments sent before this call are not seen."""
        h = self._register(PlanHandle(self, goal_msg(task_id, robot_id), on_segment, on_done,
                                      self.default_timeout if timeout is None else float(timeout), by_id=True))
        h.tracking.follow_by_id(time.monotonic())
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
        limit = handle.t_created + handle.timeout + self.poll_timeout + 5.0  # past the goal's own deadline
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
        """Stop the timer, end open handles (GoalOutcome.CLOSED) and free what this client created."""
        self._closed = True
        for h in self.open_handles():
            h.tracking.fail(GoalOutcome.CLOSED, "the PlanClient was destroyed")
        self.node.destroy_timer(self._timer)
        self.node.destroy_client(self._srv)
        for s in self._subs:
            self.node.destroy_subscription(s)
        self._subs.clear()
        if self._own_action:
            self._action.destroy()

    # -- the handles ---------------------------------------------------------------------------
    def _register(self, h: PlanHandle) -> PlanHandle:
        with self._lock:
            self._open[id(h)] = h
            self._by_task.setdefault(h.task_id, []).append(h)
        return h

    def _unregister(self, h: PlanHandle) -> None:
        with self._lock:
            self._open.pop(id(h), None)
            lst = self._by_task.get(h.task_id)
            if lst is not None:
                lst[:] = [x for x in lst if x is not h]
                if not lst:
                    del self._by_task[h.task_id]

    def _handles_of(self, task_id: str) -> list[PlanHandle]:
        with self._lock:
            return list(self._by_task.get(task_id, ()))

    def _count(self, what: str) -> None:
        with self._lock:
            self.stats[what] += 1

    def _log(self, level: str, message: str) -> None:
        getattr(self.node.get_logger(), level)(message)

    # -- the action (I/O the goal's GoalTracker asks for, and what comes back) ---------------------------
    def _send_goal(self, h: PlanHandle, att: Attempt):
        fut = self._action.send_goal_async(h.goal, feedback_callback=lambda m, h=h: self._on_feedback(h, m))
        fut.add_done_callback(lambda f, h=h, att=att: self._on_goal_response(h, att, f))
        return fut

    def _on_goal_response(self, h: PlanHandle, att: Attempt, fut) -> None:
        try:
            gh = fut.result()
        except Exception:  # noqa: BLE001
            gh = None
        h.tracking.goal_response(att, gh)

    def _get_result(self, h: PlanHandle, att: Attempt, gh):
        fut = gh.get_result_async()
        fut.add_done_callback(lambda f, h=h, att=att: self._on_result_response(h, att, f))
        return fut

    def _on_result_response(self, h: PlanHandle, att: Attempt, fut) -> None:
        try:
            resp = fut.result()
        except Exception:  # noqa: BLE001
            resp = None
        if resp is None:
            h.tracking.action_result(att, None, "result request failed")
        elif resp.status == GoalStatus.STATUS_UNKNOWN:
            h.tracking.action_result(att, None, "the action server does not know the goal (restarted?)")
        else:
            h.tracking.action_result(att, resp.result)

    def _on_feedback(self, h: PlanHandle, msg) -> None:
        h.tracking.offer(msg.feedback.segment, "feedback")

    # -- the fallback ----------------------------------------------------------------------------------
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

    def _on_topic_segment(self, msg: PlanSegment) -> None:
        for h in self._handles_of(msg.task_id):
            h.tracking.topic_segment(msg)

    def _on_plan_result(self, msg: PlanResult) -> None:
        for h in self._handles_of(msg.task_id):
            h.tracking.offer_result(msg, SOURCE_RESULTS_TOPIC)

    def _send_poll(self, h: PlanHandle):
        if not self._srv.service_is_ready():
            return None
        fut = self._srv.call_async(result_request(h.task_id))
        fut.add_done_callback(lambda f, h=h: self._on_poll(h, f))
        return fut

    def _drop_poll(self, fut) -> None:
        self._srv.remove_pending_request(fut)

    def _on_poll(self, h: PlanHandle, fut) -> None:
        try:
            resp = fut.result()
        except Exception:  # noqa: BLE001
            resp = None
        h.tracking.poll_answer(fut, resp, None if resp is None else lookup_state(resp))

    # -- the timer -----------------------------------------------------------------------------------
    def _tick(self) -> None:
        if self._closed or not self._open:
            return
        now = time.monotonic()
        ready = self.server.update(now)
        down_since = self.server.down_since
        down_for = 0.0 if down_since is None else now - down_since
        for h in self.open_handles():
            try:
                h.tracking.step(now, ready, down_for)
            except Exception as e:  # noqa: BLE001 - one bad handle must not stop the others
                self.node.get_logger().error(f"PlanClient: task {h.task_id}: {e!r}")


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
