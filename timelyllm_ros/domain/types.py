"""The domain types every layer shares: a task as submitted, the segments it produced, how it ended.
(Its generation's scheduler-side state is the planner's own: planner/generation.py.)

Imports nothing from timelyllm_ros but the TUF, so the scheduler, policies, admission, simulator,
metrics, bags and ROS nodes all read one definition.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from timelyllm_ros.domain.tuf import TimeUtility


class TaskStatus(enum.StrEnum):
    QUEUED = "queued"  # waiting for its first segment
    RUNNING = "running"  # in the engine's batch
    SUSPENDED = "suspended"  # between segments
    DONE = "done"  # every segment generated (and, where reported, executed)
    INVALID = "invalid"  # the request itself was refused: malformed, unknown robot type, bad TUF, duplicate id
    BUSY = "busy"  # refused for now, not for what it asked: planner at capacity or its engine restarting
    OVERDUE = "overdue"  # refused by the overdue policy: it could no longer earn positive utility
    FAILED = "failed"  # generation or validation failed, or the engine broke
    ROBOT_FAILED = "robot_failed"  # the robot reported a failed segment, or went silent
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in STATUS_CODE


# The one wire table: TaskStatus <-> the STATUS_* codes of PlanResult and PlanTask.Result (this layer
# cannot import the generated messages; test_ros_interfaces checks the table against them).
STATUS_CODE: dict[TaskStatus, int] = {
    TaskStatus.DONE: 0,  # STATUS_SUCCEEDED
    TaskStatus.INVALID: 1,  # STATUS_REJECTED
    TaskStatus.FAILED: 2,  # STATUS_FAILED
    TaskStatus.CANCELLED: 3,  # STATUS_CANCELED
    TaskStatus.OVERDUE: 4,  # STATUS_OVERDUE
    TaskStatus.ROBOT_FAILED: 5,  # STATUS_ROBOT_FAILED
    TaskStatus.BUSY: 6,  # STATUS_BUSY
}
# How the reason of a degraded result starts (TaskResult.degraded): it ends DONE, since the robot ran what it was
# sent, and the reason says which segments were left out.
DEGRADED_PREFIX = "degraded:"
STATUS_FROM_CODE: dict[int, TaskStatus] = {v: k for k, v in STATUS_CODE.items()}
TERMINAL_STATUSES: tuple[TaskStatus, ...] = tuple(STATUS_CODE)


@dataclass
class TaskSpec:
    """A planning request as submitted by a robot (or the simulator)."""

    robot_id: str
    prompt: str
    tuf: TimeUtility
    robot_type: str = "drone"
    task_id: str | None = None
    arrival: float | None = None  # clock time of the goal's arrival at the planner; default: now
    sent: float | None = None  # clock time of the robot's own send stamp, when the goal carried one
    prompt_token_ids: list[int] | None = None  # default: engine.tokenize(prompt)
    max_new_tokens: int = 256
    max_segment_tokens: int = 64
    extra: dict = field(default_factory=dict)  # engine extras (e.g. the simulated plan)
    meta: dict = field(default_factory=dict)  # caller's bookkeeping (trace ids, ...), echoed back
    # The task's type where the caller knows it (the simulator: its template); the plan-length model keys by it,
    # else by a type derived from the text (planner/lengths.py).
    task_type: str | None = None


@dataclass
class Segment:
    index: int
    text: str
    token_ids: list[int]
    calls: list[Any]  # parsed skill calls (empty for pure syntax such as '};')
    gen_start: float  # when the generation of this segment was (re)started
    ready: float  # when the engine produced it
    dispatch: float | None = None  # when it was sent to the robot
    est_exec_s: float = 0.0  # model minimum
    max_exec_s: float = 0.0  # model maximum: a robot is silent only once it is past this
    pred_start: float | None = None
    pred_end: float | None = None
    real_end: float | None = None  # reported by the robot
    success: bool | None = None
    final: bool = False
    error: str = ""
    probed: bool = False  # its report was asked for again (see PlannerCore.unreported)
    # Restored after a planner restart: reports sent while the planner was down are lost, so the robot's
    # silence about this segment counts from here, not from its predicted end.
    silence_from: float | None = None

    def silence_base(self) -> float:
        """Since when the robot's silence about this segment counts: the latest it can end by the model (its
        predicted start + the model's maximum; the predicted end, planned with the minimum, at the least), or
        the restart. A scan the model allows 12 s for was failed as silent at 1.2 s + the timeout."""
        assert self.pred_end is not None
        latest = self.pred_end if self.pred_start is None else max(self.pred_end, self.pred_start + self.max_exec_s)
        return latest if self.silence_from is None else max(latest, self.silence_from)

    @property
    def end(self) -> float | None:
        return self.real_end if self.real_end is not None else self.pred_end

    def predict(self, comm_s: float, prev_end: float | None) -> None:
        """Predict when this dispatched segment runs: it starts once it has reached its robot (``dispatch +
        comm_s``) and the segment before it has ended (``prev_end``, reported or predicted; None: the first),
        and takes its model minimum."""
        assert self.dispatch is not None
        arrive = self.dispatch + comm_s
        self.pred_start = arrive if prev_end is None else max(arrive, prev_end)
        self.pred_end = self.pred_start + self.est_exec_s


@dataclass
class TaskResult:
    task_id: str
    robot_id: str
    status: TaskStatus
    plan: str
    segments: list[Segment]
    response_time: float | None  # W(s_0) as the planner predicts it (dispatch + comm - arrival)
    utility: float | None  # TUF_0(response_time); None when nothing was sent
    reason: str = ""  # why it failed / was rejected / cancelled
    meta: dict = field(default_factory=dict)
    robot_type: str = "drone"
    response_time_from_send: float | None = None  # W(s_0) measured from the robot's send stamp

    @property
    def degraded(self) -> bool:
        """Ended DONE with only its mandatory part: the planner left the optional rest of the plan out under
        overload (a degrading policy, planner/policies.py). Read from the status and reason, which every layer
        carries (the action result's and /plan_results' message, the journal), so no wire change is needed."""
        return self.status is TaskStatus.DONE and self.reason.startswith(DEGRADED_PREFIX)
