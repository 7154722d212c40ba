"""``python -m timelyllm_ros.bags``: convert, inspect and analyse planner bags (rosbags only, no rclpy).

    python -m timelyllm_ros.bags convert data/lrtrace/drone-wid2 bags/wid2      # LRTrace -> bag
    python -m timelyllm_ros.bags convert bags/run1 out/run1-trace                # bag -> LRTrace folder (or .json)
    python -m timelyllm_ros.bags info bags/run1
    python -m timelyllm_ros.bags metrics bags/run1 [--csv m.csv]

Recording and replaying need a live ROS 2 graph: ``timelyllm bags record|replay``
(:mod:`timelyllm_ros.ros.bag_cli`, which adds them to this parser through ``extra_commands``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from .io import BagError

ROS_COMMANDS = ("record", "replay")  # served by timelyllm_ros.ros.bag_cli


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
    from timelyllm_ros.measure.metrics import summary_dicts, to_markdown, write_csv

    from .records import bag_metrics

    rows = bag_metrics(args.bag)
    if args.json:
        print(json.dumps(summary_dicts(rows), indent=1))
    else:
        print(to_markdown(rows), end="")
    if args.csv:
        write_csv(args.csv, summary_dicts(rows, bag=str(args.bag)))
    return 0


def build_parser(extra_commands: Callable[[argparse._SubParsersAction], None] | None = None,
                 ) -> argparse.ArgumentParser:
    """The bag commands; ``extra_commands`` adds more subparsers (the ROS layer's record and replay)."""
    from .convert import DEFAULT_ROBOT_ID_FORMAT

    what = "record, replay, convert and analyse" if extra_commands is not None else "convert and analyse"
    ap = argparse.ArgumentParser(prog="timelyllm bags", description=f"{what} planner bags")
    sub = ap.add_subparsers(dest="cmd", required=True)
    if extra_commands is not None:
        extra_commands(sub)
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


def main(argv: list[str] | None = None,
         extra_commands: Callable[[argparse._SubParsersAction], None] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if extra_commands is None and argv[:1] and argv[0] in ROS_COMMANDS:
        print(f"error: `{argv[0]}` needs ROS 2 (rclpy): run `timelyllm bags {argv[0]} ...` "
              f"(python -m timelyllm_ros.cli bags {argv[0]} ...)", file=sys.stderr)
        return 2
    args = build_parser(extra_commands).parse_args(argv)
    try:
        return args.fn(args)
    except (BagError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
