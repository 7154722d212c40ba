"""``timelyllm-bench``: policy comparisons in simulation and scheduler overhead.

    timelyllm-bench sim --workload wid2 --policies fcfs,fcfs-stream,fcfs-seg,edf-seg,pud
    timelyllm-bench sim --workload wid2 --policies fcfs-seg,edf-seg,pud --admission adaptive,adaptive-cutoff
    timelyllm-bench figures            # paper Figs. 5, 7, 8, 9 under bench/results/
    timelyllm-bench overhead           # decision time at queue lengths 1 .. 10000
    timelyllm-bench load-sweep         # utility vs load factor and burst size, pud-shed / pud / edf-seg / fcfs
    timelyllm-bench diagnose --workload wid2   # PUD vs EDF: ordering vs admission; urgent-only bound
    timelyllm-bench pool               # one vLLM server vs a pool of two vs in-process; 1-8 GPU servers projected
    timelyllm-bench fleet-load         # planner + 50 simulated robots (processes), 1200 goals: nothing lost
    timelyllm-bench plan-quality --label after   # real engine: valid / acceptable plans per task template
    timelyllm-bench robot-memory       # planner memory vs 10,000 distinct robot ids, with / without idle release
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import print_table, progress, results_root, run_policy
from timelyllm_ros.measure import metrics
from timelyllm_ros.sim.simulator import SimResult
from timelyllm_ros.sim.workloads import Workload, load_workload

DEFAULT_POLICIES = "fcfs,fcfs-stream,fcfs-seg,edf-seg,pud"


def _label(r: SimResult) -> str:
    return f"{r.policy}" + (f"@{r.admission}" if r.admission not in ("adaptive", "cap256") else "")


def side_by_side(results: Sequence[SimResult]) -> tuple[list[str], list[list[str]]]:
    summaries = [metrics.summarize(r.records) for r in results]
    header = ["task"] + [f"{_label(r)} U/b | U/b all | resp" for r in results]
    rows = []
    for i, row in enumerate(summaries[0]):
        cells = [row.group]
        for s in summaries:
            x = s[i]
            cells.append(f"{metrics.fmt(x.utility_norm, '+.3f')} | {metrics.fmt(x.utility_norm_all, '+.3f')} | "
                         f"{metrics.fmt(x.response_mean, '.3f', 's')}")
        rows.append(cells)
    rows.append(["not done"] + [metrics.not_done_text(s[-1]) for s in summaries])  # the overall row's statuses
    return header, rows


def save_results(out: Path, results: Sequence[SimResult], wl: Workload, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows, md = [], [f"# {wl.name}\n", f"Command: `{command}`\n"]
    js: dict[str, Any] = {"workload": wl.name, "jobs": len(wl.jobs), "command": command, "runs": []}
    for r in results:
        summ = metrics.summarize(r.records)
        rows += metrics.summary_dicts(summ, policy=r.policy, admission=r.admission)
        dec = metrics.decision_stats(r.decision_times_s)
        md.append(f"\n## {r.policy} (admission {r.admission})\n\n")
        md.append(metrics.to_markdown(summ))
        md.append(f"\nsimulated {r.sim_time_s:.1f} s in {r.wall_time_s:.2f} s wall ({r.speedup:.0f}x real time); "
                  f"decision time mean {dec['mean_ms']:.4f} ms, p99 {dec['p99_ms']:.4f} ms over "
                  f"{dec['decisions']} decisions; {r.engine_steps} engine steps, "
                  f"{r.prefill_tokens} prefill tokens\n")
        js["runs"].append({"policy": r.policy, "admission": r.admission, "speedup": r.speedup,
                           "sim_time_s": r.sim_time_s, "wall_time_s": r.wall_time_s, "decision": dec,
                           "summary": metrics.summary_dicts(summ)})
    metrics.write_csv(out / "summary.csv", rows)
    (out / "summary.md").write_text("".join(md))
    (out / "results.json").write_text(json.dumps(js, indent=1, default=lambda x: None if x != x else x))
    groups = [s.group for s in metrics.summarize(results[0].records)]
    for field, ylabel in (("utility_norm", "mean utility / beta"), ("response_mean", "mean response time (s)"),
                          ("waiting_mean", "mean robot waiting time (s)")):
        series = {_label(r): [getattr(x, field) for x in metrics.summarize(r.records)] for r in results}
        metrics.bar_plot(out / f"{field}.png", groups, series, ylabel, f"{wl.name}: {ylabel}")


def cmd_sim(args: argparse.Namespace) -> int:
    wl = load_workload(args.workload, seed=args.seed)
    runs = [(p, a) for a in str(args.admission).split(",") for p in args.policies.split(",")]
    results = [run_policy(wl, p, a, args) for p, a in progress(runs, "policies")]
    header, rows = side_by_side(results)
    print_table(f"{wl.name}: {len(wl.jobs)} tasks (mean utility/beta of served tasks | of all tasks, a task not "
                f"done counting 0 | mean response of served tasks)", header, rows)
    for r in results:
        print(f"  {_label(r):<32} {r.speedup:7.0f}x real time, decision "
              f"{metrics.decision_stats(r.decision_times_s)['mean_ms']:.4f} ms mean")
    name = args.name or f"{args.workload}-sim"
    out = Path(args.out) if args.out else results_root() / name
    save_results(out, results, wl, " ".join(["timelyllm-bench", *sys.argv[1:]]))
    print(f"results in {out}")
    return 0


# -- figures -------------------------------------------------------------------
def _series(results: dict[str, SimResult], field: str) -> tuple[list[str], dict[str, list[float]]]:
    summ = {k: metrics.summarize(r.records) for k, r in results.items()}
    first = next(iter(summ.values()))
    return [s.group for s in first], {k: [getattr(x, field) for x in v] for k, v in summ.items()}


def cmd_figures(args: argparse.Namespace) -> int:
    root = Path(args.out) if args.out else results_root()
    root.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) if args.only else {"fig5", "fig7", "fig8", "fig9"}
    notes: list[str] = []
    cmd = " ".join(["timelyllm-bench", *sys.argv[1:]])
    if "fig5" in only:
        for load, wname in (("low", "wid1"), ("high", "wid2")):
            wl = load_workload(wname, seed=args.seed)
            res = {p: run_policy(wl, p, None, args) for p in progress(["fcfs", "fcfs-stream", "pud"], f"fig5 {load}")}
            groups, _ = _series(res, "utility_norm")
            for field, yl in (("utility_norm", "utility / beta"), ("response_mean", "response time (s)"),
                              ("waiting_mean", "robot waiting time (s)")):
                _, ser = _series(res, field)
                metrics.bar_plot(root / f"fig5_{load}_{field}.png", groups, ser, yl,
                                 f"Fig. 5 ({load} load, {wl.name}): {yl}")
            save_results(root / f"fig5_{load}", list(res.values()), wl, cmd)
        notes.append("fig5_*: vLLM (fcfs), vLLM-stream (fcfs-stream) and TimelyLLM (pud) per task type; "
                     "low load = generated WID 1, high load = the WID 2 trace")
    if "fig7" in only:
        wl = load_workload("wid2", seed=args.seed)
        caps = [1, 2, 4, 6, 8, 10, 12, 14, 16]
        ser: dict[str, list[float]] = {"vLLM (fcfs)": [], "TimelyLLM (pud)": []}
        for c in progress(caps, "fig7 caps"):
            for key, pol in (("vLLM (fcfs)", "fcfs"), ("TimelyLLM (pud)", "pud")):
                r = run_policy(wl, pol, c, args)
                ser[key].append(metrics.summarize(r.records)[-1].utility_norm)
        adaptive = metrics.summarize(run_policy(wl, "pud", "adaptive", args).records)[-1].utility_norm
        metrics.line_plot(root / "fig7_batch_caps.png", caps, ser, "batch cap", "mean utility / beta (all tasks)",
                          "Fig. 7: fixed batch caps vs latency-guided admission (WID 2)",
                          hlines={"TimelyLLM adaptive": adaptive})
        (root / "fig7_batch_caps.json").write_text(json.dumps({"caps": caps, **ser, "pud_adaptive": adaptive},
                                                              indent=1))
        notes.append("fig7_batch_caps: overall utility/beta vs fixed batch cap, fcfs and pud, with adaptive pud")
    if "fig8" in only:
        wl = load_workload("wid2", seed=args.seed)
        res = {p: run_policy(wl, p, None, args) for p in progress(["fcfs-seg", "edf-seg", "pud"], "fig8")}
        groups, ser = _series(res, "utility_norm")
        metrics.bar_plot(root / "fig8_policies.png", groups, ser, "utility / beta",
                         "Fig. 8: segmented FCFS / EDF / PUD (WID 2)")
        save_results(root / "fig8", list(res.values()), wl, cmd)
        notes.append("fig8_policies: fcfs-seg, edf-seg, pud on WID 2, same admission (adaptive)")
    if "fig9" in only:
        wl = load_workload("wid3", seed=args.seed)
        res = {p: run_policy(wl, p, None, args) for p in progress(["fcfs", "fcfs-stream", "pud"], "fig9")}
        for field, yl in (("utility_norm", "utility / beta"), ("waiting_mean", "robot waiting time (s)")):
            groups, ser = _series(res, field)
            metrics.bar_plot(root / f"fig9_arm_{field}.png", groups, ser, yl, f"Fig. 9: robot arm (WID 3): {yl}")
        save_results(root / "fig9", list(res.values()), wl, cmd)
        notes.append("fig9_arm_*: robot-arm tasks (generated WID 3), fcfs / fcfs-stream / pud")
    (root / "figures_last_run.txt").write_text(f"{cmd}\n" + "\n".join(notes) + "\n")
    print("\n".join(notes))
    print(f"figures in {root}")
    return 0


# -- overhead ------------------------------------------------------------------
def measure_overhead(n: int, policy: str, reps: int, seed: int = 0) -> dict[str, float]:
    """Time one scheduling decision (recompute every priority, pick the batch) with ``n`` queued."""
    from timelyllm_ros.domain.clock import SimClock
    from timelyllm_ros.domain.tuf import LEVELS
    from timelyllm_ros.domain.types import TaskSpec
    from timelyllm_ros.engines.sim_engine import SimEngine
    from timelyllm_ros.planner.core import PlannerCore
    from timelyllm_ros.planner.policies import make_policy

    rng = random.Random(seed)
    clock = SimClock(100.0)
    core = PlannerCore(SimEngine(), make_policy(policy), clock)
    for i in range(n):
        lvl = LEVELS["urgent" if rng.random() < 0.4 else "normal"]
        tid = core.submit(TaskSpec(robot_id=f"r{i}", prompt="x", tuf=lvl, arrival=100.0 - rng.random() * 2,
                                   prompt_token_ids=[1] * 64, extra={"plan_text": "tc(30);"}))
        if rng.random() < 0.5:  # half of them: suspended generations resuming a later segment
            g = core.generation(tid)
            assert g is not None  # just submitted, nothing ran: still queued
            g.k, g.prev_end = 1 + rng.randrange(3), 100.0 + rng.random()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        core.queue.best(core.policy, clock.now(), core.estimator, 4)
        times.append(time.perf_counter() - t0)
    ms = sorted(t * 1e3 for t in times)
    return {"n": n, "policy": policy, "median_ms": statistics.median(ms), "p99_ms": ms[int(0.99 * (len(ms) - 1))],
            "mean_ms": statistics.fmean(ms)}


def cmd_overhead(args: argparse.Namespace) -> int:
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = []
    for pol in args.policies.split(","):
        for n in sizes:
            reps = max(20, min(2000, 200000 // max(1, n)))
            rows.append(measure_overhead(n, pol, reps))
    header = ["policy", "queued", "median ms", "p99 ms", "mean ms"]
    print_table(f"scheduler decision time ({platform.processor() or platform.machine()}, "
                f"Python {platform.python_version()})", header,
                [[r["policy"], str(r["n"]), f"{r['median_ms']:.4f}", f"{r['p99_ms']:.4f}", f"{r['mean_ms']:.4f}"]
                 for r in rows])
    out = Path(args.out) if args.out else results_root() / "overhead"
    out.mkdir(parents=True, exist_ok=True)
    metrics.write_csv(out / "overhead.csv", rows)
    metrics.line_plot(out / "overhead.png", sizes,
                      {p: [r["median_ms"] for r in rows if r["policy"] == p] for p in args.policies.split(",")},
                      "queued generations", "decision time (ms, median)", "Scheduler decision time",
                      hlines={"0.1 ms target (8 queued)": 0.1, "2 ms target (1000 queued)": 2.0})
    (out / "README.md").write_text(f"Command: `timelyllm-bench {' '.join(sys.argv[1:])}`\n\n"
                                   + "| policy | queued | median ms | p99 ms |\n|---|---|---|---|\n"
                                   + "".join(f"| {r['policy']} | {r['n']} | {r['median_ms']:.4f} | "
                                             f"{r['p99_ms']:.4f} |\n" for r in rows))
    print(f"results in {out}")
    return 0


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from bench.diagnose import cmd_diagnose

    return cmd_diagnose(args)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="timelyllm-bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--seed", type=int, default=0, help="RNG seed (workload generation, robot sampling)")
        p.add_argument("--out", help="output folder (default bench/results/<name>)")
        p.add_argument("--context-tokens", type=int, default=150,
                       help="per-task prompt tokens that miss the prefix cache (of 2884)")
        p.add_argument("--resume-lead", type=float, default=0.05, help="resume lead margin (s)")
        p.add_argument("--engine-config", help="YAML with sim_engine: parameters (SimEngineConfig)")

    p = sub.add_parser("sim", help="run policies on one workload and compare them")
    p.add_argument("--workload", default="wid2",
                   help="wid2 (real drone trace), wid1/wid3 (generated), a trace name under data/lrtrace "
                   "(drone-wid2, robotarm-fltrnn) or a trace folder")
    p.add_argument("--policies", default=DEFAULT_POLICIES)
    p.add_argument("--admission", default="auto",
                   help="auto | adaptive | adaptive-tuf | adaptive-ert | adaptive-cutoff | a fixed batch cap (e.g. 8); "
                        "a comma list runs every policy under each, side by side")
    p.add_argument("--name", help="results sub-folder name")
    common(p)
    p.set_defaults(fn=cmd_sim)

    p = sub.add_parser("figures", help="reproduce paper Figs. 5, 7, 8, 9 in simulation")
    p.add_argument("--only", help="comma list of fig5,fig7,fig8,fig9")
    common(p)
    p.set_defaults(fn=cmd_figures)

    p = sub.add_parser("diagnose", help="PUD vs EDF ordering/admission, urgent-only bound, urgent loss split")
    p.add_argument("--workload", default="wid2")
    common(p)
    p.set_defaults(fn=_cmd_diagnose)

    from bench.fleet_load import add_parser as add_fleet_load

    add_fleet_load(sub)  # fleet-load: real planner + simulated fleet processes under 1000+ goals

    from bench.flood import add_parser as add_flood

    add_flood(sub)  # flood: 10,000 robot ids' goals beside a real urgent goal, planner RSS (issue 39)

    from bench.fleet_key_cost import add_parser as add_fleet_key

    add_fleet_key(sub)  # fleet-key: the fleet key's cost per segment, ack and report (issue 39)

    from bench.plan_quality import add_parser as add_plan_quality

    add_plan_quality(sub)  # plan-quality: the real engine's plans judged per task template

    from bench.load_sweep import add_parser as add_load_sweep

    add_load_sweep(sub, common)  # load-sweep: utility vs load and burst size

    from bench.pool_bench import add_parser as add_pool

    add_pool(sub, common)  # pool: one vLLM server vs two vs in-process; projection for 1-8 GPU servers

    from bench.real_policies import add_parser as add_real_policies

    add_real_policies(sub)  # real-policies: the policies on the real engine, repeated, beside the simulator

    from bench.plan_lengths import add_parser as add_plan_lengths

    add_plan_lengths(sub)  # plan-lengths: plan lengths learned per task vs the per-robot-type estimate

    from bench.robot_memory import add_parser as add_robot_memory

    add_robot_memory(sub)  # robot-memory: planner memory vs distinct robot ids, with and without idle release

    p = sub.add_parser("overhead", help="scheduler decision time vs queue length")
    p.add_argument("--sizes", default="1,8,64,1000,10000")
    p.add_argument("--policies", default="pud,edf-seg,fcfs")
    p.add_argument("--out")
    p.set_defaults(fn=cmd_overhead)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the program itself: benchmarks run the engine as the planner does (engines/openmp.py)
        from timelyllm_ros.engines.openmp import reexec_with_intel_openmp

        reexec_with_intel_openmp()
    args = build_parser().parse_args(argv)
    return int(args.fn(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

_ = math  # keep the import for users extending the module
