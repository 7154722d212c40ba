"""Metrics per task type, per urgency level and overall (design §8), as tables (markdown, CSV) and PNG plots.

Every per-task figure is defined once, in :mod:`timelyllm_ros.measure.records`; this module only aggregates.
Each row reports all tasks: served-only means next to all-tasks means (a task not done counts 0) and
the number of tasks per terminal status.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from timelyllm_ros.domain.types import TERMINAL_STATUSES, TaskStatus
from timelyllm_ros.measure.records import TaskRecord


@dataclass
class Summary:
    """One row of the metrics table.

    Served-only figures average over the tasks that got at least one segment executed (their
    meaning predates the all-tasks ones; a policy that refuses tasks drops them from these).
    The ``*_all`` figures average over every task, one that did not end done counting 0, so
    refusing a task never looks better than serving it with utility >= 0. Per-task figures come
    from :mod:`timelyllm_ros.measure.records` (response time, robot waiting, Eq. 3 utility).
    """

    group: str  # task type, urgency level, or "all"
    n: int
    served: int  # got at least one segment
    failed: int  # did not end done (invalid / overdue / failed / robot failed / cancelled / unfinished)
    utility: float  # served only: mean TUF_0(response time), raw (not clamped at 0)
    utility_norm: float  # served only: mean TUF_0 / beta
    total_utility: float  # served only: mean of Eq. 3 (first + later segments)
    response_mean: float  # served only
    response_p50: float
    response_p95: float
    waiting_mean: float  # served only: robot waiting time (W(s_0) + sum of W(s_k))
    completion_mean: float  # served only
    miss_rate: float  # all tasks: response time > ERT (unserved tasks count as misses)
    utility_norm_all: float = math.nan  # all tasks: mean TUF_0 / beta, 0 for a task not done
    total_utility_all: float = math.nan  # all tasks: mean of Eq. 3, 0 for a task not done
    # Tasks per terminal status (TaskStatus values), every one present; "other": not terminal
    # (still pending, or cut off by the end of a recording).
    statuses: dict[str, int] = field(default_factory=dict)
    # Of the done ones, those that ended with only their mandatory part (a degrading policy left the rest of the
    # plan out under overload: TaskRecord.degraded). Their completion time is not a plan's: completion_mean
    # leaves them out.
    degraded: int = 0


OTHER_STATUS = "other"


def status_counts(recs: Iterable[Any]) -> dict[str, int]:
    """Tasks per terminal status, zeros included, plus :data:`OTHER_STATUS` for the rest."""
    out = {s.value: 0 for s in TERMINAL_STATUSES}
    out[OTHER_STATUS] = 0
    for r in recs:
        key = r.status if r.status in out else OTHER_STATUS
        out[key] += 1
    return out


def percentile(xs: Sequence[float], q: float) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    i = (len(s) - 1) * q
    lo, hi = math.floor(i), math.ceil(i)
    return s[lo] + (s[hi] - s[lo]) * (i - lo)


def _mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else math.nan


def summarize_group(name: str, recs: Sequence[TaskRecord]) -> Summary:
    served = [r for r in recs if r.served]
    rts = [r.response_time for r in served]
    us = [r.utility() for r in served]
    un = [r.utility() / r.beta for r in served]
    tot = [u for u in (r.total_utility() for r in served) if u is not None]
    misses = sum(1 for r in recs if r.missed)
    n = len(recs)
    return Summary(
        group=name, n=n, served=len(served), failed=sum(1 for r in recs if not r.done),
        utility=_mean(us), utility_norm=_mean(un), total_utility=_mean(tot),
        response_mean=_mean(rts), response_p50=percentile(rts, 0.5), response_p95=percentile(rts, 0.95),
        waiting_mean=_mean([r.robot_waiting for r in served]),
        completion_mean=_mean([c for c in (r.completion_time for r in served if not r.degraded) if c is not None]),
        miss_rate=misses / n if n else math.nan,
        utility_norm_all=_mean([r.utility_all() for r in recs]),
        total_utility_all=_mean([r.total_utility_all() for r in recs]),
        statuses=status_counts(recs), degraded=sum(1 for r in recs if r.degraded))


def summarize(records: Iterable[TaskRecord]) -> list[Summary]:
    """Rows per task type, then per urgency level, then overall."""
    recs = list(records)
    out = []
    for key in sorted({(r.trace_id, r.task_type) for r in recs}):
        out.append(summarize_group(key[1], [r for r in recs if (r.trace_id, r.task_type) == key]))
    for lvl in sorted({r.level for r in recs}):
        out.append(summarize_group(f"all {lvl}", [r for r in recs if r.level == lvl]))
    out.append(summarize_group("all", recs))
    return out


def decision_stats(times_s: Sequence[float]) -> dict[str, float]:
    ms = [t * 1e3 for t in times_s]
    return {"decisions": len(ms), "mean_ms": _mean(ms), "p50_ms": percentile(ms, 0.5),
            "p99_ms": percentile(ms, 0.99), "max_ms": max(ms) if ms else math.nan}


# (Summary field, markdown header); the status counts follow them (see :func:`to_markdown`).
COLUMNS = [("group", "task"), ("n", "n"), ("utility", "U"), ("utility_norm", "U/beta"),
           ("utility_norm_all", "U/beta all"), ("total_utility", "U total"), ("total_utility_all", "U total all"),
           ("response_mean", "resp mean s"), ("response_p50", "resp p50 s"), ("response_p95", "resp p95 s"),
           ("waiting_mean", "wait s"), ("completion_mean", "completion s"), ("miss_rate", "miss"),
           ("failed", "not done")]
LEGEND = ("U, U/beta, U total, resp, wait, completion: means over served tasks (a segment executed); "
          "U/beta all, U total all, miss: over all tasks (a task not done counts 0, an unserved one misses).")

DEGRADED_LEGEND = (" degraded: of the done tasks, those that ended with only their mandatory part (the rest of the "
                   "plan left out under overload); completion leaves them out.")


def fmt(v: Any, spec: str = ".3f", unit: str = "") -> str:
    """A table cell; a figure with nothing to average over (no task of the row was served) is "-", never "nan"."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:{spec}}{unit}"
    return str(v)


