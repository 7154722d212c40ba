"""The paper's task types (Table 2, data/plans.yaml): per LRTrace task key (robot type, robot
system, trace id), the robot type that runs it, TUF level, task text and the plan the simulated
engine writes for it. Read by the simulated engine, the workload loader and generator, bag
converters and tests.

LRTrace numbers ``trace_id`` from 0 within each robot type (drone trace 0 is "find the cat",
robot-arm trace 0 is object stacking), so a trace id alone does not name a task type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from timelyllm_ros import paths
from timelyllm_ros.domain.tuf import LEVELS, TimeUtility
from timelyllm_ros.yamlfile import load_yaml_file


class TaskKey(NamedTuple):
    """A task type as LRTrace names it: the job's ``robot_type``, ``robot_system`` and ``trace_id``."""

    robot_type: str  # LRTrace's name: drone, robotarm (not the skill set's robot type)
    robot_system: str  # the planning system the trace was made with: typefly, fltrnn
    trace_id: int


# LRTrace's drone traces (data_sample_1.json = data/lrtrace/drone-wid2) predate the two fields
# and carry neither; the trace generator calls that set "drone-typefly".
DEFAULT_TRACE_ROBOT: tuple[str, str] = ("drone", "typefly")


@dataclass(frozen=True)
class PlanTemplate:
    trace_id: int
    paper_task: int
    name: str
    robot_type: str  # the skill set's robot type that runs it (drone, arm)
    level: str
    task_input: str
    plan: str
    trace_robot_type: str  # LRTrace's robot_type of the task (drone, robotarm)
    robot_system: str
    # What a plan for this task must do to be acceptable (optional; read and checked against the skill set
    # by timelyllm_ros.skills.quality). Kept raw here: the model layer knows no skill sets.
    quality: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def tuf(self) -> TimeUtility:
        return TimeUtility.named(self.level)

    @property
    def key(self) -> TaskKey:
        return TaskKey(self.trace_robot_type, self.robot_system, self.trace_id)


_FIELDS = tuple(PlanTemplate.__dataclass_fields__)
_OPTIONAL = ("quality",)


@cache
def plan_templates(path: str | None = None) -> dict[TaskKey, PlanTemplate]:
    """Task types by LRTrace key, from data/plans.yaml (every field but ``quality`` required, no others)."""
    p = Path(path) if path else paths.data_dir() / "plans.yaml"
    raw = load_yaml_file(p)
    out: dict[TaskKey, PlanTemplate] = {}
    for i, t in enumerate(raw.get("tasks") or []):
        if not isinstance(t, dict):
            raise ValueError(f"{p}: task #{i} is not a mapping")
        extra = sorted(set(t) - set(_FIELDS))
        if extra:
            raise ValueError(f"{p}: task #{i} ({t.get('name', '?')}): unknown field(s) {extra}")
        try:
            tpl = PlanTemplate(**{k: t[k] for k in _FIELDS if k not in _OPTIONAL or k in t})
        except KeyError as e:
            raise ValueError(f"{p}: task #{i} ({t.get('name', '?')}) lacks field {e}") from None
        if not isinstance(tpl.quality, Mapping):
            raise ValueError(f"{p}: task {tpl.name}: quality must be a mapping, got {type(tpl.quality).__name__}")
        if tpl.level not in LEVELS:
            raise ValueError(f"{p}: task {tpl.name}: unknown level {tpl.level!r}")
        if tpl.key in out:
            raise ValueError(f"{p}: task key {tuple(tpl.key)} used twice")
        out[tpl.key] = tpl
    return out


def trace_robots() -> dict[str, set[str]]:
    """LRTrace robot types and, for each, the robot systems data/plans.yaml knows."""
    out: dict[str, set[str]] = {}
    for k in plan_templates():
        out.setdefault(k.robot_type, set()).add(k.robot_system)
    return out


def trace_robot_of(robot_type: str) -> tuple[str, str] | None:
    """(LRTrace robot_type, robot_system) of the tasks a skill-set robot type runs, if one pair."""
    pairs = {(t.trace_robot_type, t.robot_system) for t in plan_templates().values() if t.robot_type == robot_type}
    return pairs.pop() if len(pairs) == 1 else None


def template_by_text(robot_type: str, task: str) -> PlanTemplate | None:
    """The task type that a robot of this (skill-set) robot type is given with exactly this text."""
    for t in plan_templates().values():
        if t.robot_type == robot_type and t.task_input.strip() == task.strip():
            return t
    return None
