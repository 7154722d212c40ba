"""The planner process: PlanTask action + Plan service over one PlannerCore.

Two nodes share one process so that the decision path stays in-process:

* ``planner`` (a lifecycle node) owns the engine, the action server, the
  one-shot service, the per-robot segment topics and the SegmentDone
  subscription;
* ``scheduler`` (``scheduler_node.py``) owns the policy (``policy`` can be
  changed at run time) and publishes SchedulerState.

This module is the ROS glue only: the planner's logic (validation, retries, the journal and recovery, the
engine thread, housekeeping) is ``planner/service.py``'s PlannerService, which answers through this node's
PlannerSender methods; messages are built in ``convert.py``.

The engine loop runs in its own thread, never in an rclpy callback. Action/service callbacks only validate,
submit to the core and return; only a one-shot /plan call waits, on a mailbox the engine thread fills (at most
``max_oneshot_calls`` at once).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from rclpy.action import CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter

from timelyllm_ros.action import PlanTask
from timelyllm_ros.domain.types import Segment, TaskResult, TaskStatus
from timelyllm_ros.msg import EngineState, PlanResult, PlanSegment, TaskRequest
from timelyllm_ros.planner.config import CoreConfig
from timelyllm_ros.planner.core import PlannerCore
from timelyllm_ros.planner.policies import DEFAULT_POLICY
from timelyllm_ros.planner.service import PlannerService
from timelyllm_ros.planner.service_io import EndMarker, GoalError, PlannerHealth
from timelyllm_ros.planner.settings import PARAMETERS
from timelyllm_ros.ros import convert, params, topics
from timelyllm_ros.ros.actions import BatchedActionServer, complete_goal
from timelyllm_ros.ros.diagnostics import attach_planner_diagnostics
from timelyllm_ros.ros.fleet_auth import FleetAuth
from timelyllm_ros.ros.goal_intake import GoalIntake
from timelyllm_ros.ros.robot_outlet import RobotReports, RosOutlet
from timelyllm_ros.ros.scheduler_node import SchedulerNode
from timelyllm_ros.ros.spin import destroy_entities, ros_args_without_node_rename, run_nodes
from timelyllm_ros.ros.topics import in_fleet
from timelyllm_ros.srv import GetPlanResult, Plan
from timelyllm_ros.transport.delivery import Outbound, RejectedMessages


class PlannerNode(LifecycleNode):
    """Thin adapter: turns goals into the service's requests, and what the service produces into messages.

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
            # The planner's parameters, each read-only: read once (construction or configure), so a set at run time
            # is refused with a reason instead of silently doing nothing.
            self._p = p = {st.name: params.declare_setting(self, st) for st in PARAMETERS}
            p["policy"] = policy
            self._scheduler = scheduler
            self._bridge = convert.ClockBridge()
            self.rejected = RejectedMessages(self.get_logger().warning)  # refused robot messages (/diagnostics)
            self._auth = FleetAuth.from_file(p["fleet_key_file"])  # signs segments, checks acks and reports
            # each robot's way out: its link, readiness and delivery (pure Python) over this node's writers
            self.outbound = Outbound(RosOutlet(self, self._auth))
            self.service = PlannerService(p, self, self.get_logger(), self.rejected, self.outbound.links,
                                          self._bridge, engine=engine, constrained=constrained,
                                          engine_factory=engine_factory, core_config=core_config)  # checks parameters
            self._reports = RobotReports(self.service, self._auth, self.rejected)
            self._oneshot = threading.BoundedSemaphore(p["max_oneshot_calls"])
            self._servers: list[Any] = []  # action server and services: open from the first activate to cleanup
            self._configured: list[Any] = []  # subscriptions and timers of the configured state
            self.lifecycle_error: str | None = None  # why the last transition failed
            # The report publishers live as long as the node: a drained task's result still goes out.
            self._engine_pub = self.create_publisher(EngineState, in_fleet(topics.ENGINE_STATE), topics.TELEMETRY)
            self._all_segments = self.create_publisher(PlanSegment, in_fleet(topics.ALL_SEGMENTS), topics.REPORTS)
            self._requests = self.create_publisher(TaskRequest, in_fleet(topics.PLAN_REQUESTS), topics.REPORTS)
            self._results = self.create_publisher(PlanResult, in_fleet(topics.PLAN_RESULTS), topics.RESULTS_QOS)
            self.intake = GoalIntake(self.service, self.outbound.links, self._bridge, self._requests.publish,
                                     self.get_logger(), self.finish_goals)
            self.diagnostics = attach_planner_diagnostics(self)  # /diagnostics in every lifecycle state
            if p["control_plane"] == "locked":
                self._lock_control_plane()
            if p["autostart"]:
                for step, trigger in (("configure", self.trigger_configure), ("activate", self.trigger_activate)):
                    if trigger() != TransitionCallbackReturn.SUCCESS:
                        raise RuntimeError(f"planner could not {step}: {self.lifecycle_error or 'see the log'}")
        except BaseException:
            self.destroy_node()
            raise

    def _lock_control_plane(self) -> None:
        """control_plane 'locked': transitions asked for over /planner/change_state, and policy changes from outside
        this process, are refused; the process's own (autostart, shutdown, SchedulerNode.set_policy) go on."""
        why = ("control_plane is locked: only the planner's own process changes its policy and lifecycle "
               "(README 'Threat model')")

        def refuse_transition(req: Any, resp: Any) -> Any:
            self.rejected.note("lifecycle_transition", "(a node on the domain)",
                               f"transition {req.transition.label or req.transition.id!r} asked over change_state: "
                               "control_plane is locked")
            resp.success = False
            return resp

        self._service_change_state.callback = refuse_transition
        if self._scheduler is not None:
            self._scheduler.lock(why)

    # The service's state, under the names the node has always had (tools and tests read them).
    @property
    def core(self) -> PlannerCore | None:
        return self.service.core

    @property
    def engine(self) -> Any:
        return self.service.supervisor.engine

    @property
    def journal(self) -> Any:
        return self.service.journal

    @property
    def engine_restarts(self) -> int:
        return self.service.supervisor.restarts

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
        return self.service.health(lifecycle)

    # -- lifecycle transitions ----------------------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.lifecycle_error = None
        p = self._p
        try:
            delivery = self.outbound.open(period_s=p["resend_period_s"], max_period_s=p["resend_max_period_s"],
                                          give_up_s=p["delivery_timeout_s"])
            policy = self._scheduler.policy_name if self._scheduler is not None else p["policy"]
            self.service.configure(policy, delivery)
            self._configured = [
                *self._reports.subscribe(self),
                self.create_timer(p["state_period_s"], self._publish_engine_state),
                self.create_timer(p["resend_period_s"] / 2, self.service.housekeeping,
                                  callback_group=MutuallyExclusiveCallbackGroup())]
            if p["warm_up"]:
                self.service.warm_up()
            self.service.start()
            if self._scheduler is not None:
                self._scheduler.attach(self.core)
        except Exception as e:  # noqa: BLE001 - a failed engine start goes to error processing with its reason
            self.lifecycle_error = f"configure failed: {e!r}"
            self.get_logger().error(self.lifecycle_error)
            return TransitionCallbackReturn.ERROR
        self.get_logger().info(
            f"planner configured: policy={policy} admission={p['admission']} engine={type(self.engine).__name__} "
            f"robot types={self.service.robot_types} journal={p['state_dir'] or 'off'}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        if not self._servers:  # opened once, kept until cleanup
            goals = ReentrantCallbackGroup()
            # A burst of goals must not overflow the goal service's request queue (rclpy's default depth is 10),
            # nor a flood the goal and result queues: what overflows is lost unanswered (issue 39: 10,000 goals in
            # 7.4 s).
            self._action = BatchedActionServer(
                self, PlanTask, in_fleet(topics.PLAN_TASK_ACTION), execute_callback=_execute_noop,
                goal_callback=_accept_screened, handle_accepted_callback=self.intake.accepted,
                cancel_callback=self._cancel_cb, callback_group=goals, screen=self.intake.screen,
                order=self.intake.order, goal_service_qos_profile=topics.INTAKE,
                result_service_qos_profile=topics.INTAKE, cancel_service_qos_profile=topics.DEEP,
                feedback_pub_qos_profile=topics.DEEP, result_timeout=int(self._p["action_result_timeout_s"]))
            self._servers = [
                self._action,
                self.create_service(Plan, in_fleet(topics.PLAN_SERVICE), self._plan_srv, callback_group=goals),
                self.create_service(GetPlanResult, in_fleet(topics.GET_PLAN_RESULT_SERVICE), self._get_result_srv,
                                    callback_group=goals)]
        self.service.recover()
        self.service.set_active(True)
        self.get_logger().info("planner ready: active, accepting goals")  # tests and tools wait for this line
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.service.set_active(False)
        self.service.drain(self._p["drain_timeout_s"], "planner deactivated before the task finished")
        return super().on_deactivate(state)

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
        self.service.set_active(False)
        if self.service.core is not None:
            self.shutdown()
        destroy_entities(self, self._servers + self._configured)
        self._servers, self._configured = [], []
        if self._scheduler is not None:
            self._scheduler.detach()
        self.service.release()
        self.outbound.close()

    # -- goals and services -----------------------------------------------------------------------
    def _complete(self, goal_handle, out: PlanTask.Result, status: TaskStatus) -> None:
        complete_goal(goal_handle, out, succeeded=status is TaskStatus.DONE, cancelled=status is TaskStatus.CANCELLED,
                      log=self.get_logger())

    def _cancel_cb(self, goal_handle) -> CancelResponse:
        return CancelResponse.ACCEPT if self.service.cancel_goal(goal_handle) else CancelResponse.REJECT

    def _plan_srv(self, req: Plan.Request, resp: Plan.Response) -> Plan.Response:
        if not self._oneshot.acquire(blocking=False):
            return convert.plan_refusal(resp, TaskStatus.BUSY,
                                        "planner busy: too many one-shot /plan calls in progress "
                                        "(max_oneshot_calls); use the PlanTask action")
        try:
            box: queue.Queue = queue.Queue(maxsize=1)
            try:
                acc = self.intake.accept("", req.robot_id, req.robot_type, req.task, req.tuf, waiter=box)
            except GoalError as e:
                return convert.plan_refusal(resp, e.status, str(e))
            except Exception as e:  # noqa: BLE001
                return convert.plan_refusal(resp, TaskStatus.FAILED, f"planner error: {e}")
            res: TaskResult = acc.result or box.get()
            return convert.fill_plan_response(resp, res, self._bridge, self.service.skillset_id(res.robot_type))
        finally:
            self._oneshot.release()

    def _get_result_srv(self, req: GetPlanResult.Request, resp: GetPlanResult.Response) -> GetPlanResult.Response:
        return convert.fill_plan_result(resp, req.task_id, self.service.lookup(req.task_id), self._bridge,
                                        self.get_clock().now().to_msg())

    # -- PlannerSender: what the service asks of the node (engine thread, timers, callbacks) -----------
    def send_segment(self, task_id: str, robot_id: str, seg: Segment, skillset_id: str, goals: list[Any]) -> None:
        msg = convert.segment_msg(task_id, robot_id, seg, self._bridge, skillset_id)
        self.outbound.send(robot_id, msg)
        self._all_segments.publish(self._auth.sign(msg))  # fleet-wide copy for recorders and the exec-time node
        fb = convert.feedback_msg(msg)
        for h in goals:
            h.publish_feedback(fb)

    def resend_segment(self, task_id: str, robot_id: str, seg: Segment, skillset_id: str) -> None:
        self.outbound.send(robot_id, convert.segment_msg(task_id, robot_id, seg, self._bridge, skillset_id))

    def send_end_marker(self, task_id: str, robot_id: str, index: int, generated: float) -> None:
        self.outbound.send(robot_id, convert.end_marker_msg(task_id, robot_id, index, self._bridge.to_msg(generated)))

    def resend_journaled(self, task_id: str, robot_id: str, seg: Segment | EndMarker, skillset_id: str) -> None:
        if isinstance(seg, EndMarker):
            msg = convert.end_marker_msg(task_id, robot_id, seg.index, self._bridge.to_msg(seg.generated))
        else:
            msg = convert.segment_msg(task_id, robot_id, seg, self._bridge, skillset_id)
        self.outbound.send(robot_id, msg, check_ready=False)  # the fast re-send schedule, as for a new robot

    def finish_goals(self, goals: list[Any], res: TaskResult) -> None:
        out = convert.result_msg(res, self._bridge, self.service.skillset_id(res.robot_type))
        for h in goals:
            self._complete(h, out, res.status)

    def publish_result(self, res: TaskResult) -> None:
        self._results.publish(convert.plan_result_msg(res, self.get_clock().now().to_msg()))

    def publish_journaled_result(self, rec: dict[str, Any]) -> None:
        self._results.publish(convert.plan_result_from_record(rec))

    # -- telemetry ---------------------------------------------------------------------------------
    def _publish_engine_state(self) -> None:
        snapshot = self.service.engine_snapshot()
        if snapshot is not None:
            stats, info, estimate, lone = snapshot
            self._engine_pub.publish(convert.engine_state_msg(stats, info, self.get_clock().now().to_msg(),
                                                              estimate, lone))

    # -- shutdown ------------------------------------------------------------------------------------
    def destroy_node(self) -> None:
        super().destroy_node()
        # rclpy's LifecycleNode keeps its state machine, which holds the node's handle: the node would stay
        # on the graph (its lifecycle services announced, nobody answering) until garbage-collected.
        self._state_machine.destroy_when_not_in_use()

    def shutdown(self) -> None:
        """Stop the engine thread and answer every open task CANCELLED (idempotent; any lifecycle state)."""
        self.service.shutdown()


def _accept_screened(goal: PlanTask.Goal) -> GoalResponse:
    # It passed the intake's screen (which stamped its arrival); a later refusal still gets a result with the reason.
    return GoalResponse.ACCEPT


def _execute_noop(goal_handle) -> PlanTask.Result:  # every goal is completed through PlannerNode._complete
    goal_handle.abort()
    return convert.refused_result("", TaskStatus.FAILED, "internal: goal executed twice")


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


def main(args: list[str] | None = None) -> int:
    # Parameters come from `--ros-args --params-file config/fleet_demo.yaml -p policy:=fcfs` as usual.
    # No callback blocks for long except the bounded one-shot /plan calls (max_oneshot_calls).
    import sys

    if args is None:  # the node's own process (ros2 run / launch): its engine thread wants Intel OpenMP
        from timelyllm_ros.engines.openmp import reexec_with_intel_openmp

        reexec_with_intel_openmp()
    argv = sys.argv if args is None else args
    sched_kw = {"cli_args": ros_args_without_node_rename(argv), "use_global_arguments": False}
    return run_nodes(lambda: build_planner(scheduler_kw=sched_kw)[::-1], args, num_threads=16,
                     before_destroy=lambda nodes: nodes[-1].shutdown())


if __name__ == "__main__":
    main()


__all__ = ["PlannerNode", "build_planner", "main"]
