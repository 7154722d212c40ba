"""Robot silence: the segments each task's robot has been sent and not reported, when each robot was last
heard from, and how far behind the caller reads robot reports.

A robot that keeps talking (heartbeats, acks, reports) is busy or behind, never silent, however much slower
than predicted its skill is (a drone's first scan took 16.5 s where the model allowed 12.2 s). One that sends
nothing is judged by the execution-time model: silent past the segment's longest execution + the timeout.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from timelyllm_ros.domain.types import Segment

HEARD_MAX = 50_000  # robots remembered; past it the half heard from longest ago are forgotten


class SilenceWatchdog:
    """Unreported segments per task and robot liveness. The caller holds the core's lock."""

    def __init__(self, lag_window_s: float = 10.0) -> None:
        self.lag_window_s = lag_window_s
        self._pending: dict[str, list[Segment]] = {}  # task -> dispatched segments the robot has not reported
        self._robot: dict[str, str] = {}  # task -> its robot, for the tasks in _pending
        self._heard: dict[str, float] = {}  # robot -> when its latest report or ack was read (clock time)
        self._lag = 0.0  # how far behind the caller reads robot reports (s): not the robot's silence
        self._lag_at = 0.0

    # -- what each robot owes -----------------------------------------------------------------------
    def sent(self, task_id: str, robot_id: str, seg: Segment) -> None:
        self._pending.setdefault(task_id, []).append(seg)
        self._robot[task_id] = robot_id

    def restored(self, task_id: str, robot_id: str, segs: list[Segment], now: float) -> None:
        """Segments a planner that died had sent: their reports may have been sent while it was down, so each is
        asked for at once (:meth:`to_probe`) and judged for silence from ``now``."""
        for s in segs:
            s.silence_from, s.probed = now, False
        self._pending[task_id] = list(segs)
        self._robot[task_id] = robot_id

    def reported(self, task_id: str, seg: Segment) -> bool:
        """The robot reported ``seg``; True when that was the last segment it owed for the task."""
        pending = self._pending.get(task_id)
        if pending is None:
            return False
        pending[:] = [s for s in pending if s is not seg]  # identity: segments compare by value
        if pending:
            return False
        del self._pending[task_id], self._robot[task_id]
        return True

    def drop(self, task_id: str) -> bool:
        """Nothing more is expected of the robot for this task; True if it owed anything."""
        self._robot.pop(task_id, None)
        return self._pending.pop(task_id, None) is not None

    def owes(self, task_id: str) -> bool:
        return task_id in self._pending

    def robots(self) -> set[str]:
        """Robots that owe reports."""
        return set(self._robot.values())

    # -- liveness -------------------------------------------------------------------------------------
    def heard(self, robot_id: str, now: float) -> None:
        self._heard[robot_id] = now
        if len(self._heard) > HEARD_MAX:  # bounded: forget the robots heard from longest ago
            for rid in sorted(self._heard, key=self._heard.__getitem__)[:HEARD_MAX // 2]:
                del self._heard[rid]

    def note_lag(self, lag_s: float, now: float) -> None:
        """How old the robot report just read was. The largest lag of the last ``lag_window_s`` counts: reports
        and acks arrive on queues of their own, and one quick queue must not hide that another is seconds behind."""
        lag = max(0.0, float(lag_s))
        if lag >= self._lag or now - self._lag_at > self.lag_window_s:
            self._lag, self._lag_at = lag, now

    @property
    def lag_s(self) -> float:
        return self._lag

    def silent(self, now: float, timeout_s: float, unacked: Callable[[str, int], bool] | None = None
               ) -> list[tuple[str, Segment, float]]:
        """(task, first late segment, when its robot was last heard or -inf) for every task whose robot is silent:
        nothing heard from it for ``timeout_s`` (+ the report lag), and a segment unreported past the model's
        longest execution + as long. A segment the robot has not acknowledged (``unacked``) is not its silence:
        it cannot report what it never received (delivery re-sends it and fails the task past its own bound).
        The tasks returned are no longer watched."""
        limit = timeout_s + self._lag
        out = []
        for tid, pending in list(self._pending.items()):
            heard = self._heard.get(self._robot[tid], -math.inf)
            if now <= heard + limit:
                continue  # it keeps talking: busy or behind, not silent
            late = [s for s in pending if s.pred_end is not None and now > s.silence_base() + limit
                    and not (unacked is not None and unacked(tid, s.index))]
            if late:
                del self._pending[tid], self._robot[tid]
                out.append((tid, late[0], heard))
        return out

    def to_probe(self, now: float, timeout_s: float) -> list[tuple[str, Segment]]:
        """(task, segment) of segments still unreported half ``timeout_s`` past their predicted end (a restored
        one at once), each once: the caller re-sends them, and a robot that finished a segment answers a re-sent
        copy with its report again, so a report lost in transit does not fail a healthy task as silent."""
        half = timeout_s / 2 + self._lag
        out = []
        for tid, pending in self._pending.items():
            for seg in pending:
                if not seg.probed and seg.pred_end is not None and (
                        seg.silence_from is not None or now > seg.pred_end + half):
                    seg.probed = True
                    out.append((tid, seg))
        return out


def stamp_lag(stamp_wall: float | None, max_clock_skew_s: float, note: Callable[[float], None],
              reject: Callable[[str], None]) -> None:
    """How far behind the planner reads robot messages, from their stamps (``note``: the lag in s). A stamp further
    from this clock than ``max_clock_skew_s`` says nothing of that (a robot's clock is off, or the stamp is forged:
    one stamped 1970 switched silence detection off for the whole fleet), so it goes to ``reject`` (why) instead."""
    if stamp_wall is None:
        return
    lag = time.time() - stamp_wall
    if abs(lag) <= max_clock_skew_s:
        note(lag)
    else:
        reject(f"stamp {lag:+.1f} s from this planner's clock, beyond max_clock_skew_s={max_clock_skew_s:g}: "
               "its lag is ignored")
