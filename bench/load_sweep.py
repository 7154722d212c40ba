"""``timelyllm-bench load-sweep``: utility per policy against load and burst size.

    timelyllm-bench load-sweep                                  # WID 1, WID 2 (trace), WID 3; 3 seeds
    timelyllm-bench load-sweep --workloads wid2 --loads 1,3 --seeds 1 --bursts ""

Load factor f scales a workload's arrival rate f times. By default (``--scale fleet``) the fleet grows:
f times as many robots, each getting its tasks at the trace's own pace (:func:`scale_fleet`); with
``--scale rate`` every arrival time t becomes t / f, so the same tasks (the published WID 2 trace where
the workload is wid2) arrive f times as densely, each robot's too. The burst sweep
generates WID 2-like workloads (Table 3 arrivals at 0.25 events/s) with a different maximum number of
tasks per event. Every figure counts all tasks: U/beta all is TUF_0 / beta of a task that ended done
and 0 for one that did not (shed OVERDUE, failed, ...), see :mod:`timelyllm_ros.measure.metrics`. Repeats:
``--seeds`` per point, each varying (:data:`SEEDS_VARY`) the arrival of every event of every robot group by
U(0, ``--jitter-ms``) (20 ms by default: copies of a fleet are not synchronised to the millisecond, and
without it a fixed trace gave every seed the same run at whole load factors), which robots make up a
fractional fleet, a generated workload itself, and the simulator's samples. Reported as mean +- 95 % CI
(Student t), the default policy's edge as the paired difference per seed; a point whose runs came out
identical is reported as the one run it is, not as an interval.

``--total`` adds Eq. 3 (first and later segments: what a degrading policy's plans left out cost) beside U/beta;
``--pair-with P`` adds every policy's paired difference with P (e.g. the degrading policies with pud-shed).

``timelyllm-bench shed-audit`` runs pud-shed and pud on the same workloads and lists every task pud-shed shed
with what pud made of it: a shed task should be one that could not have earned anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import (  # noqa: F401 - scale_load, t95, line_fit: part of the sweep's API
    SCALE_DOC,
    SCALINGS,
    add_scale_argument,
    jitter,
    line_fit,
    md_table,
    mean_ci,
    print_table,
    progress,
    results_root,
    run_policy,
    scale_fleet,
    scale_load,
    t95,
    truncate,
)
from timelyllm_ros.measure import metrics
from timelyllm_ros.planner.admission import make_admission
from timelyllm_ros.planner.policies import make_policy
from timelyllm_ros.sim.workloads import SETTINGS, Workload, generate, load_workload

DEFAULT_LOADS = "0.5,0.75,1,1.5,2,2.5,3"
DEFAULT_BURSTS = "4,8,16,24,32,48"
DEFAULT_POLICIES = "pud-shed,pud,edf-seg,fcfs-stream,fcfs"
COMPARED = ("pud", "edf-seg", "fcfs-stream")  # the policies the first one must never be worse than
DEFAULT_JITTER_MS = 20.0
SEEDS_VARY = ("each event's arrival, per robot group (a copy of the fleet), moved by {moved}; which robots of the "
              "trace make up a fractional fleet; a generated workload is generated anew; the simulator's samples of "
              "skill times the trace lacks")
LEVELS = ("urgent", "normal", "all")
Y_FLOOR = -1.5  # plots clip utility below this


def burst_workload(max_per_event: int, seed: int) -> Workload:
    """WID 2's settings (Table 3) with a different burst size: U[max/2, max] tasks per event."""
    st = dataclasses.replace(SETTINGS["wid2"], max_per_event=max_per_event)
    wl = generate(st, seed)
    return Workload(f"wid2-burst{max_per_event}-s{seed}", wl.jobs, wl.config)


