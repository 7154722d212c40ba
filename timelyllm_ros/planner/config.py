"""The planner core's settings (:class:`CoreConfig`): its fields, defaults and checks come from the settings table
(``planner/settings.py``, the entries that apply to the core), so none is declared twice."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from timelyllm_ros.planner.settings import SETTINGS, Setting

CORE_SETTINGS: tuple[Setting, ...] = tuple(st for st in SETTINGS if st.applies == "core")


def _fields_from_table(cls: type) -> type:
    """``cls`` as a dataclass with a field per core setting (its annotation and default from the table)."""
    annotations = cls.__dict__.get("__annotations__", {})
    for st in CORE_SETTINGS:
        annotations[st.name] = st.annotation
        default = st.fresh_default(core=True)
        setattr(cls, st.name, field(default_factory=lambda st=st: st.fresh_default(core=True))
                if isinstance(default, list | dict | set) else default)
    cls.__annotations__ = annotations
    return dataclass(cls)


@_fields_from_table
class CoreConfig:
    """The core's settings, read when a PlannerCore is built (its parts keep what they need): set them before.
    One field per core setting of ``planner/settings.py``, each refused at construction by its setting's rule
    (ValueError naming it); a core built alone (simulator, tests) gets the settings' ``core_default``."""

    def __post_init__(self) -> None:
        for st in CORE_SETTINGS:
            if (why := st.problem(getattr(self, st.name))) is not None:
                raise ValueError(f"CoreConfig.{st.name}: {why}")

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CoreConfig:
        """The core's settings among the planner node's parameter values; the core's own at their defaults."""
        return cls(**{st.name: params[st.name] for st in CORE_SETTINGS if st.param})

    # The core works in seconds, with None for "off" (the parameters say 0, and gather and prefill in ms).
    @property
    def gather_s(self) -> float:
        return self.gather_ms / 1000

    @property
    def prefill_step_s(self) -> float | None:
        """Latency-guided admission's prefill budget per step (LatencyGuided.prefill_step_s); None: off."""
        return self.prefill_step_ms / 1000 if self.prefill_step_ms > 0 else None

    @property
    def silence_timeout_s(self) -> float | None:
        """A robot that has not reported a dispatched segment by its predicted end + this margin has failed;
        None: trust predictions forever."""
        return self.robot_timeout_s if self.robot_timeout_s > 0 else None


__all__ = ["CORE_SETTINGS", "CoreConfig"]
