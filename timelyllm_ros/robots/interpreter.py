"""Executes MiniSpec as it streams in, one plan segment at a time.

Segments arrive one by one (``?iv('cat')==True{``, ``g('cat')``, ``};``), so
blocks span segments. The interpreter keeps a stack of open blocks:

* a conditional is decided when its ``?cond{`` arrives; the statements of a
  false branch are validated but skipped;
* a loop ``N{`` runs its body once as it arrives, records it, and replays it
  N-1 more times when its ``}`` arrives (conditions are re-evaluated);
* ``->value`` ends the program: later statements are validated and skipped.

Every segment passes :meth:`SkillSet.parse` (THE validation gate) before
anything runs, and every call is checked again with real variable values
(:meth:`SkillSpec.check_args`) right before it reaches the robot, so nothing
out of bounds is ever sent. Robot commands go through :class:`DroneBackend`,
perception questions through :class:`~.perception.Perception`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from timelyllm_ros.robots.base import ExecutionError, Interrupted, RefusedError, StopSignal
from timelyllm_ros.robots.perception import Perception, bearing_error
from timelyllm_ros.skills.schema import SkillParseError, SkillSet, Var

log = logging.getLogger(__name__)

MOVES = {"mf": "forward", "mb": "back", "ml": "left", "mr": "right", "mu": "up", "md": "down"}
SCAN_STEP_DEG = 45  # TypeFly: scan = 8{?iv(obj)==True{->True};tc(45)}->False
ORIENT_STEP_DEG = 15  # TypeFly: orienting turns in 15-degree steps, up to 4 times
APPROACH_CM = 100  # TypeFly: approach = mf(100)


class DroneBackend(Protocol):
    """The robot side of the interpreter (djitellopy in :mod:`.tello_backend`)."""

    @property
    def flying(self) -> bool: ...

    def takeoff(self) -> None: ...

    def land(self) -> None: ...

    def move(self, direction: str, cm: int) -> None: ...

    def rotate(self, degrees: int, clockwise: bool) -> None: ...

    def hover(self, seconds: float, stop: StopSignal) -> None: ...


# -- AST ------------------------------------------------------------------------

@dataclass
class Call:
    name: str
    args: list[Any]  # literals or Var
    raw: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Cmp:
    op: str  # == != < > <= >= & | !
    left: Any
    right: Any = None


@dataclass
class Stmt:
    kind: str  # call, assign, return, if, loop, close
    expr: Any = None
    var: str = ""
    count: int = 0
    body: list[Stmt] = field(default_factory=list)


_TOK = re.compile(r"""\s*(?:(?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)
                      |(?P<str>'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*")|(?P<op>->|==|!=|<=|>=|&&|\|\||[-?{}();,=<>&|!]))""",
                  re.VERBOSE)


def _tokens(text: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    i = 0
    text = text.rstrip()
    while i < len(text):
        m = _TOK.match(text, i)
        if m is None or m.end() == i:
            raise RefusedError(f"unexpected character {text[i]!r} at {i}")
        kind = m.lastgroup or ""
        tok = m.group(kind)
        if kind == "num":
            out.append(("num", int(tok) if tok.isdigit() else float(tok)))
        elif kind == "str":
            out.append(("str", re.sub(r"\\(.)", r"\1", tok[1:-1])))
        elif kind == "op":
            out.append(("op", {"&&": "&", "||": "|"}.get(tok, tok)))
        else:
            out.append((kind, tok))
        i = m.end()
    out.append(("eof", None))
    return out


class _SegmentParser:
    """Statements of one segment, flat: block openers, their contents and ``close`` markers."""

    def __init__(self, text: str) -> None:
        self.t = _tokens(text)
        self.i = 0

    def peek(self, k: int = 0) -> tuple[str, Any]:
        return self.t[min(self.i + k, len(self.t) - 1)]

    def take(self) -> tuple[str, Any]:
        tok = self.t[self.i]
        self.i += 1
        return tok

    def expect(self, op: str) -> None:
        if self.take() != ("op", op):
            raise RefusedError(f"expected {op!r}")

    def run(self) -> list[Stmt]:
        out: list[Stmt] = []
        while self.peek()[0] != "eof":
            kind, v = self.peek()
            if (kind, v) == ("op", ";"):
                self.take()
            elif (kind, v) == ("op", "}"):
                self.take()
                out.append(Stmt("close"))
            elif (kind, v) == ("op", "?"):
                self.take()
                cond = self.expr()
                self.expect("{")
                out.append(Stmt("if", cond))
            elif kind == "num":
                self.take()
                self.expect("{")
                out.append(Stmt("loop", count=int(v)))
            elif (kind, v) == ("op", "->"):
                self.take()
                out.append(Stmt("return", self.expr()))
            elif kind == "ident" and re.fullmatch(r"_\d+", v) and self.peek(1) == ("op", "="):
                self.take()
                self.take()
                out.append(Stmt("assign", self.expr(), var=v))
            else:
                out.append(Stmt("call", self.call()))
        return out

    def expr(self) -> Any:
        left = self.conj()
        while self.peek() == ("op", "|"):
            self.take()
            left = Cmp("|", left, self.conj())
        return left

    def conj(self) -> Any:
        left = self.comparison()
        while self.peek() == ("op", "&"):
            self.take()
            left = Cmp("&", left, self.comparison())
        return left

    def comparison(self) -> Any:
        left = self.unary()
        kind, v = self.peek()
        if kind == "op" and v in ("==", "!=", "<", ">", "<=", ">="):
            self.take()
            return Cmp(v, left, self.unary())
        return left

    def unary(self) -> Any:
        if self.peek() == ("op", "!"):
            self.take()
            return Cmp("!", self.unary())
        if self.peek() == ("op", "("):
            self.take()
            e = self.expr()
            self.expect(")")
            return e
        kind, v = self.peek()
        if kind == "ident" and self.peek(1) == ("op", "("):
            return self.call()
        return self.literal()

    def literal(self) -> Any:
        kind, v = self.take()
        if (kind, v) == ("op", "-") and self.peek()[0] == "num":
            return -self.take()[1]
        if kind in ("num", "str"):
            return v
        if kind == "ident" and v in ("True", "False"):
            return v == "True"
        if kind == "ident" and re.fullmatch(r"_\d+", v):
            return Var(v)
        raise RefusedError(f"unexpected {v!r}")

    def call(self) -> Call:
        _, name = self.take()
        self.expect("(")
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        while self.peek() != ("op", ")"):
            if args or kwargs:
                self.expect(",")
            if self.peek()[0] == "ident" and self.peek(1) == ("op", "=") and not re.fullmatch(r"_\d+", self.peek()[1]):
                key = self.take()[1]
                self.take()
                kwargs[key] = self.literal()
            else:
                args.append(self.literal())
        self.take()
        shown = [_show(a) for a in args] + [f"{k}={_show(v)}" for k, v in kwargs.items()]
        return Call(name, args, f"{name}({', '.join(shown)})", kwargs)


def _show(a: Any) -> str:
    return repr(a) if isinstance(a, str) else str(a)


# -- interpreter -------------------------------------------------------------------

class _Return(Exception):
    def __init__(self, value: Any) -> None:
        self.value = value


@dataclass
class _Frame:
    stmt: Stmt | None  # None: the program itself
    active: bool  # statements inside run now


@dataclass
class SegmentResult:
    executed: list[str] = field(default_factory=list)  # skill calls that ran, in order
    skipped: int = 0  # statements validated but not run (false branch, after a return)
    returned: Any = None
    finished: bool = False  # the program returned


class MiniSpecInterpreter:
    """One drone's MiniSpec program state (variables, open blocks, heading) across segments."""

    def __init__(self, skillset: SkillSet, backend: DroneBackend, perception: Perception, *,
                 stop: StopSignal | None = None, auto_takeoff: bool = True,
                 on_log: Callable[[str], None] | None = None) -> None:
        if skillset.grammar != "minispec":
            raise ValueError(f"skill set {skillset.id!r} is not MiniSpec")
        self.skillset = skillset
        self.backend = backend
        self.perception = perception
        self.stop = stop or StopSignal()
        self.auto_takeoff = auto_takeoff
        self.on_log = on_log or (lambda m: log.info("%s", m))
        self.reset()

    def reset(self) -> None:
        """A new task: no variables, no open blocks, heading 0 (scene bearings are relative to it)."""
        self.vars: dict[str, Any] = {}
        self.frames: list[_Frame] = [_Frame(None, True)]
        self.heading = 0.0
        self.finished = False
        self.return_value: Any = None
        self.messages: list[str] = []

    # -- segments ------------------------------------------------------------
    def validate(self, text: str) -> list[Stmt]:
        """Refuse (RefusedError) a segment that is not valid MiniSpec of this skill set or does not fit the open
        blocks. Nothing has run when this raises."""
        try:
            self.skillset.parse(text)
        except SkillParseError as e:
            raise RefusedError(f"invalid segment: {e}") from None
        stmts = _SegmentParser(text).run()
        depth = len(self.frames) - 1
        for s in stmts:
            if s.kind == "close":
                depth -= 1
                if depth < 0:
                    raise RefusedError("invalid segment: '}' closes no open block")
            elif s.kind in ("if", "loop"):
                depth += 1
        return stmts

    def execute_segment(self, text: str) -> SegmentResult:
        """Validate, then run the complete statements of one segment. Raises RefusedError (nothing ran),
        Interrupted (stopped) or ExecutionError (robot or perception failure)."""
        stmts = self.validate(text)
        res = SegmentResult()
        for s in stmts:
            self.stop.check()
            self._feed(s, res)
        res.finished = self.finished
        res.returned = self.return_value
        return res

    def _feed(self, s: Stmt, res: SegmentResult) -> None:
        top = self.frames[-1]
        if s.kind == "close":
            self.frames.pop()
            if top.stmt is not None and top.stmt.kind == "loop" and top.active and not self.finished:
                self._replay_loop(top.stmt, res)
            return
        if top.stmt is not None:  # record for loop replays, whether or not it runs now
            top.stmt.body.append(s)
        if s.kind in ("if", "loop"):
            active = top.active and not self.finished
            if active and s.kind == "if":
                active = bool(self._eval(s.expr, res))
            self.frames.append(_Frame(s, active))
            return
        if not top.active or self.finished:
            res.skipped += 1
            return
        try:
            self._run(s, res)
        except _Return as r:
            self.finished, self.return_value = True, r.value

    def _replay_loop(self, loop: Stmt, res: SegmentResult) -> None:
        try:
            for _ in range(loop.count - 1):
                self._block(loop.body, res)
        except _Return as r:
            self.finished, self.return_value = True, r.value

    def _block(self, body: list[Stmt], res: SegmentResult) -> None:
        for s in body:
            self.stop.check()
            if s.kind == "if":
                if self._eval(s.expr, res):
                    self._block(s.body, res)
            elif s.kind == "loop":
                for _ in range(s.count):
                    self._block(s.body, res)
            else:
                self._run(s, res)

    def _run(self, s: Stmt, res: SegmentResult) -> None:
        if s.kind == "call":
            self._eval(s.expr, res)
        elif s.kind == "assign":
            self.vars[s.var] = self._eval(s.expr, res)
        elif s.kind == "return":
            raise _Return(self._eval(s.expr, res))

    # -- expressions -------------------------------------------------------------
    def _eval(self, e: Any, res: SegmentResult) -> Any:
        if isinstance(e, Call):
            return self._call(e, res)
        if isinstance(e, Var):
            if e.name not in self.vars:
                raise ExecutionError(f"variable {e.name} used before it was assigned")
            return self.vars[e.name]
        if isinstance(e, Cmp):
            if e.op == "!":
                return not self._eval(e.left, res)
            if e.op == "&":
                return bool(self._eval(e.left, res)) and bool(self._eval(e.right, res))
            if e.op == "|":
                return bool(self._eval(e.left, res)) or bool(self._eval(e.right, res))
            a, b = self._eval(e.left, res), self._eval(e.right, res)
            try:
                return {"==": lambda: a == b, "!=": lambda: a != b, "<": lambda: a < b, ">": lambda: a > b,
                        "<=": lambda: a <= b, ">=": lambda: a >= b}[e.op]()
            except TypeError:
                raise ExecutionError(f"cannot compare {a!r} {e.op} {b!r}") from None
        return e

    def _call(self, c: Call, res: SegmentResult) -> Any:
        spec = self.skillset.get(c.name)
        if spec is None:  # the gate already refused it; never reached, kept as a second lock
            raise RefusedError(f"unknown skill {c.name!r}")
        values = [self._eval(a, res) if isinstance(a, Var) else a for a in c.args]
        kwargs = {k: self._eval(a, res) if isinstance(a, Var) else a for k, a in c.kwargs.items()}
        try:
            args, _ = spec.check_args(values, kwargs)  # real values, variables resolved: bounds hold for them too
        except ValueError as e:
            self.on_log(f"refused {c.raw}: {e}")
            raise RefusedError(f"refused {c.raw} with values {values}: {e}") from None
        self.stop.check()
        out = self._dispatch(spec.name, args)
        res.executed.append(f"{spec.name}({', '.join(_show(a) for a in args)})")
        return out

    # -- skills ------------------------------------------------------------------
    def _airborne(self) -> None:
        if self.auto_takeoff and not self.backend.flying:
            self.backend.takeoff()

    def _rotate(self, deg: int, clockwise: bool) -> None:
        self._airborne()
        self.backend.rotate(int(deg), clockwise)
        self.heading = (self.heading + (deg if clockwise else -deg)) % 360.0

    def _dispatch(self, name: str, a: tuple) -> Any:
        p = self.perception
        if name in MOVES:
            self._airborne()
            self.backend.move(MOVES[name], int(a[0]))
            return None
        if name in ("tc", "tu"):
            self._rotate(int(a[0]), name == "tc")
            return None
        if name == "d":
            self.backend.hover(float(a[0]), self.stop)
            return None
        if name == "iv":
            return p.find(a[0], self.heading) is not None
        if name in ("ox", "oy", "ow", "oh", "od"):
            d = p.find(a[0], self.heading)
            if d is None:
                return False  # TypeFly returns False for an object that is not in view
            return {"ox": d.x, "oy": d.y, "ow": d.width, "oh": d.height, "od": d.distance}[name]
        if name == "tp":
            take = getattr(p, "take_picture", None)
            if take is not None:
                take(self.heading)
            self.on_log(f"picture taken at heading {self.heading:.0f} deg")
            return None
        if name == "p":
            return p.probe(a[0], self.heading)
        if name == "l":
            self.messages.append(str(a[0]))
            self.on_log(f"log: {a[0]}")
            return None
        if name == "rp":
            self.on_log("re-plan requested by the plan")
            raise _Return("re_plan")
        if name == "s":
            return self._scan(lambda: p.find(a[0], self.heading) is not None)
        if name == "sa":
            return self._scan(lambda: p.probe(a[0], self.heading), abstract=True)
        if name == "o":
            return self._orient(a[0])
        if name == "a":
            self._airborne()
            self.backend.move("forward", APPROACH_CM)
            return None
        if name == "g":
            self._orient(a[0])
            self._airborne()
            self.backend.move("forward", APPROACH_CM)
            return None
        raise RefusedError(f"skill {name!r} has no executor on this drone")

    def _scan(self, look: Callable[[], Any], abstract: bool = False) -> Any:
        for i in range(360 // SCAN_STEP_DEG):
            found = look()
            if found is not False and found is not None:
                return found if abstract else True
            if i < 360 // SCAN_STEP_DEG - 1:
                self.stop.check()
                self._rotate(SCAN_STEP_DEG, True)
        return False

    def _orient(self, name: str) -> bool:
        for _ in range(4):
            d = self.perception.find(name, self.heading)
            if d is None:
                return False
            if 0.4 <= d.x <= 0.6:
                return True
            err = bearing_error(d)
            self.stop.check()
            self._rotate(ORIENT_STEP_DEG, err > 0)
        d = self.perception.find(name, self.heading)
        return d is not None and 0.4 <= d.x <= 0.6


__all__ = ["DroneBackend", "ExecutionError", "Interrupted", "MiniSpecInterpreter", "RefusedError", "SegmentResult"]
