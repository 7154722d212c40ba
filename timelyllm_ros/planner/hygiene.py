"""Input hygiene for text that reaches the planner (tasks, scenes, robot ids).

Pure functions, no ROS: a request field is checked before it is tokenized,
logged or echoed back, and refused with a :class:`ValueError` whose message
names the field, the problem, the character (``U+XXXX`` and its name) and its
0-based position, e.g.::

    task: control character U+001B (ESCAPE) at position 0 is not allowed

Refused are characters that can rewrite a terminal or a log line, or make text
display differently from what the model reads (Trojan-Source style bidi
tricks); ordinary non-ASCII text ("café 猫") is fine.
"""

from __future__ import annotations

import re
import unicodedata

# ISO 6429 names of the C0 and C1 controls (unicodedata.name() has none for them).
_C0_NAMES = (
    "NULL", "START OF HEADING", "START OF TEXT", "END OF TEXT", "END OF TRANSMISSION", "ENQUIRY",
    "ACKNOWLEDGE", "BELL", "BACKSPACE", "CHARACTER TABULATION", "LINE FEED", "LINE TABULATION",
    "FORM FEED", "CARRIAGE RETURN", "SHIFT OUT", "SHIFT IN", "DATA LINK ESCAPE", "DEVICE CONTROL ONE",
    "DEVICE CONTROL TWO", "DEVICE CONTROL THREE", "DEVICE CONTROL FOUR", "NEGATIVE ACKNOWLEDGE",
    "SYNCHRONOUS IDLE", "END OF TRANSMISSION BLOCK", "CANCEL", "END OF MEDIUM", "SUBSTITUTE", "ESCAPE",
    "INFORMATION SEPARATOR FOUR", "INFORMATION SEPARATOR THREE", "INFORMATION SEPARATOR TWO",
    "INFORMATION SEPARATOR ONE",
)
_C1_NAMES = (
    "PADDING CHARACTER", "HIGH OCTET PRESET", "BREAK PERMITTED HERE", "NO BREAK HERE", "INDEX", "NEXT LINE",
    "START OF SELECTED AREA", "END OF SELECTED AREA", "CHARACTER TABULATION SET",
    "CHARACTER TABULATION WITH JUSTIFICATION", "LINE TABULATION SET", "PARTIAL LINE FORWARD",
    "PARTIAL LINE BACKWARD", "REVERSE LINE FEED", "SINGLE SHIFT TWO", "SINGLE SHIFT THREE",
    "DEVICE CONTROL STRING", "PRIVATE USE ONE", "PRIVATE USE TWO", "SET TRANSMIT STATE", "CANCEL CHARACTER",
    "MESSAGE WAITING", "START OF GUARDED AREA", "END OF GUARDED AREA", "START OF STRING",
    "SINGLE GRAPHIC CHARACTER INTRODUCER", "SINGLE CHARACTER INTRODUCER", "CONTROL SEQUENCE INTRODUCER",
    "STRING TERMINATOR", "OPERATING SYSTEM COMMAND", "PRIVACY MESSAGE", "APPLICATION PROGRAM COMMAND",
)

# Bidi embeddings, overrides, isolates and marks.
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
LINE_SEPARATORS = frozenset("\u2028\u2029")

# Everything check_text refuses, as one character class (lone surrogates included); an id (single_line) refuses
# TAB and LF too: a task_id with a newline forges a second line in every log that names it.
_REFUSED = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]"
)
_REFUSED_IN_IDS = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]"
)


def char_name(ch: str) -> str:
    """A readable name of one character: its Unicode name, or the ISO 6429
    name of a control, or ``SURROGATE`` / ``UNNAMED``."""
    cp = ord(ch)
    if cp < 0x20:
        return _C0_NAMES[cp]
    if cp == 0x7F:
        return "DELETE"
    if 0x80 <= cp <= 0x9F:
        return _C1_NAMES[cp - 0x80]
    if 0xD800 <= cp <= 0xDFFF:
        return "SURROGATE"
    return unicodedata.name(ch, "UNNAMED")


def _kind(ch: str) -> str:
    cp = ord(ch)
    if cp <= 0x9F:
        return "control character"
    if ch in BIDI_CONTROLS:
        return "bidirectional formatting character"
    if ch in LINE_SEPARATORS:
        return "line/paragraph separator"
    return "lone surrogate"


def check_text(field: str, text: str, *, max_chars: int | None = None, single_line: bool = False) -> None:
    """Raise ``ValueError`` unless ``text`` is acceptable planner input.

    Refused (the message names the first one, with its 0-based position):

    * C0 controls U+0000..U+001F except TAB (U+0009) and LF (U+000A). CR
      (U+000D) is refused too: a lone CR rewrites a log or terminal line; send
      newlines as LF;
    * DEL (U+007F) and the C1 controls U+0080..U+009F;
    * bidi embeddings, overrides, isolates and marks (U+202A..U+202E,
      U+2066..U+2069, U+200E, U+200F, U+061C);
    * LINE SEPARATOR and PARAGRAPH SEPARATOR (U+2028, U+2029);
    * lone surrogates (U+D800..U+DFFF): text that cannot be encoded as UTF-8.

    ``max_chars``: also refuse text longer than this many characters (code points). ``single_line`` (ids):
    TAB and LF are refused too.
    """
    if not isinstance(text, str):
        raise TypeError(f"{field}: expected a string, got {type(text).__name__}")
    if max_chars is not None and len(text) > max_chars:
        raise ValueError(f"{field}: {len(text)} characters, more than max_chars={max_chars}")
    m = (_REFUSED_IN_IDS if single_line else _REFUSED).search(text)
    if m is None:
        return
    ch, pos = m.group(), m.start()
    msg = f"{field}: {_kind(ch)} U+{ord(ch):04X} ({char_name(ch)}) at position {pos} is not allowed"
    if 0xD800 <= ord(ch) <= 0xDFFF:
        msg += " (the text is not valid UTF-8)"
    raise ValueError(msg)


def check_goal_fields(robot_id: str, task_id: str, task: str) -> None:
    """A goal's text fields: ids on one line of at most 256 characters; the task any length (its tokens are
    counted later). ValueError naming the field and the character."""
    check_text("robot_id", robot_id, max_chars=256, single_line=True)
    check_text("task_id", task_id, max_chars=256, single_line=True)
    check_text("task", task)


def fits_in_tokens(text: str, max_tokens: int | None) -> bool:
    """True when ``text`` is within ``max_tokens`` tokens of any subword tokenizer without tokenizing it: an ASCII
    text has at most one token per character, plus a start-of-text token and a leading-space marker. Taking a
    goal in tokenized its task once to count it and again to render its prompt. False: count it."""
    return max_tokens is None or (text.isascii() and len(text) + 2 <= max_tokens)


def check_token_count(field: str, n_tokens: int, max_tokens: int | None, *, limit_name: str | None = None) -> None:
    """Raise ``ValueError`` if ``n_tokens`` exceeds ``max_tokens`` (None: no limit), e.g.
    ``task: 900 tokens, more than max_task_tokens=512``. ``limit_name`` names the
    limit in the message (default ``max_<field>_tokens``)."""
    if max_tokens is not None and n_tokens > max_tokens:
        raise ValueError(f"{field}: {n_tokens} tokens, more than {limit_name or f'max_{field}_tokens'}={max_tokens}")
