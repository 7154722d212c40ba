"""The state machine of one PlanTask goal as :class:`~timelyllm_ros.ros.client.PlanClient` follows it, in plain
Python (no rclpy, no messages built here: unit-testable without ROS).

:class:`GoalOutcome` is the one vocabulary of a goal: where an open goal stands (``WAIT_SERVER``, ``SENDING``,
``ACCEPTED``, ``FALLBACK``), the planner's result it ended with (the terminal :class:`TaskStatus` values) or the
client-side failure it ended with instead (``NO_SERVER``, ``NOT_ACCEPTED``, ``NO_RESPONSE``, ``LOST``,
``TIMEOUT``, ``CLOSED``). :class:`GoalTracker` owns every transition of the goal and every field a caller reads
of it (:class:`GoalReport`, the base of :class:`~timelyllm_ros.ros.plan_handle.PlanHandle`); the client only
does the I/O it is asked for (:class:`GoalClient`) and feeds back what comes in.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from timelyllm_ros.domain.types import STATUS_FROM_CODE, TaskStatus

# Where a terminal result came from (GoalReport.source).
SOURCE_ACTION = "action"
SOURCE_RESULTS_TOPIC = "plan_results"
SOURCE_SERVICE = "get_plan_result"


class GoalOutcome(enum.StrEnum):
    """Where a goal stands: open (the client's phase), or how it ended."""

    # open
    WAIT_SERVER = "wait_server"  # no action server seen yet
    SENDING = "sending"          # goal sent, no response yet (re-sent with backoff)
    ACCEPTED = "accepted"        # following the goal through the action
    FALLBACK = "fallback"        # following the task through /plan_results, /get_plan_result, /plan_segments
    # ended with the planner's result: the terminal TaskStatus values
    DONE = "done"
    INVALID = "invalid"
    FAILED = "failed"            # also a result code this build does not know
    CANCELLED = "cancelled"
    OVERDUE = "overdue"
    ROBOT_FAILED = "robot_failed"
    BUSY = "busy"
    # ended without a result from the planner (client-side failures; REJECTED etc. are results, not errors)
    NO_SERVER = "no_server"        # no PlanTask action server within server_timeout
    NOT_ACCEPTED = "not_accepted"  # the action server answered the goal "not accepted"
    NO_RESPONSE = "no_response"    # no goal response after max_attempts sends, and the planner never heard of it
    LOST = "lost"                  # accepted, then the planner forgot the task (restarted without its journal)
    TIMEOUT = "timeout"            # no terminal result within the goal's timeout
    CLOSED = "closed"              # the PlanClient was destroyed first

    @property
    def open(self) -> bool:
        return self in _OPEN

    @property
    def client_error(self) -> bool:
        return self in _CLIENT_ERRORS

    @property
    def timed_out(self) -> bool:
        """A client-side failure that is a wait running out (PlanTimeoutError)."""
        return self in (GoalOutcome.NO_SERVER, GoalOutcome.NO_RESPONSE, GoalOutcome.TIMEOUT)

    @classmethod
    def of_code(cls, code: int) -> GoalOutcome:
        """The outcome of a result's status code (FAILED for a code this build does not know)."""
        st = STATUS_FROM_CODE.get(int(code))
        return cls(st.value) if st is not None else cls.FAILED


_OPEN = frozenset({GoalOutcome.WAIT_SERVER, GoalOutcome.SENDING, GoalOutcome.ACCEPTED, GoalOutcome.FALLBACK})
_CLIENT_ERRORS = frozenset({GoalOutcome.NO_SERVER, GoalOutcome.NOT_ACCEPTED, GoalOutcome.NO_RESPONSE,
                            GoalOutcome.LOST, GoalOutcome.TIMEOUT, GoalOutcome.CLOSED})


@dataclass(frozen=True)
class GoalIO:
    """The I/O a :class:`GoalTracker` asks its client for (PlanClient builds it from its own methods)."""

    count: Callable[[str], None]  # add one to a client-wide counter (PlanClient.stats)
    send_goal: Callable[[Any, Attempt], Any]  # (handle, attempt) -> the goal future; raises: could not send
    get_result: Callable[[Any, Attempt, Any], Any]  # (handle, attempt, goal handle) -> the result future; raises
    send_poll: Callable[[Any], Any]  # handle -> the /get_plan_result future; None: the service is not ready
    drop_poll: Callable[[Any], None]  # forget a poll the planner went away with
    fallback_subs: Callable[[], None]  # make sure /plan_results and /plan_segments are subscribed
    unregister: Callable[[Any], None]  # the handle is done: the client stops routing to it
    log: Callable[[str, str], None]  # (level, message)
    to_result: Callable[[Any], Any]  # a PlanResult as the PlanTask.Result it stands for (without segments)


class GoalClient(Protocol):
    """What a :class:`GoalTracker` reads of its client: the settings, the action server's state, the I/O."""

    server_timeout: float
    goal_response_timeout: float
    max_attempts: int
    retry_backoff: float
    max_backoff: float
    poll_period: float
    poll_timeout: float
    stale_after: float
    result_grace: float
    server_lost_grace: float
    unknown_limit: int
    cancel_on_timeout: bool
    server: Any  # .ready, .epoch (ActionServerWatch)
    io: GoalIO


class Attempt:
    """One send of a goal (a retry or a rejoin is another) and what came back for it."""

    __slots__ = ("n", "sent_at", "rejoin", "future", "goal_handle", "result_future", "responded", "broken")

    def __init__(self, n: int, sent_at: float, rejoin: bool = False) -> None:
        self.n, self.sent_at, self.rejoin = n, sent_at, rejoin
        self.future = self.goal_handle = self.result_future = None
        self.responded = self.broken = False


class GoalReport:
    """What a caller reads of one goal; written only by its :class:`GoalTracker`.

    After the goal is done: ``result`` (a ``PlanTask.Result``; rebuilt from a ``PlanResult`` when it came
    through the fallback, with ``segments`` = the segments this client saw) and ``source``, or ``error`` /
    ``error_kind`` for a client-side failure. ``segments`` is what was handed to ``on_segment``, in order;
    ``complete`` says it covers the whole plan.
    """

    def __init__(self, task_id: str, robot_id: str, on_segment: Callable[[Any], Any] | None,
                 on_done: Callable[[Any], Any] | None, timeout: float) -> None:
        self.task_id, self.robot_id = task_id, robot_id
        self.on_segment, self.on_done = on_segment, on_done
        self.timeout = timeout
        self.t_created = time.monotonic()
        self.t_first_segment: float | None = None  # monotonic, when on_segment got index 0 (or the first one)
        self.t_done: float | None = None
        self.attempts = 0          # goal requests sent
        self.responses = 0         # goal responses received (accepted or not)
        self.accepted = False      # some attempt was accepted by the action server
        self.result: Any = None    # PlanTask.Result
        self.source: str | None = None
        self.error: str | None = None
        self.error_kind: GoalOutcome | None = None  # a client-side failure (GoalOutcome.client_error)
        self.segments: list = []
        self.from_feedback = 0     # delivered as feedback arrived
        self.from_result = 0       # filled in from the result's segments list
        self.from_topic = 0        # from /plan_segments while in fallback
        self.from_service = 0      # from /get_plan_result's segments list (fallback)
        self.missing: list[int] = []  # indices never seen (fallback only)
        self.undelivered: list = []  # seen beyond a gap, so never handed to on_segment
        self.complete = False
        self.fallback_reason: str | None = None
        self.polls = 0
        self.rejoins = 0           # the same goal re-sent in fallback, to join the task on a restarted planner


class GoalTracker:
    """Every transition of one goal (attempts, held segments, polls, deadlines, the candidate result), guarded by
    ``lock``. The public methods are its events; each takes the lock. A :class:`PlanHandle` carries it as
    ``tracking``; nothing else changes its fields or its report's."""

    __slots__ = ("report", "client", "lock", "event", "outcome", "attempt_list", "deadline", "server_deadline",
                 "response_deadline", "next_send_at", "epoch", "held", "next", "last_progress", "probe_due",
                 "poll_due", "poll_future", "poll_sent_at", "unknown", "candidate", "candidate_n", "rejoined_epoch",
                 "rejoins_in_epoch", "cancel_requested")

    def __init__(self, report: GoalReport, client: GoalClient) -> None:
        created = report.t_created
        self.report, self.client = report, client
        self.lock = threading.RLock()
        self.event = threading.Event()
        self.outcome = GoalOutcome.WAIT_SERVER
        self.attempt_list: list[Attempt] = []
        self.deadline = created + report.timeout
        self.server_deadline = created + client.server_timeout
        self.response_deadline = math.inf
        self.next_send_at: float | None = None
        self.epoch = -1  # server epoch of the accepting attempt
        self.held: dict[int, Any] = {}
        self.next = 0
        self.last_progress = created
        self.probe_due = math.inf
        self.poll_due = 0.0
        self.poll_future = None
        self.poll_sent_at = 0.0
        self.unknown = 0
        self.candidate: tuple[Any, str, float] | None = None  # (PlanResult, source, take it after)
        self.candidate_n: int | None = None  # num_segments of a result that came without its segments
        self.rejoined_epoch = -1  # server epoch of the last rejoin (same goal re-sent after a fallback)
        self.rejoins_in_epoch = 0
        self.cancel_requested = False

    # -- events ------------------------------------------------------------------------------------
    def start(self, now: float) -> None:
        """The server is there as the goal is created: send it now."""
        with self.lock:
            if self.outcome is GoalOutcome.WAIT_SERVER:
                self._send_attempt(now)

    def follow_by_id(self, now: float) -> None:
        """A task sent earlier, known by its id alone: straight to the fallback, from whatever index comes first."""
        with self.lock:
            self.next = -1
            self._enter_fallback("tracking a task by id", now)

    def cancel(self) -> None:
        """Ask the planner to cancel the task (through every accepted attempt; later ones when they are accepted)."""
        with self.lock:
            self.cancel_requested = True
            handles = [a.goal_handle for a in self.attempt_list if a.goal_handle is not None and a.goal_handle.accepted]
        for gh in handles:
            try:
                gh.cancel_goal_async()
            except Exception:  # noqa: BLE001 - best effort
                pass

    def goal_response(self, att: Attempt, gh: Any) -> None:
        """The action server answered ``att`` (``gh``: its goal handle; None: the request failed)."""
        if gh is None:
            return
        with self.lock:
            r, c = self.report, self.client
            att.responded = True
            att.goal_handle = gh
            r.responses += 1
            if not self.outcome.open:
                return
            if not gh.accepted:
                if not r.accepted and not att.rejoin:
                    self._fail(GoalOutcome.NOT_ACCEPTED, f"task {r.task_id}: the action server did not accept the goal")
                return
            first = not r.accepted
            r.accepted = True
            self.last_progress = time.monotonic()
            if not att.rejoin and first:
                self.epoch = c.server.epoch
                self.response_deadline = math.inf
                self.next_send_at = None
                if self.outcome is GoalOutcome.SENDING:
                    self.outcome = GoalOutcome.ACCEPTED
                self.probe_due = self.last_progress + c.stale_after
            cancel = self.cancel_requested
            try:
                att.result_future = c.io.get_result(r, att, gh)
            except Exception as e:  # noqa: BLE001 - the action connection is gone
                att.broken = True
                self._action_broken(f"result request failed: {e!r}")
                return
        if cancel:
            gh.cancel_goal_async()

    def action_result(self, att: Attempt, result: Any, broken: str | None = None) -> None:
        """The result request of ``att`` came back: ``result`` (a PlanTask.Result), or None and why the action
        connection is ``broken``."""
        with self.lock:
            if not self.outcome.open:
                return
            if result is None:
                att.broken = True
                self._action_broken(broken or "result request failed")
                return
            if att.rejoin and STATUS_FROM_CODE.get(int(result.status)) is TaskStatus.INVALID:
                # a rejoin is only sent for a task the planner knows: a refusal says nothing about the task
                att.broken = True
                self.client.io.log("warning", f"task {self.report.task_id}: re-sent goal refused ({result.message}); "
                                            "following the task through /get_plan_result")
                return
            self._finish(result, SOURCE_ACTION)

    def offer(self, seg: Any, how: str) -> None:
        """A segment seen (``how``: "feedback", "topic"): held until the indices before it are delivered."""
        with self.lock:
            if not self.outcome.open:
                return
            if self.next < 0:  # tracking: start wherever the stream is
                self.next = seg.segment_index
            self.last_progress = time.monotonic()
            if seg.segment_index < self.next or seg.segment_index in self.held:
                return
            self.held[seg.segment_index] = seg
            self._flush(how)

    def topic_segment(self, seg: Any) -> None:
        """A segment of this task on /plan_segments: taken only in the fallback."""
        if self.outcome is GoalOutcome.FALLBACK:
            self.offer(seg, "topic")

    def offer_result(self, msg: Any, source: str) -> None:
        """A result that did not come through the action (a PlanResult: no segment list). It becomes the
        candidate outcome; :meth:`_settle` decides when to take it."""
        with self.lock:
            if not self.outcome.open:
                return
            now = time.monotonic()
            if self.candidate is None:
                self.candidate = (msg, source, now + self.client.result_grace)
            if (self.outcome is GoalOutcome.FALLBACK and source == SOURCE_RESULTS_TOPIC
                    and len(self.report.segments) < msg.num_segments):
                # published by the running planner, which keeps the result: a rejoin gets every segment
                self._maybe_rejoin(now)
            self._settle(now)

    def poll_answer(self, fut: Any, resp: Any, state: str | None) -> None:
        """/get_plan_result answered ``fut``: ``resp`` (None: the call failed), its ``state`` ('done', 'active',
        'unknown')."""
        with self.lock:
            r, c = self.report, self.client
            if self.poll_future is fut:
                self.poll_future = None
            if not self.outcome.open or resp is None:
                return
            now = time.monotonic()
            if state == "done":
                self.unknown = 0
                for seg in resp.segments:  # every segment the planner sent: the fallback's gaps close here
                    if seg.segment_index >= max(self.next, 0) and seg.segment_index not in self.held:
                        self.held[seg.segment_index] = seg
                if self.next < 0 and self.held:
                    self.next = min(self.held)
                self._flush(SOURCE_SERVICE)
                # No rejoin here: a result the planner only has in its journal (the task ended before a restart)
                # is not joined by a repeated goal but planned again (planner/service.py, PlannerService._join).
                self.offer_result(resp.result, SOURCE_SERVICE)
                self.poll_due = now + c.poll_period
                return
            if state == "active":
                self.unknown = 0
                self.last_progress = now
                if self.outcome is GoalOutcome.ACCEPTED:
                    self.probe_due = now + c.stale_after
                else:
                    self._maybe_rejoin(now)
                    self.poll_due = now + c.poll_period
                return
            # "unknown"
            if self.outcome is GoalOutcome.ACCEPTED:  # the planner forgot a goal its server accepted: restarted
                self._enter_fallback("the planner does not know the task (restarted?)", now)
                self.unknown = 1
                self.poll_due = now + c.poll_period
                return
            self.unknown += 1
            if self.unknown >= c.unknown_limit:
                if r.accepted:
                    self._fail(GoalOutcome.LOST, f"task {r.task_id}: accepted, then unknown to the planner "
                                                 f"(restarted without its journal?)")
                elif r.attempts:
                    self._fail(GoalOutcome.NO_RESPONSE, f"task {r.task_id}: no goal response after {r.attempts} "
                                                        f"attempts and the planner does not know the task")
                else:
                    self._fail(GoalOutcome.LOST, f"task {r.task_id}: unknown to the planner")
            else:
                self.poll_due = now + c.poll_period

    def fail(self, kind: GoalOutcome, message: str) -> None:
        """End the goal with a client-side failure (no-op once it is done)."""
        with self.lock:
            self._fail(kind, message)

    def step(self, now: float, ready: bool, down_for: float) -> None:
        """The client's timer: deadlines, re-sends, the stale probe and the fallback's polls. ``ready``: the
        action server is there; ``down_for``: for how long it has not been."""
        with self.lock:
            self._step(now, ready, down_for)

    # -- transitions (the lock held) -----------------------------------------------------------
    def _step(self, now: float, ready: bool, down_for: float) -> None:
        r, c = self.report, self.client
        ph = self.outcome
        if not ph.open:
            return
        if now >= self.deadline:
            self._fail(GoalOutcome.TIMEOUT, f"task {r.task_id}: no result within {r.timeout:g} s "
                                            f"({r.attempts} attempts, phase {ph})")
            return
        if self.candidate is not None:
            self._settle(now)
            ph = self.outcome
            if not ph.open:
                return
        if ph is GoalOutcome.WAIT_SERVER:
            if ready:
                self._send_attempt(now)
            elif now >= self.server_deadline:
                self._fail(GoalOutcome.NO_SERVER, f"no PlanTask action server within {c.server_timeout:g} s "
                                                  "(is the planner running?)")
        elif ph is GoalOutcome.SENDING:
            if self.next_send_at is None and now >= self.response_deadline:
                if r.attempts >= c.max_attempts:
                    self._enter_fallback(f"no goal response after {r.attempts} attempts", now)
                    return
                backoff = min(c.retry_backoff * 2 ** (r.attempts - 1), c.max_backoff)
                self.next_send_at = now + backoff
                self.server_deadline = now + backoff + c.server_timeout
            if self.next_send_at is not None and now >= self.next_send_at:
                if ready:
                    self._send_attempt(now)
                elif now >= self.server_deadline:
                    self._enter_fallback("the action server disappeared while re-sending", now)
        elif ph is GoalOutcome.ACCEPTED:
            if (not ready and down_for >= c.server_lost_grace) or (ready and c.server.epoch != self.epoch):
                self._enter_fallback("the action server went away", now)
            elif now >= self.probe_due:  # no news for a while: ask whether the planner still knows the task
                self.probe_due = now + c.stale_after
                self.poll_due = now
                self._poll(now)
        if self.outcome is GoalOutcome.FALLBACK:
            self._poll(now)

    def _send_attempt(self, now: float, *, rejoin: bool = False) -> None:
        r, c = self.report, self.client
        att = Attempt(len(self.attempt_list) + 1, now, rejoin)
        self.attempt_list.append(att)
        if rejoin:
            r.rejoins += 1
            self.rejoined_epoch = c.server.epoch
            c.io.count("rejoins")
        else:
            r.attempts += 1
            c.io.count("attempts")
            if r.attempts > 1:
                c.io.count("retries")
            self.outcome = GoalOutcome.SENDING
            self.next_send_at = None
            self.response_deadline = now + c.goal_response_timeout
        try:
            att.future = c.io.send_goal(r, att)
        except Exception as e:  # noqa: BLE001 - e.g. the context is shutting down
            att.broken = True
            if not rejoin:
                self._fail(GoalOutcome.NO_RESPONSE, f"task {r.task_id}: could not send the goal: {e!r}")

    def _action_broken(self, why: str) -> None:
        """One attempt's action connection broke: fall back unless another attempt may still answer."""
        if any(a.goal_handle is not None and a.goal_handle.accepted and not a.broken and not a.rejoin
               for a in self.attempt_list):
            return
        self._enter_fallback(why, time.monotonic())

    def _enter_fallback(self, why: str, now: float) -> None:
        if self.outcome is GoalOutcome.FALLBACK or not self.outcome.open:
            return
        self.outcome = GoalOutcome.FALLBACK
        self.report.fallback_reason = why
        self.poll_due = now
        self.client.io.count("fallbacks")
        self.client.io.fallback_subs()

    def _poll(self, now: float) -> None:
        c = self.client
        if self.poll_future is not None:
            if now - self.poll_sent_at < c.poll_timeout:
                return
            c.io.drop_poll(self.poll_future)  # the planner went away with our request
            self.poll_future = None
        if now < self.poll_due:
            return
        fut = c.io.send_poll(self.report)
        if fut is None:  # the service is not ready
            return
        self.poll_sent_at = now
        self.report.polls += 1
        c.io.count("polls")
        self.poll_future = fut

    def _flush(self, how: str, *, final: bool = False) -> None:
        """Deliver the held segments that continue the delivered prefix. ``final``: the task is over; what
        is held beyond a gap is never delivered (a robot must not run a plan with a hole in it): the gap goes
        to ``missing``, the held segments to ``undelivered``."""
        r, held = self.report, self.held
        while self.next in held:
            seg = held.pop(self.next)
            self.next += 1
            self._deliver(seg, how)
        if final and held:
            r.missing.extend(i for i in range(max(self.next, 0), max(held)) if i not in held)
            r.undelivered = [held[i] for i in sorted(held)]
            held.clear()

    def _deliver(self, seg: Any, how: str) -> None:
        r = self.report
        r.segments.append(seg)
        if how == "feedback":
            r.from_feedback += 1
        elif how == "result":
            r.from_result += 1
        elif how == SOURCE_SERVICE:
            r.from_service += 1
        else:
            r.from_topic += 1
        if r.t_first_segment is None:
            r.t_first_segment = time.monotonic()
        if r.on_segment is not None:
            try:
                r.on_segment(seg)
            except Exception as e:  # noqa: BLE001 - a user callback must not break delivery
                self.client.io.log("error", f"on_segment of task {r.task_id} raised {e!r}")

    def _settle(self, now: float) -> None:
        """Take the candidate result, or wait for better: the action's own result (every segment) usually
        follows within ``result_grace``; a rejoin's within ``goal_response_timeout``. While the action still
        looks alive, a candidate with segments missing turns into a fallback (and a rejoin) first."""
        if self.candidate is None or not self.outcome.open:
            return
        c = self.client
        msg, source, until = self.candidate
        missing = len(self.report.segments) < msg.num_segments
        if self.outcome is not GoalOutcome.FALLBACK:
            if now < until:
                return
            if missing:
                self._enter_fallback("the planner finished the task; its action result did not come", now)
                self.candidate = (msg, source, now + c.goal_response_timeout + c.result_grace)
                return
        elif now < until and (missing or self._rejoin_pending()):
            return
        self.candidate_n = int(msg.num_segments)
        self._finish(c.io.to_result(msg), source)

    def _rejoin_pending(self) -> bool:
        """A rejoin attempt that may still bring the action result (with every segment)."""
        now = time.monotonic()
        for a in self.attempt_list:
            if not a.rejoin or a.broken:
                continue
            if a.result_future is not None:
                if not a.result_future.done():
                    return True
            elif not a.responded and now - a.sent_at < self.client.goal_response_timeout:
                return True
        return False

    def _maybe_rejoin(self, now: float) -> None:
        """The planner holds the task: re-send the same goal to join it (once per server instance, again only if
        that re-send went unanswered, e.g. sent before the new server's endpoints matched ours)."""
        c = self.client
        if (self.outcome is not GoalOutcome.FALLBACK or not self.report.robot_id or not c.server.ready
                or self._rejoin_pending()):
            return
        if self.rejoined_epoch == c.server.epoch and (self.rejoins_in_epoch >= 3 or any(
                a.rejoin and a.responded and not a.broken for a in self.attempt_list)):
            return
        if self.rejoined_epoch == c.server.epoch:
            self.rejoins_in_epoch += 1
        else:
            self.rejoins_in_epoch = 1
        self._send_attempt(now, rejoin=True)
        if self.candidate is not None:  # give the joined goal's result (every segment) time to come
            msg, source, until = self.candidate
            self.candidate = (msg, source, max(until, now + c.goal_response_timeout))

    def _finish(self, result: Any, source: str) -> None:
        r = self.report
        for s in result.segments:
            if s.segment_index >= self.next and s.segment_index not in self.held:
                self.held[s.segment_index] = s
        self._flush("result", final=True)
        if source != SOURCE_ACTION:
            result.segments = list(r.segments)
        n = self.candidate_n if self.candidate_n is not None else len(result.segments)
        hi = max((x.segment_index for x in r.undelivered), default=self.next - 1)
        r.missing.extend(range(hi + 1, n))
        r.complete = not r.missing and not r.undelivered and len(r.segments) >= n
        r.result, r.source = result, source
        self._close(GoalOutcome.of_code(result.status))

    def _fail(self, kind: GoalOutcome, message: str) -> None:
        if not self.outcome.open:
            return
        r = self.report
        self._flush("feedback", final=True)
        r.error_kind, r.error = kind, message
        if kind is GoalOutcome.TIMEOUT and self.client.cancel_on_timeout:
            for a in self.attempt_list:
                if a.goal_handle is not None and a.goal_handle.accepted:
                    try:
                        a.goal_handle.cancel_goal_async()
                    except Exception:  # noqa: BLE001
                        pass
        self._close(kind)

    def _close(self, outcome: GoalOutcome) -> None:
        r, c = self.report, self.client
        self.outcome = outcome
        r.t_done = time.monotonic()
        if self.poll_future is not None:
            c.io.drop_poll(self.poll_future)
            self.poll_future = None
        c.io.unregister(r)
        self.event.set()
        if r.on_done is not None:
            try:
                r.on_done(r)
            except Exception as e:  # noqa: BLE001
                c.io.log("error", f"on_done of task {r.task_id} raised {e!r}")
