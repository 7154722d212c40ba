"""Who may hand the planner a goal, and how fast: checked at intake, before anything a goal costs (tokenizing,
journaling, a DDS writer per robot). Pure Python.

Issue 39: 10,000 goals from 10,000 robot ids in 7.4 s took intake first-come first-served: 4,768 reached the
planner and the rest were lost unanswered, the planner kept 4,772 segment writers for 600 s (97 -> 328 MB), and a
real goal sent right after waited 26.7 s for its first segment. Nothing told the flooding client to back off.

Limits (the planner's ``intake_*`` parameters), each answered BUSY naming the limit (the goal may be sent again
later):

* per robot id: ``goals_per_robot_s`` sustained, ``goals_burst_per_robot`` at once (a token bucket);
* robot ids new to the planner (it holds no link for one, so a DDS writer would be made for it, and no reader of
  its segments is on the graph: its executor does not run): ``new_robots_per_s`` sustained, ``new_robots_burst`` at
  once, over all of them. A flood of made-up ids is held to that (its tasks would also take engine steps from the
  real robots' urgent goals: 200 at once pushed an urgent first segment past its cut-off), while the fleet's robots,
  served before or with their executor up, are not slowed by it;
* ``robot_ids`` (optional): the fleet's robots; any other id is refused as invalid.

The ROS client of a goal is not known to rclpy's action server (a request's writer is not exposed), so no limit
is per client; a flood from one client and from many look alike, and each robot id pays for its own goals.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass


class TokenBucket:
    """``rate`` tokens a second up to ``burst``; starts full. ``rate`` 0: unlimited."""

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.stamp = rate, burst, float(burst), now

    def take(self, now: float) -> bool:
        if self.rate <= 0:
            return True
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def wait_s(self) -> float:
        """Seconds until the next token (0 if one is there)."""
        return 0.0 if self.tokens >= 1.0 or self.rate <= 0 else (1.0 - self.tokens) / self.rate


@dataclass(frozen=True)
class IntakeLimits:
    """The planner's intake parameters (``planner/settings.py``, whose defaults they have: none here); a rate of 0
    means no limit."""

    goals_per_robot_s: float
    goals_burst_per_robot: int
    new_robots_per_s: float
    new_robots_burst: int
    robot_ids: frozenset[str] = frozenset()  # empty: any


class Intake:
    """The limits of :class:`IntakeLimits`, thread-safe. Memory is bounded: at most ``max_tracked`` robot ids keep a
    bucket, the least recently seen forgotten first (a forgotten robot starts again with a full bucket)."""

    def __init__(self, limits: IntakeLimits, max_tracked: int = 20_000) -> None:
        self.limits = limits
        self._max_tracked = max_tracked
        self._per_robot: OrderedDict[str, TokenBucket] = OrderedDict()
        self._new: TokenBucket | None = None
        self._lock = threading.Lock()
        self.refused: dict[str, int] = {}  # per limit, for /diagnostics and the benchmark

    def in_fleet(self, robot_id: str) -> bool:
        ids = self.limits.robot_ids
        return not ids or robot_id in ids

    def admit(self, robot_id: str, now: float, known: bool) -> str | None:
        """Why the goal of ``robot_id`` is refused BUSY now (naming the limit), or None: it may proceed (a token was
        taken). ``known``: the planner holds state for the robot already (its link), or it is in ``robot_ids``."""
        lim = self.limits
        with self._lock:
            bucket = self._per_robot.get(robot_id)
            if bucket is None:
                bucket = self._per_robot[robot_id] = TokenBucket(lim.goals_per_robot_s, lim.goals_burst_per_robot,
                                                                 now)
                if len(self._per_robot) > self._max_tracked:
                    self._per_robot.popitem(last=False)
            else:
                self._per_robot.move_to_end(robot_id)
            if not known and lim.new_robots_per_s > 0:
                if self._new is None:
                    self._new = TokenBucket(lim.new_robots_per_s, lim.new_robots_burst, now)
                if not self._new.take(now):
                    return self._note("new_robots", f"robot_id: intake rate limit for robot ids new to this planner "
                                      f"(intake_new_robots_per_s={lim.new_robots_per_s:g}, intake_new_robots_burst="
                                      f"{lim.new_robots_burst}); retry in {_retry(self._new)}")
            if not bucket.take(now):
                return self._note("per_robot", f"robot_id: intake rate limit of {robot_id!r} (intake_goals_per_robot_s="
                                  f"{lim.goals_per_robot_s:g}, intake_goals_burst_per_robot="
                                  f"{lim.goals_burst_per_robot}); retry in {_retry(bucket)}")
        return None

    def _note(self, limit: str, why: str) -> str:
        self.refused[limit] = self.refused.get(limit, 0) + 1
        return why

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.refused)


def _retry(bucket: TokenBucket) -> str:
    return f"{max(0.001, math.ceil(bucket.wait_s() * 1000) / 1000):g} s"


__all__ = ["Intake", "IntakeLimits", "TokenBucket"]
