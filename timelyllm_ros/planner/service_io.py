"""What passes between the planner node (``ros/planner_node.py``) and its PlannerService (``planner/service.py``):
the plain request and answer types, and what the service needs of the node (:class:`PlannerSender` and the
node's delivery, refusal counts and logger). Pure Python: no rclpy, no message types.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from timelyllm_ros.domain.tuf import TimeUtility, TufRequest
from timelyllm_ros.domain.types import Segment, TaskResult, TaskStatus
from timelyllm_ros.interfaces import robot_id_problem
from timelyllm_ros.planner.hygiene import check_goal_fields


class Log(Protocol):
    """A logger (rclpy's or the standard library's)."""

    def debug(self, msg: str) -> Any: ...
    def info(self, msg: str) -> Any: ...
    def warning(self, msg: str) -> Any: ...
    def error(self, msg: str) -> Any: ...


class Rejections(Protocol):
    """Refused robot messages, counted per kind (``ros/delivery.RejectedMessages``)."""

    def note(self, kind: str, sender: str, why: str) -> None: ...
    def snapshot(self) -> dict[str, int]: ...


class Delivery(Protocol):
    """The planner's half of the delivery contract (``ros/delivery.SegmentDelivery``): the node sends through it,
    the service acknowledges, re-sends and gives up."""

    give_up_s: float

    def ack(self, task_id: str, index: int, now: float | None = None, robot_id: str | None = None) -> bool: ...
    def heard(self, robot_id: str, now: float) -> None: ...
    def due(self, now: float, reachable: Callable[[str], bool] | None = None) -> list[tuple[str, int, str]]: ...
    def given_up_detail(self, task_id: str, index: int) -> str: ...
    def forget_plan(self, task_id: str) -> int: ...
    def pending_for(self, robot_id: str) -> int: ...
    def unacked(self, task_id: str, index: int) -> bool: ...


class PlannerSender(Protocol):
    """The node's side of each step: it turns these plain values into messages and sends them. ``goals`` are
    the node's own goal handles, kept here only to hand back; ``skillset_id`` names the skill set of a segment's
    skills."""

    @property
    def lifecycle_state(self) -> str: ...

    def send_segment(self, task_id: str, robot_id: str, seg: Segment, skillset_id: str, goals: list[Any]) -> None:
        """A new segment: to its robot (until acknowledged), to the fleet-wide topic, as feedback to ``goals``."""

    def resend_segment(self, task_id: str, robot_id: str, seg: Segment, skillset_id: str) -> None:
        """An unreported segment to its robot again (a robot answers a copy of a finished one with its report)."""

    def send_end_marker(self, task_id: str, robot_id: str, index: int, generated: float) -> None:
        """The end of a plan (core time ``generated``) to its robot, after the last segment sent."""

    def resend_journaled(self, task_id: str, robot_id: str, seg: Segment | EndMarker, skillset_id: str) -> None:
        """A segment (as the core restores it, so with the stamp and deadline of the live message) or end marker
        journaled by a planner that died, to its robot again."""

    def finish_goals(self, goals: list[Any], res: TaskResult) -> None:
        """Complete each goal with the task's result."""

    def publish_result(self, res: TaskResult) -> None:
        """How a task ended, for everyone (/plan_results)."""

    def publish_journaled_result(self, rec: dict[str, Any]) -> None:
        """How a journaled task ended (a result record), for everyone."""


@dataclass(frozen=True)
class EndMarker:
    """A journaled end of plan: after segment ``index - 1``, first sent at ``generated`` (core time; None: a
    journal from before it was recorded)."""

    index: int
    generated: float | None


class GoalError(ValueError):
    """A goal that is refused; the message names the field and the problem. ``status``: INVALID for what the
    request asked, BUSY for the planner's state at the time (the same request may succeed later). ``task_id``:
    the task's id as refused (the one it was given, once validated)."""

    def __init__(self, message: str, status: TaskStatus = TaskStatus.INVALID, task_id: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.task_id = task_id


@dataclass(frozen=True)
class PlanRequest:
    """A request in plain values. ``arrival``: core time (None: now); ``sent_wall``: the robot's own send stamp,
    wall time (None: it gave none)."""

    task_id: str
    robot_id: str
    robot_type: str
    task: str
    tuf: TufRequest
    arrival: float | None = None
    sent_wall: float | None = None

    @property
    def key(self) -> tuple:
        """The request's content: a retry with the same task_id and key joins the task of the first."""
        t = self.tuf
        return (self.robot_id, self.robot_type, self.task, t.level, t.alpha, t.beta, t.ert)


class Accepted(NamedTuple):
    """A request taken: its task's id, its result if that task has already finished, and whether it was a retry
    that joined its task (the node announces only new requests)."""

    task_id: str
    result: TaskResult | None
    joined: bool


class TaskLookup(NamedTuple):
    """What the planner knows of a task: ``state`` 'done', 'active' or 'unknown'. One done in this run has its
    ``result``; one done before a restart its journaled ``record``, its ``robot_id`` and the ``journaled``
    segments it was sent, as the core restores them (skills parsed again). ``skillset_id``: its robot type's skill
    set."""

    state: str
    result: TaskResult | None = None
    record: dict[str, Any] | None = None
    robot_id: str = ""
    journaled: tuple[Segment, ...] = ()
    skillset_id: str = ""


@dataclass(frozen=True)
class PlannerHealth:
    """What the planner's statuses read (/diagnostics), in one snapshot: the planner's public view of its own
    state, so nothing reaches into its attributes. A planner being configured has no engine or core."""

    lifecycle_state: str | None
    engine: Any | None  # engines.base.Engine
    core: Any | None  # planner.core.PlannerCore
    engine_error: str | None  # set while the engine is down and restarting (goals are refused)
    engine_restarts: int
    engine_thread_alive: bool | None  # None: the engine thread was never started
    stopping: bool  # the planner is shutting down or deactivating its engine
    journal_file: str | None  # None: no journal (state_dir not set)
    journal_open: bool
    journal_errors: int  # journal writes that failed so far
    rejected_messages: dict[str, int] | None = None  # robot messages refused so far, per kind (ack, report, ...)


def request_tuf(robot_types: list[str], max_task_chars: int, task_id: str, robot_id: str, robot_type: str,
                 task: str, tuf: TufRequest) -> TimeUtility:
    """The checks of a request's own fields that cost nothing (no tokenizer): its TUF, or GoalError."""
    try:
        check_goal_fields(robot_id, task_id, task)
    except ValueError as e:  # the hygiene checks name the field, the character and its position
        raise GoalError(str(e)) from None
    if not robot_id.strip():
        raise GoalError("robot_id: must not be empty")
    problem = robot_id_problem(robot_id)  # it names a topic: refused here, not failed at publishing
    if problem is not None:
        raise GoalError(f"robot_id: {problem}")
    if robot_type not in robot_types:
        raise GoalError(f"robot_type: unknown {robot_type!r}; this planner serves {robot_types}")
    if not task.strip():
        raise GoalError("task: must not be empty")
    if len(task) > max_task_chars:
        raise GoalError(f"task: {len(task)} characters, more than max_task_chars={max_task_chars}")
    try:
        return tuf.resolve()
    except ValueError as e:
        raise GoalError(str(e)) from None


__all__ = ["Accepted", "Delivery", "GoalError", "Log", "PlanRequest", "PlannerHealth", "PlannerSender", "Rejections",
           "TaskLookup", "request_tuf"]