def not_done_text(row: Summary) -> str:
    """Compact status cell for narrow tables: ``0``, or ``3: overdue 2, failed 1``."""
    parts = [f"{k} {v}" for k, v in row.statuses.items() if v and k != TaskStatus.DONE]
    return f"{row.failed}: " + ", ".join(parts) if parts else str(row.failed)


def _status_columns(rows: Sequence[Summary]) -> list[str]:
    """Every terminal status; "other" only when some row has one."""
    cols = [s.value for s in TERMINAL_STATUSES]
    if any(r.statuses.get(OTHER_STATUS) for r in rows):
        cols.append(OTHER_STATUS)
    return cols


def to_markdown(rows: Sequence[Summary], extra_cols: dict[str, list[Any]] | None = None,
                legend: bool = True) -> str:
    status_cols = _status_columns(rows)
    degraded = any(r.degraded for r in rows)  # a column only where a policy degraded: other tables stay as they were
    cols = list(extra_cols or {}) + [h for _, h in COLUMNS] + status_cols + (["degraded"] if degraded else [])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for i, r in enumerate(rows):
        vals = ([fmt(v[i]) for v in (extra_cols or {}).values()] + [fmt(getattr(r, k)) for k, _ in COLUMNS]
                + [str(r.statuses.get(s, 0)) for s in status_cols] + ([str(r.degraded)] if degraded else []))
        lines.append("| " + " | ".join(vals) + " |")
    if legend:
        lines += ["", LEGEND + (DEGRADED_LEGEND if degraded else "")]
    return "\n".join(lines) + "\n"


def write_csv(path: str | Path, rows: Sequence[dict[str, Any]]) -> None:
    rows = list(rows)
    if not rows:
        Path(path).write_text("")
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def summary_dicts(rows: Sequence[Summary], **tags: Any) -> list[dict[str, Any]]:
    """Flat rows (CSV, JSON): the status counts become ``n_<status>`` columns."""
    out = []
    for r in rows:
        d = asdict(r)
        statuses = d.pop("statuses")
        out.append({**tags, **d, **{f"n_{k}": v for k, v in statuses.items()}})
    return out


