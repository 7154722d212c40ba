"""The control plane (issue 39, item 7): with ``control_plane: locked``, no other node on the domain may set the
scheduler's policy or drive the planner's lifecycle; the planner's own process still may. Real rclpy services
over loopback DDS, called by an intruder node."""

from __future__ import annotations

import contextlib

import pytest
from waiting import wait_until

rclpy = pytest.importorskip("rclpy")
from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetState  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402

from timelyllm_ros.engines.sim_realtime import RealtimeSimEngine  # noqa: E402
from timelyllm_ros.ros.planner_node import build_planner  # noqa: E402
from timelyllm_ros.ros.spin import PooledExecutor, Spinner  # noqa: E402

pytestmark = pytest.mark.ros


@contextlib.contextmanager
def _planner(control_plane: str):
    """Planner + scheduler (simulated engine) and an intruder node, one context, spun."""
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    planner, sched = build_planner([Parameter("policy", value="pud-shed"), Parameter("warm_up", value=False),
                                    Parameter("control_plane", value=control_plane)],
                                   engine=RealtimeSimEngine(), context=ctx)
    intruder = rclpy.create_node("intruder", context=ctx)
    ex = PooledExecutor(num_threads=4, context=ctx)
    for n in (planner, sched, intruder):
        ex.add_node(n)
    spin = Spinner(ex)
    spin.start()
    try:
        yield planner, sched, intruder
    finally:
        planner.shutdown()
        spin.stop()
        ex.shutdown(timeout_sec=5)
        for n in (intruder, sched, planner):
            n.destroy_node()
        rclpy.shutdown(context=ctx)


def _call(node, srv_type, name: str, request):
    cli = node.create_client(srv_type, name)
    assert cli.wait_for_service(timeout_sec=20), f"{name} not available"
    fut = cli.call_async(request)
    assert wait_until(fut.done, 20), f"{name} did not answer"
    return fut.result()


def _set_policy(intruder, name: str):
    req = SetParameters.Request(parameters=[Parameter("policy", value=name).to_parameter_msg()])
    return _call(intruder, SetParameters, "/scheduler/set_parameters", req).results[0]


def _deactivate(intruder) -> bool:
    req = ChangeState.Request(transition=Transition(id=Transition.TRANSITION_DEACTIVATE))
    return _call(intruder, ChangeState, "/planner/change_state", req).success


def test_a_locked_control_plane_refuses_policy_and_lifecycle_changes_from_other_nodes():
    """Issue 39: any node on the domain could set /scheduler policy or deactivate the planner."""
    with _planner("locked") as (planner, sched, intruder):
        res = _set_policy(intruder, "fcfs")
        assert not res.successful and "control_plane is locked" in res.reason, res.reason
        assert sched.policy_name == "pud-shed" and planner.core.policy.name == "pud-shed"
        assert not _deactivate(intruder)
        assert planner.lifecycle_state == "active"
        state = _call(intruder, GetState, "/planner/get_state", GetState.Request()).current_state
        assert state.label == "active"  # reading the state stays open
        assert planner.health().rejected_messages == {"lifecycle_transition": 1}
        # the planner's own process still may
        sched.set_policy("fcfs")
        assert planner.core.policy.name == "fcfs"
        with pytest.raises(ValueError, match="unknown 'nope'"):
            sched.set_policy("nope")
        planner.trigger_deactivate()
        assert planner.lifecycle_state == "inactive"


def test_an_open_control_plane_lets_a_node_on_the_domain_change_both():
    """The default, as documented: without a locked control plane (or DDS security) the domain is trusted."""
    with _planner("open") as (planner, sched, intruder):
        assert _set_policy(intruder, "fcfs").successful
        assert wait_until(lambda: planner.core.policy.name == "fcfs", 10)
        assert _deactivate(intruder)
        assert planner.lifecycle_state == "inactive"


def test_a_locked_control_plane_needs_autostart():
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    try:
        with pytest.raises(ValueError, match="control_plane: 'locked' needs autostart"):
            build_planner([Parameter("control_plane", value="locked"), Parameter("autostart", value=False)],
                          engine=RealtimeSimEngine(), context=ctx)
    finally:
        rclpy.shutdown(context=ctx)
