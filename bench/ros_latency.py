"""Why the scheduler node shares the planner's process: a scheduling decision
made in-process vs the round trip it would cost as a ROS 2 service in another
process (real rclpy, loopback DDS).

    python -m bench.ros_latency [--n 300] [--out bench/results/ros_latency]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

SERVER = """
import rclpy
from timelyllm_ros.srv import EstimateExecTime
rclpy.init()
n = rclpy.create_node("latency_server")
def cb(req, resp):
    resp.ok = True
    return resp
n.create_service(EstimateExecTime, "/latency_probe", cb)
print("ready", flush=True)
from rclpy.executors import ExternalShutdownException
try:
    rclpy.spin(n)
except (KeyboardInterrupt, ExternalShutdownException):
    pass
"""


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--out", default="bench/results/ros_latency")
    args = ap.parse_args(argv)

    import rclpy

    from timelyllm_ros.domain.clock import SimClock
    from timelyllm_ros.domain.tuf import LEVELS
    from timelyllm_ros.domain.types import TaskSpec
    from timelyllm_ros.engines.sim_engine import SimEngine
    from timelyllm_ros.planner.core import PlannerCore
    from timelyllm_ros.planner.policies import make_policy
    from timelyllm_ros.srv import EstimateExecTime

    # in-process: a PUD decision over 8 queued generations
    core = PlannerCore(SimEngine(), make_policy("pud"), SimClock())
    for i in range(8):
        core.submit(TaskSpec(robot_id=f"r{i}", prompt="x", tuf=LEVELS["urgent" if i % 3 == 0 else "normal"],
                             arrival=0.0, extra={"plan_text": "tc(30);mf(50);"}))
    local = []
    for _ in range(args.n):
        t0 = time.perf_counter()
        core.queue.best(core.policy, 0.01, core.estimator, 4)
        local.append(time.perf_counter() - t0)

    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        rclpy.init()
        node = rclpy.create_node("latency_client")
        cli = node.create_client(EstimateExecTime, "/latency_probe")
        if not cli.wait_for_service(timeout_sec=30):
            raise RuntimeError("probe server never came up")
        remote = []
        for i in range(args.n + 20):
            t0 = time.perf_counter()
            fut = cli.call_async(EstimateExecTime.Request(robot_type="drone", segment_text="mf(50);"))
            rclpy.spin_until_future_complete(node, fut, timeout_sec=5)
            if i >= 20:  # discovery warm-up
                remote.append(time.perf_counter() - t0)
        node.destroy_node()
        rclpy.shutdown()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)

    res = {"n": args.n,
           "in_process_decision_ms": {"p50": statistics.median(local) * 1e3, "p99": pct(local, 0.99) * 1e3},
           "cross_process_service_ms": {"p50": statistics.median(remote) * 1e3, "p99": pct(remote, 0.99) * 1e3}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    lines = ["| path | p50 ms | p99 ms |", "|---|---|---|",
             f"| PUD decision, 8 queued, in-process | {res['in_process_decision_ms']['p50']:.4f} | "
             f"{res['in_process_decision_ms']['p99']:.4f} |",
             f"| ROS 2 service round trip, other process | {res['cross_process_service_ms']['p50']:.3f} | "
             f"{res['cross_process_service_ms']['p99']:.3f} |"]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
