"""LRTrace workloads: load the published format, generate new ones (design §8).

A workload is a list of jobs (``jobs.json``) plus a ``config.json``, in the
format of data/lrtrace/drone-wid2 (see its SOURCE.md). A job's task type is
(robot_type, robot_system, trace_id) as the record carries them (drone traces
carry neither robot field), looked up in data/plans.yaml; a record that does
not name a known task type, or has a field we do not read, is refused.
Generated workloads use the paper's Table 2 tasks (data/plans.yaml) and
Table 3 settings: Poisson events at ``lambda_rate`` events/s, each releasing
U[max/2, max] tasks 1 ms apart, agents reused once their previous task
should have ended.
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
from timelyllm_ros.domain.plans import DEFAULT_TRACE_ROBOT, PlanTemplate, TaskKey, plan_templates, trace_robots
from timelyllm_ros.domain.tuf import TimeUtility


def data_dir() -> Path:
    return paths.data_dir()


# Every field an LRTrace job record may carry; anything else is refused, not ignored.
JOB_FIELDS = frozenset({"job_id", "trigger time", "agent_id", "robot_type", "robot_system", "trace_id",
                        "task_input", "exe_time_detail", "task_exe_time", "tuf"})


class TraceError(ValueError):
    """A job record that cannot be read as it stands (names the file, the job and the field)."""


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
    # As the record carries them: None where it has neither (LRTrace's drone traces), see task_key.
    robot_type: str | None = None
    robot_system: str | None = None

    @property
    def task_key(self) -> TaskKey:
        """The job's task type; a record with neither robot field is a drone (typefly) task."""
        if self.robot_type is None and self.robot_system is None:
            return TaskKey(*DEFAULT_TRACE_ROBOT, self.trace_id)
        return TaskKey(str(self.robot_type), str(self.robot_system), self.trace_id)

    @property
    def template(self) -> PlanTemplate:
        """The job's task type from data/plans.yaml (KeyError if unknown; load_trace refuses those)."""
        return plan_templates()[self.task_key]

    @property
    def time_utility(self) -> TimeUtility:
        return TimeUtility.from_trace(self.tuf)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"job_id": self.job_id, "trigger time": self.trigger_time, "agent_id": self.agent_id}
        if self.robot_type is not None:  # only what the record carried: a drone trace round-trips unchanged
            d["robot_type"] = self.robot_type
        if self.robot_system is not None:
            d["robot_system"] = self.robot_system
        d.update({"trace_id": self.trace_id, "task_input": self.task_input,
                  "exe_time_detail": [[k, v] for k, v in self.exe_time_detail],
                  "task_exe_time": self.task_exe_time, "tuf": list(self.tuf)})
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any], where: str = "") -> Job:
        """Read one LRTrace record, checking every field it carries (see :func:`check_job`)."""
        if not isinstance(d, dict):
            raise TraceError(f"{where}: job record is not an object: {d!r:.80}")
        jid = d.get("job_id", "?")
        extra = sorted(set(d) - JOB_FIELDS)
        if extra:
            raise TraceError(f"{where}: job {jid}: unknown field(s) {extra}; known: {sorted(JOB_FIELDS)}")
        for k in ("robot_type", "robot_system"):
            if k in d and not isinstance(d[k], str):
                raise TraceError(f"{where}: job {jid}: {k} must be a string, got {d[k]!r}")
        try:
            job = cls(job_id=int(d["job_id"]), trigger_time=float(d["trigger time"]), agent_id=int(d["agent_id"]),
                      trace_id=int(d["trace_id"]), task_input=str(d["task_input"]),
                      exe_time_detail=[(str(k), float(v)) for k, v in d["exe_time_detail"]],
                      tuf=[float(x) for x in d["tuf"]], task_exe_time=float(d.get("task_exe_time", 0.0)),
                      robot_type=d.get("robot_type"), robot_system=d.get("robot_system"))
        except (KeyError, TypeError, ValueError) as e:
            raise TraceError(f"{where}: malformed job record {jid}: {e}") from None
        check_job(job, where)
        return job


