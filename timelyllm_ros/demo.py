"""The fleet demo (README's main command): a short LRTrace workload served by
the real stack — vLLM with the bundled model, the PUD scheduler (pud-shed), ROS 2
nodes — to a simulated drone fleet, with urgent tasks among normal ones.

    python -m timelyllm_ros.demo                     # pud-shed, then the same tasks under vLLM-style fcfs
    python -m timelyllm_ros.demo --compare ''        # pud-shed only
    python -m timelyllm_ros.demo --engine engine_sim.yaml   # no weights: the simulated engine

Prints every segment as the robot receives it, a progress bar, and at the end
the metrics table (utility per task type, response and robot waiting time),
writing results (markdown, CSV, JSON), a bar plot and a timeline per robot
(timeline.png: segments, deadlines, misses, one panel per policy) under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from timelyllm_ros.engines import openmp
from timelyllm_ros.measure import bound as bounds
from timelyllm_ros.measure import metrics
from timelyllm_ros.measure.records import SegRecord, TaskRecord
from timelyllm_ros.planner import telemetry
from timelyllm_ros.sim.workloads import Job, Workload, load_workload

console = Console(highlight=False, width=None if sys.stdout.isatty() else 130)
# The smallest stretch at which pud-shed meets issue 27's targets on this 2-CPU machine (urgent U/beta >= 0.8, normal
# >= 0.9 at the trace's own pace): x2 in 3 runs of 3 (bench/results/demo_cpu/session_ab/); x1 gives ~0.68 urgent.
CPU_TUF_SCALE = 2.0


@dataclass
class RunResult:
    policy: str
    records: list[TaskRecord]
    summary: list[metrics.Summary]
    wall_s: float
    decision_ms: dict[str, float]
    admission: str = ""
    latency_estimate: dict = field(default_factory=dict)  # the scheduler's step-time estimate at the end
    steps: list[tuple[int, int, int, float, float]] = field(default_factory=list)  # batch, prefill, kept, s, start
    calibration: Any = None  # what the planner's warm-up measured on the engine (planner/warmup.py Calibration)


def add_job_selection(ap: Any, events: int, per_event: int) -> None:
    """The options :func:`pick_jobs` takes (``--events``, ``--per-event``, ``--max-gap``), with these defaults."""
    ap.add_argument("--events", type=int, default=events,
                    help=f"how many arrival events of the trace to serve (default {events})")
    ap.add_argument("--per-event", type=int, default=per_event,
                    help=f"at most this many tasks of each event (default {per_event})")
    ap.add_argument("--max-gap", type=float, default=6.0, help="shorten idle gaps between events to this (s)")


def pick_jobs(workload: Workload, events: int, per_event: int, max_gap_s: float, tuf_scale: float = 1.0
              ) -> list[Job]:
    """The first ``per_event`` jobs of each of the first ``events`` events, with idle gaps
    between events shortened to ``max_gap_s`` (the trace waits up to a minute).

    ``tuf_scale`` stretches every TUF's time axis (ERT and cut-off; beta unchanged): an engine k
    times slower than the paper's GPU faces the same scheduling problem with deadlines k times
    longer."""
    groups: list[list[Job]] = []
    for j in workload.jobs:
        if groups and j.trigger_time - groups[-1][0].trigger_time < 0.5:
            groups[-1].append(j)
        elif len(groups) < events:
            groups.append([j])
        else:
            break
    out: list[Job] = []
    t_shift = 0.0
    prev_start = None
    for g in groups:
        start = g[0].trigger_time
        if prev_start is not None:
            t_shift += max(0.0, (start - prev_start) - max_gap_s)
        prev_start = start
        for j in g[:per_event]:
            beta, ert, cutoff = j.tuf
            # replace: the copy keeps every other field (robot_type / robot_system name the task type)
            out.append(replace(j, trigger_time=j.trigger_time - t_shift - groups[0][0].trigger_time,
                                           tuf=[beta, ert * tuf_scale, cutoff * tuf_scale]))
    return out


@contextmanager
def _spinning(nodes: list[Any], ctx: Any) -> Iterator[Any]:

    from timelyllm_ros.ros.spin import PooledExecutor, Spinner

    ex = PooledExecutor(num_threads=32, context=ctx)
    for n in nodes:
        ex.add_node(n)
    t = Spinner(ex, name="timelyllm-demo")
    t.start()
    try:
        yield ex
    finally:
        ex.shutdown(timeout_sec=5)
        t.join(timeout=5)


# Starts the robots of one run instead of the simulated fleet node: called with (robot ids, scene text per
# robot, parsed args, the run's rclpy context), returns a context manager. Set by developer tooling
# (devtools/tello_demo.py).
FLEET_HOOK: Callable[[list[str], dict[str, str], argparse.Namespace, Any], AbstractContextManager[Any]] | None = None


def run_policy(engine: Any, constrained: bool, policy: str, jobs: list[Job], args: argparse.Namespace,
               record: bool = True, mode: str = "workload", robot_ids: dict[int, str] | None = None) -> RunResult:
    """Serve ``jobs`` under ``policy`` through the ROS 2 stack on ``engine``. The planner's nodes run here; the
    robots (the simulated fleet and the client that sends their goals) in a process of their own at a lower
    priority (ros/robots_process.py), as robots on other machines would, unless ``args.robots_in_process`` or a
    FLEET_HOOK puts them here. ``mode="alone"``: each job alone (the bound's lone pass)."""
    import rclpy
    from rclpy.parameter import Parameter

    from timelyllm_ros.ros.exec_time_node import ExecTimeNode
    from timelyllm_ros.ros.planner_node import build_planner

    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    planner, sched = build_planner([Parameter("policy", value=policy), Parameter("admission", value=args.admission)],
                                   engine=engine, constrained=constrained, context=ctx)
    calibration = planner.core.calibration
    exec_time = ExecTimeNode(models=planner.core.hooks.exec_model, context=ctx)
    # every engine step of the run: batch, prefill tokens, kept tokens, seconds, its start (time.monotonic)
    steps: list[tuple[int, int, int, float, float]] = []
    engine_step = engine.step

    def logged_step() -> Any:
        t0 = time.monotonic()
        rep = engine_step()
        steps.append((rep.batch_size, rep.prefill_tokens, rep.new_tokens, rep.duration_s, t0))
        return rep

    progress = Progress(TextColumn(f"[bold]{policy if mode == 'workload' else 'alone':>12}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("tasks"), TimeElapsedColumn(), console=console,
                        transient=False)
    bar = progress.add_task(policy, total=len(jobs))
    nodes = [planner, sched, exec_time]
    bag = args.out_dir / f"bag_{policy}" if args.record and record else None
    engine.step = logged_step  # type: ignore[method-assign]
    try:
        with _spinning(nodes, ctx):
            console.rule(f"[bold]policy {policy}: {len(jobs)} tasks "
                         f"({sum(1 for j in jobs if j.tuf[0] > 1)} urgent)"
                         + (f", TUF time axis x{args.tuf_scale:g}" if args.tuf_scale != 1 else "")
                         + (", each alone (the bound)" if mode == "alone" else ""))
            if FLEET_HOOK is not None or args.robots_in_process:
                records, wall = _robots_here(ctx, jobs, args, progress, bar, bag, mode, robot_ids)
            else:
                records, wall = _robots_apart(jobs, args, progress, bar, bag, mode, robot_ids)
            decisions = metrics.decision_stats(telemetry.decision_log(planner.core))
            admission, estimate = planner.core.admission.name, planner.core.estimator.describe()
            planner.shutdown()
    finally:
        engine.step = engine_step  # type: ignore[method-assign]
        for n in nodes:
            n.destroy_node()
        rclpy.shutdown(context=ctx)
    engine.reset_prefix_cache()  # the next policy starts from the same (cold) cache
    return RunResult(policy, records, metrics.summarize(records), wall, decisions, admission, estimate, steps,
                     calibration)


def _show_segment(progress: Progress, t: float, robot: str, level: str, task_type: str, index: int,
                  text: str) -> None:
    urgent = "[red]URGENT[/red]" if level == "urgent" else "normal"
    progress.console.print(f"[dim]{t:7.3f}s[/dim]  {robot:<9} {urgent:<6} {task_type:<20} #{index} [cyan]{text}[/cyan]")


def _robots_apart(jobs: list[Job], args: argparse.Namespace, progress: Progress, bar: Any, bag: Path | None,
                  mode: str, robot_ids: dict[int, str] | None) -> tuple[list[TaskRecord], float]:
    """The robots in their own process (ros/robots_process.py); their events printed as they come."""
    from timelyllm_ros.ros.robots_process import RobotsProcess, RobotsSpec

    spec = RobotsSpec(jobs, speed=args.speed, mode=mode, fleet_time_scale=args.fleet_time_scale, seed=args.seed,
                      timeout_s=args.timeout, bag=str(bag or ""), robot_ids=dict(robot_ids or {}))
    done = 0
    t_start = time.monotonic()
    with RobotsProcess(spec) as robots, progress:
        for kind, ev in robots.events():
            if kind == "started":
                t_start = float(ev["t"])
            elif kind == "segment":
                _show_segment(progress, ev["t"], ev["robot"], ev["level"], ev["task_type"], ev["index"], ev["text"])
            elif kind == "done":
                done += 1
                progress.update(bar, completed=done)
                if ev["status"] != "done" and (mode == "workload" or ev["status"] != "cancelled"):
                    progress.console.print(f"[yellow]{ev['robot']} {ev['task_type']}: {ev['status']} "
                                           f"({ev['reason']})")
            elif kind == "warning":
                progress.console.print(f"[yellow]{ev['text']}")
            elif kind == "recorded":
                progress.console.print(f"recorded {ev['messages']} messages to {ev['bag']}")
        records = robots.records()
    return records, time.monotonic() - t_start


def _robots_here(ctx: Any, jobs: list[Job], args: argparse.Namespace, progress: Progress, bar: Any,
                 bag: Path | None, mode: str, robot_ids: dict[int, str] | None) -> tuple[list[TaskRecord], float]:
    """The robots in the planner's process (a FLEET_HOOK's emulated Tellos, or --robots-in-process)."""
    from rclpy.parameter import Parameter

    from timelyllm_ros.ros.sim_fleet_node import SimFleetNode
    from timelyllm_ros.ros.workload_client import WorkloadClient, robot_id_of, robot_type_of

    ids = dict(robot_ids or {})
    robots = sorted({ids.get(j.job_id) or robot_id_of(j) for j in jobs})
    stack = ExitStack()
    if FLEET_HOOK is not None:  # other robots than the simulated fleet (devtools/tello_demo.py: emulated Tellos)
        stack.enter_context(FLEET_HOOK(robots, {ids.get(j.job_id) or robot_id_of(j): j.task_input for j in jobs},
                                       args, ctx))
        fleet_nodes = []
    else:
        by_type: dict[str, set[str]] = {}
        for j in jobs:
            by_type.setdefault(robot_type_of(j), set()).add(ids.get(j.job_id) or robot_id_of(j))
        fleet_nodes = [SimFleetNode("sim_fleet" if len(by_type) == 1 else f"sim_fleet_{rt}", context=ctx,
                                    parameter_overrides=[
                                        Parameter("robots", value=sorted(r)), Parameter("robot_type", value=rt),
                                        Parameter("time_scale", value=args.fleet_time_scale),
                                        Parameter("seed", value=args.seed)])
                       for rt, r in sorted(by_type.items())]
    done = [0]
    t_start = [time.monotonic()]

    def show(rec: TaskRecord, seg: SegRecord) -> None:
        _show_segment(progress, time.monotonic() - t_start[0], robot_label(rec), rec.level, rec.task_type,
                      seg.index, seg.text)

    def task_done(rec: TaskRecord) -> None:
        done[0] += 1
        progress.update(bar, completed=done[0])
        if not rec.done and mode == "workload":
            progress.console.print(f"[yellow]{robot_label(rec)} {rec.task_type}: {rec.status} ({rec.reason})")

    client = WorkloadClient(jobs, speed=args.speed, on_segment=show, on_done=task_done, context=ctx, robot_ids=ids)
    nodes = [*fleet_nodes, client]
    recorder = None
    try:
        with _spinning(nodes, ctx):
            if not client.wait_for_planner(60):
                raise RuntimeError("the planner's action server never came up")
            if bag is not None:  # one bag per run: requests, segments, robot reports, results, telemetry
                from timelyllm_ros.ros.recorder_node import start_recorder

                recorder = start_recorder(ctx, bag)
            t_start[0] = time.monotonic()
            with progress:
                records = client.run_alone(args.timeout) if mode == "alone" else client.run(timeout=args.timeout)
                if not client.wait_for_reports(timeout=60):
                    console.print("[yellow]some robots did not report every segment in time")
            wall = time.monotonic() - t_start[0]
            if recorder is not None:
                n_msgs = sum(recorder.counts.values())
                console.print(f"recorded {n_msgs} messages to {recorder.stop()}")
    finally:
        for n in nodes:
            n.destroy_node()
        stack.close()  # a fleet on this context goes before the context
    return records, wall


LONE_ROUNDS = 2  # each distinct task is served alone this many times for the bound (the median is kept)


def measure_bound(engine: Any, constrained: bool, policy: str, jobs: list[Job], args: argparse.Namespace
                  ) -> dict[int, float]:
    """Job id -> its utility under the bound of this run (measure/bound.py): every distinct task served alone
    through the same stack, LONE_ROUNDS times, each on a robot of its own (no task waits for a robot)."""
    from timelyllm_ros.ros.workload_client import robot_type_of

    texts = list(dict.fromkeys(j.task_input for j in jobs))
    first = {j.task_input: j for j in reversed(jobs)}
    lone_jobs, robot_ids, text_of = [], {}, {}
    base = max(j.job_id for j in jobs) + 1
    for _ in range(LONE_ROUNDS):
        for t in texts:
            k = base + len(lone_jobs)
            j = replace(first[t], job_id=k, trigger_time=0.0)
            lone_jobs.append(j)
            robot_ids[k] = f"{robot_type_of(j)}_lone{k}"
            text_of[k] = t
    res = run_policy(engine, constrained, policy, lone_jobs, args, record=False, mode="alone", robot_ids=robot_ids)
    lone = bounds.lone_times((text_of[r.job_id], r) for r in res.records)
    console.print("first segment alone (s): " + ", ".join(
        f"{first[t].task_input.split('Task: ')[-1][:24]!r} {v:.3f}" for t, v in lone.items()))
    return bounds.serial_bound(jobs, lone, speed=args.speed)


def _step_ratios(r: RunResult) -> tuple[tuple[float, int], tuple[float, int]]:
    """The run's decode and prefill steps against the bare engine's, as the warm-up measured it in this run."""
    cal = r.calibration
    if cal is None:
        return (float("nan"), 0), (float("nan"), 0)
    return (bounds.step_ratio(r.steps, cal.decode_step_s),
            bounds.prefill_step_ratio(r.steps, cal.decode_step_s, cal.decode_s.get(1, float("nan")),
                                      cal.prefill_step_s, cal.prefill_s_per_token))


def print_shares(results: list[RunResult], bound: dict[int, float]) -> None:
    """Each policy's utility beside the bound of this run, and its engine steps beside the bare engine's."""
    t = Table(title="Against what this machine allows in this run (the bound: each task's first segment served "
                    "alone, a burst's goals one after another; measure/bound.py)")
    for col in ("policy", "level", "n", "U (sum)", "bound (sum)", "share of bound", "decode step / bare",
                "prefill step / bare"):
        t.add_column(col, justify="left" if col in ("policy", "level") else "right")
    for r in results:
        (ratio, n), (pratio, pn) = _step_ratios(r)
        for row in bounds.shares(r.records, bound):
            t.add_row(r.policy, row.level, str(row.n), f"{row.utility:.2f}", f"{row.bound:.2f}", f"{row.share:.3f}",
                      f"{ratio:.2f} ({n} steps)" if row.level == "all" else "",
                      f"{pratio:.2f} ({pn} steps)" if row.level == "all" else "")
        t.add_section()
    console.print(t)


def default_tuf_scale(engine: Any) -> float:
    """1 for the simulated engine or a GPU; CPU_TUF_SCALE for a real engine on a CPU."""
    return 1.0 if engine.info.needs_plan_text or _has_cuda() else CPU_TUF_SCALE


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def robot_label(rec: TaskRecord) -> str:
    return f"{rec.robot_type}_{rec.agent_id}"


def print_table(results: list[RunResult]) -> None:
    t = Table(title="Per task type (utility U = TUF_0(response time); U/beta normalised; times in s)",
              caption=metrics.LEGEND)
    for col in ("policy", "task type", "n", "U", "U/beta", "U/beta all", "resp mean", "resp p95", "robot wait",
                "miss", "not done"):
        t.add_column(col, justify="left" if col in ("policy", "task type") else "right")
    for r in results:
        for s in r.summary:
            style = "bold" if s.group.startswith("all") else None
            f = metrics.fmt
            t.add_row(r.policy, s.group, str(s.n), f(s.utility), f(s.utility_norm), f(s.utility_norm_all),
                      f(s.response_mean), f(s.response_p95), f(s.waiting_mean), f"{s.miss_rate:.0%}",
                      metrics.not_done_text(s), style=style)
        t.add_section()
    console.print(t)


def write_results(results: list[RunResult], out: Path, args: argparse.Namespace,
                  bound: dict[int, float] | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    rows, bound_rows = [], []
    md = [f"# Fleet demo ({time.strftime('%Y-%m-%d %H:%M:%S')})", "",
          f"Command: `{' '.join(['python -m timelyllm_ros.demo', *args.argv])}`", "",
          "Times are the robots' view: arrival = when the robot sent the goal, response = until the robot "
          "started the first segment. `timelyllm bags metrics <bag>` measures from the planner's receive "
          "stamp instead, so its response times are shorter by the goal's transit time.", "",
          f"TUF time axis scaled by {args.tuf_scale:g} (ERT and cut-off; 1 = the paper's TUFs).", "",
          f"OpenMP runtime of the engine's CPU kernels: {openmp.runtime()} (timelyllm_ros/engines/openmp.py).", "",
          "Simulated robots: " + ("in the planner's process." if args.robots_in_process or FLEET_HOOK is not None
                                  else "robots: a process of their own at a lower priority "
                                       "(timelyllm_ros/ros/robots_process.py), as robots on other machines."), ""]
    for r in results:
        rows += metrics.summary_dicts(r.summary, policy=r.policy, admission=r.admission)
        est = r.latency_estimate
        md += [f"## {r.policy} (admission {r.admission}; wall {r.wall_s:.1f} s; decision time mean "
               f"{r.decision_ms['mean_ms']:.3f} ms, p99 {r.decision_ms['p99_ms']:.3f} ms over "
               f"{r.decision_ms['decisions']} decisions)", "",
               f"Step-time estimate at the end (seeded from {est.get('seed')}): decode "
               f"{est.get('decode_ms_b1', float('nan')):.1f} ms/step at batch 1, prefill "
               f"{est.get('prefill_ms_per_token', float('nan')):.3f} ms/token "
               f"({est.get('decode_samples')} decode and {est.get('prefill_samples')} prefill steps kept).", "",
               metrics.to_markdown(r.summary)]
        cal = r.calibration
        if cal is not None:
            (ratio, n), (pratio, pn) = _step_ratios(r)
            md += ["", "Measured on the engine at the planner's warm-up (planner/warmup.py): " + ", ".join(
                f"{k} {v:.1f}" for k, v in cal.describe().items()) + f". A decode step inside this run cost "
                f"{ratio:.2f}x the warm-up's at the same batch size (median over {n} decode steps); a step that "
                f"prefilled, {pratio:.2f}x the warm-up's model of it (its batch's decode, the fixed cost and each "
                f"prompt token; median over {pn} steps)."]
        if bound:
            md += ["", "| level | n | U (sum) | bound (sum) | share of bound |", "|---|---|---|---|---|"]
            md += [f"| {x.level} | {x.n} | {x.utility:.2f} | {x.bound:.2f} | {x.share:.3f} |"
                   for x in bounds.shares(r.records, bound)]
            bound_rows += [{"policy": r.policy, "level": x.level, "n": x.n, "utility_sum": x.utility,
                            "bound_sum": x.bound, "share": x.share} for x in bounds.shares(r.records, bound)]
    if bound:
        md += ["", "The bound: each task's first segment served alone through the same stack in this run "
               f"({LONE_ROUNDS} times, the median), a burst's goals one after another, earliest deadline first "
               "(timelyllm_ros/measure/bound.py). A policy can beat it where goals share a prompt."]
    (out / "results.md").write_text("\n".join(md))
    metrics.write_csv(out / "results.csv", rows)
    if bound_rows:
        metrics.write_csv(out / "bound.csv", bound_rows)
    # Every engine step, on the robots' clock (CLOCK_MONOTONIC is one clock for every process on the machine):
    # set beside records.json, it shows which prompts shared which step and how long each step took.
    metrics.write_csv(out / "steps.csv", [
        {"policy": r.policy, "start": f"{t0:.4f}", "duration_s": s, "batch": b, "prefill_tokens": p, "kept_tokens": k}
        for r in results for b, p, k, s, t0 in r.steps])
    (out / "records.json").write_text(json.dumps(
        {r.policy: [_record_dict(x) for x in r.records] for r in results}, indent=1, default=str))
    groups = [s.group for s in results[0].summary]
    png = out / "utility_per_task_type.png"
    metrics.bar_plot(png, groups, {r.policy: [s.utility_norm for s in r.summary] for r in results},
                     "mean utility / beta", "Fleet demo: time utility per task type (1 = answered within ERT)",
                     hline=1.0)
    metrics.timeline_plot(out / "timeline.png", {r.policy: r.records for r in results},
                          f"Fleet demo: what each robot did, per policy (TUF x{args.tuf_scale:g})")
    metrics.bar_plot(out / "response_time.png", groups,
                     {r.policy: [s.response_mean for s in r.summary] for r in results},
                     "mean response time (s)", "Fleet demo: response time (arrival -> first action)")
    return png


def _record_dict(r: TaskRecord) -> dict:
    d = {k: getattr(r, k) for k in ("job_id", "trace_id", "task_type", "level", "agent_id", "status", "reason",
                                     "plan")}
    d.update(response_time=r.response_time, utility=r.utility(), robot_waiting=r.robot_waiting,
             completion_time=r.completion_time, segments=[vars(s) for s in r.segments])
    return d


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="timelyllm demo", description=__doc__.splitlines()[0])
    from timelyllm_ros.planner.policies import DEFAULT_POLICY

    ap.add_argument("--policy", default=DEFAULT_POLICY, help=f"scheduling policy (default {DEFAULT_POLICY})")
    ap.add_argument("--compare", default="fcfs",
                    help="also run these policies on the same workload, comma-separated (default fcfs: vLLM's "
                         "first-come first-served; '' for none; e.g. fcfs,fcfs-stream,edf-seg)")
    ap.add_argument("--engine", default="engine_vllm_cpu.yaml", help="engine YAML (name in config/ or path)")
    ap.add_argument("--workload", default="wid2",
                    help="LRTrace workload: wid2 (real drone trace), wid1/wid3 (generated), a trace name under "
                    "data/lrtrace (drone-wid2, robotarm-fltrnn), or a path")
    add_job_selection(ap, events=3, per_event=10)
    ap.add_argument("--speed", type=float, default=3.0,
                    help="arrival-time speed-up factor (default 3: this CPU engine serves the trace's own pace with "
                         "every policy on time, bench/results/real_policies_nominal)")
    ap.add_argument("--tuf-scale", type=float, default=None,
                    help="stretch every TUF's ERT and cut-off by this factor (the paper's TUFs assume a GPU; "
                         "a CPU engine k times slower faces the same problem with deadlines k times longer). "
                         f"Default: {CPU_TUF_SCALE:g} for a real engine on a CPU (the least at which pud-shed met "
                         "the urgent and normal targets on a 2-CPU machine, bench/results/demo_cpu/session_ab), 1 "
                         "for the simulated engine or a GPU")
    ap.add_argument("--fleet-time-scale", type=float, default=1.0, help="robot execution time factor")
    ap.add_argument("--admission", default="auto",
                    help="'auto' (latency-guided for segmented policies, vLLM's cap of 256 for fcfs and "
                         "fcfs-stream, as in the simulator), 'latency', 'adaptive-tuf' (weighing the TUFs of "
                         "simultaneous first segments) or a fixed batch cap")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--out", default="", help="results folder (default out/demo/<time>)")
    ap.add_argument("--no-warmup-pass", dest="warmup_pass", action="store_false",
                    help="when comparing policies, skip the unmeasured first pass of the workload")
    ap.add_argument("--no-record", dest="record", action="store_false",
                    help="do not record a rosbag2 (MCAP) bag of each run into the results folder")
    ap.add_argument("--no-bound", dest="bound", action="store_false",
                    help="skip the lone pass (each task served alone) the results are set beside")
    ap.add_argument("--robots-in-process", action="store_true",
                    help="run the simulated robots in the planner's process (by default they run in a process of "
                         "their own at a lower priority, as robots on other machines would)")
    args = ap.parse_args(argv)
    args.argv = argv

    policies = [args.policy] + [p for p in args.compare.split(",") if p]
    from timelyllm_ros.planner.policies import POLICIES

    bad = [p for p in policies if p not in POLICIES]
    if bad:
        ap.error(f"unknown policy {bad}; known: {', '.join(POLICIES)}")
    if args.tuf_scale is not None and not args.tuf_scale > 0:
        ap.error("--tuf-scale must be > 0")
    out = Path(args.out or Path("out") / "demo" / time.strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    args.out_dir = out
    taken = [str(out / f"bag_{p}") for p in policies if args.record and (out / f"bag_{p}").exists()]
    if taken:  # found now, not after the engine has loaded and a policy has run
        ap.error(f"--out: a bag is already there ({', '.join(taken)}): choose another folder, remove it, "
                 "or pass --no-record")

    from timelyllm_ros.engines.factory import planner_engine

    with console.status(f"loading the engine ({args.engine}) ..."):
        t0 = time.monotonic()
        engine, constrained = planner_engine(args.engine)
    console.print(f"engine {engine.info.name} ({engine.info.model}) loaded in {time.monotonic() - t0:.1f} s; "
                  f"OpenMP runtime: {openmp.runtime()}")
    if args.tuf_scale is None:
        args.tuf_scale = default_tuf_scale(engine)
    if args.tuf_scale != 1:
        console.print(f"TUF time axis x{args.tuf_scale:g} (ERT and cut-off; the paper's TUFs assume a GPU engine; "
                      "--tuf-scale 1 for the paper's)")
    jobs = pick_jobs(load_workload(args.workload, args.seed), args.events, args.per_event, args.max_gap,
                     args.tuf_scale)
    if not jobs:
        ap.error("the workload selection is empty")
    results = []
    bound: dict[int, float] = {}
    try:
        if len(policies) > 1 and args.warmup_pass:
            # Whichever policy runs first would otherwise also pay for the engine's first bursts.
            console.rule("[dim]warm-up pass (not measured)")
            run_policy(engine, constrained, policies[0], jobs, args, record=False)
        if args.bound:
            bound = measure_bound(engine, constrained, policies[0], jobs, args)
        for p in policies:
            results.append(run_policy(engine, constrained, p, jobs, args))
    finally:
        engine.close()
    print_table(results)
    if bound:
        print_shares(results, bound)
    png = write_results(results, out, args, bound)
    if len(results) > 1:
        for grp in ("all urgent", "all normal"):
            vals = [({x.group: x for x in r.summary}.get(grp), r.policy) for r in results]
            console.print(f"{grp} U/beta (served | all tasks): "
                          + ", ".join(f"{p} {s.utility_norm:.3f} | {s.utility_norm_all:.3f}" for s, p in vals if s))
    console.print(f"results: {out / 'results.md'}\nplots: {png}, {out / 'timeline.png'} (what each robot did)")
    return 0


if __name__ == "__main__":
    openmp.reexec_with_intel_openmp()  # the engine steps on a thread of its own: see engines/openmp.py
    sys.exit(main())
