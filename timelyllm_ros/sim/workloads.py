"""LRTrace workloads: load the published format, generate new ones (design §8).

A workload is a list of jobs (``jobs.json``) plus a ``config.json``, in the
format of data/lrtrace/drone-wid2 (see its SOURCE.md). Generated workloads use
the paper's Table 2 tasks (data/plans.yaml) and Table 3 settings: Poisson
events at ``lambda_rate`` events/s, each releasing U[max/2, max] tasks 1 ms
apart, agents reused once their previous task should have ended.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from timelyllm_ros import paths
from timelyllm_ros.model.plans import plan_templates
from timelyllm_ros.model.tuf import TimeUtility


def data_dir() -> Path:
    return paths.data_dir()


@dataclass
class Job:
    job_id: int
    trigger_time: float
    agent_id: int
    trace_id: int
    task_input: str
    exe_time_detail: list[tuple[str, float]]
    tuf: list[float]  # [beta, ERT, cutoff]
    task_exe_time: float = 0.0

    @property
    def time_utility(self) -> TimeUtility:
        return TimeUtility.from_trace(self.tuf)

    def to_json(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "trigger time": self.trigger_time, "agent_id": self.agent_id,
                "trace_id": self.trace_id, "task_input": self.task_input,
                "exe_time_detail": [[k, v] for k, v in self.exe_time_detail],
                "task_exe_time": self.task_exe_time, "tuf": list(self.tuf)}

    @classmethod
    def from_json(cls, d: dict[str, Any], where: str = "") -> Job:
        try:
            return cls(job_id=int(d["job_id"]), trigger_time=float(d["trigger time"]), agent_id=int(d["agent_id"]),
                       trace_id=int(d["trace_id"]), task_input=str(d["task_input"]),
                       exe_time_detail=[(str(k), float(v)) for k, v in d["exe_time_detail"]],
                       tuf=[float(x) for x in d["tuf"]], task_exe_time=float(d.get("task_exe_time", 0.0)))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: malformed job record {d.get('job_id', '?')}: {e}") from None


@dataclass
class Workload:
    name: str
    jobs: list[Job]
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return max((j.trigger_time for j in self.jobs), default=0.0)

    def save(self, folder: str | Path) -> Path:
        d = Path(folder)
        d.mkdir(parents=True, exist_ok=True)
        (d / "jobs.json").write_text(json.dumps([j.to_json() for j in self.jobs], indent=1))
        (d / "config.json").write_text(json.dumps(self.config, indent=1))
        return d


def load_trace(path_or_name: str | Path) -> Workload:
    """Load an LRTrace folder (jobs.json + config.json), a jobs file, or a name under data/lrtrace."""
    p = Path(path_or_name)
    if not p.exists():
        p = data_dir() / "lrtrace" / str(path_or_name)
    if p.is_dir():
        jobs_file, cfg_file = p / "jobs.json", p / "config.json"
    else:
        jobs_file, cfg_file = p, p.with_name(p.stem + "_config.json")
    if not jobs_file.is_file():
        raise FileNotFoundError(f"no LRTrace jobs at {jobs_file}")
    raw = json.loads(jobs_file.read_text())
    jobs = [Job.from_json(r, str(jobs_file)) for r in raw]
    jobs.sort(key=lambda j: (j.trigger_time, j.job_id))
    cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    return Workload(p.name if p.is_dir() else p.stem, jobs, cfg)


@dataclass(frozen=True)
class WorkloadSettings:
    """Paper Table 3."""

    wid: int
    trace_ids: tuple[int, ...]
    lambda_rate: float  # events/s
    max_per_event: int
    num_agents: int
    duration_s: float
    job_interval: float = 0.001


SETTINGS: dict[str, WorkloadSettings] = {
    "wid1": WorkloadSettings(1, tuple(range(8)), 0.25, 8, 25, 260.0),
    "wid2": WorkloadSettings(2, tuple(range(8)), 0.25, 16, 42, 300.0),
    "wid3": WorkloadSettings(3, (8, 9, 10), 0.1, 8, 40, 900.0),
}


def exec_times_for(plan: str, robot_type: str, rng: random.Random) -> list[tuple[str, float]]:
    """Sample per-skill execution times of a plan from the execution-time model."""
    model = _exec_model(robot_type)
    return [(c.name, round(float(model.sample([c], rng)), 4)) for c in _plan_calls(robot_type, plan)]


@cache
def _skillset(robot_type: str):  # noqa: ANN202 - load_skill_set re-reads every YAML per call for a robot type
    from timelyllm_ros.skills.schema import load_skill_set

    return load_skill_set(robot_type)


@cache
def _plan_calls(robot_type: str, plan: str) -> tuple:
    return tuple(_skillset(robot_type).parse(plan))


@cache
def _exec_model(robot_type: str):  # noqa: ANN202 - cached per robot type
    from timelyllm_ros.skills.exec_model import ExecTimeModel

    return ExecTimeModel(_skillset(robot_type), learn=False)


def generate(settings: WorkloadSettings | str, seed: int = 0, *, duration_s: float | None = None,
             start_s: float = 0.0) -> Workload:
    """A new LRTrace-format workload with Table 3 arrivals and Table 2 tasks."""
    st = SETTINGS[settings] if isinstance(settings, str) else settings
    rng = random.Random(seed)
    tpls = plan_templates()
    missing = [t for t in st.trace_ids if t not in tpls]
    if missing:
        raise ValueError(f"no plan template for trace ids {missing}")
    end = st.duration_s if duration_s is None else duration_s
    jobs: list[Job] = []
    busy_until = [0.0] * st.num_agents
    events: list[float] = []
    structure: list[list[int]] = []
    t = start_s
    while True:
        t += rng.expovariate(st.lambda_rate)
        if t > start_s + end:
            break
        events.append(t)
        n = rng.randint(math.ceil(st.max_per_event / 2), st.max_per_event)
        ids = [rng.choice(st.trace_ids) for _ in range(n)]
        structure.append(ids)
        for i, tid in enumerate(ids):
            tpl = tpls[tid]
            at = t + i * st.job_interval
            detail = exec_times_for(tpl.plan, tpl.robot_type, rng)
            total = sum(v for _, v in detail)
            # Reuse a free agent (its previous task should be over), else the one free soonest.
            free = [a for a in range(st.num_agents) if busy_until[a] <= at]
            agent = free[0] if free else min(range(st.num_agents), key=busy_until.__getitem__)
            busy_until[agent] = max(at, busy_until[agent]) + total + 1.0
            jobs.append(Job(len(jobs), at, agent, tid, tpl.task_input, detail, tpl.tuf.to_trace(), total))
    cfg = {"num_agents": st.num_agents, "max_num_per_event": st.max_per_event, "lambda_rate": st.lambda_rate,
           "job_interval": st.job_interval, "wid": st.wid, "seed": seed, "generator": "timelyllm_ros.sim.workloads",
           "data_sample_structure": structure, "task_arrivals": events}
    return Workload(f"wid{st.wid}-gen-s{seed}", jobs, cfg)


def load_workload(name: str, seed: int = 0) -> Workload:
    """``wid2`` -> the real trace; ``wid1`` / ``wid3`` (or ``wid2-gen``) -> generated; else a path."""
    key = name.lower()
    if key == "wid2":
        return load_trace(data_dir() / "lrtrace" / "drone-wid2")
    if key.endswith("-gen"):
        key = key[:-4]
    if key in SETTINGS:
        return generate(key, seed)
    return load_trace(name)
