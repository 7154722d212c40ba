"""``python -m timelyllm_ros.bags``: record, replay, convert, inspect and analyse planner bags.

    python -m timelyllm_ros.bags record [-o bags/run1] [--duration 60]
    python -m timelyllm_ros.bags replay bags/run1 [--speed 2] [--record bags/run1-replay] [--results r.json]
    python -m timelyllm_ros.bags replay data/lrtrace/drone-wid2 --robot-id-format 'agent{agent_id}'
    python -m timelyllm_ros.bags convert data/lrtrace/drone-wid2 bags/wid2      # LRTrace -> bag
    python -m timelyllm_ros.bags convert bags/run1 out/run1-trace                # bag -> LRTrace folder (or .json)
    python -m timelyllm_ros.bags info bags/run1
    python -m timelyllm_ros.bags metrics bags/run1 [--csv m.csv]

record and replay need rclpy (a sourced ROS 2 environment); the others only rosbags.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from .io import BagError


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
    try:
        handle = start_recorder(None, path, topics)
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
            handle = start_recorder(None, args.record)
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


def _convert(args: argparse.Namespace) -> int:
    from timelyllm_ros.sim.workloads import load_trace

    from .convert import bag_to_workload, is_bag, workload_to_bag

    src, dst = Path(args.src), Path(args.dst)
    if is_bag(src):
        wl = bag_to_workload(src, robot_id_format=args.robot_id_format)
        if dst.suffix == ".json":  # a jobs file; config next to it as load_trace expects
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(json.dumps([j.to_json() for j in wl.jobs], indent=1))
            dst.with_name(dst.stem + "_config.json").write_text(json.dumps(wl.config, indent=1))
        else:
            wl.save(dst)
        print(f"{len(wl.jobs)} jobs -> {dst}")
    else:
        wl = load_trace(src)
        out = workload_to_bag(wl, dst, robot_id_format=args.robot_id_format, time_base_ns=args.time_base_ns)
        print(f"{len(wl.jobs)} jobs -> bag {out}")
    return 0


def _info(args: argparse.Namespace) -> int:
    from .io import bag_info

    print(bag_info(args.bag).to_text())
    return 0


def _metrics(args: argparse.Namespace) -> int:
    from timelyllm_ros.sim.metrics import summary_dicts, to_markdown, write_csv

    from .records import bag_metrics

    rows = bag_metrics(args.bag)
    if args.json:
        print(json.dumps(summary_dicts(rows), indent=1))
    else:
        print(to_markdown(rows), end="")
    if args.csv:
        write_csv(args.csv, summary_dicts(rows, bag=str(args.bag)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .convert import DEFAULT_ROBOT_ID_FORMAT

    ap = argparse.ArgumentParser(prog="timelyllm bags", description="record, replay, convert and analyse planner bags")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record the planner topics into a new bag until Ctrl-C")
    r.add_argument("-o", "--output", help="bag folder to create (default: <output-dir>/timelyllm_<date>-<time>)")
    r.add_argument("--output-dir", default="bags")
    r.add_argument("--topics", help="comma-separated topics (default: the five planner topics)")
    r.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    r.set_defaults(fn=_record)
    p = sub.add_parser("replay", help="replay a bag or LRTrace workload as PlanTask goals")
    p.add_argument("source", help="bag folder / .mcap, or LRTrace folder / jobs.json")
    p.add_argument("--speed", type=float, default=1.0, help="time factor (2 = twice as fast)")
    p.add_argument("--action", default="plan_task")
    p.add_argument("--robot-id-format", default=DEFAULT_ROBOT_ID_FORMAT,
                   help="robot id of an LRTrace agent; fields {robot_type}, {agent_id}")
    p.add_argument("--keep-task-ids", action="store_true", help="send the recorded task ids (default: new ids)")
    p.add_argument("--task-id-suffix", default="", help="appended to kept task ids (run several replays)")
    p.add_argument("--results", help="write the per-goal results as JSON")
    p.add_argument("--record", metavar="BAG", help="record the replayed run into this bag")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for results after the last goal")
    p.set_defaults(fn=_replay)
    c = sub.add_parser("convert", help="LRTrace (folder / jobs.json) -> bag, or bag -> LRTrace (folder or .json)")
    c.add_argument("src")
    c.add_argument("dst")
    c.add_argument("--robot-id-format", default=DEFAULT_ROBOT_ID_FORMAT)
    c.add_argument("--time-base-ns", type=int, default=0, help="bag time of trigger time 0 (LRTrace -> bag)")
    c.set_defaults(fn=_convert)
    i = sub.add_parser("info", help="topics, types, counts and time span (like ros2 bag info)")
    i.add_argument("bag")
    i.set_defaults(fn=_info)
    m = sub.add_parser("metrics", help="utility, response, waiting time per task type, from the bag alone")
    m.add_argument("bag")
    m.add_argument("--csv", help="also write the rows as CSV")
    m.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    m.set_defaults(fn=_metrics)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return args.fn(args)
    except (BagError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
