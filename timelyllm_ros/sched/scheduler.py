"""Task / generation state, the queue, and the PlannerCore runtime.

PlannerCore drives one :class:`~timelyllm_ros.engines.base.Engine` under a
:class:`~timelyllm_ros.sched.policies.Policy`, an admission rule and a
:class:`~timelyllm_ros.model.clock.Clock`, and talks to robots only through
callbacks, so the same object runs in the ROS planner node (RealClock, real
engine, a dedicated engine thread) and in the discrete-event simulator
(SimClock, SimEngine).

Threading model
---------------
* One *engine thread* calls :meth:`PlannerCore.run_once` (or the split
  :meth:`start_step` / :meth:`complete_step` pair the simulator uses, or
  :meth:`serve_forever`). Only that thread touches the engine.
* Any thread may call :meth:`submit`, :meth:`cancel` and
  :meth:`report_segment_done`; they only change queued state under a lock and
  set :attr:`wake` so a waiting engine thread re-plans at once. A cancel of a
  generation that sits in the engine is applied (engine.abort) by the engine
  thread at its next decision.
* ``on_segment`` / ``on_result`` callbacks run on the engine thread, outside
  the lock (they may call back into the core).

One task per robot
------------------
A robot runs one task at a time, and the planner decides which (the same rule in the ROS planner, the
simulator and the demo; README "A busy robot"). A task *owns* its robot from when it is accepted (or
released to) until it has ended and the robot has reported every segment sent to it. A new task for
a robot owned by another:

* preempts it when its beta is strictly higher (an urgent task over a normal one): the older task
  ends CANCELLED ("preempted by task ..."), and the robot drops the rest of it when the new task's
  segment 0 arrives (executor_base: segment 0 of a different task preempts). A finished generation
  whose plan the robot may still be running has its result revised to that once the robot reports a
  segment it did not run to the end; if it reports every one done (the plan ended before the new
  task's segment 0 reached it), the result stays DONE;
* otherwise waits its turn: it is not generated (not a candidate) until the robot is released, so
  its segment 0 never interrupts the plan in progress; its response time still counts from its
  arrival.

Resume timing
-------------
A suspended generation becomes *eligible* again at
``exec_end(s_{k-1}) - G(s_k) - comm - lead``: the latest moment at which
starting it would still let s_k reach the robot as it finishes s_{k-1},
minus a lead margin (``resume_lead_s``) that absorbs queueing behind other
generations and the error of G. exec_end is predicted from the execution-time
model's *minimum* (the earliest the robot can finish) and replaced by the real
finish time once the robot reports it. Before it is eligible a suspended
generation is not a candidate at all: it would only take batch slots (and
slow every other generation) to produce a segment nobody needs yet.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from timelyllm_ros.engines.base import Engine, EngineRequest, FinishReason, SegmentEvent, StepReport
from timelyllm_ros.engines.latency import LatencyEstimator
from timelyllm_ros.model.clock import Clock
from timelyllm_ros.model.tokens import common_prefix_len
from timelyllm_ros.model.types import DEGRADED_PREFIX, Generation, Segment, TaskResult, TaskSpec, TaskStatus
from timelyllm_ros.sched.admission import Admission, AdmissionView, LatencyGuided, make_admission
from timelyllm_ros.sched.lengths import PlanLengths
from timelyllm_ros.sched.policies import Policy, RankContext
from timelyllm_ros.skills.minispec import SkillParseError
from timelyllm_ros.skills.segmenter import StopChecker

log = logging.getLogger(__name__)


@dataclass
class CoreConfig:
    comm_s: float = 0.008  # one network hop (paper's LAN)
    slack_floor_s: float = 0.001
    resume_lead_s: float = 0.05
    overdue: str = "serve"  # "serve": keep serving (PUD puts it last) | "reject": answer with a rejection
    segment_tokens_prior: dict[str, float] = field(
        default_factory=lambda: {"drone": 6.0, "arm": 12.0, "chatbot": 15.0})
    # How many tokens the next segment takes (G = tokens x step time, in ranking, resume timing and admission):
    # "learned": per task from finished segments and plans, with an uncertainty (sched/lengths.py);
    # "ewma": one running mean per robot type, seeded by segment_tokens_prior (cheaper, blind to the task).
    length_model: str = "learned"
    # Under "learned", urgent tasks (beta >= length_urgent_beta) plan with this quantile of the prediction, not
    # its mean: their next segment is started early enough for a longer than usual segment (resume timing) and
    # admission protects them for it. A normal task plans with the mean.
    length_quantile_urgent: float = 0.9
    length_urgent_beta: float = 1.5
    length_max_keys: int = 1024  # memory bound of the learned model: keys kept (LRU), ~2.5 kB each
    prefill_tokens_default: int = 64  # prefill estimate when a prompt is not tokenized yet
    # Tokens per KV block: a resubmission recomputes what its last full block leaves. None: the engine's own
    # (EngineInfo.kv_block_tokens: 16 in the simulator, the vLLM build's block size, e.g. 32 on CPU), else 16.
    kv_block_tokens: int | None = None
    learn_exec_times: bool = True  # feed robot reports into the exec-time model
    record_decisions: bool = True
    # Finished results are kept this long / at most this many (then the task id can be used again).
    keep_results_s: float = 600.0
    keep_results_max: int = 10_000
    # A robot that has not reported a dispatched segment by its predicted end + this margin has failed
    # (None: trust predictions forever, as the simulator does).
    robot_timeout_s: float | None = None
    # Latency-guided admission's prefill budget per step (LatencyGuided.prefill_step_s), for an admission the core
    # builds from a name ('auto', 'latency'). None: off (the default, as it costs under load; see admission.py).
    prefill_step_s: float | None = None

    def __post_init__(self) -> None:
        if self.overdue not in ("serve", "reject"):
            raise ValueError(f"CoreConfig.overdue must be 'serve' or 'reject', got {self.overdue!r}")
        for name in ("comm_s", "resume_lead_s"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"CoreConfig.{name} must be a finite number >= 0")
        if not (self.slack_floor_s > 0 and math.isfinite(self.slack_floor_s)):
            raise ValueError("CoreConfig.slack_floor_s must be > 0")
        if self.length_model not in LENGTH_MODELS:
            raise ValueError(f"CoreConfig.length_model must be one of {LENGTH_MODELS}, got {self.length_model!r}")
        if not 0.0 < self.length_quantile_urgent < 1.0:
            raise ValueError("CoreConfig.length_quantile_urgent must be in (0, 1)")
        if self.length_max_keys < 3:
            raise ValueError("CoreConfig.length_max_keys must be >= 3")
        if self.kv_block_tokens is not None and self.kv_block_tokens < 1:
            raise ValueError("CoreConfig.kv_block_tokens must be >= 1 (or None: the engine's)")
        if self.prefill_step_s is not None and not (math.isfinite(self.prefill_step_s) and self.prefill_step_s > 0):
            raise ValueError(f"CoreConfig.prefill_step_s must be a finite number > 0 (or None: off), "
                             f"got {self.prefill_step_s!r}")


LENGTH_MODELS = ("learned", "ewma")
WARM_PROMPTS_KEPT = 64  # per robot type: the planner warms one prompt per set of few-shot families (21 for a drone)
KV_TIGHT = 0.9  # KV cache usage from which a suspended generation's own blocks count as evicted by its resume


SegmentCallback = Callable[[TaskResult, Segment], None]
ResultCallback = Callable[[TaskResult], None]


class _SkillHooks:
    """Stop checkers, parsers and exec-time models per robot type (lazy, cached)."""

    def __init__(self, learn: bool = True) -> None:
        self.learn = learn
        self._sets: dict[str, Any] = {}
        self._models: dict[str, Any] = {}

    def skillset(self, robot_type: str) -> Any:
        s = self._sets.get(robot_type)
        if s is None:
            from timelyllm_ros.skills.schema import load_skill_set

            s = self._sets[robot_type] = load_skill_set(robot_type)
        return s

    def stop_checker(self, robot_type: str) -> StopChecker:
        from timelyllm_ros.skills.segmenter import make_stop_checker

        return make_stop_checker(self.skillset(robot_type))

    def validate(self, robot_type: str, text: str) -> str | None:
        """None if ``text`` is a valid segment of the robot's skill set, else the reason."""
        try:
            return self.skillset(robot_type).validate(text)
        except Exception as e:  # noqa: BLE001 - a validator that raises fails this plan, not the engine loop
            return f"the {robot_type} validator raised {type(e).__name__}: {e}"

    def validate_plan(self, robot_type: str, text: str) -> str | None:
        """None if ``text`` is a valid complete plan of the robot's skill set, else the reason."""
        try:
            return self.skillset(robot_type).validate_plan(text)
        except Exception as e:  # noqa: BLE001
            return f"the {robot_type} plan validator raised {type(e).__name__}: {e}"

    def parse(self, robot_type: str, text: str) -> list[Any]:
        if not text.strip():
            return []
        try:
            return list(self.skillset(robot_type).parse(text))
        except Exception as e:  # still dispatched: the robot's executor reports the error
            log.warning("segment %r does not parse for %s: %s", text, robot_type, e)
            return []

    def exec_model(self, robot_type: str) -> Any:
        m = self._models.get(robot_type)
        if m is None:
            from timelyllm_ros.skills.exec_model import ExecTimeModel

            m = self._models[robot_type] = ExecTimeModel(self.skillset(robot_type), learn=self.learn)
        return m


