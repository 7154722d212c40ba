"""The skill language front end: one lexer, one parser, one validator.

Everything that reads plan text goes through here: :meth:`SkillSet.parse` /
:meth:`SkillSet.validate` (the planner's gate), :meth:`SkillSet.validate_plan`
(whole plans), the drone interpreter (it executes the :class:`Program` this
module builds, it has no parser of its own) and the stop checkers (they drive
the same :class:`Lexer` one character at a time). So the planner can never
validate one parse while the robot executes another.

Grammars (``grammar:`` in the skill-set YAML):

* ``minispec`` — TypeFly's MiniSpec. Statements are calls ``mf(50)``,
  assignments ``_1=ox('cat')``, returns ``->True``, conditionals
  ``?iv('cat')==True{...}`` and loops ``8{...}``; ``;`` separates statements
  and is optional after ``}`` and before ``}``. Conditions compare values with
  ``== != < > <= >=``, combine them with ``&`` (``&&``) and ``|`` (``||``) and
  negate with ``!``; parentheses group.
* ``calls`` — ``;``-separated calls only (robot arm).
* ``text`` — prose, no skills (chatbot); never parsed.

Lexical rules and the :class:`Lexer`: :mod:`timelyllm_ros.skills.lexer` (its
names are importable from here too). This module holds the parser / validator; the
AST is :mod:`~timelyllm_ros.skills.plan_ast`, the plan bounds :mod:`~timelyllm_ros.skills.plan_cost` (their
names are importable from here too).

Hostile text is refused (SkillParseError), never crashes the validator (it
runs on the planner's engine thread): a number has at most
:data:`MAX_NUMBER_CHARS` characters, a string value at most
:data:`MAX_STRING_CHARS` and no control character (:func:`is_control`:
newline, ESC, U+2028, ... would reach the operator's console through ``l()``),
``(`` and ``!`` nest at most :data:`MAX_NESTING` deep (so does an
expression's operator tree) and blocks :data:`MAX_BLOCK_DEPTH` deep.

Text is parsed as a whole plan (``complete=True``: blocks must balance) or as
one segment of a plan streamed in pieces: a ``}`` may close a block an earlier
segment opened and blocks may stay open for a later one. Given the number of
blocks open before the text (``open_blocks``) and the variables assigned
before it (``declared``), the validator also refuses a ``}`` that closes
nothing and a variable used before any assignment to it.

Argument values are checked against the skill's signature (type, bounds,
pattern) as parsed; a variable argument is kept as :class:`Var` and checked by
the robot once its value is known (:meth:`SkillSpec.check_args`).

Plans are bounded (:class:`CostCounter`): loops unrolled, every branch taken
and every call at the execution-time model's maximum, a plan may take at most
the skill set's ``max_plan_exec_s`` and run at most ``max_plan_iterations``
skill executions and loop passes. Text whose own statements already exceed a
bound is refused here; :func:`stream_cost` checks a segment in the context of
the plan before it (what the planner and the robot do).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from timelyllm_ros.skills.lexer import (  # the lexer's names are part of this module's API too
    BOOL_LITERALS,
    COMPARISONS,
    DIGITS,
    ESCAPE,
    IDENT_CHARS,
    IDENT_START,
    MAX_BLOCK_DEPTH,
    MAX_NESTING,
    MAX_NUMBER_CHARS,
    MAX_STRING_CHARS,
    OPERATORS,
    QUOTES,
    SKILL_NAME_RE,
    VAR_RE,
    Lexer,
    SkillParseError,
    Token,
    is_control,
    is_space,
    tokenize,
)
from timelyllm_ros.skills.plan_ast import (  # the syntax tree's names are part of this module's API too
    ArgValue,
    Assign,
    BinOp,
    CallStatement,
    EndBlock,
    Expr,
    If,
    Loop,
    Not,
    ParseCache,
    Program,
    Return,
    SkillCall,
    Statement,
    Var,
    statement_calls,
)
from timelyllm_ros.skills.plan_cost import (  # so are the plan bounds'
    CallCost,
    Cost,
    CostCounter,
    bound_error,
    model_cost,
)

if TYPE_CHECKING:
    from timelyllm_ros.skills.schema import SkillSet, SkillSpec


def stream_cost(ss: SkillSet, before: str, text: str, call_cost: CallCost | None = None) -> tuple[Cost, Cost]:
    """Parse a plan's next segment ``text`` after the plan so far, ``before``, with full context (blocks open,
    variables assigned); returns (what running the segment costs: its calls once, plus at each loop's ``}`` the
    count-1 replays of the loop's body, nested loops multiplied; the plan so far with the segment, open blocks
    closed). SkillParseError if either text is invalid there, or if the plan so far exceeds a bound of ``ss``
    (checked with the model's maxima, whatever ``call_cost`` is: default, the model too).
    """
    first = parse_program(ss, before, open_blocks=0, declared=())
    prog = parse_program(ss, text, open_blocks=first.opened, declared=first.assigned)
    bound = CostCounter(model_cost(ss))
    for s in first.statements:
        bound.feed(s)
    seg_bound = Cost()
    for s in prog.statements:
        seg_bound = seg_bound + bound.feed(s)
        err = bound_error(ss, bound.total)
        if err is not None:
            raise SkillParseError(err, s.position)
    if call_cost is None:
        return seg_bound, bound.total
    counter = CostCounter(call_cost)
    for s in first.statements:
        counter.feed(s)
    seg = Cost()
    for s in prog.statements:
        seg = seg + counter.feed(s)
    return seg, counter.total


# ---------------------------------------------------------------------------
# Parser and validator
# ---------------------------------------------------------------------------

# Texts longer than this are parsed each time, not kept: a plan so far (each segment's cost is parsed after it) is
# a new text at every segment, and its parse would take a cache entry many times a segment's size.
PARSE_CACHE_MAX_CHARS = 256


def parse_program(ss: SkillSet, text: str, *, complete: bool = False, open_blocks: int | None = None,
                  declared: Iterable[str] | None = None) -> Program:
    """Parse ``text`` as MiniSpec / calls of ``ss`` and validate it; SkillParseError at the first problem.

    ``open_blocks``: blocks open before the text (None: unknown, any ``}`` may close an earlier one).
    ``declared``: variables assigned before the text (None: unknown, no use-before-assignment check).
    ``complete``: the text ends the plan, so every block must be closed (``open_blocks`` None counts as 0).
    """
    if ss.grammar not in ("minispec", "calls"):
        raise ValueError(f"skill set {ss.id!r} has no skill language (grammar {ss.grammar!r})")
    if complete and open_blocks is None:
        open_blocks = 0
    known = None if declared is None else frozenset(declared)
    if len(text) > PARSE_CACHE_MAX_CHARS:
        return _Parser(ss, text, open_blocks, known, complete).run()
    key = (text, complete, open_blocks, known)
    prog = ss.parsed.get(key)  # (a text that does not parse raises each time: it is not kept)
    if prog is None:
        prog = _Parser(ss, text, open_blocks, known, complete).run()
        ss.parsed.put(key, prog)
    return prog


class _Parser:
    def __init__(self, ss: SkillSet, text: str, open_blocks: int | None, declared: frozenset[str] | None,
                 complete: bool) -> None:
        self.ss, self.text, self.complete = ss, text, complete
        self.outer = open_blocks
        self.declared = declared
        self.minispec = ss.grammar == "minispec"
        self.toks = tokenize(text)
        self.i = 0
        self.calls: list[SkillCall] = []
        self.assigned: set[str] = set()
        self.nesting = 0  # '(' and '!' being parsed
        self.cost = CostCounter(model_cost(ss))

    # -- token helpers -------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def peek(self, k: int = 1) -> Token:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def peek_op(self, op: str) -> bool:
        t = self.peek()
        return t.kind == "op" and t.value == op

    def take(self) -> Token:
        t = self.toks[self.i]
        self.i += 1
        return t

    def at_op(self, *ops: str) -> bool:
        return self.tok.kind == "op" and self.tok.value in ops

    def expect(self, op: str, what: str) -> Token:
        if not self.at_op(op):
            raise SkillParseError(f"expected {op!r} {what}, found {self._show(self.tok)}", self.tok.pos)
        return self.take()

    @staticmethod
    def _show(t: Token) -> str:
        return "end of text" if t.kind == "eof" else repr(t.text)

    # -- statements ------------------------------------------------------------
    def run(self) -> Program:
        stmts: list[Statement] = []
        opened: list[int] = []  # positions of the '{' opened here and still open
        closed = 0
        while self.tok.kind != "eof":
            t = self.tok
            if self.at_op(";"):
                self.take()
            elif self.at_op("}"):
                if not self.minispec:
                    raise SkillParseError("unexpected '}' (blocks are not part of this skill language)", t.pos)
                if opened:
                    opened.pop()
                elif self.outer is None:
                    closed += 1
                elif closed < self.outer:
                    closed += 1
                else:
                    raise SkillParseError("unmatched '}' (it closes no open block)", t.pos)
                self.take()
                stmts.append(EndBlock(t.pos))
                self.cost.feed(stmts[-1])
            else:
                s, brace = self.statement()
                stmts.append(s)
                if brace is not None:
                    opened.append(brace)
                    depth = len(opened) + (0 if self.outer is None else self.outer - closed)
                    if depth > MAX_BLOCK_DEPTH:
                        raise SkillParseError(f"blocks nested {depth} deep (at most {MAX_BLOCK_DEPTH})", brace)
                self.cost.feed(s)
                err = bound_error(self.ss, self.cost.total)  # what this text alone costs: a plan's least
                if err is not None:
                    raise SkillParseError(err, s.position)
        if self.complete:
            if opened:
                raise SkillParseError("unclosed '{'", opened[-1])
            if self.outer is not None and closed < self.outer:
                raise SkillParseError(f"unclosed '{{' ({self.outer - closed} block(s) of earlier text still open)",
                                      len(self.text))
        return Program(self.text, tuple(stmts), tuple(self.calls), frozenset(self.assigned), len(opened), closed)

    def statement(self) -> tuple[Statement, int | None]:
        """One statement, and the position of the '{' it opened, if any."""
        t = self.tok
        if t.kind == "ident" and self.peek_op("("):
            return CallStatement(self.call("statement"), t.pos), None
        if not self.minispec:
            raise SkillParseError(f"expected a skill call, found {self._show(t)}", t.pos)
        if self.at_op("?"):
            self.take()
            cond = self.expr("condition")
            return If(cond, t.pos), self.expect("{", "after the condition").pos
        if t.kind == "num":
            self.take()
            if not isinstance(t.value, int) or not 1 <= t.value <= self.ss.max_loop_count:
                raise SkillParseError(f"loop count {t.text} outside [1, {self.ss.max_loop_count}]", t.pos)
            return Loop(t.value, t.pos), self.expect("{", "after the loop count").pos
        if self.at_op("->"):
            self.take()
            return Return(self.expr("return"), t.pos), None
        if t.kind == "ident" and VAR_RE.fullmatch(t.text) and self.peek_op("="):
            self.take()
            self.take()
            value = self.expr("assign")
            self.assigned.add(t.text)  # after its value: `_1=ox(_1)` reads the old _1
            return Assign(t.text, value, t.pos), None
        if t.kind == "ident":
            if self.ss.get(t.text) is not None:
                raise SkillParseError(f"skill {t.text!r} must be called with '(...)'", t.pos)
            raise SkillParseError(f"unknown skill {t.text!r}", t.pos)
        raise SkillParseError(f"expected a statement, found {self._show(t)}", t.pos)

    # -- expressions --------------------------------------------------------------
    def expr(self, role: str) -> Expr:
        left = self.conj(role)
        while self.at_op("|"):
            t = self.take()
            left = _shallow(BinOp("|", left, self.conj(role)), t.pos)
        return left

    def conj(self, role: str) -> Expr:
        left = self.comparison(role)
        while self.at_op("&"):
            t = self.take()
            left = _shallow(BinOp("&", left, self.comparison(role)), t.pos)
        return left

    def comparison(self, role: str) -> Expr:
        left = self.unary(role)
        if self.at_op(*COMPARISONS):
            t = self.take()
            return _shallow(BinOp(t.value, left, self.unary(role)), t.pos)
        return left

    def unary(self, role: str) -> Expr:
        if self.at_op("!", "("):
            t = self.take()
            self.nesting += 1
            if self.nesting > MAX_NESTING:
                raise SkillParseError(f"'(' and '!' nested more than {MAX_NESTING} deep", t.pos)
            if t.value == "!":
                e: Expr = _shallow(Not(self.unary(role)), t.pos)
            else:
                e = self.expr(role)
                self.expect(")", "to close '('")
            self.nesting -= 1
            return e
        if self.tok.kind == "ident" and self.peek_op("("):
            return self.call(role)
        return self.literal(f"in {role}")

    def literal(self, where: str) -> ArgValue:
        t = self.take()
        if t.kind == "op" and t.value == "-" and self.tok.kind == "num":
            return -self.take().value
        if t.kind == "str":
            # A string reaches the robot, and through l() the operator's console: no terminal escapes, no
            # line breaks (U+2028 and U+2029 included), whatever the quoting.
            bad = next((i for i, c in enumerate(t.text) if is_control(c)), None)
            if bad is not None:
                ch = t.text[bad]
                what = "line or paragraph separator" if ch in "\u2028\u2029" else "control character"
                raise SkillParseError(f"{what} U+{ord(ch):04X} in a string", t.pos + bad)
            if len(t.value) > MAX_STRING_CHARS:
                raise SkillParseError(f"string of {len(t.value)} characters (at most {MAX_STRING_CHARS})", t.pos)
            return t.value
        if t.kind == "num":
            return t.value
        if t.kind == "ident":
            if t.text in BOOL_LITERALS:
                return BOOL_LITERALS[t.text]
            if VAR_RE.fullmatch(t.text):
                if not self.minispec:
                    raise SkillParseError(f"variables are not part of this skill language: {t.text!r}", t.pos)
                if self.declared is not None and t.text not in self.declared and t.text not in self.assigned:
                    raise SkillParseError(f"variable {t.text} is used before it is assigned", t.pos)
                return Var(t.text)
            if self.ss.get(t.text) is not None:
                raise SkillParseError(f"skill {t.text!r} must be called with '(...)'", t.pos)
            raise SkillParseError(f"unknown name {t.text!r} {where} (quote strings: '{t.text}')", t.pos)
        raise SkillParseError(f"expected a value {where}, found {self._show(t)}", t.pos)

    def call(self, role: str) -> SkillCall:
        name_tok = self.take()
        spec: SkillSpec | None = self.ss.get(name_tok.text)
        if spec is None:
            raise SkillParseError(f"unknown skill {name_tok.text!r}", name_tok.pos)
        self.expect("(", f"after {name_tok.text}")
        values: list[ArgValue] = []
        kwargs: dict[str, ArgValue] = {}
        while not self.at_op(")"):
            if self.tok.kind == "eof":
                raise SkillParseError(f"unclosed argument list of {spec.name}", self.tok.pos)
            if values or kwargs:
                self.expect(",", f"between arguments of {spec.name}")
            arg_tok = self.tok
            if arg_tok.kind == "ident" and self.peek_op("=") and not VAR_RE.fullmatch(arg_tok.text):
                self.take()
                self.take()
                if arg_tok.text in kwargs:  # else the last one would silently win: mf(distance=50,distance=500)
                    raise SkillParseError(f"keyword argument {arg_tok.text!r} of {spec.name} given twice", arg_tok.pos)
                kwargs[arg_tok.text] = self._arg_value(spec)
            else:
                if kwargs:
                    raise SkillParseError(f"positional argument after keyword argument in {spec.name}", arg_tok.pos)
                values.append(self._arg_value(spec))
        close = self.take()
        try:
            bound, names = spec.check_args(values, kwargs)
        except ValueError as e:
            raise SkillParseError(str(e), name_tok.pos) from None
        call = SkillCall(spec.name, spec.long_name, bound, self.text[name_tok.pos:close.pos + 1], self.ss.id, names,
                         name_tok.pos, role)
        self.calls.append(call)
        return call

    def _arg_value(self, spec: SkillSpec) -> ArgValue:
        t = self.tok
        if t.kind == "eof":
            raise SkillParseError(f"unclosed argument list of {spec.name}", t.pos)
        if t.kind == "ident" and self.peek_op("("):
            raise SkillParseError(f"nested call {t.text}(...) as argument of {spec.name}; "
                                  "assign it to a variable first", t.pos)
        return self.literal(f"as argument of {spec.name}")


def _depth(e: Expr) -> int:
    """Levels of an expression's operator tree (recursive: only called on trees :func:`_shallow` admitted)."""
    if isinstance(e, Not):
        return 1 + _depth(e.operand)
    if isinstance(e, BinOp):
        return 1 + max(_depth(e.left), _depth(e.right))
    return 0


def _shallow(e: Expr, pos: int) -> Expr:
    # The interpreter evaluates expressions recursively: `a&b&c&...` builds a tree as deep as it is long.
    if _depth(e) > MAX_NESTING:
        raise SkillParseError(f"expression nested more than {MAX_NESTING} operators deep", pos)
    return e


__all__ = [
    "BOOL_LITERALS", "COMPARISONS", "DIGITS", "ESCAPE", "IDENT_CHARS", "IDENT_START", "MAX_BLOCK_DEPTH",
    "MAX_NESTING", "MAX_NUMBER_CHARS", "MAX_STRING_CHARS", "OPERATORS", "QUOTES", "SKILL_NAME_RE", "VAR_RE",
    "ArgValue", "Assign", "BinOp", "CallCost", "CallStatement", "Cost", "CostCounter", "EndBlock", "Expr", "If",
    "Lexer", "Loop", "Not", "ParseCache", "Program", "Return", "SkillCall", "SkillParseError", "Statement", "Token",
    "Var",
    "bound_error", "is_control", "is_space", "model_cost", "parse_program", "statement_calls", "stream_cost",
    "tokenize",
]
