"""Incremental stop checkers: where a generation is cut into segments (design §5).

The engine feeds each new token's decoded text to a :class:`StopChecker` and
suspends the generation when ``feed`` returns True. A checker must therefore
decide from the text seen so far only, whatever way the tokenizer happened to
split it (``mf`` ``(`` ``50`` ``);`` or ``('`` ``cat`` ``')`` ...), so all
checkers here scan characters, never engine tokens (the skill-language
checkers through the language's own incremental lexer, one character at a
time), and cut only when the boundary
character is the last non-whitespace character written: a token like ``;m``
that runs past a boundary simply extends the segment to the next one.

Invariant of every checker: each text returned by :meth:`cut` contains at
least one complete skill call (chatbot: a sentence); what is left at the end
of the generation is handed out by :attr:`pending_text`. Concatenating the cut
segments and the remainder gives back exactly the generated text.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Iterable

from timelyllm_ros.skills.lexer import SKILL_NAME_RE, Lexer, Token, is_space
from timelyllm_ros.skills.schema import SkillSet
from timelyllm_ros.skills.skill_files import load_skill_set


class StopChecker(abc.ABC):
    """Incremental, per-generation segment detector (design §5).

    It is fed the decoded text of each new token, one token at a time, and
    keeps whatever grammar state it needs across segments (open
    conditionals, loops, ...).
    """

    @abc.abstractmethod
    def feed(self, piece: str) -> bool:
        """Append one token's text; True if the current segment is complete."""

    @abc.abstractmethod
    def cut(self) -> str:
        """Close the current segment and return its text."""

    @property
    @abc.abstractmethod
    def pending_text(self) -> str:
        """Text of the segment being written (not yet complete)."""


class _CallScanner(StopChecker):
    """Scanner shared by the skill-language checkers.

    Characters go one at a time through the skill language's own
    :class:`~timelyllm_ros.skills.lexer.Lexer` (so identifiers, numbers,
    strings and escapes are exactly the parser's); this class only follows
    the tokens: parentheses (and whether each one opened a call), MiniSpec
    conditions ``?...{`` and statement starts. The lexer and this state survive
    a cut, so a forced cut in the middle of a statement does not desync them.
    """

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._lexer = Lexer()
        self._parens: list[bool] = []  # one per open '(': True if it opened a call
        self._prev_ident = False  # the previous token was an identifier
        self._in_cond = False  # between '?' and its '{'
        self._cond_has_call = False
        self._stmt_start = True  # next token starts a statement
        self._stmt_is_call = False  # current statement starts with a skill name
        self._has_call = False  # the pending segment holds a complete call
        self._cut_ok = False  # last significant char ended a segment
        self.brace_depth = 0  # open blocks over the whole generation

    # -- StopChecker --------------------------------------------------------
    def feed(self, piece: str) -> bool:
        self._parts.append(piece)
        for c in piece:
            toks = self._lexer.feed(c)
            if self._lexer.in_string or not is_space(c):
                self._cut_ok = False  # only a terminator as the last significant char allows a cut
            for t in toks:
                self._token(t)
        return self._cut_ok

    def cut(self) -> str:
        text = "".join(self._parts)
        self._parts = []
        self._has_call = False
        self._cut_ok = False
        return text

    @property
    def pending_text(self) -> str:
        return "".join(self._parts)

    # -- scanning -------------------------------------------------------------
    def _token(self, t: Token) -> None:
        if self._stmt_start:
            self._stmt_start = False
            # `_1=` assigns; `?`, `->`, `8{` are not calls either
            self._stmt_is_call = t.kind == "ident" and SKILL_NAME_RE.fullmatch(t.text) is not None
        was_ident, self._prev_ident = self._prev_ident, t.kind == "ident"
        if t.kind != "op":
            return
        if t.value == "(":
            self._parens.append(was_ident)
        elif t.value == ")":
            if self._parens and self._parens.pop():
                self._has_call = True
                if self._in_cond:
                    self._cond_has_call = True
                elif not self._parens and self._stmt_is_call:
                    self._on_terminator(")")
        elif not self._parens:
            self._structural(t.value)

    def _structural(self, c: str) -> None:
        """A character outside parentheses and strings."""
        if c == ";":
            if not self._in_cond:
                self._on_terminator(";")
        elif c == "?":
            self._in_cond, self._cond_has_call = True, False
        elif c == "{":
            self.brace_depth += 1
            self._on_terminator("{")
        elif c == "}":
            self.brace_depth = max(0, self.brace_depth - 1)
            self._in_cond = False
            self._on_terminator("}")

    def _on_terminator(self, c: str) -> None:
        raise NotImplementedError


