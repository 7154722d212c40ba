"""``timelyllm-bench load-sweep``: utility per policy against load and burst size (issue 12, item 6).

    timelyllm-bench load-sweep                                  # WID 1, WID 2 (trace), WID 3; 3 seeds
    timelyllm-bench load-sweep --workloads wid2 --loads 1,3 --seeds 1 --bursts ""

Load factor f scales a workload's arrival rate f times. By default (``--scale fleet``) the fleet grows:
f times as many robots, each getting its tasks at the trace's own pace (:func:`scale_fleet`); with
``--scale rate`` every arrival time t becomes t / f, so the same tasks (the published WID 2 trace where
the workload is wid2) arrive f times as densely, each robot's too. The burst sweep
generates WID 2-like workloads (Table 3 arrivals at 0.25 events/s) with a different maximum number of
tasks per event. Every figure counts all tasks: U/beta all is TUF_0 / beta of a task that ended done
and 0 for one that did not (shed OVERDUE, failed, ...), see :mod:`timelyllm_ros.sim.metrics`. Repeats:
``--seeds`` simulator seeds per point (a generated workload is generated anew per seed; the trace is
the same, only robot sampling and prompt contexts change, unless ``--jitter-ms`` moves each of its events
a little per seed), reported as mean +- 95 % CI (Student t),
and the default policy's edge as the paired difference per seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.cli import _progress, _results_root, print_table, run_policy
from timelyllm_ros.sim import metrics
from timelyllm_ros.sim.workloads import SETTINGS, Workload, generate, load_workload

DEFAULT_LOADS = "0.5,0.75,1,1.5,2,2.5,3"
DEFAULT_BURSTS = "4,8,16,24,32,48"
DEFAULT_POLICIES = "pud-shed,pud,edf-seg,fcfs"
COMPARED = ("pud", "edf-seg")  # the policies the first one must never be worse than
LEVELS = ("urgent", "normal", "all")
Y_FLOOR = -1.5  # plots clip utility below this
# Student t, two-sided 95 %, by degrees of freedom (more than 30: normal).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        15: 2.131, 20: 2.086, 30: 2.042}


def t95(df: int) -> float:
    if df <= 0:
        return math.nan
    key = max(k for k in _T95 if k <= df) if df <= 30 else None
    return _T95[key] if key is not None else 1.96


def mean_ci(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % confidence interval (NaN with fewer than 2 values)."""
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return math.nan, math.nan
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, math.nan
    return m, t95(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))


def line_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares line y = intercept + slope * x (slope 0 when every x is the same)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def scale_load(wl: Workload, factor: float) -> Workload:
    """The same tasks arriving ``factor`` times as densely (every arrival time divided by it)."""
    if not factor > 0:
        raise ValueError(f"load factor must be > 0, got {factor}")
    jobs = [dataclasses.replace(j, trigger_time=j.trigger_time / factor) for j in wl.jobs]
    return Workload(f"{wl.name}-x{factor:g}", jobs, {**wl.config, "load_factor": factor})


def scale_fleet(wl: Workload, factor: float, seed: int = 0) -> Workload:
    """``factor`` times the fleet: each robot's own task stream as the trace has it, on ``factor`` times as
    many robots (whole copies of the fleet, then a seeded share of its robots for the fraction; below 1, that
    share alone). The arrival rate grows by ``factor`` as with :func:`scale_load`, but no robot gets its tasks
    faster: a robot runs one task at a time, so compressing its arrivals measures robots queueing behind
    their own plans (and preempting their own tasks), not the planner under load."""
    if not factor > 0:
        raise ValueError(f"load factor must be > 0, got {factor}")
    import random

    agents = sorted({j.agent_id for j in wl.jobs})
    stride = max(agents) + 1
    copies, frac = int(factor), factor - int(factor)
    extra = sorted(random.Random(f"fleet-{seed}-{factor}").sample(agents, round(frac * len(agents))))
    fleet = [(c, a) for c in range(copies) for a in agents] + [(copies, a) for a in extra]
    by_agent: dict[int, list] = {}
    for j in wl.jobs:
        by_agent.setdefault(j.agent_id, []).append(j)
    jobs = [dataclasses.replace(j, agent_id=a + c * stride) for c, a in fleet for j in by_agent[a]]
    jobs.sort(key=lambda j: (j.trigger_time, j.agent_id, j.job_id))
    jobs = [dataclasses.replace(j, job_id=i) for i, j in enumerate(jobs)]
    return Workload(f"{wl.name}-fleet{factor:g}", jobs, {**wl.config, "load_factor": factor, "load_scaling": "fleet"})