def run_point(wl: Workload, policy: str, args: argparse.Namespace) -> dict[str, Any]:
    """One simulation: U/beta all per urgency level and overall, and how tasks ended. ``policy@admission`` (e.g.
    ``pud-shed@adaptive-tuf``) runs the policy under that admission instead of its own ('auto')."""
    name, _, admission = policy.partition("@")
    res = run_policy(wl, name, admission or None, args)
    rows = {r.group: r for r in metrics.summarize(res.records)}
    out: dict[str, Any] = {"n": rows["all"].n, "statuses": rows["all"].statuses}
    for lvl in LEVELS:
        r = rows.get("all" if lvl == "all" else f"all {lvl}")
        out[lvl] = r.utility_norm_all if r is not None else math.nan
        out[f"n_{lvl}"] = r.n if r is not None else 0
        out[f"shed_{lvl}"] = r.statuses.get("overdue", 0) if r is not None else 0
        # Eq. 3 (TUF_0 + sum of TUF_1 of the segments run), all tasks, not done = 0: the figure that sees a plan's
        # later segments, so the one that shows what degrading (a plan's rest left out) costs
        out[f"total_{lvl}"] = r.total_utility_all if r is not None else math.nan
    out["shed"] = rows["all"].statuses.get("overdue", 0)
    out["degraded"] = rows["all"].degraded
    out["not_done"] = rows["all"].failed
    return out


def _key(run: dict[str, Any]) -> str:
    return json.dumps(run, sort_keys=True)  # NaN (a level without tasks) compares equal this way


def distinct(rs: Sequence[Any]) -> list[Any]:
    """``rs`` less repeats: seeds whose runs came out identical are one run, not a sample of several."""
    seen: dict[str, Any] = {}
    for r in rs:
        seen.setdefault(_key(r), r)
    return list(seen.values())


def sweep(kind: str, xs: Sequence[float], policies: Sequence[str], seeds: Sequence[int],
          make: Any, args: argparse.Namespace, desc: str) -> list[dict[str, Any]]:
    """For every x, policy and seed one run of ``make(x, seed)``; returns the aggregated points. Where a
    policy's runs (or a pair's runs, for the paired difference) are identical over the seeds, the figure is that
    one run with no interval (``runs`` / ``diff_<other>_runs``: how many distinct runs it rests on)."""
    runs: dict[tuple[float, str], list[dict[str, Any]]] = {}
    todo = [(x, s) for x in xs for s in seeds]
    for x, s in progress(todo, desc):
        wl = make(x, s)
        a = argparse.Namespace(**{**vars(args), "seed": s})
        for p in policies:
            runs.setdefault((x, p), []).append(run_point(wl, p, a))
    points = []
    for x in xs:
        for p in policies:
            rs = runs[(x, p)]
            uniq = distinct(rs)
            pt: dict[str, Any] = {"sweep": kind, "x": x, "policy": p, "seeds": len(rs), "runs": len(uniq),
                                  "n": statistics.fmean(r["n"] for r in rs)}
            for lvl in LEVELS:
                pt[lvl], pt[f"{lvl}_ci"] = mean_ci([r[lvl] for r in uniq])
                pt[f"total_{lvl}"], pt[f"total_{lvl}_ci"] = mean_ci([r.get(f"total_{lvl}", math.nan) for r in uniq])
                pt[f"n_{lvl}"] = statistics.fmean(r[f"n_{lvl}"] for r in rs)  # a generated workload varies by seed
                pt[f"shed_{lvl}"] = statistics.fmean(r[f"shed_{lvl}"] for r in rs)
            pt["shed"] = statistics.fmean(r["shed"] for r in rs)
            pt["not_done"] = statistics.fmean(r["not_done"] for r in rs)
            pt["degraded"] = statistics.fmean(r.get("degraded", 0) for r in rs)
            pt["per_seed"] = rs
            points.append(pt)
        # Paired differences of every policy with every other (the table shows the first policy's against
        # ``compare``; results.json keeps them all, e.g. pud-degrade against pud-shed)
        for base in policies:
            for other in policies:
                if other == base:
                    continue
                b = next(q for q in points if q["x"] == x and q["policy"] == base)
                o = next(q for q in points if q["x"] == x and q["policy"] == other)
                pairs = distinct(list(zip(b["per_seed"], o["per_seed"], strict=True)))  # paired by seed
                b[f"diff_{other}_runs"] = len(pairs)
                for lvl in LEVELS:
                    for m in (lvl, f"total_{lvl}"):
                        b[f"diff_{other}_{m}"], b[f"diff_{other}_{m}_ci"] = mean_ci(
                            [u.get(m, math.nan) - v.get(m, math.nan) for u, v in pairs])
    return points


