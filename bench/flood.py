"""``timelyllm-bench flood``: a goal flood from many robot ids while a real urgent goal arrives (issue 39).

Per variant, side by side in one run: a planner process (simulated engine in real time), a simulated fleet process
holding the real robot, and a flood process: rclpy's ``ActionClient`` (``SafeActionClient``: its race that loses
goal futures fixed; queues deep enough for what it sends)
that sends ``--goals`` goals from as many distinct robot ids at ``--rate`` goals/s and follows every answer. When
half the flood is out, this process sends one urgent goal for the real robot, stamped, and reads how long its
first segment took from that stamp (the planner's ``response_time_from_send``: queueing at intake included). The
planner's resident memory (``/proc/<pid>/status`` VmRSS) is sampled throughout; its segment writers are counted in
the ROS graph after the flood.

``--before-src DIR`` adds a variant run from another source tree (e.g. ``git archive main | tar -x -C DIR``), with
this checkout's generated interfaces. Writes ``results.json``, ``results.md`` and ``flood_rss.png`` to ``--out``.
The flood process is also what ``test/test_intake.py`` floods with (``python -m bench.flood client ...``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import print_table, results_root
from bench.fleet_load import Child, rss_kib

DEFAULT_OUT = results_root() / "flood"
TASK = "Scene: [] Task: [A] Could you find the cat?"
URGENT_TASK = ("Scene: [dog x:0.48 y:0.51 width:0.2 height:0.4] Task: [E] a dog is chasing you")
HALF = "FLOOD_HALF"


# -- the flood process ------------------------------------------------------------------------------------------
def client_main(argv: list[str]) -> int:
    """``python -m bench.flood client --goals N --rate R --prefix P --settle S``: flood, then one JSON line."""
    ap = argparse.ArgumentParser(prog="bench.flood client")
    ap.add_argument("--goals", type=int, required=True)
    ap.add_argument("--rate", type=float, default=0.0, help="goals/s; 0: as fast as rclpy sends them")
    ap.add_argument("--prefix", default="flood_")
    ap.add_argument("--settle", type=float, default=60.0, help="s to wait for the last answers")
    a = ap.parse_args(argv)
    import rclpy
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.qos import QoSProfile

    from timelyllm_ros.action import PlanTask
    from timelyllm_ros.msg import TimeUtility
    from timelyllm_ros.ros import topics
    from timelyllm_ros.ros.actions import SafeActionClient

    rclpy.init()
    node = rclpy.create_node("flooder")
    deep = QoSProfile(depth=max(1000, 2 * a.goals))  # the client's own queues must hold what it asks for
    # rclpy's ActionClient with the race that loses goal futures fixed (ros/actions.py): the same protocol and
    # messages as a plain one; a lost future would read as a goal the planner never answered
    client = SafeActionClient(node, PlanTask, topics.PLAN_TASK_ACTION, goal_service_qos_profile=deep,
                              result_service_qos_profile=deep, feedback_sub_qos_profile=deep)
    ex = MultiThreadedExecutor(num_threads=2)
    ex.add_node(node)
    threading.Thread(target=ex.spin, daemon=True).start()
    if not client.wait_for_server(timeout_sec=60):
        print(json.dumps({"error": "no action server"}), flush=True)
        return 1
    lock = threading.Lock()
    out: dict[str, Any] = {"sent": 0, "responses": 0, "accepted": 0, "not_accepted": 0, "results": Counter(),
                           "reasons": Counter(), "empty_reasons": 0}
    answered: set[int] = set()  # goals with their final answer (not accepted, or a result), each once
    done = threading.Event()

    def on_result(i: int, f: Any) -> None:
        r = f.result().result
        with lock:
            if i in answered:
                return
            answered.add(i)
            out["results"][int(r.status)] += 1
            if r.status != 0:
                out["reasons"][r.message.split(" (")[0].split(";")[0][:70]] += 1
                out["empty_reasons"] += not r.message.strip()
            if len(answered) == a.goals:
                done.set()

    def on_response(i: int, f: Any) -> None:
        gh = f.result()
        with lock:
            out["responses"] += 1
            out["accepted" if gh.accepted else "not_accepted"] += 1
            if not gh.accepted:
                answered.add(i)
                if len(answered) == a.goals:
                    done.set()
        if gh.accepted:
            gh.get_result_async().add_done_callback(lambda r: on_result(i, r))

    tuf = TimeUtility(level="normal")
    t0 = time.monotonic()
    for i in range(a.goals):
        g = PlanTask.Goal(robot_id=f"{a.prefix}{i:05d}", robot_type="drone", task=TASK, tuf=tuf)
        client.send_goal_async(g).add_done_callback(lambda f, i=i: on_response(i, f))
        out["sent"] += 1
        if i + 1 == a.goals // 2:
            print(HALF, flush=True)
        if a.rate > 0:
            while time.monotonic() < t0 + (i + 1) / a.rate:
                time.sleep(0.0005)
    out["send_s"] = time.monotonic() - t0
    done.wait(a.settle)
    with lock:
        out["unanswered"] = a.goals - len(answered)
        out["results"] = {str(k): v for k, v in out["results"].items()}
        out["reasons"] = dict(out["reasons"].most_common(6))
        print(json.dumps(out), flush=True)
    os._exit(0)  # what it measured is out; rclpy's threads may abort the interpreter's own teardown


# -- one variant --------------------------------------------------------------------------------------------------
def _env(src: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if src is not None:  # its package and data first, not this checkout's from the working directory (-m)
        env["PYTHONPATH"] = f"{src}:{env.get('PYTHONPATH', '')}"
        env["PYTHONSAFEPATH"] = "1"
        env["TIMELYLLM_SHARE"] = str(src)
    return env


def run_variant(label: str, src: Path | None, goals: int, rate: float, settle: float, planner_args: list[str],
                log_dir: Path) -> dict[str, Any]:
    import rclpy
    from rclpy.executors import MultiThreadedExecutor

    from timelyllm_ros.action import PlanTask
    from timelyllm_ros.msg import PlanSegment, TimeUtility
    from timelyllm_ros.ros import topics
    from timelyllm_ros.ros.actions import SafeActionClient
    from timelyllm_ros.ros.convert import duration_s, time_msg

    env = _env(src)
    planner = Child(f"planner_{label}", [sys.executable, "-m", "timelyllm_ros.ros.planner_node", "--ros-args", "-p",
                                         "engine_config:=engine_sim.yaml", *planner_args], env,
                    log_dir / f"planner_{label}.log")
    fleet = Child(f"fleet_{label}", [sys.executable, "-m", "timelyllm_ros.ros.sim_fleet_node", "--ros-args", "-p",
                                     "robots:=[real_0]", "--log-level", "warn"], env, log_dir / f"fleet_{label}.log")
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    node = rclpy.create_node("real_robot", context=ctx)
    urgent_client = SafeActionClient(node, PlanTask, topics.PLAN_TASK_ACTION)  # the robot's: our client's class
    first_segment: list[float] = []  # when segment 0 of the urgent task reached the robot's own topic
    node.create_subscription(PlanSegment, topics.segment_topic("real_0"), lambda m: first_segment.append(
        time.monotonic()) if m.task_id == "urgent-1" and m.segment_index == 0 else None, topics.RELIABLE)
    ex = MultiThreadedExecutor(num_threads=2, context=ctx)
    ex.add_node(node)
    threading.Thread(target=ex.spin, daemon=True).start()
    flood = None
    rss: list[tuple[float, int]] = []
    out: dict[str, Any] = {"variant": label}
    try:
        if not planner.wait_for_line("planner ready", 120) or not urgent_client.wait_for_server(timeout_sec=60):
            raise RuntimeError(f"{label}: the planner did not come up (log: {planner.log_path})")
        end = time.monotonic() + 30
        while node.count_subscribers(topics.segment_topic("real_0")) == 0 and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(1.0)  # settled before the first reading
        rss.append((0.0, rss_kib(planner.pid) or 0))
        t0 = time.monotonic()
        flood = subprocess.Popen([sys.executable, "-m", "bench.flood", "client", "--goals", str(goals), "--rate",
                                  str(rate), "--settle", str(settle)], stdout=subprocess.PIPE, text=True,
                                 start_new_session=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(flood.stdout), daemon=True)
        reader.start()
        while HALF not in "".join(lines) and flood.poll() is None:
            rss.append((time.monotonic() - t0, rss_kib(planner.pid) or 0))
            time.sleep(0.05)
        goal = PlanTask.Goal(task_id="urgent-1", robot_id="real_0", robot_type="drone", task=URGENT_TASK,
                             tuf=TimeUtility(level="urgent"), stamp=time_msg(time.time()))
        sent_at = time.monotonic()
        fut = urgent_client.send_goal_async(goal)
        answer: dict[str, Any] = {}

        def on_response(f: Any) -> None:
            gh = f.result()
            answer["accepted"] = gh.accepted
            if gh.accepted:
                gh.get_result_async().add_done_callback(lambda r: answer.update(result=r.result().result))
        fut.add_done_callback(on_response)
        while flood.poll() is None:
            rss.append((time.monotonic() - t0, rss_kib(planner.pid) or 0))
            time.sleep(0.25)
        reader.join(5)
        summary = json.loads(lines[-1]) if lines else {"error": "no summary"}
        settle_end = time.monotonic() + 10.0  # what the planner keeps once the flood is over
        while time.monotonic() < settle_end:
            rss.append((time.monotonic() - t0, rss_kib(planner.pid) or 0))
            time.sleep(0.5)
        res = _plan_result(node, "urgent-1")
        writers = sum(1 for name, _ in node.get_topic_names_and_types() if name.endswith("/plan_segments")
                      and any(e.node_name == "planner" for e in node.get_publishers_info_by_topic(name)))
        out.update(flood=summary, urgent={
            "status": None if res is None else int(res.status), "message": None if res is None else res.message,
            "response_time_from_send_s": None if res is None else float(res.response_time_from_send),
            "response_time_s": None if res is None else duration_s(res.response_time),
            "first_segment_at_robot_s": (first_segment[0] - sent_at) if first_segment else None,
            # the action's own answers travel on topics every action client reads (Fast DDS does not filter a
            # service response by client): a default-depth client can lose its own among a flood's
            "action_answer_reached_client": "result" in answer},
            rss_mb={"before": rss[0][1] / 1024, "peak": max(r for _, r in rss) / 1024, "after": rss[-1][1] / 1024},
            rss_series=[(round(t, 2), round(k / 1024, 1)) for t, k in rss],  # (s from the flood's start, MB)
            segment_writers_after=writers)
    finally:
        if flood is not None and flood.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(flood.pid, 9)
        ex.shutdown(timeout_sec=2)
        node.destroy_node()
        rclpy.try_shutdown(context=ctx)
        fleet.stop()
        planner.stop()
    return out


def _plan_result(node: Any, task_id: str) -> Any:
    """/get_plan_result's PlanResult for ``task_id`` (after the flood: the service's responses reach us)."""
    from timelyllm_ros.ros import topics
    from timelyllm_ros.srv import GetPlanResult

    cli = node.create_client(GetPlanResult, topics.GET_PLAN_RESULT_SERVICE)
    if not cli.wait_for_service(timeout_sec=10):
        return None
    fut = cli.call_async(GetPlanResult.Request(task_id=task_id))
    end = time.monotonic() + 10
    while not fut.done() and time.monotonic() < end:
        time.sleep(0.02)
    return fut.result().result if fut.done() else None


def _table(runs: list[dict[str, Any]], args: argparse.Namespace) -> tuple[list[str], list[list[str]]]:
    def f(v: Any, spec: str = ".3f") -> str:
        return "-" if v is None else format(v, spec) if isinstance(v, float) else str(v)

    rows = []
    for r in runs:
        fl, u, m = r["flood"], r["urgent"], r["rss_mb"]
        refused = sum(v for k, v in fl.get("results", {}).items() if k != "0")
        rows.append([r["variant"], f(fl.get("sent")), f(fl.get("responses")), f(fl.get("unanswered")),
                     f(fl.get("results", {}).get("0", 0)), f(refused), f(fl.get("empty_reasons")),
                     "DONE" if u["status"] == 0 else f(u["message"] or "no answer")[:40],
                     f(u["first_segment_at_robot_s"]), f(u["response_time_from_send_s"]), f(m["before"], ".0f"),
                     f(m["peak"], ".0f"), f(m["after"], ".0f"), f(r["segment_writers_after"])])
    header = ["variant", "flood sent", "answered goals", "unanswered", "planned (DONE)", "refused/other results",
              "without reason", "urgent", "urgent segment 0 at robot, s", "planner's response from send, s",
              "RSS before MB", "RSS peak MB", "RSS after MB", "segment writers after"]
    return header, rows


def _plot(runs: list[dict[str, Any]], args: argparse.Namespace, path: Path) -> None:
    """The planner's RSS over the flood, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        xs, ys = zip(*r["rss_series"], strict=True)
        ax.plot(xs, ys, label=f"{r['variant']}: {r['segment_writers_after']} segment writers after")
    ax.set_xlabel("s since the flood started")
    ax.set_ylabel("planner RSS (MB)")
    ax.set_title(f"Planner memory under a flood of {args.goals} robot ids at {args.rate:g} goals/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def cmd_flood(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("ROS_DOMAIN_ID", str(random.randint(1, 100)))
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    log_dir = Path(tempfile.mkdtemp(prefix="flood_"))
    planner_args = args.planner_args.split() if args.planner_args else []
    variants: list[tuple[str, Path | None]] = []
    if args.before_src:
        variants.append(("before", Path(args.before_src).resolve()))
    variants.append(("after", None))
    runs = [run_variant(label, src, args.goals, args.rate, args.settle, planner_args, log_dir)
            for label, src in variants]
    header, rows = _table(runs, args)
    print_table(f"Goal flood: {args.goals} robot ids at {args.rate:g} goals/s, one urgent goal half-way", header, rows)
    (out / "results.json").write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "fn"},
                                                  "runs": runs}, indent=1))
    lines = [f"# Goal flood: {args.goals} robot ids, one urgent goal", "",
             f"`python -m bench.flood --goals {args.goals} --rate {args.rate:g}"
             + (f" --before-src {args.before_src}" if args.before_src else "") + "` (simulated engine, real time; "
             "planner logs in a temporary folder). The urgent goal's first segment is timed from its own stamp.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    for r in runs:
        lines += ["", f"{r['variant']}: refusals by reason {r['flood'].get('reasons')}; urgent: {r['urgent']}"]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    _plot(runs, args, out / "flood_rss.png")
    print(f"results: {out / 'results.md'}, plot: {out / 'flood_rss.png'}; logs: {log_dir}")
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("flood", help="a goal flood from many robot ids beside a real urgent goal (before/after)")
    p.add_argument("--goals", type=int, default=10_000, help="flood goals, one robot id each")
    p.add_argument("--rate", type=float, default=1350.0, help="flood goals/s (issue 39: 10,000 in 7.4 s)")
    p.add_argument("--settle", type=float, default=60.0, help="s the flood client waits for its last answers")
    p.add_argument("--before-src", default="", help="another source tree to run as 'before' (e.g. main's)")
    p.add_argument("--planner-args", default="--log-level info", help="more planner arguments (after --ros-args)")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.set_defaults(fn=cmd_flood)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["client"]:
        return client_main(argv[1:])
    ap = argparse.ArgumentParser(prog="bench.flood")
    add_parser(ap.add_subparsers())
    args = ap.parse_args(["flood", *argv])
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
