"""``timelyllm-bench fleet-load``: one planner process, one simulated fleet process, and a client playing the
robots, over real rclpy and the simulated engine in real time.

    timelyllm-bench fleet-load [--goals 1000] [--duration 100] [--burst 200] [--robots 50] [--seed 0]

The client (this process, :class:`~timelyllm_ros.ros.client.PlanClient`) sends ``--goals`` PlanTask goals
as Poisson arrivals over ``--duration`` seconds plus ``--burst`` goals within one second in the middle,
each for a random robot with a random drone task of the paper (Table 2: normal and urgent). It is judged
from the robots' side: it listens to every ``/<robot>/plan_segments`` topic and to ``/segment_done``; a
task's plan was delivered exactly once in order when the executions the fleet reports on SegmentDone
cover indices 0..n-1 once each, in increasing start order (n: the segments of its result; end-of-plan
markers are neither executed nor reported), or a prefix of them where its last result on ``/plan_results`` is
not DONE (an urgent task for its robot preempted the plan while the robot ran it: the result is revised).
A robot answers a re-sent copy of a segment it already ran
with the same report again (same index, start and finish): that is one execution, counted once and
shown as a repeated report; a second execution would have its own start. Every goal must end in a
terminal result (lost = 0), every accepted one also on ``/plan_results``.

Results: a table on stdout; results.json, results.md and fleet_load.png in ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from timelyllm_ros.domain.types import TaskStatus
from timelyllm_ros.ros.goal_tracking import GoalOutcome

DEFAULT_OUT = Path("bench/results/fleet_load")


# -- child processes -----------------------------------------------------------------------------------
class Child:
    """One child process in a session of its own; :meth:`stop` sends SIGINT, then SIGKILL after a timeout."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.cmd, self.log_path = name, cmd, log
        self._log = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for_line(self, text: str, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with contextlib.suppress(OSError):
                if text in self.log_path.read_text(errors="replace"):
                    return True
            if not self.alive():
                return False
            time.sleep(0.1)
        return False

    def rss_kib(self) -> int | None:
        return rss_kib(self.pid)

    def stop(self, timeout: float = 15.0) -> int | None:
        try:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGINT)
                try:
                    self.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.proc.wait(timeout=10)
            return self.proc.returncode
        finally:
            self._log.close()

    def tail(self, n: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""


def rss_kib(pid: int) -> int | None:
    """VmRSS of a process, KiB (None if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


# -- the workload ---------------------------------------------------------------------------------------
@dataclass
class GoalPlan:
    at: float          # seconds after the start
    robot: str
    template: str
    level: str
    task: str
    burst: bool


def make_schedule(goals: int, duration: float, burst: int, robots: list[str], seed: int) -> list[GoalPlan]:
    """``goals`` Poisson arrivals over ``duration`` (scaled to end within it) + ``burst`` goals within one
    second in the middle; each a random drone task of data/plans.yaml for a random robot."""
    from timelyllm_ros.domain.plans import plan_templates

    rng = random.Random(seed)
    tpls = [t for t in plan_templates().values() if t.robot_type == "drone"]
    times: list[float] = []
    t = 0.0
    for _ in range(goals):
        t += rng.expovariate(1.0)
        times.append(t)
    scale = duration / (t + rng.expovariate(1.0)) if goals else 1.0
    arrivals = [(x * scale, False) for x in times]
    mid = duration / 2
    arrivals += [(mid + rng.random(), True) for _ in range(burst)]
    arrivals.sort()
    out = []
    for at, b in arrivals:
        tpl = rng.choice(tpls)
        out.append(GoalPlan(at=at, robot=rng.choice(robots), template=tpl.name, level=tpl.level,
                            task=tpl.task_input, burst=b))
    return out


# -- what the robots' side saw ------------------------------------------------------------------------------
@dataclass
class GoalRecord:
    task_id: str
    robot: str
    template: str
    level: str
    burst: bool
    scheduled: float
    sent_wall: float = math.nan
    done_wall: float = math.nan
    attempts: int = 0
    responded: bool = False
    accepted: bool = False
    status: str = ""  # the result's TaskStatus value ("" while none came)
    final_status: str = ""  # the last /plan_results revision's (DONE revised CANCELLED: preempted mid-plan)
    message: str = ""
    error_kind: str = ""  # a client-side GoalOutcome value ("" when none)
    source: str = ""
    fallback: str = ""
    n_segments: int = 0
    from_feedback: int = 0
    from_result: int = 0
    client_in_order: bool = False
    response_time: float = math.nan
    response_time_from_send: float = math.nan
    first_segment_topic: float = math.nan   # send -> segment 0 first seen on the robot's topic (this process)
    first_segment_client: float = math.nan  # send -> segment 0 handed to on_segment
    first_segment_hop: float = math.nan     # segment 0: the planner's stamp_generated -> seen on the robot topic
    done_indices: list[int] = field(default_factory=list)  # executions reported on /segment_done, by start
    re_reports: int = 0  # the same execution (index, start, finish) reported again (answer to a re-sent copy)
    exactly_once_in_order: bool = False
    on_plan_results: int = 0


class Observer:
    """Subscriptions of the robots' side: every robot's segment topic, /segment_done, /plan_results."""

    def __init__(self, node, robots: list[str]) -> None:
        from rclpy.callback_groups import ReentrantCallbackGroup

        from timelyllm_ros.msg import PlanResult, PlanSegment, SegmentDone
        from timelyllm_ros.ros import topics

        self.lock = threading.Lock()
        self.first_seen: dict[str, float] = {}            # task -> wall time segment 0 was first seen
        self.first_hop: dict[str, float] = {}             # task -> that time - the segment's stamp_generated
        self.topic_copies: Counter = Counter()            # (task, index) -> copies seen on robot topics
        # task -> (start, finish, index, ok) of every SegmentDone received
        self.reports: dict[str, list[tuple[float, float, int, bool]]] = defaultdict(list)
        self.results: dict[str, list[Any]] = defaultdict(list)  # task -> PlanResult messages
        group = ReentrantCallbackGroup()
        for r in robots:
            node.create_subscription(PlanSegment, topics.segment_topic(r), self._segment, topics.RELIABLE,
                                     callback_group=group)
        node.create_subscription(SegmentDone, topics.SEGMENT_DONE, self._done, topics.REPORTS, callback_group=group)
        node.create_subscription(PlanResult, topics.PLAN_RESULTS, self._result, topics.RESULTS_QOS,
                                 callback_group=group)

    def _segment(self, msg) -> None:
        now = time.time()
        with self.lock:
            self.topic_copies[(msg.task_id, msg.segment_index)] += 1
            if msg.segment_index == 0 and msg.text and msg.task_id not in self.first_seen:
                self.first_seen[msg.task_id] = now
                gen = msg.stamp_generated.sec + msg.stamp_generated.nanosec * 1e-9
                if gen > 0:
                    self.first_hop[msg.task_id] = now - gen

    def _done(self, msg) -> None:
        with self.lock:
            self.reports[msg.task_id].append((msg.start.sec + msg.start.nanosec * 1e-9,
                                              msg.finish.sec + msg.finish.nanosec * 1e-9, msg.segment_index,
                                              msg.success))

    def _result(self, msg) -> None:
        with self.lock:
            self.results[msg.task_id].append(msg)


# -- statistics --------------------------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float:
    xs = sorted(x for x in xs if x == x)
    if not xs:
        return math.nan
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _ms(x: float) -> str:
    return "-" if x != x else f"{x * 1e3:.0f} ms"


def summarize(recs: list[GoalRecord], rss: dict[str, int | None], extra: dict[str, Any]) -> dict[str, Any]:
    sent = [r for r in recs if r.sent_wall == r.sent_wall]
    terminal = [r for r in sent if r.status]
    # refused by the planner: INVALID (what it asked) or BUSY (at capacity, engine restarting)
    refused = (TaskStatus.INVALID, TaskStatus.BUSY)
    accepted = [r for r in terminal if r.status not in refused]
    rejected = [r for r in sent if r.status in refused or r.error_kind == GoalOutcome.NOT_ACCEPTED]
    with_segments = [r for r in accepted if r.n_segments > 0]
    reasons = Counter(_reason(r.message or r.error_kind) for r in rejected)
    s: dict[str, Any] = {
        "goals_sent": len(sent),
        "goal_responses": sum(r.responded for r in sent),
        "accepted": len(accepted),
        "rejected": len(rejected),
        "rejected_reasons": reasons.most_common(5),
        "terminal_results": len(terminal),
        "terminal_via_action": sum(r.source == "action" for r in terminal),
        "terminal_via_fallback": sum(r.source not in ("action", "") for r in terminal),
        "client_errors": Counter(r.error_kind for r in sent if r.error_kind).most_common(),
        "statuses": Counter(r.status for r in terminal).most_common(),
        "on_plan_results": sum(1 for r in accepted if r.on_plan_results > 0),
        "accepted_missing_on_plan_results": sum(1 for r in accepted if r.on_plan_results == 0),
        "plan_results_revisions": sum(max(0, r.on_plan_results - 1) for r in sent),
        "revised_status": Counter(f"{r.status}->{r.final_status}" for r in sent
                                  if r.final_status and r.final_status != r.status).most_common(),
        "tasks_with_segments": len(with_segments),
        "delivered_exactly_once_in_order": sum(r.exactly_once_in_order for r in with_segments),
        "client_in_order": sum(r.client_in_order for r in with_segments),
        "re_reports": sum(r.re_reports for r in sent),
        "segments_from_result_not_feedback": sum(r.from_result for r in sent),
        "lost": len(sent) - len(terminal),
        "goal_retries": sum(max(0, r.attempts - 1) for r in sent),
        "rss_kib": rss,
        **extra,
    }
    lat: dict[str, dict[str, float]] = {}
    for level in sorted({r.level for r in sent}):
        ok = [r for r in with_segments if r.level == level and r.status == TaskStatus.DONE]
        lat[level] = {
            "n": len(ok),
            "response_time_p50": pct([r.response_time for r in ok], 0.5),
            "response_time_p95": pct([r.response_time for r in ok], 0.95),
            "from_send_p50": pct([r.response_time_from_send for r in ok], 0.5),
            "from_send_p95": pct([r.response_time_from_send for r in ok], 0.95),
            "client_first_segment_p50": pct([r.first_segment_topic for r in ok], 0.5),
            "client_first_segment_p95": pct([r.first_segment_topic for r in ok], 0.95),
            "client_first_segment_n": sum(1 for r in ok if r.first_segment_topic == r.first_segment_topic),
            "hop_p50": pct([r.first_segment_hop for r in ok], 0.5),
            "hop_p95": pct([r.first_segment_hop for r in ok], 0.95),
        }
    s["latency"] = lat
    return s


def _reason(msg: str) -> str:
    """A rejection message without its numbers and ids, to group them."""
    import re

    msg = re.sub(r"'[^']*'", "'…'", msg)
    msg = re.sub(r"\d+(\.\d+)?", "N", msg)
    return msg[:100]


def table_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    rss = s["rss_kib"]
    rows = [
        ("goals sent", f"{s['goals_sent']} ({s['goals_poisson']} Poisson over {s['duration_s']:g} s + "
                       f"{s['goals_burst']} in a 1 s burst)"),
        ("goal responses received", str(s["goal_responses"])),
        ("accepted (planned)", str(s["accepted"])),
        ("rejected (explicit)", str(s["rejected"])),
    ]
    for reason, n in s["rejected_reasons"]:
        rows.append(("  reason", f"{n} x {reason}"))
    rows += [
        ("terminal results at the client", f"{s['terminal_results']} (action {s['terminal_via_action']}, "
                                           f"fallback {s['terminal_via_fallback']})"),
        ("  statuses", ", ".join(f"{k} {v}" for k, v in s["statuses"]) or "-"),
        ("results seen on /plan_results", f"{s['on_plan_results']} of {s['accepted']} accepted "
                                          f"(missing {s['accepted_missing_on_plan_results']}, "
                                          f"revisions {s['plan_results_revisions']}: "
                                          f"{', '.join(f'{k} {v}' for k, v in s['revised_status']) or 'none'})"),
        ("delivered exactly once in order (robots)", f"{s['delivered_exactly_once_in_order']} of "
                                                     f"{s['tasks_with_segments']} tasks with segments "
                                                     f"({s['re_reports']} repeated reports of one execution)"),
        ("  on_segment once in order (client)", f"{s['client_in_order']} of {s['tasks_with_segments']}; "
                                               f"{s['segments_from_result_not_feedback']} segments filled in "
                                               "from results (feedback lost)"),
        ("lost (sent, no terminal result)", str(s["lost"])),
        ("goal re-sends / client errors", f"{s['goal_retries']} / "
                                          f"{', '.join(f'{k} {v}' for k, v in s['client_errors']) or 'none'}"),
    ]
    for level, x in s["latency"].items():
        rows.append((f"{level}: response_time p50 / p95", f"{_ms(x['response_time_p50'])} / "
                                                          f"{_ms(x['response_time_p95'])}  (n={x['n']})"))
        rows.append((f"{level}: from send stamp p50 / p95 (planner)", f"{_ms(x['from_send_p50'])} / "
                                                                       f"{_ms(x['from_send_p95'])}"))
        rows.append((f"{level}: send -> segment 0 on robot topic p50 / p95",
                     f"{_ms(x['client_first_segment_p50'])} / {_ms(x['client_first_segment_p95'])}  "
                     f"(n={x['client_first_segment_n']})"))
        rows.append((f"{level}:   of which stamp_generated -> robot topic", f"{_ms(x['hop_p50'])} / "
                                                                          f"{_ms(x['hop_p95'])}"))
    before, after = rss.get("before"), rss.get("after")
    rows.append(("planner RSS before / after", f"{_mib(before)} / {_mib(after)}"))
    rows.append(("wall time", f"{s['wall_s']:.1f} s (sending {s['send_s']:.1f} s)"))
    return rows


def _mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f} MiB"


def print_table(rows: list[tuple[str, str]], title: str) -> None:
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title)
        t.add_column("metric")
        t.add_column("value")
        for k, v in rows:
            t.add_row(k, v)
        Console(width=140).print(t)
    except ImportError:  # pragma: no cover
        print(title)
        for k, v in rows:
            print(f"  {k:<50} {v}")


def write_markdown(path: Path, rows: list[tuple[str, str]], command: str, cfg: dict[str, Any]) -> None:
    lines = ["# fleet-load", "", f"Command: `{command}`", "",
             "Config: " + ", ".join(f"{k}={v}" for k, v in cfg.items()), "",
             "| metric | value |", "|---|---|"]
    lines += [f"| {k.strip()} | {v.replace('|', '/')} |" for k, v in rows]
    path.write_text("\n".join(lines) + "\n")


def plot(path: Path, recs: list[GoalRecord], t0: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sent = [r for r in recs if r.sent_wall == r.sent_wall]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    if sent:
        end = max(int(max((r.done_wall if r.done_wall == r.done_wall else r.sent_wall) for r in sent) - t0) + 2, 2)
        bins = list(range(end + 1))
        a1.hist([r.sent_wall - t0 for r in sent], bins=bins, alpha=0.6, label="goals sent / s")
        a1.hist([r.done_wall - t0 for r in sent if r.done_wall == r.done_wall], bins=bins, alpha=0.6,
                label="terminal results / s", histtype="step", lw=1.5)
    a1.set_ylabel("per second")
    a1.legend()
    a1.set_title("fleet-load: goals and results per second")
    for level, color in (("normal", "tab:blue"), ("urgent", "tab:red")):
        pts = [(r.sent_wall - t0, r.response_time) for r in sent if r.level == level and r.response_time > 0]
        if pts:
            a2.scatter(*zip(*pts, strict=True), s=6, color=color, alpha=0.6, label=f"{level}: response_time")
        pts = [(r.sent_wall - t0, r.first_segment_topic) for r in sent
               if r.level == level and r.first_segment_topic == r.first_segment_topic]
        if pts:
            a2.scatter(*zip(*pts, strict=True), s=6, marker="x", color=color, alpha=0.4,
                       label=f"{level}: send -> segment 0 on robot topic")
    a2.set_xlabel("seconds since the first goal")
    a2.set_ylabel("seconds")
    a2.set_yscale("log")
    a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the run -----------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    robots = [f"drone_{i}" for i in range(args.robots)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    domain = args.domain_id if args.domain_id is not None else int(
        os.environ.get("ROS_DOMAIN_ID") or random.Random().randint(30, 99))
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), PYTHONUNBUFFERED="1", RCUTILS_LOGGING_BUFFERED_STREAM="0")
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", env["ROS_AUTOMATIC_DISCOVERY_RANGE"])
    schedule = make_schedule(args.goals, args.duration, args.burst, robots, args.seed)
    command = " ".join(["timelyllm-bench", *(args.argv or sys.argv[1:])])
    cfg = {"goals": args.goals, "burst": args.burst, "duration_s": args.duration, "robots": args.robots,
           "seed": args.seed, "fleet_time_scale": args.time_scale, "engine_config": args.engine_config,
           "robot_timeout_s": args.robot_timeout, "ros_domain_id": domain}
    print(f"fleet-load: {len(schedule)} goals, {args.robots} robots, ROS_DOMAIN_ID={domain}, logs in {out}",
          file=sys.stderr)
    children: list[Child] = []
    ctx = node = ex = spin_thread = pc = None
    import rclpy

    try:
        py = sys.executable
        planner = Child("planner", [py, "-m", "timelyllm_ros.ros.planner_node", "--ros-args",
                                    "-p", f"engine_config:={args.engine_config}", "-p", "warm_up:=false",
                                    "-p", f"robot_timeout_s:={args.robot_timeout}",
                                    "-p", f"delivery_timeout_s:={max(30.0, args.robot_timeout)}"],
                        env, out / "planner.log")
        children.append(planner)
        fleet = Child("sim_fleet", [py, "-m", "timelyllm_ros.ros.sim_fleet_node", "--ros-args",
                                    "-p", f"robots:=[{', '.join(robots)}]", "-p", f"time_scale:={args.time_scale}",
                                    "-p", f"seed:={args.seed}"], env, out / "sim_fleet.log")
        children.append(fleet)
        if not planner.wait_for_line("planner ready", 120):
            raise RuntimeError(f"the planner did not start:\n{planner.tail()}")
        if not fleet.wait_for_line("simulated", 60):
            raise RuntimeError(f"the simulated fleet did not start:\n{fleet.tail()}")

        from timelyllm_ros.action import PlanTask
        from timelyllm_ros.msg import TimeUtility
        from timelyllm_ros.ros import topics
        from timelyllm_ros.ros.client import PlanClient
        from timelyllm_ros.ros.convert import duration_s, status_name, time_s
        from timelyllm_ros.ros.spin import PooledExecutor, Spinner

        ctx = rclpy.Context()
        rclpy.init(context=ctx, domain_id=domain)
        node = rclpy.create_node("fleet_load_client", context=ctx)
        obs = Observer(node, robots)
        pc = PlanClient(node, server_timeout=60.0, default_timeout=args.goal_timeout)
        ex = PooledExecutor(num_threads=4, context=ctx)
        ex.add_node(node)
        spin_thread = Spinner(ex, name="fleet-load-spin")
        spin_thread.start()
        if not pc.wait_for_server(60):
            raise RuntimeError(f"no PlanTask action server:\n{planner.tail()}")
        end = time.monotonic() + 60
        while time.monotonic() < end and not all(
                node.count_subscribers(topics.segment_topic(r)) >= 2 for r in robots):  # the fleet's and ours
            time.sleep(0.1)
        time.sleep(1.0)  # the rest of discovery (/plan_results, /segment_done)
        rss = {"before": planner.rss_kib()}

        recs: list[GoalRecord] = []
        handles = []
        done_count = [0]
        lock = threading.Lock()

        def on_done(h) -> None:
            with lock:
                done_count[0] += 1

        progress = _progress(len(schedule))
        t_start_wall, t_start = time.time(), time.monotonic()
        for gp in schedule:
            delay = t_start + gp.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            goal = pc.prepare(PlanTask.Goal(robot_id=gp.robot, robot_type="drone", task=gp.task,
                                            tuf=TimeUtility(level=gp.level)))
            rec = GoalRecord(task_id=goal.task_id, robot=gp.robot, template=gp.template, level=gp.level,
                             burst=gp.burst, scheduled=gp.at, sent_wall=time_s(goal.stamp))
            recs.append(rec)
            handles.append(pc.send(goal, on_done=on_done))
            _update(progress, done_count[0], len(recs), len(schedule))
        send_s = time.monotonic() - t_start
        # drain: every goal must end (the goal timeout bounds it), then the robots' reports of what they ran
        drain_end = time.monotonic() + args.goal_timeout + 30
        while time.monotonic() < drain_end and not all(h.done() for h in handles):
            _update(progress, done_count[0], len(recs), len(schedule))
            time.sleep(0.2)
        _update(progress, done_count[0], len(recs), len(schedule))
        reports_end = time.monotonic() + args.report_wait

        def expected_reports_in() -> bool:
            with obs.lock:
                return all(len({x[2] for x in obs.reports.get(h.task_id, ())}) >= _n_segments(h)
                           for h in handles if h.ok)

        while time.monotonic() < reports_end and not expected_reports_in():
            time.sleep(0.2)
        time.sleep(1.0)  # late duplicates, if any, would show
        rss["after"] = planner.rss_kib()
        wall_s = time.monotonic() - t_start
        if progress is not None:
            progress.close()

        with obs.lock:
            for rec, h in zip(recs, handles, strict=True):
                rec.attempts, rec.responded, rec.accepted = h.attempts, h.responses > 0, h.accepted
                rec.done_wall = (t_start_wall + (h.t_done - t_start)) if h.t_done is not None else math.nan
                rec.error_kind, rec.source = str(h.error_kind or ""), h.source or ""
                rec.fallback = h.fallback_reason or ""
                rec.from_feedback, rec.from_result = h.from_feedback, h.from_result
                if h.result is not None:
                    r = h.result
                    rec.status = status_name(r.status)
                    rec.message = r.message
                    rec.n_segments = _n_segments(h)
                    rec.response_time = duration_s(r.response_time) if rec.n_segments else math.nan
                    rec.response_time_from_send = r.response_time_from_send
                else:
                    rec.message = h.error or ""
                idx = [s.segment_index for s in h.segments]
                rec.client_in_order = h.result is not None and idx == list(range(len(idx))) and h.complete
                if rec.task_id in obs.first_seen:
                    rec.first_segment_topic = obs.first_seen[rec.task_id] - rec.sent_wall
                    rec.first_segment_hop = obs.first_hop.get(rec.task_id, math.nan)
                if h.t_first_segment is not None:
                    rec.first_segment_client = h.t_first_segment - (t_start + (rec.sent_wall - t_start_wall))
                # executions: a segment the robot refused without starting it (a preempted task's rest) is
                # reported failed with a zero start, and is no execution
                reps = [r for r in obs.reports.get(rec.task_id, []) if r[0] > 0]
                runs = sorted({(start, finish, i) for start, finish, i, _ in reps})  # one per execution
                rec.re_reports = len(reps) - len(runs)
                rec.done_indices = [i for _, _, i in runs]
                # every segment the robot ran, once and in order: the whole plan for a task done, a prefix for one
                # ended early (a preempted task's robot stops, and segments written ahead of it are not run)
                ran = rec.done_indices
                revisions = obs.results.get(rec.task_id, [])
                rec.final_status = status_name(revisions[-1].status) if revisions else rec.status
                # a plan generated whole (DONE) may still be preempted on the robot by an urgent task: its result
                # is then revised CANCELLED on /plan_results, and the robot ran a prefix of it
                whole = rec.final_status == TaskStatus.DONE
                rec.exactly_once_in_order = rec.n_segments > 0 and ran == list(range(len(ran))) and (
                    len(ran) == rec.n_segments if whole else len(ran) <= rec.n_segments)
                rec.on_plan_results = len(obs.results.get(rec.task_id, ()))
        extra = {"goals_poisson": args.goals, "goals_burst": args.burst, "duration_s": args.duration,
                 "wall_s": wall_s, "send_s": send_s, "client_stats": dict(pc.stats),
                 "robot_topic_copies": sum(obs.topic_copies.values()),
                 "robot_topic_segments": len(obs.topic_copies)}
        summary = summarize(recs, rss, extra)
        rows = table_rows(summary)
        print_table(rows, f"fleet-load: {args.robots} simulated robots, {len(recs)} goals "
                          f"(planner: simulated engine, real time; fleet time_scale {args.time_scale:g})")
        (out / "results.json").write_text(json.dumps(
            {"command": command, "config": cfg, "summary": summary, "goals": [asdict(r) for r in recs]},
            indent=1, default=_json_default))
        write_markdown(out / "results.md", rows, command, cfg)
        plot(out / "fleet_load.png", recs, t_start_wall)
        print(f"results in {out} (results.json, results.md, fleet_load.png; planner.log, sim_fleet.log)")
        return 0 if summary["lost"] == 0 else 1
    finally:
        if pc is not None:
            with contextlib.suppress(Exception):
                pc.destroy()
        if ex is not None:
            ex.shutdown(timeout_sec=5)
        if node is not None:
            with contextlib.suppress(Exception):
                node.destroy_node()
        if ctx is not None:
            with contextlib.suppress(Exception):
                rclpy.shutdown(context=ctx)
        if spin_thread is not None:
            spin_thread.join(timeout=5)
        for c in reversed(children):
            c.stop()


def _n_segments(h) -> int:
    """Segments of the task's result that a robot executes (end-of-plan markers are not)."""
    from timelyllm_ros.ros.topics import is_end_marker

    if h.result is None:
        return 0
    if h.source == "action":
        return sum(1 for s in h.result.segments if not is_end_marker(s.text, s.is_final))
    return len(h.segments) + len(h.missing) + len(h.undelivered)


def _json_default(x: Any) -> Any:
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, Counter):
        return dict(x)
    return str(x)