def verdict(pt: dict[str, Any], other: str, lvl: str = "all") -> str:
    """'better' / 'worse' when the paired 95 % CI excludes 0, '=' when it holds 0 (or one run: the sign)."""
    d, ci = pt.get(f"diff_{other}_{lvl}", math.nan), pt.get(f"diff_{other}_{lvl}_ci", math.nan)
    if math.isnan(d):
        return "-"
    if math.isnan(ci):
        ci = 0.0
    if abs(d) < 5e-4:
        return "="
    return "better" if d - ci > 0 else "worse" if d + ci < 0 else "="


def _cell(m: float, ci: float) -> str:
    """Mean ± CI half-width, or the one run it is (no interval: one seed, or every seed gave the same run)."""
    if math.isnan(m):
        return "-"
    return f"{m:+.3f}" + (" (1 run)" if math.isnan(ci) else f" ±{ci:.3f}")


def table(points: list[dict[str, Any]], policies: Sequence[str], xlabel: str, metric: str = "",
          compared: Sequence[str] = COMPARED) -> tuple[list[str], list[list[str]]]:
    """``metric``: "" for U/beta all (TUF_0), "total_" for Eq. 3 all. A column of tasks degraded (ended with only
    their mandatory part) per policy that degraded any."""
    vs = [o for o in compared if o in policies and o != policies[0]]
    degrading = [p for p in policies if any(q["policy"] == p and q.get("degraded") for q in points)]
    header = [xlabel, "level"] + list(policies) + [f"{policies[0]} shed"] + [f"{p} degraded" for p in degrading] + [
        f"vs {o}" for o in vs]
    rows = []
    for x in sorted({p["x"] for p in points}):
        by = {p["policy"]: p for p in points if p["x"] == x}
        base = by[policies[0]]
        for lvl in LEVELS:
            if base[f"n_{lvl}"] == 0:
                continue
            m = f"{metric}{lvl}"
            rows.append([f"{x:g}", lvl] + [_cell(by[p][m], by[p][f"{m}_ci"]) for p in policies]
                        + [f"{base[f'shed_{lvl}']:.0f}/{base[f'n_{lvl}']:.0f}"]
                        + [f"{by[p]['degraded']:.0f}" if lvl == "all" else "" for p in degrading]
                        + [_diff_cell(base, o, m) for o in vs])
    return header, rows


def pair_table(points: list[dict[str, Any]], policies: Sequence[str], ref: str, xlabel: str
               ) -> tuple[list[str], list[list[str]]]:
    """Every policy's paired difference with ``ref`` per seed, over all tasks: U/beta (TUF_0) and Eq. 3."""
    others = [p for p in policies if p != ref]
    header = [xlabel] + [f"{p} - {ref} U/beta" for p in others] + [f"{p} - {ref} Eq. 3" for p in others]
    rows = []
    for x in sorted({p["x"] for p in points}):
        by = {p["policy"]: p for p in points if p["x"] == x}
        rows.append([f"{x:g}"] + [_diff_cell(by[p], ref, "all") for p in others]
                    + [_diff_cell(by[p], ref, "total_all") for p in others])
    return header, rows


