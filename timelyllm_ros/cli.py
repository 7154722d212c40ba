"""``timelyllm``: start the node graph from a config without ros2 launch, or run the demo / a client.

    timelyllm up [--config fleet_demo.yaml] [--only planner,sim_fleet] [--policy fcfs]
    timelyllm demo [--policy fcfs] ...
    timelyllm plan --robot-id drone_0 --task "Task: find the cat"
    timelyllm bags {record,replay,convert,info,metrics} ...
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

from timelyllm_ros.launch_graph import NODE_HOSTS, node_specs


def up(config: str, only: list[str] | None, ros_args: list[str], grace_s: float = 10.0,
       record: str | None = None) -> int:
    """One process per executable; Ctrl-C (or SIGTERM) stops them all cleanly.

    ``record``: also run the recorder node, writing one rosbag2 (MCAP) bag to that path."""
    specs = node_specs(config, only)
    cmds = [(s.executable, [sys.executable, "-m", s.module, "--ros-args", "--params-file", str(s.params_file),
                            *ros_args]) for s in specs]
    if record:
        cmds.append(("recorder_node", [sys.executable, "-m", "timelyllm_ros.ros.recorder_node", "--ros-args",
                                       "-p", f"bag_path:={record}"]))
    procs: list[tuple[str, subprocess.Popen]] = []
    for name, cmd in cmds:
        print(f"[timelyllm] starting {name}: {' '.join(cmd)}", flush=True)
        procs.append((name, subprocess.Popen(cmd)))

    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    rc = 0
    while not stopping:
        for name, p in procs:
            if p.poll() is not None:
                print(f"[timelyllm] {name} exited with {p.returncode}; stopping the others", flush=True)
                rc = p.returncode or 1
                stopping = True
        time.sleep(0.2)
    for _, p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + grace_s
    for name, p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"[timelyllm] {name} did not stop in {grace_s} s: killing it", flush=True)
            p.kill()
            p.wait()
    return rc


def main(argv: list[str] | None = None) -> int:
    from_command_line = argv is None
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="timelyllm", description="timelyllm_ros command line")
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="start the node graph of a config (one process per executable)")
    u.add_argument("--config", default="fleet_demo.yaml", help="ROS parameters file (path or name in config/)")
    u.add_argument("--only", help=f"comma-separated subset of {sorted(NODE_HOSTS)}")
    u.add_argument("--policy", help="override the scheduler's policy")
    u.add_argument("--record", metavar="BAG", help="record the planner traffic into a rosbag2 (MCAP) bag at BAG")
    sub.add_parser("demo", help="the fleet demo (see `timelyllm demo --help`)", add_help=False)
    sub.add_parser("plan", help="send one task as a robot and print its segments", add_help=False)
    sub.add_parser("bags", help="record / replay / convert / info / metrics of bags", add_help=False)
    args, rest = ap.parse_known_args(argv)
    if args.cmd == "demo":
        if from_command_line:  # the program itself, not a caller in this process: see engines/openmp.py
            from timelyllm_ros.engines.openmp import reexec_with_intel_openmp

            reexec_with_intel_openmp()
        from timelyllm_ros.demo import main as demo_main

        return demo_main(rest)
    if args.cmd == "bags":  # the ROS layer's bag CLI: record and replay besides the rclpy-free commands
        from timelyllm_ros.ros.bag_cli import main as bags_main

        return bags_main(rest)
    if args.cmd == "plan":
        from timelyllm_ros.ros.client import main as client_main

        return client_main(["plan_client", *rest])
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    ros_args = ["-p", f"policy:={args.policy}"] if args.policy else []
    return up(args.config, args.only.split(",") if args.only else None, ros_args, record=args.record)


if __name__ == "__main__":
    sys.exit(main())
