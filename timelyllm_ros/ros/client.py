"""Send a task as a robot would and print each segment as it arrives.

    ros2 run timelyllm_ros plan_client --robot-id drone_0 --task "Task: find the cat" --urgency urgent
"""

from __future__ import annotations

import argparse
import sys
import time

import rclpy
from rclpy.action import ActionClient
from rclpy.node import Node
from rclpy.utilities import remove_ros_args

from timelyllm_ros.action import PlanTask
from timelyllm_ros.msg import TimeUtility
from timelyllm_ros.ros.convert import duration_s

STATUS_NAMES = {v: k.removeprefix("STATUS_").lower() for k, v in vars(PlanTask.Result).items()
                if k.startswith("STATUS_")}


def send_task(node: Node, client: ActionClient, goal: PlanTask.Goal, *, timeout: float = 120.0,
              on_feedback=None) -> PlanTask.Result:
    """Send one goal and wait for its result (spinning ``node``)."""
    if not client.wait_for_server(timeout_sec=min(timeout, 30.0)):
        raise TimeoutError("no PlanTask action server (is the planner running?)")
    fut = client.send_goal_async(goal, feedback_callback=(lambda m: on_feedback(m.feedback)) if on_feedback else None)
    rclpy.spin_until_future_complete(node, fut, timeout_sec=timeout)
    handle = fut.result()
    if handle is None or not handle.accepted:
        raise RuntimeError("goal was not accepted")
    res = handle.get_result_async()
    rclpy.spin_until_future_complete(node, res, timeout_sec=timeout)
    if not res.done():
        handle.cancel_goal_async()
        raise TimeoutError(f"no result within {timeout} s")
    return res.result().result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv if argv is None else argv
    ap = argparse.ArgumentParser(prog="plan_client", description=__doc__.splitlines()[0])
    ap.add_argument("--robot-id", default="drone_0")
    ap.add_argument("--robot-type", default="drone")
    ap.add_argument("--task", required=True, help="scene and instruction, as in the LRTrace traces")
    ap.add_argument("--urgency", default="normal", help="named level (normal, urgent) or '' for custom")
    ap.add_argument("--alpha", type=float, default=0.0)
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--ert", type=float, default=0.0)
    ap.add_argument("--action", default="plan_task", help="PlanTask action name")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args(remove_ros_args(argv)[1:])

    rclpy.init(args=argv)
    node = rclpy.create_node("plan_client")
    client = ActionClient(node, PlanTask, args.action)
    t0 = time.monotonic()

    def show(fb: PlanTask.Feedback) -> None:
        s = fb.segment
        print(f"[{time.monotonic() - t0:7.3f}s] {s.robot_id} {s.task_id} #{s.segment_index}: {s.text!r}"
              f"{'  (final)' if s.is_final else ''}", flush=True)

    goal = PlanTask.Goal(robot_id=args.robot_id, robot_type=args.robot_type, task=args.task,
                         tuf=TimeUtility(level=args.urgency, alpha=args.alpha, beta=args.beta, ert=args.ert))
    try:
        r = send_task(node, client, goal, timeout=args.timeout, on_feedback=show)
    except (TimeoutError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"result: {STATUS_NAMES.get(r.status, r.status)} ({r.message}); plan {r.plan_text!r}; "
          f"response {duration_s(r.response_time):.3f}s; utility {r.utility:.3f}")
    node.destroy_node()
    rclpy.shutdown()
    return 0 if r.status == PlanTask.Result.STATUS_SUCCEEDED else 1


if __name__ == "__main__":
    import sys

    sys.exit(main())
