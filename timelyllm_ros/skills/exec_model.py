"""Robot execution-time model (design §7).

Per skill, the model is data in the skill set YAML (``exec_time``). For one
segment it gives a range: the scheduler uses ``min_s`` (the earliest the robot
can finish, so the next segment is ready in time even then), simulated robots
draw from :meth:`ExecTimeModel.sample`.

A segment that closes a loop (``}``) makes the robot replay the loop's body
count-1 more times: :meth:`ExecTimeModel.segment_range` predicts a segment in
the context of the plan before it, replays included, starting from the YAML model of
each call (:func:`.call_time.call_estimate`, also what plan bounds are checked with).

Online learning: executors report how long segments really took;
:meth:`ExecTimeModel.observe` adapts a per-skill multiplicative factor with a
normalised LMS step (for a one-skill segment that is an EWMA of
observed / modelled), so a slow battery or a faster firmware shows up in the
predictions. Sampling is never affected: it stands for the real robot.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence

from timelyllm_ros.skills.call_time import ZERO, ExecEstimate, arg_spec, call_estimate, formula
from timelyllm_ros.skills.minispec import SkillCall, Var, stream_cost
from timelyllm_ros.skills.schema import SkillSet, SkillSpec
from timelyllm_ros.skills.skill_files import load_skill_set

_TEXT = "_text"  # learning key of the chatbot reading-time model


Calls = Sequence[SkillCall] | str  # a segment's skill calls, or its text (a chatbot's reading time)


class ExecTimeModel:
    """Execution-time model of one robot type, built from its skill set."""

    def __init__(self, skillset: SkillSet | str, *, learn: bool = True, alpha: float = 0.2,
                 factor_bounds: tuple[float, float] = (0.25, 4.0), min_learn_s: float = 0.05) -> None:
        """``alpha``: learning rate (0..1]; ``factor_bounds``: clamp of the
        learned factors against outliers; ``min_learn_s``: segments modelled
        shorter than this (perception only) are not learned from, since the
        report's latency jitter would dominate them."""
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if not 0 < factor_bounds[0] <= 1 <= factor_bounds[1]:
            raise ValueError(f"factor_bounds must satisfy 0 < low <= 1 <= high, got {factor_bounds}")
        self.skillset = load_skill_set(skillset) if isinstance(skillset, str) else skillset
        self.learn = learn
        self.alpha = alpha
        self.factor_bounds = factor_bounds
        self.min_learn_s = min_learn_s
        self._factors: dict[str, float] = {}
        self._observations = 0
        self._lock = threading.Lock()

    @classmethod
    def for_robot(cls, name_or_robot_type: str, **kwargs) -> ExecTimeModel:
        return cls(load_skill_set(name_or_robot_type), **kwargs)

    # -- estimates --------------------------------------------------------------
    def estimate(self, calls: Calls) -> ExecEstimate:
        """Execution time of one segment (calls, or its text), learned
        factors applied."""
        if isinstance(calls, str):
            return self.estimate_text(calls)
        total = ZERO
        with self._lock:
            factors = dict(self._factors)
        for c in calls:
            total = total + self.base_estimate(c).scaled(factors.get(c.name, 1.0))
        return total

    def estimate_text(self, text: str) -> ExecEstimate:
        """Parse ``text`` with the skill set (SkillParseError if invalid) and
        estimate it; chatbot: reading time of its words."""
        if self.skillset.grammar == "text":
            with self._lock:
                f = self._factors.get(_TEXT, 1.0)
            return self._text_estimate(text).scaled(f)
        return self.estimate(self.skillset.parse(text))

    def base_estimate(self, call: SkillCall) -> ExecEstimate:
        """The YAML model of one call, without learning."""
        return call_estimate(self._spec(call), call)

    def segment_range(self, before: str, text: str) -> tuple[float, float]:
        """(min, max) seconds of a plan segment ``text`` sent after the plan so far ``before``, learned factors
        applied: its calls once, plus at each loop's ``}`` the count-1 replays of the loop's whole body (the
        robot replays it then; nested loops multiply). SkillParseError if the text is invalid after ``before``,
        or the plan so far exceeds a bound of the skill set (see :func:`~.minispec.stream_cost`). Prose: its
        reading time."""
        if self.skillset.grammar == "text":
            e = self.estimate_text(text)
            return e.min_s, e.max_s
        with self._lock:
            factors = dict(self._factors)

        def cost(c: SkillCall) -> tuple[float, float]:
            e = self.base_estimate(c)
            f = factors.get(c.name, 1.0)
            return e.min_s * f, e.max_s * f

        seg, _ = stream_cost(self.skillset, before, text, cost)
        return seg.min_s, seg.max_s

    # -- simulation -------------------------------------------------------------
    def sample(self, calls: Calls, rng: random.Random) -> float:
        """One draw of how long a (simulated) robot takes for the segment."""
        if isinstance(calls, str):
            if self.skillset.grammar == "text":
                e = self._text_estimate(calls)
                return rng.uniform(e.min_s, e.max_s)
            calls = self.skillset.parse(calls)
        return sum(self._sample_call(c, rng) for c in calls)

    def _sample_call(self, call: SkillCall, rng: random.Random) -> float:
        spec = self._spec(call)
        et = spec.exec_time
        p = et.params
        if et.model == "uniform":
            return rng.uniform(p["low"], p["high"])
        if et.model == "composite":  # one draw of each skill it runs
            return self.sample(p["runs"], rng)
        if et.model == "repeated":
            lo_k, hi_k = p["min_count"], p["max_count"]
            counts = range(lo_k, hi_k + 1)
            w = p.get("count_weights")
            k = rng.choices(counts, weights=w)[0] if w else rng.randint(lo_k, hi_k)
            return p.get("base", 0.0) + p["unit"] * k
        if et.model == "constant":
            t = p["value"]
        else:
            v = call.arg(et.arg or "")
            if isinstance(v, Var) or v is None:  # unknown until run time: any value in bounds
                arg = arg_spec(spec, call, et)
                v = rng.uniform(arg.min, arg.max) if arg.min is not None and arg.max is not None else arg.typical
            t = formula(et, float(v or 0.0))
        return max(0.0, t * (1 + rng.uniform(-et.noise, et.noise)))

    # -- learning ---------------------------------------------------------------
    def observe(self, calls: Calls, observed_s: float) -> None:
        """Learn from a reported execution time of a segment (no-op when
        ``learn`` is off or the segment is too short to learn from)."""
        if not self.learn or observed_s < 0:
            return
        parts: dict[str, float] = {}  # skill -> modelled (typical) seconds in this segment
        if isinstance(calls, str) and self.skillset.grammar == "text":
            parts[_TEXT] = self._text_estimate(calls).typical_s
        else:
            for c in self.skillset.parse(calls) if isinstance(calls, str) else calls:
                parts[c.name] = parts.get(c.name, 0.0) + self.base_estimate(c).typical_s
        base = sum(parts.values())
        if base < self.min_learn_s:
            return
        lo, hi = self.factor_bounds
        norm = sum(t * t for t in parts.values())
        with self._lock:
            predicted = sum(self._factors.get(k, 1.0) * t for k, t in parts.items())
            err = observed_s - predicted
            for k, t in parts.items():
                # Normalised LMS: the correction is shared in proportion to each
                # skill's modelled time; one skill -> EWMA of observed/modelled.
                f = self._factors.get(k, 1.0) + self.alpha * err * t / norm
                self._factors[k] = min(hi, max(lo, f))
            self._observations += 1

    def factor(self, skill: str) -> float:
        """Learned multiplier of a skill (1.0 when nothing learned)."""
        spec = self.skillset.get(skill)
        key = spec.name if spec is not None else skill
        with self._lock:
            return self._factors.get(key, 1.0)

    def factors(self) -> dict[str, float]:
        with self._lock:
            return dict(self._factors)

    @property
    def observations(self) -> int:
        with self._lock:
            return self._observations

    def reset_learning(self) -> None:
        with self._lock:
            self._factors.clear()
            self._observations = 0

    # -- helpers --------------------------------------------------------------
    def _spec(self, call: SkillCall) -> SkillSpec:
        if call.skillset_id != self.skillset.id:
            raise ValueError(f"call {call.raw!r} is from skill set {call.skillset_id!r}, "
                             f"this model is for {self.skillset.id!r}")
        return self.skillset[call.name]

    def _text_estimate(self, text: str) -> ExecEstimate:
        m = self.skillset.text_exec_time
        words = len(text.split())
        return ExecEstimate(words * m.get("min_per_word", 0.0), words * m.get("typical_per_word", 0.0),
                            words * m.get("max_per_word", 0.0))
