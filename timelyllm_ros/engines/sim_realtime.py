"""The simulated engine in wall-clock time, for ROS nodes and their tests.

The core's SimEngine returns a modelled step duration and lets the
discrete-event simulator jump the clock. Under a RealClock (the planner node)
nothing would pace it, so this subclass sleeps each step's modelled time: it
behaves like a real engine of that speed, deterministically, without weights.
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from collections.abc import Sequence

from timelyllm_ros.domain.plans import plan_templates
from timelyllm_ros.engines.base import RawTokens, StepModel
from timelyllm_ros.engines.sim_engine import SimEngine, SimEngineConfig


def sim_plan_for(robot_type: str, task: str) -> str:
    """The plan the simulated engine writes for ``task``: the Table 2 task with
    the same text, else one whose name appears in it, else a deterministic pick
    among that robot type's tasks."""
    tpls = [t for t in plan_templates().values() if t.robot_type == robot_type]
    if not tpls:
        raise ValueError(f"robot_type: the simulated engine has no plans for {robot_type!r}")
    for t in tpls:
        if t.task_input.strip() == task.strip():
            return t.plan
    low = task.lower()
    for t in tpls:
        if t.name.replace("_", " ") in low:
            return t.plan
    return tpls[zlib.crc32(task.encode()) % len(tpls)].plan


class RealtimeSimEngine(SimEngine):
    """SimEngine paced in wall-clock time; its info is SimEngine's (needs_plan_text: the planner
    attaches extra['plan_text'] from :func:`sim_plan_for`)."""

    def __init__(self, config: SimEngineConfig | None = None, *, time_scale: float = 1.0) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        super().__init__(config)
        self.time_scale = time_scale
        m = self.cfg
        self.info = dataclasses.replace(self.info, step_model=StepModel(
            m.decode_s * time_scale, m.batch_slowdown, m.prefill_s_per_token * time_scale,
            f"the simulated engine's own step model, paced x{time_scale:g}"))

    def _backend_step(self) -> tuple[Sequence[RawTokens], float | None, int]:
        outs, modelled, prefill = super()._backend_step()
        time.sleep((modelled or 0.0) * self.time_scale)
        return outs, None, prefill  # None: the engine measures the wall time it really took
