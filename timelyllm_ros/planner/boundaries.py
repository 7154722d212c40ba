"""Segment when it pays, stream when it does not: per generation in the batch and per step, whether it
suspends at its next segment boundary or writes on in place (policies with :attr:`Policy.adaptive`).

A suspension is worth only what its place is worth to waiting work, and a resume is not free. A plan written on
in place shares every step with the batch, where a token costs a small share of a step; its resumes each come
back alone or nearly so, paying a prefill of what the engine's cache lacks and a step per token. Suspending at
every boundary on the arm trace at 3x ran the engine twice as long for fewer tokens (mean batch 7.9 against
27.4) and lost 0.29 of beta to writing on in place.
"""

from __future__ import annotations

import dataclasses

from timelyllm_ros.engines.base import Engine
from timelyllm_ros.engines.latency import LatencyEstimator
from timelyllm_ros.planner.admission import Admission, AdmissionView
from timelyllm_ros.planner.generation import Generation
from timelyllm_ros.planner.policies import Policy
from timelyllm_ros.planner.prefill import PrefillModel
from timelyllm_ros.planner.runqueue import RunQueue

KV_TIGHT = 0.9  # KV cache usage from which a suspended generation's own blocks count as evicted by its resume


class SegmentOrStream:
    """The boundary decision and what it learns: the least a robot's skill-bearing segment takes (how little of
    the pause a segment covers), and how many boundaries were suspended at / streamed past."""

    def __init__(self, prefill: PrefillModel, comm_s: float, resume_lead_s: float) -> None:
        self.prefill, self.comm_s, self.resume_lead_s = prefill, comm_s, resume_lead_s
        self._exec_min: dict[str, float] = {}  # robot type -> the least predicted execution of a skill segment
        self.counts = {"suspended": 0, "streamed": 0}

    def observe_segment(self, robot_type: str, est_exec_s: float) -> None:
        """A skill-bearing segment the model predicts to take ``est_exec_s`` (> 0)."""
        self._exec_min[robot_type] = min(est_exec_s, self._exec_min.get(robot_type, est_exec_s))

    def decide(self, now: float, queue: RunQueue, policy: Policy, engine: Engine, admission: Admission,
               est: LatencyEstimator) -> bool:
        """Set each running generation's ``suspend_at_boundary``. ``g`` suspends only where the best waiting
        generation (the engine's own queue first, else the policy's order) gains more utility by
        taking its place at its boundary than by waiting for the next plan in the batch to end, and that gain
        exceeds the resume's cost: its prefill (none where the engine holds requests in place) on the late work
        in the batch, and its own robot idling where the segments it was sent do not cover the pause. Where there
        is room in the batch, the place counts only if admission turns the waiting generation away because of
        ``g``. With nothing waiting a plan is never suspended. Returns whether anything was weighed."""
        running = [g for g in queue.running.values() if g.req is not None and not g.pending_abort]
        has_cands = bool(queue.cands)
        for g in running:
            g.req.suspend_at_boundary = False
        if not running:
            return False
        stats = engine.stats() if has_cands or len(running) > 1 else None
        places = admission.max_batch()
        queued: list[Generation] = []  # admitted by the core, queued by the engine for a place in its batch
        if stats is not None:
            if stats.max_batch:
                places = min(places, stats.max_batch)
            if stats.waiting > 0:  # the latest added that have written nothing yet (the engine takes them in order)
                queued = [g for g in running if g.seg_tokens() == 0][-stats.waiting:]
        if not has_cands and not queued:
            return False  # nothing waits: every generation streams on
        step = est.step_time(len(running))
        comm, lead = self.comm_s, self.resume_lead_s
        tight = stats is not None and (stats.kv_cache_usage >= KV_TIGHT or stats.waiting > 0)
        late = sum(-h.alpha for h in running if self._losing(h, now, step))
        skip = {g.task_id for g in queued}
        # when a place frees without a suspension: the earliest end of a plan in the batch
        free = min((now + h.plan_left_s(step) for h in running if h.task_id not in skip),
                   default=now)
        in_place = self.in_place_share(engine)  # once per decision, not per generation
        offers = []
        for g in running:
            if g.task_id in skip:
                continue  # not started yet: nothing to suspend
            t_b = now + g.segment_left_s(step)  # its boundary
            cover = self._robot_cover(g, t_b)
            resume = self.resume_cost(g, tight, est, engine, in_place)
            # its robot waits this long for it
            idle = max(0.0, g.gen_time(step, prefill=False) + comm + resume + lead - cover)
            offers.append((-g.alpha * idle + late * resume, t_b, g))
        if not offers:
            return True
        offers.sort(key=lambda x: (x[0], x[1]))
        no_place = len(running) >= places or bool(queued)
        # who gets the place: the engine's own queue first (it admits in order), else the policy's best candidates
        waiting = queued or queue.best(policy, now, est, min(len(offers), 8))
        view = None
        for q in waiting[:len(offers)]:
            for i, (cost, t_b, g) in enumerate(offers):
                if self._start_gain(q, t_b, free, step) <= cost:
                    continue
                if not no_place:  # there is a place: q waits for admission, which g's leaving must change
                    if view is None:
                        view = AdmissionView(running, now, comm, stats.kv_cache_usage, est)
                    if admission.admit(view, q) or not admission.admit(
                            dataclasses.replace(view, running=[h for h in running if h is not g]), q):
                        continue
                g.req.suspend_at_boundary = True
                del offers[i]
                break
        return True

    def _losing(self, g: Generation, now: float, step: float) -> bool:
        """Is ``g``'s current segment already past full utility at its expected end (loses utility every step)?"""
        end = now + g.segment_left_s(step) + self.comm_s
        return (end - g.arrival > g.ert) if g.k == 0 else (end > g.prev_end)

    def _start_gain(self, q: Generation, t_b: float, t_free: float, step: float) -> float:
        """What ``q`` gains by starting at ``t_b`` instead of ``t_free`` (its utility at each start)."""
        if t_free <= t_b:
            return 0.0
        G = q.gen_time(step, prefill=not (q.req and q.req.output_token_ids))  # a resumed prompt was prefilled
        # a first segment is judged from the task's arrival, a later one from the end of the one before
        tuf, since = (q.tuf.tuf0, q.arrival) if q.k == 0 else (q.tuf.tuf1, q.prev_end)
        lag = G + self.comm_s - since
        return tuf(t_b + lag) - tuf(t_free + lag)

    def _robot_cover(self, g: Generation, t_b: float) -> float:
        """How long after ``t_b`` (its boundary) ``g``'s robot still has sent segments to run: its queue's end (the
        last sent segment's reported or predicted end), then the segment being written at the least the robot's
        shortest skill-bearing segment has taken."""
        last = g.segments[-1] if g.segments else None
        q_end = last.end if last is not None and last.end is not None else t_b
        start = max(q_end, t_b + self.comm_s)
        return start + self._exec_min.get(g.robot_type, 0.0) - t_b

    def resume_cost(self, g: Generation, tight: bool, est: LatencyEstimator, engine: Engine,
                    in_place: float | None = None) -> float:
        """Prefill time of a resume: what the cache lacks of a resubmission, times the share of resumes the engine
        does not hold in place (``in_place``; None: :meth:`in_place_share`). The cache lacks the tokens past the last
        full KV block; with the KV cache ``tight`` (full, or requests queued for room) everything but the prefix
        its robot type's prompts share, as its own blocks are the ones evicted while it is out."""
        n = len(g.req.prompt_token_ids) + len(g.req.output_token_ids)
        miss = n % self.prefill.block_tokens(engine) + 1
        if tight:
            miss = max(miss, n - int(self.prefill.hit(g.robot_type) or 0.0))
        return est.prefill_time(miss) * (1.0 - (self.in_place_share(engine) if in_place is None else in_place))

    @staticmethod
    def in_place_share(engine: Engine) -> float:
        """The share of resumes the engine has held in place (no resubmission)."""
        c = engine.resume_counters()
        done = c.get("resumed_in_place", 0) + c.get("resubmitted", 0)
        return c.get("resumed_in_place", 0) / done if done else 0.0
