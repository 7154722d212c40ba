"""The engine's segment events, on the engine thread under the core's lock: a segment is validated, parsed and
timed by the robot type's model (:func:`on_event`), kept and sent (:func:`add_segment`, :func:`send_held`); its
generation suspends until its resume time (:func:`requeue`), streams on in place, or ends."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from timelyllm_ros.domain.types import Segment, TaskStatus
from timelyllm_ros.engines.base import FinishReason, SegmentEvent
from timelyllm_ros.planner.generation import Generation
from timelyllm_ros.skills.minispec import SkillParseError

if TYPE_CHECKING:
    from timelyllm_ros.planner.core import PlannerCore


def on_event(core: PlannerCore, g: Generation, ev: SegmentEvent, now: float) -> None:
    text = ev.text
    # LLM output is untrusted: a segment reaches the robot only if it parses
    # against the robot's skill set with every argument inside its bounds.
    deliverable = ev.reason in (FinishReason.SEGMENT, FinishReason.STOP)
    if not deliverable:
        text = ""  # a cut-off fragment (length cap, runaway segment, abort) is never sent
    err = core.hooks.validate(g.robot_type, text) if text.strip() else None
    adds = err is None and (text or ev.reason is FinishReason.SEGMENT)
    calls: list[Any] = []
    times = (0.0, 0.0)
    if adds:
        calls = core.hooks.parse(g.robot_type, text)
        try:
            times = core.hooks.exec_range(g.robot_type, calls, text=text, before=g.plan_text())
        except SkillParseError as e:  # valid alone, not after the plan so far: over a plan bound of its skill set
            err = str(e)
    if err is not None:
        core.queue.running.pop(g.task_id, None)
        if g.task_id in core.engine.running_ids():
            core.engine.abort(g.task_id)
        elif ev.suspended:
            core.aborts.append(g.task_id)  # the engine may still hold it (a parked request)
        core.finish(g, TaskStatus.FAILED, f"invalid plan output in segment {len(g.segments)} "
                                           f"({text.strip()[:60]!r}): {err}")
        return
    if adds:
        add_segment(core, g, ev, now, calls, times)
    if ev.reason is FinishReason.SEGMENT:
        core.segmenting.counts["suspended" if ev.suspended else "streamed"] += 1
        if ev.suspended:
            core.queue.running.pop(g.task_id, None)
            g.suspend()
            requeue(core, g, now)
        else:  # streamed on in place: the next segment is now the one being written
            g.stream_on()
        return
    # final event
    core.queue.running.pop(g.task_id, None)
    if g.segments:
        g.segments[-1].final = True
    if ev.reason is FinishReason.STOP:
        send_held(core, g, now)
        # Each segment was valid alone; the whole plan must be too (blocks closed, variables set).
        err = core.hooks.validate_plan(g.robot_type, g.plan_text())
        if err is not None:
            core.finish(g, TaskStatus.FAILED, f"invalid plan at its end: {err}")
        else:
            core.finish(g, TaskStatus.DONE, "")
    else:
        what = {FinishReason.LENGTH: f"plan exceeded max_new_tokens={g.spec.max_new_tokens}",
                FinishReason.ABORTED: "generation aborted by the engine"}.get(ev.reason, ev.reason.value)
        core.finish(g, TaskStatus.FAILED, ev.error or what)


def add_segment(core: PlannerCore, g: Generation, ev: SegmentEvent, now: float, calls: list[Any],
                times: tuple[float, float]) -> None:
    """A validated segment: ``calls`` parsed from it, ``times`` its (min, max) execution by the model."""
    if not g.segments:  # first segment: learn how much of a new prompt the prefix cache covers
        rt = g.robot_type
        core.prefill.observe(rt, ev.cached_prompt_tokens)
        for q in core.queue.cands.values():
            if q.k == 0 and q.robot_type == rt and q.warm_hit is None:
                core.prefill.price(q, core.engine, core.estimator)
    est, longest = times
    seg = Segment(index=len(g.segments), text=ev.text, token_ids=list(ev.token_ids), calls=calls,
                  gen_start=g.gen_start, ready=now, est_exec_s=est, max_exec_s=longest)
    g.segments.append(seg)
    n = len(ev.token_ids)
    core.lengths.observe_segment(g, seg.index, n, bool(calls))
    if calls and est > 0:  # the shortest skill-bearing segment: how little of the robot's time a segment covers
        core.segmenting.observe_segment(g.robot_type, est)
    if n:
        core.overload.observe_segment(g.robot_type, seg.index == 0, n)
    g.gen_start = now
    g.held.append(seg)
    if core.policy.streams:
        send_held(core, g, now)


def send_held(core: PlannerCore, g: Generation, now: float) -> None:
    """Send ``g``'s produced segments to its robot (a streaming policy sends each as it is made)."""
    for seg in g.held:
        g.dispatch(seg, now, core.cfg.comm_s)
        core.watchdog.sent(g.task_id, g.robot_id, seg)
        core.outbox.append(("segment", g, seg))
    g.held.clear()


def requeue(core: PlannerCore, g: Generation, now: float) -> None:
    """A suspended generation waits for its resume time (:meth:`Generation.resume_time`; ``runqueue.py``), its G
    at the batch it would join."""
    g.resume_time(now, core.estimator.step_time(len(core.queue.running) + 1), core.cfg.comm_s, core.cfg.resume_lead_s)
    core.queue.park(g, now)