def check_job(job: Job, where: str = "") -> PlanTemplate:
    """The job's task type, or TraceError naming the job and the field that is not understood.

    A record with only one of robot_type / robot_system is refused (only one with neither is a
    drone task), as are an unknown robot type, robot system or trace id, a TUF that is not
    [beta, ERT, cutoff], and a skill in exe_time_detail that the task's robot does not have.
    """
    at = f"{where}: job {job.job_id}"
    robots = trace_robots()
    if (job.robot_type is None) != (job.robot_system is None):
        missing = "robot_system" if job.robot_system is None else "robot_type"
        raise TraceError(f"{at}: {missing} is missing (a record names both robot_type and robot_system, "
                         f"or neither for a drone task)")
    key = job.task_key
    if key.robot_type not in robots:
        raise TraceError(f"{at}: robot_type {key.robot_type!r} is unknown; known: {sorted(robots)}")
    if key.robot_system not in robots[key.robot_type]:
        raise TraceError(f"{at}: robot_system {key.robot_system!r} is unknown for robot_type {key.robot_type!r}; "
                         f"known: {sorted(robots[key.robot_type])}")
    tpl = plan_templates().get(key)
    if tpl is None:
        known = sorted(k.trace_id for k in plan_templates() if k[:2] == key[:2])
        raise TraceError(f"{at}: trace_id {key.trace_id} is unknown for {key.robot_type}/{key.robot_system}; "
                         f"known: {known}")
    try:
        TimeUtility.from_trace(job.tuf)
    except ValueError as e:
        raise TraceError(f"{at}: tuf: {e}") from None
    ss = _skillset(tpl.robot_type)
    for i, (k, _) in enumerate(job.exe_time_detail):
        if ss.get(k.rstrip("(")) is None:
            raise TraceError(f"{at}: exe_time_detail[{i}]: {k!r} is no skill of the {tpl.robot_type} "
                             f"({key.robot_type}/{key.robot_system} task {tpl.name})")
    return tpl


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


# LRTrace's published traces by the name we store them under (data/lrtrace/<name>, see its SOURCE.md):
# the file of github.com/MarkoMile/TimelyLLM each one is.
PUBLISHED_TRACES: dict[str, str] = {
    "drone-wid1": "dataset/data_sample_2.json",
    "drone-wid2": "dataset/data_sample_1.json",
    "robotarm-fltrnn": "dataset/data_sample_robotarm_fltrnn.json",
}


def load_trace(path_or_name: str | Path) -> Workload:
    """Load an LRTrace folder (jobs.json + config.json), a jobs file, or a name under data/lrtrace
    (``drone-wid1``, ``drone-wid2``, ``robotarm-fltrnn``). Every job must be a known task type (TraceError
    otherwise)."""
    p = Path(path_or_name)
    if not p.exists():
        p = data_dir() / "lrtrace" / str(path_or_name)
    if p.is_dir():
        jobs_file, cfg_file = p / "jobs.json", p / "config.json"
    else:
        jobs_file, cfg_file = p, p.with_name(p.stem + "_config.json")
    if not jobs_file.is_file():
        hint = ""
        if str(path_or_name) in PUBLISHED_TRACES:
            hint = (f" (the published trace {path_or_name!r} is {PUBLISHED_TRACES[str(path_or_name)]} and its "
                    f"_config.json of github.com/MarkoMile/TimelyLLM; store them there as jobs.json, config.json)")
        raise FileNotFoundError(f"no LRTrace jobs at {jobs_file}{hint}")
    raw = json.loads(jobs_file.read_text())
    if not isinstance(raw, list):
        raise TraceError(f"{jobs_file}: expected a list of job records")
    jobs = [Job.from_json(r, str(jobs_file)) for r in raw]
    jobs.sort(key=lambda j: (j.trigger_time, j.job_id))
    cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    return Workload(p.name if p.is_dir() else p.stem, jobs, cfg)


