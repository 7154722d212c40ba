"""At-least-once segment transport with acknowledgements (the planner's half of the delivery contract).

Every segment (and end-of-plan marker) handed to a robot stays here until the
robot's executor acknowledges it on ``/segment_acks``; until then it is
re-sent with exponential backoff. The executor drops duplicates by
(task_id, segment_index), so at-least-once sending gives exactly-once
execution. Why not TRANSIENT_LOCAL on the robot topics: a history cache
would hand a *restarted* executor old plans, and it still cannot say whether
a segment arrived; acknowledgements can.

Pure Python (no rclpy). A segment's whole way out is here: :class:`Outbound` holds
each robot's link (:class:`RobotLinks`), asks whether its reader is ready, and hands the
segment to :class:`SegmentDelivery`, which publishes through the node's
:class:`RobotOutlet` (its only ROS part: the writers); the planner calls
:meth:`SegmentDelivery.due` from a timer.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from timelyllm_ros.interfaces import is_end_marker


@dataclass
class _Pending:
    robot_id: str
    msg: Any  # PlanSegment
    first_sent: float
    next_send: float
    period: float
    cap: float  # the longest re-send period for this copy
    matched: bool = False  # the robot's reader had matched when it was first sent
    last_sent: float = 0.0
    lost: bool = False  # evidence that the latest copy never arrived: re-send it now, whatever the backlog
    sends: int = 1


class SegmentDelivery:
    """Unacknowledged segments by (task_id, segment_index); bounded by what is in flight."""

    def __init__(self, send: Callable[[str, Any], None], *, period_s: float = 0.2, max_period_s: float = 1.0,
                 give_up_s: float = 30.0, matched_period_s: float = 3.0, matched_max_period_s: float = 12.0) -> None:
        if not (0 < period_s <= max_period_s) or give_up_s <= 0 or not (period_s <= matched_period_s
                                                                         <= matched_max_period_s):
            raise ValueError("SegmentDelivery: need 0 < period_s <= max_period_s, period_s <= matched_period_s "
                             "<= matched_max_period_s and give_up_s > 0")
        self._send = send
        self.period_s, self.max_period_s, self.give_up_s = period_s, max_period_s, give_up_s
        self.matched_period_s, self.matched_max_period_s = matched_period_s, matched_max_period_s
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._by_robot: dict[str, dict[tuple[str, int], _Pending]] = {}  # the same entries, per robot
        self._heard: dict[str, float] = {}  # robot -> when it last acknowledged or reported anything
        # The slowest acknowledgement of the last give_up_s (send -> ack): how far behind the robots are.
        self._ack_lag, self._ack_lag_at = 0.0, float("-inf")
        self._lock = threading.Lock()
        self.resends = 0  # total re-sends (telemetry)
        self._given_up: OrderedDict[tuple[str, int], str] = OrderedDict()  # why, for the latest give-ups (bounded)

    def send(self, robot_id: str, msg: Any, now: float, *, matched: bool = False) -> None:
        """Send now and keep re-sending until :meth:`ack`.

        ``matched``: the robot's subscription had already matched, so RELIABLE transport delivers this copy
        unless the robot dies; re-sends are then a slow safety net (``matched_period_s``, doubling up to
        ``matched_max_period_s``), not a storm: with a fixed 3 s period, 1000 goals to 100 robots on a busy host
        made 56,000 re-sends of 3,000 segments, and the duplicates (each acknowledged) kept the robots and the
        planner too busy to acknowledge the originals."""
        period, cap = (self.matched_period_s, self.matched_max_period_s) if matched else (self.period_s,
                                                                                          self.max_period_s)
        key = (msg.task_id, int(msg.segment_index))
        with self._lock:
            self._drop(key)
            p = self._pending[key] = _Pending(robot_id, msg, now, now + period, period, cap, matched, now)
            self._by_robot.setdefault(robot_id, {})[key] = p
        self._send(robot_id, msg)

    def _drop(self, key: tuple[str, int]) -> _Pending | None:
        p = self._pending.pop(key, None)
        if p is not None:
            mine = self._by_robot.get(p.robot_id)
            if mine is not None:
                mine.pop(key, None)
                if not mine:
                    del self._by_robot[p.robot_id]
        return p

    def heard(self, robot_id: str, now: float) -> None:
        """The robot is alive (an ack or report of anything): a busy planner that is slow to read acks must
        not give up on a robot that keeps answering."""
        with self._lock:
            self._heard[robot_id] = now
            if len(self._heard) > 100_000:  # bounded: forget robots not heard from for the longest
                for rid in sorted(self._heard, key=self._heard.__getitem__)[:50_000]:
                    del self._heard[rid]

    def ack(self, task_id: str, index: int, now: float | None = None, robot_id: str | None = None) -> bool:
        """The robot has it; False if it was not pending (a duplicate ack) or ``robot_id`` (None: not checked)
        is not the robot it was sent to (another node must not stop the re-sends to the real robot).

        A robot's segments travel on one RELIABLE topic, in order, and it acknowledges them in the order they
        arrive. So an ack of a copy sent *after* the latest copy of a segment still unacknowledged means that
        copy was lost (e.g. it went out while the robot's reader had not yet matched our writer, or a full
        history dropped it): it is re-sent at the next :meth:`due`, not after a full re-send period. The same
        for an earlier segment of the same task (its ack is the robot's, whatever the order)."""
        index = int(index)
        with self._lock:
            p = self._pending.get((task_id, index))
            if p is not None and robot_id is not None and p.robot_id != robot_id:
                return False
            p = self._drop((task_id, index))
            found = p is not None
            if now is not None:
                if p is not None:
                    lag = now - p.first_sent
                    if lag >= self._ack_lag or now - self._ack_lag_at > self.give_up_s:
                        self._ack_lag, self._ack_lag_at = lag, now
                    for q in self._by_robot.get(p.robot_id, {}).values():  # a handful per robot
                        if q.last_sent < p.first_sent:
                            q.lost, q.next_send = True, min(q.next_send, now)
                for j in range(index):  # a task has a handful of segments: cheap, whatever is in flight
                    q = self._pending.get((task_id, j))
                    if q is not None:
                        q.lost, q.next_send = True, min(q.next_send, now)
            return found

    def due(self, now: float, reachable: Callable[[str], bool] | None = None) -> list[tuple[str, int, str]]:
        """Re-send what is due; returns (task_id, index, robot_id) of segments given up on (never acknowledged
        within ``give_up_s``): the caller ends those tasks as robot failures.

        ``reachable(robot_id)``: whether the robot's reader has matched our writer. A robot not yet discovered
        could not have received anything, so its silence says nothing: on a loaded machine discovery of a new
        writer took longer than ``give_up_s``. Such a robot is given the hard bound (4x) instead.

        While other robots' acknowledgements take long to come back (a loaded host: 100 robots in one busy
        process were 30 s behind), silence means less: ``give_up_s`` is extended by the slowest
        acknowledgement of the last ``give_up_s`` (never beyond the hard bound). For the same reason a copy
        that went to a matched reader of a robot that is still answering is not re-sent before twice that
        lag, unless it is known lost (see :meth:`ack`): it is queued behind the others, and a duplicate would
        only lengthen the queue (100 robots in one starved process fell further behind on duplicates)."""
        resend, lost = [], []
        with self._lock:
            lag = self._ack_lag if now - self._ack_lag_at <= self.give_up_s else 0.0
            wait = self.give_up_s + lag
            for key, p in list(self._pending.items()):
                age = now - p.first_sent
                silent = self._heard.get(p.robot_id, -1.0) < now - wait
                # Give up once the robot has been silent that long (or after 4x give_up_s, whatever it says).
                if age > wait and silent and reachable is not None and age <= 4 * self.give_up_s:
                    silent = reachable(p.robot_id)
                if (age > wait and silent) or age > 4 * self.give_up_s:
                    self._drop(key)
                    lost.append((key[0], key[1], p.robot_id))
                    heard = self._heard.get(p.robot_id)
                    self._given_up[key] = (f"sent {p.sends} time{'s' if p.sends > 1 else ''} over {age:.1f} s; robot "
                                           + ("never heard" if heard is None else f"last heard {now - heard:.1f} s ago")
                                           + (f"; acks lag {lag:.1f} s" if lag else ""))
                    while len(self._given_up) > 1000:
                        self._given_up.popitem(last=False)
                elif now >= p.next_send:
                    p.period = max(p.period, min(p.period * 2, p.cap))
                    p.next_send = now + p.period
                    if p.matched and not p.lost and not silent and now - p.last_sent < 2 * lag:
                        continue  # behind, not lost: wait for the queue ahead of it
                    p.sends += 1
                    p.last_sent, p.lost = now, False
                    resend.append((p.robot_id, p.msg))
            self.resends += len(resend)
        for robot_id, msg in resend:
            self._send(robot_id, msg)
        return lost

    def given_up_detail(self, task_id: str, index: int) -> str:
        """What delivery knew when it gave up on a segment (copies sent, the robot's silence); '' if unknown."""
        with self._lock:
            return self._given_up.get((task_id, int(index)), "")

    def forget(self, task_id: str, keep: Callable[[Any], bool] = lambda msg: False) -> int:
        """Stop re-sending ``task_id``'s unacknowledged copies (except those ``keep`` accepts); returns how many.

        For a task that ended without running its plan: a late copy of its segment 0 would reach a robot that
        never saw the task as a new task, and preempt whatever that robot runs now (the urgent task that
        replaced it)."""
        with self._lock:
            keys = [k for k, p in self._pending.items() if k[0] == task_id and not keep(p.msg)]
            for k in keys:
                self._drop(k)
        return len(keys)

    def waiting(self, task_id: str) -> list[Any]:
        """The messages of this task still waiting for an ack (re-sent until acknowledged)."""
        with self._lock:
            return [p.msg for k, p in self._pending.items() if k[0] == task_id]

    def forget_plan(self, task_id: str) -> int:
        """:meth:`forget` all but the end-of-plan marker of a task that ended without running its plan: the robot
        must still hear that the plan ended."""
        return self.forget(task_id, keep=lambda msg: is_end_marker(msg.text, msg.is_final))

    def pending_for(self, robot_id: str) -> int:
        """Segments sent to ``robot_id`` and not acknowledged yet."""
        with self._lock:
            return len(self._by_robot.get(robot_id, ()))

    def unacked(self, task_id: str, index: int) -> bool:
        """Segment ``index`` of ``task_id`` was sent and the robot has not acknowledged it yet."""
        with self._lock:
            return (task_id, int(index)) in self._pending

    def pending(self, task_id: str | None = None) -> int:
        with self._lock:
            if task_id is None:
                return len(self._pending)
            return sum(1 for k in self._pending if k[0] == task_id)


class RobotLinks:
    """Each robot's link (the node's segment writer, opaque here): made on first use, released once the robot
    has been idle long enough. ``matched(link)``: the robot's reader is matched to it now; ``present(robot_id)``:
    a reader of the robot's segments is on the graph (no link needed)."""

    def __init__(self, make: Callable[[str], Any], destroy: Callable[[Any], None],
                 matched: Callable[[Any], bool], present: Callable[[str], bool] = lambda robot_id: False) -> None:
        self._make, self._destroy, self._matched, self._present = make, destroy, matched, present
        self._links: dict[str, Any] = {}
        self._used: dict[str, float] = {}  # robot -> last segment sent to it (monotonic), for release
        self._discovered: set[str] = set()  # robots whose reader matched their segment topic (one per link)
        self._lock = threading.Lock()

    def get(self, robot_id: str) -> Any:
        """The robot's link, made if it has none; marks the robot used."""
        with self._lock:
            self._used[robot_id] = time.monotonic()
            link = self._links.get(robot_id)
            if link is None:
                link = self._links[robot_id] = self._make(robot_id)
            return link

    def has(self, robot_id: str) -> bool:
        """The robot has a link now (it was served and not released since)."""
        with self._lock:
            return robot_id in self._links

    def known(self, robot_id: str) -> bool:
        """The robot has a link, or is ``present``: a reader of its segments is on the graph (its executor runs),
        which a flood of made-up robot ids lacks."""
        return self.has(robot_id) or self._present(robot_id)

    def make_room(self, max_links: int, busy: Callable[[str], bool]) -> bool:
        """True if one more robot may get a link: fewer than ``max_links`` robots hold one, or the least recently
        used of those not ``busy`` is released for it (a flood of robot ids must not hold a writer each; issue 39)."""
        with self._lock:
            if len(self._links) < max_links:
                return True
            by_use = sorted(self._links, key=lambda r: self._used.get(r, 0.0))
        for robot_id in by_use:
            if busy(robot_id):
                continue
            with self._lock:
                link = self._links.pop(robot_id, None)
                self._used.pop(robot_id, None)
                self._discovered.discard(robot_id)
            if link is not None:
                self._destroy(link)
                return True
        return False

    def reachable(self, robot_id: str) -> bool:
        """The robot's reader has matched our writer at some point. One that matched and went away (a dead
        executor) is judged by its silence; one never discovered is given delivery's hard bound."""
        if robot_id in self._discovered:
            return True
        if self._matched(self.get(robot_id)):
            self._discovered.add(robot_id)
            return True
        return False

    def release_idle(self, now: float, idle_s: float, busy: Callable[[str], bool]) -> int:
        """Release the link (a DDS writer, ~50 KB) of every robot sent nothing for ``idle_s`` that is not
        ``busy``, and forget what is kept per robot: 10,000 distinct robot ids took the planner from 88 to 579 MB,
        never freed. The next segment to such a robot makes a new link (and waits for its reader to match, as the
        first did). A robot whose reader never matched its link is released as soon as it is not ``busy``: no
        executor of it ever listened, and a flood of made-up robot ids must not hold a writer each for ``idle_s``
        (issue 39: 4,772 kept 600 s). Returns how many were released."""
        with self._lock:
            used = dict(self._used)
            strangers = {r for r in used if r not in self._discovered and r in self._links
                         and not self._matched(self._links[r])}
        idle = [r for r, t in used.items() if (now - t > idle_s or r in strangers) and not busy(r)]
        released = 0
        for robot_id in idle:
            with self._lock:  # get() marks a robot used under it: one used since is kept
                last = self._used.get(robot_id, now)
                if now - last <= idle_s and (robot_id not in strangers or last != used[robot_id]):
                    continue
                link = self._links.pop(robot_id, None)
                del self._used[robot_id]
                self._discovered.discard(robot_id)
                if link is not None:
                    self._destroy(link)
                    released += 1
        return released


class RobotOutlet(Protocol):
    """What is not pure Python on a segment's way out: each robot's link (a writer on its segment topic, made by the
    node, opaque here). The node implements it with rclpy publishers and nothing else."""

    def open(self, robot_id: str) -> Any:
        """A new link to the robot (a writer on its segment topic)."""

    def ready(self, link: Any) -> bool:
        """The robot's reader is matched to ``link`` now."""

    def present(self, robot_id: str) -> bool:
        """A reader of the robot's segments is on the graph (no link needed)."""

    def publish(self, robot_id: str, link: Any, msg: Any) -> None:
        """Sign and publish ``msg`` on ``link``; a failure is logged, never raised (delivery sends it again)."""

    def release(self, link: Any) -> None:
        """Destroy ``link``."""


class Outbound:
    """One outbound path per robot: its link (:class:`RobotLinks`), whether its reader is ready, and at-least-once
    delivery (:class:`SegmentDelivery`, made by :meth:`open`, dropped by :meth:`close`). A segment goes from
    :meth:`send` through the delivery to the outlet's ``publish``, and nowhere else."""

    def __init__(self, outlet: RobotOutlet) -> None:
        self._outlet = outlet
        self.links = RobotLinks(outlet.open, outlet.release, outlet.ready, outlet.present)
        self.delivery: SegmentDelivery | None = None

    def open(self, *, period_s: float, max_period_s: float, give_up_s: float) -> SegmentDelivery:
        """Start delivering (the planner's configure): a fresh :class:`SegmentDelivery` with these periods."""
        self.delivery = SegmentDelivery(self._publish, period_s=period_s, max_period_s=max_period_s,
                                        give_up_s=give_up_s)
        return self.delivery

    def close(self) -> None:
        self.delivery = None

    def send(self, robot_id: str, msg: Any, *, check_ready: bool = True) -> None:
        """Hand ``msg`` to delivery (sent now, re-sent until acknowledged). ``check_ready``: ask whether the robot's
        reader is matched, for the slow re-send schedule (:meth:`SegmentDelivery.send`); False for a copy a
        restarted planner sends again from its journal, which goes on the fast one."""
        matched = self._outlet.ready(self.links.get(robot_id)) if check_ready else False
        self.delivery.send(robot_id, msg, time.monotonic(), matched=matched)

    def _publish(self, robot_id: str, msg: Any) -> None:
        self._outlet.publish(robot_id, self.links.get(robot_id), msg)


class RejectedMessages:
    """Messages the planner refused (robots' acks, heartbeats and reports; goals): counted per kind for /diagnostics,
    and logged once per claimed sender and kind, at most ``max_lines`` lines per ``window_s`` over all senders: a
    flood of forgeries, or of goals from ever new robot ids, must not flood the log (each line also costs rclpy's
    logger about a millisecond). Refusals of new senders the budget leaves out are counted, and the next line says
    how many. Bounded: at most ``max_senders`` senders are remembered as already logged."""

    def __init__(self, warn: Callable[[str], None], max_senders: int = 1000, *, max_lines: int = 20,
                 window_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._warn = warn
        self._max = max_senders
        self._max_lines, self._window_s, self._clock = max_lines, window_s, clock
        self._window_start, self._lines = -math.inf, 0
        self._unlogged = 0  # first refusals of a sender the line budget left out, since the last line
        self._logged: dict[tuple[str, str], None] = {}  # insertion-ordered: the oldest are forgotten first
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.total = 0

    def note(self, kind: str, sender: str, why: str) -> None:
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.total += 1
            key = (kind, sender)
            if key in self._logged:
                return
            self._logged[key] = None
            if len(self._logged) > self._max:
                del self._logged[next(iter(self._logged))]
            now = self._clock()
            if now - self._window_start >= self._window_s:
                self._window_start, self._lines = now, 0
            if self._lines >= self._max_lines:
                self._unlogged += 1
                return
            self._lines += 1
            unlogged, self._unlogged = self._unlogged, 0
        more = f"; {unlogged} refusals of other senders not logged before this one" if unlogged else ""
        self._warn(f"refused {kind} from {sender!r}: {why} (further ones from it are only counted{more})")

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)
