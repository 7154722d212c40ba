"""The decision, on the engine thread under the core's lock: apply the aborts asked for, shed, rank and admit
(:func:`schedule`), degrade, and start what was admitted in the engine (:func:`start`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from timelyllm_ros.domain.types import TaskStatus
from timelyllm_ros.planner.admission import AdmissionView
from timelyllm_ros.planner.generation import Generation

if TYPE_CHECKING:
    from timelyllm_ros.planner.core import PlannerCore


def apply_aborts(core: PlannerCore) -> None:
    """Abort in the engine what was asked to end while it ran (or while the engine may still hold it)."""
    # Taken before any is applied: an engine whose abort raises (the engine loop restarts it) is not
    # asked the same again and again.
    aborts, core.aborts = core.aborts, []
    for tid in aborts:
        g = core.tasks.get(tid)
        core.engine.abort(tid)
        core.queue.running.pop(tid, None)
        if g is not None and g.pending_abort:
            core.finish(g, g.abort_status, g.reason)


def schedule(core: PlannerCore, now: float) -> float | None:
    """Shed, rank and admit; returns the seconds the decision took (None: nothing waited, nothing was
    decided)."""
    q, pol = core.queue, core.policy
    q.promote(now)
    core.prefill.reprice(q.cands.values(), core.engine, core.estimator)
    if pol.sheds:
        def shed_running(g: Generation, reason: str) -> None:  # this is the engine thread: abort it now
            core.engine.abort(g.task_id)
            q.running.pop(g.task_id, None)
            core.finish(g, TaskStatus.OVERDUE, reason)

        core.overload.shed(now, pol, core.estimator, len(core.engine.warm_up_targets()) <= 1,
                           list(q.running.values()), lambda: q.rank(pol, now, core.estimator),
                           lambda: any(g.k == 0 for g in q.cands.values()), shed_running,
                           lambda g, reason: core.finish(g, TaskStatus.OVERDUE, reason))
    if not q.cands or (not q.running and not core.engine.has_work() and q.gather_until(
            now, core.cfg.gather_s, core.estimator.step_time(1), core.intake.latest()) is not None):
        return None
    t0 = time.perf_counter()
    if core.cfg.overdue == "reject":
        core.overload.reject(now, list(q.cands.values()), core.estimator.step_time(len(q.running) + 1),
                             lambda g, reason: core.finish(g, TaskStatus.OVERDUE, reason))
    room = core.admission.max_batch() - len(q.running)
    picked: list[Generation] = []
    if room > 0 and q.cands:
        view = AdmissionView(list(q.running.values()), now, core.cfg.comm_s, core.engine.stats().kv_cache_usage,
                             core.estimator, q.cands.values())
        while True:
            # Admit in the policy's order while the batch has room and admission takes them, ranking only as
            # many as could join (cheaper than a full sort), and again if all were taken.
            refused = False
            while room > 0 and q.cands and not refused:
                core.prefill.reprice(q.cands.values(), core.engine, core.estimator)
                for g in q.best(pol, now, core.estimator, min(room, 64)):
                    if not core.admission.admit(view, g):
                        refused = True
                        break
                    _take(core, view, picked, g)
                    room -= 1
                    if core.prefill.admitted(g, core.engine, len(core.engine.warm_up_targets()) == 1):
                        break  # the cache will hold its prompt: the rest are priced and ranked again
            if refused and room > 0:
                room -= _riders(core, view, picked, now, room)
            if not (pol.eager and q.cands and any(g.k > 0 for g in picked)):
                break
            # Eager degrading: a later segment admitted ahead of a first segment that can still earn, and that
            # its generation time would push past its ERT, gives up its optional rest; its place goes to the
            # waiting ones.
            cut = degrade(core, now, [g for g in picked if g.k > 0], True)
            if not cut:
                break
            for g in cut:
                picked.remove(g)
                view.running.remove(g)
                room += 1
    if pol.degrades and q.cands:  # left waiting: the engine could not take them now (overload)
        degrade(core, now, [g for g in q.cands.values() if g.k > 0], pol.eager)
    spent = time.perf_counter() - t0
    for g in picked:
        start(core, g, now)
    return spent


RIDERS_RANKED = 64  # candidates a decision looks through for riders after a refusal (bounded hot path)


def _riders(core: PlannerCore, view: AdmissionView, picked: list[Generation], now: float, room: int) -> int:
    """After a refusal: admit the waiting prompts that ride on one the cache holds (PrefillModel.rides), in the
    policy's order, as far as admission takes them. Returns how many joined. Why: the copies of one emergency
    that several robots report come in the same instant and rank among the other reports; the first distinct
    prompt admission refuses would otherwise keep them out too, though each adds one partial block to the step.
    In a logged fleet demo run, two copies of an admitted report were never admitted and were shed. The best
    RIDERS_RANKED candidates are looked at, whatever the room (the refused ones rank first)."""
    q, prefill, n = core.queue, core.prefill, 0
    prefill.reprice(q.cands.values(), core.engine, core.estimator)
    for g in q.best(core.policy, now, core.estimator, RIDERS_RANKED):
        if n >= room:
            break
        if not prefill.rides(g, core.engine) or not core.admission.admit(view, g):
            continue
        _take(core, view, picked, g)
        n += 1
    return n


def _take(core: PlannerCore, view: AdmissionView, picked: list[Generation], g: Generation) -> None:
    """``g`` was admitted: it runs from this decision on (started in the engine after it)."""
    picked.append(g)
    view.running.append(g)
    core.queue.start(g)


def degrade(core: PlannerCore, now: float, gens: list[Generation], contended: bool) -> list[Generation]:
    """End the optional rest of those of ``gens`` a degrading policy names (:meth:`Overload.degrade`): each
    ends DONE with what was sent. Returns them."""
    def end(g: Generation, reason: str) -> None:  # (eager) admitted here, not started: released as suspended
        core.queue.running.pop(g.task_id, None)
        core.finish(g, TaskStatus.DONE, reason)

    return core.overload.degrade(
        now, core.policy, core.estimator, gens, contended, core.queue.cands.values,
        lambda: len(core.queue.running),
        lambda g: core.hooks.validate_plan(g.robot_type, g.plan_text()) is None, end)


def start(core: PlannerCore, g: Generation, now: float) -> None:
    """Start (or resume) ``g`` in the engine: its request is made on its first start."""
    g.start(now)
    if g.req is None:
        spec = g.spec
        try:
            ids = spec.prompt_token_ids
            if ids is None:  # tokenized only now: priced by its length (PrefillModel.admitted could not note it)
                ids = core.engine.tokenize(spec.prompt)
                core.prefill.price(g, core.engine, core.estimator, len(ids))
            g.checker = core.hooks.stop_checker(g.robot_type)
        except Exception as e:  # noqa: BLE001 - e.g. a skill set that does not load: this task's failure
            core.queue.running.pop(g.task_id, None)
            core.finish(g, TaskStatus.FAILED, f"planner error preparing the generation: {type(e).__name__}: {e}")
            return
        g.req = g.engine_request(ids, core.policy.segmented, g.checker)
    g.begin_segment()
    try:
        core.engine.add(g.req)
    except Exception as e:  # an engine refusal must reach the robot, not vanish
        core.engine.abort(g.task_id)
        core.queue.running.pop(g.task_id, None)
        core.finish(g, TaskStatus.FAILED, f"engine refused the generation: {e}")
        return
    if core.policy.sheds and g.k == 0 and not g.req.output_token_ids:  # a new prompt joins the prefill queue
        core.overload.admitted(g, now)
