"""One PlanTask goal as :class:`~timelyllm_ros.ros.client.PlanClient` follows it: the handle a caller holds
(:class:`PlanHandle`: its outcome, the segments delivered, how they came) and the client-side errors a goal can
end with. The goal's state machine (:class:`~timelyllm_ros.ros.goal_tracking.GoalTracker`, the handle's
``tracking``) and its one vocabulary (:class:`~timelyllm_ros.ros.goal_tracking.GoalOutcome`) are in
:mod:`timelyllm_ros.ros.goal_tracking`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from timelyllm_ros.action import PlanTask
from timelyllm_ros.domain.types import TaskStatus
from timelyllm_ros.msg import PlanSegment
from timelyllm_ros.ros.convert import status_from_code, status_name, time_s
from timelyllm_ros.ros.goal_tracking import GoalOutcome, GoalReport, GoalTracker

if TYPE_CHECKING:
    from collections.abc import Callable

    from timelyllm_ros.ros.client import PlanClient


class PlanClientError(RuntimeError):
    """A goal that ended without a result from the planner; ``kind`` is its GoalOutcome (a client-side one)."""

    def __init__(self, kind: GoalOutcome | str, message: str, handle: PlanHandle | None = None) -> None:
        super().__init__(message)
        self.kind, self.handle = kind, handle


class PlanTimeoutError(PlanClientError, TimeoutError):
    """No action server, no goal response, or no result in time."""


class PlanHandle(GoalReport):
    """One goal in flight (and its outcome). Created by :meth:`PlanClient.send`.

    ``outcome`` says where it stands (a :class:`GoalOutcome`); the fields it reads after :meth:`done` are
    :class:`~timelyllm_ros.ros.goal_tracking.GoalReport`'s, written only by its ``tracking``.
    """

    def __init__(self, client: PlanClient, goal: PlanTask.Goal, on_segment: Callable[[PlanSegment], Any] | None,
                 on_done: Callable[[PlanHandle], Any] | None, timeout: float, *, by_id: bool = False) -> None:
        super().__init__(goal.task_id, goal.robot_id, on_segment, on_done, timeout)
        self.client = client
        self.goal = goal
        # the goal's send stamp (wall clock); NaN for a task followed by its id alone
        self.sent_wall: float = math.nan if by_id else time_s(goal.stamp)
        self.tracking = GoalTracker(self, client)

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
    def outcome(self) -> GoalOutcome:
        """Where the goal stands: an open phase, the planner's result (a result code this build does not know
        reads FAILED), or the client-side failure it ended with."""
        return self.tracking.outcome

    @property
    def status(self) -> TaskStatus | None:
        """How the planner ended the task (None until its result came, or for a code this build does not know)."""
        return status_from_code(self.result.status) if self.result is not None else None

    @property
    def status_name(self) -> str:
        """The outcome's value ("done", "invalid", "timeout", "sending", ...; an unknown result code as its number)."""
        if self.result is not None:
            return status_name(self.result.status)
        return str(self.outcome)

    def result_or_raise(self) -> PlanTask.Result:
        """The planner's result, or PlanClientError / PlanTimeoutError for a client-side failure."""
        if self.result is not None:
            return self.result
        if not self.done():
            raise PlanTimeoutError(GoalOutcome.TIMEOUT, f"task {self.task_id}: not finished yet", self)
        kind = self.error_kind
        cls = PlanTimeoutError if kind is not None and kind.timed_out else PlanClientError
        raise cls(kind or "error", self.error or "failed", self)

    def cancel(self) -> None:
        """Ask the planner to cancel the task (its result then comes as STATUS_CANCELED)."""
        self.tracking.cancel()

    def __repr__(self) -> str:
        return f"PlanHandle({self.task_id!r}, {self.status_name}, segments={len(self.segments)})"
