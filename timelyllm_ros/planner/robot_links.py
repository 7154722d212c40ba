"""Each robot's link from the planner (a segment writer the node makes, opaque here): made on first use, released
once the robot has been idle long enough (bounded memory with many robot ids). Pure Python."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class RobotLinks:
    """Each robot's link (the node's segment writer, opaque here): made on first use, released once the robot
    has been idle long enough. ``matched(link)``: the robot's reader is matched to it now."""

    def __init__(self, make: Callable[[str], Any], destroy: Callable[[Any], None],
                 matched: Callable[[Any], bool]) -> None:
        self._make, self._destroy, self._matched = make, destroy, matched
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
        first did). Returns how many were released."""
        idle = [r for r, t in list(self._used.items()) if now - t > idle_s and not busy(r)]
        released = 0
        for robot_id in idle:
            with self._lock:  # get() marks a robot used under it: one used since is kept
                if now - self._used.get(robot_id, now) <= idle_s:
                    continue
                link = self._links.pop(robot_id, None)
                del self._used[robot_id]
                self._discovered.discard(robot_id)
                if link is not None:
                    self._destroy(link)
                    released += 1
        return released


__all__ = ["RobotLinks"]
