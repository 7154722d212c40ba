"""The planner process: PlanTask action + Plan service over one PlannerCore.

Two nodes share one process so that the decision path stays in-process:

* ``planner`` (a lifecycle node) owns the engine, the action server, the
  one-shot service, the per-robot segment topics and the SegmentDone
  subscription;
* ``scheduler`` (``scheduler_node.py``) owns the policy (``policy`` can be
  changed at run time) and publishes SchedulerState.

Messages are built in ``convert.py``; the journal's result records are
``sched/journal_records.py``.

The engine loop runs in its own thread (PlannerCore.serve_forever), never in
an rclpy callback. Action/service callbacks only validate, submit to the core
and wait on a per-task mailbox that the engine thread fills.
"""

from __future__ import annotations

import math
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.event_handler import PublisherEventCallbacks
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.qos import QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy
from rclpy.service import Service
from rclpy.subscription import Subscription
from rclpy.timer import Timer

from timelyllm_ros.action import PlanTask
from timelyllm_ros.engines.factory import planner_engine
from timelyllm_ros.engines.prompts import PromptRenderer, TaskPromptError
from timelyllm_ros.model.clock import RealClock
from timelyllm_ros.model.types import Segment, TaskResult, TaskSpec, TaskStatus
from timelyllm_ros.msg import (
    EngineState,
    PlanResult,
    PlanSegment,
    SegmentAck,
    SegmentDone,
    TaskRequest,
)
from timelyllm_ros.ros import params, topics
from timelyllm_ros.ros.actions import BatchedActionServer
from timelyllm_ros.ros.convert import (
    ClockBridge,
    duration_msg,
    engine_member_msg,
    plan_result_from_record,
    plan_result_msg,
    pool_members,
    result_msg,
    segment_msg,
    skill_call_msg,
    spec_record,
    started,
    status_code,
    time_s,
    tuf_from_msg,
)
from timelyllm_ros.ros.delivery import RejectedMessages
from timelyllm_ros.ros.diagnostics import PlannerHealth, attach_planner_diagnostics
from timelyllm_ros.ros.scheduler_node import SchedulerNode
from timelyllm_ros.ros.spin import run_nodes
from timelyllm_ros.sched.hygiene import check_text, check_token_count
from timelyllm_ros.sched.journal import ACTIVE, Journal
from timelyllm_ros.sched.journal_records import result_record, task_result_from_record
from timelyllm_ros.sched.policies import DEFAULT_POLICY, make_policy
from timelyllm_ros.sched.scheduler import CoreConfig, PlannerCore
from timelyllm_ros.srv import GetPlanResult, Plan


@dataclass
class _OpenTask:
    """Node-side state of one accepted task: who waits for it and what its robot was sent."""

    task_id: str
    robot_id: str
    robot_type: str
    key: tuple  # the request's content: a retry with the same task_id and key joins this task
    handles: list = field(default_factory=list)  # PlanTask goal handles (a retry adds one)
    waiters: list = field(default_factory=list)  # queues of one-shot Plan service calls
    sent: int = 0  # segments handed to the robot's topic
    final_sent: bool = False


class GoalError(ValueError):
    """A goal that is refused; the message names the field and the problem. ``status``: INVALID for what the
    request asked, BUSY for the planner's state at the time (the same request may succeed later)."""

    def __init__(self, message: str, status: TaskStatus = TaskStatus.INVALID) -> None:
        super().__init__(message)
        self.status = status


def _request_key(robot_id: str, robot_type: str, task: str, tuf_msg) -> tuple:
    return (robot_id, robot_type, task, tuf_msg.level, tuf_msg.alpha, tuf_msg.beta, tuf_msg.ert)