def _drain(queue: list[list[Any]], tokens: int) -> None:
    """Take ``tokens`` of prefill off a first-come-first-served queue of [id, tokens left, ...] entries (a chunked
    prefill step)."""
    for e in queue:
        if tokens <= 0:
            return
        take = min(tokens, e[1])
        e[1] -= take
        tokens -= take


class PlannerCore:
    """Scheduler + engine + clock. See the module docstring for the threading model."""

    DECISION_LOG_LEN = 200_000

    def __init__(self, engine: Engine, policy: Policy, clock: Clock, *,
                 admission: Admission | str | int | None = None, config: CoreConfig | None = None,
                 on_segment: SegmentCallback | None = None, on_result: ResultCallback | None = None,
                 estimator: LatencyEstimator | None = None, hooks: Any = None) -> None:
        self.engine, self.policy, self.clock = engine, policy, clock
        self.cfg = config or CoreConfig()
        # A spec ('auto', 'adaptive', a cap) is kept: 'auto' follows the policy when it is switched.
        self._admission_spec = admission if isinstance(admission, str | int) else None
        if self._admission_spec is not None:
            self.admission = self._named_admission(policy)
        else:
            self.admission = admission or LatencyGuided(prefill_step_s=self.cfg.prefill_step_s)
        self.on_segment, self.on_result = on_segment, on_result
        self.estimator = estimator or LatencyEstimator.for_engine(engine)
        self.hooks = hooks or _SkillHooks(learn=self.cfg.learn_exec_times)
        self.wake = threading.Event()
        self._lock = threading.RLock()
        self._seq = itertools.count()
        self._tasks: dict[str, Generation] = {}  # every non-terminal task
        self._done: dict[str, TaskResult] = {}  # finished, oldest first (bounded: keep_results_*)
        self._done_at: dict[str, float] = {}
        self._watch: dict[str, list[Segment]] = {}  # task -> dispatched segments the robot has not reported
        self._preempted: dict[str, str] = {}  # DONE task, preempted while in _watch -> why (bounded by _watch)
        self._report_lag = 0.0  # how far behind the caller reads robot reports (s): not the robot's silence
        self._report_lag_at = 0.0
        self._robot_heard: dict[str, float] = {}  # robot -> when its latest report or ack was read (clock time)
        self._owner: dict[str, tuple[str, float]] = {}  # robot -> (task that owns it, its beta)
        self._turns: dict[str, deque[str]] = {}  # robot -> tasks waiting for it, in arrival order
        self.lag_window_s = 10.0
        self._cands: dict[str, Generation] = {}  # eligible, not running
        self._waiting: list[tuple[float, int, int, Generation]] = []  # (eligible_at, seq, version, gen)
        self._running: dict[str, Generation] = {}
        self._aborts: list[str] = []
        self._tok_est = dict(self.cfg.segment_tokens_prior)  # length_model "ewma": robot type -> tokens
        # Learned under either length_model (a run-time switch keeps what was learned); used under "learned".
        self.lengths = PlanLengths(self.cfg.segment_tokens_prior, max_keys=self.cfg.length_max_keys)
        self._cache_hit: dict[str, float] = {}  # robot type -> prefix-cache hit tokens of new prompts (EWMA)
        self._cache_hit_max: dict[str, int] = {}  # robot type -> the largest hit seen (a best case, for shedding)
        # (robot type, first segment?) -> the fewest tokens such a segment has taken (a best case, for shedding)
        self._tok_min: dict[tuple[str, bool], int] = {}
        self._exec_min: dict[str, float] = {}  # robot type -> the least predicted execution of a segment with a skill
        # Shedding's model of the engine's chunked prefill, first come first served: first segments admitted and
        # not yet through their prompt, [task id, best-case tokens left, admitted at], drained by the steps' reports.
        self._prefill_queue: list[list[Any]] = []
        self._prefill_step_max = 0  # the most prefill tokens one step has carried (at most the engine's budget)
        # robot type -> the prompts warm_up left in the prefix cache (one per few-shot family set: a task shares
        # its prefix with one of them only), the last WARM_PROMPTS_KEPT
        self._warm_prompts: dict[str, deque[list[int]]] = {}
        self._outbox: list[tuple[str, Any, Any]] = []  # callbacks to fire outside the lock
        # seconds, one per decision with candidates: the most recent DECISION_LOG_LEN (a planner runs for days)
        self.decision_times: deque[float] = deque(maxlen=self.DECISION_LOG_LEN)
        self.step_count = 0
        # segment boundaries a generation suspended at / wrote on past in place (Policy.adaptive decides which)
        self.boundaries = {"suspended": 0, "streamed": 0}

    # -- thread-safe API ------------------------------------------------------
    def submit(self, spec: TaskSpec) -> str:
        """Queue a task; returns its id. The result always arrives via on_result."""
        with self._lock:
            seq = next(self._seq)
            tid = spec.task_id or f"t{seq}"
            if tid in self._tasks or tid in self._done:
                raise ValueError(f"task id {tid!r} already used")
            arrival = self.clock.now() if spec.arrival is None else float(spec.arrival)
            g = Generation(spec, tid, arrival, seq)
            self._estimate_length(g)
            g.warm_hit = self._warm_hit(spec)
            self._seed_cache_hit(spec, g.warm_hit)
            g.prefill_est_s = self._prefill_estimate(spec, hit=g.warm_hit)
            self._tasks[tid] = g
            self._claim(g)
        self.wake.set()
        self._flush()
        return tid

    def cancel(self, task_id: str, reason: str = "cancelled by client") -> bool:
        """Abort a task wherever it is; the robot gets a CANCELLED result. False if unknown/finished."""
        with self._lock:
            g = self._tasks.get(task_id)
            if g is None:
                return False
            if task_id in self._running:
                g.pending_abort = True
                g.reason = reason
                self._aborts.append(task_id)
            else:
                self._finish(g, TaskStatus.CANCELLED, reason)
        self.wake.set()
        self._flush()
        return True

    def _sent_segment(self, task_id: str, seg_index: int, robot_id: str | None
                      ) -> tuple[Generation | TaskResult, Segment | None] | str:
        """(task, segment) a robot message may speak of, or why it may not: the task must be known, the segment
        sent to the robot, and ``robot_id`` (None: not checked) the task's robot. Any node on the domain can
        publish reports and acks; one naming another robot's task must not end or free it. The segment is None
        for the end-of-plan marker of a finished plan (index = its number of segments)."""
        owner = self._tasks.get(task_id) or self._done.get(task_id)
        if owner is None:
            return f"unknown task {task_id!r}"
        if robot_id is not None and robot_id != owner.robot_id:
            return f"robot {robot_id!r} spoke for task {task_id!r} of robot {owner.robot_id!r}"
        segs = owner.segments
        if seg_index == len(segs) and segs and task_id not in self._tasks:
            return owner, None
        if not 0 <= seg_index < len(segs) or segs[seg_index].dispatch is None:
            return f"segment {seg_index} of task {task_id!r} was never sent"
        return owner, segs[seg_index]

    def _heard(self, robot_id: str) -> None:
        self._robot_heard[robot_id] = self.clock.now()
        if len(self._robot_heard) > 50_000:  # bounded: forget the robots heard from longest ago
            for rid in sorted(self._robot_heard, key=self._robot_heard.__getitem__)[:25_000]:
                del self._robot_heard[rid]

    def robot_alive(self, task_id: str, seg_index: int, robot_id: str) -> str | None:
        """The robot acknowledged a segment, or sent a heartbeat (it is executing it now). Returns why the
        message does not count (see :meth:`_sent_segment`), or None. A robot that keeps sending heartbeats is
        never called silent (:meth:`expire_silent`), however much slower than predicted its skill is."""
        with self._lock:
            found = self._sent_segment(task_id, seg_index, robot_id)
            if isinstance(found, str):
                return found
            self._heard(robot_id)
            return None

    def report_segment_done(self, task_id: str, seg_index: int, finish_time: float | None = None,
                            success: bool = True, error: str = "", start_time: float | None = None,
                            robot_id: str | None = None) -> str | None:
        """A robot finished executing a segment (closed loop: real times replace predictions). Returns why the
        report was ignored (unknown or unsent segment, or ``robot_id`` not the task's robot), or None."""
        with self._lock:
            found = self._sent_segment(task_id, seg_index, robot_id)
            if isinstance(found, str):
                log.warning("report ignored: %s", found)
                return found
            owner, seg = found
            if seg is None:  # the executor refused to end the plan there: the task's result already stands
                log.info("robot %s on the end of plan %s: %s", owner.robot_id, task_id, error or "ok")
                return None
            g = self._tasks.get(task_id)
            res = self._done.get(task_id)
            t = self.clock.now() if finish_time is None else float(finish_time)
            self._heard(owner.robot_id)
            seg.real_end, seg.success, seg.error = t, success, error
            self._reported(task_id, seg)
            robot_type = g.robot_type if g is not None else res.robot_type
            if success and self.cfg.learn_exec_times and seg.calls:
                start = start_time if start_time is not None else seg.pred_start
                if start is not None and t > start:
                    try:
                        self.hooks.exec_model(robot_type).observe(seg.calls, t - start)
                    except Exception as e:  # learning must never break scheduling; but say so
                        log.warning("exec model (%s) did not learn from %s[%s]: %s", robot_type, task_id,
                                    seg_index, e)
            if not success:
                self._robot_failed(task_id, f"robot failed segment {seg_index}: {error or 'no reason given'}")
            elif g is not None:
                self._repredict(g, seg_index)
        self.wake.set()
        self._flush()
        return None

    def robot_failed(self, task_id: str, reason: str) -> None:
        """The transport or a watchdog says the robot failed this task (see :meth:`_robot_failed`)."""
        with self._lock:
            self._robot_failed(task_id, reason)
        self.wake.set()
        self._flush()

    def _robot_failed(self, task_id: str, reason: str) -> None:
        """The robot failed (or went silent): end the task ROBOT_FAILED."""
        self._end_or_revise(task_id, TaskStatus.ROBOT_FAILED, reason)

    def _end_or_revise(self, task_id: str, status: TaskStatus, reason: str) -> None:
        """End an open task with ``status`` (a generating one is aborted in the engine first); a task whose
        generation had already ended DONE gets its published result revised (never silently left at DONE)."""
        g = self._tasks.get(task_id)
        if g is not None:
            if task_id in self._running:
                g.pending_abort, g.reason, g.abort_status = True, reason, status
                self._aborts.append(task_id)
            else:
                self._finish(g, status, reason)
            return
        res = self._done.get(task_id)
        if res is not None and res.status is TaskStatus.DONE:
            why = self._preempted.pop(task_id, None)
            if why is not None:  # what the robot did not run to the end, it was told to drop
                status, reason = TaskStatus.CANCELLED, why
            self._revise(res, status, reason)

    def _revise(self, res: TaskResult, status: TaskStatus, reason: str) -> None:
        """A finished task's robot did not run its plan to the end: publish the result again, revised."""
        res.status, res.reason = status, reason
        self._watch.pop(res.task_id, None)
        self._outbox.append(("result", res, None))
        self._release(res.robot_id)

    # -- one task per robot (module docstring) ------------------------------------------
    def _claim(self, g: Generation) -> None:
        """A new task asks for its robot: it owns a free one, preempts a lower-beta owner, or waits its turn."""
        rid = g.robot_id
        self._release(rid)  # the owner may have ended since
        owner = self._owner.get(rid)
        if owner is not None and g.tuf.beta <= owner[1]:
            self._turns.setdefault(rid, deque()).append(g.task_id)
            return
        self._owner[rid] = (g.task_id, g.tuf.beta)  # first: ending the old owner must not release the robot
        self._cands[g.task_id] = g
        if owner is not None:
            self._preempt(owner[0], owner[1], g)

    def _preempt(self, old_id: str, old_beta: float, by: Generation) -> None:
        reason = f"preempted by task {by.task_id} (beta {by.tuf.beta:g} > {old_beta:g})"
        if old_id not in self._tasks and old_id in self._watch:
            # Generated DONE, not all reported: the robot may have run it all before the new segment 0 came.
            # A report of a segment not run to the end revises it CANCELLED with this reason (_end_or_revise).
            self._preempted[old_id] = reason
        else:
            self._end_or_revise(old_id, TaskStatus.CANCELLED, reason)

    def _release(self, robot_id: str) -> None:
        """Hand the robot to the waiting task of highest beta once its owner has ended and every segment sent
        to it has been reported (or given up on)."""
        owner = self._owner.get(robot_id)
        if owner is not None and (owner[0] in self._tasks or owner[0] in self._watch):
            return
        self._owner.pop(robot_id, None)
        turns = self._turns.get(robot_id)
        if turns is None:
            return
        waiting = [g for t in turns if (g := self._tasks.get(t)) is not None and not g.status.terminal]
        if waiting:  # the highest beta, first come among equals: it would have preempted any of the others
            g = max(waiting, key=lambda w: w.tuf.beta)
            waiting.remove(g)
            self._owner[robot_id] = (g.task_id, g.tuf.beta)
            g.enqueued_at = self.clock.now()
            self._cands[g.task_id] = g
        turns.clear()
        turns.extend(w.task_id for w in waiting)
        if not turns:
            del self._turns[robot_id]

    def robots_in_use(self) -> set[str]:
        """Robots with an open task, a task waiting for them, or segments they have not reported yet: what a
        caller must keep per robot (a publisher, say); anything kept for other robots may be released."""
        with self._lock:
            busy = set(self._owner) | set(self._turns)
            busy.update(g.robot_id for g in self._tasks.values())
            for tid in self._watch:
                owner = self._tasks.get(tid) or self._done.get(tid)
                if owner is not None:
                    busy.add(owner.robot_id)
            return busy

    def waiting_for_robot(self) -> int:
        """Tasks accepted but waiting for their robot to finish another task (telemetry)."""
        with self._lock:
            return sum(len(t) for t in self._turns.values())

    def _reported(self, task_id: str, seg: Segment) -> None:
        pending = self._watch.get(task_id)
        if pending is not None:
            pending[:] = [s for s in pending if s is not seg]  # identity: segments compare by value
            if not pending:
                del self._watch[task_id]
                if seg.success:  # it ran to the end: it stays DONE (a failure revises it, report_segment_done)
                    self._preempted.pop(task_id, None)
                owner = self._tasks.get(task_id) or self._done.get(task_id)
                if owner is not None:
                    self._release(owner.robot_id)

    def note_report_lag(self, lag_s: float) -> None:
        """How old the robot report just read was (now - its stamp). A planner that is behind on reading
        reports must not call a robot silent whose report is merely waiting in its own queue."""
        now = self.clock.now()
        lag = max(0.0, float(lag_s))
        # The largest lag of the last lag_window_s: reports and acks arrive on queues of their own, and one
        # quick queue must not hide that another is seconds behind.
        if lag >= self._report_lag or now - self._report_lag_at > self.lag_window_s:
            self._report_lag, self._report_lag_at = lag, now

    def expire_silent(self, now: float | None = None,
                      unacked: Callable[[str, int], bool] | None = None) -> list[str]:
        """End every task whose robot is silent about a dispatched segment (ROBOT_FAILED, naming the segment).
        Returns the task ids it ended.

        Silent: nothing heard from the robot (no heartbeat, ack or report: :meth:`robot_alive`) for
        ``robot_timeout_s``, *and* the segment unreported past the model's longest execution +
        ``robot_timeout_s``. An executor that sends heartbeats while it runs a segment is never silent while it
        does, however long the skill takes (a drone's first scan took 16.5 s where the model allowed 12.2 s);
        one that sends none is judged by the model, as before heartbeats existed.

        ``unacked(task_id, index)``: the robot has not acknowledged that segment yet. It cannot report what
        it never received, so such a segment is not its silence: delivery re-sends it and, past its own
        bound, fails the task naming the segment. Once a robot runs one task at a time, a segment lost on a
        lossy link left the robot quiet, and a healthy robot was failed as silent (CI, 5 % packet loss)."""
        if self.cfg.robot_timeout_s is None:
            return []
        ended = []
        with self._lock:
            now = self.clock.now() if now is None else now
            limit = self.cfg.robot_timeout_s + self._report_lag
            for tid, pending in list(self._watch.items()):
                owner = self._tasks.get(tid) or self._done.get(tid)
                heard = self._robot_heard.get(owner.robot_id, -math.inf) if owner is not None else -math.inf
                if now <= heard + limit:
                    continue  # it keeps talking (heartbeats, acks, other reports): busy or behind, not silent
                late = [s for s in pending if s.pred_end is not None and now > s.silence_base() + limit
                        and not (unacked is not None and unacked(tid, s.index))]
                if late:
                    s = late[0]
                    quiet = "never heard" if heard == -math.inf else f"nothing heard for {now - heard:.1f} s"
                    self._watch.pop(tid, None)
                    self._robot_failed(tid, f"robot silent: no heartbeat, ack or report ({quiet}), and no report "
                                            f"for segment {s.index} within its longest execution by the model "
                                            f"({max(s.est_exec_s, s.max_exec_s):.2f} s) + "
                                            f"{self.cfg.robot_timeout_s:g} s")
                    ended.append(tid)
        self._flush()
        return ended

    def unreported(self, now: float | None = None) -> list[tuple[str, str, str, Segment]]:
        """(task id, robot id, robot type, segment) of dispatched segments still unreported half a ``robot_timeout_s``
        past their predicted end, each once: the caller re-sends them, and a robot that finished a segment
        answers a re-sent copy with its report again, so a report lost in transit (e.g. while the planner
        restarted) does not fail a healthy task as silent."""
        if self.cfg.robot_timeout_s is None:
            return []
        out = []
        with self._lock:
            now = self.clock.now() if now is None else now
            for tid, pending in self._watch.items():
                owner = self._tasks.get(tid) or self._done.get(tid)
                if owner is None:
                    continue
                half = self.cfg.robot_timeout_s / 2 + self._report_lag
                for seg in pending:  # a restored segment is asked for at once: its report may have been sent
                    # while the planner was down
                    if not seg.probed and seg.pred_end is not None and (
                            seg.silence_from is not None or now > seg.pred_end + half):
                        seg.probed = True
                        out.append((tid, owner.robot_id, owner.robot_type, seg))
        return out

    def fail_all(self, reason: str, status: TaskStatus = TaskStatus.FAILED) -> int:
        """End every open task at once (the engine died, or a drain or shutdown: nothing may wait for the
        engine thread). What the engine holds of them is released at the engine thread's next decision: on
        this engine when it serves on (a drain; a restart that reuses it), a no-op on a replacement
        (:meth:`replace_engine`)."""
        with self._lock:
            gens = list(self._tasks.values())
            self._aborts.extend(self._running)
            self._running.clear()
            for g in gens:
                self._finish(g, status, reason)
        self._flush()
        return len(gens)

    def replace_engine(self, engine: Engine) -> None:
        """Serve from a new engine (after a crash); only when no task is open."""
        with self._lock:
            if self._tasks:
                raise RuntimeError(f"replace_engine with {len(self._tasks)} open tasks")
            self.engine = engine
            self.estimator = self.estimator.for_replaced_engine(engine)  # a pool's estimate is its members'
            self._warm_prompts.clear()  # the old engine's prefix cache went with it
        self.wake.set()

    def warm_up(self, prompts: list[tuple[str, list[int]]], burst: list[tuple[str, list[int]]] | None = None,
                extra: Callable[[str], dict] | None = None) -> int:
        """Throw-away generations before serving, so the first tasks pay neither for a fresh engine's slow
        first passes nor for prefilling a shared prompt: each of ``prompts`` (robot type, prompt ids) alone
        for one token, then ``burst`` together for a few (the backend's first multi-request batch is slow to
        set up). ``extra``: each robot type's request extras (its grammar: the engine's structured-output
        backend is set up here, not in the first task). Engine thread only, before :meth:`serve_forever` (it
        steps the engine itself); the steps are not fed to the latency estimator. Returns the engine steps
        taken."""
        with self._lock:
            if self._running or self.engine.has_work():
                raise RuntimeError("warm_up: the engine is already serving")
        steps = 0
        waves = [[(f"warmup-{rt}-{i}", rt, ids, 1, True)] for i, (rt, ids) in enumerate(prompts)]
        waves.append([(f"warmup-burst-{i}", rt, ids, 4, False) for i, (rt, ids) in enumerate(burst or [])])
        for engine in self.engine.warm_up_targets():  # a pool: each member (each has its own prefix cache)
            for wave in waves:
                for gid, rt, ids, n, suspend in wave:
                    engine.add(EngineRequest(gid, list(ids), self.hooks.stop_checker(rt), max_new_tokens=n,
                                             suspend_at_boundary=suspend, extra=dict(extra(rt)) if extra else {}))
                while engine.has_work():
                    engine.step()
                    steps += 1
        for rt, ids in prompts:
            self.note_warm_prompt(rt, ids)
        return steps

    def decision_log(self) -> list[float]:
        """The kept decision times (s), a copy taken under the lock (the engine thread appends)."""
        with self._lock:
            return list(self.decision_times)

    def note_warm_prompt(self, robot_type: str, prompt_ids: list[int]) -> None:
        """``prompt_ids`` sits in the engine's prefix cache (warm_up, or a simulator's warmed prefix): every task of
        this robot type is estimated with the longest prefix it shares with one of these as cached
        (:meth:`_warm_hit`), not as a cold prompt (with which pud-shed shed urgent tasks it could serve)."""
        if self.engine.info.supports_prefix_cache and prompt_ids:
            with self._lock:
                kept = self._warm_prompts.setdefault(robot_type, deque(maxlen=WARM_PROMPTS_KEPT))
                kept.append(list(prompt_ids))

    def _warm_hit(self, spec: TaskSpec) -> int | None:
        """The prompt tokens the prefix cache holds for ``spec`` from a warmed prompt: the longest prefix it shares
        with one, in whole KV blocks (vLLM caches full blocks only), less the last prompt token (always
        computed). None when no prompt of its robot type was warmed. Per prompt, not per robot type: the
        drone's families leave cached prefixes from 1.4k to 1.8k tokens, and a robot type's mean hit made a
        short prompt's uncached tail look 3x too small, so admission let several such prefills into one step."""
        ids = spec.prompt_token_ids
        warm = self._warm_prompts.get(spec.robot_type)
        if not ids or not warm:
            return None
        block = self._kv_block_tokens()
        n = max(common_prefix_len(w, ids) for w in warm) // block * block
        return min(n, len(ids) - 1)

    def _kv_block_tokens(self) -> int:
        """Tokens per KV block (CoreConfig.kv_block_tokens): the prefix cache holds whole blocks only."""
        return self.cfg.kv_block_tokens or self.engine.info.kv_block_tokens or 16

    def _seed_cache_hit(self, spec: TaskSpec, hit: int | None) -> None:
        """A robot type's first task: its warm hit stands for the learned one until a hit is measured."""
        if hit is None or spec.robot_type in self._cache_hit:
            return
        self._cache_hit[spec.robot_type] = float(hit)
        self._cache_hit_max[spec.robot_type] = max(self._cache_hit_max.get(spec.robot_type, 0), hit)

    def restore(self, spec: TaskSpec, segments: list[Segment], *, final: bool = False) -> str:
        """Re-open a task journaled by a planner that died: its segments were already sent (their
        dispatch/prediction times in this clock), so its generation resumes after the last one from
        the exact token ids, with the stop checker fed the text written so far.
        ``final``: the plan had ended (its last segment or end marker was sent): it ends DONE."""
        with self._lock:
            tid = spec.task_id
            if not tid or tid in self._tasks or tid in self._done:
                raise ValueError(f"task id {tid!r}: missing or already known")
            arrival = self.clock.now() if spec.arrival is None else float(spec.arrival)
            g = Generation(spec, tid, arrival, next(self._seq))
            g.warm_hit = self._warm_hit(spec)
            g.prefill_est_s = self._prefill_estimate(spec, hit=g.warm_hit)
            g.segments = list(segments)
            self._estimate_length(g)
            self._tasks[tid] = g
            if g.segments:  # its plan was already on the robot when the planner died
                prev = self._owner.get(g.robot_id)
                if prev is not None and prev[0] != tid and not self._tasks[prev[0]].segments:
                    # restored before it (older) and claimed the robot, but was waiting when the planner died
                    self._cands.pop(prev[0], None)
                    self._turns.setdefault(g.robot_id, deque()).appendleft(prev[0])
                self._owner[g.robot_id] = (tid, g.tuf.beta)
            unreported = [s for s in g.segments if s.dispatch is not None and s.real_end is None]
            if unreported:
                restored_at = self.clock.now()
                for s in unreported:
                    s.silence_from, s.probed = restored_at, False
                self._watch[tid] = unreported
            if final or (g.segments and g.segments[-1].final):
                if g.segments:
                    g.segments[-1].final = True
                self._finish(g, TaskStatus.DONE, "")
            elif not g.segments:
                self._claim(g)
            else:
                ids = spec.prompt_token_ids if spec.prompt_token_ids is not None else self.engine.tokenize(spec.prompt)
                g.checker = self.hooks.stop_checker(g.robot_type)
                for s in g.segments:  # the grammar state (open braces, ...) of what was written
                    g.checker.feed(s.text)
                    g.checker.cut()
                g.req = EngineRequest(
                    gen_id=tid, prompt_token_ids=list(ids), stop_checker=g.checker,
                    output_token_ids=[t for s in g.segments for t in s.token_ids],
                    max_new_tokens=spec.max_new_tokens, max_segment_tokens=spec.max_segment_tokens,
                    suspend_at_boundary=self.policy.segmented, extra={"robot_type": g.robot_type, **spec.extra})
                g.status = TaskStatus.SUSPENDED
                g.k = len(g.segments)
                self._requeue(g, self.clock.now())
        self.wake.set()
        self._flush()
        return tid

    def task_status(self, task_id: str) -> TaskStatus | None:
        with self._lock:
            g = self._tasks.get(task_id)
            if g is not None:
                return g.status
            r = self._done.get(task_id)
            return r.status if r else None

    def result(self, task_id: str) -> TaskResult | None:
        with self._lock:
            return self._done.get(task_id)

    def queued(self, task_id: str) -> Generation | None:
        """The live state of a generation waiting to be ranked (queued or resumed), else None."""
        with self._lock:
            return self._cands.get(task_id)

    def pending(self) -> int:
        with self._lock:
            return len(self._tasks)

    def snapshot(self) -> dict:
        """Scheduler state for telemetry."""
        with self._lock:
            return {"queued": len(self._cands), "suspended": len(self._waiting), "running": len(self._running),
                    "tasks": len(self._tasks), "done": len(self._done), "policy": self.policy.name,
                    "waiting_for_robot": self.waiting_for_robot(),
                    "admission": self.admission.name, "length_model": self.cfg.length_model,
                    "boundaries_suspended": self.boundaries["suspended"],
                    "boundaries_streamed": self.boundaries["streamed"],
                    "per_token_s": self.estimator.step_time(max(1, len(self._running)))}

    def set_policy(self, policy: Policy) -> None:
        """Switch the policy at run time; it applies from the next decision (with its admission, where
        the core was given 'auto')."""
        with self._lock:
            self.policy = policy
            for g in self._running.values():  # a plan written on in place suspends again under a segmented policy
                if g.req is not None:
                    g.req.suspend_at_boundary = policy.segmented
            if self._admission_spec is not None:
                self.admission = self._named_admission(policy)
        self.wake.set()

    def _named_admission(self, policy: Policy) -> Admission:
        adm = make_admission(self._admission_spec, segmented=policy.segmented)
        if isinstance(adm, LatencyGuided):
            adm.prefill_step_s = self.cfg.prefill_step_s
        return adm

    def running_ids(self) -> list[str]:
        with self._lock:
            return list(self._running)

    def queue_view(self, now: float | None = None) -> list[dict]:
        """Queued generations, best first, with their current priority, slack and projected wait (telemetry)."""
        with self._lock:
            now = self.clock.now() if now is None else now
            cands, pri = self._priorities(now)
            ctx = self._rank_ctx()
            out = []
            for p, g in sorted(zip(pri, cands, strict=True), key=lambda x: -x[0]):
                G = g.tok_est * ctx.per_token_s + (g.prefill_est_s if g.k == 0 else 0.0)
                if g.k == 0:
                    wait = now - g.arrival + G + self.cfg.comm_s
                else:
                    wait = max(0.0, now + G + self.cfg.comm_s - g.prev_end)
                out.append({"task_id": g.task_id, "robot_id": g.robot_id, "k": g.k, "priority": p,
                            "slack_s": g.deadline() - now - G, "waiting_s": wait,
                            "prefill_est_s": g.prefill_est_s if g.k == 0 else 0.0,
                            "next_tokens_est": g.tok_est, "plan_tokens_left_est": g.rem_tok_est})
            return out

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
        with self._lock:
            now = self.clock.now()
            if self.engine.has_work() or self._cands or self._aborts:
                return now
            while self._waiting and self._waiting[0][2] != self._waiting[0][3].wait_version:
                heapq.heappop(self._waiting)  # stale entry
            return self._waiting[0][0] if self._waiting else None

    def start_step(self) -> StepReport | None:
        """Decide and launch one engine step; None if the engine has nothing to do.

        For a real engine the step runs (blocks) here; the simulator instead
        advances its clock by ``report.duration_s`` and then calls complete_step.
        """
        with self._lock:
            now = self.clock.now()
            self._apply_aborts()
            spent = self._schedule(now)
            self._apply_aborts()  # of suspended tasks the decision itself ended
            if self.policy.segmented and self.policy.adaptive:
                t0 = time.perf_counter()
                if self._decide_boundaries(now):  # part of the decision whenever it weighed anything
                    spent = (spent or 0.0) + time.perf_counter() - t0
            if spent is not None and self.cfg.record_decisions:
                self.decision_times.append(spent)
        self._flush()
        if not self.engine.has_work():
            return None
        return self.engine.step()

    def _apply_aborts(self) -> None:
        # Taken before any is applied: an engine whose abort raises (the engine loop restarts it) is not
        # asked the same again and again.
        aborts, self._aborts = self._aborts, []
        for tid in aborts:
            g = self._tasks.get(tid)
            self.engine.abort(tid)
            self._running.pop(tid, None)
            if g is not None and g.pending_abort:
                self._finish(g, g.abort_status, g.reason)

    def complete_step(self, report: StepReport) -> None:
        """Handle the step's segment events at the current clock time."""
        with self._lock:
            now = self.clock.now()
            self.step_count += 1
            duration = report.duration_s
            if report.new_tokens > report.batch_size > 0 and not report.prefill_tokens:
                # Speculative decoding: a step gave each generation several tokens; the estimate is per token.
                duration *= report.batch_size / report.new_tokens
            self.estimator.observe(report.batch_size, duration, report.prefill_tokens)
            if report.prefill_tokens > 0:
                self._prefill_step_max = max(self._prefill_step_max, report.prefill_tokens)
                _drain(self._prefill_queue, report.prefill_tokens)
            for ev in report.events:
                g = self._tasks.get(ev.gen_id)
                if g is None or g.pending_abort:
                    continue
                try:
                    self._on_event(g, ev, now)
                except Exception as e:  # noqa: BLE001 - one task's event must not crash the loop (it fails all)
                    log.exception("%s: handling its %s event failed", ev.gen_id, ev.reason.value)
                    self._fail_generation(g, f"planner error on segment {len(g.segments)} "
                                             f"({ev.text.strip()[:60]!r}): {type(e).__name__}: {e}")
        self._flush()

    def _fail_generation(self, g: Generation, reason: str) -> None:
        """End one generation FAILED wherever it stands (the engine may still run it)."""
        self._running.pop(g.task_id, None)
        if g.task_id in self.engine.running_ids():
            self.engine.abort(g.task_id)
        self._finish(g, TaskStatus.FAILED, reason)

    # -- decisions ------------------------------------------------------------
    def _promote(self, now: float) -> None:
        w = self._waiting
        while w and w[0][0] <= now:
            _, _, ver, g = heapq.heappop(w)
            if ver == g.wait_version and g.status is TaskStatus.SUSPENDED:
                g.enqueued_at = max(g.eligible_at, g.enqueued_at)
                self._cands[g.task_id] = g

    def _rank_ctx(self) -> RankContext:
        # G is estimated at the batch size the candidate would join
        return RankContext(self.cfg.comm_s, self.estimator.step_time(len(self._running) + 1), self.cfg.slack_floor_s)

    def _priorities(self, now: float) -> tuple[list[Generation], list[float]]:
        cands = list(self._cands.values())
        return cands, (self.policy.priorities(cands, now, self._rank_ctx()) if cands else [])

    def rank(self, now: float) -> list[Generation]:
        """Candidates ordered by the policy (best first), priorities recomputed now."""
        cands, pri = self._priorities(now)
        order = sorted(range(len(cands)), key=pri.__getitem__, reverse=True)  # stable: ties by queue order
        return [cands[i] for i in order]

    def best(self, now: float, n: int) -> list[Generation]:
        """The ``n`` best candidates (what a decision needs; cheaper than a full sort)."""
        cands, pri = self._priorities(now)
        if not cands:
            return []
        if n == 1:
            i = max(range(len(pri)), key=pri.__getitem__)
            return [cands[i]]
        return [cands[i] for i in heapq.nlargest(n, range(len(pri)), key=pri.__getitem__)]

    def _schedule(self, now: float) -> float | None:
        """Rank and admit; returns the seconds the decision took (None: nothing waited, nothing was decided)."""
        self._promote(now)
        if self.policy.sheds:
            self._shed(now)
        if not self._cands:
            return None
        t0 = time.perf_counter()
        if self.cfg.overdue == "reject":
            self._reject_hopeless(now)
        room = self.admission.max_batch() - len(self._running)
        picked: list[Generation] = []
        if room > 0 and self._cands:
            stats = self.engine.stats()
            view = AdmissionView(list(self._running.values()), now, self.cfg.comm_s, stats.kv_cache_usage,
                                 self.estimator)
            while True:
                room = self._admit(now, view, room, picked)
                if not (self.policy.eager and self._cands and any(g.k > 0 for g in picked)):
                    break
                # Eager degrading: a later segment admitted ahead of a first segment that can still earn, and that
                # its generation time would push past its ERT, gives up its optional rest; its place goes to the
                # waiting ones.
                cut = self._degrade(now, [g for g in picked if g.k > 0], True)
                if not cut:
                    break
                for g in cut:
                    picked.remove(g)
                    view.running.remove(g)
                    room += 1
        if self.policy.degrades and self._cands:  # left waiting: the engine could not take them now (overload)
            self._degrade(now, [g for g in self._cands.values() if g.k > 0], self.policy.eager)
        spent = time.perf_counter() - t0
        for g in picked:
            self._start(g, now)
        return spent

    def _admit(self, now: float, view: AdmissionView, room: int, picked: list[Generation]) -> int:
        """Admit candidates in the policy's order while the batch has room and admission takes them; returns the
        room left. Ranks only as many as could join (cheaper than a full sort), and re-ranks if all were taken."""
        refused = False
        while room > 0 and self._cands and not refused:
            for g in self.best(now, min(room, 64)):
                if not self.admission.admit(view, g):
                    refused = True
                    break
                picked.append(g)
                view.running.append(g)
                self._running[g.task_id] = g
                del self._cands[g.task_id]
                room -= 1
        return room

    def _decide_boundaries(self, now: float) -> bool:
        """Segment when it pays, stream when it does not (policies with :attr:`Policy.adaptive`): for each
        generation in the batch, whether it suspends at its next boundary or writes on in place.

        Why: a suspension is worth only what its place is worth to waiting work, and a resume is not free. A plan
        written on in place shares every step with the batch, where a token costs a small share of a step; its
        resumes each come back alone or nearly so, paying a prefill of what the engine's cache lacks and a step per
        token. Suspending at every boundary on the arm trace at 3x ran the engine twice as long for fewer tokens
        (mean batch 7.9 against 27.4) and lost 0.29 of beta to writing on in place. So ``g`` suspends only where
        the best waiting generation (the engine's own queue first, else the policy's order) gains more utility by
        taking its place at its boundary than by waiting for the next plan in the batch to end, and that gain
        exceeds the resume's cost: its prefill (none where the engine holds requests in place) on the late work in
        the batch, and its own robot idling where the segments it was sent do not cover the pause. Where there is
        room in the batch, the place counts only if admission turns the waiting generation away because of ``g``.
        With nothing waiting a plan is never suspended. Returns whether anything was weighed (something waited)."""
        running = [g for g in self._running.values() if g.req is not None and not g.pending_abort]
        for g in running:
            g.req.suspend_at_boundary = False
        if not running:
            return False
        stats = self.engine.stats() if self._cands or len(running) > 1 else None
        places = self.admission.max_batch()
        queued: list[Generation] = []  # admitted by the core, queued by the engine for a place in its batch
        if stats is not None:
            if stats.max_batch:
                places = min(places, stats.max_batch)
            if stats.waiting > 0:  # the latest added that have written nothing yet (the engine takes them in order)
                queued = [g for g in running if g.seg_tokens() == 0][-stats.waiting:]
        if not self._cands and not queued:
            return False  # nothing waits: every generation streams on
        step = self.estimator.step_time(len(running))
        comm, lead = self.cfg.comm_s, self.cfg.resume_lead_s
        tight = stats is not None and (stats.kv_cache_usage >= KV_TIGHT or stats.waiting > 0)
        late = sum(-h.alpha for h in running if self._losing(h, now, step))
        skip = {g.task_id for g in queued}
        # when a place frees without a suspension: the earliest end of a plan in the batch
        free = min((now + max(1.0, h.rem_tok_est - h.seg_tokens()) * step for h in running if h.task_id not in skip),
                   default=now)
        in_place = self._in_place_share()  # once per decision, not per generation
        offers = []
        for g in running:
            if g.task_id in skip:
                continue  # not started yet: nothing to suspend
            t_b = now + max(1.0, g.tok_est - g.seg_tokens()) * step  # its boundary
            cover = self._robot_cover(g, t_b)
            resume = self._resume_cost(g, tight, in_place)
            idle = max(0.0, g.tok_est * step + comm + resume + lead - cover)  # its robot waits this long for it
            offers.append((-g.alpha * idle + late * resume, t_b, g))
        if not offers:
            return True
        offers.sort(key=lambda x: (x[0], x[1]))
        no_place = len(running) >= places or bool(queued)
        # who gets the place: the engine's own queue first (it admits in order), else the policy's best candidates
        waiting = queued or self.best(now, min(len(offers), 8))
        view = None
        for q in waiting[:len(offers)]:
            for i, (cost, t_b, g) in enumerate(offers):
                if self._start_gain(q, t_b, free, step) <= cost:
                    continue
                if not no_place:  # there is a place: q waits for admission, which g's leaving must change
                    if view is None:
                        view = AdmissionView(running, now, comm, stats.kv_cache_usage, self.estimator)
                    if self.admission.admit(view, q) or not self.admission.admit(
                            dataclasses.replace(view, running=[h for h in running if h is not g]), q):
                        continue
                g.req.suspend_at_boundary = True
                del offers[i]
                break
        return True

    def _losing(self, g: Generation, now: float, step: float) -> bool:
        """Is ``g``'s current segment already past full utility at its expected end (loses utility every step)?"""
        end = now + max(1.0, g.tok_est - g.seg_tokens()) * step + self.cfg.comm_s
        return (end - g.arrival > g.ert) if g.k == 0 else (end > g.prev_end)

    def _start_gain(self, q: Generation, t_b: float, t_free: float, step: float) -> float:
        """What ``q`` gains by starting at ``t_b`` instead of ``t_free`` (its utility at each start)."""
        if t_free <= t_b:
            return 0.0
        G = q.tok_est * step + (q.prefill_est_s if q.k == 0 and not (q.req and q.req.output_token_ids) else 0.0)
        # a first segment is judged from the task's arrival, a later one from the end of the one before
        tuf, since = (q.tuf.tuf0, q.arrival) if q.k == 0 else (q.tuf.tuf1, q.prev_end)
        lag = G + self.cfg.comm_s - since
        return tuf(t_b + lag) - tuf(t_free + lag)

    def _robot_cover(self, g: Generation, t_b: float) -> float:
        """How long after ``t_b`` (its boundary) ``g``'s robot still has sent segments to run: its queue's end (the
        last sent segment's reported or predicted end), then the segment being written at the least the robot's
        shortest skill-bearing segment has taken."""
        last = g.segments[-1] if g.segments else None
        q_end = last.end if last is not None and last.end is not None else t_b
        start = max(q_end, t_b + self.cfg.comm_s)
        return start + self._exec_min.get(g.robot_type, 0.0) - t_b

    def _resume_cost(self, g: Generation, tight: bool, in_place: float | None = None) -> float:
        """Prefill time of a resume: what the cache lacks of a resubmission, times the share of resumes the engine
        does not hold in place (``in_place``; None: :meth:`_in_place_share`). The cache lacks the tokens past the
        last full KV block; with the KV cache ``tight`` (full, or requests queued for room) everything but the
        prefix its robot type's prompts share, as its own blocks are the ones evicted while it is out."""
        n = len(g.req.prompt_token_ids) + len(g.req.output_token_ids)
        miss = n % self._kv_block_tokens() + 1
        if tight:
            miss = max(miss, n - int(self._cache_hit.get(g.robot_type, 0.0)))
        return self.estimator.prefill_time(miss) * (1.0 - (self._in_place_share() if in_place is None else in_place))

    def _in_place_share(self) -> float:
        c = self.engine.resume_counters()
        done = c.get("resumed_in_place", 0) + c.get("resubmitted", 0)
        return c.get("resumed_in_place", 0) / done if done else 0.0

    def _contended(self, now: float, delay_s: float | None) -> bool:
        """Is a first segment left waiting that can still earn positive utility (at its best case) and that a wait
        of ``delay_s`` more would make lose some (its best-case response then past its ERT)? One that stays inside
        its ERT loses nothing by waiting (a burst's queue at normal load), and one that cannot earn is shed.
        ``delay_s`` None: any first segment waiting that can still earn (Policy.at_risk off)."""
        step1, comm = self.estimator.step_time(1), self.cfg.comm_s
        for q in self._cands.values():
            if q.k == 0:
                best = now - q.arrival + self._prefill_best(q.spec) + self._tokens_best(q, 0) * step1 + comm
                if q.tuf.tuf0(best) > 0.0 and (delay_s is None or q.tuf.tuf0(best + delay_s) < q.beta):
                    return True
        return False

    def _degrade(self, now: float, gens: list[Generation], contended: bool) -> list[Generation]:
        """Ask a degrading policy (Policy.degradable) about ``gens``, generations that have sent a segment and
        were left waiting at this decision (an eager policy: also those admitted ahead of a first segment that can
        still earn and was left waiting), and end the optional rest of those it names: the task ends DONE with
        what was sent (its mandatory part, never less than its first segment) and a reason that names the
        segments left out. Returns them. ``contended``: ask :meth:`_contended` about each (an eager policy).

        The best case, as shedding's: the fewest tokens a later segment of its robot type has taken at the batch-1
        step time (a resumed generation's prefill is what was evicted: nothing, at best), and the robot ready for
        it at the latest it can finish the segment before (its report, else the model's maximum), so a segment
        that could still earn is not cut because the robot was slower than the model's minimum."""
        step1, comm = self.estimator.step_time(1), self.cfg.comm_s
        cut = []
        for g in gens:
            last = g.segments[-1] if g.segments else None
            if last is None or last.dispatch is None:  # nothing of it reached the robot yet: no mandatory part
                continue
            if self.hooks.validate_plan(g.robot_type, "".join(s.text for s in g.segments)) is not None:
                continue  # what was sent is no whole plan (a block left open): the robot could not end there
            ready = g.prev_end
            if last.real_end is not None:
                ready = last.real_end
            elif last.pred_start is not None:
                ready = max(ready, last.pred_start + last.max_exec_s)
            left = self._tokens_best(g, 0) * step1
            # the first segments waiting behind it lose its expected generation time (the ranking's G)
            busy = contended is not False and self._contended(
                now, g.tok_est * self.estimator.step_time(len(self._running) + 1) if self.policy.at_risk else None)
            if self.policy.degradable(g, now, left, comm, ready, busy):
                # (eager) admitted at this decision, not started: _finish releases its parked request as any suspended
                self._running.pop(g.task_id, None)
                self._finish(g, TaskStatus.DONE, self._degraded_reason(g, now + left + comm - ready))
                cut.append(g)
        return cut

    def _degraded_reason(self, g: Generation, best_wait_s: float) -> str:
        n = len(g.segments)
        why = (f"could not earn utility (best-case wait {best_wait_s:.3f} s, TUF_1 <= 0 past "
               f"{-g.beta / g.alpha:.3f} s)" if g.tuf.tuf1(best_wait_s) <= 0.0 else
               f"was late (best-case wait {best_wait_s:.3f} s) while a first segment that can still earn waited")
        return (f"{DEGRADED_PREFIX} optional rest (segments {n}..) left out under overload by {self.policy.name}; "
                f"sent {n} segment{'s' if n != 1 else ''} (the mandatory part); segment {n} {why}")

    def _estimate_length(self, g: Generation) -> None:
        """Set ``g``'s next-segment and remaining token estimates for the segment it writes next (CoreConfig
        length_model)."""
        if self.cfg.length_model == "ewma":
            g.tok_est = g.rem_tok_est = self._tok_est.get(g.robot_type, 8.0)
            return
        p = self.lengths.predict(g.spec, len(g.segments))
        q = self.cfg.length_quantile_urgent if g.tuf.beta >= self.cfg.length_urgent_beta else 0.5
        g.tok_est, g.rem_tok_est = p.seg_quantile(q), p.rem_quantile(q)

    def _prefill_estimate(self, spec: TaskSpec, n: int | None = None, hit: float | None = None) -> float:
        """Prefill time of a new prompt: its length minus ``hit``, the prefix its warmed prompt leaves in the
        cache (:meth:`_warm_hit`), or without one the hits this robot type's prompts have been getting."""
        if n is None:
            n = len(spec.prompt_token_ids) if spec.prompt_token_ids else self.cfg.prefill_tokens_default
        if hit is None:
            hit = self._cache_hit.get(spec.robot_type)
        uncached = n if hit is None else max(1.0, n - hit)
        return self.estimator.prefill_time(int(uncached))

    def _shed(self, now: float) -> None:
        """Ask a shedding policy (Policy.hopeless) about every first segment, queued or running, and end
        the hopeless ones OVERDUE (a running one is aborted in the engine first: this is the engine thread).

        ``left`` is the segment's best case given the work the engine and the policy run before it, so only a
        task that cannot earn even then is shed (the mean segment length at the batch's step time would shed urgent
        ``d(3);`` segments, 4 tokens, that PUD serves inside their cutoff):

        * tokens: the fewest a first segment of its robot type has taken, less those written (:meth:`_tokens_best`);
        * prefill, in the engine's order (:meth:`_prefill_view`): a prompt still being prefilled waits for the
          prompts admitted before it; a queued one for every prompt in the engine and for the first segments
          the policy ranks above it (admission takes candidates in rank order), each at its best case (the
          prompt less the largest prefix-cache hit its robot type has had, :meth:`_prefill_best`);
        * decode: a queued one at the batch-1 step time; one in the batch at the step time of the smallest batch
          it can be in (the generations whose own best case outlasts its), each of its steps also carrying the
          prefill of the prompts admitted after it, up to what one step has been seen to carry (chunked prefill).

        An engine pool prefills on each member apart, so there each segment counts its own prompt only.
        """
        comm, pol, est = self.cfg.comm_s, self.policy, self.estimator
        one_queue = len(self.engine.warm_up_targets()) <= 1
        running = [g for g in self._running.values() if not g.pending_abort]
        rest = [self._tokens_best(g, g.seg_tokens()) for g in running]
        live = {g.task_id for g in running if g.k == 0 and g.seg_tokens() == 0}
        self._prefill_queue = [e for e in self._prefill_queue if e[0] in live]
        per_step = max(0, self._prefill_step_max - len(running)) * est.prefill_time(1) if one_queue else 0.0
        firsts = [(g, r, sum(1 for x in rest if x >= r)) for g, r in zip(running, rest, strict=True) if g.k == 0]

        # Every admitted prompt counts, the hopeless ones too: in the engine they are the work these steps carry.
        # (Judging each as if the other hopeless ones were gone swings between shedding most and few, and keeping
        # the few costs more: bench/results/README.md, "load_sweep/", the WID 2 trace at 3x.)
        view, total = self._prefill_view(now, set())
        shed: dict[str, float] = {}
        for g, r, batch in firsts:
            before, own = view.get(g.task_id, (0.0, 0.0))
            behind = total - before - own
            if not one_queue:
                before = behind = 0.0
            steps = r - 1 if g.task_id in view else r  # the step that ends its prefill writes its first token
            left = before + own + r * est.step_time(batch) + min(behind, steps * per_step)
            if pol.hopeless(g, now, left, comm):
                shed[g.task_id] = left
        for g, _, _ in firsts:
            if g.task_id in shed:
                self.engine.abort(g.task_id)
                self._running.pop(g.task_id, None)
                self._finish(g, TaskStatus.OVERDUE, self._overdue_reason(g, now, "running", shed[g.task_id] + comm))
        if not any(g.k == 0 for g in self._cands.values()):
            return
        ahead = self._prefill_view(now, set(shed))[1] if one_queue else 0.0
        step1 = est.step_time(1)
        for g in self.rank(now):
            if g.k != 0:
                continue  # a resumed generation's prefill is what was evicted: nothing, at best
            own = self._prefill_best(g.spec)
            left = ahead + own + self._tokens_best(g, 0) * step1
            if pol.hopeless(g, now, left, comm):
                self._finish(g, TaskStatus.OVERDUE, self._overdue_reason(g, now, "queued", left + comm))
            elif one_queue:
                ahead += own  # admitted before the ones ranked below it: its prefill is theirs to wait for

    def _prefill_view(self, now: float, drop: set[str]) -> tuple[dict[str, tuple[float, float]], float]:
        """The prefill queue in best-case seconds: task id -> (queued before it, its own), and the total; those in
        ``drop`` count for themselves only. An engine whose steps report no prefill tokens gets, instead of the
        reports, what the time since the oldest prompt was admitted allows at most to be done."""
        q = [[tid, left] for tid, left, _ in self._prefill_queue]
        rate = self.estimator.prefill_time(1)
        if q and self._prefill_step_max == 0 and rate > 0:
            _drain(q, int((now - self._prefill_queue[0][2]) / rate))
        view, cum = {}, 0.0
        for tid, left in q:
            view[tid] = (cum, left * rate)
            if tid not in drop:
                cum += left * rate
        return view, cum

    def _tokens_best(self, g: Generation, written: int) -> int:
        """The fewest tokens ``g``'s current segment can still take: the shortest segment of its kind (first
        or later) its robot type has written, less the ``written`` ones; 1 before any was seen."""
        return max(1, self._tok_min.get((g.robot_type, g.k == 0), 1) - written)

    def _prefill_best(self, spec: TaskSpec) -> float:
        n = len(spec.prompt_token_ids) if spec.prompt_token_ids else self.cfg.prefill_tokens_default
        return self.estimator.prefill_time(max(1, n - self._cache_hit_max.get(spec.robot_type, 0)))

    def _overdue_reason(self, g: Generation, now: float, where: str, best_s: float) -> str:
        return (f"overdue ({where}, shed by {self.policy.name}): the first segment cannot arrive before the "
                f"utility cutoff ({g.tuf.cutoff:.3f} s after arrival); waited {now - g.arrival:.3f} s, "
                f"best case {now - g.arrival + best_s:.3f} s")

    def _reject_hopeless(self, now: float) -> None:
        tpt = self.estimator.step_time(len(self._running) + 1)
        for g in [g for g in self._cands.values() if g.k == 0]:
            G = g.tok_est * tpt + g.prefill_est_s
            if g.tuf.tuf0(now - g.arrival + G + self.cfg.comm_s) < 0:
                self._finish(g, TaskStatus.OVERDUE,
                             f"overdue: the first segment cannot arrive before the utility cutoff "
                             f"({g.tuf.cutoff:.3f} s after arrival); waited {now - g.arrival:.3f} s")

    def _start(self, g: Generation, now: float) -> None:
        g.status = TaskStatus.RUNNING
        g.gen_start = now
        if g.req is None:
            spec = g.spec
            try:
                ids = spec.prompt_token_ids if spec.prompt_token_ids is not None else self.engine.tokenize(spec.prompt)
                g.prefill_est_s = self._prefill_estimate(spec, len(ids), g.warm_hit)
                g.checker = self.hooks.stop_checker(g.robot_type)
            except Exception as e:  # noqa: BLE001 - e.g. a skill set that does not load: this task's failure
                self._running.pop(g.task_id, None)
                self._finish(g, TaskStatus.FAILED, f"planner error preparing the generation: {type(e).__name__}: {e}")
                return
            g.req = EngineRequest(
                gen_id=g.task_id, prompt_token_ids=list(ids), stop_checker=g.checker,
                max_new_tokens=spec.max_new_tokens, max_segment_tokens=spec.max_segment_tokens,
                suspend_at_boundary=self.policy.segmented, extra={"robot_type": g.robot_type, **spec.extra})
        g.seg_start_len = len(g.req.output_token_ids)
        try:
            self.engine.add(g.req)
        except Exception as e:  # an engine refusal must reach the robot, not vanish
            self.engine.abort(g.task_id)
            self._running.pop(g.task_id, None)
            self._finish(g, TaskStatus.FAILED, f"engine refused the generation: {e}")
            return
        if self.policy.sheds and g.k == 0 and not g.req.output_token_ids:  # a new prompt joins the prefill queue
            n = len(g.req.prompt_token_ids) - self._cache_hit_max.get(g.robot_type, 0)
            self._prefill_queue.append([g.task_id, max(1, n), now])

    # -- engine events ----------------------------------------------------------
    def _on_event(self, g: Generation, ev: SegmentEvent, now: float) -> None:
        text = ev.text
        # LLM output is untrusted: a segment reaches the robot only if it parses
        # against the robot's skill set with every argument inside its bounds.
        deliverable = ev.reason in (FinishReason.SEGMENT, FinishReason.STOP)
        if not deliverable:
            text = ""  # a cut-off fragment (length cap, runaway segment, abort) is never sent
        err = self.hooks.validate(g.robot_type, text) if text.strip() else None
        adds = err is None and (text or ev.reason is FinishReason.SEGMENT)
        calls: list[Any] = []
        times = (0.0, 0.0)
        if adds:
            calls = self.hooks.parse(g.robot_type, text)
            try:
                times = self.exec_range(g.robot_type, calls, text=text, before="".join(s.text for s in g.segments))
            except SkillParseError as e:  # valid alone, not after the plan so far: over a plan bound of its skill set
                err = str(e)
        if err is not None:
            self._running.pop(g.task_id, None)
            if g.task_id in self.engine.running_ids():
                self.engine.abort(g.task_id)
            elif ev.suspended:
                self._aborts.append(g.task_id)  # the engine may still hold it (a parked request)
            self._finish(g, TaskStatus.FAILED, f"invalid plan output in segment {len(g.segments)} "
                                               f"({text.strip()[:60]!r}): {err}")
            return
        if adds:
            self._add_segment(g, ev, now, calls, times)
        if ev.reason is FinishReason.SEGMENT:
            self.boundaries["suspended" if ev.suspended else "streamed"] += 1
            if ev.suspended:
                self._running.pop(g.task_id, None)
                g.status = TaskStatus.SUSPENDED
                g.k = len(g.segments)
                self._requeue(g, now)
            else:  # streamed on in place: the next segment is now the one being written
                g.seg_start_len = len(g.req.output_token_ids)
                g.k = len(g.segments)
                if g.segments and g.segments[-1].end is not None:
                    g.prev_end = g.segments[-1].end
            return
        # final event
        self._running.pop(g.task_id, None)
        if g.segments:
            g.segments[-1].final = True
        if ev.reason is FinishReason.STOP:
            self._release_held(g, now)
            # Each segment was valid alone; the whole plan must be too (blocks closed, variables set).
            err = self.hooks.validate_plan(g.robot_type, "".join(s.text for s in g.segments))
            if err is not None:
                self._finish(g, TaskStatus.FAILED, f"invalid plan at its end: {err}")
            else:
                self._finish(g, TaskStatus.DONE, "")
        else:
            what = {FinishReason.LENGTH: f"plan exceeded max_new_tokens={g.spec.max_new_tokens}",
                    FinishReason.ABORTED: "generation aborted by the engine"}.get(ev.reason, ev.reason.value)
            self._finish(g, TaskStatus.FAILED, ev.error or what)

    def _add_segment(self, g: Generation, ev: SegmentEvent, now: float, calls: list[Any],
                     times: tuple[float, float]) -> None:
        """A validated segment: ``calls`` parsed from it, ``times`` its (min, max) execution by the model."""
        if not g.segments:  # first segment: learn how much of a new prompt the prefix cache covers
            rt, hit = g.robot_type, float(ev.cached_prompt_tokens)
            old = self._cache_hit.get(rt)
            self._cache_hit[rt] = hit if old is None else 0.8 * old + 0.2 * hit
            self._cache_hit_max[rt] = max(self._cache_hit_max.get(rt, 0), ev.cached_prompt_tokens)
            for q in self._cands.values():
                if q.k == 0 and q.robot_type == rt and q.warm_hit is None:
                    q.prefill_est_s = self._prefill_estimate(q.spec)
        est, longest = times
        seg = Segment(index=len(g.segments), text=ev.text, token_ids=list(ev.token_ids), calls=calls,
                      gen_start=g.gen_start, ready=now, est_exec_s=est, max_exec_s=longest)
        g.segments.append(seg)
        n = len(ev.token_ids)
        if n and calls:  # learn the segment length G is estimated from
            rt = g.robot_type
            self._tok_est[rt] = 0.9 * self._tok_est.get(rt, n) + 0.1 * n
            if self.cfg.length_model == "ewma":
                g.tok_est = g.rem_tok_est = self._tok_est[rt]
        if n:  # the learned model counts every segment (a closer such as '};' takes its steps too), by its index
            self.lengths.observe_segment(g.spec, seg.index, n)
            if self.cfg.length_model == "learned":
                self._estimate_length(g)
        if calls and est > 0:  # the shortest skill-bearing segment: how little of the robot's time a segment covers
            self._exec_min[g.robot_type] = min(est, self._exec_min.get(g.robot_type, est))
        if n:  # every segment, a skill-less closer such as '};' too: the shortest is the best case
            key = (g.robot_type, seg.index == 0)
            self._tok_min[key] = min(n, self._tok_min.get(key, n))
        g.gen_start = now
        if self.policy.streams:
            self._dispatch(g, seg, now)
        else:
            g.held.append(seg)

    def exec_range(self, robot_type: str, calls: list[Any], *, text: str | None = None,
                   before: str = "") -> tuple[float, float]:
        """The execution-time model's (minimum, maximum) for these skill calls; (0, 0) for none. Given the
        segment's ``text`` and the plan's text ``before`` it, loops count: at a loop's ``}`` the robot replays its
        body count-1 more times, so a robot still in a long loop is not taken for silent. Then SkillParseError
        if the segment is invalid after ``before``, e.g. the plan would exceed a bound of its skill set."""
        if text is not None and text.strip() and self.hooks.skillset(robot_type).grammar != "text":
            try:
                return self.hooks.exec_model(robot_type).segment_range(before, text)
            except SkillParseError:
                raise
            except Exception as e:  # a model fault must not end the task: the calls alone, as before
                log.warning("exec-time estimate failed for %r after %r: %s", text, before, e)
        if not calls:
            return 0.0, 0.0
        try:
            e = self.hooks.exec_model(robot_type).estimate(calls)
            return float(e.min_s), float(e.max_s)
        except Exception as e:
            log.warning("exec-time estimate failed for %r: %s", calls, e)
            return 0.0, 0.0

    def _release_held(self, g: Generation, now: float) -> None:
        for seg in g.held:
            self._dispatch(g, seg, now)
        g.held.clear()

    def _dispatch(self, g: Generation, seg: Segment, now: float) -> None:
        seg.dispatch = now
        prev = g.segments[seg.index - 1].end if seg.index > 0 else None
        arrive = now + self.cfg.comm_s
        seg.pred_start = arrive if prev is None else max(arrive, prev)
        seg.pred_end = seg.pred_start + seg.est_exec_s
        self._watch.setdefault(g.task_id, []).append(seg)
        self._outbox.append(("segment", g, seg))

    def _repredict(self, g: Generation, from_index: int) -> None:
        """A real finish time arrived: shift later predictions and the resume time."""
        segs = g.segments
        for seg in segs[from_index + 1:]:
            if seg.dispatch is None or seg.real_end is not None:
                continue
            seg.pred_start = max(seg.dispatch + self.cfg.comm_s, segs[seg.index - 1].end)
            seg.pred_end = seg.pred_start + seg.est_exec_s
        if g.status is TaskStatus.SUSPENDED and segs and g.k == len(segs):
            self._requeue(g, self.clock.now())

    def _requeue(self, g: Generation, now: float) -> None:
        last = g.segments[-1] if g.segments else None
        if last is not None and last.end is not None:
            g.prev_end = last.end
        elif last is not None:  # held (not streamed): resume at once
            g.prev_end = now
        tpt = self.estimator.step_time(len(self._running) + 1)
        G = g.tok_est * tpt
        g.eligible_at = g.prev_end - G - self.cfg.comm_s - self.cfg.resume_lead_s
        g.wait_version += 1
        if g.eligible_at <= now:
            if g.task_id not in self._cands:
                g.enqueued_at = now
                self._cands[g.task_id] = g
        else:
            self._cands.pop(g.task_id, None)
            heapq.heappush(self._waiting, (g.eligible_at, g.seq, g.wait_version, g))

    # -- results ------------------------------------------------------------------
    def _finish(self, g: Generation, status: TaskStatus, reason: str) -> None:
        if g.status.terminal:
            return
        if g.status is TaskStatus.SUSPENDED:
            # The engine may still hold it (a parked vLLM request, a kept cache). The engine thread releases
            # it (start_step), never a caller's thread while a step runs.
            self._aborts.append(g.task_id)
        g.status = status
        g.reason = reason
        g.wait_version += 1
        self._tasks.pop(g.task_id, None)
        self._cands.pop(g.task_id, None)
        self._running.pop(g.task_id, None)
        s0 = g.segments[0] if g.segments else None
        rt = (s0.dispatch + self.cfg.comm_s - g.arrival) if s0 is not None and s0.dispatch is not None else None
        sent = g.spec.sent
        res = TaskResult(task_id=g.task_id, robot_id=g.robot_id, status=status,
                         plan="".join(s.text for s in g.segments), segments=g.segments,
                         response_time=rt, utility=g.tuf.tuf0(rt) if rt is not None else None,
                         reason=reason, meta=g.spec.meta, robot_type=g.robot_type,
                         response_time_from_send=(rt + g.arrival - sent) if rt is not None and sent is not None
                         else None)
        if status is not TaskStatus.DONE:
            self._watch.pop(g.task_id, None)  # nothing more is expected of the robot
        elif g.segments and g.segments[-1].final:  # a complete plan: learn how long plans of its task are
            self.lengths.observe_plan(g.spec, [len(s.token_ids) for s in g.segments])
        now = self.clock.now()
        self._done[g.task_id] = res
        self._done_at[g.task_id] = now
        self._evict_results(now)
        self._outbox.append(("result", res, None))
        turns = self._turns.get(g.robot_id)
        if turns and g.task_id in turns:  # ended while waiting for its robot
            turns.remove(g.task_id)
        self._release(g.robot_id)

    def _evict_results(self, now: float) -> None:
        """Bounded memory: forget the oldest results (their task ids become usable again)."""
        horizon = now - self.cfg.keep_results_s
        for tid in list(self._done_at):  # insertion order = finish order
            if len(self._done_at) <= self.cfg.keep_results_max and self._done_at[tid] > horizon:
                break
            del self._done_at[tid]
            res = self._done.pop(tid, None)
            self._preempted.pop(tid, None)
            if self._watch.pop(tid, None) is not None and res is not None:
                self._release(res.robot_id)

    def _flush(self) -> None:
        with self._lock:
            out, self._outbox = self._outbox, []
        for kind, a, b in out:
            try:
                if kind == "segment":
                    if self.on_segment is not None:
                        self.on_segment(self._view(a), b)
                elif self.on_result is not None:
                    self.on_result(a)
            except Exception:  # a broken callback must not kill the engine thread
                log.exception("%s callback failed", kind)

    def _view(self, g: Generation) -> TaskResult:
        return TaskResult(task_id=g.task_id, robot_id=g.robot_id, status=g.status, plan="",
                          segments=g.segments, response_time=None, utility=None, meta=g.spec.meta)