def record_robot(tpl: PlanTemplate) -> tuple[str | None, str | None]:
    """(robot_type, robot_system) a job record of this task type carries: none for the drone (typefly)
    tasks, as LRTrace's drone traces have it, both otherwise."""
    pair = (tpl.trace_robot_type, tpl.robot_system)
    return (None, None) if pair == DEFAULT_TRACE_ROBOT else pair


@dataclass(frozen=True)
class WorkloadSettings:
    """Paper Table 3."""

    wid: int
    tasks: tuple[TaskKey, ...]  # the task types events draw from
    lambda_rate: float  # events/s
    max_per_event: int
    num_agents: int
    duration_s: float
    job_interval: float = 0.001


def _tasks(robot: tuple[str, str], trace_ids: range) -> tuple[TaskKey, ...]:
    return tuple(TaskKey(*robot, i) for i in trace_ids)


SETTINGS: dict[str, WorkloadSettings] = {
    "wid1": WorkloadSettings(1, _tasks(DEFAULT_TRACE_ROBOT, range(8)), 0.25, 8, 25, 260.0),
    "wid2": WorkloadSettings(2, _tasks(DEFAULT_TRACE_ROBOT, range(8)), 0.25, 16, 42, 300.0),
    "wid3": WorkloadSettings(3, _tasks(("robotarm", "fltrnn"), range(3)), 0.1, 8, 40, 900.0),
}


def exec_times_for(plan: str, robot_type: str, rng: random.Random) -> list[tuple[str, float]]:
    """Sample per-skill execution times of a plan from the execution-time model, each under the
    name the plan calls it by (an arm trace says take / drop where the skill set's names are pick / place)."""
    model = _exec_model(robot_type)
    return [(c.raw[:c.raw.index("(")].strip(), round(float(model.sample([c], rng)), 4))
            for c in _plan_calls(robot_type, plan)]


@cache
def _skillset(robot_type: str):  # noqa: ANN202 - load_skill_set re-reads every YAML per call for a robot type
    from timelyllm_ros.skills.skill_files import load_skill_set

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
    missing = [tuple(t) for t in st.tasks if t not in tpls]
    if missing:
        raise ValueError(f"no plan template for task types {missing}")
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
        keys = [rng.choice(st.tasks) for _ in range(n)]
        structure.append([k.trace_id for k in keys])  # as LRTrace's config: trace ids per event
        for i, key in enumerate(keys):
            tpl = tpls[key]
            at = t + i * st.job_interval
            detail = exec_times_for(tpl.plan, tpl.robot_type, rng)
            total = sum(v for _, v in detail)
            # Reuse a free agent (its previous task should be over), else the one free soonest.
            free = [a for a in range(st.num_agents) if busy_until[a] <= at]
            agent = free[0] if free else min(range(st.num_agents), key=busy_until.__getitem__)
            busy_until[agent] = max(at, busy_until[agent]) + total + 1.0
            rtype, rsystem = record_robot(tpl)
            jobs.append(Job(len(jobs), at, agent, key.trace_id, tpl.task_input, detail, tpl.tuf.to_trace(), total,
                            robot_type=rtype, robot_system=rsystem))
    cfg = {"num_agents": st.num_agents, "max_num_per_event": st.max_per_event, "lambda_rate": st.lambda_rate,
           "job_interval": st.job_interval, "wid": st.wid, "seed": seed, "generator": "timelyllm_ros.sim.workloads",
           "data_sample_structure": structure, "task_arrivals": events}
    return Workload(f"wid{st.wid}-gen-s{seed}", jobs, cfg)


def load_workload(name: str, seed: int = 0) -> Workload:
    """``wid2`` -> the real drone trace; ``wid1`` / ``wid3`` (or ``wid2-gen``) -> generated; else a
    trace name under data/lrtrace (``drone-wid2``, ``robotarm-fltrnn``) or a path."""
    key = name.lower()
    if key == "wid2":
        return load_trace(data_dir() / "lrtrace" / "drone-wid2")
    if key.endswith("-gen"):
        key = key[:-4]
    if key in SETTINGS:
        return generate(key, seed)
    return load_trace(name)
