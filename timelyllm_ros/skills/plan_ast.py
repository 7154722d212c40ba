"""The skill language's syntax tree: what :func:`timelyllm_ros.skills.minispec.parse_program` builds, the planner
validates and the drone interpreter executes (its names are importable from :mod:`~timelyllm_ros.skills.minispec`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Var:
    """A MiniSpec variable (``_1``) used as a value; its value is only known on the robot, which must
    check it against the argument's bounds (:meth:`SkillSpec.check_args`)."""

    name: str

    def __str__(self) -> str:
        return self.name


ArgValue = int | float | str | bool | Var


@dataclass(frozen=True)
class SkillCall:
    """One parsed, validated skill call."""

    name: str  # canonical short name, whatever alias the LLM used
    long_name: str
    args: tuple[ArgValue, ...]  # positional, in signature order
    raw: str  # the call's text as written
    skillset_id: str
    arg_names: tuple[str, ...] = ()
    position: int = 0  # offset in the parsed text
    # Where the call appears: statement, condition, assign, return, argument.
    role: str = "statement"

    def arg(self, name: str) -> ArgValue | None:
        try:
            return self.args[self.arg_names.index(name)]
        except ValueError:
            return None


@dataclass(frozen=True)
class Not:
    operand: Expr


@dataclass(frozen=True)
class BinOp:
    op: str  # one of COMPARISONS, & or |
    left: Expr
    right: Expr


# A literal is the Python value itself.
Expr = SkillCall | Var | Not | BinOp | int | float | str | bool


@dataclass(frozen=True)
class CallStatement:
    call: SkillCall
    position: int


@dataclass(frozen=True)
class Assign:
    var: str
    value: Expr
    position: int


@dataclass(frozen=True)
class Return:
    value: Expr
    position: int


@dataclass(frozen=True)
class If:
    """``?cond{``: opens a block; its :class:`EndBlock` may come in a later segment."""

    condition: Expr
    position: int


@dataclass(frozen=True)
class Loop:
    """``N{``: opens a block run ``count`` times."""

    count: int
    position: int


@dataclass(frozen=True)
class EndBlock:
    """``}``: closes the innermost open block, possibly one opened by an earlier segment."""

    position: int


Statement = CallStatement | Assign | Return | If | Loop | EndBlock


@dataclass(frozen=True)
class Program:
    """A parsed and validated plan or plan segment: its statements in order, blocks flat (openers
    and :class:`EndBlock` markers), since a block may span segments."""

    text: str
    statements: tuple[Statement, ...]
    calls: tuple[SkillCall, ...]  # every skill call, in order of appearance
    assigned: frozenset[str]  # variables this text assigns
    opened: int  # blocks opened here and still open at the end
    closed: int  # '}' that closed blocks opened before this text


class ParseCache:
    """The latest parses of one skill set, least recently used out first (bounded). The planner's engine thread
    parses each segment several times (checked, its calls, its cost after the plan so far) and many plans share
    their segments; a Program is immutable, so one parse serves them all. Thread-safe."""

    def __init__(self, max_entries: int = 2048) -> None:
        self.max_entries = max_entries
        self._programs: OrderedDict[tuple, Program] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> Program | None:
        with self._lock:
            prog = self._programs.get(key)
            if prog is not None:
                self._programs.move_to_end(key)
            return prog

    def put(self, key: tuple, prog: Program) -> None:
        with self._lock:
            self._programs[key] = prog
            if len(self._programs) > self.max_entries:
                self._programs.popitem(last=False)

    def __len__(self) -> int:
        return len(self._programs)


def statement_calls(s: Statement) -> list[SkillCall]:
    """The skill calls one statement makes each time it runs (an If: those of its condition)."""
    if isinstance(s, CallStatement):
        return [s.call]
    root = s.value if isinstance(s, (Assign, Return)) else s.condition if isinstance(s, If) else None
    out: list[SkillCall] = []
    stack: list[Any] = [root]
    while stack:
        e = stack.pop()
        if isinstance(e, SkillCall):
            out.append(e)
        elif isinstance(e, Not):
            stack.append(e.operand)
        elif isinstance(e, BinOp):
            stack += (e.right, e.left)
    return out
