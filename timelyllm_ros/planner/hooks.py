"""What the planner core needs of a robot type's skill set: its stop checker, validators, parser and
execution-time model, loaded on first use and kept."""

from __future__ import annotations

import logging
from typing import Any

from timelyllm_ros.skills.minispec import SkillParseError
from timelyllm_ros.skills.segmenter import StopChecker

log = logging.getLogger(__name__)


class SkillHooks:
    """Stop checkers, parsers and exec-time models per robot type (lazy, cached)."""

    def __init__(self, learn: bool = True) -> None:
        self.learn = learn
        self._sets: dict[str, Any] = {}
        self._models: dict[str, Any] = {}

    def skillset(self, robot_type: str) -> Any:
        s = self._sets.get(robot_type)
        if s is None:
            from timelyllm_ros.skills.skill_files import load_skill_set

            s = self._sets[robot_type] = load_skill_set(robot_type)
        return s

    def use_skillset(self, robot_type: str, skillset: Any) -> None:
        """Serve ``robot_type`` with this skill set instead of the one its name loads (a caller's own, or a
        test's faulty one)."""
        self._sets[robot_type] = skillset

    def stop_checker(self, robot_type: str) -> StopChecker:
        from timelyllm_ros.skills.segmenter import make_stop_checker

        return make_stop_checker(self.skillset(robot_type))

    def validate(self, robot_type: str, text: str) -> str | None:
        """None if ``text`` is a valid segment of the robot's skill set, else the reason."""
        try:
            return self.skillset(robot_type).validate(text)
        except Exception as e:  # noqa: BLE001 - a validator that raises fails this plan, not the engine loop
            return f"the {robot_type} validator raised {type(e).__name__}: {e}"

    def validate_plan(self, robot_type: str, text: str) -> str | None:
        """None if ``text`` is a valid complete plan of the robot's skill set, else the reason."""
        try:
            return self.skillset(robot_type).validate_plan(text)
        except Exception as e:  # noqa: BLE001
            return f"the {robot_type} plan validator raised {type(e).__name__}: {e}"

    def parse(self, robot_type: str, text: str) -> list[Any]:
        if not text.strip():
            return []
        try:
            return list(self.skillset(robot_type).parse(text))
        except Exception as e:  # still dispatched: the robot's executor reports the error
            log.warning("segment %r does not parse for %s: %s", text, robot_type, e)
            return []

    def exec_model(self, robot_type: str) -> Any:
        m = self._models.get(robot_type)
        if m is None:
            from timelyllm_ros.skills.exec_model import ExecTimeModel

            m = self._models[robot_type] = ExecTimeModel(self.skillset(robot_type), learn=self.learn)
        return m

    def exec_range(self, robot_type: str, calls: list[Any], *, text: str | None = None,
                   before: str = "") -> tuple[float, float]:
        """The execution-time model's (minimum, maximum) for these skill calls; (0, 0) for none. Given the
        segment's ``text`` and the plan's text ``before`` it, loops count: at a loop's ``}`` the robot replays its
        body count-1 more times, so a robot still in a long loop is not taken for silent. Then SkillParseError
        if the segment is invalid after ``before``, e.g. the plan would exceed a bound of its skill set."""
        if text is not None and text.strip() and self.skillset(robot_type).grammar != "text":
            try:
                return self.exec_model(robot_type).segment_range(before, text)
            except SkillParseError:
                raise
            except Exception as e:  # a model fault must not end the task: the calls alone
                log.warning("exec-time estimate failed for %r after %r: %s", text, before, e)
        if not calls:
            return 0.0, 0.0
        try:
            e = self.exec_model(robot_type).estimate(calls)
            return float(e.min_s), float(e.max_s)
        except Exception as e:
            log.warning("exec-time estimate failed for %r: %s", calls, e)
            return 0.0, 0.0
