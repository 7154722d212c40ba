"""Task records from planner traffic, and the metrics report over them.

One :class:`RecordBuilder` turns the planner's messages (TaskRequest,
PlanSegment, SegmentDone; rclpy messages or rosbags dataclasses alike) into
the core's :class:`~timelyllm_ros.measure.records.TaskRecord`, and
:func:`timelyllm_ros.measure.metrics.summarize` computes the report (every figure as
:mod:`timelyllm_ros.measure.records` defines it, as for the simulator and the live demo). The live
collector (``timelyllm_ros.ros.live_metrics``) and the bag reader feed the
same builder, so a bag's numbers equal the live numbers of the same run.

Times are robot-side, as in the simulator: arrival = TaskRequest.stamp (the
planner's receive time), a segment's start/end = its SegmentDone start/finish.
A segment the robot never reported is left out of its task (it was not seen
executing). Status, a TaskStatus value: "invalid" (the planner refused the goal),
"robot_failed" (a robot reported a failed segment), the planner's PlanResult when it
ended a task otherwise (overdue, cancelled, failed), "done" (every segment executed and the
plan is finished: a PlanResult, a final segment, or a syntactically complete
plan for bags recorded before /plan_results existed), else "incomplete"
(still running when the recording ended).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from timelyllm_ros.domain.plans import template_by_text
from timelyllm_ros.domain.tuf import LEVELS
from timelyllm_ros.domain.types import STATUS_CODE, STATUS_FROM_CODE, TaskStatus
from timelyllm_ros.measure.metrics import Summary, summarize
from timelyllm_ros.measure.records import SegRecord, TaskRecord
from timelyllm_ros.skills.skill_files import load_skill_set

from .io import read_bag, stamp_ns
from .typestore import REQUESTS, RESULTS, SEGMENT_DONE, SEGMENTS

RECORD_TOPICS = (REQUESTS.name, SEGMENTS.name, SEGMENT_DONE.name, RESULTS.name)


def _s(t: Any) -> float:
    return stamp_ns(t) * 1e-9


def _kind(msg: Any) -> str:
    # rclpy class "TaskRequest"; rosbags dataclass "timelyllm_ros__msg__TaskRequest"
    return type(msg).__name__.rsplit("__", 1)[-1]


def resolve_tuf(tuf: Any) -> tuple[str, float, float, float]:
    """(level, alpha, beta, ert) of a TimeUtility message, as the planner reads it (tuf_from_msg)."""
    level = tuf.level.strip()
    if level in LEVELS:
        base = LEVELS[level]
        return level, tuf.alpha or base.alpha, tuf.beta or base.beta, tuf.ert or base.ert
    return (level or "custom"), tuf.alpha, tuf.beta, tuf.ert


def task_type(robot_type: str, task: str) -> tuple[int, str]:
    """(trace id, name) of the Table 2 task with this exact text, else (-1, robot type)."""
    t = template_by_text(robot_type, task)
    return (t.trace_id, t.name) if t else (-1, robot_type or "?")


def _complete(robot_type: str, plan: str) -> bool:
    """The plan parses as a complete program. The planner marks a segment final only when it knows no
    text follows; a plan that ends exactly at a segment boundary (``mu(100);ml(100);``) has its end
    known only to the action result, which is not on a topic: the grammar tells instead."""
    try:
        ss = load_skill_set(robot_type)
    except (FileNotFoundError, ValueError, KeyError):
        return False
    return ss.grammar != "text" and bool(plan.strip()) and ss.validate(plan, complete=True) is None


@dataclass
class _Task:
    request: Any
    seq: int
    segments: dict[int, Any] = field(default_factory=dict)
    done: dict[int, Any] = field(default_factory=dict)
    result: Any = None


class RecordBuilder:
    """Feed messages in arrival order (any interleaving); ``records()`` at any time."""

    def __init__(self) -> None:
        self._tasks: list[_Task] = []
        self._by_id: dict[str, _Task] = {}
        self._agents: dict[str, int] = {}
        self.orphans = 0  # segments / reports of tasks whose request was not seen

    def add(self, msg: Any, topic: str | None = None) -> None:
        kind = _kind(msg)
        if kind == "TaskRequest":
            self.add_request(msg)
        elif kind == "PlanSegment":
            self.add_segment(msg)
        elif kind == "SegmentDone":
            self.add_done(msg)
        elif kind == "PlanResult":
            self.add_result(msg)

    def add_request(self, msg: Any) -> None:
        t = _Task(msg, len(self._tasks))
        self._tasks.append(t)
        self._agents.setdefault(msg.robot_id, len(self._agents))
        if msg.accepted and msg.task_id:
            self._by_id[msg.task_id] = t

    def add_segment(self, msg: Any) -> None:
        t = self._by_id.get(msg.task_id)
        if t is None:
            self.orphans += 1
            return
        t.segments[int(msg.segment_index)] = msg

    def add_done(self, msg: Any) -> None:
        t = self._by_id.get(msg.task_id)
        if t is None:
            self.orphans += 1
            return
        t.done[int(msg.segment_index)] = msg

    def add_result(self, msg: Any) -> None:
        t = self._by_id.get(msg.task_id)
        if t is None:
            self.orphans += 1
            return
        t.result = msg

    def __len__(self) -> int:
        return len(self._tasks)

    def records(self) -> list[TaskRecord]:
        return [self._record(t) for t in self._tasks]

    def _record(self, t: _Task) -> TaskRecord:
        r = t.request
        level, alpha, beta, ert = resolve_tuf(r.tuf)
        trace_id, name = task_type(r.robot_type, r.task)
        rec = TaskRecord(job_id=t.seq, trace_id=trace_id, task_type=name, robot_type=r.robot_type, level=level,
                         agent_id=self._agents[r.robot_id], arrival=_s(r.stamp), alpha=alpha, beta=beta, ert=ert)
        if not r.accepted:
            busy = r.status == STATUS_CODE[TaskStatus.BUSY]
            rec.status, rec.reason = (TaskStatus.BUSY if busy else TaskStatus.INVALID).value, r.error
            return rec
        texts = []
        for k in sorted(t.segments):
            seg = t.segments[k]
            texts.append(seg.text)
            d = t.done.get(k)
            if d is None:
                continue
            # a zero start: the robot never started it (refused, or dropped for a preempting task)
            start, end = (_s(d.start) if stamp_ns(d.start) else math.nan), _s(d.finish)
            gen = _s(seg.stamp_generated)
            rec.segments.append(SegRecord(k, seg.text, len(seg.skills), dispatch=gen, recv=gen, start=start,
                                          end=end, exec_s=max(0.0, end - start) if math.isfinite(start) else 0.0,
                                          preempted="" if d.success else d.error))
        rec.plan = "".join(texts)
        failed = [d for d in t.done.values() if not d.success]
        final = any(s.is_final for s in t.segments.values())
        st = STATUS_FROM_CODE.get(int(t.result.status)) if t.result is not None else None
        if t.result is not None and st is not TaskStatus.DONE:
            # the planner ended it (overdue, cancelled or preempted, failed, robot failed); a code this build does
            # not know reads as failed
            rec.status, rec.reason = (st or TaskStatus.FAILED).value, t.result.message
        elif failed:
            rec.status, rec.reason = TaskStatus.ROBOT_FAILED.value, f"robot failed: {failed[0].error}"
        elif len(rec.segments) == len(t.segments) and (t.result is not None or final
                                                       or _complete(r.robot_type, rec.plan)):
            rec.status = TaskStatus.DONE.value
        else:
            rec.status = "incomplete"
        rec.finished = max((s.end for s in rec.segments), default=math.nan)
        return rec


def records_from_messages(msgs: Iterable[Any]) -> list[TaskRecord]:
    b = RecordBuilder()
    for m in msgs:
        b.add(m)
    return b.records()


def records_from_bag(path: str | Path) -> list[TaskRecord]:
    """Task records of a recorded bag (needs /plan_requests; segments and reports when recorded)."""
    return records_from_messages(m.msg for m in read_bag(path, RECORD_TOPICS))


def bag_metrics(path: str | Path) -> list[Summary]:
    """The metrics report (per task type, per urgency level, overall) of a bag alone: every request,
    refused ones included, counts in the all-tasks figures and the per-status counts."""
    return summarize(records_from_bag(path))


__all__ = ["RECORD_TOPICS", "RecordBuilder", "bag_metrics", "records_from_bag", "records_from_messages",
           "resolve_tuf", "task_type"]
