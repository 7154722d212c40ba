"""Robot skill sets: the data model a skills/*.yaml file loads into (loading and validation:
:mod:`timelyllm_ros.skills.skill_files`).

LLM output is untrusted. Nothing may reach a robot unless it parses as calls
of that robot's skill set with every literal argument of the right type and
inside its bounds; :meth:`SkillSet.parse` is that gate. The language itself
is :mod:`timelyllm_ros.skills.minispec` (parser, validator, AST) over
:mod:`timelyllm_ros.skills.lexer`; this module holds the schema it validates
against.

Besides its signature and execution-time model, a skill may name the robot
operation that runs it (``op``, with fixed ``op_args``; the skill's own
arguments fill the operation's other parameters in order), so executors
dispatch on data and a skill renamed or added in YAML needs no code change.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from timelyllm_ros.skills.minispec import (
    ArgValue,
    ParseCache,
    Program,
    SkillCall,
    SkillParseError,
    Var,
    parse_program,
)

ARG_TYPES = ("int", "float", "str", "bool")
GRAMMARS = ("minispec", "calls", "text")
SEGMENTERS = ("minispec", "semicolon", "sentence")
EXEC_MODELS = {
    "constant": ("value",),
    "linear": ("a", "b"),
    "polynomial": ("coeffs",),
    "repeated": ("unit", "min_count", "max_count"),
    "uniform": ("low", "high"),
    "composite": ("runs",),  # a skill that runs others (goto: orient, then forward): their sum, at worst their worst
}


class SkillSetError(ValueError):
    """A skill-set YAML file is malformed; the message names file and field."""


@dataclass(frozen=True)
class SkillArg:
    name: str
    type: str  # one of ARG_TYPES
    min: float | None = None  # numbers: inclusive bounds
    max: float | None = None
    unit: str = ""
    typical: float | None = None  # value assumed for estimates when unknown
    min_length: int = 1  # strings
    max_length: int = 100
    pattern: str | None = None  # strings: regex the whole value must match
    description: str = ""
    # strings: constrained decoding draws it from the names the task and its scene use (skills/grammar.py):
    # "any" of them, or an "object" the task asks about (not one it names as a place: "the toy under the
    # bed" is the toy); "" = a free string. The robot may still be sent other names by hand.
    from_task: str = ""
    # strings: a constrained plan writes at least this many words in a literal of it (a log states something,
    # not a one-word fragment); a grammar rule only, plans sent by hand are not held to it
    min_words: int = 0

    def check(self, value: ArgValue, skill: str) -> ArgValue:
        """Return the value normalised to the arg type, or raise ValueError."""
        if isinstance(value, Var):
            return value
        where = f"argument {self.name!r} of {skill}"
        if self.type in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{where} must be a number ({self.type}), got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{where} must be finite, got {value!r}")
            if self.type == "int":
                if value != int(value):
                    raise ValueError(f"{where} must be an integer, got {value!r}")
                value = int(value)
            else:
                value = float(value)
            if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
                raise ValueError(f"{where} = {value!r} outside [{_num(self.min)}, {_num(self.max)}]")
            return value
        if self.type == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"{where} must be True or False, got {value!r}")
            return value
        if not isinstance(value, str):
            raise ValueError(f"{where} must be a quoted string, got {value!r}")
        if not self.min_length <= len(value) <= self.max_length:
            raise ValueError(f"{where} has length {len(value)}, allowed {self.min_length}..{self.max_length}")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise ValueError(f"{where} = {value!r} does not match {self.pattern!r}")
        return value

    def describe(self) -> str:
        s = f"{self.name}: {self.type}"
        if self.type in ("int", "float") and (self.min is not None or self.max is not None):
            s += f" {_num(self.min)}..{_num(self.max)}"
        if self.unit:
            s += f" {self.unit}"
        return s


def _num(v: float | None) -> str:
    if v is None:
        return "?"
    return str(int(v)) if float(v).is_integer() else str(v)


@dataclass(frozen=True)
class ExecTimeSpec:
    """Execution-time model of a skill as data (evaluated by exec_model)."""

    model: str  # one of EXEC_MODELS
    params: Mapping[str, Any]
    arg: str | None = None  # numeric argument the formula reads
    noise: float = 0.0  # relative half-width around formula models


@dataclass(frozen=True)
class SkillSpec:
    name: str  # short name the LLM writes (mf)
    long_name: str  # move_forward
    description: str
    kind: str  # movement / perception / ...
    signatures: tuple[tuple[SkillArg, ...], ...]  # overloads; usually one
    exec_time: ExecTimeSpec
    returns: str | None = None
    aliases: tuple[str, ...] = ()
    op: str | None = None  # robot operation that runs it (executors check they know it)
    op_args: Mapping[str, str | int | float | bool] = field(default_factory=dict)  # its fixed parameters
    # How tasks say it ("move up"): a task that begins with one gets a plan that begins with this skill
    # (constrained decoding, skills/grammar.py)
    phrases: tuple[str, ...] = ()
    # What a task says to ask for it anywhere ("take a picture"): the plan must call it (constrained decoding)
    asked_by: tuple[str, ...] = ()

    @property
    def args(self) -> tuple[SkillArg, ...]:
        return self.signatures[0]

    def check_args(self, values: Sequence[ArgValue], kwargs: Mapping[str, ArgValue] | None = None
                   ) -> tuple[tuple[ArgValue, ...], tuple[str, ...]]:
        """Bind and validate argument values (also used by executors once
        variables are known). Returns (values, argument names); ValueError
        with a message naming the skill and argument otherwise."""
        kwargs = dict(kwargs or {})
        errors: list[str] = []
        n = len(values) + len(kwargs)
        # Report only the overloads of the right arity when there are some.
        sigs = [sig for sig in self.signatures if len(sig) == n] or list(self.signatures)
        for sig in sigs:
            try:
                return self._bind(sig, values, kwargs), tuple(a.name for a in sig)
            except ValueError as e:
                errors.append(str(e))
        if len(errors) == 1:
            raise ValueError(errors[0])
        raise ValueError(f"no form of {self.name} accepts these arguments: " + "; ".join(errors))

    def _bind(self, sig: tuple[SkillArg, ...], values: Sequence[ArgValue],
              kwargs: Mapping[str, ArgValue]) -> tuple[ArgValue, ...]:
        names = [a.name for a in sig]
        for k in kwargs:
            if k not in names:
                raise ValueError(f"{self.name} has no argument {k!r} (takes {self.signature_text(sig)})")
        if len(values) + len(kwargs) != len(sig):
            raise ValueError(f"{self.name} takes {len(sig)} argument(s) {self.signature_text(sig)}, "
                             f"got {len(values) + len(kwargs)}")
        out: list[ArgValue] = []
        for i, a in enumerate(sig):
            if i < len(values):
                if a.name in kwargs:
                    raise ValueError(f"argument {a.name!r} of {self.name} given twice")
                v = values[i]
            elif a.name in kwargs:
                v = kwargs[a.name]
            else:
                raise ValueError(f"argument {a.name!r} of {self.name} is missing")
            out.append(a.check(v, self.name))
        return tuple(out)

    def signature_text(self, sig: tuple[SkillArg, ...] | None = None) -> str:
        sig = self.args if sig is None else sig
        return "(" + ", ".join(a.describe() for a in sig) + ")"


@dataclass(frozen=True)
class PlanStructure:
    """The shape constrained decoding gives a plan (``plan_structure:`` in a skill-set file; see
    skills/grammar.py). ``unit``: call templates such as ``pick($object)`` that a plan repeats, 1 to
    ``max_units`` times, each ``$name`` one name of the task; ``max_statements`` / ``max_block_statements``:
    statements per plan and per conditional block, so a plan always ends."""

    unit: tuple[tuple[str, str | None], ...] = ()  # (skill, $variable or None)
    max_units: int = 0
    unit_verbs: frozenset[str] = frozenset()  # a task has as many units as these words (skills/grammar.py)
    order: str = "any"  # "task": the units' names in the order the task mentions them
    # a task tagged [T] ("[E] ...") starts its plan with a call of one of these skills (an emergency: move away)
    first_by_tag: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    max_statements: int | None = None
    max_block_statements: int | None = None


@dataclass
class SkillSet:
    id: str
    robot_type: str
    description: str
    segmenter: str
    grammar: str
    lmax: int
    skills: tuple[SkillSpec, ...]
    path: Path | None = None
    max_loop_count: int = 20
    # Per plan, loops unrolled and every call at its model's longest (see plan_cost.CostCounter): the skill
    # sets declare their own; these defaults only serve a skill set that does not.
    max_plan_exec_s: float = 600.0
    max_plan_iterations: int = 1000  # skill executions plus loop passes
    min_segment_tokens: int = 10  # sentence segmenter
    text_exec_time: Mapping[str, float] = field(default_factory=dict)
    plan_structure: PlanStructure = field(default_factory=PlanStructure)
    _by_name: dict[str, SkillSpec] = field(default_factory=dict, repr=False)
    # Parses of this skill set's texts (minispec.parse_program); not an init field, so dataclasses.replace, which
    # makes a different skill set, starts its own.
    parsed: ParseCache = field(default_factory=ParseCache, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for s in self.skills:
            for n in (s.name, s.long_name, *s.aliases):
                other = self._by_name.get(n)
                if other is not None and other is not s:
                    raise SkillSetError(f"{self.path or self.id}: skill name {n!r} is used twice")
                self._by_name[n] = s

    # -- lookup -------------------------------------------------------------
    def get(self, name: str) -> SkillSpec | None:
        """Skill by short name, long name or alias."""
        return self._by_name.get(name)

    def __getitem__(self, name: str) -> SkillSpec:
        s = self._by_name.get(name)
        if s is None:
            raise KeyError(f"skill set {self.id!r} has no skill {name!r}")
        return s

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.skills)

    def skill_for_op(self, op: str, **op_args: str | int | float | bool) -> SkillSpec | None:
        """The first skill that runs ``op`` with these fixed ``op_args`` (a backend that needs the skill
        behind one of its commands, e.g. for its execution-time model, looks it up instead of naming it)."""
        for s in self.skills:
            if s.op == op and all(k in s.op_args and s.op_args[k] == v for k, v in op_args.items()):
                return s
        return None

    # -- parsing --------------------------------------------------------------
    def parse(self, text: str, *, complete: bool = False) -> list[SkillCall]:
        """All skill calls in a plan or a plan segment, in order of appearance.

        Raises SkillParseError on anything that is not valid for this skill
        set. ``complete=True`` also requires balanced braces (a whole plan).
        """
        if self.grammar == "text":
            return []
        return list(parse_program(self, text, complete=complete).calls)

    def parse_program(self, text: str, *, complete: bool = False, open_blocks: int | None = None,
                      declared: Iterable[str] | None = None) -> Program:
        """The statements of a plan or segment (see :func:`~timelyllm_ros.skills.minispec.parse_program`)."""
        return parse_program(self, text, complete=complete, open_blocks=open_blocks, declared=declared)

    def validate(self, text: str, *, complete: bool = False) -> str | None:
        """None if ``text`` parses, else the error message."""
        try:
            self.parse(text, complete=complete)
        except SkillParseError as e:
            return str(e)
        return None

    def validate_plan(self, text: str) -> str | None:
        """None if ``text`` is a valid complete plan, else the reason.

        Stricter than ``validate(text, complete=True)``: besides balanced
        blocks, every variable must be assigned before it is used (earlier in
        the text) and the plan must hold at least one statement. Prose
        (grammar ``text``) is always valid.
        """
        if self.grammar == "text":
            return None
        try:
            prog = parse_program(self, text, complete=True, declared=())
        except SkillParseError as e:
            return str(e)
        if not prog.statements:
            return "empty plan: no statements"
        return None

    # -- prompting ------------------------------------------------------------
    def describe_for_prompt(self) -> str:
        """Skill catalogue (and grammar) to put in the LLM prompt."""
        if self.grammar == "text":
            return "Answer in plain sentences."
        lines = [f"Skills of the {self.robot_type} ({self.id}):"]
        for s in self.skills:
            forms = " | ".join(s.name + s.signature_text(sig) for sig in s.signatures)
            ret = f" -> {s.returns}" if s.returns else ""
            also = [n for n in (s.long_name, *s.aliases) if n != s.name]
            alias = f" [{', '.join(also)}]" if also else ""
            lines.append(f"- {forms}{ret}{alias}: {s.description}")
        if self.grammar == "minispec":
            lines += [
                "MiniSpec program syntax:",
                "- call: mf(50); strings in quotes: iv('cat');",
                "- assignment: _1=ox('cat');",
                "- conditional: ?cond{...}, e.g. ?iv('cat')==True{g('cat')};",
                "  cond compares values with == != < > <= >= and combines with & |;",
                f"- loop: N{{...}} repeats the block N times (N <= {self.max_loop_count});",
                "- return: ->value;",
                "Use short skill names. Statements end with ';'.",
            ]
        else:
            lines.append("A plan is a sequence of calls, each ending with ';', e.g. "
                         + _example_call(self) + ";")
        return "\n".join(lines)


def _example_call(ss: SkillSet) -> str:
    s = ss.skills[0]
    vals = []
    for a in s.args:
        if a.type == "str":
            vals.append("'red_box'")
        elif a.type == "bool":
            vals.append("True")
        else:
            vals.append(_num(a.typical if a.typical is not None else a.min))
    return f"{s.name}({', '.join(vals)})"
