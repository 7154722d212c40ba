"""The robots' side of a workload (ros/workload_client.py) against a real planner node over loopback DDS.

A goal sent while the planner cannot hear it yet (the action server not there, or not yet aware of this node) is
lost by DDS without an answer; the client sends it again, with the same task_id, and waits for the planner to have
seen it before a run starts."""

from __future__ import annotations

import threading

import pytest

rclpy = pytest.importorskip("rclpy")
from rclpy.parameter import Parameter  # noqa: E402

from timelyllm_ros.engines.sim_realtime import RealtimeSimEngine  # noqa: E402
from timelyllm_ros.ros.planner_node import build_planner  # noqa: E402
from timelyllm_ros.ros.sim_fleet_node import SimFleetNode  # noqa: E402
from timelyllm_ros.ros.spin import PooledExecutor, Spinner  # noqa: E402
from timelyllm_ros.ros.workload_client import WorkloadClient, robot_id_of  # noqa: E402
from timelyllm_ros.sim.workloads import load_workload  # noqa: E402

pytestmark = pytest.mark.ros


def _jobs(n: int = 2):
    return [j for j in load_workload("wid2", 0).jobs if robot_id_of(j).startswith("drone")][:n]


def test_a_goal_sent_before_the_planner_can_hear_it_is_sent_again_and_served() -> None:
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    jobs = _jobs()
    client = WorkloadClient(jobs, speed=1000.0, context=ctx)
    ex = PooledExecutor(num_threads=8, context=ctx)
    ex.add_node(client)
    spinner = Spinner(ex)
    spinner.start()
    nodes = [client]
    try:
        out: list = []
        runner = threading.Thread(target=lambda: out.append(client.run(timeout=60)))
        runner.start()  # every goal goes out now, to no planner
        assert not client.wait_for_planner(timeout=0.3)
        planner, sched = build_planner([Parameter("policy", value="pud")], engine=RealtimeSimEngine(), context=ctx)
        fleet = SimFleetNode(context=ctx, parameter_overrides=[
            Parameter("robots", value=sorted({robot_id_of(j) for j in jobs})),
            Parameter("time_scale", value=0.05)])
        nodes += [planner, sched, fleet]
        for n in (planner, sched, fleet):
            ex.add_node(n)
        assert client.wait_for_planner(timeout=30)
        runner.join(timeout=60)
        assert out, "the run never ended"
        assert client.resent >= len(jobs)
        assert [r.status for r in out[0]] == ["done"] * len(jobs)
        assert all(r.response_time is not None for r in out[0])
    finally:
        ex.shutdown(timeout_sec=5)
        spinner.join(timeout=5)
        for n in nodes:
            if n is not client:
                getattr(n, "shutdown", lambda: None)()
            n.destroy_node()
        rclpy.shutdown(context=ctx)
