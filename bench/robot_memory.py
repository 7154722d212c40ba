"""``timelyllm-bench robot-memory``: planner memory against the number of distinct robot ids it has served.

One planner process (simulated engine) per setting of ``robot_idle_release_s``, side by side in one run: a
client sends goals for ``--robots`` distinct robot ids (no executor: each task ends when delivery gives up on
its unreachable robot), and the planner's resident memory (``/proc/<pid>/status`` VmRSS) is read after every
``--step`` robot ids. Before idle release, 10,000 ids took a planner from 88 to 579 MB (a DDS writer per robot,
never freed). Writes ``results.json``, ``results.md`` and ``robot_memory.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from bench.fleet_load import Child

DEFAULT_OUT = Path("bench/results/robot_memory")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for pid {pid}")


def run_one(release_s: float, robots: int, step: int, rate: float, settle_s: float, env: dict[str, str]) -> dict:
    import rclpy
    from rclpy.action import ActionClient
    from tqdm import tqdm

    from timelyllm_ros.action import PlanTask
    from timelyllm_ros.msg import TimeUtility
    from timelyllm_ros.ros import topics

    cmd = [sys.executable, "-m", "timelyllm_ros.ros.planner_node", "--ros-args",
           "-p", "engine_config:=engine_sim.yaml", "-p", f"robot_idle_release_s:={release_s}",
           "-p", "delivery_timeout_s:=0.5", "-p", "keep_results_max:=1000", "-p", "action_result_timeout_s:=5",
           "--log-level", "error"]
    # The log (one line per unreachable robot) goes to a temporary folder, not beside the results.
    log = Path(tempfile.mkdtemp(prefix="robot_memory_")) / f"planner_release_{release_s:g}.log"
    planner = Child(f"planner_release_{release_s:g}", cmd, env, log)
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    node = rclpy.create_node("robot_memory_client", context=ctx)
    client = ActionClient(node, PlanTask, topics.PLAN_TASK_ACTION)
    from rclpy.executors import SingleThreadedExecutor

    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(node)
    points: list[tuple[int, float]] = []
    try:
        end = time.monotonic() + 120
        while not client.server_is_ready() and time.monotonic() < end:
            ex.spin_once(timeout_sec=0.1)
        if not client.server_is_ready():
            raise RuntimeError(f"the planner's action server never came up (log: {planner.log_path})")
        points.append((0, _rss_mb(planner.pid)))
        t0 = time.monotonic()
        tuf = TimeUtility(level="normal")
        for i in tqdm(range(robots), desc=f"release {release_s:g} s", file=sys.stderr):
            goal = PlanTask.Goal(robot_id=f"robot_{i:05d}", robot_type="drone", task="[A] find the cat", tuf=tuf)
            client.send_goal_async(goal)
            while time.monotonic() < t0 + (i + 1) / rate:
                ex.spin_once(timeout_sec=0.005)
            if (i + 1) % step == 0:
                points.append((i + 1, _rss_mb(planner.pid)))
        settle_end = time.monotonic() + settle_s  # unreachable robots' tasks end, idle robots are released
        while time.monotonic() < settle_end:
            ex.spin_once(timeout_sec=0.1)
        points.append((robots, _rss_mb(planner.pid)))
    finally:
        node.destroy_node()
        rclpy.shutdown(context=ctx)
        planner.stop()
    return {"robot_idle_release_s": release_s, "points": points}


def _write(results: list[dict], args: argparse.Namespace, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (out / "results.json").write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "fn"},
                                                  "runs": results}, indent=1))
    lines = ["# Planner memory vs distinct robot ids", "",
             f"`timelyllm-bench robot-memory --robots {args.robots} --rate {args.rate:g}` (simulated engine; each "
             "task ends when delivery gives up on its unreachable robot). RSS of the planner process, MB.", "",
             "| robot ids served | " + " | ".join(f"release {r['robot_idle_release_s']:g} s" if
                                                 r["robot_idle_release_s"] else "never released" for r in results)
             + " |", "|---|" + "---|" * len(results)]
    for k in range(len(results[0]["points"])):
        n = results[0]["points"][k][0]
        label = f"{n} (+{args.settle:g} s)" if k == len(results[0]["points"]) - 1 else str(n)
        lines.append(f"| {label} | " + " | ".join(f"{r['points'][k][1]:.0f}" for r in results) + " |")
    # Over the second half of the ids: the first half also holds the robots still busy (a plateau's height).
    growth = []
    for r in results:
        pts = r["points"][:-1]
        (n0, m0), (n1, m1) = pts[len(pts) // 2], pts[-1]
        k = r["robot_idle_release_s"]
        growth.append(f"{'never released' if not k else f'release {k:g} s'}: {1024 * (m1 - m0) / (n1 - n0):.1f} KB")
    lines += ["", "Growth per further robot id over the second half of the ids: " + ", ".join(growth)]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        xs, ys = zip(*r["points"], strict=True)
        ax.plot(xs[:-1], ys[:-1], marker="o", label="never released" if not r["robot_idle_release_s"]
                else f"robot_idle_release_s = {r['robot_idle_release_s']:g}")
        ax.scatter([xs[-1]], [ys[-1]], marker="x")
    ax.set_xlabel("distinct robot ids served")
    ax.set_ylabel("planner RSS (MB)")
    ax.set_title("Planner memory vs robot ids (x: after settling)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "robot_memory.png", dpi=110)
    print("\n".join(lines))
    print(f"results: {out / 'results.md'}, plot: {out / 'robot_memory.png'}")


def cmd_robot_memory(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("ROS_DOMAIN_ID", str(random.randint(1, 100)))
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE")})
    results = [run_one(float(r), args.robots, args.step, args.rate, args.settle, env)
               for r in args.release.split(",")]
    _write(results, args, out)
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("robot-memory", help="planner memory vs distinct robot ids, with and without idle release")
    p.add_argument("--robots", type=int, default=10000, help="distinct robot ids, one goal each")
    p.add_argument("--step", type=int, default=1000, help="read the planner's memory after this many ids")
    p.add_argument("--rate", type=float, default=100.0, help="goals per second")
    p.add_argument("--release", default="0,5", help="robot_idle_release_s settings to compare (0: never)")
    p.add_argument("--settle", type=float, default=15.0, help="seconds after the last goal before the last reading")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.set_defaults(fn=cmd_robot_memory)
    return p