def _diff_cell(pt: dict[str, Any], other: str, lvl: str) -> str:
    d, ci = pt[f"diff_{other}_{lvl}"], pt[f"diff_{other}_{lvl}_ci"]
    if math.isnan(d):
        return "-"
    return f"{verdict(pt, other, lvl)} ({d:+.3f}" + (", 1 run)" if math.isnan(ci) else f" ±{ci:.3f})")


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


def workload_label(spec: str, wl: Workload) -> str:
    """What a workload's plot, table and results key are called: the name it was given (``wid2``,
    ``drone-wid1``), or for a path the workload's own name (the folder's or the jobs file's), never the path."""
    label = wl.name if ("/" in spec or "\\" in spec or Path(spec).exists()) else spec
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "workload"


def seeds_text(jitter_ms: float) -> str:
    """What the seeds of a sweep vary (the summary says it)."""
    return SEEDS_VARY.format(moved=f"U(0, {jitter_ms:g} ms)" if jitter_ms > 0 else "0 ms (--jitter-ms 0: not moved)")


def cmd_load_sweep(args: argparse.Namespace) -> int:
    policies = [p for p in args.policies.split(",") if p]
    for p in policies:  # a misspelt name is refused now, not after the sweeps before it ran
        name, _, admission = p.partition("@")
        try:
            segmented = make_policy(name).segmented
            if admission:
                make_admission(admission, segmented=segmented)
        except ValueError as e:
            raise SystemExit(f"load-sweep --policies: {p!r}: {e}") from None
    loads = [float(x) for x in args.loads.split(",") if x]
    bursts = [int(x) for x in args.bursts.split(",") if x]
    seeds = list(range(args.seed, args.seed + args.seeds))
    out = Path(args.out) if args.out else results_root() / "load_sweep"
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["timelyllm-bench", *sys.argv[1:]]) if args.command is None else args.command
    vary = seeds_text(args.jitter_ms)
    results: dict[str, Any] = {"command": command, "policies": policies, "seeds": seeds, "jitter_ms": args.jitter_ms,
                               "seeds_vary": vary, "load_scaling": f"{args.scale}: {SCALE_DOC[args.scale]}",
                               "metric": "mean TUF_0/beta over all tasks, a task not done (shed, failed) counting 0",
                               "sweeps": {}}
    compared = [o for o in args.compare.split(",") if o]
    vs = ", ".join(o for o in compared if o in policies and o != policies[0])
    md = [f"# Load sweep\n\nCommand: `{command}`\n\nLoad scaling: `{args.scale}` ({SCALE_DOC[args.scale]})\n\n",
          f"Seeds ({len(seeds)}) vary: {vary}. The burst sweep's workloads are generated anew per seed.\n\n",
          f"Mean U/beta over **all** tasks (a task not done, e.g. shed OVERDUE, counts 0) ± 95 % CI over the seeds; "
          f"`(1 run)`: one seed, or every seed gave the identical run, so it is one run and has no interval. "
          f"`{policies[0]} shed`: tasks it ended OVERDUE / tasks (means per run)"
          + (f"; `vs X` ({vs}): paired difference {policies[0]} - X per seed, 'better'/'worse' when its 95 % CI "
             f"excludes 0 (one run: its sign)" if vs else "") + ".\n"]
    for wname in [w for w in args.workloads.split(",") if w]:
        cache: dict[int, Workload] = {}

        def make(f: float, seed: int, wname: str = wname, cache: dict[int, Workload] = cache) -> Workload:
            if seed not in cache:
                cache[seed] = truncate(load_workload(wname, seed=seed), args.max_jobs)
            # jitter after scaling: each copy of the fleet moves on its own
            return jitter(SCALINGS[args.scale](cache[seed], f, seed), args.jitter_ms / 1e3, seed)

        pts = sweep("load", loads, policies, seeds, make, args, f"load {wname}")
        wl0 = cache[seeds[0]]
        label = workload_label(wname, wl0)
        results["sweeps"][f"load-{label}"] = {"workload": wl0.name, "given_as": wname, "jobs": len(wl0.jobs),
                                              "points": pts}
        header, rows = table(pts, policies, "load", compared=compared)
        print_table(f"{wl0.name}: U/beta all tasks vs load factor", header, rows)
        md.append(f"\n## {label} ({wl0.name}, {len(wl0.jobs)} tasks): load factor\n\n")
        md.append(md_table(header, rows))
        if args.total:
            header, rows = table(pts, policies, "load", metric="total_", compared=compared)
            print_table(f"{wl0.name}: Eq. 3 utility (all tasks) vs load factor", header, rows)
            md.append(f"\n### {label}: Eq. 3 utility per task (TUF_0 + sum of TUF_1 of the segments run; all "
                      f"tasks, not done = 0)\n\n")
            md.append(md_table(header, rows))
        if args.pair_with in policies:
            header, rows = table_pair = pair_table(pts, policies, args.pair_with, "load")
            print_table(f"{wl0.name}: paired difference with {args.pair_with}, all tasks", *table_pair)
            md.append(f"\n### {label}: each policy - {args.pair_with}, paired per seed, all tasks (U/beta: TUF_0; "
                      f"Eq. 3: first and later segments)\n\n")
            md.append(md_table(header, rows))
        plot(out / f"load_{label}.png", pts, policies, "load factor (x arrival rate)",
             f"{wl0.name}: utility vs load ({len(seeds)} seeds, 95 % CI)")
    if bursts:
        pts = sweep("burst", bursts, policies, seeds,
                    lambda b, s: truncate(burst_workload(int(b), s), args.max_jobs), args, "burst")
        results["sweeps"]["burst-wid2"] = {"workload": "wid2 settings, generated", "points": pts}
        header, rows = table(pts, policies, "max/event", compared=compared)
        print_table("WID 2 settings (generated): U/beta all tasks vs burst size", header, rows)
        md.append("\n## Burst size (WID 2 settings, generated; U[max/2, max] tasks per event at 0.25 events/s)\n\n")
        md.append(md_table(header, rows))
        plot(out / "burst_wid2.png", pts, policies, "max tasks per event",
             f"WID 2 settings: utility vs burst size ({len(seeds)} seeds, 95 % CI)")
    (out / "results.json").write_text(json.dumps(results, indent=1, default=lambda x: None if x != x else x))
    (out / "summary.md").write_text("".join(md))
    print(f"results in {out}")
    return 0


