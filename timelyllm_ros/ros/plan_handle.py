"""One PlanTask goal as :class:`~timelyllm_ros.ros.client.PlanClient` follows it: the handle a caller holds
(:class:`PlanHandle`: its outcome, the segments delivered, how they came), the client's bookkeeping of the goal
(:class:`GoalState`, the handle's ``tracking``: attempts, held segments, polls, deadlines) and the client-side
errors a goal can end with.
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING, Any

from timelyllm_ros.action import PlanTask
from timelyllm_ros.domain.types import TaskStatus
from timelyllm_ros.msg import PlanResult, PlanSegment
from timelyllm_ros.ros.convert import status_from_code, status_name, time_s

if TYPE_CHECKING:
    from collections.abc import Callable

    from timelyllm_ros.ros.client import PlanClient

# Client-side failures (the planner's own outcomes, REJECTED included, are results, not errors).
ERR_NO_SERVER = "no_server"        # no PlanTask action server within server_timeout
ERR_NOT_ACCEPTED = "not_accepted"  # the action server answered the goal "not accepted"
ERR_NO_RESPONSE = "no_response"    # no goal response after max_attempts sends, and the planner never heard of it
ERR_LOST = "lost"                  # accepted, then the planner forgot the task (restarted without its journal)
ERR_TIMEOUT = "timeout"            # no terminal result within the goal's timeout
ERR_CLOSED = "closed"              # the PlanClient was destroyed first


class PlanClientError(RuntimeError):
    """A goal that ended without a result from the planner; ``kind`` is one of the ERR_* names."""

    def __init__(self, kind: str, message: str, handle: PlanHandle | None = None) -> None:
        super().__init__(message)
        self.kind, self.handle = kind, handle


class PlanTimeoutError(PlanClientError, TimeoutError):
    """No action server, no goal response, or no result in time."""


# Phases of a handle (PlanHandle.phase).
PHASE_WAIT_SERVER = "wait_server"  # no action server seen yet
PHASE_SENDING = "sending"          # goal sent, no response yet (re-sent with backoff)
PHASE_ACCEPTED = "accepted"        # following the goal through the action
PHASE_FALLBACK = "fallback"        # following the task through /plan_results, /get_plan_result, /plan_segments
PHASE_DONE = "done"


class Attempt:
    """One send of a goal (a retry or a rejoin is another) and what came back for it."""

    __slots__ = ("n", "sent_at", "rejoin", "future", "goal_handle", "result_future", "responded", "broken")

    def __init__(self, n: int, sent_at: float, rejoin: bool = False) -> None:
        self.n, self.sent_at, self.rejoin = n, sent_at, rejoin
        self.future = self.goal_handle = self.result_future = None
        self.responded = self.broken = False


class GoalState:
    """The client's bookkeeping of one goal (its attempts, held segments, polls, deadlines), guarded by ``lock``.
    A :class:`PlanHandle` carries it as ``tracking``; only :class:`PlanClient` changes it."""

    __slots__ = ("lock", "event", "phase", "attempt_list", "deadline", "server_deadline", "response_deadline",
                 "next_send_at", "epoch", "held", "next", "last_progress", "probe_due", "poll_due", "poll_future",
                 "poll_sent_at", "unknown", "candidate", "candidate_n", "rejoined_epoch", "rejoins_in_epoch",
                 "cancel_requested")

    def __init__(self, created: float, timeout: float, server_timeout: float) -> None:
        self.lock = threading.RLock()
        self.event = threading.Event()
        self.phase = PHASE_WAIT_SERVER
        self.attempt_list: list[Attempt] = []
        self.deadline = created + timeout
        self.server_deadline = created + server_timeout
        self.response_deadline = math.inf
        self.next_send_at: float | None = None
        self.epoch = -1  # server epoch of the accepting attempt
        self.held: dict[int, PlanSegment] = {}
        self.next = 0
        self.last_progress = created
        self.probe_due = math.inf
        self.poll_due = 0.0
        self.poll_future = None
        self.poll_sent_at = 0.0
        self.unknown = 0
        self.candidate: tuple[PlanResult, str, float] | None = None
        self.candidate_n: int | None = None  # num_segments of a result that came without its segments
        self.rejoined_epoch = -1  # server epoch of the last rejoin (same goal re-sent after a fallback)
        self.rejoins_in_epoch = 0
        self.cancel_requested = False


class PlanHandle:
    """One goal in flight (and its outcome). Created by :meth:`PlanClient.send`.

    After :meth:`done`: ``result`` (a ``PlanTask.Result``; rebuilt from a ``PlanResult`` when it came
    through the fallback, with ``segments`` = the segments this client saw) and ``source``, or ``error``
    / ``error_kind`` for a client-side failure. ``segments`` is what was handed to ``on_segment``, in
    order; ``complete`` says it covers the whole plan.
    """

    def __init__(self, client: PlanClient, goal: PlanTask.Goal, on_segment: Callable[[PlanSegment], Any] | None,
                 on_done: Callable[[PlanHandle], Any] | None, timeout: float) -> None:
        self.client = client
        self.goal = goal
        self.task_id: str = goal.task_id
        self.robot_id: str = goal.robot_id
        self.on_segment = on_segment
        self.on_done = on_done
        self.timeout = timeout
        self.sent_wall: float = time_s(goal.stamp)  # the goal's send stamp (wall clock)
        self.t_created = time.monotonic()
        self.t_first_segment: float | None = None  # monotonic, when on_segment got index 0 (or the first one)
        self.t_done: float | None = None
        self.attempts = 0          # goal requests sent
        self.responses = 0         # goal responses received (accepted or not)
        self.accepted = False      # some attempt was accepted by the action server
        self.result: PlanTask.Result | None = None
        self.source: str | None = None
        self.error: str | None = None
        self.error_kind: str | None = None
        self.segments: list[PlanSegment] = []
        self.from_feedback = 0     # delivered as feedback arrived
        self.from_result = 0       # filled in from the result's segments list
        self.from_topic = 0        # from /plan_segments while in fallback
        self.from_service = 0      # from /get_plan_result's segments list (fallback)
        self.missing: list[int] = []  # indices never seen (fallback only)
        self.undelivered: list[PlanSegment] = []  # seen beyond a gap, so never handed to on_segment
        self.complete = False
        self.fallback_reason: str | None = None
        self.polls = 0
        self.rejoins = 0           # the same goal re-sent in fallback, to join the task on a restarted planner
        self.tracking = GoalState(self.t_created, timeout, client.server_timeout)

    # -- public -----------------------------------------------------------------------------
    def done(self) -> bool:
        return self.tracking.event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (another thread must spin the node); True if done."""
        return self.tracking.event.wait(timeout)

    @property
    def ok(self) -> bool:
        return self.status is TaskStatus.DONE

    @property
    def status(self) -> TaskStatus | None:
        """How the planner ended the task (None until its result came, or for a code this build does not know)."""
        return status_from_code(self.result.status) if self.result is not None else None

    @property
    def status_name(self) -> str:
        """The TaskStatus value of the result ("done", "invalid", ...), else the client-side error or phase."""
        if self.result is not None:
            return status_name(self.result.status)
        return self.error_kind or self.tracking.phase

    @property
    def phase(self) -> str:
        return self.tracking.phase

    def result_or_raise(self) -> PlanTask.Result:
        """The planner's result, or PlanClientError / PlanTimeoutError for a client-side failure."""
        if self.result is not None:
            return self.result
        if not self.done():
            raise PlanTimeoutError(ERR_TIMEOUT, f"task {self.task_id}: not finished yet", self)
        cls = PlanTimeoutError if self.error_kind in (ERR_NO_SERVER, ERR_NO_RESPONSE, ERR_TIMEOUT) else PlanClientError
        raise cls(self.error_kind or "error", self.error or "failed", self)

    def cancel(self) -> None:
        """Ask the planner to cancel the task (its result then comes as STATUS_CANCELED)."""
        with self.tracking.lock:
            self.tracking.cancel_requested = True
            handles = [a.goal_handle for a in self.tracking.attempt_list
                       if a.goal_handle is not None and a.goal_handle.accepted]
        for gh in handles:
            try:
                gh.cancel_goal_async()
            except Exception:  # noqa: BLE001 - best effort
                pass

    def __repr__(self) -> str:
        return f"PlanHandle({self.task_id!r}, {self.status_name}, segments={len(self.segments)})"