def bar_plot(path: str | Path, groups: Sequence[str], series: dict[str, Sequence[float]], ylabel: str,
             title: str, hline: float | None = None) -> None:
    """Grouped bars: one group per task type, one bar per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(min(12.0, 3 + 0.3 * len(groups) * max(1, len(series))), 4.5))
    width = 0.8 / max(1, len(series))
    for i, (name, vals) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [0 if math.isnan(v) else v for v in vals], width, label=name)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.axhline(0, color="black", lw=0.6)
    if hline is not None:
        ax.axhline(hline, color="gray", lw=0.6, ls="--")
    ax.legend(fontsize=8, ncol=min(4, len(series)), loc="best", framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def line_plot(path: str | Path, xs: Sequence[float], series: dict[str, Sequence[float]], xlabel: str,
              ylabel: str, title: str, hlines: dict[str, float] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, ys in series.items():
        ax.plot(xs, ys, marker="o", ms=3, label=name)
    for name, y in (hlines or {}).items():
        ax.axhline(y, ls="--", lw=0.8, label=name, color="gray")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@dataclass
class TimelineTask:
    """One task as a timeline draws it (times relative to the run's first arrival, seconds)."""

    task_type: str
    level: str
    arrival: float
    deadline: float  # arrival + ERT: the first segment must start by then for full utility
    segments: list[tuple[float, float]]  # (start, end) of every segment the robot started
    missed: bool  # first segment started after the deadline, or never started
    started: bool


def timeline_rows(records: Iterable[TaskRecord], label: Any = None) -> dict[str, list[TimelineTask]]:
    """Per robot (``label(rec)``, default ``<robot_type>_<agent_id>``), its tasks in arrival order.
    Only segments a robot started count; a task with none is drawn as never started."""
    recs = list(records)
    label = label or (lambda r: f"{r.robot_type}_{r.agent_id}")
    t0 = min((r.arrival for r in recs), default=0.0)
    rows: dict[str, list[TimelineTask]] = {}
    for r in sorted(recs, key=lambda r: r.arrival):
        segs = [(s.start - t0, (s.end if math.isfinite(s.end) else s.start) - t0)
                for s in r.segments if math.isfinite(s.start)]
        deadline = r.arrival - t0 + r.ert
        rows.setdefault(label(r), []).append(TimelineTask(
            r.task_type, r.level, r.arrival - t0, deadline, segs,
            missed=not segs or segs[0][0] > deadline + 1e-9, started=bool(segs)))
    return dict(sorted(rows.items(), key=lambda kv: _natural(kv[0])))


def _natural(name: str) -> list:
    """drone_2 before drone_10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def timeline_plot(path: str | Path, runs: dict[str, Iterable[TaskRecord]], title: str) -> None:
    """One panel per policy, one row per robot: segments as bars (red: urgent, blue: normal), a thin
    line from each task's arrival (▲) to its first segment, its deadline (arrival + ERT) as a tick,
    and a miss (first segment late, or never started) as a black ✕ at the deadline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    panels = {name: timeline_rows(recs) for name, recs in runs.items()}
    robots = sorted({rob for rows in panels.values() for rob in rows}, key=_natural)
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False,
                             figsize=(11, 1.8 + (0.4 + 0.32 * len(robots)) * len(panels)))
    colour = {"urgent": "tab:red", "normal": "tab:blue"}
    for ax, (name, rows) in zip(axes[:, 0], panels.items(), strict=True):
        n_miss = sum(t.missed for ts in rows.values() for t in ts)
        n_all = sum(len(ts) for ts in rows.values())
        for y, rob in enumerate(robots):
            for i, t in enumerate(rows.get(rob, [])):
                dy = 0.18 * (i % 2) - 0.09  # two tasks of one robot side by side stay apart
                c = colour.get(t.level, "tab:gray")
                first = t.segments[0][0] if t.segments else t.deadline
                ax.plot([t.arrival, first], [y + dy, y + dy], color=c, lw=0.8, alpha=0.6)
                ax.plot([t.arrival], [y + dy], marker="^", color=c, ms=4)
                ax.plot([t.deadline], [y + dy], marker="|", color="black", ms=9)
                for s, e in t.segments:
                    ax.barh(y + dy, max(e - s, 0.05), left=s, height=0.16, color=c, alpha=0.85)
                if t.missed:
                    ax.plot([t.deadline], [y + dy], marker="x", color="black", ms=7, mew=2)
        ax.set_yticks(range(len(robots)))
        ax.set_yticklabels(robots, fontsize=7)
        ax.set_ylim(-0.6, len(robots) - 0.4)
        ax.invert_yaxis()
        ax.set_title(f"{name}: {n_miss} of {n_all} tasks missed their deadline", fontsize=9, loc="left")
        ax.grid(axis="x", lw=0.3)
    axes[-1, 0].set_xlabel("time since the first task arrived (s)")
    handles = [Line2D([], [], color="tab:red", lw=6, label="urgent segment"),
               Line2D([], [], color="tab:blue", lw=6, label="normal segment"),
               Line2D([], [], color="gray", marker="^", lw=0.8, label="arrival → first segment"),
               Line2D([], [], color="black", marker="|", ls="", ms=9, label="deadline (arrival + ERT)"),
               Line2D([], [], color="black", marker="x", ls="", mew=2, label="missed / never started")]
    fig.legend(handles=handles, loc="lower center", fontsize=7, ncol=5, framealpha=0.9)
    fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    fig.savefig(path, dpi=120)
    plt.close(fig)