# the shed's reason (planner/overload.py, Overload.overdue_reason); results of older runs lack the best case
_SHED_AT = re.compile(r"\((queued|running), shed by .*?waited ([0-9.]+) s(?:, best case ([0-9.]+) s)?")


def shed_audit(wl: Workload, args: argparse.Namespace, policy: str = "pud-shed",
               against: str = "pud") -> dict[str, Any]:
    """Run ``policy`` and ``against`` on the same workload; for every task ``policy`` ended OVERDUE (shed), what
    ``against`` made of it. A right shed is one ``against`` could not earn anything from either."""
    shed_run, ref_run = run_policy(wl, policy, None, args), run_policy(wl, against, None, args)
    ref = {r.job_id: r for r in ref_run.records}
    rows = []
    for r in sorted(shed_run.records, key=lambda r: r.arrival):
        if r.status != "overdue":
            continue
        q, m = ref[r.job_id], _SHED_AT.search(r.reason)
        u = q.utility()
        rows.append({"job": r.job_id, "level": r.level, "task": r.task_type, "agent": r.agent_id,
                     "arrival_s": round(r.arrival, 4), "shed": m.group(1) if m else "?",
                     "waited_s": float(m.group(2)) if m else None,
                     "best_case_s": float(m.group(3)) if m and m.group(3) else None,
                     "cutoff_s": round(r.tuf.cutoff, 4), f"{against}_status": q.status,
                     f"{against}_response_s": None if q.response_time is None else round(q.response_time, 4),
                     f"{against}_u_beta": None if u is None else round(u / q.beta, 4),
                     "earns": q.utility_all() > 0})
    return {"tasks": len(shed_run.records), "shed": len(rows), "earn": sum(x["earns"] for x in rows),
            "earn_u_beta": round(sum(ref[x["job"]].utility_all() for x in rows if x["earns"]), 4),
            f"{policy}_all": statistics.fmean(r.utility_all() for r in shed_run.records),
            f"{against}_all": statistics.fmean(r.utility_all() for r in ref_run.records), "rows": rows}