SCALINGS = {"fleet": scale_fleet, "rate": lambda wl, factor, seed=0: scale_load(wl, factor)}


SCALE_DOC = {"fleet": "f times as many robots, each at the trace's pace",
             "rate": "every arrival time divided by f, each robot's too"}


def add_scale_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scale", choices=sorted(SCALINGS), default="fleet",
                   help="how a load factor f is made: 'fleet' (default) f times as many robots, each at the "
                        "trace's pace; 'rate' every arrival time divided by f (each robot gets tasks f times as "
                        "fast and, one task at a time, queues behind its own plans)")


def jitter(wl: Workload, jitter_s: float, seed: int) -> Workload:
    """Every event of ``wl`` (the tasks released at one trigger time, 1 ms apart) moved by U(0, jitter_s),
    seeded: a fixed trace then gives a spread over seeds where only its exact timing changes."""
    if jitter_s <= 0:
        return wl
    import random

    rng = random.Random(f"jitter-{seed}")
    jobs, shift, last = [], 0.0, -math.inf
    for j in wl.jobs:  # sorted by arrival; a gap above 10 ms starts a new event
        if j.trigger_time - last > 0.01:
            shift = rng.uniform(0.0, jitter_s)
        last = j.trigger_time
        jobs.append(dataclasses.replace(j, trigger_time=j.trigger_time + shift))
    jobs.sort(key=lambda j: (j.trigger_time, j.job_id))
    return Workload(f"{wl.name}-j{seed}", jobs, wl.config)


def burst_workload(max_per_event: int, seed: int) -> Workload:
    """WID 2's settings (Table 3) with a different burst size: U[max/2, max] tasks per event."""
    st = dataclasses.replace(SETTINGS["wid2"], max_per_event=max_per_event)
    wl = generate(st, seed)
    return Workload(f"wid2-burst{max_per_event}-s{seed}", wl.jobs, wl.config)


def run_point(wl: Workload, policy: str, args: argparse.Namespace) -> dict[str, Any]:
    """One simulation: U/beta all per urgency level and overall, and how tasks ended."""
    res = run_policy(wl, policy, None, args)
    rows = {r.group: r for r in metrics.summarize(res.records)}
    out: dict[str, Any] = {"n": rows["all"].n, "statuses": rows["all"].statuses}
    for lvl in LEVELS:
        r = rows.get("all" if lvl == "all" else f"all {lvl}")
        out[lvl] = r.utility_norm_all if r is not None else math.nan
        out[f"n_{lvl}"] = r.n if r is not None else 0
        out[f"shed_{lvl}"] = r.statuses.get("overdue", 0) if r is not None else 0
    out["shed"] = rows["all"].statuses.get("overdue", 0)
    out["not_done"] = rows["all"].failed
    return out


def _truncate(wl: Workload, max_jobs: int | None) -> Workload:
    return wl if not max_jobs else Workload(wl.name, wl.jobs[:max_jobs], wl.config)


def sweep(kind: str, xs: Sequence[float], policies: Sequence[str], seeds: Sequence[int],
          make: Any, args: argparse.Namespace, desc: str) -> list[dict[str, Any]]:
    """For every x, policy and seed one run of ``make(x, seed)``; returns the aggregated points."""
    runs: dict[tuple[float, str], list[dict[str, Any]]] = {}
    todo = [(x, s) for x in xs for s in seeds]
    for x, s in _progress(todo, desc):
        wl = make(x, s)
        a = argparse.Namespace(**{**vars(args), "seed": s})
        for p in policies:
            runs.setdefault((x, p), []).append(run_point(wl, p, a))
    points = []
    for x in xs:
        for p in policies:
            rs = runs[(x, p)]
            pt: dict[str, Any] = {"sweep": kind, "x": x, "policy": p, "seeds": len(rs),
                                  "n": statistics.fmean(r["n"] for r in rs)}
            for lvl in LEVELS:
                pt[lvl], pt[f"{lvl}_ci"] = mean_ci([r[lvl] for r in rs])
                pt[f"n_{lvl}"] = statistics.fmean(r[f"n_{lvl}"] for r in rs)  # a generated workload varies by seed
                pt[f"shed_{lvl}"] = statistics.fmean(r[f"shed_{lvl}"] for r in rs)
            pt["shed"] = statistics.fmean(r["shed"] for r in rs)
            pt["not_done"] = statistics.fmean(r["not_done"] for r in rs)
            pt["per_seed"] = rs
            points.append(pt)
        base = policies[0]
        for other in COMPARED:
            if other == base or other not in policies:
                continue
            b = next(q for q in points if q["x"] == x and q["policy"] == base)
            o = next(q for q in points if q["x"] == x and q["policy"] == other)
            for lvl in LEVELS:  # paired by seed: same tasks, same robot sampling
                d = [u[lvl] - v[lvl] for u, v in zip(b["per_seed"], o["per_seed"], strict=True)]
                b[f"diff_{other}_{lvl}"], b[f"diff_{other}_{lvl}_ci"] = mean_ci(d)
    return points


