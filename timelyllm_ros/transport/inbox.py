"""The robot side of the delivery contract: deduplicate, reorder and hold plan segments.

The planner re-sends every segment until the robot acknowledges it (README,
"Delivery guarantees"), so a robot sees duplicates, and -- a re-sent segment
racing a newer one -- segments out of order. :class:`SegmentInbox` turns that
stream into what an executor may act on:

* **at most once**: a (task_id, segment_index) pair is released (or refused)
  once; every later copy is a duplicate, acknowledged by the caller and
  otherwise ignored. So no segment runs twice and none is reported twice, and a
  duplicate segment 0 of an old task never preempts or restarts anything;
* **in order**: the segments of a task are released strictly by index. One
  that arrives early (k while k-1 is missing) is held until the gap fills;
* **bounded waiting**: a gap that does not fill within ``reorder_timeout_s``
  (typically: segment 0 of a task never arrived) ends the task: its held
  segments come back from :meth:`SegmentInbox.expired` as refused, with a
  reason naming the missing segment, and its later segments are refused at
  once;
* **end of plan**: a segment with ``is_final`` closes the plan; an end marker
  (``is_final`` with empty text, see ``interfaces.is_end_marker``) says the plan
  ended after ``index - 1``. The marker is released in order like a segment
  (the caller closes the task when it reaches it, runs nothing and reports
  nothing); a segment beyond the end is refused;
* **bounded memory**: at most ``max_tasks`` tasks are remembered (least
  recently offered forgotten first), at most ``max_per_task`` segments held or
  remembered as refused per task.

Pure Python, no ROS: a robot's :class:`~timelyllm_ros.transport.session.RobotSession`
holds one, for the real executors (``ros/executor_base.py``) and the simulated
fleet (``ros/sim_fleet_node.py``) alike, under the host's lock; it is not
thread-safe by itself.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from timelyllm_ros.interfaces import is_end_marker

# As long as the planner's default delivery_timeout_s: the planner keeps re-sending a missing segment that
# long, so a robot that gave up sooner refused plans that were still on their way (seen with 5 s on a busy host).
DEFAULT_REORDER_TIMEOUT_S = 30.0
DEFAULT_MAX_TASKS = 512
DEFAULT_MAX_PER_TASK = 1024


@dataclass(frozen=True)
class ReceivedSegment:
    """One segment as released by the inbox.

    ``refused`` empty: run it now (in the order released; an end marker closes
    the task instead). ``refused`` set: never run it, report it failed with
    that reason. ``payload`` is whatever the caller offered (e.g. the message).
    """

    task_id: str
    index: int
    text: str = ""
    is_final: bool = False
    payload: Any = None
    refused: str = ""

    @property
    def is_end_marker(self) -> bool:
        """is_final with no text: the plan ended after the previous segment."""
        return is_end_marker(self.text, self.is_final)


@dataclass
class _Task:
    next_index: int = 0  # every index below it has been released (or refused while the task ended)
    held: dict[int, ReceivedSegment] = field(default_factory=dict)  # early arrivals, waiting for the gap to fill
    hold_since: float | None = None  # when the current gap started being waited on
    end: int | None = None  # indexes >= end are after the plan's end
    ended: str = ""  # why the task ended (its new segments are refused with this reason)
    refused: set[int] = field(default_factory=set)  # indexes >= next_index refused once (duplicates after)


def _after_end(task_id: str, index: int, end: int) -> str:
    return f"segment {index} of task {task_id} comes after the end of its plan (segment {end - 1} was its last)"


class SegmentInbox:
    """Dedup, order and hold the segments of one robot (see the module docstring for the why)."""

    def __init__(self, reorder_timeout_s: float = DEFAULT_REORDER_TIMEOUT_S, *, max_tasks: int = DEFAULT_MAX_TASKS,
                 max_per_task: int = DEFAULT_MAX_PER_TASK) -> None:
        if not reorder_timeout_s > 0:
            raise ValueError(f"reorder_timeout_s: must be > 0, got {reorder_timeout_s}")
        if max_tasks < 1 or max_per_task < 1:
            raise ValueError(f"max_tasks and max_per_task must be >= 1, got {max_tasks}, {max_per_task}")
        self.reorder_timeout_s = float(reorder_timeout_s)
        self.max_tasks = max_tasks
        self.max_per_task = max_per_task
        self._tasks: OrderedDict[str, _Task] = OrderedDict()  # least recently offered first
        self._forgotten: list[ReceivedSegment] = []  # held segments of evicted tasks, refused by the next expired()

    # -- queries ----------------------------------------------------------------------------
    def is_duplicate(self, task_id: str, index: int) -> bool:
        """Whether (task_id, index) was offered before (released, held or refused): ignore it, just ack."""
        st = self._tasks.get(task_id)
        return st is not None and (index < st.next_index or index in st.held or index in st.refused)

    def ended_reason(self, task_id: str) -> str:
        """Why the task ended ("" if it has not, or is not remembered)."""
        st = self._tasks.get(task_id)
        return st.ended if st is not None else ""

    def held_count(self) -> int:
        return sum(len(st.held) for st in self._tasks.values())

    def task_count(self) -> int:
        return len(self._tasks)

    def next_deadline(self) -> float | None:
        """The earliest time at which :meth:`expired` will refuse something (None: nothing is held)."""
        times = [st.hold_since + self.reorder_timeout_s for st in self._tasks.values()
                 if st.held and st.hold_since is not None]
        if self._forgotten:
            times.append(float("-inf"))
        return min(times) if times else None

    # -- arrivals ------------------------------------------------------------------------------
    def offer(self, task_id: str, index: int, text: str = "", is_final: bool = False, now: float = 0.0,
              payload: Any = None) -> list[ReceivedSegment]:
        """One received segment; returns what can be acted on now, in order.

        Empty list: a duplicate, or held (an earlier segment is missing). Otherwise the
        segments now ready (this one and held ones it unblocked, by index) and/or
        refused ones (``ReceivedSegment.refused`` set: the task has ended, the segment is after
        the plan's end, or too many are held).
        """
        index = int(index)
        if index < 0:
            raise ValueError(f"segment index must be >= 0, got {index}")
        if self.is_duplicate(task_id, index):
            return []
        st = self._task(task_id)
        seg = ReceivedSegment(task_id, index, text, bool(is_final), payload)
        if st.ended:
            return [self._refuse_new(st, seg, st.ended)]
        if st.end is not None and index >= st.end:
            return [self._refuse_new(st, seg, _after_end(task_id, index, st.end))]
        out: list[ReceivedSegment] = []
        if seg.is_final:  # the plan's end is known now: held segments beyond it can never run
            st.end = index if seg.is_end_marker else index + 1
            for k in sorted(k for k in st.held if k >= st.end):
                out.append(self._refuse_new(st, st.held.pop(k), _after_end(task_id, k, st.end)))
        if index != st.next_index:
            if len(st.held) >= self.max_per_task:
                out.append(self._refuse_new(st, seg, f"segment {index} of task {task_id}: more than "
                                                     f"{self.max_per_task} segments held waiting for segment "
                                                     f"{st.next_index}"))
            else:
                if not st.held:
                    st.hold_since = now
                st.held[index] = seg
            return out
        out.append(seg)
        st.next_index += 1
        while st.next_index in st.held:
            out.append(st.held.pop(st.next_index))
            st.next_index += 1
        st.hold_since = now if st.held else None  # progress: the wait for the next gap starts now
        return out

    # -- endings ---------------------------------------------------------------------------------
    def expired(self, now: float) -> list[ReceivedSegment]:
        """Held segments whose gap did not fill within ``reorder_timeout_s``: report them failed.

        Their task ends (its later segments are refused with the same reason); the
        reason names the missing segment, e.g. ``segment 0 of task X never arrived
        within 5.0 s``. Also returns the held segments of tasks forgotten to bound memory.
        """
        out, self._forgotten = self._forgotten, []
        for task_id, st in self._tasks.items():
            if st.held and st.hold_since is not None and now - st.hold_since >= self.reorder_timeout_s:
                reason = (f"segment {st.next_index} of task {task_id} never arrived within "
                          f"{self.reorder_timeout_s} s")
                out.extend(self._end(st, reason))
        return out

    def end_task(self, task_id: str, reason: str) -> list[ReceivedSegment]:
        """The caller ended the task (preempted, failed, emergency stop): returns its held segments, refused.

        Its later segments are refused with ``reason`` (the first reason given is kept).
        """
        return self._end(self._task(task_id), reason)

    def refuse(self, task_id: str, index: int, reason: str) -> list[ReceivedSegment]:
        """The caller refused (task_id, index) without offering it (wrong robot, emergency stop active).

        Records it (its copies become duplicates) and ends the task with ``reason``;
        returns the task's held segments, refused.
        """
        st = self._task(task_id)
        if index >= st.next_index and len(st.refused) < self.max_per_task:
            st.refused.add(int(index))
        return self._end(st, reason)

    # -- internals ---------------------------------------------------------------------------------
    def _task(self, task_id: str) -> _Task:
        st = self._tasks.get(task_id)
        if st is None:
            st = self._tasks[task_id] = _Task()
            while len(self._tasks) > self.max_tasks:
                old_id, old = self._tasks.popitem(last=False)
                reason = f"task {old_id} forgotten: more than {self.max_tasks} tasks in this robot's memory"
                self._forgotten.extend(ReceivedSegment(s.task_id, s.index, s.text, s.is_final, s.payload, reason)
                                       for _, s in sorted(old.held.items()))
        else:
            self._tasks.move_to_end(task_id)
        return st

    def _refuse_new(self, st: _Task, seg: ReceivedSegment, reason: str) -> ReceivedSegment:
        if len(st.refused) < self.max_per_task:  # beyond: a copy may be refused (reported) again
            st.refused.add(seg.index)
        return ReceivedSegment(seg.task_id, seg.index, seg.text, seg.is_final, seg.payload, reason)

    def _end(self, st: _Task, reason: str) -> list[ReceivedSegment]:
        if not st.ended:
            st.ended = reason
        held = [self._refuse_new(st, s, st.ended) for _, s in sorted(st.held.items())]
        st.held.clear()
        st.hold_since = None
        return held


class ReportCache:
    """The last SegmentDone report of each finished segment (bounded), so a re-sent copy of a segment the
    robot already finished is answered with its report again: a report published while no planner was
    listening (a planner restart) is not lost, because the restarted planner re-sends what it has no
    report for."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._reports: OrderedDict[tuple[str, int], Any] = OrderedDict()

    def put(self, task_id: str, index: int, report: Any) -> None:
        self._reports[(task_id, int(index))] = report
        self._reports.move_to_end((task_id, int(index)))
        while len(self._reports) > self.max_entries:
            self._reports.popitem(last=False)

    def get(self, task_id: str, index: int) -> Any | None:
        return self._reports.get((task_id, int(index)))