class MiniSpecStopChecker(_CallScanner):
    """MiniSpec (drone): design §5.

    A segment ends when the last character written completes a statement —
    ``;``, ``}``, the ``)`` of a call statement, or the ``{`` of a conditional
    whose condition contains a skill — and the segment holds a complete
    skill call. Skill-less statements (``}``, ``;``, ``8{``, ``?_1>0.6{``) are
    merged into the next segment. Segments of ``tc(30);?s('cat')==True{g('cat')};``:
    ``tc(30);``, ``?s('cat')==True{``, ``g('cat')``, and the remainder ``};``.
    """

    def _on_terminator(self, c: str) -> None:
        self._stmt_start = True
        if c == "{":
            in_cond, self._in_cond = self._in_cond, False
            self._cut_ok = in_cond and self._cond_has_call
        else:
            self._cut_ok = self._has_call


class SemicolonStopChecker(_CallScanner):
    """Robot-arm plans: a segment ends at each ``;`` after a complete call."""

    def _on_terminator(self, c: str) -> None:
        self._stmt_start = True
        if c == "{":
            self._in_cond = False
        self._cut_ok = c == ";" and self._has_call


_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s*$")


class SentenceStopChecker(StopChecker):
    """Chatbot: a segment ends at ``.``, ``!`` or ``?`` (closing quotes and
    brackets may follow) once it has more than ``min_tokens`` tokens (feed
    calls), so that abbreviations and short openers do not make tiny
    segments."""

    def __init__(self, min_tokens: int = 10) -> None:
        self.min_tokens = min_tokens
        self._parts: list[str] = []

    def feed(self, piece: str) -> bool:
        self._parts.append(piece)
        if len(self._parts) <= self.min_tokens:
            return False
        tail = "".join(self._parts[-4:])  # the end mark and what may follow it
        return bool(_SENTENCE_END.search(tail)) and bool(tail.strip())

    def cut(self) -> str:
        text = "".join(self._parts)
        self._parts = []
        return text

    @property
    def pending_text(self) -> str:
        return "".join(self._parts)


def make_stop_checker(skillset: SkillSet | str) -> StopChecker:
    """A fresh checker for one generation of a robot with this skill set."""
    ss = load_skill_set(skillset) if isinstance(skillset, str) else skillset
    if ss.segmenter == "minispec":
        return MiniSpecStopChecker()
    if ss.segmenter == "semicolon":
        return SemicolonStopChecker()
    if ss.segmenter == "sentence":
        return SentenceStopChecker(ss.min_segment_tokens)
    raise ValueError(f"skill set {ss.id!r}: unknown segmenter {ss.segmenter!r}")


def split_segments(skillset: SkillSet | str, pieces: Iterable[str]) -> list[str]:
    """Drive a fresh checker over token pieces as the engine would; returns
    the segments followed by the non-empty remainder (the text after the last
    cut), so ``"".join(result) == "".join(pieces)``."""
    checker = make_stop_checker(skillset)
    out: list[str] = []
    for p in pieces:
        if checker.feed(p):
            out.append(checker.cut())
    if checker.pending_text:
        out.append(checker.pending_text)
    return out
