"""One task per robot: which task owns each robot, and which tasks wait their turn for it.

A robot runs one task at a time and the planner decides which (the same rule in the ROS planner, the
simulator and the demo; docs/contract.md "Robots and safety"). A task owns its robot from when it is
accepted (or released to) until it has ended and the robot has reported every segment sent to it.
A new task for a robot owned by another:

* preempts it when its beta is strictly higher (an urgent task over a normal one): the older task ends
  CANCELLED ("preempted by task ..."), and the robot drops the rest of it when the new task's segment 0
  arrives (transport/session.py). A finished generation whose plan the robot may still be running has its result
  revised to that once the robot reports a segment it did not run to the end (:attr:`RobotOwnership.preempted`);
  if it reports every one done, the result stays DONE;
* otherwise waits its turn: it is not generated until the robot is released, so its segment 0 never interrupts
  the plan in progress; its response time still counts from its arrival.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from timelyllm_ros.planner.generation import Generation


class RobotOwnership:
    """Owners and turns per robot. ``busy(task_id)``: the task is open or its robot still owes reports of it;
    ``live(task_id)``: the open task's generation, else None. The caller holds the core's lock."""

    def __init__(self, busy: Callable[[str], bool], live: Callable[[str], Generation | None]) -> None:
        self._busy, self._live = busy, live
        self._owner: dict[str, tuple[str, float]] = {}  # robot -> (task that owns it, its beta)
        self._turns: dict[str, deque[str]] = {}  # robot -> tasks waiting for it, in arrival order
        # A task generated DONE and preempted while its robot still owed reports -> why. A report of a segment not
        # run to the end then revises it CANCELLED with this reason; bounded by the tasks that owe reports.
        self.preempted: dict[str, str] = {}

    def claim(self, g: Generation) -> tuple[bool, tuple[str, float] | None]:
        """A new task asks for its robot: (it owns it now, the owner it preempts). It owns a free robot or
        preempts a lower-beta owner; otherwise it waits its turn. The caller releases the robot first."""
        rid = g.robot_id
        owner = self._owner.get(rid)
        if owner is not None and g.tuf.beta <= owner[1]:
            self._turns.setdefault(rid, deque()).append(g.task_id)
            return False, None
        self._owner[rid] = (g.task_id, g.tuf.beta)  # first: ending the old owner must not release the robot
        return True, owner

    def release(self, robot_id: str) -> Generation | None:
        """Hand the robot to the waiting task of highest beta once its owner is no longer busy; returns that
        task (now its owner), else None."""
        owner = self._owner.get(robot_id)
        if owner is not None and self._busy(owner[0]):
            return None
        self._owner.pop(robot_id, None)
        turns = self._turns.get(robot_id)
        if turns is None:
            return None
        waiting = [g for t in turns if (g := self._live(t)) is not None and not g.status.terminal]
        chosen = None
        if waiting:  # the highest beta, first come among equals: it would have preempted any of the others
            chosen = max(waiting, key=lambda w: w.tuf.beta)
            waiting.remove(chosen)
            self._owner[robot_id] = (chosen.task_id, chosen.tuf.beta)
        turns.clear()
        turns.extend(w.task_id for w in waiting)
        if not turns:
            del self._turns[robot_id]
        return chosen

    def leave_turns(self, robot_id: str, task_id: str) -> None:
        """A task ended while it waited for its robot."""
        turns = self._turns.get(robot_id)
        if turns and task_id in turns:
            turns.remove(task_id)

    def restore_owner(self, g: Generation) -> str | None:
        """A journaled task whose plan was on its robot when the planner died owns the robot again. A task
        restored before it (older) that claimed the robot but had sent nothing goes back to the front of the
        turns; returns its id (the caller takes it off the candidates)."""
        prev = self._owner.get(g.robot_id)
        back = None
        if prev is not None and prev[0] != g.task_id:
            other = self._live(prev[0])
            if other is not None and not other.segments:
                self._turns.setdefault(g.robot_id, deque()).appendleft(prev[0])
                back = prev[0]
        self._owner[g.robot_id] = (g.task_id, g.tuf.beta)
        return back

    def robots(self) -> set[str]:
        """Robots with an owner or a task waiting for them."""
        return set(self._owner) | set(self._turns)

    def waiting(self) -> int:
        """Tasks waiting for their robot to finish another task."""
        return sum(len(t) for t in self._turns.values())
