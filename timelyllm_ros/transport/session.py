"""One robot's half of the delivery contract, the same for every host: the real executors
(``ros/executor_base.py``) and the simulated fleet (``ros/sim_fleet_node.py``).

A :class:`RobotSession` holds what decides, for each received copy of a segment, whether it runs, waits or is
refused: the :class:`~timelyllm_ros.transport.inbox.SegmentInbox` (at most once, in order, bounded holding), the one
task the robot runs, the queue of that task's released segments and end markers, and the reports of segments
already reported (a re-sent copy means the planner has none: the host sends it again). One task per robot: segment
0 of another task while the current one is active (its plan has not run to its end) preempts it.

The host runs what :meth:`next` hands it, in order, and says when each segment ended (:meth:`ran`); it acts on
what the session returns: :class:`Refusal` (report the segment failed with a zero start, never run it; end
markers are never reported) and, on preemption, the reason to stop what runs now. Pure Python, not thread-safe:
the host calls it under its own lock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from timelyllm_ros.transport.inbox import DEFAULT_REORDER_TIMEOUT_S, ReceivedSegment, ReportCache, SegmentInbox

DEFAULT_REPORTS_KEPT = 4096


@dataclass(frozen=True)
class Refusal:
    """A segment that never started: report it failed with ``reason`` and a zero start (an end marker, which the
    host tells by its message, is never reported)."""

    payload: Any
    reason: str


@dataclass
class Arrival:
    """What one received copy changed. ``duplicate``: already released or refused (``report``: its cached report,
    to publish again). ``preempted``: the reason the task that was active ends now (the host stops what runs
    and reports it failed with this reason; its queued segments are among ``refused``)."""

    duplicate: bool = False
    report: Any = None
    refused: list[Refusal] = field(default_factory=list)
    preempted: str = ""


def _refusals(segs: list[ReceivedSegment]) -> list[Refusal]:
    return [Refusal(s.payload, s.refused) for s in segs]


class RobotSession:
    """Dedup, order, hold, one task at a time and preemption for one robot (module doc)."""

    def __init__(self, reorder_timeout_s: float = DEFAULT_REORDER_TIMEOUT_S, *,
                 reports_kept: int = DEFAULT_REPORTS_KEPT) -> None:
        # also remembers why tasks ended, so a late or duplicate segment of an old task never preempts or restarts
        self.inbox = SegmentInbox(reorder_timeout_s)
        self.reports = ReportCache(max_entries=reports_kept)
        self.queue: deque[Any] = deque()  # released payloads (segments and end markers) of ``task``, in order
        self.task: str | None = None  # the task whose segments are accepted now
        self.task_open = False  # its plan has not run to its end (final segment or end marker not reached yet)

    def receive(self, task_id: str, index: int, text: str, is_final: bool, now: float, payload: Any, *,
                refuse: str = "") -> Arrival:
        """One received copy. ``refuse``: the host will not run it (an emergency stop, another robot's segment):
        it and the task's later segments are refused with this reason."""
        if self.inbox.is_duplicate(task_id, index):
            return Arrival(duplicate=True, report=self.reports.get(task_id, index))
        out = Arrival()
        if refuse:
            out.refused = [Refusal(payload, refuse), *_refusals(self.inbox.refuse(task_id, index, refuse))]
            return out
        for seg in self.inbox.offer(task_id, index, text, is_final, now, payload=payload):
            self._accept(seg, out)
        return out

    def _accept(self, seg: ReceivedSegment, out: Arrival) -> None:
        if seg.refused:
            out.refused.append(Refusal(seg.payload, seg.refused))
        elif seg.task_id == self.task:
            self.queue.append(seg.payload)
        elif seg.index == 0:
            if seg.is_end_marker:  # an empty plan: nothing to run, nothing to preempt
                return
            if self.task is not None and self.task_open:
                out.preempted = f"preempted by task {seg.task_id}"
                out.refused += self._end_current(out.preempted)
            self.task, self.task_open = seg.task_id, True
            self.queue.append(seg.payload)
        else:  # the inbox releases k > 0 only after 0, so the task was replaced meanwhile
            reason = f"segment {seg.index} of task {seg.task_id}, which this robot no longer runs"
            out.refused.append(Refusal(seg.payload, reason))
            out.refused += _refusals(self.inbox.end_task(seg.task_id, reason))

    def _end_current(self, reason: str) -> list[Refusal]:
        """The current task ends here: its held segments and its queue are refused with ``reason``."""
        out = _refusals(self.inbox.end_task(self.task, reason)) if self.task is not None else []
        out += [Refusal(p, reason) for p in self.queue]
        self.queue.clear()
        self.task_open = False
        return out

    def expire(self, now: float) -> list[Refusal]:
        """Held segments whose gap did not fill within the reorder timeout."""
        return _refusals(self.inbox.expired(now))

    def next(self) -> Any | None:
        """The next payload to run (or an end marker to reach), None when nothing is queued."""
        return self.queue.popleft() if self.queue else None

    def reached_end(self, task_id: str) -> None:
        """An end marker reached the head of the queue: every earlier segment has run, the plan is over."""
        if self.task == task_id:
            self.task_open = False

    def ran(self, task_id: str, index: int, is_final: bool, ok: bool, error: str = "") -> list[Refusal]:
        """A segment ended. Failed: the task ends at it (the planner ends a task at its first failure), its held
        and queued segments are refused. The final one: the plan ran to its end."""
        if not ok:
            refused = _refusals(self.inbox.end_task(task_id, f"task ended at segment {index}: {error}"))
            if self.task == task_id:
                refused += self._end_current(self.inbox.ended_reason(task_id))
            return refused
        if is_final and self.task == task_id:
            self.task_open = False
        return []

    def end_all(self, reason: str) -> list[Refusal]:
        """Everything queued, and the held segments of an active task, are refused (an emergency stop)."""
        if self.task_open:
            return self._end_current(reason)
        out = [Refusal(p, reason) for p in self.queue]
        self.queue.clear()
        return out

