"""A task's robot, under the core's lock: which robot message may speak of which segment (:func:`sent_segment`),
ending or revising a task for what its robot did (:func:`end_or_revise`), and the robot's ownership as the core's
tasks see it (:func:`claim`, :func:`release`; ``ownership.py`` keeps the owners and turns)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from timelyllm_ros.domain.types import Segment, TaskResult, TaskStatus
from timelyllm_ros.planner.generation import Generation

if TYPE_CHECKING:
    from timelyllm_ros.planner.core import PlannerCore


def sent_segment(core: PlannerCore, task_id: str, seg_index: int, robot_id: str | None
                 ) -> tuple[Generation | TaskResult, Segment | None] | str:
    """(task, segment) a robot message may speak of, or why it may not: the task must be known, the segment
    sent to the robot, and ``robot_id`` (None: not checked) the task's robot. Any node on the domain can
    publish reports and acks; one naming another robot's task must not end or free it. The segment is None
    for the end-of-plan marker of a finished plan (index = its number of segments)."""
    owner = core.tasks.get(task_id) or core.results.get(task_id)
    if owner is None:
        return f"unknown task {task_id!r}"
    if robot_id is not None and robot_id != owner.robot_id:
        return f"robot {robot_id!r} spoke for task {task_id!r} of robot {owner.robot_id!r}"
    segs = owner.segments
    if seg_index == len(segs) and segs and task_id not in core.tasks:
        return owner, None
    if not 0 <= seg_index < len(segs) or segs[seg_index].dispatch is None:
        return f"segment {seg_index} of task {task_id!r} was never sent"
    return owner, segs[seg_index]


def end_or_revise(core: PlannerCore, task_id: str, status: TaskStatus, reason: str) -> None:
    """End an open task with ``status`` (a generating one is aborted in the engine first); a task whose
    generation had already ended DONE gets its published result revised (never silently left at DONE): its
    robot did not run its plan to the end."""
    g = core.tasks.get(task_id)
    if g is not None:
        if task_id in core.queue.running:
            g.abort_later(reason, status)
            core.aborts.append(task_id)
        else:
            core.finish(g, status, reason)
        return
    res = core.results.get(task_id)
    if res is not None and res.status is TaskStatus.DONE:
        why = core.ownership.preempted.pop(task_id, None)
        if why is not None:  # what the robot did not run to the end, it was told to drop
            status, reason = TaskStatus.CANCELLED, why
        res.status, res.reason = status, reason
        core.watchdog.drop(task_id)
        core.outbox.append(("result", res, None))
        release(core, res.robot_id)


def claim(core: PlannerCore, g: Generation) -> None:
    """A new task asks for its robot: it owns a free one, preempts a lower-beta owner, or waits its turn."""
    release(core, g.robot_id)  # the owner may have ended since
    owns, old = core.ownership.claim(g)
    if not owns:
        return
    core.queue.add(g)
    if old is None:
        return
    old_id, old_beta = old
    reason = f"preempted by task {g.task_id} (beta {g.tuf.beta:g} > {old_beta:g})"
    if old_id not in core.tasks and core.watchdog.owes(old_id):
        # Generated DONE, not all reported: the robot may have run it all before the new segment 0 came.
        # A report of a segment not run to the end revises it CANCELLED with this reason (end_or_revise).
        core.ownership.preempted[old_id] = reason
    else:
        end_or_revise(core, old_id, TaskStatus.CANCELLED, reason)


def release(core: PlannerCore, robot_id: str) -> None:
    """Hand the robot to the waiting task of highest beta once its owner has ended and every segment sent
    to it has been reported (or given up on)."""
    g = core.ownership.release(robot_id)
    if g is not None:
        g.enqueued_at = core.clock.now()
        core.queue.add(g)
