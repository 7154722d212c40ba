"""Robot execution-time model (design §7).

Per skill, the model is data in the skill set YAML (``exec_time``). For one
segment it gives a range: the scheduler uses ``min_s`` (the earliest the robot
can finish, so the next segment is ready in time even then), simulated robots
draw from :meth:`ExecTimeModel.sample`.

A segment that closes a loop (``}``) makes the robot replay the loop's body
count-1 more times: :meth:`ExecTimeModel.segment_range` predicts a segment in
the context of the plan before it, replays included. :func:`call_estimate` is
the YAML model of one call, also what plan bounds are checked with
(:mod:`.minispec`).

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
from dataclasses import dataclass

from timelyllm_ros.skills.minispec import stream_cost
from timelyllm_ros.skills.schema import ExecTimeSpec, SkillArg, SkillCall, SkillSet, SkillSpec, Var, load_skill_set

_TEXT = "_text"  # learning key of the chatbot reading-time model


@dataclass(frozen=True)
class ExecEstimate:
    min_s: float
    typical_s: float
    max_s: float

    def __add__(self, other: ExecEstimate) -> ExecEstimate:
        return ExecEstimate(self.min_s + other.min_s, self.typical_s + other.typical_s, self.max_s + other.max_s)

    def scaled(self, f: float) -> ExecEstimate:
        return ExecEstimate(self.min_s * f, self.typical_s * f, self.max_s * f)

    @property
    def scheduling_s(self) -> float:
        """What the scheduler should plan with (design §7: the minimum)."""
        return self.min_s


ZERO = ExecEstimate(0.0, 0.0, 0.0)

Segment = Sequence[SkillCall] | str


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
    def estimate(self, calls: Segment) -> ExecEstimate:
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
    def sample(self, calls: Segment, rng: random.Random) -> float:
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
                arg = _arg_spec(spec, call, et)
                v = rng.uniform(arg.min, arg.max) if arg.min is not None and arg.max is not None else arg.typical
            t = _formula(et, float(v or 0.0))
        return max(0.0, t * (1 + rng.uniform(-et.noise, et.noise)))

    # -- learning ---------------------------------------------------------------
    def observe(self, calls: Segment, observed_s: float) -> None:
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


def call_estimate(spec: SkillSpec, call: SkillCall) -> ExecEstimate:
    """The YAML model of one call of ``spec``, without learning (pure: also what plan bounds are checked with)."""
    et = spec.exec_time
    p = et.params
    if et.model == "constant":
        lo = typ = hi = p["value"]
    elif et.model in ("linear", "polynomial"):
        lo, typ, hi = _formula_range(spec, call)
    elif et.model == "repeated":
        base = p.get("base", 0.0)
        lo = base + p["unit"] * p["min_count"]
        hi = base + p["unit"] * p["max_count"]
        typ = base + p["unit"] * _expected_count(p)
    elif et.model == "uniform":
        lo, hi = p["low"], p["high"]
        typ = (lo + hi) / 2
    else:  # validated at load time
        raise ValueError(f"unknown exec_time model {et.model!r}")
    n = et.noise
    return ExecEstimate(max(0.0, lo * (1 - n)), max(0.0, typ), max(0.0, hi * (1 + n)))


def _formula_range(spec: SkillSpec, call: SkillCall) -> tuple[float, float, float]:
    et = spec.exec_time
    v = call.arg(et.arg or "")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        t = _formula(et, float(v))
        return t, t, t
    # Variable argument: the range over the argument's bounds.
    arg = _arg_spec(spec, call, et)
    pts = [x for x in (arg.min, arg.max) if x is not None]
    typical = arg.typical if arg.typical is not None else (sum(pts) / len(pts) if pts else 0.0)
    vals = [_formula(et, float(x)) for x in (*pts, typical)]
    return min(vals), _formula(et, float(typical)), max(vals)


def _formula(et: ExecTimeSpec, v: float) -> float:
    p = et.params
    if et.model == "linear":
        return p["a"] * v + p["b"]
    return sum(c * v**i for i, c in enumerate(p["coeffs"]))


def _expected_count(p: dict) -> float:
    lo_k, hi_k = p["min_count"], p["max_count"]
    w = p.get("count_weights")
    if not w:
        return (lo_k + hi_k) / 2
    return sum((lo_k + i) * x for i, x in enumerate(w)) / sum(w)


def _arg_spec(spec: SkillSpec, call: SkillCall, et: ExecTimeSpec) -> SkillArg:
    for sig in spec.signatures:
        for a in sig:
            if a.name == et.arg:
                return a
    raise ValueError(f"{spec.name}: exec_time.arg {et.arg!r} is not an argument")
