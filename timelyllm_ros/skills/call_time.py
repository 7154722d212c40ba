"""The YAML execution-time model of one skill call (``exec_time`` in a skill set), without learning: what the
planner's robot model starts from (:mod:`.exec_model`), and what plan bounds are checked with
(:mod:`.minispec`), so that both read one definition."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # schema sits above this module (it loads the parser, which checks bounds with this model)
    from timelyllm_ros.skills.minispec import SkillCall
    from timelyllm_ros.skills.schema import ExecTimeSpec, SkillArg, SkillSpec


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
    elif et.model == "composite":  # the sum of what it runs, resolved when its skill set loads (schema)
        lo, typ, hi = p["min"], p["typical"], p["max"]
    else:  # validated at load time
        raise ValueError(f"unknown exec_time model {et.model!r}")
    n = et.noise
    return ExecEstimate(max(0.0, lo * (1 - n)), max(0.0, typ), max(0.0, hi * (1 + n)))


def _formula_range(spec: SkillSpec, call: SkillCall) -> tuple[float, float, float]:
    et = spec.exec_time
    v = call.arg(et.arg or "")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        t = formula(et, float(v))
        return t, t, t
    # Variable argument: the range over the argument's bounds.
    arg = arg_spec(spec, call, et)
    pts = [x for x in (arg.min, arg.max) if x is not None]
    typical = arg.typical if arg.typical is not None else (sum(pts) / len(pts) if pts else 0.0)
    vals = [formula(et, float(x)) for x in (*pts, typical)]
    return min(vals), formula(et, float(typical)), max(vals)


def formula(et: ExecTimeSpec, v: float) -> float:
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


def arg_spec(spec: SkillSpec, call: SkillCall, et: ExecTimeSpec) -> SkillArg:
    for sig in spec.signatures:
        for a in sig:
            if a.name == et.arg:
                return a
    raise ValueError(f"{spec.name}: exec_time.arg {et.arg!r} is not an argument")
