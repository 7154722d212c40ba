"""The generations the engine thread chooses among: candidates (eligible now), parked ones (suspended until
their resume time) and the running batch, and the policy's ranking of the candidates.

A suspended generation becomes eligible again at ``exec_end(s_{k-1}) - G(s_k) - comm - lead`` (the latest
start that still lets s_k reach the robot as it finishes s_{k-1}, less a lead margin for queueing and the
error of G). Before then it is not a candidate at all: it would only take batch slots, and slow every other
generation, to produce a segment nobody needs yet.
"""

from __future__ import annotations

import heapq
import threading

from timelyllm_ros.domain.types import TaskStatus
from timelyllm_ros.engines.latency import LatencyEstimator
from timelyllm_ros.planner.generation import Generation
from timelyllm_ros.planner.policies import Policy, RankContext

GATHER_SPAN = 5  # an idle engine waits for a burst's goals at most this many gather_s after the first


class RunQueue:
    """``cands`` (task id -> generation, in queue order) and ``running`` are read by the core; change them
    through the methods. The caller holds the core's lock. ``comm_s``, ``slack_floor_s``: the ranking's
    (CoreConfig)."""

    def __init__(self, comm_s: float, slack_floor_s: float) -> None:
        self.comm_s, self.slack_floor_s = comm_s, slack_floor_s
        self.cands: dict[str, Generation] = {}  # eligible, not running
        self.running: dict[str, Generation] = {}
        self._parked: list[tuple[float, int, int, Generation]] = []  # (eligible_at, seq, version, gen)

    def add(self, g: Generation) -> None:
        self.cands[g.task_id] = g

    def drop(self, task_id: str) -> None:
        """Off the candidates and the batch (a parked entry goes stale: the caller bumps ``wait_version``)."""
        self.cands.pop(task_id, None)
        self.running.pop(task_id, None)

    def start(self, g: Generation) -> None:
        del self.cands[g.task_id]
        self.running[g.task_id] = g

    def park(self, g: Generation, now: float) -> None:
        """Queue a suspended generation whose ``eligible_at`` is set: a candidate now if it is due, else parked
        until then."""
        g.wait_version += 1
        if g.eligible_at <= now:
            if g.task_id not in self.cands:
                g.enqueued_at = now
                self.cands[g.task_id] = g
        else:
            self.cands.pop(g.task_id, None)
            heapq.heappush(self._parked, (g.eligible_at, g.seq, g.wait_version, g))

    def promote(self, now: float) -> None:
        """Parked generations whose resume time has come become candidates."""
        p = self._parked
        while p and p[0][0] <= now:
            _, _, ver, g = heapq.heappop(p)
            if ver == g.wait_version and g.status is TaskStatus.SUSPENDED:
                g.enqueued_at = max(g.eligible_at, g.enqueued_at)
                self.cands[g.task_id] = g

    def next_due(self) -> float | None:
        """The earliest resume time parked, None if nothing is."""
        p = self._parked
        while p and p[0][2] != p[0][3].wait_version:
            heapq.heappop(p)  # stale entry
        return p[0][0] if p else None

    def parked(self) -> int:
        """Parked entries (stale ones included until they come up)."""
        return len(self._parked)

    def gather_until(self, now: float, gather_s: float, step1_s: float, arriving: float | None = None
                     ) -> float | None:
        """On an idle engine (the caller's to say), while a burst of goals is arriving, when to decide (None: now).
        An idle engine takes whichever goal came first, and a step cannot be cut: waiting until no goal has come
        for ``gather_s`` (at most GATHER_SPAN times that after the first) lets the burst be ranked together, where
        no goal waiting would lose utility by the wait (its best case, its prefill alone and its first segment at
        the batch-1 step time ``step1_s``, still inside its ERT) and none is a resumed plan (its robot is waiting
        for it). Why a quiet gap, not a fixed wait: a burst's goals reach the planner one after another, each
        rendered in turn (~3-10 ms apart on a 2-core CPU). ``arriving``: when the latest goal still being taken in
        (:class:`Intake`) arrived, None if none is. CoreConfig.gather_s."""
        if gather_s <= 0 or not self.cands:
            return None
        came = [g.enqueued_at for g in self.cands.values()]
        if arriving is not None:
            came.append(arriving)
        until = min(min(came) + GATHER_SPAN * gather_s, max(came) + gather_s)
        if until <= now:
            return None
        for g in self.cands.values():
            if g.k != 0 or until + g.gen_time(step1_s) + self.comm_s > g.deadline():
                return None
        return until

    def context(self, est: LatencyEstimator) -> RankContext:
        """What ranking needs: G is estimated at the batch size a candidate would join."""
        return RankContext(self.comm_s, est.step_time(len(self.running) + 1), self.slack_floor_s)

    def priorities(self, policy: Policy, now: float, est: LatencyEstimator) -> tuple[list[Generation], list[float]]:
        cands = list(self.cands.values())
        return cands, (policy.priorities(cands, now, self.context(est)) if cands else [])

    def rank(self, policy: Policy, now: float, est: LatencyEstimator) -> list[Generation]:
        """Candidates ordered by the policy (best first), priorities recomputed now."""
        cands, pri = self.priorities(policy, now, est)
        order = sorted(range(len(cands)), key=pri.__getitem__, reverse=True)  # stable: ties by queue order
        return [cands[i] for i in order]

    def best(self, policy: Policy, now: float, est: LatencyEstimator, n: int) -> list[Generation]:
        """The ``n`` best candidates (what a decision needs; cheaper than a full sort)."""
        cands, pri = self.priorities(policy, now, est)
        if not cands:
            return []
        if n == 1:
            i = max(range(len(pri)), key=pri.__getitem__)
            return [cands[i]]
        return [cands[i] for i in heapq.nlargest(n, range(len(pri)), key=pri.__getitem__)]


class Intake:
    """Goals that have reached the planner and are still being taken in (validated, their prompt rendered): an
    idle engine waiting for the rest of a burst (:meth:`RunQueue.gather_until`) counts them as come. Thread-safe:
    the goal callbacks call :meth:`begin` and :meth:`end` in pairs. A pair left open only ages: its time soon lies
    more than a gap in the past and no longer holds anything back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = 0
        self._last = 0.0

    def begin(self, t: float) -> None:
        with self._lock:
            self._open += 1
            self._last = max(self._last, t)

    def end(self) -> None:
        with self._lock:
            self._open = max(0, self._open - 1)

    def latest(self) -> float | None:
        """When the latest goal still being taken in arrived; None when none is."""
        with self._lock:
            return self._last if self._open else None
