"""The planner process: PlanTask action + Plan service over one PlannerCore.

Two nodes share one process so that the decision path stays in-process:

* ``planner`` owns the engine, the action server, the one-shot service, the
  per-robot segment topics and the SegmentDone subscription;
* ``scheduler`` owns the policy (``policy`` can be changed at run time) and
  publishes SchedulerState.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSDurabilityPolicy, QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy

from timelyllm_ros.action import PlanTask
from timelyllm_ros.core.clock import RealClock
from timelyllm_ros.core.policies import POLICIES, make_policy
from timelyllm_ros.core.scheduler import CoreConfig, PlannerCore, Segment, TaskResult, TaskSpec, TaskStatus
from timelyllm_ros.msg import (
    EngineState,
    PlanResult,
    PlanSegment,
    QueuedGeneration,
    SchedulerState,
    SegmentDone,
    TaskRequest,
)
from timelyllm_ros.ros.convert import ClockBridge, duration_msg, segment_msg, tuf_from_msg
from timelyllm_ros.ros.spin import run_nodes
from timelyllm_ros.srv import Plan

RELIABLE = QoSProfile(depth=50, reliability=QoSReliabilityPolicy.RELIABLE, history=QoSHistoryPolicy.KEEP_LAST)
TELEMETRY = QoSProfile(depth=5, reliability=QoSReliabilityPolicy.BEST_EFFORT, history=QoSHistoryPolicy.KEEP_LAST)
LATCHED = QoSProfile(depth=1, reliability=QoSReliabilityPolicy.RELIABLE,
                     durability=QoSDurabilityPolicy.TRANSIENT_LOCAL)

STATUS_FROM_CORE = {
    TaskStatus.DONE: PlanTask.Result.STATUS_SUCCEEDED,
    TaskStatus.REJECTED: PlanTask.Result.STATUS_OVERDUE,
    TaskStatus.CANCELLED: PlanTask.Result.STATUS_CANCELED,
    TaskStatus.FAILED: PlanTask.Result.STATUS_FAILED,
}


def _status_code(res: TaskResult) -> int:
    if res.status is TaskStatus.FAILED and res.reason.startswith("robot failed"):
        return PlanTask.Result.STATUS_ROBOT_FAILED
    return STATUS_FROM_CORE.get(res.status, PlanTask.Result.STATUS_FAILED)


def segment_topic(robot_id: str) -> str:
    """Per-robot segment topic: /<robot_id>/plan_segments."""
    return f"/{robot_id}/plan_segments"


@dataclass
class _Mailbox:
    """What the engine thread hands to the goal/service thread of one task."""

    robot_id: str
    robot_type: str
    events: queue.Queue = field(default_factory=queue.Queue)  # ("segment", Segment) | ("result", TaskResult)


class GoalError(ValueError):
    """A goal that is refused; the message names the field and the problem."""


class PlannerNode(Node):
    def __init__(self, *, policy: str = "pud", engine: Any = None, constrained: bool = False,
                 core_config: CoreConfig | None = None, parameter_overrides: list[Parameter] | None = None,
                 node_name: str = "planner", **node_kw) -> None:
        super().__init__(node_name, parameter_overrides=parameter_overrides or [], **node_kw)
        p = self._declare_params()
        p["policy"] = policy
        self._bridge = ClockBridge()
        if engine is None:
            engine, constrained = engine_from_config(p["engine_config"])
        self.engine = engine
        from timelyllm_ros.core.admission import make_admission

        cfg = core_config or CoreConfig(comm_s=p["comm_s"], overdue=p["overdue"], slack_floor_s=p["slack_floor_s"],
                                        resume_lead_s=p["resume_lead_s"])
        self.core = PlannerCore(engine, make_policy(p["policy"]), RealClock(), admission=make_admission(p["admission"]),
                                config=cfg, on_segment=self._on_segment, on_result=self._on_result)
        self._mail: dict[str, _Mailbox] = {}
        self._mail_lock = threading.Lock()
        self._seg_pubs: dict[str, Any] = {}
        self._pub_lock = threading.Lock()
        self._prompts = _PromptRenderer(engine, constrained)
        self._skillset_ids: dict[str, str] = {}

        goals = ReentrantCallbackGroup()
        self._action = ActionServer(self, PlanTask, "plan_task", execute_callback=self._execute,
                                    goal_callback=self._goal_cb, cancel_callback=lambda _g: CancelResponse.ACCEPT,
                                    callback_group=goals)
        self.create_service(Plan, "plan", self._plan_srv, callback_group=goals)
        self.create_subscription(SegmentDone, "/segment_done", self._segment_done, RELIABLE,
                                 callback_group=MutuallyExclusiveCallbackGroup())
        self._engine_pub = self.create_publisher(EngineState, "engine_state", TELEMETRY)
        self._all_segments = self.create_publisher(PlanSegment, "/plan_segments", RELIABLE)
        self._requests = self.create_publisher(TaskRequest, "/plan_requests", RELIABLE)
        self._results = self.create_publisher(PlanResult, "/plan_results", RELIABLE)
        self.create_timer(p["state_period_s"], self._publish_engine_state)

        self._stop = threading.Event()
        if p["warm_up"]:
            self._warm_up()
        self._thread = threading.Thread(target=self._engine_loop, name="timelyllm-engine", daemon=True)
        self._thread.start()
        self.get_logger().info(
            f"planner ready: policy={p['policy']} admission={p['admission']} engine={type(engine).__name__} "
            f"robot types={self._robot_types}")

    def _warm_up(self) -> None:
        """Prefill each robot type's shared prompt (skill catalogue, few-shot examples) once, before the
        first task: then even the first request of a burst pays only for its own scene and instruction,
        and a fresh engine's slow first forward passes are out of the way."""
        if getattr(self.engine, "needs_plan_text", False):
            return  # the simulated engine has no prompt to warm
        from timelyllm_ros.core.engine import EngineRequest

        t0 = time.monotonic()
        for rt in self._robot_types:
            ids = self._prompts.token_ids(rt, "Scene: [] Task: [A] warm-up")
            self.engine.add(EngineRequest(f"warmup-{rt}", ids, self.core.hooks.stop_checker(rt), max_new_tokens=1))
            while self.engine.has_work():
                self.engine.step()
        # A burst of requests at once: the engine's first multi-request prefill and decode batches are slow
        # to set up, and the first real burst must not pay for that.
        rt = self._robot_types[0]
        for i in range(min(8, int(getattr(self.engine, "max_batch", 8)))):
            ids = self._prompts.token_ids(rt, f"Scene: [] Task: [A] warm-up {i}: " + "look around " * i)
            self.engine.add(EngineRequest(f"warmup-burst-{i}", ids, self.core.hooks.stop_checker(rt),
                                          max_new_tokens=4, suspend_at_boundary=False))
        while self.engine.has_work():
            self.engine.step()
        self.get_logger().info(f"warmed the prompts of {self._robot_types} in {time.monotonic() - t0:.2f} s")

    # -- parameters ---------------------------------------------------------------
    def _declare_params(self) -> dict:
        d = ParameterDescriptor
        p = {
            "engine_config": self.declare_parameter(
                "engine_config", "engine_vllm_cpu.yaml",
                d(description="engine YAML (file name in config/ or a path)")).value,
            "admission": self.declare_parameter(
                "admission", "latency", d(description="'latency' (latency-guided) or a fixed batch cap 1..16")).value,
            "overdue": self.declare_parameter(
                "overdue", "serve", d(description="'serve' overdue tasks last, or 'reject' them")).value,
            "comm_s": self.declare_parameter("comm_s", 0.008, d(description="one network hop, s")).value,
            "slack_floor_s": self.declare_parameter("slack_floor_s", 0.001).value,
            "resume_lead_s": self.declare_parameter("resume_lead_s", 0.05).value,
            "state_period_s": self.declare_parameter("state_period_s", 0.5).value,
            "robot_types": self.declare_parameter("robot_types", ["drone", "arm", "chatbot"]).value,
            "max_task_chars": self.declare_parameter("max_task_chars", 2000).value,
            "warm_up": self.declare_parameter(
                "warm_up", True, d(description="prefill each robot type's shared prompt before serving")).value,
        }
        self._robot_types = list(p["robot_types"])
        self._max_task_chars = int(p["max_task_chars"])
        return p

    # -- goal validation -------------------------------------------------------------
    def _goal_cb(self, goal: PlanTask.Goal) -> GoalResponse:
        # Accept everything here so that a refused goal still gets a result with
        # the reason; validation happens at the start of execution.
        return GoalResponse.ACCEPT

    def _validate(self, task_id: str, robot_id: str, robot_type: str, task: str, tuf_msg) -> TaskSpec:
        if not robot_id.strip():
            raise GoalError("robot_id: must not be empty")
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
        if task_id and self.core.task_status(task_id) is not None:
            raise GoalError(f"task_id: {task_id!r} is already in use")
        prompt_ids = self._prompts.token_ids(robot_type, task)
        limit = getattr(self.engine, "max_model_len", None)
        if limit and len(prompt_ids) + 16 > limit:
            raise GoalError(f"task: the prompt is {len(prompt_ids)} tokens, too long for the model's context "
                            f"of {limit} tokens")
        extra = self._prompts.extras(robot_type)
        if getattr(self.engine, "needs_plan_text", False):  # simulated engine: it writes a known plan
            from timelyllm_ros.engines.sim_realtime import sim_plan_for

            try:
                extra["plan_text"] = sim_plan_for(robot_type, task)
            except ValueError as e:
                raise GoalError(str(e)) from None
        return TaskSpec(robot_id=robot_id, prompt=task, tuf=tuf, robot_type=robot_type,
                        task_id=task_id or f"{robot_id}-{uuid.uuid4().hex[:8]}", prompt_token_ids=prompt_ids,
                        extra=extra)

    # -- action / service --------------------------------------------------------------
    def _submit(self, spec: TaskSpec) -> tuple[str, _Mailbox]:
        box = _Mailbox(spec.robot_id, spec.robot_type)
        with self._mail_lock:
            if spec.task_id in self._mail:
                raise GoalError(f"task_id: {spec.task_id!r} is already in use")
            self._mail[spec.task_id] = box
        try:
            tid = self.core.submit(spec)
        except ValueError as e:
            with self._mail_lock:
                self._mail.pop(spec.task_id, None)
            raise GoalError(str(e)) from None
        return tid, box

    def _accept(self, task_id: str, robot_id: str, robot_type: str, task: str, tuf_msg) -> tuple[str, _Mailbox]:
        """Validate and submit; every request, refused or not, is published on /plan_requests."""
        req = TaskRequest(stamp=self.get_clock().now().to_msg(), task_id=task_id, robot_id=robot_id,
                          robot_type=robot_type, task=task, tuf=tuf_msg, accepted=False)
        try:
            spec = self._validate(task_id, robot_id, robot_type, task, tuf_msg)
            req.task_id = spec.task_id
            tid, box = self._submit(spec)
        except GoalError as e:
            req.error = str(e)
            self._requests.publish(req)
            raise
        req.accepted = True
        self._requests.publish(req)
        return tid, box

    def _execute(self, goal_handle) -> PlanTask.Result:
        g = goal_handle.request
        try:
            tid, box = self._accept(g.task_id, g.robot_id, g.robot_type, g.task, g.tuf)
        except GoalError as e:
            self.get_logger().warning(f"goal from {g.robot_id!r} rejected: {e}")
            goal_handle.abort()
            return PlanTask.Result(status=PlanTask.Result.STATUS_REJECTED, message=str(e), task_id=g.task_id)
        except Exception as e:  # noqa: BLE001 - the robot must hear why, whatever broke
            self.get_logger().error(f"goal from {g.robot_id!r} failed before planning: {e!r}")
            goal_handle.abort()
            return PlanTask.Result(status=PlanTask.Result.STATUS_FAILED, message=f"planner error: {e}",
                                   task_id=g.task_id)
        while True:
            try:
                kind, item = box.events.get(timeout=0.05)
            except queue.Empty:
                if goal_handle.is_cancel_requested:
                    self.core.cancel(tid, "cancelled by the robot")
                continue
            if kind == "segment":
                seg: Segment = item
                goal_handle.publish_feedback(PlanTask.Feedback(
                    segment=segment_msg(tid, box.robot_id, seg, self._bridge, self._skillset_id(box.robot_type)),
                    utility_estimate=_utility_estimate(self.core, tid)))
                continue
            res: TaskResult = item
            out = self._result_msg(res, box)
            if res.status is TaskStatus.DONE:
                goal_handle.succeed()
            elif res.status is TaskStatus.CANCELLED and goal_handle.is_cancel_requested:
                goal_handle.canceled()
            else:
                goal_handle.abort()
            return out

    def _plan_srv(self, req: Plan.Request, resp: Plan.Response) -> Plan.Response:
        try:
            tid, box = self._accept("", req.robot_id, req.robot_type, req.task, req.tuf)
        except GoalError as e:
            resp.status, resp.error = Plan.Response.STATUS_REJECTED, str(e)
            return resp
        except Exception as e:  # noqa: BLE001
            resp.status, resp.error = Plan.Response.STATUS_FAILED, f"planner error: {e}"
            return resp
        while True:
            kind, item = box.events.get()
            if kind == "result":
                out = self._result_msg(item, box)
                resp.status = Plan.Response.STATUS_OK if item.status is TaskStatus.DONE else Plan.Response.STATUS_FAILED
                resp.error = "" if item.status is TaskStatus.DONE else out.message
                resp.plan_text, resp.segments = out.plan_text, out.segments
                return resp

    def _result_msg(self, res: TaskResult, box: _Mailbox) -> PlanTask.Result:
        status = _status_code(res)
        sid = self._skillset_id(box.robot_type)
        waiting = _robot_waiting(res)
        return PlanTask.Result(
            status=status, message=res.reason or res.status.value, task_id=res.task_id, plan_text=res.plan,
            segments=[segment_msg(res.task_id, res.robot_id, s, self._bridge, sid) for s in res.segments],
            response_time=duration_msg(res.response_time if res.response_time is not None else 0.0),
            robot_waiting_time=duration_msg(waiting),
            utility=res.utility if res.utility is not None else float("nan"))

    # -- core callbacks (engine thread) ----------------------------------------------------
    def _on_segment(self, res: TaskResult, seg: Segment) -> None:
        box = self._mail.get(res.task_id)
        robot_type = box.robot_type if box else "drone"
        msg = segment_msg(res.task_id, res.robot_id, seg, self._bridge, self._skillset_id(robot_type))
        self._segment_pub(res.robot_id).publish(msg)
        self._all_segments.publish(msg)  # fleet-wide copy for recorders and the exec-time node
        if box is not None:
            box.events.put(("segment", seg))

    def _on_result(self, res: TaskResult) -> None:
        with self._mail_lock:
            box = self._mail.pop(res.task_id, None)
        status = _status_code(res)
        self._results.publish(PlanResult(
            stamp=self.get_clock().now().to_msg(), task_id=res.task_id, robot_id=res.robot_id, status=status,
            message=res.reason or res.status.value, plan_text=res.plan, num_segments=len(res.segments),
            response_time=duration_msg(res.response_time or 0.0),
            utility=res.utility if res.utility is not None else float("nan")))
        if box is not None:
            box.events.put(("result", res))

    def _segment_pub(self, robot_id: str):
        with self._pub_lock:
            pub = self._seg_pubs.get(robot_id)
            if pub is None:
                pub = self._seg_pubs[robot_id] = self.create_publisher(PlanSegment, segment_topic(robot_id), RELIABLE)
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
        start = self._bridge.to_core(msg.start) if (msg.start.sec or msg.start.nanosec) else None
        finish = self._bridge.to_core(msg.finish) if (msg.finish.sec or msg.finish.nanosec) else None
        self.core.report_segment_done(msg.task_id, msg.segment_index, finish, msg.success, msg.error, start)

    # -- engine loop ------------------------------------------------------------------------------
    def _engine_loop(self) -> None:
        try:
            self.core.serve_forever(self._stop)
        except Exception as e:  # noqa: BLE001 - every accepted task must still get an answer
            self.get_logger().error(f"engine loop crashed: {e!r}; failing all tasks")
            self.fail_all(f"planner engine failure: {e}")

    def _publish_engine_state(self) -> None:
        try:
            st = self.engine.stats()
        except Exception:  # noqa: BLE001
            return
        self._engine_pub.publish(EngineState(
            stamp=self.get_clock().now().to_msg(),
            backend=getattr(self.engine, "backend_name", type(self.engine).__name__),
            model=str(getattr(self.engine, "model_name", "")), running=st.running, waiting=st.waiting,
            max_batch=st.max_batch, tokens_per_second=float(st.tokens_per_s), step_time_s=float(st.step_time_s),
            kv_cache_usage=float(st.kv_cache_usage)))

    def fail_all(self, reason: str) -> None:
        """Answer every open task (shutdown or engine failure): nothing is left hanging."""
        with self._mail_lock:
            open_ids = list(self._mail)
        for tid in open_ids:
            self.core.cancel(tid, reason)

    def shutdown(self) -> None:
        self.fail_all("planner shutting down")
        # The engine thread may be inside a step: give it time to deliver the results.
        deadline = time.monotonic() + 5.0
        while self._mail and time.monotonic() < deadline:
            self.core.wake.set()
            time.sleep(0.02)
        self._stop.set()
        self.core.wake.set()
        self._thread.join(timeout=10)
        with self._mail_lock:  # last resort: the engine thread is gone
            leftovers = list(self._mail.items())
            self._mail.clear()
        for tid, box in leftovers:
            box.events.put(("result", TaskResult(tid, box.robot_id, TaskStatus.CANCELLED, "", [], None, None,
                                                 "planner shutting down")))


