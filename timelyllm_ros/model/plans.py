"""The paper's task types (Table 2, data/plans.yaml): per trace id, the robot type, TUF level,
task text and the plan the simulated engine writes for it. Read by the simulated engine, the
workload generator, bag converters and tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from timelyllm_ros import paths
from timelyllm_ros.model.tuf import LEVELS, TimeUtility


@dataclass(frozen=True)
class PlanTemplate:
    trace_id: int
    paper_task: int
    name: str
    robot_type: str
    level: str
    task_input: str
    plan: str

    @property
    def tuf(self) -> TimeUtility:
        return TimeUtility.named(self.level)


@cache
def plan_templates(path: str | None = None) -> dict[int, PlanTemplate]:
    """Task types by trace id, from data/plans.yaml."""
    p = Path(path) if path else paths.data_dir() / "plans.yaml"
    raw = yaml.safe_load(p.read_text())
    out: dict[int, PlanTemplate] = {}
    for i, t in enumerate(raw.get("tasks") or []):
        try:
            tpl = PlanTemplate(**{k: t[k] for k in PlanTemplate.__dataclass_fields__})
        except (KeyError, TypeError) as e:
            raise ValueError(f"{p}: task #{i} is malformed ({e})") from None
        if tpl.level not in LEVELS:
            raise ValueError(f"{p}: task {tpl.name}: unknown level {tpl.level!r}")
        if tpl.trace_id in out:
            raise ValueError(f"{p}: trace_id {tpl.trace_id} used twice")
        out[tpl.trace_id] = tpl
    return out
