"""What a robot saw of one task, and the one definition of each figure measured on it.

The simulator, the live demo (``ros.workload_client``), the bag reader (``bags.records``) and the
planner's action result all measure through the functions here, so a figure means the same thing
in every table (design §2, §8):

- response time = W(s_0): from the task's arrival to the start of execution of its first segment;
- W(s_k), k >= 1: from the end of execution of the previous segment to the start of s_k, for each
  segment that holds a skill call (a pure-syntax closer such as ``};`` gives the robot nothing to
  do, so nothing waits on it);
- robot waiting time = W(s_0) + sum_{k>=1} W(s_k) over those segments: the time the robot stood
  idle with its task unfinished. With a robot that runs its segments back to back this is
  completion - execution (design §8);
- utility per segment (paper Eq. 3): TUF_0(W(s_0)), then TUF_1(W(s_k)); a task's utility is their
  sum, and every utility is also reported divided by beta.

Only segments the robot actually started count, at the time it started them: a task's figures are
taken over its segments up to the first one that never started (refused, preempted before it began,
or never reported). A task none of whose segments started has no response time or utility (None), is
not "served", counts as a miss, and counts 0 in the all-tasks columns.

Every W is clamped at 0 (a negative gap is clock skew between robot and planner, not time gained).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from timelyllm_ros.domain.tuf import TimeUtility
from timelyllm_ros.domain.types import DEGRADED_PREFIX, TaskResult, TaskStatus

# One segment as the robot ran it: (start of execution, end of execution, holds a skill call).
Span = tuple[float, float, bool]


def wait_time(ready: float, start: float) -> float:
    """W: from when the robot was ready for a segment (arrival, or the previous segment's end) to its start."""
    w = start - ready
    return w if w > 0.0 or math.isnan(w) else 0.0


def response_time(arrival: float, first_start: float) -> float:
    """W(s_0): from the task's arrival to the start of execution of its first segment."""
    return wait_time(arrival, first_start)


def segment_waits(arrival: float, spans: Iterable[Span]) -> list[float]:
    """[W(s_0), W(s_k) of each later segment that holds a skill call], in order."""
    out: list[float] = []
    prev_end = arrival
    for i, (start, end, skills) in enumerate(spans):
        if i == 0 or skills:
            out.append(wait_time(prev_end, start))
            prev_end = end
    return out


def robot_waiting_time(arrival: float, spans: Iterable[Span]) -> float:
    """Robot waiting time: the sum of :func:`segment_waits` (0 when nothing was executed)."""
    return sum(segment_waits(arrival, spans))


def segment_utilities(tuf: TimeUtility, waits: Sequence[float]) -> list[float]:
    """The terms of Eq. 3 for one task's :func:`segment_waits` (the per-segment rule is
    :meth:`TimeUtility.utility`: TUF_0 for s_0, TUF_1 after)."""
    return [tuf.utility(k, w) for k, w in enumerate(waits)]


def result_robot_waiting(res: TaskResult) -> float:
    """Robot waiting time as the planner knows it when it ends a task (the action result's field).

    The same definition as the records', on the planner's clock: a segment starts at its predicted
    start and ends at its reported end (predicted where not reported); segments never sent count
    nothing. The core's response time is s_0's predicted start minus the arrival, which gives the
    arrival back, so W(s_0) here is the result's own ``response_time``."""
    spans: list[Span] = []
    for s in res.segments:
        if s.dispatch is None:
            break
        start = s.pred_start if s.pred_start is not None else s.dispatch
        end = s.end if s.end is not None else start
        spans.append((start, end, bool(s.calls)))
    if not spans or res.response_time is None:
        return 0.0
    return robot_waiting_time(spans[0][0] - res.response_time, spans)


@dataclass
class SegRecord:
    """One segment as the robot saw it (times on the measuring side's clock, seconds)."""

    index: int
    text: str
    skills: int  # number of skill calls (0: pure syntax such as '};')
    dispatch: float
    recv: float
    start: float = float("nan")  # NaN: never started
    end: float = float("nan")
    exec_s: float = 0.0
    preempted: str = ""  # why the robot stopped it or never ran it (a preempting task, a refusal)

    @property
    def started(self) -> bool:
        return math.isfinite(self.start)

    @property
    def span(self) -> Span:
        return (self.start, self.end, self.skills > 0)


@dataclass
class TaskRecord:
    """One task from arrival to its terminal status, with the segments its robot executed."""

    job_id: int
    trace_id: int
    task_type: str
    robot_type: str
    level: str
    agent_id: int
    arrival: float
    alpha: float
    beta: float
    ert: float
    status: str = "pending"  # a TaskStatus value once it ended
    reason: str = ""
    finished: float = float("nan")  # planner's terminal result time
    segments: list[SegRecord] = field(default_factory=list)
    plan: str = ""

    @property
    def tuf(self) -> TimeUtility:
        return TimeUtility(alpha=self.alpha, beta=self.beta, ert=self.ert, level=self.level)

    @property
    def ran(self) -> list[SegRecord]:
        """The segments the robot started, in order, up to the first one it did not start."""
        out = []
        for s in self.segments:
            if not s.started:
                break
            out.append(s)
        return out

    @property
    def served(self) -> bool:
        """The robot started at least one segment (the served-only columns average over these)."""
        return bool(self.segments) and self.segments[0].started

    @property
    def done(self) -> bool:
        return self.status == TaskStatus.DONE

    @property
    def degraded(self) -> bool:
        """Ended done with only its mandatory part, the rest of its plan left out under overload
        (TaskResult.degraded). It counts as done: its figures are those of the segments its robot ran, so Eq. 3
        has no term for a segment left out, and TUF_0 cannot see the rest at all (the metrics count these)."""
        return self.done and self.reason.startswith(DEGRADED_PREFIX)

    # -- derived metrics (robot-side times), all through the module's functions ----------------
    @property
    def response_time(self) -> float | None:
        """W(s_0), see :func:`response_time`; None when nothing was executed."""
        return response_time(self.arrival, self.segments[0].start) if self.served else None

    def waits(self) -> list[float]:
        """W(s_0) and the W(s_k) of later started segments holding a skill, see :func:`segment_waits`."""
        return segment_waits(self.arrival, (s.span for s in self.ran))

    @property
    def robot_waiting(self) -> float | None:
        """Robot waiting time, see :func:`robot_waiting_time`; None when nothing was executed."""
        return robot_waiting_time(self.arrival, (s.span for s in self.ran)) if self.served else None

    @property
    def missed(self) -> bool:
        """The first segment started after its deadline (TimeUtility.deadline), or never started."""
        return not self.served or self.segments[0].start > self.tuf.deadline(0, self.arrival)

    def utility(self) -> float | None:
        """TUF_0(W(s_0)), raw (negative past the cut-off); None when nothing was executed."""
        rt = self.response_time
        return None if rt is None else self.tuf.utility(0, rt)

    def segment_utilities(self) -> list[float]:
        """The Eq. 3 terms of this task, one per entry of :meth:`waits`."""
        return segment_utilities(self.tuf, self.waits()) if self.served else []

    def total_utility(self) -> float | None:
        """Paper Eq. 3 objective: TUF_0(W(s_0)) + sum_k TUF_1(W(s_k)); None when nothing was executed."""
        us = self.segment_utilities()
        return sum(us) if us else None

    def utility_all(self) -> float:
        """TUF_0(W(s_0)) / beta counting the task as the all-tasks columns do: 0 unless it ended done."""
        u = self.utility() if self.done else None
        return 0.0 if u is None else u / self.beta

    def total_utility_all(self) -> float:
        """Eq. 3 over the task as the all-tasks columns count it: 0 unless it ended done."""
        u = self.total_utility() if self.done else None
        return 0.0 if u is None else u

    @property
    def completion_time(self) -> float | None:
        """From arrival to the end of the last segment that ran (None when nothing ran, or its end is unknown)."""
        ran = self.ran
        end = ran[-1].end if ran else math.nan
        return end - self.arrival if math.isfinite(end) else None

    @property
    def exec_time(self) -> float:
        return sum(s.exec_s for s in self.ran)


__all__ = ["SegRecord", "Span", "TaskRecord", "response_time", "result_robot_waiting", "robot_waiting_time",
           "segment_utilities", "segment_waits", "wait_time"]