class SchedulerNode(Node):
    """Owns the policy of a PlannerCore and publishes SchedulerState."""

    def __init__(self, *, parameter_overrides: list[Parameter] | None = None, node_name: str = "scheduler",
                 **node_kw) -> None:
        super().__init__(node_name, parameter_overrides=parameter_overrides or [], **node_kw)
        self.core: PlannerCore | None = None
        self.policy_name = self.declare_parameter(
            "policy", "pud", ParameterDescriptor(description=f"one of {sorted(POLICIES)}; settable at run time")).value
        if self.policy_name not in POLICIES:
            raise ValueError(f"parameter policy: unknown {self.policy_name!r}; known: {sorted(POLICIES)}")
        self._period = self.declare_parameter("state_period_s", 0.5).value
        self.add_on_set_parameters_callback(self._on_params)
        self._pub = self.create_publisher(SchedulerState, "scheduler_state", TELEMETRY)

    def attach(self, core: PlannerCore) -> None:
        self.core = core
        self.create_timer(self._period, self.publish_state)

    def _on_params(self, params: list[Parameter]) -> SetParametersResult:
        for prm in params:
            if prm.name == "policy":
                try:
                    policy = make_policy(prm.value)
                except ValueError as e:
                    return SetParametersResult(successful=False, reason=f"policy: {e}")
                if self.core is not None:
                    self.core.set_policy(policy)
                self.get_logger().info(f"policy -> {prm.value}")
        return SetParametersResult(successful=True)

    def publish_state(self) -> None:
        now = self.core.clock.now()
        ranked = self.core.queue_view(now)
        snap = self.core.snapshot()
        dts = self.core.decision_times
        self._pub.publish(SchedulerState(
            stamp=self.get_clock().now().to_msg(), policy=self.core.policy.name,
            queue=[QueuedGeneration(task_id=q["task_id"], robot_id=q["robot_id"], segment_index=q["k"],
                                    suspended=q["k"] > 0, priority=_finite(q["priority"]),
                                    slack_s=_finite(q["slack_s"]), waiting_s=_finite(q["waiting_s"]))
                   for q in ranked],
            running_task_ids=self.core.running_ids(), tasks_active=snap["tasks"], tasks_done=snap["done"],
            last_decision_time_s=dts[-1] if dts else 0.0))


