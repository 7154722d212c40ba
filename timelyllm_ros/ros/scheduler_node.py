"""The scheduler node: owns the planner core's policy (settable at run time, unless the planner's control plane is
locked) and publishes SchedulerState."""

from __future__ import annotations

import threading

from rcl_interfaces.msg import SetParametersResult
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.timer import Timer

from timelyllm_ros.msg import SchedulerState
from timelyllm_ros.planner import telemetry
from timelyllm_ros.planner.core import PlannerCore
from timelyllm_ros.planner.policies import DEFAULT_POLICY, POLICIES, make_policy
from timelyllm_ros.planner.settings import BY_NAME
from timelyllm_ros.ros import convert, topics
from timelyllm_ros.ros.params import declare, declare_setting, on_change, refuse


class SchedulerNode(Node):
    """Owns the policy of a PlannerCore and publishes SchedulerState."""

    def __init__(self, *, parameter_overrides: list[Parameter] | None = None, node_name: str = "scheduler",
                 **node_kw) -> None:
        super().__init__(node_name, parameter_overrides=parameter_overrides or [], **node_kw)
        self.core: PlannerCore | None = None
        try:
            self.policy_name = declare(self, "policy", DEFAULT_POLICY, "the scheduling policy; settable at run time",
                                       check=_known_policy, constraints=f"one of {sorted(POLICIES)}")
            self._period = declare_setting(self, BY_NAME["state_period_s"])  # the planner's too: one setting
        except ValueError:
            self.destroy_node()  # not left on the graph (PlannerNode.__init__)
            raise
        on_change(self, {"policy": self._set_policy})
        self._locked: str | None = None  # why a change from outside this process is refused (control_plane)
        self._own = threading.local()  # set while this process changes the policy itself (set_policy)
        self.refused_changes = 0
        self.add_on_set_parameters_callback(self._guard)
        self._pub = self.create_publisher(SchedulerState, topics.in_fleet(topics.SCHEDULER_STATE), topics.TELEMETRY)
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

    def lock(self, why: str) -> None:
        """Refuse every later change of ``policy`` but this process's own (:meth:`set_policy`), with ``why``."""
        self._locked = why

    def set_policy(self, name: str) -> None:
        """Change the policy from this process (allowed whether or not the control plane is locked); ValueError
        with the reason if the value is refused."""
        self._own.active = True
        try:
            result = self.set_parameters([Parameter("policy", value=name)])[0]
        finally:
            self._own.active = False
        if not result.successful:
            raise ValueError(result.reason)

    def _guard(self, params: list[Parameter]) -> SetParametersResult:
        if self._locked is not None and not getattr(self._own, "active", False) \
                and any(p.name == "policy" for p in params):
            self.refused_changes += 1
            if self.refused_changes == 1:  # a flood of them must not flood the log
                self.get_logger().warning(f"refused a change of policy from outside this process: {self._locked} "
                                          "(further ones are only counted)")
            return refuse("policy", self._locked)
        return SetParametersResult(successful=True)

    def _set_policy(self, name: str) -> None:
        if self.core is not None:
            self.core.set_policy(make_policy(name))
        self.policy_name = name
        self.get_logger().info(f"policy -> {name}")

    def publish_state(self) -> None:
        core = self.core
        if core is None:  # detached by the planner's cleanup
            return
        now = core.clock.now()
        ranked = telemetry.queue_view(core, now)
        snap = core.snapshot()
        dts = core.decision_times
        self._pub.publish(convert.scheduler_state_msg(self.get_clock().now().to_msg(), core.policy.name, ranked,
                                                      core.running_ids(), snap, dts))


def _known_policy(name: str) -> str | None:
    shown = name if len(name) <= 60 else name[:60] + "..."  # a huge value is not echoed whole into the reason
    return None if name in POLICIES else f"unknown {shown!r}; known: {sorted(POLICIES)}"
