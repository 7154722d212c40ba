"""The planner without ROS: requests and their retries, the open tasks and their answers, the journal writes, the
housekeeping of deliveries and robots. Recovery after a restart (and the journal's record format) is
``planner/recovery.py``; the engine thread and its restarts ``planner/engine_supervisor.py``.

The node (``ros/planner_node.py``) owns everything ROS: lifecycle, parameters, servers, topics and timers. It
converts requests and robot reports to the plain values taken here (``ros/convert.py``), and
:class:`PlannerService` answers through the node's :class:`PlannerSender`: deliver a segment to a robot,
complete a goal, publish a result. No rclpy and no message types here.

Threads: the engine runs in its own thread (:meth:`EngineSupervisor.start`, PlannerCore.serve_forever), never
in an rclpy callback. A request only validates, submits to the core and returns; the core's callbacks (the
engine thread, or a report's thread) deliver segments and answer goals, so no thread waits per goal and the
open tasks are bounded by ``max_active_tasks``. One re-entrant lock guards the open tasks, the active flag and
the engine error (the supervisor's, under this lock); the arrivals and :class:`RobotLinks` have their own.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from timelyllm_ros.domain.clock import RealClock, WallOffset
from timelyllm_ros.domain.tuf import TufRequest
from timelyllm_ros.domain.types import Segment, TaskResult, TaskSpec, TaskStatus
from timelyllm_ros.engines.factory import planner_engine
from timelyllm_ros.engines.prompts import PromptRenderer, TaskPromptError
from timelyllm_ros.interfaces import segment_topic
from timelyllm_ros.planner.config import CoreConfig
from timelyllm_ros.planner.core import PlannerCore
from timelyllm_ros.planner.engine_supervisor import EngineSupervisor
from timelyllm_ros.planner.hooks import SkillHooks
from timelyllm_ros.planner.hygiene import check_token_count, fits_in_tokens
from timelyllm_ros.planner.intake import Intake, IntakeLimits
from timelyllm_ros.planner.journal import Journal
from timelyllm_ros.planner.policies import make_policy
from timelyllm_ros.planner.recovery import (
    Recovery,
    RecoveryHost,
    restored_segments,
    result_record,
    spec_record,
    task_result_from_record,
)
from timelyllm_ros.planner.service_io import (
    Accepted,
    Delivery,
    GoalError,
    Log,
    PlannerHealth,
    PlannerSender,
    PlanRequest,
    Rejections,
    TaskLookup,
    request_tuf,
)
from timelyllm_ros.planner.settings import check_params
from timelyllm_ros.planner.warmup import lone_first_s, warm_up_planner
from timelyllm_ros.planner.watchdog import stamp_lag
from timelyllm_ros.transport.delivery import RobotLinks


@dataclass
class _OpenTask:
    """An accepted task: who waits for it and what its robot was sent."""

    task_id: str
    robot_id: str
    robot_type: str
    key: tuple  # PlanRequest.key
    goals: list = field(default_factory=list)  # the node's goal handles (a retry adds one)
    waiters: list = field(default_factory=list)  # queues of one-shot calls, each answered with the TaskResult
    sent: int = 0  # segments handed to the robot's topic
    final_sent: bool = False


def _guard(log: Log, what: str, fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        log.error(f"could not {what}: {e!r}")


class PlannerService:
    """The planner's non-ROS half (module doc), over one PlannerCore per configure.

    ``params``: the planner's parameter values by name, as the node declared them (checked here);
    ``engine``/``constrained``/``engine_factory``/``core_config``: given instead of built from them.
    ``robots`` and ``bridge`` are shared with the node, which sends on the links and converts stamps.
    """

    def __init__(self, params: Mapping[str, Any], sender: PlannerSender, log: Log, rejected: Rejections,
                 robots: RobotLinks, bridge: WallOffset, *, engine: Any = None, constrained: bool = False,
                 engine_factory: Callable[[], Any] | None = None, core_config: CoreConfig | None = None) -> None:
        check_params(params)
        self._p = params
        self._sender, self._log, self._rejected, self._robots, self._bridge = sender, log, rejected, robots, bridge
        self._given = (engine, constrained, engine_factory, core_config)
        self.robot_types = list(params["robot_types"])
        self._max_task_chars = int(params["max_task_chars"])
        self._max_task_tokens = int(params["max_task_tokens"])
        self._max_active = int(params["max_active_tasks"])
        self._max_clock_skew_s = float(params["max_clock_skew_s"])
        self._robot_idle_release_s = float(params["robot_idle_release_s"])
        self._max_robots = int(params["max_robots"])
        self.intake = Intake(IntakeLimits(
            goals_per_robot_s=float(params["intake_goals_per_robot_s"]),
            goals_burst_per_robot=int(params["intake_goals_burst_per_robot"]),
            new_robots_per_s=float(params["intake_new_robots_per_s"]),
            new_robots_burst=int(params["intake_new_robots_burst"]),
            robot_ids=frozenset(r for r in params["robot_ids"] if r)))
        self.core: PlannerCore | None = None
        self.delivery: Delivery | None = None
        self.journal: Journal | None = None
        self._prompts: PromptRenderer | None = None
        self._hooks: SkillHooks | None = None  # the core's, built here (recovery parses journaled segments)
        self._open: dict[str, _OpenTask] = {}
        self._lock = threading.RLock()
        self.supervisor = EngineSupervisor(log, float(params["engine_restart_backoff_s"]), self._lock)
        self._recovery = Recovery(bridge, robots, sender, log)
        self._arrivals: dict[int, float] = {}  # a goal's key -> its arrival (core clock), until it is accepted
        # its own lock: a goal's arrival is stamped at once, never behind another goal's validation and rendering
        self._arrivals_lock = threading.Lock()
        self._skillset_ids: dict[str, str] = {}
        self._next_prune = 0.0
        self._next_release = 0.0
        self._journal_closed = False
        self._recovered = False
        self._active = False  # goals are accepted only while active
        self.journal_errors = 0

    # -- state -------------------------------------------------------------------------------------
    def health(self, lifecycle_state: str | None) -> PlannerHealth:
        sup, journal = self.supervisor, self.journal
        return PlannerHealth(
            lifecycle_state=lifecycle_state, engine=sup.engine, core=self.core, engine_error=sup.error,
            engine_restarts=sup.restarts, engine_thread_alive=sup.thread_alive,
            stopping=sup.stopping, journal_file=None if journal is None else journal.file,
            journal_open=journal is not None and journal.is_open and not self._journal_closed,
            journal_errors=self.journal_errors, rejected_messages=self._rejected.snapshot())

    def open_tasks(self) -> list[str]:
        """The ids of the accepted tasks not answered yet."""
        with self._lock:
            return list(self._open)

    def now(self) -> float:
        """The core's clock."""
        return self.core.clock.now()

    # -- configure, start, stop --------------------------------------------------------------------
    def configure(self, policy: str, delivery: Delivery) -> None:
        """Load the engine (unless one was given), build the core, the prompt renderer and the journal."""
        p = self._p
        engine, constrained, engine_factory, core_config = self._given
        owns = engine is None
        if engine is None:
            engine, constrained = planner_engine(p["engine_config"])
            engine_factory = engine_factory or (lambda: planner_engine(p["engine_config"])[0])
        self.supervisor.adopt(engine, engine_factory, owns)
        cfg = core_config or CoreConfig.from_params(p)
        self._hooks = SkillHooks(learn=cfg.learn_exec_times)
        self.core = PlannerCore(engine, make_policy(policy), RealClock(), admission=p["admission"],
                                config=cfg, on_segment=self._on_segment, on_result=self._on_result,
                                hooks=self._hooks)
        self.delivery = delivery
        self._prompts = PromptRenderer(engine, constrained)
        self._skillset_ids = {}
        if p["state_dir"]:
            journal = Journal(p["state_dir"], reset_damaged=p["journal_reset_damaged"])  # refuses damage, named
            for w in journal.warnings:
                self._log.warning(f"journal: {w}")
            if journal.reset_report:  # loud: the tasks in the moved files are not resumed
                self._log.error(f"journal: {journal.reset_report}")
            self.journal, self._journal_closed, self._recovered = journal, False, False
        self.supervisor.attach(self.core, self._prompts.replace_engine)

    def warm_up(self) -> None:
        """Prefill each robot type's shared prompt once before the first task, and measure the engine where
        ``calibrate`` is set (:func:`warm_up_planner`). Runs before the engine thread starts, so this thread is
        the engine thread meanwhile."""
        warm_up_planner(self.core, self._prompts, self.robot_types, bool(self._p["calibrate"]), self._log)

    def start(self) -> None:
        """Start the engine thread."""
        self.supervisor.start()

    def set_active(self, active: bool) -> None:
        """Goals are accepted only while active."""
        with self._lock:
            self._active = active

    def recover(self) -> None:
        """Once per configure (the first activate): resume what a killed planner left in the journal."""
        if self.journal is not None and not self._recovered:
            self._recovered = True

            def reopen(task_id: str, robot_id: str, robot_type: str, key: tuple, sent: int, final_sent: bool
                       ) -> None:
                with self._lock:
                    self._open[task_id] = _OpenTask(task_id, robot_id, robot_type, key, [], [], sent=sent,
                                                    final_sent=final_sent)

            def drop(task_id: str) -> None:
                with self._lock:
                    self._open.pop(task_id, None)

            def open_robot_type(task_id: str) -> str | None:
                op = self._open.get(task_id)
                return None if op is None else op.robot_type

            self._recovery.run(self.journal, self.core, self._hooks,
                               RecoveryHost(self.validate, self.skillset_id, reopen, drop, open_robot_type))

    def drain(self, timeout_s: float, reason: str) -> None:
        """Let open tasks finish for up to ``timeout_s``, then end the rest CANCELLED: every robot hears."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if not self.open_tasks():
                return
            time.sleep(0.05)
        if self.core is not None:
            n = self.core.fail_all(reason, TaskStatus.CANCELLED)
            self._log.warning(f"drain: {n} open tasks ended CANCELLED after {timeout_s:g} s")

    def shutdown(self) -> None:
        """Stop the engine thread and answer every open task CANCELLED (idempotent)."""
        self.set_active(False)
        self.supervisor.stop()
        if self.core is None:
            return
        self.core.wake.set()
        self.supervisor.join(10)
        self.core.fail_all("planner shutting down", TaskStatus.CANCELLED)
        with self._lock:  # last resort: anything the core no longer knows
            leftovers = list(self._open.values())
            self._open.clear()
        for op in leftovers:
            res = TaskResult(op.task_id, op.robot_id, TaskStatus.CANCELLED, "", [], None, None,
                             "planner shutting down", robot_type=op.robot_type)
            self._sender.finish_goals(op.goals, res)
            for w in op.waiters:
                w.put(res)
        if self.journal is not None and not self._journal_closed:
            self._journal_closed = True
            self.journal.close()

    def release(self) -> None:
        """After :meth:`shutdown`: close an engine this service built and forget the configured state."""
        self.supervisor.release()
        self.core = self.delivery = self._prompts = self._hooks = None
        self.journal = None

    # -- requests ----------------------------------------------------------------------------------
    def arrived(self, key: int) -> None:
        """A goal came in: its arrival time (core clock) is kept under ``key`` until :meth:`arrival` takes it."""
        with self._arrivals_lock:
            if len(self._arrivals) > 10_000:  # entries whose goal was never accepted (bounded memory)
                self._arrivals.clear()
            self._arrivals[key] = now = self.core.clock.now()
        self.core.intake.begin(now)  # ended by accept (the goal was taken in, or refused)

    def arrival(self, key: int) -> float | None:
        with self._arrivals_lock:
            return self._arrivals.pop(key, None)

    def taken_in(self) -> None:
        """A goal that :meth:`arrived` was accepted or refused: an idle engine no longer waits for it."""
        core = self.core
        if core is not None:
            core.intake.end()

    def validate(self, task_id: str, robot_id: str, robot_type: str, task: str, tuf: TufRequest, *,
                 arrival: float | None = None, sent: float | None = None) -> TaskSpec:
        """The task to plan, or GoalError naming the field and the problem. ``arrival``, ``sent``: core time."""
        time_utility = request_tuf(self.robot_types, self._max_task_chars, task_id, robot_id, robot_type, task, tuf)
        if not fits_in_tokens(task, self._max_task_tokens):
            try:
                check_token_count("task", self._prompts.count_tokens(task), self._max_task_tokens)
            except ValueError as e:
                raise GoalError(str(e)) from None
        try:
            prompt_ids, extra = self._prompts.render(robot_type, task)
        except TaskPromptError as e:
            raise GoalError(str(e)) from None
        return TaskSpec(robot_id=robot_id, prompt=task, tuf=time_utility, robot_type=robot_type,
                        task_id=task_id or f"{robot_id}-{uuid.uuid4().hex[:8]}", prompt_token_ids=prompt_ids,
                        extra=extra, arrival=arrival, sent=sent)

    def screen(self, req: PlanRequest) -> None:
        """What a goal is checked for as it arrives, before any work is done for it: the planner's state, the
        request's own fields, then intake's limits (``planner/intake.py``) and ``max_robots``; GoalError names the
        problem (the node answers it at once, without a goal handle). A retry of a task this planner knows passes: it
        joins its task in :meth:`accept`, which, given ``screened``, does not charge intake again."""
        # Without the lock: a flood's goals are screened here one after another, and the engine thread takes the
        # lock for every segment it sends. These reads are single dict and attribute reads; accept checks again
        # under the lock.
        if req.task_id and (req.task_id in self._open or self.core.result(req.task_id) is not None):
            return
        self._refuse_if_unable()
        request_tuf(self.robot_types, self._max_task_chars, req.task_id, req.robot_id, req.robot_type, req.task,
                    req.tuf)
        if not self.intake.in_fleet(req.robot_id):
            raise GoalError(f"robot_id: {req.robot_id!r} is not one of this planner's robots (parameter robot_ids)")
        linked = self._robots.has(req.robot_id)
        known = linked or bool(self.intake.limits.robot_ids) or self._robots.known(req.robot_id)
        why = self.intake.admit(req.robot_id, time.monotonic(), known)
        if why is not None:
            raise GoalError(why, TaskStatus.BUSY)
        if linked:
            return
        in_use: set[str] | None = None

        def busy(robot_id: str) -> bool:
            """It has a task, one waiting, or segments unreported or unacknowledged (read once, if asked)."""
            nonlocal in_use
            if in_use is None:
                in_use = self.core.robots_in_use()
            return robot_id in in_use or bool(self.delivery.pending_for(robot_id))
        if not self._robots.make_room(self._max_robots, busy):
            raise GoalError(f"robot_id: this planner serves at most max_robots={self._max_robots} robots at once, "
                            "all busy; retry later", TaskStatus.BUSY)

    def _refuse_if_unable(self) -> None:
        """GoalError (BUSY) while the planner cannot take a new task (under the lock, or as :meth:`screen`'s
        early look)."""
        if not self._active:
            raise GoalError(f"planner not active (lifecycle state: {self._sender.lifecycle_state}); retry later",
                            TaskStatus.BUSY)
        if self.supervisor.error is not None:
            raise GoalError(f"engine unavailable ({self.supervisor.error}); restarting, retry later", TaskStatus.BUSY)
        if len(self._open) >= self._max_active:
            raise GoalError(f"planner at capacity: {len(self._open)} active tasks "
                            f"(max_active_tasks={self._max_active}); retry later", TaskStatus.BUSY)

    def accept(self, req: PlanRequest, *, goal: Any = None, waiter: queue.Queue | None = None,
               screened: bool = False) -> Accepted:
        """Validate and submit, or join the open (or finished) task of an identical retry. ``goal`` is completed
        through the sender, ``waiter`` gets the TaskResult. ``screened``: :meth:`screen` passed it already (else it
        is screened here). Raises GoalError."""
        arrival = self.core.clock.now() if req.arrival is None else req.arrival
        sent = self._bridge.to_core_s(req.sent_wall) if req.sent_wall is not None else None
        key, tid = req.key, req.task_id
        try:
            with self._lock:
                joined = self._join(req.task_id, key, goal, waiter)
                if joined is not None:
                    return joined
            if not screened:
                self.screen(req)
            # Rendering the prompt is the costly part of taking a goal in: outside the lock, which the engine
            # thread takes for every segment it sends.
            spec = self.validate(req.task_id, req.robot_id, req.robot_type, req.task, req.tuf, arrival=arrival,
                                 sent=sent)
            with self._lock:
                joined = self._join(req.task_id, key, goal, waiter)  # an identical retry taken in meanwhile
                if joined is not None:
                    return joined
                self._refuse_if_unable()
                tid = spec.task_id
                spec.meta["request_key"] = key
                if self.core.task_status(spec.task_id) is not None:
                    raise GoalError(f"task_id: {spec.task_id!r} is already in use")
                self._robots.get(req.robot_id)  # discovery starts now, before the first segment exists
                self._open[spec.task_id] = _OpenTask(spec.task_id, req.robot_id, req.robot_type, key,
                                                     [goal] if goal is not None else [],
                                                     [waiter] if waiter is not None else [])
                if self.journal is not None and not self._journal_closed:
                    try:  # not _jot: a goal that cannot be journaled is refused, never accepted non-durably
                        self.journal.task_accepted(spec.task_id, req.robot_id, req.robot_type,
                                                   spec_record(spec, req.tuf, self._bridge),
                                                   self._bridge.to_wall(arrival))
                    except Exception as e:  # noqa: BLE001 - e.g. JournalError: disk full, naming the file
                        self._open.pop(spec.task_id, None)
                        self.journal_errors += 1
                        raise GoalError(f"not accepted: the task journal could not record it ({e}); retry later",
                                        TaskStatus.BUSY) from None
            try:
                tid = self.core.submit(spec)
            except ValueError as e:
                with self._lock:
                    self._open.pop(spec.task_id, None)
                raise GoalError(str(e)) from None
        except GoalError as e:
            e.task_id = tid
            raise
        return Accepted(tid, None, False)

    def _join(self, task_id: str, key: tuple, goal: Any, waiter: queue.Queue | None) -> Accepted | None:
        """A repeated request (same task_id, same content) is answered with that task's state."""
        if not task_id:
            return None
        op = self._open.get(task_id)
        if op is not None:
            if op.key != key:
                raise GoalError(f"task_id: {task_id!r} is already in use by a different request")
            if goal is not None:
                op.goals.append(goal)
            if waiter is not None:
                op.waiters.append(waiter)
            return Accepted(task_id, None, True)
        res = self.core.result(task_id)
        if res is None and self.journal is not None and not self._journal_closed:
            rec = self.journal.result(task_id)  # finished before this planner (re)started
            if rec is not None:
                res = task_result_from_record(task_id, rec)
        if res is not None:
            if res.meta.get("request_key") != key:
                raise GoalError(f"task_id: {task_id!r} is already in use by a different request")
            return Accepted(task_id, res, True)
        return None

    def cancel_goal(self, goal: Any) -> bool:
        """Cancel the task ``goal`` waits for; False if it waits for none."""
        with self._lock:
            tid = next((t for t, op in self._open.items() if goal in op.goals), None)
        if tid is None:
            return False
        self.core.cancel(tid, "cancelled by the robot")
        return True

    def lookup(self, task_id: str) -> TaskLookup:
        if (res := self.core.result(task_id)) is not None:
            return TaskLookup("done", result=res, skillset_id=self.skillset_id(res.robot_type))
        if self.core.task_status(task_id) is not None:
            return TaskLookup("active")
        if self.journal is not None and (rec := self.journal.result(task_id)) is not None:
            jt = self.journal.task(task_id)  # finished before a restart: the segments as journaled when sent
            if jt is None:
                return TaskLookup("done", record=rec)
            segs = restored_segments(jt, self._hooks, self.core.cfg.comm_s, self._bridge)
            return TaskLookup("done", record=rec, robot_id=jt.robot_id, journaled=tuple(segs),
                              skillset_id=self.skillset_id(jt.robot_type))
        return TaskLookup("unknown")

    def skillset_id(self, robot_type: str) -> str:
        sid = self._skillset_ids.get(robot_type)
        if sid is None:
            try:
                sid = self._hooks.skillset(robot_type).id
            except Exception:  # noqa: BLE001 - an id is cosmetic; never fail a dispatch on it
                sid = robot_type
            self._skillset_ids[robot_type] = sid
        return sid

    def engine_snapshot(self) -> tuple[Any, Any, dict, float] | None:
        """(EngineStats, EngineInfo, the scheduler's step-time estimate, warm-up's lone first segment in s or 0)
        now, or None when the engine cannot tell."""
        try:
            engine = self.supervisor.engine
            return engine.stats(), engine.info, self.core.estimator.describe(), \
                lone_first_s(self.core.calibration)
        except Exception:  # noqa: BLE001
            return None

    # -- core callbacks (engine thread, or a report's thread) --------------------------------------
    def _on_segment(self, res: TaskResult, seg: Segment) -> None:
        with self._lock:
            op = self._open.get(res.task_id)
            goals = list(op.goals) if op is not None else []
        robot_type = op.robot_type if op else res.robot_type
        final = bool(seg.final)
        if op is not None:
            op.sent = max(op.sent, seg.index + 1)
            op.final_sent = op.final_sent or final
        if self.journal is not None:
            self._jot("segment_sent", res.task_id, seg.index, seg.text, list(seg.token_ids), final,
                      self._bridge.to_wall(seg.dispatch), seg.est_exec_s)
        self._sender.send_segment(res.task_id, res.robot_id, seg, self.skillset_id(robot_type), goals)

    def _on_result(self, res: TaskResult) -> None:
        """Journal, the result for everyone, the robot's end of plan, then every waiting goal. Each step is
        guarded: one failing (e.g. a publisher whose context is going away) must not keep the others from
        happening."""
        with self._lock:
            op = self._open.pop(res.task_id, None)
            if self._recovery.take_readopted(res.task_id):  # re-adopted after a restart: its result stands
                return
        marker_at = None
        if op is not None and op.sent and not op.final_sent:
            # The robot's topic carries the end of the plan itself: a marker after the last segment sent.
            marker_at = self.core.clock.now()
            self._jot("end_marker_sent", res.task_id, op.sent, self._bridge.to_wall(marker_at))  # its stamp
        self._jot("task_finished", res.task_id, res.status.value, result_record(res), time.time())
        if res.status is not TaskStatus.DONE:  # (or revised) a segment still in flight must not start it later
            self.delivery.forget_plan(res.task_id)
        _guard(self._log, "publish the result", lambda: self._sender.publish_result(res))
        if marker_at is not None:
            _guard(self._log, "send the end-of-plan marker",
                        lambda: self._sender.send_end_marker(res.task_id, res.robot_id, op.sent, marker_at))
        if op is None:
            return  # a revision (late robot failure) or a restored task: the published result carries it
        self._sender.finish_goals(op.goals, res)
        for w in op.waiters:
            w.put(res)

    def _jot(self, what: str, *args: Any) -> None:
        """Journal write: a failure is logged loudly but never stops a segment or result from going out."""
        if self.journal is None or self._journal_closed:
            return
        try:
            getattr(self.journal, what)(*args)
        except Exception as e:  # noqa: BLE001
            self.journal_errors += 1
            self._log.error(f"journal {what}{args[:2]} failed: {e!r}")

    # -- robot reports (rclpy callbacks) -----------------------------------------------------------
    def segment_done(self, task_id: str, index: int, robot_id: str, success: bool, error: str,
                     start_wall: float | None, finish_wall: float | None) -> None:
        """A robot's report of a segment; ``start_wall``/``finish_wall``: its stamps, None where unset."""
        core, delivery = self.core, self.delivery
        if core is None:  # cleaned up: a callback already in flight has nothing to do
            return
        start = self._bridge.to_core_s(start_wall) if start_wall is not None else None
        finish = self._bridge.to_core_s(finish_wall) if finish_wall is not None else None
        refused = core.report_segment_done(task_id, index, finish, success, error, start, robot_id=robot_id)
        if refused is not None:
            self._rejected.note("report", robot_id, refused)
            return
        # A report implies receipt (its ack may have been lost), and that the robot is alive.
        delivery.ack(task_id, index, robot_id=robot_id)
        delivery.heard(robot_id, time.monotonic())
        stamp_lag(finish_wall, self._max_clock_skew_s, core.note_stamp_lag,
                  lambda why: self._rejected.note("stamp", "(any)", why))
        if self.journal is not None:
            self._jot("segment_reported", task_id, index, success, start_wall or None, finish_wall or None, error)

    def segment_ack(self, task_id: str, index: int, robot_id: str, running: bool, stamp_wall: float | None) -> None:
        """An acknowledgement, or a heartbeat (``running``). It counts only from the task's robot, for a segment
        sent to it: a rogue node must neither stop the re-sends to the real robot nor keep a dead one alive."""
        core, delivery = self.core, self.delivery
        if core is None:  # cleaned up: a callback already in flight has nothing to do
            return
        now = time.monotonic()
        acked = delivery.ack(task_id, index, now, robot_id=robot_id)
        refused = core.robot_alive(task_id, index, robot_id)
        if refused is not None and not acked:  # an end marker or a task already forgotten: delivery's word
            self._rejected.note("heartbeat" if running else "ack", robot_id, refused)
            return
        delivery.heard(robot_id, now)
        stamp_lag(stamp_wall, self._max_clock_skew_s, core.note_stamp_lag,
                  lambda why: self._rejected.note("stamp", "(any)", why))
        if acked and self.journal is not None:
            self._jot("segment_acked", task_id, index)

    # -- housekeeping (a timer) --------------------------------------------------------------------
    def housekeeping(self) -> None:
        """Re-send or give up on unacknowledged segments, probe unreported ones, end tasks of silent robots,
        release idle robots, prune the journal."""
        core, delivery = self.core, self.delivery
        if core is None:  # cleaned up: a callback already in flight has nothing to do
            return
        reachable = self._robots.reachable
        for tid, index, robot_id in delivery.due(time.monotonic(), reachable):
            if reachable(robot_id):
                why = f"robot {robot_id} never acknowledged segment {index} within {delivery.give_up_s:g} s"
                detail = delivery.given_up_detail(tid, index)
                why += f" ({detail})" if detail else ""
            else:
                why = (f"robot {robot_id} unreachable: no executor subscribed to {segment_topic(robot_id)} "
                       f"within {4 * delivery.give_up_s:g} s")
            self._log.error(f"task {tid}: {why}")
            core.robot_failed(tid, why)
        for tid, robot_id, robot_type, seg in core.unreported():
            self._sender.resend_segment(tid, robot_id, seg, self.skillset_id(robot_type))
        for tid in core.expire_silent(unacked=delivery.unacked):
            self._log.error(f"task {tid}: robot silent, ended ROBOT_FAILED")
        now = time.monotonic()
        if now >= self._next_release:  # robots never matched go even with idle release off (RobotLinks)
            self._next_release = now + min(30.0, self._robot_idle_release_s / 2 or 30.0)
            busy = self.core.robots_in_use()  # robots with no open task, waiting task or unacknowledged segment go
            released = self._robots.release_idle(now, self._robot_idle_release_s or float("inf"),
                                                 lambda r: r in busy or bool(self.delivery.pending_for(r)))
            if released:
                self._log.debug(f"released {released} idle robots' segment publishers")
        if self.journal is not None and now >= self._next_prune:
            self._next_prune = now + 30.0
            cfg = core.cfg
            self._jot("prune", cfg.keep_results_s, cfg.keep_results_max, time.time())


__all__ = ["PlannerService"]