def _finite(x: float) -> float:
    return float(x) if math.isfinite(x) else 0.0


def _robot_waiting(res: TaskResult) -> float:
    """Sum of W(s_k): gaps in which the robot had nothing to execute (predicted where not reported)."""
    total, prev_end = 0.0, None
    for s in res.segments:
        if s.dispatch is None:
            break
        if prev_end is None:
            total += max(0.0, res.response_time or 0.0)
        else:
            total += max(0.0, (s.pred_start or s.dispatch) - prev_end)
        prev_end = s.end
    return total


def _utility_estimate(core: PlannerCore, task_id: str) -> float:
    r = core.result(task_id)
    return float(r.utility) if r is not None and r.utility is not None else float("nan")


class _PromptRenderer:
    """Task text -> prompt token ids (and the constrained-decoding regex) per robot type."""

    def __init__(self, engine: Any, constrained: bool = False) -> None:
        self.engine = engine
        self.constrained = constrained
        self._builders: dict[str, Any] = {}
        self._lock = threading.Lock()

    def builder(self, robot_type: str):
        with self._lock:
            b = self._builders.get(robot_type)
            if b is None:
                from timelyllm_ros.engines.prompts import PromptBuilder

                b = self._builders[robot_type] = PromptBuilder(self.engine.tokenizer, robot_type)
            return b

    def token_ids(self, robot_type: str, task: str) -> list[int]:
        if getattr(self.engine, "needs_plan_text", False):  # simulated engine: only the length matters
            return self.engine.tokenize(task)
        return self.builder(robot_type).token_ids(task)

    def extras(self, robot_type: str) -> dict:
        if self.constrained and not getattr(self.engine, "needs_plan_text", False):
            return {"regex": self.builder(robot_type).regex}  # re-evaluated at every resume
        return {}