def verdict(pt: dict[str, Any], other: str, lvl: str = "all") -> str:
    """'better' / 'worse' when the paired 95 % CI excludes 0, '=' when it holds 0 (or one seed: the sign)."""
    d, ci = pt.get(f"diff_{other}_{lvl}", math.nan), pt.get(f"diff_{other}_{lvl}_ci", math.nan)
    if math.isnan(d):
        return "-"
    if math.isnan(ci):
        ci = 0.0
    if abs(d) < 5e-4:
        return "="
    return "better" if d - ci > 0 else "worse" if d + ci < 0 else "="


def _cell(m: float, ci: float) -> str:
    if math.isnan(m):
        return "-"
    return f"{m:+.3f}" + ("" if math.isnan(ci) else f" ±{ci:.3f}")


def table(points: list[dict[str, Any]], policies: Sequence[str], xlabel: str) -> tuple[list[str], list[list[str]]]:
    header = [xlabel, "level"] + list(policies) + [f"{policies[0]} shed"] + [
        f"vs {o}" for o in COMPARED if o in policies and o != policies[0]]
    rows = []
    for x in sorted({p["x"] for p in points}):
        by = {p["policy"]: p for p in points if p["x"] == x}
        base = by[policies[0]]
        for lvl in LEVELS:
            if base[f"n_{lvl}"] == 0:
                continue
            rows.append([f"{x:g}", lvl] + [_cell(by[p][lvl], by[p][f"{lvl}_ci"]) for p in policies]
                        + [f"{base[f'shed_{lvl}']:.0f}/{base[f'n_{lvl}']:.0f}"]
                        + [f"{verdict(base, o, lvl)} ({_cell(base[f'diff_{o}_{lvl}'], base[f'diff_{o}_{lvl}_ci'])})"
                           for o in COMPARED if o in policies and o != policies[0]])
    return header, rows


