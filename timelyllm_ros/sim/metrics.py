"""Metrics per task type and overall (design §8), as tables (markdown, CSV) and PNG plots."""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass
class Summary:
    group: str  # task type, urgency level, or "all"
    n: int
    served: int  # got at least one segment
    failed: int  # rejected / failed / cancelled
    utility: float  # mean TUF_0(response time), raw (not clamped at 0)
    utility_norm: float  # mean TUF_0 / beta
    total_utility: float  # mean of Eq. 3 (first + later segments)
    response_mean: float
    response_p50: float
    response_p95: float
    waiting_mean: float  # robot waiting time (sum of W(s_k))
    completion_mean: float
    miss_rate: float  # response time > ERT (unserved tasks count as misses)


def percentile(xs: Sequence[float], q: float) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    i = (len(s) - 1) * q
    lo, hi = math.floor(i), math.ceil(i)
    return s[lo] + (s[hi] - s[lo]) * (i - lo)


def _mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else math.nan


def summarize_group(name: str, recs: Sequence[Any]) -> Summary:
    served = [r for r in recs if r.segments]
    rts = [r.response_time for r in served]
    us = [r.utility() for r in served]
    un = [r.utility() / r.beta for r in served]
    tot = [u for u in (r.total_utility() for r in served) if u is not None]
    misses = sum(1 for r in recs if not r.segments or r.response_time > r.ert)
    return Summary(
        group=name, n=len(recs), served=len(served), failed=sum(1 for r in recs if r.status != "done"),
        utility=_mean(us), utility_norm=_mean(un), total_utility=_mean(tot),
        response_mean=_mean(rts), response_p50=percentile(rts, 0.5), response_p95=percentile(rts, 0.95),
        waiting_mean=_mean([r.robot_waiting for r in served]),
        completion_mean=_mean([r.completion_time for r in served]),
        miss_rate=misses / len(recs) if recs else math.nan)


def summarize(records: Iterable[Any]) -> list[Summary]:
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


COLUMNS = [("group", "task"), ("n", "n"), ("utility", "U"), ("utility_norm", "U/beta"),
           ("total_utility", "U total"), ("response_mean", "resp mean s"), ("response_p50", "resp p50 s"),
           ("response_p95", "resp p95 s"), ("waiting_mean", "wait s"), ("completion_mean", "completion s"),
           ("miss_rate", "miss"), ("failed", "failed")]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.3f}"
    return str(v)


def to_markdown(rows: Sequence[Summary], extra_cols: dict[str, list[Any]] | None = None) -> str:
    cols = list(extra_cols or {}) + [h for _, h in COLUMNS]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for i, r in enumerate(rows):
        vals = [_fmt(v[i]) for v in (extra_cols or {}).values()] + [_fmt(getattr(r, k)) for k, _ in COLUMNS]
        lines.append("| " + " | ".join(vals) + " |")
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
    return [{**tags, **asdict(r)} for r in rows]


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