def engine_from_config(name: str) -> tuple[Any, bool]:
    """Engine from a YAML (name in config/ or a path); the simulated one is paced in wall-clock time here."""
    from timelyllm_ros.core.paths import config_dir
    from timelyllm_ros.engines.factory import load_engine_config, make_engine

    path = name if Path(name).is_file() else config_dir() / name
    cfg = load_engine_config(path)
    if cfg.get("backend") == "sim":
        from timelyllm_ros.core.sim_engine import SimEngineConfig
        from timelyllm_ros.engines.sim_realtime import RealtimeSimEngine

        return RealtimeSimEngine(SimEngineConfig(**(cfg.get("sim_engine") or {})),
                                 time_scale=float(cfg.get("time_scale", 1.0))), False
    return make_engine(cfg), bool(cfg.get("constrained", False))


def build_planner(parameter_overrides: list[Parameter] | None = None, engine: Any = None, constrained: bool = False,
                  **node_kw) -> tuple[PlannerNode, SchedulerNode]:
    """The scheduler node owns ``policy``; the planner builds its core with it.

    ``node_kw`` goes to both nodes (e.g. ``context=``).
    """
    overrides = parameter_overrides or []
    sched = SchedulerNode(parameter_overrides=[p for p in overrides if p.name in ("policy", "state_period_s")],
                          **node_kw)
    planner = PlannerNode(policy=sched.policy_name, engine=engine, constrained=constrained,
                          parameter_overrides=[p for p in overrides if p.name != "policy"], **node_kw)
    sched.attach(planner.core)
    return planner, sched


def main(args: list[str] | None = None) -> int:
    # Parameters come from `--ros-args --params-file config/fleet_demo.yaml -p policy:=fcfs` as usual.
    # Goal threads block on their mailbox: many executor threads.
    return run_nodes(lambda: build_planner()[::-1], args, num_threads=32,
                     before_destroy=lambda nodes: nodes[-1].shutdown())


if __name__ == "__main__":
    main()


__all__ = ["PlannerNode", "SchedulerNode", "build_planner", "main", "segment_topic"]
