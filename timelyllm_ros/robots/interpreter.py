"""Executes MiniSpec as it streams in, one plan segment at a time.

Segments arrive one by one (``?iv('cat')==True{``, ``g('cat')``, ``};``), so
blocks span segments. The interpreter keeps a stack of open blocks:

* a conditional is decided when its ``?cond{`` arrives; the statements of a
  false branch are validated but skipped;
* a loop ``N{`` runs its body once as it arrives, records it, and replays it
  N-1 more times when its ``}`` arrives (conditions are re-evaluated);
* ``->value`` ends the program: later statements are validated and skipped.

It has no parser: every segment goes through the skill language's front end
(:func:`~timelyllm_ros.skills.minispec.parse_program`, the parser behind
:meth:`SkillSet.parse`) with what the robot knows besides the planner (blocks
open and variables assigned so far), and the interpreter executes the
:class:`~timelyllm_ros.skills.minispec.Program` it returns. Every call is
checked again with real variable values (:meth:`SkillSpec.check_args`) right
before it reaches the robot, so nothing out of bounds is ever sent.

Plans are bounded (the skill set's ``max_plan_exec_s`` and
``max_plan_iterations``): a segment that takes the plan so far over a bound,
loops unrolled and every call at its model's longest, is refused like the
planner refuses it; and while the plan runs, the skill executions, loop passes
and modelled time (with the real argument values) are counted, and the call or
pass that would exceed a bound is refused before it starts.

Skills are data: each skill of the skill set names the drone operation that
runs it (``op`` and fixed ``op_args`` in skills/*.yaml, the skill's own
arguments filling the operation's other parameters in order), checked against
:data:`OPERATIONS` when the interpreter is built. Robot commands go through
:class:`DroneBackend`, perception questions through
:class:`~.perception.Perception`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from timelyllm_ros.robots.base import ExecutionError, Interrupted, RefusedError, StopSignal
from timelyllm_ros.robots.perception import Perception, bearing_error
from timelyllm_ros.skills.call_time import call_estimate
from timelyllm_ros.skills.minispec import (
    Assign,
    BinOp,
    CallStatement,
    CostCounter,
    EndBlock,
    If,
    Loop,
    Not,
    Program,
    Return,
    SkillCall,
    SkillParseError,
    Statement,
    Var,
    bound_error,
    model_cost,
    parse_program,
)
from timelyllm_ros.skills.schema import SkillSet, SkillSpec

log = logging.getLogger(__name__)

CENTRED = (0.4, 0.6)  # TypeFly: an object is centred when its x is in this part of the image


class DroneBackend(Protocol):
    """The robot side of the interpreter (djitellopy in :mod:`.tello_backend`)."""

    @property
    def flying(self) -> bool: ...

    def takeoff(self) -> None: ...

    def land(self) -> None: ...

    def move(self, direction: str, cm: int) -> None: ...

    def rotate(self, degrees: int, clockwise: bool) -> None: ...

    def hover(self, seconds: float, stop: StopSignal) -> None: ...


# -- operations -------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    name: str
    type: type  # int, float, str or bool
    min: int | None = None  # for fixed values (the skill's own arguments have their bounds in the YAML)
    choices: tuple[str, ...] = ()


_OBJ, _DEG, _CM = Param("target", str), Param("step_deg", int, 1), Param("cm", int, 1)

# What a skill's ``op`` may name, with its parameters (method ``_op_<name>`` runs it).
OPERATIONS: dict[str, tuple[Param, ...]] = {
    "move": (Param("direction", str, choices=("forward", "back", "left", "right", "up", "down")), _CM),
    "rotate": (Param("clockwise", bool), Param("degrees", int)),
    "hover": (Param("seconds", float),),
    "visible": (_OBJ,),
    "measure": (Param("attribute", str, choices=("x", "y", "width", "height", "distance")), _OBJ),
    "picture": (),
    "probe": (Param("question", str),),
    "log": (Param("text", str),),
    "replan": (),
    # TypeFly: scan = 8{?iv(obj)==True{->True};tc(45)}->False (360 / step_deg looks)
    "scan": (_OBJ, _DEG),
    "scan_probe": (Param("question", str), _DEG),  # the same, asking the VLM; returns its first answer
    "orient": (_OBJ, _DEG, Param("tries", int, 0)),  # turn in steps until centred, at most `tries` turns
    "goto": (_OBJ, _DEG, Param("tries", int, 0), _CM),  # orient, then forward `cm`
}
_ARG_TYPES = {int: ("int",), float: ("int", "float"), str: ("str",), bool: ("bool",)}


def _fits(v: Any, t: type) -> bool:
    if isinstance(v, bool):
        return t is bool
    return isinstance(v, (int, float)) if t is float else isinstance(v, t)


@dataclass(frozen=True)
class _Binding:
    op: str
    fixed: dict[str, Any]
    free: tuple[Param, ...]  # filled by the skill's arguments, in order


def bind_operations(skillset: SkillSet) -> dict[str, _Binding]:
    """Every skill's operation, checked against :data:`OPERATIONS`; ValueError naming skill and field."""
    out: dict[str, _Binding] = {}
    for spec in skillset.skills:
        where = f"skill set {skillset.id!r}: skill {spec.name!r}"
        if spec.op is None:
            raise ValueError(f"{where} has no op (the drone operation that runs it)")
        params = OPERATIONS.get(spec.op)
        if params is None:
            raise ValueError(f"{where}: unknown op {spec.op!r} (known: {', '.join(sorted(OPERATIONS))})")
        by_name = {p.name: p for p in params}
        fixed: dict[str, Any] = {}
        for k, v in spec.op_args.items():
            p = by_name.get(k)
            if p is None:
                raise ValueError(f"{where}: op {spec.op!r} has no parameter {k!r} (has {', '.join(by_name)})")
            if (not _fits(v, p.type) or (p.choices and v not in p.choices)
                    or (p.min is not None and v < p.min)):
                raise ValueError(f"{where}: op_args.{k} = {v!r} does not fit {p.name}: {p.type.__name__}"
                                 + (f" in {p.choices}" if p.choices else "")
                                 + (f" >= {p.min}" if p.min is not None else ""))
            fixed[k] = v
        free = tuple(p for p in params if p.name not in fixed)
        for sig in spec.signatures:
            if len(sig) != len(free) or any(a.type not in _ARG_TYPES[p.type] for a, p in zip(sig, free, strict=False)):
                want = ", ".join(f"{p.name}: {p.type.__name__}" for p in free) or "none"
                raise ValueError(f"{where}: arguments {spec.signature_text(sig)} do not fill op {spec.op!r} "
                                 f"(parameters left after op_args: {want})")
        out[spec.name] = _Binding(spec.op, fixed, free)
    return out


