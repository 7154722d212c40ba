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

With the task's text (``judge(..., task=...)``), the **strict** judge also applies checks that every plan of
every task must pass, read from the plan and the task's sentence (skills/task_analysis.py), none declared:

  ``repeat``    no statement repeated back to back (the same call, or the same block) outside a loop, unless
                the run is as long as a count the task asks for (``spin twice``: ``tc(360);tc(360);``);
  ``log``       a log states something: not a one-word fragment (a bare yes/no answers a question, a greeting
                is a whole utterance), not the same text twice, and an answer to a question names no object of
                the task that the conditions it is under did not observe (``?iv('keys')==True{l('the wallet
                is there')}``);
  ``names``     every object or place argument is a noun phrase of the task or a name of its scene, never a verb,
                an adjective of state or a number word (``door_closed``, ``spin_around``, ``both``);
  ``answer``    a question the plan answers with logs is answered on every outcome of its conditions (every
                truth assignment of the perception calls it tests logs something);
  ``count``     each count in the task (``twice``, ``three pictures``, ``in four steps``) is a loop of that
                count or one call made that many times;
  ``unasked``   a normal task that asks for no movement gets no movement by a set amount (``mf(50)`` before the
                asked-for photo); going to a named object (``g``, ``move_to``) is the task's own.

Pure Python: no ROS, no engine. :func:`judge` is what the plan-quality benchmark calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from timelyllm_ros.domain.plans import PlanTemplate
from timelyllm_ros.skills import task_analysis as ta
from timelyllm_ros.skills.exec_model import ExecTimeModel
from timelyllm_ros.skills.minispec import (
    ArgValue,
    Assign,
    BinOp,
    CallStatement,
    EndBlock,
    If,
    Loop,
    Not,
    Program,
    SkillCall,
    SkillParseError,
    Statement,
    Var,
    statement_calls,
)
from timelyllm_ros.skills.schema import SkillSet
from timelyllm_ros.skills.skill_files import load_skill_set
from timelyllm_ros.skills.task_names import STOPWORDS, move_phrases

CHECKS = ("require", "sequence", "numbers", "evasive")
STRICT_CHECKS = ("repeat", "log", "names", "answer", "count", "unasked")
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
          model: ExecTimeModel | None = None, task: str | None = None) -> Verdict:
    """Judge one plan. ``ended``: False when the generation stopped on its token budget (not a plan).
    ``task``: the task's input text, for the strict checks (:func:`strict_failures`); None: declared checks only."""
    if not ended:
        return Verdict(plan, False, "the generation did not end (token budget exhausted)")
    err = ss.validate_plan(plan)
    if err:
        return Verdict(plan, False, err)
    if (spec is None and task is None) or ss.grammar == "text":
        return Verdict(plan, True)
    try:
        prog = ss.parse_program(plan, complete=True)
    except SkillParseError as e:  # validate_plan accepted it: cannot happen, but never judge what did not parse
        return Verdict(plan, False, str(e))
    out = [] if spec is None else spec.failures(list(prog.calls), ss, model)
    if task is not None:
        out += strict_failures(prog, ss, task)
    return Verdict(plan, True, failures=tuple(out))


def template_spec(tpl: PlanTemplate, ss: SkillSet | None = None) -> QualitySpec:
    """The checks a task template declares (an empty spec when it declares none)."""
    ss = ss or load_skill_set(tpl.robot_type)
    return QualitySpec.from_dict(tpl.quality, ss, f"data/plans.yaml: task {tpl.name}: quality")


# -- the strict checks --------------------------------------------------------------------------------------------
@dataclass
class _Node:
    """A statement with its text, and for a block (If / Loop) the statements in it."""

    stmt: Statement
    text: str  # whitespace and the closing ';' left out: what "the same statement" compares
    children: list[_Node]


def _tree(prog: Program) -> list[_Node]:
    text, stmts = prog.text, prog.statements
    top: list[_Node] = []
    stack: list[tuple[_Node, list[_Node]]] = []
    for i, st in enumerate(stmts):
        if isinstance(st, EndBlock):
            if stack:
                node, _ = stack.pop()
                node.text = _clean(text[node.stmt.position:st.position + 1])
            continue
        siblings = stack[-1][1] if stack else top
        end = stmts[i + 1].position if i + 1 < len(stmts) else len(text)
        node = _Node(st, _clean(text[st.position:end]), [])
        siblings.append(node)
        if isinstance(st, If | Loop):
            stack.append((node, node.children))
    return top


def _clean(t: str) -> str:
    return " ".join(t.split()).rstrip(";").strip()


def _walk(nodes: Sequence[_Node], conds: tuple[Any, ...] = (), times: int = 1, in_loop: bool = False):
    """(node, enclosing If conditions, executions per run of the plan, inside a loop) for every statement."""
    for n in nodes:
        yield n, conds, times, in_loop
        if isinstance(n.stmt, If):
            yield from _walk(n.children, (*conds, n.stmt.condition), times, in_loop)
        elif isinstance(n.stmt, Loop):
            yield from _walk(n.children, conds, times * n.stmt.count, True)


def _runs(nodes: Sequence[_Node], in_loop: bool = False):
    """(text, length) of each run of identical statements back to back outside a loop, every block level."""
    if not in_loop:
        i = 0
        while i < len(nodes):
            j = i
            while j + 1 < len(nodes) and nodes[j + 1].text == nodes[i].text:
                j += 1
            if j > i:
                yield nodes[i].text, j - i + 1
            i = j + 1
    for n in nodes:
        if n.children:
            yield from _runs(n.children, in_loop or isinstance(n.stmt, Loop))


def _log_skills(ss: SkillSet) -> frozenset[str]:
    return frozenset(s.name for s in ss.skills if s.op == "log")


def _name_words(name: str) -> frozenset[str]:
    return frozenset(w.rstrip("s") for w in name.split("_") if w)


# One-word logs that are whole utterances: an answer to a question, and (any task) a greeting or thanks.
_YES_NO = frozenset({"yes", "no", "true", "false"})
_INTERJECTIONS = frozenset({"hello", "hi", "hey", "goodbye", "bye", "thanks", "welcome"})


def strict_failures(prog: Program, ss: SkillSet, task: str) -> list[str]:
    """What a valid plan (its parsed program) fails of the strict checks (module docstring) for its task."""
    out: list[str] = []
    nodes = _tree(prog)
    counts = ta.counts(task)
    question = ta.is_question(task)
    logs = _log_skills(ss)
    phrases = ta.noun_phrases(task, STOPWORDS - ta.VERBS)
    mentioned = [n for n in ta.name_runs(task, STOPWORDS - ta.VERBS) if n not in ta.scene_names(task)]
    for text, k in _runs(nodes):
        if k not in counts:
            out.append(f"repeat: {text} {k} times in a row")
    walked = list(_walk(nodes))
    assigned = {n.stmt.var: n.stmt.value for n, _, _, _ in walked if isinstance(n.stmt, Assign)}
    seen_logs: dict[str, int] = {}
    for n, conds, _, _ in walked:
        for c in statement_calls(n.stmt):
            for arg_spec, v in zip(_sig(ss, c), c.args, strict=False):
                if arg_spec is not None and arg_spec.from_task and isinstance(v, str) and _norm(v) not in phrases:
                    out.append(f"names: {c.raw}: {v!r} is no noun phrase of the task or name of its scene")
            if c.name not in logs or not c.args or not isinstance(c.args[0], str):
                continue
            said = c.args[0]
            ws = [w for w in ta.words(said) if w[:1].isalpha()]
            if not ws or (len(ws) == 1 and not (question and ws[0] in _YES_NO) and ws[0] not in _INTERJECTIONS):
                out.append(f"log: {c.raw} is a fragment, not a statement")
            key = " ".join(ws)
            seen_logs[key] = seen_logs.get(key, 0) + 1
            if seen_logs[key] == 2:
                out.append(f"log: {c.raw} logged twice")
            observed = [_name_words(x) for x in _observed(conds, assigned)]
            if question and observed:  # an answer is about what its conditions observed
                said_words = frozenset(w.rstrip("s") for w in ws)
                for m in mentioned:
                    mw = _name_words(m)
                    if mw <= said_words and not any(mw <= o for o in observed):
                        out.append(f"log: {c.raw} states the {m.replace('_', ' ')} where the plan observed "
                                   f"{', '.join('_'.join(sorted(o)) for o in observed)}")
    if question and any(c.name in logs for c in prog.calls):
        miss = _unanswered(nodes, assigned, logs)
        if miss:
            out.append(f"answer: no log when {miss}")
    for k in counts:
        execs: dict[str, int] = {}
        for n, _, times, _ in walked:
            if isinstance(n.stmt, CallStatement):
                execs[n.text] = execs.get(n.text, 0) + times
        if not any(isinstance(n.stmt, Loop) and n.stmt.count == k for n, _, _, _ in walked) and k not in execs.values():
            out.append(f"count: the task asks for {k}: no loop of {k}, no call made {k} times")
    if ta.tag(task) != "E" and not ta.asks_to_move(task, move_phrases(ss)):
        for c in prog.calls:
            if ss[c.name].kind == "movement" and any(_is_number(a) for a in c.args):
                out.append(f"unasked: {c.raw} moves the robot by an amount the task does not ask for")
                break
    return out


def _sig(ss: SkillSet, c: SkillCall):
    """The argument specs of the signature a call was bound to (by its argument names)."""
    for sig in ss[c.name].signatures:
        if tuple(a.name for a in sig) == tuple(c.arg_names):
            return list(sig)
    return [None] * len(c.args)


def _observed(conds: Sequence[Any], assigned: Mapping[str, Any]) -> list[str]:
    """The object names the perception calls of these conditions test (variables read through their value)."""
    out: list[str] = []
    stack = list(conds)
    seen: set[str] = set()
    while stack:
        e = stack.pop()
        if isinstance(e, SkillCall):
            out += [a for a in e.args if isinstance(a, str)]
        elif isinstance(e, Var) and e.name in assigned and e.name not in seen:
            seen.add(e.name)
            stack.append(assigned[e.name])
        elif isinstance(e, Not):
            stack.append(e.operand)
        elif isinstance(e, BinOp):
            stack += (e.left, e.right)
    return out


_MAX_ATOMS = 6


def _unanswered(nodes: Sequence[_Node], assigned: Mapping[str, Any], logs: frozenset[str]) -> str | None:
    """None if every truth assignment of the conditions' tests runs a log, else one that runs none (in words)."""
    atoms: dict[str, None] = {}

    def ev(e: Any, val: Mapping[str, bool] | None, depth: int = 0) -> Any:
        if isinstance(e, bool) or (not isinstance(e, SkillCall | Var | Not | BinOp)):
            return e
        if isinstance(e, Var):
            if e.name in assigned and depth < 8:
                return ev(assigned[e.name], val, depth + 1)
            return _atom(e.name, val)
        if isinstance(e, Not):
            return not ev(e.operand, val, depth)
        if isinstance(e, SkillCall):
            return _atom(e.raw, val)
        if e.op in ("&", "|"):
            a, b = bool(ev(e.left, val, depth)), bool(ev(e.right, val, depth))
            return (a and b) if e.op == "&" else (a or b)
        if e.op in ("==", "!=") and (isinstance(e.right, bool) or isinstance(e.left, bool)):
            lit, other = (e.right, e.left) if isinstance(e.right, bool) else (e.left, e.right)
            same = bool(ev(other, val, depth)) == lit
            return same if e.op == "==" else not same
        return _atom(repr(e), val)

    def _atom(key: str, val: Mapping[str, bool] | None) -> bool:
        atoms.setdefault(key)
        return True if val is None else val.get(key, True)

    def logs_in(ns: Sequence[_Node], val: Mapping[str, bool] | None) -> bool:
        hit = False
        for n in ns:
            st = n.stmt
            if isinstance(st, If):
                if ev(st.condition, val) and logs_in(n.children, val):
                    hit = True
            elif isinstance(st, Loop):
                hit = logs_in(n.children, val) or hit
            elif any(c.name in logs for c in statement_calls(st)):
                hit = True
        return hit

    logs_in(nodes, None)  # collects the atoms
    keys = list(atoms)[:_MAX_ATOMS]
    for bits in range(2 ** len(keys)):
        val = {k: bool(bits >> i & 1) for i, k in enumerate(keys)}
        if not logs_in(nodes, val):
            return ", ".join(f"{k} is {v}" for k, v in val.items()) or "the plan runs"
    return None


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
