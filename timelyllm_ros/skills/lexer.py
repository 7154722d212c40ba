"""The skill language's lexical rules and its one :class:`Lexer`.

The parser (:mod:`timelyllm_ros.skills.minispec`), the stop checkers and the
grammar builder all read text through it, so they agree on where every token
ends.

Lexical rules: identifiers ``[A-Za-z_][A-Za-z0-9_]*``;
numbers ``(\\d+\\.\\d*|\\.\\d+|\\d+)([eE][-+]?\\d+)?`` (ASCII digits; a
leading ``-`` is an operator the parser folds into the literal); strings in
``'`` or ``"`` where a backslash takes the next character literally; the
operators of :data:`OPERATORS`; whitespace between tokens. Variables are
``_<digits>``; ``True``/``False`` are literals.

The limits on hostile text (:data:`MAX_NESTING`, :data:`MAX_BLOCK_DEPTH`,
:data:`MAX_NUMBER_CHARS`, :data:`MAX_STRING_CHARS`) are defined here too;
the parser enforces the ones a lexer cannot see.
"""

from __future__ import annotations

import re
import string
import unicodedata
from dataclasses import dataclass
from typing import Any

# ---------------------------------------------------------------------------
# Lexical definitions (the stop checkers read these too)
# ---------------------------------------------------------------------------

IDENT_START = frozenset(string.ascii_letters + "_")
IDENT_CHARS = IDENT_START | frozenset(string.digits)
DIGITS = frozenset(string.digits)
QUOTES = frozenset("'\"")
ESCAPE = "\\"
OPERATORS = ("->", "==", "!=", "<=", ">=", "&&", "||",
             "-", "?", "{", "}", "(", ")", ";", ",", "=", "<", ">", "&", "|", "!")
_OP_CANON = {"&&": "&", "||": "|"}
_OP_PREFIXES = frozenset(op[0] for op in OPERATORS if len(op) == 2)
COMPARISONS = ("==", "!=", "<", ">", "<=", ">=")
BOOL_LITERALS = {"True": True, "False": False}
VAR_RE = re.compile(r"_[0-9]+")
SKILL_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # a skill name; `_1` is a variable

# Limits on hostile text. The parser recurses per '(' and '!' (and the interpreter per operator-tree level), so
# nesting is bounded well below Python's recursion limit; int() refuses more than 4300 digits. Real plans
# stay far below all of them.
MAX_NESTING = 32  # '(' and '!' nested in one expression; depth of an expression's operator tree
MAX_BLOCK_DEPTH = 16  # blocks open at once
MAX_NUMBER_CHARS = 32  # characters of a number literal
MAX_STRING_CHARS = 1000  # characters of a string literal (skill arguments have their own, smaller max_length)


def is_space(c: str) -> bool:
    return c.isspace()


def is_control(c: str) -> bool:
    """Unicode category C (control, format, private use, unassigned, surrogate) and the line and paragraph
    separators (Zl, Zp: U+2028, U+2029 break a console line as a newline does): refused in strings."""
    cat = unicodedata.category(c)
    return cat[0] == "C" or cat in ("Zl", "Zp")


class SkillParseError(ValueError):
    """LLM output is not a valid plan for the skill set.

    ``position`` is the character offset in the parsed text.
    """

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} at {position}")
        self.position = position
        self.reason = message


@dataclass(frozen=True)
class Token:
    kind: str  # ident, num, str, op, bad (not a token: value is why), eof
    text: str  # as written
    pos: int
    value: Any = None  # num: int | float; str: the unescaped string; op: canonical op; bad: the reason


# Number automaton (the regex of the lexical rules above): state -> character class -> next state.
_NUM_STEPS = {
    "int": {"digit": "int", ".": "frac", "e": "exp_mark"},
    "dot": {"digit": "frac"},
    "frac": {"digit": "frac", "e": "exp_mark"},
    "exp_mark": {"digit": "exp", "sign": "exp_sign"},
    "exp_sign": {"digit": "exp"},
    "exp": {"digit": "exp"},
}
_NUM_ACCEPTING = frozenset({"int", "frac", "exp"})


def _num_class(c: str) -> str:
    if c in DIGITS:
        return "digit"
    return {"e": "e", "E": "e", "+": "sign", "-": "sign"}.get(c, c)