# -- interpreter -------------------------------------------------------------------

class _Return(Exception):
    def __init__(self, value: Any) -> None:
        self.value = value


@dataclass
class _Frame:
    opener: If | Loop | None  # None: the program itself
    active: bool  # statements inside run now
    body: list[Statement | _Frame] = field(default_factory=list)  # recorded for loop replays


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
        """ValueError if the skill set is not MiniSpec or a skill has no operation this drone knows."""
        if skillset.grammar != "minispec":
            raise ValueError(f"skill set {skillset.id!r} is not MiniSpec")
        self.skillset = skillset
        self.ops = bind_operations(skillset)
        self.backend = backend
        self.perception = perception
        self.stop = stop or StopSignal()
        self.auto_takeoff = auto_takeoff
        self.on_log = on_log or (lambda m: log.info("%s", m))
        self.reset()

    def reset(self) -> None:
        """A new task: no variables, no open blocks, heading 0 (scene bearings are relative to it)."""
        self.vars: dict[str, Any] = {}
        self.declared: frozenset[str] = frozenset()  # variables some validated statement assigns
        self.frames: list[_Frame] = [_Frame(None, True)]
        self.heading = 0.0
        self.finished = False
        self.return_value: Any = None
        self.messages: list[str] = []
        self.cost = CostCounter(model_cost(self.skillset))  # the plan so far, as the planner bounds it
        self.ran_s = 0.0  # modelled seconds of the calls run (their longest, with the real argument values)
        self.ran_iterations = 0  # skill executions and loop passes run

    # -- segments ------------------------------------------------------------
    def validate(self, text: str, *, final: bool = False) -> Program:
        """Refuse (RefusedError) a segment that is not valid MiniSpec of this skill set, closes a block that
        is not open, or uses a variable no earlier statement assigns; ``final``: the plan ends with it, so
        every block must be closed, or takes the plan over a bound of the skill set. Nothing has run, and no
        state changed, when this raises."""
        return self._check(text, final)[0]

    def _check(self, text: str, final: bool) -> tuple[Program, CostCounter]:
        try:
            prog = parse_program(self.skillset, text, complete=final, open_blocks=len(self.frames) - 1,
                                 declared=self.declared)
        except SkillParseError as e:
            raise RefusedError(f"invalid segment: {e}") from None
        cost = self.cost.copy()
        for s in prog.statements:
            cost.feed(s)
            err = bound_error(self.skillset, cost.total)
            if err is not None:
                raise RefusedError(f"invalid segment: {err} at {s.position}")
        return prog, cost

    def execute_segment(self, text: str, *, final: bool = False) -> SegmentResult:
        """Validate, then run the complete statements of one segment. Raises RefusedError (nothing ran; or, with
        a plan bound named, the call or loop pass that would have exceeded it), Interrupted (stopped) or
        ExecutionError (robot or perception failure)."""
        prog, self.cost = self._check(text, final)
        self.declared |= prog.assigned
        res = SegmentResult()
        for s in prog.statements:
            self.stop.check()
            self._feed(s, res)
        res.finished = self.finished
        res.returned = self.return_value
        return res

    def _feed(self, s: Statement, res: SegmentResult) -> None:
        top = self.frames[-1]
        if isinstance(s, EndBlock):
            self.frames.pop()
            if isinstance(top.opener, Loop) and top.active and not self.finished:
                self._replay_loop(top, res)
            return
        if isinstance(s, (If, Loop)):
            active = top.active and not self.finished
            if active and isinstance(s, If):
                try:
                    active = bool(self._eval(s.condition, res))
                except _Return as r:  # rp() in a condition ends the program there
                    self.finished, self.return_value, active = True, r.value, False
            if active and isinstance(s, Loop):
                self._count_pass()
            frame = _Frame(s, active)
            if top.opener is not None:  # record for loop replays, whether or not it runs now
                top.body.append(frame)
            self.frames.append(frame)
            return
        if top.opener is not None:
            top.body.append(s)
        if not top.active or self.finished:
            res.skipped += 1
            return
        try:
            self._run(s, res)
        except _Return as r:
            self.finished, self.return_value = True, r.value

    def _replay_loop(self, loop: _Frame, res: SegmentResult) -> None:
        assert isinstance(loop.opener, Loop)
        try:
            for _ in range(loop.opener.count - 1):
                self._count_pass()
                self._block(loop.body, res)
        except _Return as r:
            self.finished, self.return_value = True, r.value

    def _block(self, body: list[Statement | _Frame], res: SegmentResult) -> None:
        for s in body:
            self.stop.check()
            if isinstance(s, _Frame):
                if isinstance(s.opener, If):
                    if self._eval(s.opener.condition, res):
                        self._block(s.body, res)
                elif isinstance(s.opener, Loop):
                    for _ in range(s.opener.count):
                        self._count_pass()
                        self._block(s.body, res)
            else:
                self._run(s, res)

    def _run(self, s: Statement, res: SegmentResult) -> None:
        if isinstance(s, CallStatement):
            self._eval(s.call, res)
        elif isinstance(s, Assign):
            self.vars[s.var] = self._eval(s.value, res)
        elif isinstance(s, Return):
            raise _Return(self._eval(s.value, res))

    # -- expressions -------------------------------------------------------------
    def _eval(self, e: Any, res: SegmentResult) -> Any:
        if isinstance(e, SkillCall):
            return self._call(e, res)
        if isinstance(e, Var):
            if e.name not in self.vars:
                raise ExecutionError(f"variable {e.name} used before it was assigned")
            return self.vars[e.name]
        if isinstance(e, Not):
            return not self._eval(e.operand, res)
        if isinstance(e, BinOp):
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
        return e  # a literal

    def _call(self, c: SkillCall, res: SegmentResult) -> Any:
        spec = self.skillset[c.name]
        values = [self._eval(a, res) if isinstance(a, Var) else a for a in c.args]
        try:  # real values, variables resolved: bounds hold for them too (same signature: bound by name)
            args, _ = spec.check_args((), dict(zip(c.arg_names, values, strict=True)))
        except ValueError as e:
            self.on_log(f"refused {c.raw}: {e}")
            raise RefusedError(f"refused {c.raw} with values {values}: {e}") from None
        self.stop.check()
        self._count(call_estimate(spec, dataclasses.replace(c, args=args)).max_s, c.raw)
        out = self._dispatch(spec, args)
        res.executed.append(f"{spec.name}({', '.join(_show(a) for a in args)})")
        return out

    def _count_pass(self) -> None:
        self._count(0.0, "a loop pass")

    def _count(self, seconds: float, what: str) -> None:
        """Count one skill execution or loop pass of the running plan; refuse it if it would exceed a bound (the
        validator's worst case holds this for every plan it accepts: a safety net, e.g. for a variable argument
        a polynomial model makes longer than at its bounds)."""
        ss = self.skillset
        if self.ran_iterations + 1 > ss.max_plan_iterations:
            raise RefusedError(f"refused {what}: the plan would exceed max_plan_iterations = "
                               f"{ss.max_plan_iterations} (skill executions and loop passes)")
        if self.ran_s + seconds > ss.max_plan_exec_s:
            raise RefusedError(f"refused {what}: the plan would exceed max_plan_exec_s = {ss.max_plan_exec_s:g} s "
                               f"({self.ran_s:.1f} s run, {seconds:.1f} s more)")
        self.ran_iterations += 1
        self.ran_s += seconds

    # -- operations ------------------------------------------------------------------
    def _dispatch(self, spec: SkillSpec, args: tuple) -> Any:
        b = self.ops[spec.name]
        params = dict(b.fixed)
        for p, v in zip(b.free, args, strict=True):
            if p.choices and v not in p.choices:
                raise RefusedError(f"{spec.name}: {p.name} = {v!r} is not one of {p.choices}")
            params[p.name] = v
        params = {p.name: p.type(params[p.name]) for p in OPERATIONS[b.op]}
        return getattr(self, f"_op_{b.op}")(**params)

    def _airborne(self) -> None:
        if self.auto_takeoff and not self.backend.flying:
            self.backend.takeoff()

    def _op_move(self, direction: str, cm: int) -> None:
        self._airborne()
        self.backend.move(direction, cm)

    def _op_rotate(self, clockwise: bool, degrees: int) -> None:
        self._airborne()
        self.backend.rotate(degrees, clockwise)
        self.heading = (self.heading + (degrees if clockwise else -degrees)) % 360.0

    def _op_hover(self, seconds: float) -> None:
        self.backend.hover(seconds, self.stop)

    def _op_visible(self, target: str) -> bool:
        return self.perception.find(target, self.heading) is not None

    def _op_measure(self, attribute: str, target: str) -> Any:
        d = self.perception.find(target, self.heading)
        if d is None:
            return False  # TypeFly returns False for an object that is not in view
        return getattr(d, attribute)

    def _op_picture(self) -> None:
        take = getattr(self.perception, "take_picture", None)
        if take is not None:
            take(self.heading)
        self.on_log(f"picture taken at heading {self.heading:.0f} deg")

    def _op_probe(self, question: str) -> Any:
        return self.perception.probe(question, self.heading)

    def _op_log(self, text: str) -> None:
        self.messages.append(text)
        self.on_log(f"log: {text}")

    def _op_replan(self) -> None:
        self.on_log("re-plan requested by the plan")
        raise _Return("re_plan")

    def _op_scan(self, target: str, step_deg: int) -> bool:
        return self._scan(lambda: self.perception.find(target, self.heading) is not None, step_deg)

    def _op_scan_probe(self, question: str, step_deg: int) -> Any:
        return self._scan(lambda: self.perception.probe(question, self.heading), step_deg, abstract=True)

    def _op_orient(self, target: str, step_deg: int, tries: int) -> bool:
        for _ in range(tries):
            d = self.perception.find(target, self.heading)
            if d is None:
                return False
            if CENTRED[0] <= d.x <= CENTRED[1]:
                return True
            err = bearing_error(d)
            self.stop.check()
            self._op_rotate(err > 0, step_deg)
        d = self.perception.find(target, self.heading)
        return d is not None and CENTRED[0] <= d.x <= CENTRED[1]

    def _op_goto(self, target: str, step_deg: int, tries: int, cm: int) -> None:
        self._op_orient(target, step_deg, tries)
        self._op_move("forward", cm)

    def _scan(self, look: Callable[[], Any], step_deg: int, abstract: bool = False) -> Any:
        looks = 360 // step_deg
        for i in range(looks):
            found = look()
            if found is not False and found is not None:
                return found if abstract else True
            if i < looks - 1:
                self.stop.check()
                self._op_rotate(True, step_deg)
        return False


def _show(a: Any) -> str:
    return repr(a) if isinstance(a, str) else str(a)


__all__ = ["OPERATIONS", "DroneBackend", "ExecutionError", "Interrupted", "MiniSpecInterpreter", "Param",
           "RefusedError", "SegmentResult", "bind_operations"]
