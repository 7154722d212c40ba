"""PlannerCore: the planner's runtime, one engine under a policy, an admission rule and a clock.

It talks to robots only through callbacks, so the same object runs in the ROS planner node (RealClock, real
engine, a dedicated engine thread) and in the discrete-event simulator (SimClock, SimEngine). It ranks and
steps; each other concern has a home of its own beside it (``planner/``):

=================  ==========================================================================================
``config.py``      CoreConfig
``generation.py``  a task's generation: its next segment's generation time G, wait, slack, resume time, status
``scheduling.py``  the decision: aborts, shedding, ranking, admission, starting in the engine
``events.py``      the engine's segment events: validate, send, suspend (and its resume time) or stream on
``robots.py``      a task's robot: which messages may speak of a segment, ending or revising for it, claim, release
``runqueue.py``    candidates, suspended generations waiting for their resume time, the batch, the ranking
``ownership.py``   one task per robot: owners, turns, preemption
``watchdog.py``    what each robot owes (unreported segments) and its silence
``results.py``     finished results, bounded
``prefill.py``     prefix-cache hits and prefill estimates
``lengths.py``     segment and plan lengths learned per task
``overload.py``    shedding first segments and degrading plans (best cases)
``boundaries.py``  suspend at a boundary or stream on in place
``hooks.py``       a robot type's skill set: stop checker, validators, parser, exec-time model
``warmup.py``      warming the engine before it serves, and measuring it (the step-time estimate's start)
``telemetry.py``   read-only views (the queue ranked, decision times)
=================  ==========================================================================================

Threading model
---------------
* One *engine thread* calls :meth:`PlannerCore.run_once` (or the split :meth:`start_step` /
  :meth:`complete_step` pair the simulator uses, or :meth:`serve_forever`). Only that thread touches the engine.
* Any thread may call :meth:`submit`, :meth:`cancel` and :meth:`report_segment_done`; they only change queued
  state under :attr:`lock` and set :attr:`wake` so a waiting engine thread re-plans at once. A cancel of a
  generation that sits in the engine is applied (engine.abort) by the engine thread at its next decision.
* ``on_segment`` / ``on_result`` callbacks run on the engine thread, outside the lock (they may call back into
  the core).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from timelyllm_ros.domain.clock import Clock
from timelyllm_ros.domain.types import Segment, TaskResult, TaskSpec, TaskStatus
from timelyllm_ros.engines.base import Engine, StepReport
from timelyllm_ros.engines.latency import LatencyEstimator
from timelyllm_ros.planner import events, robots, scheduling
from timelyllm_ros.planner.admission import Admission, make_admission
from timelyllm_ros.planner.boundaries import SegmentOrStream
from timelyllm_ros.planner.config import CoreConfig
from timelyllm_ros.planner.generation import Generation
from timelyllm_ros.planner.hooks import SkillHooks
from timelyllm_ros.planner.lengths import SegmentLengths
from timelyllm_ros.planner.overload import Overload
from timelyllm_ros.planner.ownership import RobotOwnership
from timelyllm_ros.planner.policies import Policy
from timelyllm_ros.planner.prefill import PrefillModel
from timelyllm_ros.planner.results import ResultStore
from timelyllm_ros.planner.runqueue import Intake, RunQueue
from timelyllm_ros.planner.watchdog import SilenceWatchdog

log = logging.getLogger(__name__)

SegmentCallback = Callable[[TaskResult, Segment], None]
ResultCallback = Callable[[TaskResult], None]


class PlannerCore:
    """Scheduler + engine + clock. See the module docstring for the threading model."""

    DECISION_LOG_LEN = 200_000

    def __init__(self, engine: Engine, policy: Policy, clock: Clock, *,
                 admission: Admission | str | int | None = None, config: CoreConfig | None = None,
                 on_segment: SegmentCallback | None = None, on_result: ResultCallback | None = None,
                 estimator: LatencyEstimator | None = None, hooks: Any = None) -> None:
        self.engine, self.policy, self.clock = engine, policy, clock
        cfg = self.cfg = config or CoreConfig()
        # A spec ('auto', 'adaptive', a cap) is kept: 'auto' follows the policy when it is switched.
        self._admission_spec = admission if isinstance(admission, str | int) else None
        if self._admission_spec is not None:
            self.admission = make_admission(self._admission_spec, segmented=policy.segmented,
                                            prefill_step_s=cfg.prefill_step_s)
        else:  # an Admission given, else the default: latency-guided
            self.admission = admission or make_admission("auto", segmented=True, prefill_step_s=cfg.prefill_step_s)
        self.on_segment, self.on_result = on_segment, on_result
        self.estimator = estimator or LatencyEstimator.for_engine(engine)
        self.hooks = hooks or SkillHooks(learn=cfg.learn_exec_times)
        self.wake = threading.Event()
        self.lock = threading.RLock()  # guards every component below; telemetry reads them under it too
        self._seq = itertools.count()
        # Below, what the core's own modules (scheduling.py, events.py, robots.py) share with it under the lock:
        self.tasks: dict[str, Generation] = {}  # every non-terminal task
        self.queue = RunQueue(cfg.comm_s, cfg.slack_floor_s)
        self.intake = Intake()  # goals still being taken in by the caller (a burst to wait for, RunQueue.gather_until)
        self.results = ResultStore(cfg.keep_results_s, cfg.keep_results_max)
        self.watchdog = SilenceWatchdog()
        self.ownership = RobotOwnership(busy=lambda t: t in self.tasks or self.watchdog.owes(t),
                                        live=self.tasks.get)
        self.prefill = PrefillModel(cfg.prefill_tokens_default, cfg.kv_block_tokens)
        self.overload = Overload(self.prefill, cfg.comm_s)
        self.segmenting = SegmentOrStream(self.prefill, cfg.comm_s, cfg.resume_lead_s)
        self.lengths = SegmentLengths(cfg.length_model, cfg.segment_tokens_prior,
                                      quantile_urgent=cfg.length_quantile_urgent,
                                      urgent_beta=cfg.length_urgent_beta, max_keys=cfg.length_max_keys)
        self.aborts: list[str] = []  # tasks the engine thread aborts in the engine at its next decision
        self.outbox: list[tuple[str, Any, Any]] = []  # callbacks to fire outside the lock
        # seconds, one per decision with candidates: the most recent DECISION_LOG_LEN (a planner runs for days)
        self.decision_times: deque[float] = deque(maxlen=self.DECISION_LOG_LEN)
        self.calibration: Any = None  # what warm-up measured on the engine (planner/warmup.py), where it did
        self.step_count = 0

    # -- thread-safe API ------------------------------------------------------
    def submit(self, spec: TaskSpec) -> str:
        """Queue a task; returns its id. The result always arrives via on_result."""
        with self.lock:
            seq = next(self._seq)
            tid = spec.task_id or f"t{seq}"
            if tid in self.tasks or tid in self.results:
                raise ValueError(f"task id {tid!r} already used")
            g = self._new_generation(spec, tid, seq)
            self.prefill.seed(spec.robot_type, g.warm_hit)
            self.tasks[g.task_id] = g
            robots.claim(self, g)
        self.wake.set()
        self._flush()
        return g.task_id

    def cancel(self, task_id: str, reason: str = "cancelled by client") -> bool:
        """Abort a task wherever it is; the robot gets a CANCELLED result. False if unknown/finished."""
        with self.lock:
            g = self.tasks.get(task_id)
            if g is None:
                return False
            if task_id in self.queue.running:
                g.abort_later(reason)
                self.aborts.append(task_id)
            else:
                self.finish(g, TaskStatus.CANCELLED, reason)
        self.wake.set()
        self._flush()
        return True

    def robot_alive(self, task_id: str, seg_index: int, robot_id: str) -> str | None:
        """The robot acknowledged a segment, or sent a heartbeat (it is executing it now). Returns why the
        message does not count (see :func:`planner.robots.sent_segment`), or None. A robot that keeps sending
        heartbeats is never called silent (:meth:`expire_silent`), however much slower than predicted its skill is."""
        with self.lock:
            found = robots.sent_segment(self, task_id, seg_index, robot_id)
            if isinstance(found, str):
                return found
            self.watchdog.heard(robot_id, self.clock.now())
            return None

    def report_segment_done(self, task_id: str, seg_index: int, finish_time: float | None = None,
                            success: bool = True, error: str = "", start_time: float | None = None,
                            robot_id: str | None = None) -> str | None:
        """A robot finished executing a segment (closed loop: real times replace predictions). Returns why the
        report was ignored (unknown or unsent segment, or ``robot_id`` not the task's robot), or None."""
        with self.lock:
            found = robots.sent_segment(self, task_id, seg_index, robot_id)
            if isinstance(found, str):  # the caller counts it and logs it once per claimed sender
                return found
            owner, seg = found
            if seg is None:  # the executor refused to end the plan there: the task's result already stands
                log.info("robot %s on the end of plan %s: %s", owner.robot_id, task_id, error or "ok")
                return None
            g = self.tasks.get(task_id)
            t = self.clock.now() if finish_time is None else float(finish_time)
            self.watchdog.heard(owner.robot_id, self.clock.now())
            seg.real_end, seg.success, seg.error = t, success, error
            if self.watchdog.reported(task_id, seg):  # the robot owes nothing more of this task
                if seg.success:  # it ran to the end: it stays DONE (a failure revises it, below)
                    self.ownership.preempted.pop(task_id, None)
                robots.release(self, owner.robot_id)
            if success and self.cfg.learn_exec_times and seg.calls:
                start = start_time if start_time is not None else seg.pred_start
                if start is not None and t > start:
                    try:
                        self.hooks.exec_model(owner.robot_type).observe(seg.calls, t - start)
                    except Exception as e:  # learning must never break scheduling; but say so
                        log.warning("exec model (%s) did not learn from %s[%s]: %s", owner.robot_type, task_id,
                                    seg_index, e)
            if not success:
                robots.end_or_revise(self, task_id, TaskStatus.ROBOT_FAILED,
                                    f"robot failed segment {seg_index}: {error or 'no reason given'}")
            elif g is not None:
                g.repredict(seg_index, self.cfg.comm_s)  # a real finish time: shift later predictions
                if g.status is TaskStatus.SUSPENDED and g.segments and g.k == len(g.segments):
                    events.requeue(self, g, self.clock.now())  # ... and the resume time
        self.wake.set()
        self._flush()
        return None

    def robot_failed(self, task_id: str, reason: str) -> None:
        """The transport or a watchdog says the robot failed this task: it ends ROBOT_FAILED (see
        :func:`planner.robots.end_or_revise`)."""
        with self.lock:
            robots.end_or_revise(self, task_id, TaskStatus.ROBOT_FAILED, reason)
        self.wake.set()
        self._flush()

    def robots_in_use(self) -> set[str]:
        """Robots with an open task, a task waiting for them, or segments they have not reported yet: what a
        caller must keep per robot (a publisher, say); anything kept for other robots may be released."""
        with self.lock:
            busy = self.ownership.robots()
            busy.update(g.robot_id for g in self.tasks.values())
            busy.update(self.watchdog.robots())
            return busy

    def expire_silent(self, now: float | None = None,
                      unacked: Callable[[str, int], bool] | None = None) -> list[str]:
        """End every task whose robot is silent about a dispatched segment (ROBOT_FAILED, naming the segment;
        :meth:`SilenceWatchdog.silent`). Returns the task ids it ended.

        ``unacked(task_id, index)``: the robot has not acknowledged that segment yet. It cannot report what
        it never received, so such a segment is not its silence: delivery re-sends it and, past its own
        bound, fails the task naming the segment (else, on a lossy link, a healthy robot that runs one task at
        a time and lost a segment was failed as silent)."""
        timeout = self.cfg.silence_timeout_s
        if timeout is None:
            return []
        with self.lock:
            now = self.clock.now() if now is None else now
            silent = self.watchdog.silent(now, timeout, unacked)
            for tid, s, heard in silent:
                quiet = "never heard" if heard == -math.inf else f"nothing heard for {now - heard:.1f} s"
                robots.end_or_revise(self, tid, TaskStatus.ROBOT_FAILED,
                                    f"robot silent: no heartbeat, ack or report ({quiet}), and no report for "
                                    f"segment {s.index} within its longest execution by the model "
                                    f"({max(s.est_exec_s, s.max_exec_s):.2f} s) + {timeout:g} s")
        self._flush()
        return [tid for tid, _, _ in silent]

    def unreported(self, now: float | None = None) -> list[tuple[str, str, str, Segment]]:
        """(task id, robot id, robot type, segment) of dispatched segments to ask the robot about again
        (:meth:`SilenceWatchdog.to_probe`), each once."""
        if self.cfg.silence_timeout_s is None:
            return []
        with self.lock:
            now = self.clock.now() if now is None else now
            probes = [(t, s, self.tasks.get(t) or self.results.get(t)) for t, s in
                      self.watchdog.to_probe(now, self.cfg.silence_timeout_s)]
            return [(t, o.robot_id, o.robot_type, s) for t, s, o in probes if o is not None]

    def fail_all(self, reason: str, status: TaskStatus = TaskStatus.FAILED) -> int:
        """End every open task at once (the engine died, or a drain or shutdown: nothing may wait for the
        engine thread). What the engine holds of them is released at the engine thread's next decision: on
        this engine when it serves on (a drain; a restart that reuses it), a no-op on a replacement
        (:meth:`replace_engine`)."""
        with self.lock:
            gens = list(self.tasks.values())
            self.aborts.extend(self.queue.running)
            self.queue.running.clear()
            for g in gens:
                self.finish(g, status, reason)
        self._flush()
        return len(gens)

    def replace_engine(self, engine: Engine) -> None:
        """Serve from a new engine (after a crash); only when no task is open."""
        with self.lock:
            if self.tasks:
                raise RuntimeError(f"replace_engine with {len(self.tasks)} open tasks")
            self.engine = engine
            self.estimator = self.estimator.for_replaced_engine(engine)  # a pool's estimate is its members'
            self.prefill.forget_warm()  # the old engine's prefix cache went with it
        self.wake.set()

    def note_warm_prompt(self, robot_type: str, prompt_ids: list[int]) -> None:
        """``prompt_ids`` sits in the engine's prefix cache (warm_up, or a simulator's warmed prefix): every task of
        this robot type is estimated with the longest prefix it shares with one of these as cached
        (:meth:`PrefillModel.warm_hit`), not as a cold prompt (with which pud-shed shed urgent tasks it could
        serve)."""
        if self.engine.info.supports_prefix_cache and prompt_ids:
            with self.lock:
                self.prefill.note_warm_prompt(robot_type, prompt_ids, self.engine)

    def restore(self, spec: TaskSpec, segments: list[Segment], *, final: bool = False) -> str:
        """Re-open a task journaled by a planner that died: its segments were already sent (their
        dispatch/prediction times in this clock), so its generation resumes after the last one from
        the exact token ids, with the stop checker fed the text written so far.
        ``final``: the plan had ended (its last segment or end marker was sent): it ends DONE."""
        with self.lock:
            tid = spec.task_id
            if not tid or tid in self.tasks or tid in self.results:
                raise ValueError(f"task id {tid!r}: missing or already known")
            g = self._new_generation(spec, tid, next(self._seq), segments)
            self.tasks[tid] = g
            if g.segments:  # its plan was already on the robot when the planner died
                back = self.ownership.restore_owner(g)
                if back is not None:  # restored before it and claimed the robot, but was waiting: waits again
                    self.queue.cands.pop(back, None)
            unreported = [s for s in g.segments if s.dispatch is not None and s.real_end is None]
            if unreported:
                self.watchdog.restored(tid, g.robot_id, unreported, self.clock.now())
            if final or (g.segments and g.segments[-1].final):
                if g.segments:
                    g.segments[-1].final = True
                self.finish(g, TaskStatus.DONE, "")
            elif not g.segments:
                robots.claim(self, g)
            else:
                ids = spec.prompt_token_ids if spec.prompt_token_ids is not None else self.engine.tokenize(spec.prompt)
                g.checker = self.hooks.stop_checker(g.robot_type)
                for s in g.segments:  # the grammar state (open braces, ...) of what was written
                    g.checker.feed(s.text)
                    g.checker.cut()
                g.req = g.engine_request(ids, self.policy.segmented, g.checker,
                                         [t for s in g.segments for t in s.token_ids])
                g.suspend()
                events.requeue(self, g, self.clock.now())
        self.wake.set()
        self._flush()
        return tid

    def task_status(self, task_id: str) -> TaskStatus | None:
        with self.lock:
            g = self.tasks.get(task_id)
            if g is not None:
                return g.status
            r = self.results.get(task_id)
            return r.status if r else None

    def result(self, task_id: str) -> TaskResult | None:
        # One dict read (atomic under the GIL), not the lock: intake asks this of every goal it screens, and must
        # not wait behind the engine thread's handling of a step.
        return self.results.get(task_id)

    def generation(self, task_id: str) -> Generation | None:
        """The live state of an open task's generation, else None."""
        with self.lock:
            return self.tasks.get(task_id)

    def pending(self) -> int:
        with self.lock:
            return len(self.tasks)

    def snapshot(self) -> dict:
        """Scheduler state for telemetry."""
        with self.lock:
            q = self.queue
            return {"queued": len(q.cands), "suspended": q.parked(), "running": len(q.running),
                    "tasks": len(self.tasks), "done": len(self.results), "policy": self.policy.name,
                    "waiting_for_robot": self.ownership.waiting(),
                    "admission": self.admission.name, "length_model": self.lengths.model,
                    "boundaries_suspended": self.segmenting.counts["suspended"],
                    "boundaries_streamed": self.segmenting.counts["streamed"],
                    "per_token_s": self.estimator.step_time(max(1, len(q.running)))}

    def set_policy(self, policy: Policy) -> None:
        """Switch the policy at run time; it applies from the next decision (with its admission, where
        the core was given 'auto')."""
        with self.lock:
            self.policy = policy
            for g in self.queue.running.values():  # a plan written on in place suspends again under a segmented one
                if g.req is not None:
                    g.req.suspend_at_boundary = policy.segmented
            if self._admission_spec is not None:
                self.admission = make_admission(self._admission_spec, segmented=policy.segmented,
                                                prefill_step_s=self.cfg.prefill_step_s)
        self.wake.set()

    def running_ids(self) -> list[str]:
        with self.lock:
            return list(self.queue.running)

    # -- engine thread ----------------------------------------------------------
    def run_once(self) -> float | None:
        """One decision + one engine step (blocking). Returns the next wake-up time (None: idle)."""
        rep = self.start_step()
        if rep is not None:
            self.complete_step(rep)
        return self.next_wakeup()

    def serve_forever(self, stop: threading.Event) -> None:
        """Engine-thread loop for real time; returns when ``stop`` is set."""
        while not stop.is_set():
            w = self.run_once()
            if stop.is_set():
                break
            if w is None or w > self.clock.now():
                self.clock.wait_until(w if w is not None else self.clock.now() + 0.5, self.wake)

    def next_wakeup(self) -> float | None:
        """When run_once has something to do: now if busy, else the next resume time, else None."""
        with self.lock:
            now = self.clock.now()
            if self.engine.has_work() or self.aborts:
                return now
            if self.queue.cands:  # (an idle engine may wait for the rest of a burst)
                return self.queue.gather_until(now, self.cfg.gather_s, self.estimator.step_time(1),
                                               self.intake.latest()) or now
            return self.queue.next_due()

    def note_stamp_lag(self, lag_s: float) -> None:
        """A robot's stamp ran ``lag_s`` behind the planner's clock (watchdog: silence is judged net of it)."""
        self.watchdog.note_lag(lag_s, self.clock.now())

    def start_step(self) -> StepReport | None:
        """Decide and launch one engine step; None if the engine has nothing to do.

        For a real engine the step runs (blocks) here; the simulator instead
        advances its clock by ``report.duration_s`` and then calls complete_step.
        """
        with self.lock:
            now = self.clock.now()
            scheduling.apply_aborts(self)
            spent = scheduling.schedule(self, now)
            scheduling.apply_aborts(self)  # of suspended tasks the decision itself ended
            if self.policy.segmented and self.policy.adaptive:
                t0 = time.perf_counter()
                if self.segmenting.decide(now, self.queue, self.policy, self.engine, self.admission, self.estimator):
                    spent = (spent or 0.0) + time.perf_counter() - t0  # part of the decision when it weighed anything
            if spent is not None and self.cfg.record_decisions:
                self.decision_times.append(spent)
        self._flush()
        if not self.engine.has_work():
            return None
        return self.engine.step()

    def complete_step(self, report: StepReport) -> None:
        """Handle the step's segment events at the current clock time."""
        with self.lock:
            now = self.clock.now()
            self.step_count += 1
            duration = report.duration_s
            if report.new_tokens > report.batch_size > 0 and not report.prefill_tokens:
                # Speculative decoding: a step gave each generation several tokens; the estimate is per token.
                duration *= report.batch_size / report.new_tokens
            self.estimator.observe(report.batch_size, duration, report.prefill_tokens)
            self.overload.observe_step(report.prefill_tokens)
            for ev in report.events:
                g = self.tasks.get(ev.gen_id)
                if g is None or g.pending_abort:
                    continue
                try:
                    events.on_event(self, g, ev, now)
                except Exception as e:  # noqa: BLE001 - one task's event must not crash the loop (it fails all)
                    log.exception("%s: handling its %s event failed", ev.gen_id, ev.reason.value)
                    self.queue.drop(g.task_id)
                    if g.task_id in self.engine.running_ids():
                        self.engine.abort(g.task_id)
                    self.finish(g, TaskStatus.FAILED, f"planner error on segment {len(g.segments)} "
                                                       f"({ev.text.strip()[:60]!r}): {type(e).__name__}: {e}")
        self._flush()

    # -- tasks and their robots (the caller holds the lock) -------------------------------------------
    def _new_generation(self, spec: TaskSpec, tid: str, seq: int, segments: list[Segment] | None = None
                        ) -> Generation:
        arrival = self.clock.now() if spec.arrival is None else float(spec.arrival)
        g = Generation(spec, tid, arrival, seq)
        g.segments = list(segments or [])
        self.lengths.estimate(g)
        self.prefill.price(g, self.engine, self.estimator)
        return g

    # -- results ------------------------------------------------------------------
    def finish(self, g: Generation, status: TaskStatus, reason: str) -> None:
        """End ``g`` with ``status`` (the caller holds the lock): its result goes out at the next flush, its robot
        to the next waiting task. A task already ended stays as it ended."""
        if g.status.terminal:
            return
        if g.status is TaskStatus.SUSPENDED:
            # The engine may still hold it (a parked vLLM request, a kept cache). The engine thread releases
            # it (start_step), never a caller's thread while a step runs.
            self.aborts.append(g.task_id)
        g.end(status, reason)
        self.tasks.pop(g.task_id, None)
        self.queue.drop(g.task_id)
        res = g.result(self.cfg.comm_s)
        if status is not TaskStatus.DONE:
            self.watchdog.drop(g.task_id)  # nothing more is expected of the robot
        elif g.segments and g.segments[-1].final:  # a complete plan: learn how long plans of its task are
            self.lengths.observe_plan(g.spec, [len(s.token_ids) for s in g.segments])
        for tid, old in self.results.add(res, self.clock.now()):  # bounded memory: the oldest results go
            self.ownership.preempted.pop(tid, None)
            if self.watchdog.drop(tid) and old is not None:
                robots.release(self, old.robot_id)
        self.outbox.append(("result", res, None))
        self.ownership.leave_turns(g.robot_id, g.task_id)  # ended while waiting for its robot
        robots.release(self, g.robot_id)

    def _flush(self) -> None:
        with self.lock:
            out, self.outbox = self.outbox, []
        for kind, a, b in out:
            try:
                if kind == "segment":
                    if self.on_segment is not None:
                        self.on_segment(a.segment_view(), b)
                elif self.on_result is not None:
                    self.on_result(a)
            except Exception:  # a broken callback must not kill the engine thread
                log.exception("%s callback failed", kind)
