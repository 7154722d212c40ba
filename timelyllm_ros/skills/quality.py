"""Plan quality: is a plan one a robotics engineer would accept for its task?

Two levels, both judged by the skill set's one parser (:meth:`SkillSet.validate_plan`):

* **valid**: the plan parses as calls of the robot's skill set with every argument inside its declared
  bounds, and it ended (a generation cut by its token budget is not a plan);
* **acceptable**: a valid plan that also passes the semantic checks its task template declares under
  ``quality:`` in data/plans.yaml:

  ``require``   calls that must appear anywhere. An item is a pattern or a list of alternatives (one of
                them must appear). A pattern is a skill name (``g``: any arguments) or a call with literal
                arguments (``g('cat')``). Strings compare case-insensitively, with spaces and hyphens as
                underscores (``'Red box'`` is ``'red_box'``); aliases are the skill (``take`` is ``pick``).
  ``sequence``  patterns (or alternatives) that must appear in this order, each after the previous one.
  ``numbers``   ``{skill: [lo, hi]}``: every literal number passed to the skill lies in [lo, hi] (tighter
                than the skill set's bounds, which only keep the robot safe).
  ``evasive``   urgent tasks: ``moves`` (skills that take the robot out of the danger), ``max_wait_s``
                (the longest the robot may spend before it starts the first of them: waits count their
                seconds, other skills their typical execution time from the skill set's model) and,
                optionally, ``hover_s: [lo, hi]`` (hovering that long is itself the evasion, e.g. to let
                a passer-by pass). Any other movement before the evasion fails the check.

Pure Python: no ROS, no engine. :func:`judge` is what the plan-quality benchmark calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from timelyllm_ros.domain.plans import PlanTemplate
from timelyllm_ros.skills.exec_model import ExecTimeModel
from timelyllm_ros.skills.minispec import ArgValue, SkillCall, SkillParseError, Var
from timelyllm_ros.skills.schema import SkillSet, load_skill_set

CHECKS = ("require", "sequence", "numbers", "evasive")
_EVASIVE_KEYS = ("moves", "max_wait_s", "hover_s")
WAIT_OP = "hover"  # the robot operation of a wait (drone `d`): waits count their own seconds


class QualitySpecError(ValueError):
    """A ``quality:`` block is malformed; the message names the task and the field."""


def _norm(v: ArgValue) -> ArgValue:
    if isinstance(v, str):
        return v.strip().lower().replace(" ", "_").replace("-", "_")
    return v


@dataclass(frozen=True)
class CallPattern:
    """A skill (canonical short name), optionally with the literal arguments a call must have."""

    skill: str
    args: tuple[ArgValue, ...] | None  # None: any arguments
    text: str  # as declared, for messages

    def matches(self, call: SkillCall) -> bool:
        if call.name != self.skill:
            return False
        return self.args is None or tuple(_norm(a) for a in call.args) == self.args


Alternatives = tuple[CallPattern, ...]  # one of them must match


@dataclass(frozen=True)
class Evasive:
    moves: frozenset[str]
    max_wait_s: float
    hover_s: tuple[float, float] | None = None


@dataclass(frozen=True)
class QualitySpec:
    """The semantic checks of one task template (see the module docstring)."""

    require: tuple[Alternatives, ...] = ()
    sequence: tuple[Alternatives, ...] = ()
    numbers: Mapping[str, tuple[float, float]] | None = None
    evasive: Evasive | None = None

    @property
    def empty(self) -> bool:
        return not (self.require or self.sequence or self.numbers or self.evasive)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], ss: SkillSet, where: str = "quality") -> QualitySpec:
        """Parse and check a ``quality:`` block against the skill set; QualitySpecError names the field."""
        if not isinstance(raw, Mapping):
            raise QualitySpecError(f"{where}: expected a mapping, got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(CHECKS))
        if unknown:
            raise QualitySpecError(f"{where}: unknown check(s) {unknown}; known: {list(CHECKS)}")
        numbers = raw.get("numbers") or {}
        if not isinstance(numbers, Mapping):
            raise QualitySpecError(f"{where}.numbers: expected a mapping skill -> [lo, hi]")
        ranges: dict[str, tuple[float, float]] = {}
        for name, rng in numbers.items():
            spec = ss.get(str(name))
            at = f"{where}.numbers.{name}"
            if spec is None:
                raise QualitySpecError(f"{at}: skill set {ss.id!r} has no skill {name!r}")
            if not any(a.type in ("int", "float") for sig in spec.signatures for a in sig):
                raise QualitySpecError(f"{at}: skill {name!r} takes no number")
            ranges[spec.name] = _range(rng, at)
        return cls(require=_items(raw.get("require"), ss, f"{where}.require"),
                   sequence=_items(raw.get("sequence"), ss, f"{where}.sequence"),
                   numbers=ranges or None,
                   evasive=_evasive(raw["evasive"], ss, f"{where}.evasive") if "evasive" in raw else None)

    def failures(self, calls: Sequence[SkillCall], ss: SkillSet, model: ExecTimeModel | None = None) -> list[str]:
        """What the calls of a valid plan (in order of appearance) fail of these checks; empty: acceptable."""
        out: list[str] = []
        for alts in self.require:
            if not any(p.matches(c) for c in calls for p in alts):
                out.append(f"require: no {_show(alts)}")
        at = 0
        for alts in self.sequence:
            hit = next((i for i in range(at, len(calls)) if any(p.matches(calls[i]) for p in alts)), None)
            if hit is None:
                before = "" if at == 0 else f" after {calls[at - 1].raw}"
                out.append(f"sequence: no {_show(alts)}{before}")
                break
            at = hit + 1
        for c in calls:
            lo_hi = (self.numbers or {}).get(c.name)
            if lo_hi is None:
                continue
            for name, v in zip(c.arg_names, c.args, strict=False):
                if _is_number(v) and not lo_hi[0] <= v <= lo_hi[1]:
                    out.append(f"numbers: {c.raw}: {name} = {v:g} outside [{lo_hi[0]:g}, {lo_hi[1]:g}]")
        if self.evasive is not None:
            msg = _evasive_failure(self.evasive, calls, ss, model or ExecTimeModel(ss, learn=False))
            if msg:
                out.append(f"evasive: {msg}")
        return out


@dataclass(frozen=True)
class Verdict:
    """One plan judged: ``valid`` (parses within bounds and ended), ``failures`` of the semantic checks."""

    plan: str
    valid: bool
    error: str = ""  # why it is not valid
    failures: tuple[str, ...] = ()

    @property
    def acceptable(self) -> bool:
        return self.valid and not self.failures


def judge(plan: str, ss: SkillSet, spec: QualitySpec | None, *, ended: bool = True,
          model: ExecTimeModel | None = None) -> Verdict:
    """Judge one plan. ``ended``: False when the generation stopped on its token budget (not a plan)."""
    if not ended:
        return Verdict(plan, False, "the generation did not end (token budget exhausted)")
    err = ss.validate_plan(plan)
    if err:
        return Verdict(plan, False, err)
    if spec is None or ss.grammar == "text":
        return Verdict(plan, True)
    try:
        calls = ss.parse(plan, complete=True)
    except SkillParseError as e:  # validate_plan accepted it: cannot happen, but never judge what did not parse
        return Verdict(plan, False, str(e))
    return Verdict(plan, True, failures=tuple(spec.failures(calls, ss, model)))


def template_spec(tpl: PlanTemplate, ss: SkillSet | None = None) -> QualitySpec:
    """The checks a task template declares (an empty spec when it declares none)."""
    ss = ss or load_skill_set(tpl.robot_type)
    return QualitySpec.from_dict(tpl.quality, ss, f"data/plans.yaml: task {tpl.name}: quality")


# -- helpers -------------------------------------------------------------------------------------------------------
def _is_number(v: ArgValue) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)  # a Var's value is only known on the robot


def _range(v: Any, at: str) -> tuple[float, float]:
    if (not isinstance(v, Sequence) or isinstance(v, str) or len(v) != 2
            or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in v) or v[0] > v[1]):
        raise QualitySpecError(f"{at}: expected [lo, hi] with lo <= hi, got {v!r}")
    return float(v[0]), float(v[1])


def _pattern(text: Any, ss: SkillSet, at: str) -> CallPattern:
    if not isinstance(text, str) or not text.strip():
        raise QualitySpecError(f"{at}: expected a skill name or a call, got {text!r}")
    text = text.strip()
    if "(" not in text:
        spec = ss.get(text)
        if spec is None:
            raise QualitySpecError(f"{at}: skill set {ss.id!r} has no skill {text!r}")
        return CallPattern(spec.name, None, text)
    try:  # a call: read by the skill language's own parser, so it is checked against the skill set too
        calls = ss.parse(text)
    except SkillParseError as e:
        raise QualitySpecError(f"{at}: {text!r} is not a call of skill set {ss.id!r}: {e}") from None
    if len(calls) != 1 or any(isinstance(a, Var) for a in calls[0].args):
        raise QualitySpecError(f"{at}: {text!r} must be one call with literal arguments")
    return CallPattern(calls[0].name, tuple(_norm(a) for a in calls[0].args), text)


def _items(raw: Any, ss: SkillSet, at: str) -> tuple[Alternatives, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise QualitySpecError(f"{at}: expected a list of calls (or of lists of alternatives)")
    out = []
    for i, item in enumerate(raw):
        alts = item if isinstance(item, list) else [item]
        if not alts:
            raise QualitySpecError(f"{at}[{i}]: empty list of alternatives")
        out.append(tuple(_pattern(a, ss, f"{at}[{i}]") for a in alts))
    return tuple(out)


def _evasive(raw: Any, ss: SkillSet, at: str) -> Evasive:
    if not isinstance(raw, Mapping):
        raise QualitySpecError(f"{at}: expected a mapping with {list(_EVASIVE_KEYS)}")
    unknown = sorted(set(raw) - set(_EVASIVE_KEYS))
    if unknown:
        raise QualitySpecError(f"{at}: unknown key(s) {unknown}; known: {list(_EVASIVE_KEYS)}")
    for k in ("moves", "max_wait_s"):
        if k not in raw:
            raise QualitySpecError(f"{at}: {k} is required")
    moves = raw["moves"]
    if not isinstance(moves, list) or not moves:
        raise QualitySpecError(f"{at}.moves: expected a non-empty list of skills")
    names = []
    for m in moves:
        spec = ss.get(str(m))
        if spec is None:
            raise QualitySpecError(f"{at}.moves: skill set {ss.id!r} has no skill {m!r}")
        names.append(spec.name)
    wait = raw["max_wait_s"]
    if isinstance(wait, bool) or not isinstance(wait, int | float) or wait < 0:
        raise QualitySpecError(f"{at}.max_wait_s: expected a number >= 0, got {wait!r}")
    hover = _range(raw["hover_s"], f"{at}.hover_s") if "hover_s" in raw else None
    if hover is not None and not any(s.op == WAIT_OP for s in ss.skills):
        raise QualitySpecError(f"{at}.hover_s: skill set {ss.id!r} has no wait skill (op {WAIT_OP!r})")
    return Evasive(frozenset(names), float(wait), hover)


def _evasive_failure(ev: Evasive, calls: Sequence[SkillCall], ss: SkillSet, model: ExecTimeModel) -> str | None:
    """None if the robot starts evading in time, else why not."""
    spent = 0.0
    for c in calls:
        spec = ss[c.name]
        if c.name in ev.moves:
            if spent > ev.max_wait_s:
                return f"{spent:g} s pass before the first evasive move {c.raw} (at most {ev.max_wait_s:g} s)"
            return None
        if spec.op == WAIT_OP:
            v = next((a for a in c.args if _is_number(a)), None)
            if ev.hover_s is not None and v is not None and ev.hover_s[0] <= v <= ev.hover_s[1]:
                if spent > ev.max_wait_s:
                    return f"{spent:g} s pass before hovering {c.raw} (at most {ev.max_wait_s:g} s)"
                return None
        elif spec.kind == "movement":
            return f"{c.raw} moves the robot before it evades (evasive moves: {', '.join(sorted(ev.moves))})"
        spent += model.base_estimate(c).typical_s
    hover = "" if ev.hover_s is None else f" or hover {ev.hover_s[0]:g}-{ev.hover_s[1]:g} s"
    return f"no evasive move ({', '.join(sorted(ev.moves))}){hover}"


def _show(alts: Alternatives) -> str:
    return " or ".join(p.text for p in alts)