def cmd_shed_audit(args: argparse.Namespace) -> int:
    loads = [float(x) for x in args.loads.split(",") if x]
    seeds = list(range(args.seed, args.seed + args.seeds))
    out = Path(args.out) if args.out else results_root() / "load_sweep" / "shed-audit"
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["timelyllm-bench", *sys.argv[1:]]) if args.command is None else args.command
    pol, ref = args.policy, args.against
    points = []
    for wname in [w for w in args.workloads.split(",") if w]:
        base_by_seed = {s: truncate(load_workload(wname, seed=s), args.max_jobs) for s in seeds}
        label = workload_label(wname, base_by_seed[seeds[0]])
        for f, s in progress([(f, s) for f in loads for s in seeds], f"shed audit {label}"):
            wl = jitter(SCALINGS[args.scale](base_by_seed[s], f, s), args.jitter_ms / 1e3, s)
            a = argparse.Namespace(**{**vars(args), "seed": s})
            points.append({"workload": label, "load": f, "seed": s, **shed_audit(wl, a, pol, ref)})
    summary_h = ["workload", "load", "seed", "tasks", f"{pol} shed", f"shed that earn > 0 under {ref}",
                 f"their U/beta under {ref}", f"{pol} U/beta all", f"{ref} U/beta all"]
    summary = [[p["workload"], f"{p['load']:g}", str(p["seed"]), str(p["tasks"]), str(p["shed"]), str(p["earn"]),
                f"{p['earn_u_beta']:+.3f}", f"{p[f'{pol}_all']:+.3f}", f"{p[f'{ref}_all']:+.3f}"] for p in points]
    print_table(f"{pol} sheds vs {ref}", summary_h, summary)
    cols = ["job", "level", "task", "shed", "waited_s", "best_case_s", "cutoff_s", f"{ref}_status",
            f"{ref}_response_s", f"{ref}_u_beta", "earns"]
    md = [f"# Shed audit: every task {pol} shed, and what {ref} made of it\n\nCommand: `{command}`\n\n",
          f"Load scaling: `{args.scale}` ({SCALE_DOC[args.scale]}). Seeds vary: {seeds_text(args.jitter_ms)}. "
          f"The same workload runs under both policies. `waited` / `best case`: at the shed, seconds since arrival "
          f"and the best-case response {pol} judged it by; `{ref}_u_beta`: TUF_0/beta {ref} got (negative past "
          f"the cutoff; empty: never served); `earns`: {ref} ended it done with positive utility.\n\n",
          md_table(summary_h, summary)]
    csv = [",".join(["workload", "load", "seed", *cols])]
    for p in points:
        rows = p["rows"]
        csv += [",".join(str(x) for x in [p["workload"], p["load"], p["seed"], *(r[c] for c in cols)]) for r in rows]
        listed = rows
        if len(rows) > args.list_max:  # those that earn, and the 10 closest to earning
            near = sorted(rows, key=lambda r: -math.inf if r[f"{ref}_u_beta"] is None else r[f"{ref}_u_beta"])[-10:]
            listed = [r for r in rows if r["earns"] or r in near]
        md.append(f"\n## {p['workload']} at {p['load']:g}x, seed {p['seed']}: {p['shed']} shed, {p['earn']} of them "
                  f"earn > 0 under {ref}\n\n")
        if len(listed) < len(rows):
            md.append(f"Listed: those that earn under {ref} and the 10 {ref} came closest with; all {len(rows)} "
                      f"in `shed_audit.csv`.\n\n")
        if listed:
            md.append(md_table(cols, [["-" if r[c] is None else str(r[c]) for c in cols] for r in listed]))
    (out / "shed_audit.json").write_text(json.dumps({"command": command, "policy": pol, "against": ref,
                                                     "load_scaling": args.scale, "jitter_ms": args.jitter_ms,
                                                     "points": points}, indent=1))
    (out / "shed_audit.csv").write_text("\n".join(csv) + "\n")
    (out / "shed_audit.md").write_text("".join(md))
    print(f"results in {out}")
    return 0


