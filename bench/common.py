"""What the bench commands share: where results go, progress and tables, one simulated run, the statistics
(95 % intervals, line fits) and the workload transforms of the load sweeps (rate or fleet scaling, jitter).

Every bench module imports these from here, so the modules form no cycle through each other's helpers.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from timelyllm_ros.engines.sim_engine import SimEngineConfig
from timelyllm_ros.sim.simulator import SimConfig, SimResult, Simulator
from timelyllm_ros.sim.workloads import Workload


# -- output ---------------------------------------------------------------------------------------------------------
def results_root() -> Path:
    return Path(__file__).resolve().parents[1] / "bench" / "results"


def progress(iterable: Sequence[Any], desc: str) -> Any:
    try:
        from tqdm import tqdm

        return tqdm(iterable, desc=desc, leave=False, file=sys.stderr)
    except ImportError:  # pragma: no cover
        return iterable


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title)
        for h in header:
            t.add_column(h, justify="left" if h == "task" else "right")
        for r in rows:
            t.add_row(*r)
        Console().print(t)
    except ImportError:  # pragma: no cover
        print(title)
        for r in [header, *rows]:
            print("  ".join(f"{c:>22}" for c in r))


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def ci_cell(m: float, ci: float, fmt: str = "{:+.3f}") -> str:
    if m != m:
        return "-"
    return fmt.format(m) + ("" if ci != ci else " ±" + fmt.format(ci).lstrip("+"))


# -- one simulated run ------------------------------------------------------------------------------------------
def run_policy(wl: Workload, policy: str, admission: str | int | None, args: argparse.Namespace) -> SimResult:
    from timelyllm_ros.planner.policies import make_policy

    pol = make_policy(policy)
    eng = SimEngineConfig.from_yaml(args.engine_config) if getattr(args, "engine_config", None) else SimEngineConfig()
    cfg = SimConfig(policy=policy, admission="auto" if admission is None else admission, seed=args.seed, engine=eng,
                    prompt_context_tokens=args.context_tokens,
                    prompt_shared_tokens=max(0, 2884 - args.context_tokens))
    cfg.core.resume_lead_s = args.resume_lead
    return Simulator(wl, cfg, policy=pol).run()


# -- statistics ---------------------------------------------------------------------------------------------------
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


# -- workload transforms -----------------------------------------------------------------------------------------
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
    return Workload(f"{wl.name}-fleet{factor:g}", jobs,
                    {**wl.config, "load_factor": factor, "load_scaling": "fleet", "fleet_stride": stride})


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
    seeded: a fixed trace then gives a spread over seeds where only its exact timing changes. In a fleet made
    by :func:`scale_fleet` each copy's events move on their own: f copies of a fleet are f groups of robots,
    not one group whose requests leave together to the millisecond."""
    if jitter_s <= 0:
        return wl
    rng = random.Random(f"jitter-{seed}")
    stride = wl.config.get("fleet_stride")
    jobs, shift, last = [], {}, {}
    for j in wl.jobs:  # sorted by arrival; in each group, a gap above 10 ms starts a new event
        grp = j.agent_id // stride if stride else 0
        if j.trigger_time - last.get(grp, -math.inf) > 0.01:
            shift[grp] = rng.uniform(0.0, jitter_s)
        last[grp] = j.trigger_time
        jobs.append(dataclasses.replace(j, trigger_time=j.trigger_time + shift[grp]))
    jobs.sort(key=lambda j: (j.trigger_time, j.job_id))
    return Workload(f"{wl.name}-j{seed}", jobs, wl.config)


def truncate(wl: Workload, max_jobs: int | None) -> Workload:
    return wl if not max_jobs else Workload(wl.name, wl.jobs[:max_jobs], wl.config)