def _progress(total: int):
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc="goals done", unit="goal", file=sys.stderr, dynamic_ncols=True,
                    mininterval=0.5 if sys.stderr.isatty() else 5.0)
    except ImportError:  # pragma: no cover
        return None


def _update(bar, done: int, sent: int, total: int) -> None:
    if bar is None:
        return
    bar.set_postfix_str(f"sent {sent}/{total}, open {sent - done}", refresh=False)
    if done > bar.n:
        bar.update(done - bar.n)  # redraws at most every mininterval


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("fleet-load", help="planner + 50 simulated robots in real processes, 1000+ goals: "
                                          "delivery, loss and response times")
    p.add_argument("--goals", type=int, default=1000, help="Poisson-arriving goals over --duration")
    p.add_argument("--duration", type=float, default=100.0, help="seconds over which the goals arrive")
    p.add_argument("--burst", type=int, default=200, help="extra goals within one second in the middle")
    p.add_argument("--robots", type=int, default=50, help="simulated drones drone_0..drone_<n-1>")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-scale", type=float, default=0.05, help="the fleet's execution time scale")
    p.add_argument("--engine-config", default="engine_sim.yaml", help="the planner's engine YAML")
    p.add_argument("--robot-timeout", type=float, default=120.0, help="the planner's robot_timeout_s")
    p.add_argument("--goal-timeout", type=float, default=300.0, help="the client's timeout per goal, s")
    p.add_argument("--report-wait", type=float, default=30.0,
                   help="after the last result, wait at most this long for the robots' SegmentDone reports")
    p.add_argument("--domain-id", type=int, help="ROS_DOMAIN_ID (default: $ROS_DOMAIN_ID, else a random one)")
    p.set_defaults(fn=cmd_fleet_load, argv=None)
    return p


def cmd_fleet_load(args: argparse.Namespace) -> int:
    for name in ("goals", "burst"):
        if getattr(args, name) < 0:
            raise SystemExit(f"--{name} must be >= 0")
    if args.robots < 1 or not args.duration > 0 or not args.time_scale > 0:
        raise SystemExit("--robots must be >= 1, --duration and --time-scale > 0")
    return run(args)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="timelyllm-bench", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_parser(sub)
    args = ap.parse_args(["fleet-load", *(sys.argv[1:] if argv is None else argv)])
    return int(args.fn(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
