"""What a run is measured against: what this machine allows, measured in the same run.

Absolute figures move 1.5x between two machines of one kind; a share of what the machine in that run allows does
not. The bound takes each task's first segment as measured when it was served alone (the robot's view: from its
goal's send to the start of its first segment, nothing else in the engine; ``RobotsSpec(mode="alone")``), and
serves each burst of goals (arrivals closer than ``burst_gap_s``) one after another, earliest deadline first (the
shorter lone time first among equal deadlines), a goal that could no longer earn left out as a shedding policy
would. Each task's TUF_0 at its serial response is its bound; a level's bound is their sum.

It is not an upper bound in the strict sense: goals whose prompts share a prefix (the same emergency reported by
several robots) cost less together than alone, and a policy can beat it there (a share above 1).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from timelyllm_ros.measure.records import TaskRecord

if TYPE_CHECKING:  # measure sits below sim: a workload's jobs are only read here
    from timelyllm_ros.sim.workloads import Job

BURST_GAP_S = 0.5  # arrivals closer than this (after the speed-up) form one burst


def lone_times(alone: Iterable[tuple[str, TaskRecord]]) -> dict[str, float]:
    """Task text -> the median response time of its lone runs (robot's view); a run that was not served counts
    nothing."""
    seen: dict[str, list[float]] = {}
    for text, rec in alone:
        rt = rec.response_time
        if rt is not None:
            seen.setdefault(text, []).append(rt)
    return {t: statistics.median(v) for t, v in seen.items()}


@dataclass
class BoundRow:
    """One level (urgent, normal, all): the utility its tasks earned and the bound's, both summed over its tasks."""

    level: str
    n: int
    utility: float
    bound: float

    @property
    def share(self) -> float:
        return self.utility / self.bound if self.bound > 0 else float("nan")


def serial_bound(jobs: Sequence[Job], lone: dict[str, float], speed: float = 1.0,
                 burst_gap_s: float = BURST_GAP_S) -> dict[int, float]:
    """Job id -> its TUF_0 under the bound (module doc). Arrivals are ``trigger_time / speed``; a job whose task has
    no lone time is left out of the bound (KeyError would hide a broken lone pass: it is named)."""
    missing = sorted({j.task_input for j in jobs} - set(lone))
    if missing:
        raise KeyError(f"no lone first segment measured for {len(missing)} task(s), e.g. {missing[0][:60]!r}")
    first = min((j.trigger_time for j in jobs), default=0.0)
    arrivals = sorted(((j.trigger_time - first) / speed, j) for j in jobs)
    bursts: list[list[tuple[float, Job]]] = []
    for t, j in arrivals:
        if bursts and t - bursts[-1][-1][0] < burst_gap_s:
            bursts[-1].append((t, j))
        else:
            bursts.append([(t, j)])
    out: dict[int, float] = {}
    for burst in bursts:
        order = sorted(burst, key=lambda a: (a[0] + a[1].time_utility.ert, lone[a[1].task_input]))
        clock = burst[0][0]
        for t, j in order:
            tuf = j.time_utility
            end = max(clock, t) + lone[j.task_input]
            u = tuf.tuf0(end - t)
            if u > 0:
                out[j.job_id] = u
                clock = end
            else:
                out[j.job_id] = 0.0  # left out: it could no longer earn, and takes no engine time
    return out


def shares(records: Sequence[TaskRecord], bound: dict[int, float]) -> list[BoundRow]:
    """Urgent, normal and all: the utility the run's tasks earned (TUF_0 of a task that ended done, else 0, as the
    all-tasks columns count) against the bound's."""
    rows = []
    for level in ("urgent", "normal", "all"):
        recs = [r for r in records if level == "all" or r.level == level]
        if not recs:
            continue
        got = sum(r.utility_all() * r.beta for r in recs)
        rows.append(BoundRow(level, len(recs), got, sum(bound.get(r.job_id, 0.0) for r in recs)))
    return rows


def prefill_step_ratio(steps: Iterable[tuple[int, int, int, float, float]], bare_step_s: dict[int, float],
                       lone_s: float, fixed_s: float, per_token_s: float) -> tuple[float, int]:
    """:func:`step_ratio` for the steps that prefill: each against the bare engine's model of the same step as the
    warm-up fitted it on lone prompts (planner/warmup.py: ``lone_s``, the batch-1 decode it takes off each probe,
    plus ``fixed_s`` and ``per_token_s`` for each prompt token behind the cached examples), and what decoding the
    step's other generations adds (``bare_step_s`` at its batch size less at batch 1; linear between the measured
    sizes, the nearest beyond them). Why: on a CPU the prefill is most of an urgent first segment, and the decode
    ratio alone did not show what a burst's prefill costs inside the stack."""
    if not bare_step_s or 1 not in bare_step_s:
        return float("nan"), 0
    sizes = sorted(bare_step_s)

    def decode(b: int) -> float:
        lo = max((x for x in sizes if x <= b), default=sizes[0])
        hi = min((x for x in sizes if x >= b), default=sizes[-1])
        if lo == hi:
            return bare_step_s[lo]
        return bare_step_s[lo] + (bare_step_s[hi] - bare_step_s[lo]) * (b - lo) / (hi - lo)

    one = bare_step_s[1]
    ratios = [s / (decode(b) - one + lone_s + fixed_s + pf * per_token_s)
              for b, pf, _, s, _ in steps if pf > 0 and b > 0]
    return (statistics.median(ratios) if ratios else float("nan")), len(ratios)


def step_ratio(steps: Iterable[tuple[int, int, int, float, float]], bare_step_s: dict[int, float]
               ) -> tuple[float, int]:
    """How much a decode step inside the running stack costs against the bare engine's at the same batch size
    (``bare_step_s``: batch -> seconds, the warm-up's calibration of the same engine in the same run): the median
    of each decode step's ratio, over the steps (batch, prefill tokens, kept tokens, seconds, start) without
    prefill at a measured batch size; and their number (NaN, 0: none)."""
    ratios = [s / bare_step_s[b] for b, pf, kept, s, _ in steps if not pf and kept > 0 and b in bare_step_s]
    return (statistics.median(ratios) if ratios else float("nan")), len(ratios)