def plot(path: Path, points: list[dict[str, Any]], policies: Sequence[str], xlabel: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [lvl for lvl in LEVELS if any(p[f"n_{lvl}"] for p in points)]
    fig, axes = plt.subplots(1, len(levels), figsize=(4.2 * len(levels), 3.6), squeeze=False)
    for ax, lvl in zip(axes[0], levels, strict=True):
        for pol in policies:
            ps = sorted((p for p in points if p["policy"] == pol), key=lambda p: p["x"])
            ax.errorbar([p["x"] for p in ps], [p[lvl] for p in ps],
                        yerr=[0 if math.isnan(p[f"{lvl}_ci"]) else p[f"{lvl}_ci"] for p in ps],
                        marker="o", ms=3, capsize=2, label=pol, lw=2 if pol == policies[0] else 1)
        low = min((p[lvl] for p in points if not math.isnan(p[lvl])), default=0.0)
        if low < Y_FLOOR:  # a collapse to -28 would flatten every other curve: clip, and say so
            ax.set_ylim(bottom=Y_FLOOR, top=1.05)
            ax.text(0.02, 0.02, f"clipped at {Y_FLOOR:g} (lowest {low:.1f}, see summary.md)", transform=ax.transAxes,
                    fontsize=6, color="gray")
        ax.set_title(f"{lvl} tasks", fontsize=9)
        ax.set_xlabel(xlabel)
        ax.axhline(0, color="black", lw=0.5)
        ax.grid(lw=0.3)
    axes[0][0].set_ylabel("mean U/beta, all tasks (not done = 0)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_load_sweep(args: argparse.Namespace) -> int:
    policies = [p for p in args.policies.split(",") if p]
    loads = [float(x) for x in args.loads.split(",") if x]
    bursts = [int(x) for x in args.bursts.split(",") if x]
    seeds = list(range(args.seed, args.seed + args.seeds))
    out = Path(args.out) if args.out else _results_root() / "load_sweep"
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["timelyllm-bench", *sys.argv[1:]]) if args.command is None else args.command
    results: dict[str, Any] = {"command": command, "policies": policies, "seeds": seeds, "jitter_ms": args.jitter_ms,
                               "load_scaling": f"{args.scale}: {SCALE_DOC[args.scale]}",
                               "metric": "mean TUF_0/beta over all tasks, a task not done (shed, failed) counting 0",
                               "sweeps": {}}
    moved = f" (each event moved by U(0, {args.jitter_ms:g}) ms per seed)" if args.jitter_ms else ""
    md = [f"# Load sweep\n\nCommand: `{command}`\n\nLoad scaling: `{args.scale}` ({SCALE_DOC[args.scale]})\n\n",
          f"Mean U/beta over **all** tasks (a task not done, e.g. shed OVERDUE, counts 0) ± 95 % CI over "
          f"{len(seeds)} seed(s){moved}; `{policies[0]} shed`: tasks it ended OVERDUE / tasks (means per run); `vs X`: "
          f"paired difference {policies[0]} - X per seed, 'better'/'worse' when its 95 % CI excludes 0.\n"]
    for wname in [w for w in args.workloads.split(",") if w]:
        cache: dict[int, Workload] = {}

        def make(f: float, seed: int, wname: str = wname, cache: dict[int, Workload] = cache) -> Workload:
            if seed not in cache:
                cache[seed] = jitter(_truncate(load_workload(wname, seed=seed), args.max_jobs), args.jitter_ms / 1e3,
                                     seed)
            return SCALINGS[args.scale](cache[seed], f, seed)

        pts = sweep("load", loads, policies, seeds, make, args, f"load {wname}")
        name = cache[seeds[0]].name
        results["sweeps"][f"load-{wname}"] = {"workload": name, "jobs": len(cache[seeds[0]].jobs), "points": pts}
        header, rows = table(pts, policies, "load")
        print_table(f"{name}: U/beta all tasks vs load factor", header, rows)
        md.append(f"\n## {wname} ({name}, {len(cache[seeds[0]].jobs)} tasks): load factor\n\n")
        md.append(_md_table(header, rows))
        plot(out / f"load_{wname}.png", pts, policies, "load factor (x arrival rate)",
             f"{name}: utility vs load ({len(seeds)} seeds, 95 % CI)")
    if bursts:
        pts = sweep("burst", bursts, policies, seeds,
                    lambda b, s: _truncate(burst_workload(int(b), s), args.max_jobs), args, "burst")
        results["sweeps"]["burst-wid2"] = {"workload": "wid2 settings, generated", "points": pts}
        header, rows = table(pts, policies, "max/event")
        print_table("WID 2 settings (generated): U/beta all tasks vs burst size", header, rows)
        md.append("\n## Burst size (WID 2 settings, generated; U[max/2, max] tasks per event at 0.25 events/s)\n\n")
        md.append(_md_table(header, rows))
        plot(out / "burst_wid2.png", pts, policies, "max tasks per event",
             f"WID 2 settings: utility vs burst size ({len(seeds)} seeds, 95 % CI)")
    (out / "results.json").write_text(json.dumps(results, indent=1, default=lambda x: None if x != x else x))
    (out / "summary.md").write_text("".join(md))
    print(f"results in {out}")
    return 0


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def add_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("load-sweep", help="utility per policy vs load factor and burst size (all tasks counted)")
    p.add_argument("--workloads", default="wid1,wid2,wid3",
                   help="comma list: wid2 (the published trace), wid1/wid3 (generated), a trace name or folder")
    p.add_argument("--policies", default=DEFAULT_POLICIES,
                   help="comma list; the first is compared (paired) with pud and edf-seg")
    p.add_argument("--loads", default=DEFAULT_LOADS, help="load factors (x the workload's arrival rate)")
    add_scale_argument(p)
    p.add_argument("--bursts", default=DEFAULT_BURSTS,
                   help="max tasks per event for the burst sweep (WID 2 settings); empty: no burst sweep")
    p.add_argument("--seeds", type=int, default=3, help="repetitions per point (seeds --seed, --seed+1, ...)")
    p.add_argument("--jitter-ms", type=float, default=0.0,
                   help="move each arrival event by U(0, this) ms per seed (gives a fixed trace a spread over seeds)")
    p.add_argument("--max-jobs", type=int, default=None, help="keep only each workload's first N tasks (smoke runs)")
    common(p)  # --seed (the first seed), --out (default bench/results/load_sweep), the simulator's settings
    p.set_defaults(fn=cmd_load_sweep, command=None)