class Lexer:
    """Incremental lexer: :meth:`feed` text in pieces of any size, get the tokens each piece completes.

    Operators that start no longer operator (``( ) ; { } ? ,``) come out with their character, so a
    stop checker sees a terminator the moment it is written; identifiers, numbers and ``-`` ``=``
    ``!`` ``<`` ``>`` ``&`` ``|`` come out when the next character shows where they end. A character
    that starts no token gives a ``bad`` token (the lexer goes on). :meth:`end` flushes the last
    token (an unterminated string is ``bad``) and appends ``eof``.
    """

    def __init__(self) -> None:
        self._pos = 0  # offset of the next character
        self._kind: str | None = None  # token being read: ident, num, op, str
        self._start = 0
        # The token's characters so far, joined once at its end: `str += c` copied the whole token for each
        # character (quadratic: 400k characters took 2.5 s, 10 MB did not finish in 280 s).
        self._buf: list[str] = []
        self._num = ""  # number automaton state
        self._accept = 0  # length of the longest prefix of _buf that is a number
        self._quote = ""
        self._escape = False
        self._chars: list[str] = []  # unescaped string contents

    @property
    def in_string(self) -> bool:
        return self._kind == "str"

    def feed(self, text: str) -> list[Token]:
        out: list[Token] = []
        for c in text:
            self._char(c, out)
        return out

    def end(self) -> list[Token]:
        out: list[Token] = []
        while self._kind is not None:  # a flush may read the end of a number again
            if self._kind == "str":
                out.append(Token("bad", "".join(self._buf), self._start, "unterminated string"))
                self._kind = None
            else:
                self._flush(out)
        out.append(Token("eof", "", self._pos))
        return out

    def _char(self, c: str, out: list[Token]) -> None:
        if self._kind == "str":
            self._buf.append(c)
            self._pos += 1
            if self._escape:
                self._escape = False
                self._chars.append(c)
            elif c == ESCAPE:
                self._escape = True
            elif c == self._quote:
                out.append(Token("str", "".join(self._buf), self._start, "".join(self._chars)))
                self._kind = None
            else:
                self._chars.append(c)
            return
        if self._kind is not None:
            if self._extend(c):
                self._buf.append(c)
                self._pos += 1
                return
            self._flush(out)
            if self._kind is not None:  # what followed a number was read again and started a token
                self._char(c, out)
                return
        self._begin(c, out)

    def _extend(self, c: str) -> bool:
        if self._kind == "ident":
            return c in IDENT_CHARS
        if self._kind == "op":  # at most two characters
            return "".join(self._buf) + c in OPERATORS
        nxt = _NUM_STEPS[self._num].get(_num_class(c))
        if nxt is None:
            return False
        self._num = nxt
        if nxt in _NUM_ACCEPTING:
            self._accept = len(self._buf) + 1
        return True

    def _begin(self, c: str, out: list[Token]) -> None:
        pos = self._pos
        self._pos += 1
        if is_space(c):
            return
        self._start, self._buf = pos, [c]
        if c in QUOTES:
            self._kind, self._quote, self._escape, self._chars = "str", c, False, []
        elif c in IDENT_START:
            self._kind = "ident"
        elif c in DIGITS or c == ".":
            self._kind, self._num = "num", ("int" if c in DIGITS else "dot")
            self._accept = 1 if c in DIGITS else 0
        elif c in _OP_PREFIXES:
            self._kind = "op"
        elif c in OPERATORS:
            out.append(Token("op", c, pos, c))
        else:
            out.append(Token("bad", c, pos, f"unexpected character {c!r}"))

    def _flush(self, out: list[Token]) -> None:
        kind, buf, start = self._kind, "".join(self._buf), self._start
        self._kind = None
        rest = ""
        if kind == "ident":
            out.append(Token("ident", buf, start, buf))
        elif kind == "op":
            out.append(Token("op", buf, start, _OP_CANON.get(buf, buf)))
        elif self._accept == 0:  # a lone '.'
            out.append(Token("bad", buf[0], start, f"unexpected character {buf[0]!r}"))
            rest = buf[1:]
        else:  # the longest number; what followed it (`1e` of `1ex`) is read again
            num, rest = buf[:self._accept], buf[self._accept:]
            if len(num) > MAX_NUMBER_CHARS:
                out.append(Token("bad", num, start, f"number of {len(num)} characters (at most {MAX_NUMBER_CHARS})"))
            else:
                out.append(Token("num", num, start, int(num) if num.isdigit() else float(num)))
        if rest:
            resume, self._pos = self._pos, start + len(buf) - len(rest)
            for ch in rest:
                self._char(ch, out)
            assert self._pos == resume


def tokenize(text: str) -> list[Token]:
    """All tokens of ``text`` ending with ``eof``; SkillParseError at the first character that is no token."""
    lx = Lexer()
    toks = lx.feed(text) + lx.end()
    for t in toks:
        if t.kind == "bad":
            raise SkillParseError(t.value, t.pos)
    return toks


__all__ = [
    "BOOL_LITERALS", "COMPARISONS", "DIGITS", "ESCAPE", "IDENT_CHARS", "IDENT_START", "MAX_BLOCK_DEPTH",
    "MAX_NESTING", "MAX_NUMBER_CHARS", "MAX_STRING_CHARS", "OPERATORS", "QUOTES", "SKILL_NAME_RE", "VAR_RE",
    "Lexer", "SkillParseError", "Token", "is_control", "is_space", "tokenize",
]
