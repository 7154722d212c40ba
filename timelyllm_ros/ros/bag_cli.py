"""``timelyllm bags``: the bag commands, with the two that need a live ROS 2 graph.

    timelyllm bags record [-o bags/run1] [--duration 60]
    timelyllm bags replay bags/run1 [--speed 2] [--record bags/run1-replay] [--results r.json]
    timelyllm bags replay data/lrtrace/drone-wid2 --robot-id-format 'agent{agent_id}'
    timelyllm bags convert|info|metrics ...      # as python -m timelyllm_ros.bags (no rclpy)

record and replay live here, in the ROS layer, so that :mod:`timelyllm_ros.bags` never imports
rclpy or ``timelyllm_ros.ros``. rclpy is imported only when one of them runs: ``timelyllm bags
info`` still works without a sourced ROS 2 environment.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import signal
import sys
import threading
from pathlib import Path

from timelyllm_ros.bags import cli as bags_cli
from timelyllm_ros.bags.convert import DEFAULT_ROBOT_ID_FORMAT
from timelyllm_ros.interfaces import PLAN_TASK_ACTION, in_fleet


def _record(args: argparse.Namespace) -> int:
    import rclpy

    from timelyllm_ros.bags.typestore import DEFAULT_TOPICS, topic_spec
    from timelyllm_ros.ros.recorder_node import default_bag_path, start_recorder

    topics = [topic_spec(t) for t in args.topics.split(",")] if args.topics else DEFAULT_TOPICS
    path = Path(args.output) if args.output else default_bag_path(args.output_dir)
    rclpy.init()
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: where is a stuck recorder?
    try:
        handle = start_recorder(None, path, topics, wait_s=10.0)  # the planner's publishers, if running
        print(f"recording to {handle.path} (Ctrl-C stops)", flush=True)
        stop.wait(args.duration)
        counts = handle.counts
        out = handle.stop()
    finally:
        rclpy.try_shutdown()
    print(f"{sum(counts.values())} messages: {counts}")
    print(f"bag: {out}", flush=True)
    return 0


def _replay(args: argparse.Namespace) -> int:
    import rclpy
    from rclpy.parameter import Parameter

    from timelyllm_ros.ros.recorder_node import start_recorder
    from timelyllm_ros.ros.replay_node import ReplayNode, run_replay

    rclpy.init()
    handle = None
    try:
        node = ReplayNode(parameter_overrides=[
            Parameter("source", value=str(args.source)), Parameter("speed", value=float(args.speed)),
            Parameter("action", value=args.action), Parameter("robot_id_format", value=args.robot_id_format),
            Parameter("keep_task_ids", value=bool(args.keep_task_ids)),
            Parameter("task_id_suffix", value=args.task_id_suffix), Parameter("results", value=args.results or ""),
            Parameter("timeout_s", value=float(args.timeout))])
        if args.record:
            handle = start_recorder(None, args.record, wait_s=10.0)
            print(f"recording to {handle.path}", flush=True)
        try:
            rep = run_replay(node)
        finally:
            node.replayer.destroy()
            node.destroy_node()
            if handle is not None:
                print(f"bag: {handle.stop()}", flush=True)
    except TimeoutError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        rclpy.try_shutdown()
    print(json.dumps(rep.counts()))
    return 0 if rep.complete else 1


def add_ros_commands(sub: argparse._SubParsersAction) -> None:
    """The record and replay subcommands (for :func:`timelyllm_ros.bags.cli.build_parser`)."""
    r = sub.add_parser("record", help="record the planner topics into a new bag until Ctrl-C")
    r.add_argument("-o", "--output", help="bag folder to create (default: <output-dir>/timelyllm_<date>-<time>)")
    r.add_argument("--output-dir", default="bags")
    r.add_argument("--topics", help="comma-separated topics (default: the five planner topics)")
    r.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    r.set_defaults(fn=_record)
    p = sub.add_parser("replay", help="replay a bag or LRTrace workload as PlanTask goals")
    p.add_argument("source", help="bag folder / .mcap, or LRTrace folder / jobs.json")
    p.add_argument("--speed", type=float, default=1.0, help="time factor (2 = twice as fast)")
    p.add_argument("--action", default=in_fleet(PLAN_TASK_ACTION))
    p.add_argument("--robot-id-format", default=DEFAULT_ROBOT_ID_FORMAT,
                   help="robot id of an LRTrace agent; fields {robot_type}, {agent_id}")
    p.add_argument("--keep-task-ids", action="store_true", help="send the recorded task ids (default: new ids)")
    p.add_argument("--task-id-suffix", default="", help="appended to kept task ids (run several replays)")
    p.add_argument("--results", help="write the per-goal results as JSON")
    p.add_argument("--record", metavar="BAG", help="record the replayed run into this bag")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for results after the last goal")
    p.set_defaults(fn=_replay)


def main(argv: list[str] | None = None) -> int:
    return bags_cli.main(argv, extra_commands=add_ros_commands)


if __name__ == "__main__":
    sys.exit(main())
