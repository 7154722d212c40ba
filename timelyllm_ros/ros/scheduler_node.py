"""The scheduler node: owns the planner core's policy (settable at run time) and publishes SchedulerState."""

from __future__ import annotations

import math

from rcl_interfaces.msg import FloatingPointRange, ParameterDescriptor, SetParametersResult
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.timer import Timer

from timelyllm_ros.msg import QueuedGeneration, SchedulerState
from timelyllm_ros.ros import topics
from timelyllm_ros.sched.policies import DEFAULT_POLICY, POLICIES, make_policy
from timelyllm_ros.sched.scheduler import PlannerCore


class SchedulerNode(Node):
    """Owns the policy of a PlannerCore and publishes SchedulerState."""

    def __init__(self, *, parameter_overrides: list[Parameter] | None = None, node_name: str = "scheduler",
                 **node_kw) -> None:
        super().__init__(node_name, parameter_overrides=parameter_overrides or [], **node_kw)
        self.core: PlannerCore | None = None
        self.policy_name = self.declare_parameter(
            "policy", DEFAULT_POLICY,
            ParameterDescriptor(description=f"one of {sorted(POLICIES)}; settable at run time")).value
        if self.policy_name not in POLICIES:
            self.destroy_node()  # not left on the graph (PlannerNode.__init__)
            raise ValueError(f"parameter policy: unknown {self.policy_name!r}; known: {sorted(POLICIES)}")
        self._period = self.declare_parameter("state_period_s", 0.5, ParameterDescriptor(
            description="SchedulerState period, s", read_only=True,
            floating_point_range=[FloatingPointRange(from_value=0.01, to_value=3600.0, step=0.0)])).value
        self.add_on_set_parameters_callback(self._on_params)
        self._pub = self.create_publisher(SchedulerState, topics.SCHEDULER_STATE, topics.TELEMETRY)
        self._timer: Timer | None = None

    def attach(self, core: PlannerCore) -> None:
        """The planner's core (on each configure); SchedulerState is published while one is attached."""
        self.detach()
        self.core = core
        self._timer = self.create_timer(self._period, self.publish_state)

    def detach(self) -> None:
        if self._timer is not None:
            self.destroy_timer(self._timer)
        self._timer, self.core = None, None

    def _on_params(self, params: list[Parameter]) -> SetParametersResult:
        for prm in params:
            if prm.name == "policy":
                try:
                    policy = make_policy(prm.value)
                except ValueError as e:
                    return SetParametersResult(successful=False, reason=f"policy: {e}")
                if self.core is not None:
                    self.core.set_policy(policy)
                self.policy_name = prm.value
                self.get_logger().info(f"policy -> {prm.value}")
        return SetParametersResult(successful=True)

    def publish_state(self) -> None:
        core = self.core
        if core is None:  # detached by the planner's cleanup
            return
        now = core.clock.now()
        ranked = core.queue_view(now)
        snap = core.snapshot()
        dts = core.decision_times
        self._pub.publish(SchedulerState(
            stamp=self.get_clock().now().to_msg(), policy=core.policy.name,
            queue=[QueuedGeneration(task_id=q["task_id"], robot_id=q["robot_id"], segment_index=q["k"],
                                    suspended=q["k"] > 0, priority=_finite(q["priority"]),
                                    slack_s=_finite(q["slack_s"]), waiting_s=_finite(q["waiting_s"]))
                   for q in ranked],
            running_task_ids=core.running_ids(), tasks_active=snap["tasks"], tasks_done=snap["done"],
            last_decision_time_s=dts[-1] if dts else 0.0))


def _finite(x: float) -> float:
    return float(x) if math.isfinite(x) else 0.0