def add_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("load-sweep", help="utility per policy vs load factor and burst size (all tasks counted)")
    p.add_argument("--workloads", default="wid1,wid2,wid3",
                   help="comma list: wid2 (the published trace), wid1/wid3 (generated), a trace name or folder")
    p.add_argument("--policies", default=DEFAULT_POLICIES,
                   help="comma list; the first is compared (paired) with those of --compare; policy@admission runs a "
                        "policy under another admission (e.g. pud-shed@adaptive-tuf)")
    p.add_argument("--compare", default=",".join(COMPARED),
                   help="comma list: the policies the table compares the first one with (paired per seed; "
                        "results.json holds every pair)")
    p.add_argument("--pair-with", default="",
                   help="a policy of --policies: also tabulate every other's paired difference with it (all tasks)")
    p.add_argument("--total", action="store_true",
                   help="also tabulate Eq. 3 utility (first and later segments; what degrading a plan costs)")
    p.add_argument("--loads", default=DEFAULT_LOADS, help="load factors (x the workload's arrival rate)")
    add_scale_argument(p)
    p.add_argument("--bursts", default=DEFAULT_BURSTS,
                   help="max tasks per event for the burst sweep (WID 2 settings); empty: no burst sweep")
    p.add_argument("--seeds", type=int, default=3, help="repetitions per point (seeds --seed, --seed+1, ...)")
    p.add_argument("--jitter-ms", type=float, default=DEFAULT_JITTER_MS,
                   help="move each arrival event of each robot group (copy of the fleet) by U(0, this) ms per seed "
                        f"(default {DEFAULT_JITTER_MS:g}; 0: the trace's exact times, every seed the same run)")
    p.add_argument("--max-jobs", type=int, default=None, help="keep only each workload's first N tasks (smoke runs)")
    common(p)  # --seed (the first seed), --out (default bench/results/load_sweep), the simulator's settings
    p.set_defaults(fn=cmd_load_sweep, command=None)

    p = sub.add_parser("shed-audit", help="every task pud-shed sheds, with what pud made of it")
    p.add_argument("--workloads", default="drone-wid1", help="comma list, as load-sweep's")
    p.add_argument("--loads", default="2", help="load factors")
    add_scale_argument(p)
    p.add_argument("--seeds", type=int, default=1, help="repetitions per point (seeds --seed, --seed+1, ...)")
    p.add_argument("--jitter-ms", type=float, default=DEFAULT_JITTER_MS, help="as load-sweep's (0: the exact trace)")
    p.add_argument("--max-jobs", type=int, default=None, help="keep only each workload's first N tasks")
    p.add_argument("--policy", default="pud-shed", help="the shedding policy audited")
    p.add_argument("--against", default="pud", help="the policy that serves every task, to compare with")
    p.add_argument("--list-max", type=int, default=60,
                   help="list every shed task of a point with at most this many in shed_audit.md")
    common(p)  # --out default bench/results/load_sweep/shed-audit
    p.set_defaults(fn=cmd_shed_audit, command=None)