class PlannerNode(LifecycleNode):
    """Thin adapter: validates goals, hands them to the core, and delivers what the core produces.

    A managed (lifecycle) node. ``configure`` loads the engine, warms its prompts and starts the engine
    thread; ``activate`` opens the PlanTask action and the /plan and /get_plan_result services and accepts
    goals; ``deactivate`` drains: new goals are refused (BUSY, with the reason), open tasks get up to
    ``drain_timeout_s`` to finish and are then ended CANCELLED, each with a result its robot receives;
    ``cleanup`` closes the servers and frees the engine. A configure that fails (e.g. the engine cannot
    load) goes through error processing back to unconfigured, the reason in the log and in
    ``lifecycle_error``. With ``autostart`` (default) the node configures and activates itself, as a plain
    node would; launch files that drive the transitions set it to false.

    No thread waits per goal: a goal handle is kept until the core's result callback completes it
    (``ServerGoalHandle.execute`` with a callback that returns the finished result), so the number of
    open goals is bounded by ``max_active_tasks``, not by the executor's thread count.
    """

    def __init__(self, *, policy: str = DEFAULT_POLICY, engine: Any = None, constrained: bool = False,
                 core_config: CoreConfig | None = None, parameter_overrides: list[Parameter] | None = None,
                 node_name: str = "planner", engine_factory: Callable[[], Any] | None = None,
                 scheduler: SchedulerNode | None = None, **node_kw) -> None:
        super().__init__(node_name, parameter_overrides=parameter_overrides or [], **node_kw)
        # A constructor that raises destroys its node: left alive, it stays on the graph (its services
        # announced, nobody answering) for as long as the exception's traceback keeps it referenced.
        try:
            self._p = p = self._declare_params()
            p["policy"] = policy
            self._scheduler = scheduler
            self._given = (engine, constrained, engine_factory, core_config)
            self._bridge = ClockBridge()
            self.engine: Any = None
            self.core: PlannerCore | None = None
            self.delivery: Any = None
            self.journal: Any = None
            self._prompts: PromptRenderer | None = None
            self._engine_factory: Callable[[], Any] = self._reuse_engine
            self._owns_engine = False
            self._open: dict[str, _OpenTask] = {}
            self._open_lock = threading.RLock()
            self._arrivals: dict[int, float] = {}  # id(goal message) -> arrival (core clock), goal_cb -> accepted cb
            self._seg_pubs: dict[str, Any] = {}
            self._pub_used: dict[str, float] = {}  # robot -> last segment sent to it (monotonic), for release
            self._discovered: set[str] = set()  # robots whose reader matched their segment topic (one per publisher)
            self._pub_lock = threading.Lock()
            self._skillset_ids: dict[str, str] = {}
            self._oneshot = threading.BoundedSemaphore(p["max_oneshot_calls"])
            self._engine_error: str | None = None  # set while the engine is down (goals are refused)
            self._next_prune = 0.0
            self._journal_closed = False
            self._recovered = False
            self._active = False  # goals are accepted only while active
            self._servers: list[Any] = []  # action server and services: open from the first activate to cleanup
            self._configured: list[Any] = []  # subscriptions and timers of the configured state
            self._stop = threading.Event()
            self._thread: threading.Thread | None = None
            self.engine_restarts = 0
            self.lifecycle_error: str | None = None  # why the last transition failed
            # The report publishers live as long as the node: a drained task's result still goes out.
            self._engine_pub = self.create_publisher(EngineState, topics.ENGINE_STATE, topics.TELEMETRY)
            self._all_segments = self.create_publisher(PlanSegment, topics.ALL_SEGMENTS, topics.REPORTS)
            self._requests = self.create_publisher(TaskRequest, topics.PLAN_REQUESTS, topics.REPORTS)
            self._results = self.create_publisher(PlanResult, topics.PLAN_RESULTS, topics.RESULTS_QOS)
            self.journal_errors = 0
            self.rejected = RejectedMessages(self.get_logger().warning)  # refused robot messages (/diagnostics)
            self.diagnostics = attach_planner_diagnostics(self)  # /diagnostics in every lifecycle state
            if p["autostart"]:
                for step, trigger in (("configure", self.trigger_configure), ("activate", self.trigger_activate)):
                    if trigger() != TransitionCallbackReturn.SUCCESS:
                        raise RuntimeError(f"planner could not {step}: {self.lifecycle_error or 'see the log'}")
        except BaseException:
            self.destroy_node()
            raise

    @property
    def lifecycle_state(self) -> str:
        """unconfigured | inactive | active | finalized (or a transition state while one runs)."""
        return self._state_machine.current_state[1]

    def health(self) -> PlannerHealth:
        """A snapshot of the engine's and the journal's state for /diagnostics (safe in every lifecycle state)."""
        try:
            lifecycle: str | None = self.lifecycle_state
        except Exception:  # noqa: BLE001 - a state machine mid-teardown has no state to report
            lifecycle = None
        thread, journal = self._thread, self.journal
        return PlannerHealth(
            lifecycle_state=lifecycle, engine=self.engine, core=self.core, engine_error=self._engine_error,
            engine_restarts=self.engine_restarts, engine_thread_alive=None if thread is None else thread.is_alive(),
            stopping=self._stop.is_set(), journal_file=None if journal is None else journal.file,
            journal_open=journal is not None and journal.is_open and not self._journal_closed,
            journal_errors=self.journal_errors, rejected_messages=self.rejected.snapshot())

    # -- lifecycle transitions ----------------------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.lifecycle_error = None
        try:
            self._configure()
        except Exception as e:  # noqa: BLE001 - a failed engine start goes to error processing with its reason
            self.lifecycle_error = f"configure failed: {e!r}"
            self.get_logger().error(self.lifecycle_error)
            return TransitionCallbackReturn.ERROR
        return TransitionCallbackReturn.SUCCESS

    def _configure(self) -> None:
        p = self._p
        engine, constrained, engine_factory, core_config = self._given
        self._owns_engine = engine is None
        if engine is None:
            engine, constrained = planner_engine(p["engine_config"])
            engine_factory = engine_factory or (lambda: planner_engine(p["engine_config"])[0])
        self.engine = engine
        self._engine_factory = engine_factory or self._reuse_engine
        from timelyllm_ros.ros.delivery import SegmentDelivery

        robot_timeout = p["robot_timeout_s"] if p["robot_timeout_s"] > 0 else None
        prefill_step = p["prefill_step_ms"] / 1000 if p["prefill_step_ms"] > 0 else None
        cfg = core_config or CoreConfig(comm_s=p["comm_s"], overdue=p["overdue"], slack_floor_s=p["slack_floor_s"],
                                        resume_lead_s=p["resume_lead_s"], keep_results_s=p["keep_results_s"],
                                        keep_results_max=p["keep_results_max"], robot_timeout_s=robot_timeout,
                                        prefill_step_s=prefill_step)
        policy = self._scheduler.policy_name if self._scheduler is not None else p["policy"]
        self.core = PlannerCore(engine, make_policy(policy), RealClock(), admission=p["admission"],
                                config=cfg, on_segment=self._on_segment, on_result=self._on_result)
        self.delivery = SegmentDelivery(self._publish_to_robot, period_s=p["resend_period_s"],
                                        max_period_s=p["resend_max_period_s"],
                                        give_up_s=p["delivery_timeout_s"])
        self._prompts = PromptRenderer(engine, constrained)
        self._skillset_ids = {}
        if p["state_dir"]:
            journal = Journal(p["state_dir"], reset_damaged=p["journal_reset_damaged"])  # refuses damage, named
            for w in journal.warnings:
                self.get_logger().warning(f"journal: {w}")
            if journal.reset_report:  # loud: the tasks in the moved files are not resumed
                self.get_logger().error(f"journal: {journal.reset_report}")
            self.journal, self._journal_closed, self._recovered = journal, False, False
        # Reports and acks in groups of their own: a burst of one never queues behind the other.
        self._configured = [
            self.create_subscription(SegmentDone, topics.SEGMENT_DONE, self._segment_done, topics.REPORTS_IN,
                                     callback_group=MutuallyExclusiveCallbackGroup()),
            self.create_subscription(SegmentAck, topics.SEGMENT_ACKS, self._segment_ack, topics.REPORTS_IN,
                                     callback_group=MutuallyExclusiveCallbackGroup()),
            self.create_timer(p["state_period_s"], self._publish_engine_state),
            self.create_timer(p["resend_period_s"] / 2, self._housekeeping,
                              callback_group=MutuallyExclusiveCallbackGroup())]
        self._stop = threading.Event()
        if p["warm_up"]:
            self._warm_up()
        self._thread = threading.Thread(target=self._engine_loop, name="timelyllm-engine", daemon=True)
        self._thread.start()
        if self._scheduler is not None:
            self._scheduler.attach(self.core)
        self.get_logger().info(
            f"planner configured: policy={policy} admission={p['admission']} engine={type(engine).__name__} "
            f"robot types={self._robot_types} journal={p['state_dir'] or 'off'}")

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        if not self._servers:
            self._open_servers()
        if self.journal is not None and not self._recovered:
            self._recovered = True
            self._recover()
        with self._open_lock:
            self._active = True
        self.get_logger().info("planner ready: active, accepting goals")  # tests and tools wait for this line
        return super().on_activate(state)

    def _open_servers(self) -> None:
        p = self._p
        goals = ReentrantCallbackGroup()
        deep = QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.RELIABLE, history=QoSHistoryPolicy.KEEP_LAST)
        # A burst of goals must not overflow the goal service's request queue (rclpy's default depth is 10).
        self._action = BatchedActionServer(self, PlanTask, topics.PLAN_TASK_ACTION, execute_callback=self._execute_noop,
                                    goal_callback=self._goal_cb, handle_accepted_callback=self._accepted,
                                    cancel_callback=self._cancel_cb, callback_group=goals,
                                    goal_service_qos_profile=deep, result_service_qos_profile=deep,
                                    cancel_service_qos_profile=deep,
                                    feedback_pub_qos_profile=QoSProfile(depth=1000),
                                    result_timeout=int(p["action_result_timeout_s"]))
        self._servers = [
            self._action,
            self.create_service(Plan, topics.PLAN_SERVICE, self._plan_srv, callback_group=goals),
            self.create_service(GetPlanResult, topics.GET_PLAN_RESULT_SERVICE, self._get_result_srv,
                                callback_group=goals)]

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        with self._open_lock:
            self._active = False
        self._drain(self._p["drain_timeout_s"], "planner deactivated before the task finished")
        return super().on_deactivate(state)

    def _drain(self, timeout_s: float, reason: str) -> None:
        """Let open tasks finish for up to ``timeout_s``, then end the rest CANCELLED: every robot hears."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self._open_lock:
                left = len(self._open)
            if not left:
                return
            time.sleep(0.05)
        if self.core is not None:
            n = self.core.fail_all(reason, TaskStatus.CANCELLED)
            self.get_logger().warning(f"drain: {n} open tasks ended CANCELLED after {timeout_s:g} s")

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._teardown()
        return super().on_cleanup(state)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.shutdown()
        return super().on_shutdown(state)

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Undo whatever a failed transition left, so the node is cleanly unconfigured (configure may be
        tried again)."""
        self.get_logger().error(f"error processing: {self.lifecycle_error or 'a transition failed'}; "
                                "releasing the engine, back to unconfigured")
        try:
            self._teardown()
        except Exception as e:  # noqa: BLE001
            self.get_logger().error(f"releasing after the error failed: {e!r}")
            return TransitionCallbackReturn.FAILURE  # -> finalized
        return TransitionCallbackReturn.SUCCESS

    def _teardown(self) -> None:
        """Stop the engine thread, close servers, subscriptions and timers, the journal, and an engine this
        node built. Open tasks are answered first (nothing is left hanging)."""
        with self._open_lock:
            self._active = False
        if self.core is not None:
            self.shutdown()
        for ent in self._servers + self._configured:
            try:
                if isinstance(ent, ActionServer):
                    ent.destroy()
                else:
                    self._destroy_entity(ent)
            except Exception as e:  # noqa: BLE001 - a half-built entity must not keep the rest alive
                self.get_logger().warning(f"closing {ent!r}: {e!r}")
        self._servers, self._configured = [], []
        if self._scheduler is not None:
            self._scheduler.detach()
        if self.engine is not None and self._owns_engine:
            try:
                self.engine.close()
            except Exception as e:  # noqa: BLE001 - a broken engine may not close cleanly
                self.get_logger().warning(f"closing the engine: {e!r}")
        self.engine = self.core = self.delivery = self._prompts = None
        self.journal = None

    def _destroy_entity(self, ent: Any) -> None:
        for kind, destroy in ((Subscription, self.destroy_subscription), (Timer, self.destroy_timer),
                              (Service, self.destroy_service)):
            if isinstance(ent, kind):
                destroy(ent)
                return
        raise TypeError(f"unknown entity {ent!r}")

    def _warm_up(self) -> None:
        """Prefill each robot type's shared prompt (skill catalogue, few-shot examples) once, before the
        first task: then even the first request of a burst pays only for its own scene and instruction,
        and a fresh engine's slow first forward passes are out of the way. Runs before the engine thread
        starts, so this thread is the engine thread meanwhile."""
        prompts, burst = self._prompts.warm_up_prompts(self._robot_types)
        if not prompts:
            return  # the simulated engine has no prompt to warm
        t0 = time.monotonic()
        self.core.warm_up(prompts, burst, extra=self._prompts.warm_up_extra)
        self.get_logger().info(f"warmed the prompts of {self._robot_types} in {time.monotonic() - t0:.2f} s")

    # -- parameters ---------------------------------------------------------------
    def _declare_params(self) -> dict:
        """Every parameter is read once (at construction or configure): all are read-only, with ranges where
        they apply, so a set at run time is refused with a reason instead of silently doing nothing."""
        def declare(name: str, default: Any, description: str, lo: float | None = None, hi: float | None = None
                    ) -> Any:
            return params.declare(self, name, default, description, read_only=True, min=lo, max=hi)

        big = 1e9
        p = {
            "engine_config": declare("engine_config", "engine_vllm_cpu.yaml",
                                     "engine YAML (file name in config/ or a path); loaded at configure"),
            "admission": declare("admission", "auto", "'auto' (latency-guided for segmented policies, vLLM's cap "
                                 "of 256 for the fcfs baselines), 'latency' (latency-guided) or a fixed batch cap"),
            "prefill_step_ms": declare("prefill_step_ms", 0.0, "latency-guided admission: the prefill one step may "
                                       "carry, ms of estimated prefill, so a step in flight delays an urgent goal "
                                       "less (0 = off, the default: it costs throughput under load)", 0.0, 10_000.0),
            "overdue": declare("overdue", "serve", "'serve' overdue tasks last, or 'reject' them"),
            "comm_s": declare("comm_s", 0.008, "one network hop, s", 0.0, 10.0),
            "slack_floor_s": declare("slack_floor_s", 0.001, "smallest slack a generation is ranked by, s",
                                     0.0, 10.0),
            "resume_lead_s": declare("resume_lead_s", 0.05, "resume a suspended generation this long before its "
                                                            "robot is predicted idle, s", 0.0, 60.0),
            "state_period_s": declare("state_period_s", 0.5, "EngineState period, s", 0.01, 3600.0),
            "robot_types": declare("robot_types", ["drone", "arm", "chatbot"], "robot types served (skill sets)"),
            "max_task_chars": declare("max_task_chars", 2000, "task text limit in characters", 1, 10**7),
            "max_task_tokens": declare("max_task_tokens", 1024, "task text limit in tokens of the engine's "
                                                                "tokenizer", 1, 10**7),
            "warm_up": declare("warm_up", True, "prefill each robot type's shared prompt at configure"),
            "max_active_tasks": declare("max_active_tasks", 5000, "open tasks; goals beyond are refused BUSY, "
                                                                  "never dropped", 1, 10**7),
            "max_oneshot_calls": declare("max_oneshot_calls", 8, "concurrent /plan service calls (each holds a "
                                                                 "thread); more are refused: use the PlanTask "
                                                                 "action", 1, 1000),
            "keep_results_s": declare("keep_results_s", 600.0, "finished results kept this long (then the id is "
                                                               "free)", 0.001, big),
            "keep_results_max": declare("keep_results_max", 10000, "at most this many finished results kept",
                                        1, 10**8),
            "action_result_timeout_s": declare("action_result_timeout_s", 60, "rclpy keeps an action result "
                                                                              "this long, s", 1, 10**7),
            "resend_period_s": declare("resend_period_s", 0.2, "first re-send of an unacknowledged segment, s",
                                       0.001, 3600.0),
            "resend_max_period_s": declare("resend_max_period_s", 1.0, "re-send backoff cap, s", 0.001, 3600.0),
            "delivery_timeout_s": declare("delivery_timeout_s", 30.0, "a segment unacknowledged this long fails "
                                                                      "its task (ROBOT_FAILED), s", 0.001, big),
            "robot_timeout_s": declare("robot_timeout_s", 10.0, "a robot silent this long fails its task "
                                                                "(ROBOT_FAILED): no heartbeat, ack or report from "
                                                                "an executor that sends heartbeats; else past the "
                                                                "model's longest time for the segment; 0: never",
                                       0.0, big),
            "robot_idle_release_s": declare("robot_idle_release_s", 600.0, "a robot sent nothing this long, with "
                                                                         "no open task, has its segment publisher "
                                                                         "and per-robot state released (bounded "
                                                                         "memory with many robot ids), s; 0: never",
                                            0.0, big),
            "max_clock_skew_s": declare("max_clock_skew_s", 120.0, "a robot message stamped further than this "
                                                                   "from the planner's clock does not count as "
                                                                   "how far behind the planner reads, s", 0.001, big),
            "state_dir": declare("state_dir", "", "folder of the durable task journal (SQLite WAL); '' = none"),
            "journal_reset_damaged": declare("journal_reset_damaged", False, "a damaged journal (lost commits, "
                                             "corrupt file) is moved aside and an empty one started, instead of "
                                             "refused at configure"),
            "engine_restart_backoff_s": declare("engine_restart_backoff_s", 0.5, "first wait before rebuilding a "
                                                                                 "failed engine; doubles up to "
                                                                                 "30 s", 0.001, 3600.0),
            "autostart": declare("autostart", True, "configure and activate at start-up; false: wait for the "
                                                    "lifecycle transitions (launch files, a lifecycle manager)"),
            "drain_timeout_s": declare("drain_timeout_s", 30.0, "deactivate lets open tasks finish this long, "
                                                                "then ends them CANCELLED, s", 0.0, big),
        }
        for name in ("max_active_tasks", "max_oneshot_calls", "keep_results_max", "max_task_tokens",
                     "max_task_chars", "action_result_timeout_s"):
            if int(p[name]) < 1:
                raise ValueError(f"parameter {name}: must be >= 1, got {p[name]}")
        for name in ("resend_period_s", "delivery_timeout_s", "keep_results_s", "engine_restart_backoff_s"):
            if not float(p[name]) > 0:
                raise ValueError(f"parameter {name}: must be > 0, got {p[name]}")
        if float(p["robot_timeout_s"]) < 0:
            raise ValueError(f"parameter robot_timeout_s: must be >= 0 (0 = never), got {p['robot_timeout_s']}")
        if float(p["resend_max_period_s"]) < float(p["resend_period_s"]):
            raise ValueError(f"parameter resend_max_period_s: must be >= resend_period_s ({p['resend_period_s']}), "
                             f"got {p['resend_max_period_s']}")
        if p["overdue"] not in ("serve", "reject"):
            raise ValueError(f"parameter overdue: must be 'serve' or 'reject', got {p['overdue']!r}")
        self._robot_types = list(p["robot_types"])
        self._max_task_chars = int(p["max_task_chars"])
        self._max_task_tokens = int(p["max_task_tokens"])
        self._max_active = int(p["max_active_tasks"])
        self._restart_backoff = float(p["engine_restart_backoff_s"])
        self._max_clock_skew_s = float(p["max_clock_skew_s"])
        self._robot_idle_release_s = float(p["robot_idle_release_s"])
        self._next_release = 0.0
        return p

    # -- goal validation -------------------------------------------------------------
    def _goal_cb(self, goal: PlanTask.Goal) -> GoalResponse:
        # Accept everything here so that a refused goal still gets a result with the reason; this is the
        # earliest moment the goal is ours: its arrival time.
        with self._open_lock:
            if len(self._arrivals) > 10_000:  # entries whose goal never reached _accepted (bounded memory)
                self._arrivals.clear()
            self._arrivals[id(goal)] = self.core.clock.now()
        return GoalResponse.ACCEPT

    def _validate(self, task_id: str, robot_id: str, robot_type: str, task: str, tuf_msg, *,
                  arrival: float | None = None, sent: float | None = None) -> TaskSpec:
        try:
            self._check_fields(robot_id, task_id, task)
        except ValueError as e:  # the hygiene checks name the field, the character and its position
            raise GoalError(str(e)) from None
        if not robot_id.strip():
            raise GoalError("robot_id: must not be empty")
        problem = topics.robot_id_problem(robot_id)  # it names a topic: refused here, not failed at publishing
        if problem is not None:
            raise GoalError(f"robot_id: {problem}")
        if robot_type not in self._robot_types:
            raise GoalError(f"robot_type: unknown {robot_type!r}; this planner serves {self._robot_types}")
        if not task.strip():
            raise GoalError("task: must not be empty")
        if len(task) > self._max_task_chars:
            raise GoalError(f"task: {len(task)} characters, more than max_task_chars={self._max_task_chars}")
        try:
            tuf = tuf_from_msg(tuf_msg)
        except ValueError as e:
            raise GoalError(str(e)) from None
        try:
            check_token_count("task", self._prompts.count_tokens(task), self._max_task_tokens)
        except ValueError as e:
            raise GoalError(str(e)) from None
        try:
            prompt_ids, extra = self._prompts.render(robot_type, task)
        except TaskPromptError as e:
            raise GoalError(str(e)) from None
        return TaskSpec(robot_id=robot_id, prompt=task, tuf=tuf, robot_type=robot_type,
                        task_id=task_id or f"{robot_id}-{uuid.uuid4().hex[:8]}", prompt_token_ids=prompt_ids,
                        extra=extra, arrival=arrival, sent=sent)

    @staticmethod
    def _check_fields(robot_id: str, task_id: str, task: str) -> None:
        check_text("robot_id", robot_id, max_chars=256)
        check_text("task_id", task_id, max_chars=256)
        check_text("task", task)

    # -- accepting work -----------------------------------------------------------------
    def _accept(self, task_id: str, robot_id: str, robot_type: str, task: str, tuf_msg, *,
                arrival: float | None = None, stamp=None, handle=None, waiter=None) -> tuple[str, TaskResult | None]:
        """Validate and submit, or join the open task of an identical retry. Returns (task id, its result if it
        has already finished). Every request, refused or not, is published on /plan_requests."""
        arrival = self.core.clock.now() if arrival is None else arrival
        sent = self._bridge.to_core(stamp) if stamp is not None and (stamp.sec or stamp.nanosec) else None
        req = TaskRequest(stamp=self._bridge.to_msg(arrival), task_id=task_id, robot_id=robot_id,
                          robot_type=robot_type, task=task, tuf=tuf_msg, accepted=False)
        if sent is not None:
            req.sent = stamp
        key = _request_key(robot_id, robot_type, task, tuf_msg)
        try:
            with self._open_lock:
                joined = self._join(task_id, key, handle, waiter)
                if joined is not None:
                    return task_id, joined[1]
                if not self._active:
                    raise GoalError(f"planner not active (lifecycle state: {self.lifecycle_state}); retry later",
                                    TaskStatus.BUSY)
                if self._engine_error is not None:
                    raise GoalError(f"engine unavailable ({self._engine_error}); restarting, retry later",
                                    TaskStatus.BUSY)
                if len(self._open) >= self._max_active:
                    raise GoalError(f"planner at capacity: {len(self._open)} active tasks "
                                    f"(max_active_tasks={self._max_active}); retry later", TaskStatus.BUSY)
                spec = self._validate(task_id, robot_id, robot_type, task, tuf_msg, arrival=arrival, sent=sent)
                req.task_id = spec.task_id
                spec.meta["request_key"] = key
                if self.core.task_status(spec.task_id) is not None:
                    raise GoalError(f"task_id: {spec.task_id!r} is already in use")
                self._segment_pub(robot_id)  # discovery starts now, before the first segment exists
                self._open[spec.task_id] = _OpenTask(spec.task_id, robot_id, robot_type, key,
                                                     [handle] if handle is not None else [],
                                                     [waiter] if waiter is not None else [])
                if self.journal is not None and not self._journal_closed:
                    try:  # not _jot: a goal that cannot be journaled is refused, never accepted non-durably
                        self.journal.task_accepted(spec.task_id, robot_id, robot_type,
                                                   spec_record(spec, tuf_msg, self._bridge),
                                                   self._bridge.to_wall(arrival))
                    except Exception as e:  # noqa: BLE001 - e.g. JournalError: disk full, naming the file
                        self._open.pop(spec.task_id, None)
                        self.journal_errors += 1
                        raise GoalError(f"not accepted: the task journal could not record it ({e}); retry later",
                                        TaskStatus.BUSY) from None
            try:
                tid = self.core.submit(spec)
            except ValueError as e:
                with self._open_lock:
                    self._open.pop(spec.task_id, None)
                raise GoalError(str(e)) from None
        except GoalError as e:
            req.error, req.status = str(e), status_code(e.status)
            self._requests.publish(req)
            self.get_logger().warning(f"request from {robot_id!r} refused: {e}")
            raise
        req.accepted = True
        self._requests.publish(req)
        return tid, None

    def _join(self, task_id: str, key: tuple, handle, waiter) -> tuple[str, TaskResult | None] | None:
        """A repeated request (same task_id, same content) is answered with that task's state."""
        if not task_id:
            return None
        op = self._open.get(task_id)
        if op is not None:
            if op.key != key:
                raise GoalError(f"task_id: {task_id!r} is already in use by a different request")
            if handle is not None:
                op.handles.append(handle)
            if waiter is not None:
                op.waiters.append(waiter)
            return task_id, None
        res = self.core.result(task_id)
        if res is None and self.journal is not None and not self._journal_closed:
            rec = self.journal.result(task_id)  # finished before this planner (re)started
            if rec is not None:
                res = task_result_from_record(task_id, rec)
        if res is not None:
            if res.meta.get("request_key") != key:
                raise GoalError(f"task_id: {task_id!r} is already in use by a different request")
            return task_id, res
        return None

    def _accepted(self, goal_handle) -> None:
        g = goal_handle.request
        with self._open_lock:
            arrival = self._arrivals.pop(id(g), None)
        try:
            tid, done = self._accept(g.task_id, g.robot_id, g.robot_type, g.task, g.tuf, arrival=arrival,
                                     stamp=g.stamp, handle=goal_handle)
        except GoalError as e:  # refused (INVALID or BUSY), with the reason
            self._complete(goal_handle, PlanTask.Result(status=status_code(e.status), message=str(e),
                                                        task_id=g.task_id), e.status)
            return
        except Exception as e:  # noqa: BLE001 - the robot must hear why, whatever broke
            self.get_logger().error(f"goal from {g.robot_id!r} failed before planning: {e!r}")
            self._complete(goal_handle, PlanTask.Result(status=status_code(TaskStatus.FAILED),
                                                        message=f"planner error: {e}", task_id=g.task_id),
                           TaskStatus.FAILED)
            return
        if done is not None:  # a retry of a finished task: its result again
            self._complete(goal_handle, self._result_msg(done), done.status)

    def _complete(self, goal_handle, out: PlanTask.Result, status: TaskStatus) -> None:
        """Finish a goal without having held a thread for it: rclpy runs this callback once, at once."""
        def finish(h):
            if status is TaskStatus.DONE:
                h.succeed()
            elif status is TaskStatus.CANCELLED and h.is_cancel_requested:
                h.canceled()
            else:
                h.abort()
            return out
        try:
            goal_handle.execute(finish)
        except Exception as e:  # noqa: BLE001 - e.g. the client's goal already expired
            self.get_logger().warning(f"could not complete goal of task {out.task_id!r}: {e!r}")

    @staticmethod
    def _execute_noop(goal_handle) -> PlanTask.Result:  # every goal is completed through _complete
        goal_handle.abort()
        return PlanTask.Result(status=status_code(TaskStatus.FAILED), message="internal: goal executed twice")

    def _cancel_cb(self, goal_handle) -> CancelResponse:
        with self._open_lock:
            tid = next((t for t, op in self._open.items() if goal_handle in op.handles), None)
        if tid is None:
            return CancelResponse.REJECT
        self.core.cancel(tid, "cancelled by the robot")
        return CancelResponse.ACCEPT

    def _plan_srv(self, req: Plan.Request, resp: Plan.Response) -> Plan.Response:
        if not self._oneshot.acquire(blocking=False):
            resp.status, resp.error = Plan.Response.STATUS_BUSY, (
                "planner busy: too many one-shot /plan calls in progress (max_oneshot_calls); "
                "use the PlanTask action")
            return resp
        try:
            box: queue.Queue = queue.Queue(maxsize=1)
            try:
                tid, done = self._accept("", req.robot_id, req.robot_type, req.task, req.tuf, waiter=box)
            except GoalError as e:
                busy = e.status is TaskStatus.BUSY
                resp.status = Plan.Response.STATUS_BUSY if busy else Plan.Response.STATUS_REJECTED
                resp.error = str(e)
                return resp
            except Exception as e:  # noqa: BLE001
                resp.status, resp.error = Plan.Response.STATUS_FAILED, f"planner error: {e}"
                return resp
            res: TaskResult = done or box.get()
            out = self._result_msg(res)
            ok = res.status is TaskStatus.DONE
            resp.status = Plan.Response.STATUS_OK if ok else Plan.Response.STATUS_FAILED
            resp.error = "" if ok else out.message
            resp.plan_text, resp.segments = out.plan_text, out.segments
            return resp
        finally:
            self._oneshot.release()

    def _get_result_srv(self, req: GetPlanResult.Request, resp: GetPlanResult.Response) -> GetPlanResult.Response:
        tid = req.task_id
        res = self.core.result(tid)
        if res is not None:
            resp.state, resp.result = GetPlanResult.Response.STATE_DONE, self._plan_result_msg(res)
            sid = self._skillset_id(res.robot_type)
            resp.segments = [segment_msg(tid, res.robot_id, sg, self._bridge, sid) for sg in res.segments]
        elif self.core.task_status(tid) is not None:
            resp.state = GetPlanResult.Response.STATE_ACTIVE
            resp.result = PlanResult(task_id=tid, response_time_from_send=math.nan, utility=math.nan)
        elif self.journal is not None and (rec := self.journal.result(tid)) is not None:
            resp.state, resp.result = GetPlanResult.Response.STATE_DONE, plan_result_from_record(rec)
            jt = self.journal.task(tid)  # finished before a restart: the segments as journaled when sent
            if jt is not None:
                resp.segments = [self._journaled_segment_msg(tid, jt.robot_id, jt.robot_type, js)
                                 for js in jt.segments if not js.marker]
        else:
            resp.state = GetPlanResult.Response.STATE_UNKNOWN
            resp.result = PlanResult(task_id=tid, response_time_from_send=math.nan, utility=math.nan)
        return resp

    # -- messages ---------------------------------------------------------------------------
    def _result_msg(self, res: TaskResult) -> PlanTask.Result:
        return result_msg(res, self._bridge, self._skillset_id(res.robot_type))

    def _plan_result_msg(self, res: TaskResult) -> PlanResult:
        return plan_result_msg(res, self.get_clock().now().to_msg())

    # -- core callbacks (engine thread, or a report's thread) ------------------------------------
    def _on_segment(self, res: TaskResult, seg: Segment) -> None:
        with self._open_lock:
            op = self._open.get(res.task_id)
            handles = list(op.handles) if op is not None else []
        robot_type = op.robot_type if op else res.robot_type
        msg = segment_msg(res.task_id, res.robot_id, seg, self._bridge, self._skillset_id(robot_type))
        if op is not None:
            op.sent = max(op.sent, seg.index + 1)
            op.final_sent = op.final_sent or msg.is_final
        if self.journal is not None:
            self._jot("segment_sent", res.task_id, seg.index, seg.text, list(seg.token_ids), msg.is_final,
                                      self._bridge.to_wall(seg.dispatch), seg.est_exec_s)
        self._deliver(res.robot_id, msg)
        self._all_segments.publish(msg)  # fleet-wide copy for recorders and the exec-time node
        fb = PlanTask.Feedback(segment=msg, utility_estimate=math.nan)
        for h in handles:
            h.publish_feedback(fb)

    def _on_result(self, res: TaskResult) -> None:
        """Journal, /plan_results, the robot's end of plan, then every waiting goal. Each step is guarded:
        one failing (e.g. a publisher whose context is going away) must not keep the others from happening."""
        with self._open_lock:
            op = self._open.pop(res.task_id, None)
        marker = None
        if op is not None and op.sent and not op.final_sent:
            # The robot's topic carries the end of the plan itself: a marker after the last segment sent.
            marker = PlanSegment(task_id=res.task_id, robot_id=res.robot_id, segment_index=op.sent, text="",
                                 is_final=True, stamp_generated=self._bridge.to_msg(self.core.clock.now()))
            self._jot("end_marker_sent", res.task_id, op.sent)
        self._jot("task_finished", res.task_id, res.status.value, result_record(res), time.time())
        if res.status is not TaskStatus.DONE:  # (or revised) a segment still in flight must not start it later
            self.delivery.forget(res.task_id, keep=lambda m: topics.is_end_marker(m.text, m.is_final))
        self._guard("publish the result", lambda: self._results.publish(self._plan_result_msg(res)))
        if marker is not None:
            self._guard("send the end-of-plan marker",
                        lambda: self._deliver(res.robot_id, marker))
        if op is None:
            return  # a revision (late robot failure) or a restored task: /plan_results carries it
        out = self._result_msg(res)
        for h in op.handles:
            self._complete(h, out, res.status)
        for w in op.waiters:
            w.put(res)

    def _guard(self, what: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            self.get_logger().error(f"could not {what}: {e!r}")

    def _publish_to_robot(self, robot_id: str, msg: PlanSegment) -> None:
        topics.publish_or_log(self._segment_pub(robot_id), msg, self.get_logger(),
                       f"segment {msg.segment_index} of {msg.task_id} to {robot_id}")

    def _deliver(self, robot_id: str, msg: PlanSegment) -> None:
        matched = self._segment_pub(robot_id).get_subscription_count() > 0
        self.delivery.send(robot_id, msg, time.monotonic(), matched=matched)

    def _segment_pub(self, robot_id: str):
        with self._pub_lock:
            self._pub_used[robot_id] = time.monotonic()
            pub = self._seg_pubs.get(robot_id)
            if pub is None:
                # No QoS event callbacks: with hundreds of robots their waitables slow the whole executor.
                pub = self._seg_pubs[robot_id] = self.create_publisher(
                    PlanSegment, topics.segment_topic(robot_id), topics.RELIABLE,
                    event_callbacks=PublisherEventCallbacks(use_default_callbacks=False))
            return pub

    def _skillset_id(self, robot_type: str) -> str:
        sid = self._skillset_ids.get(robot_type)
        if sid is None:
            try:
                sid = self.core.hooks.skillset(robot_type).id
            except Exception:  # noqa: BLE001 - an id is cosmetic; never fail a dispatch on it
                sid = robot_type
            self._skillset_ids[robot_type] = sid
        return sid

    # -- robot reports -----------------------------------------------------------------------
    def _segment_done(self, msg: SegmentDone) -> None:
        core, delivery = self.core, self.delivery
        if core is None:  # cleaned up: a callback already in flight has nothing to do
            return
        start = self._bridge.to_core(msg.start) if started(msg.start) else None
        finish = self._bridge.to_core(msg.finish) if started(msg.finish) else None
        refused = core.report_segment_done(msg.task_id, msg.segment_index, finish, msg.success, msg.error, start,
                                           robot_id=msg.robot_id)
        if refused is not None:
            self.rejected.note("report", msg.robot_id, refused)
            return
        # A report implies receipt (its ack may have been lost), and that the robot is alive.
        delivery.ack(msg.task_id, msg.segment_index, robot_id=msg.robot_id)
        delivery.heard(msg.robot_id, time.monotonic())
        self._note_stamp_lag(msg.finish)
        if self.journal is not None:
            self._jot("segment_reported", msg.task_id, msg.segment_index, msg.success,
                                          time_s(msg.start) or None, time_s(msg.finish) or None, msg.error)

    def _jot(self, what: str, *args) -> None:
        """Journal write: a failure is logged loudly but never stops a segment or result from going out."""
        if self.journal is None or self._journal_closed:
            return
        try:
            getattr(self.journal, what)(*args)
        except Exception as e:  # noqa: BLE001
            self.journal_errors += 1
            self.get_logger().error(f"journal {what}{args[:2]} failed: {e!r}")

    def _segment_ack(self, msg: SegmentAck) -> None:
        """An acknowledgement, or a heartbeat (``running``). It counts only from the task's robot, for a segment
        sent to it: a rogue node must neither stop the re-sends to the real robot nor keep a dead one alive."""
        core, delivery = self.core, self.delivery
        if core is None:  # cleaned up: a callback already in flight has nothing to do
            return
        now = time.monotonic()
        acked = delivery.ack(msg.task_id, msg.segment_index, now, robot_id=msg.robot_id)
        refused = core.robot_alive(msg.task_id, msg.segment_index, msg.robot_id)
        if refused is not None and not acked:  # an end marker or a task already forgotten: delivery's word
            self.rejected.note("heartbeat" if msg.running else "ack", msg.robot_id, refused)
            return
        delivery.heard(msg.robot_id, now)
        self._note_stamp_lag(msg.stamp)
        if acked and self.journal is not None:
            self._jot("segment_acked", msg.task_id, msg.segment_index)

    def _note_stamp_lag(self, stamp) -> None:
        """How far behind this planner reads robot messages, from their stamps. A stamp further from this clock
        than ``max_clock_skew_s`` says nothing of that (a robot's clock is off, or the stamp is forged: one
        stamped 1970 switched silence detection off for the whole fleet), so it is ignored."""
        if not (stamp.sec or stamp.nanosec):
            return
        lag = time.time() - time_s(stamp)
        if abs(lag) <= self._max_clock_skew_s:
            self.core.note_report_lag(lag)
        else:
            self.rejected.note("stamp", "(any)", f"stamp {lag:+.1f} s from this planner's clock, beyond "
                                                  f"max_clock_skew_s={self._max_clock_skew_s:g}: its lag is ignored")

    def _robot_reachable(self, robot_id: str) -> bool:
        """The robot's reader has matched our writer at some point. One that matched and went away (a dead
        executor) is judged by its silence; one never discovered is given delivery's hard bound."""
        if robot_id in self._discovered:
            return True
        if self._segment_pub(robot_id).get_subscription_count() > 0:
            self._discovered.add(robot_id)
            return True
        return False

    def _housekeeping(self) -> None:
        core, delivery = self.core, self.delivery
        if core is None:  # cleaned up: a callback already in flight has nothing to do
            return
        for tid, index, robot_id in delivery.due(time.monotonic(), self._robot_reachable):
            if self._robot_reachable(robot_id):
                why = f"robot {robot_id} never acknowledged segment {index} within {delivery.give_up_s:g} s"
                detail = delivery.given_up_detail(tid, index)
                why += f" ({detail})" if detail else ""
            else:
                why = (f"robot {robot_id} unreachable: no executor subscribed to {topics.segment_topic(robot_id)} "
                       f"within {4 * delivery.give_up_s:g} s")
            self.get_logger().error(f"task {tid}: {why}")
            core.robot_failed(tid, why)
        for tid, robot_id, robot_type, seg in core.unreported():
            self._deliver(robot_id, segment_msg(tid, robot_id, seg, self._bridge, self._skillset_id(robot_type)))
        for tid in core.expire_silent(unacked=delivery.unacked):
            self.get_logger().error(f"task {tid}: robot silent, ended ROBOT_FAILED")
        now = time.monotonic()
        if self._robot_idle_release_s > 0 and now >= self._next_release:
            self._next_release = now + min(30.0, self._robot_idle_release_s / 2)
            self._release_idle_robots(now)
        if self.journal is not None and now >= self._next_prune:
            self._next_prune = now + 30.0
            cfg = core.cfg
            self._jot("prune", cfg.keep_results_s, cfg.keep_results_max, time.time())

    def _release_idle_robots(self, now: float) -> int:
        """Destroy the segment publisher (a DDS writer, ~50 KB) of every robot sent nothing for
        ``robot_idle_release_s`` that has no open task, waiting task or unreported segment, and forget what is
        kept per robot: 10,000 distinct robot ids took the planner from 88 to 579 MB, never freed. The next
        segment to such a robot makes a new publisher (and waits for its reader to match, as the first did)."""
        busy = self.core.robots_in_use()
        idle = [r for r, t in list(self._pub_used.items())
                if now - t > self._robot_idle_release_s and r not in busy and not self.delivery.pending_for(r)]
        released = 0
        for robot_id in idle:
            with self._pub_lock:  # _segment_pub marks a robot used under it: one used since is kept
                if now - self._pub_used.get(robot_id, now) <= self._robot_idle_release_s:
                    continue
                pub = self._seg_pubs.pop(robot_id, None)
                del self._pub_used[robot_id]
                self._discovered.discard(robot_id)
                if pub is not None:
                    self.destroy_publisher(pub)
                    released += 1
        if released:
            self.get_logger().debug(f"released {released} idle robots' segment publishers")
        return released

    # -- engine loop ------------------------------------------------------------------------------
    def _engine_loop(self) -> None:
        backoff = self._restart_backoff
        while not self._stop.is_set():
            try:
                self.core.serve_forever(self._stop)
                return
            except Exception as e:  # noqa: BLE001 - every accepted task must still get an answer
                with self._open_lock:
                    self._engine_error = f"engine failure: {e!r}"
                self.get_logger().error(f"engine loop crashed: {e!r}; failing every open task, rebuilding the engine")
                n = self.core.fail_all(f"planner engine failure: {e!r}")
                self.get_logger().error(f"{n} open tasks ended FAILED")
            while not self._stop.wait(backoff):
                try:
                    engine = self._engine_factory()
                    self.core.fail_all("planner engine failure (task accepted during the restart)")
                    self.core.replace_engine(engine)
                    old, self.engine = self.engine, engine
                    self._prompts.engine = engine
                    if old is not engine:
                        try:
                            old.close()
                        except Exception as e:  # noqa: BLE001 - a broken engine may not close cleanly
                            self.get_logger().warning(f"closing the failed engine: {e!r}")
                except Exception as e:  # noqa: BLE001
                    backoff = min(backoff * 2, 30.0)
                    self.get_logger().error(f"engine restart failed: {e!r}; next try in {backoff:g} s")
                    continue
                with self._open_lock:
                    self._engine_error = None
                self.engine_restarts += 1
                backoff = self._restart_backoff
                self.get_logger().warning(f"engine restarted ({self.engine_restarts}); serving again")
                break

    def _reuse_engine(self) -> Any:
        """Restart for an engine handed in without a factory: drop whatever it still holds."""
        for gid in self.engine.running_ids() | self.engine.suspended_ids():
            self.engine.abort(gid)
        return self.engine

    def _publish_engine_state(self) -> None:
        try:
            st, info = self.engine.stats(), self.engine.info
        except Exception:  # noqa: BLE001
            return
        described = {"dtype": info.dtype, "dtype_reason": info.dtype_reason, "speculative": info.speculative}
        if "dtype" not in EngineState.get_fields_and_field_types():  # interfaces built before these fields
            described = {}  # (msg/EngineState.msg): rebuilt by scripts/setup.sh
        self._engine_pub.publish(EngineState(
            stamp=self.get_clock().now().to_msg(), backend=info.name, model=info.model, **described,
            running=st.running, waiting=st.waiting,
            max_batch=st.max_batch, tokens_per_second=float(st.tokens_per_s), step_time_s=float(st.step_time_s),
            kv_cache_usage=float(st.kv_cache_usage), members=[engine_member_msg(m) for m in pool_members(st)]))

    # -- journal recovery --------------------------------------------------------------------------
    def _recover(self) -> None:
        """Resume what a killed planner left: re-open unfinished tasks, re-send unacknowledged segments."""
        from timelyllm_ros.msg import TimeUtility as TimeUtilityMsg

        now_wall = time.time()
        resumed = ended = 0
        for jt in self.journal.unfinished():
            s = jt.spec
            tuf_msg = TimeUtilityMsg(level=s["tuf"]["level"], alpha=s["tuf"]["alpha"], beta=s["tuf"]["beta"],
                                     ert=s["tuf"]["ert"])
            arrival = self._bridge.to_core_s(jt.arrival_wall)
            sent = self._bridge.to_core_s(s["sent_wall"]) if s.get("sent_wall") else None
            try:
                spec = self._validate(jt.task_id, jt.robot_id, jt.robot_type, s["task"], tuf_msg, arrival=arrival,
                                      sent=sent)
            except GoalError as e:  # e.g. its robot type is no longer served: refused as invalid now
                self.journal.task_finished(jt.task_id, TaskStatus.INVALID.value,
                                           {"status": TaskStatus.INVALID.value, "message": f"after restart: {e}",
                                            "robot_id": jt.robot_id}, now_wall)
                ended += 1
                continue
            segs = []
            for js in jt.segments:
                if js.marker:
                    continue
                calls = self.core.hooks.parse(jt.robot_type, js.text)
                seg = Segment(index=js.index, text=js.text, token_ids=list(js.token_ids), calls=calls,
                              gen_start=self._bridge.to_core_s(js.dispatch_wall),
                              ready=self._bridge.to_core_s(js.dispatch_wall),
                              dispatch=self._bridge.to_core_s(js.dispatch_wall), est_exec_s=js.est_exec_s,
                              max_exec_s=self.core.exec_range(jt.robot_type, calls)[1], final=js.is_final)
                seg.pred_start = seg.dispatch + self.core.cfg.comm_s
                if segs and segs[-1].end is not None:
                    seg.pred_start = max(seg.pred_start, segs[-1].end)
                seg.pred_end = seg.pred_start + seg.est_exec_s
                if js.reported:
                    seg.real_end, seg.success, seg.error = (self._bridge.to_core_s(js.finish_wall)
                                                            if js.finish_wall else seg.pred_end), js.success, js.error
                segs.append(seg)
            marker = any(js.marker for js in jt.segments)
            key = _request_key(jt.robot_id, jt.robot_type, s["task"], tuf_msg)
            with self._open_lock:
                self._open[jt.task_id] = _OpenTask(jt.task_id, jt.robot_id, jt.robot_type, key, [], [],
                                                   sent=len(segs), final_sent=marker or any(x.final for x in segs))
            self._segment_pub(jt.robot_id)
            if not segs and spec.tuf.tuf0(self.core.clock.now() - arrival) < 0:
                with self._open_lock:
                    self._open.pop(jt.task_id, None)
                res_rec = {"status": TaskStatus.OVERDUE.value, "robot_id": jt.robot_id,
                           "message": "planner restarted after the task's utility cutoff; nothing was sent"}
                self.journal.task_finished(jt.task_id, TaskStatus.OVERDUE.value, res_rec, now_wall)
                self._results.publish(plan_result_from_record({"task_id": jt.task_id, **res_rec}))
                ended += 1
                continue
            spec.meta["request_key"] = key
            self.core.restore(spec, segs, final=marker)
            resumed += 1
        resend = {(tid, js.index): (tid, robot_id, js) for tid, robot_id, js in self.journal.unacked()}
        for jt in self.journal.unfinished():  # also what was acknowledged but never reported: the robot
            for js in jt.segments:            # answers a copy of a finished segment with its report again
                if not js.marker and not js.reported:
                    resend.setdefault((jt.task_id, js.index), (jt.task_id, jt.robot_id, js))
        for tid, robot_id, js in resend.values():
            if not js.marker and self.journal.status(tid) not in (ACTIVE, TaskStatus.DONE.value):
                continue  # ended without running its plan: see SegmentDelivery.forget
            if tid in self._open:
                rt = self._open[tid].robot_type
            else:  # finished before the restart: its own robot type, as journaled
                jt = self.journal.task(tid)
                rt = jt.robot_type if jt is not None else ""
            self.delivery.send(robot_id, self._journaled_segment_msg(tid, robot_id, rt, js), time.monotonic())
        if resumed or ended:
            self.get_logger().warning(f"journal: resumed {resumed} unfinished tasks, ended {ended}")

    def _journaled_segment_msg(self, tid: str, robot_id: str, robot_type: str, js: Any) -> PlanSegment:
        """A journaled segment (or end marker) as the PlanSegment that was sent, its skills parsed again with the
        task's own skill set."""
        msg = PlanSegment(task_id=tid, robot_id=robot_id, segment_index=js.index, text=js.text,
                          is_final=bool(js.is_final or js.marker))
        if not js.marker:
            calls = self.core.hooks.parse(robot_type, js.text)
            msg.skills = [skill_call_msg(c, self._skillset_id(robot_type)) for c in calls]
            msg.predicted_execution = duration_msg(js.est_exec_s)
        return msg

    # -- shutdown ------------------------------------------------------------------------------------
    def fail_all(self, reason: str) -> None:
        """Answer every open task (shutdown): nothing is left hanging."""
        self.core.fail_all(reason, TaskStatus.CANCELLED)

    def destroy_node(self) -> None:
        super().destroy_node()
        # rclpy's LifecycleNode keeps its state machine, which holds the node's handle: the node would stay
        # on the graph (its lifecycle services announced, nobody answering) until garbage-collected.
        self._state_machine.destroy_when_not_in_use()

    def shutdown(self) -> None:
        """Stop the engine thread and answer every open task CANCELLED (idempotent; any lifecycle state)."""
        with self._open_lock:
            self._active = False
        self._stop.set()
        if self.core is None:
            return
        self.core.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.fail_all("planner shutting down")
        with self._open_lock:  # last resort: anything the core no longer knows
            leftovers = list(self._open.values())
            self._open.clear()
        for op in leftovers:
            res = TaskResult(op.task_id, op.robot_id, TaskStatus.CANCELLED, "", [], None, None,
                             "planner shutting down", robot_type=op.robot_type)
            for h in op.handles:
                self._complete(h, self._result_msg(res), res.status)
            for w in op.waiters:
                w.put(res)
        if self.journal is not None and not self._journal_closed:
            self._journal_closed = True
            self.journal.close()


def build_planner(parameter_overrides: list[Parameter] | None = None, engine: Any = None, constrained: bool = False,
                  scheduler_kw: dict | None = None, **node_kw) -> tuple[PlannerNode, SchedulerNode]:
    """The scheduler node owns ``policy``; the planner builds its core with it.

    ``node_kw`` goes to both nodes (e.g. ``context=``), ``scheduler_kw`` to the scheduler only.
    """
    overrides = parameter_overrides or []
    sched = SchedulerNode(parameter_overrides=[p for p in overrides if p.name in ("policy", "state_period_s")],
                          **node_kw, **(scheduler_kw or {}))
    try:
        planner = PlannerNode(policy=sched.policy_name, engine=engine, constrained=constrained, scheduler=sched,
                              parameter_overrides=[p for p in overrides if p.name != "policy"], **node_kw)
    except BaseException:
        sched.destroy_node()
        raise
    return planner, sched


def scheduler_ros_args(argv: list[str]) -> list[str]:
    """The process's ROS arguments for the scheduler node, without a rename of the node.

    ``ros2 launch`` starts this process as the lifecycle node ``planner`` with ``-r __node:=planner``, which
    rcl applies to every node of the process: the scheduler would be renamed too (and miss its parameters).
    So the scheduler ignores the global arguments and takes these instead."""
    out: list[str] = []
    ros = False
    it = iter(argv)
    for a in it:
        if a == "--ros-args":
            ros = True
            continue
        if a == "--":
            ros = False
            continue
        if not ros:
            continue
        if a in ("-r", "--remap"):
            rule = next(it, "")
            if rule.split(":=")[0].split(":")[-1] not in ("__node", "__name"):
                out += [a, rule]
            continue
        out.append(a)
    return ["--ros-args", *out] if out else []


def main(args: list[str] | None = None) -> int:
    # Parameters come from `--ros-args --params-file config/fleet_demo.yaml -p policy:=fcfs` as usual.
    # No callback blocks for long except the bounded one-shot /plan calls (max_oneshot_calls).
    import sys

    sched_kw = {"cli_args": scheduler_ros_args(sys.argv if args is None else args), "use_global_arguments": False}
    return run_nodes(lambda: build_planner(scheduler_kw=sched_kw)[::-1], args, num_threads=16,
                     before_destroy=lambda nodes: nodes[-1].shutdown())


if __name__ == "__main__":
    main()


__all__ = ["PlannerNode", "build_planner", "main"]
