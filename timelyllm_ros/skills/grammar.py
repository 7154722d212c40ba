"""Regexes for constrained decoding to a skill set (vLLM structured outputs).

Built from the skill set (skills/*.yaml), so every constrained plan uses only
known skills with arguments of the right type inside their bounds. The
regexes are a subset of what the language front end accepts up to the plan
bounds (every string they match is a valid plan, :meth:`SkillSet.validate_plan`,
unless it runs longer than ``max_plan_exec_s`` or ``max_plan_iterations``: a
regex cannot add up execution times; checked by hypothesis in
test/test_minispec.py):

* ``calls`` (arm): ``(CALL;)+``
* ``minispec`` (drone): statements ``CALL;`` and one level of conditionals
  ``?BOOLCALL==True{(CALL;)+};?`` (a regex cannot count nested braces).

A suspended generation is resubmitted as a new vLLM request, whose grammar
starts from scratch, so :func:`continuation_regex` builds the regex for the
state the plan so far left off in (inside an open block, right after a call
cut at its ``)``).
"""

from __future__ import annotations

import re

from timelyllm_ros.skills.minispec import Lexer
from timelyllm_ros.skills.schema import SkillArg, SkillSet

_STR_BODY = "[a-z][a-z0-9_ ]"


def int_range_regex(lo: int, hi: int) -> str:
    """Regex matching exactly the decimal integers lo..hi (no leading zeros)."""
    if lo > hi:
        raise ValueError(f"empty range {lo}..{hi}")
    if lo < 0:
        parts = []
        if hi >= 0:
            parts.append(int_range_regex(0, hi))
        parts.append("-(?:" + int_range_regex(max(1, -hi) if hi < 0 else 1, -lo) + ")")
        return "(?:" + "|".join(parts) + ")"
    alts = []
    for n in range(len(str(lo)), len(str(hi)) + 1):
        a, b = max(lo, 10 ** (n - 1) if n > 1 else 0), min(hi, 10**n - 1)
        if a <= b:
            alts.append(_same_len(str(a), str(b)))
    return "(?:" + "|".join(alts) + ")"


def _same_len(a: str, b: str) -> str:
    if a == b:
        return a
    if len(a) == 1:
        return f"[{a}-{b}]"
    if a[0] == b[0]:
        return a[0] + "(?:" + _same_len(a[1:], b[1:]) + ")"
    n = len(a) - 1
    parts = [a[0] + "(?:" + _same_len(a[1:], "9" * n) + ")"]
    if int(a[0]) + 1 <= int(b[0]) - 1:
        parts.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}][0-9]{{{n}}}")
    parts.append(b[0] + "(?:" + _same_len("0" * n, b[1:]) + ")")
    return "(?:" + "|".join(parts) + ")"


def _float_regex(lo: float | None, hi: float | None) -> str:
    lo = 0.0 if lo is None else lo
    hi = 999.0 if hi is None else hi
    if lo >= 0 and float(lo).is_integer() and float(hi).is_integer():
        lo_i, hi_i = int(lo), int(hi)
        frac = r"(?:\.[0-9]{1,2})?"
        if hi_i > lo_i:
            return f"(?:{int_range_regex(lo_i, hi_i - 1)}{frac}|{hi_i}(?:\\.0)?)"
        return f"{hi_i}(?:\\.0)?"
    # Non-integer bounds (arm coordinates): enumerate a 0.05 grid, exact and small.
    steps = round((hi - lo) / 0.05)
    vals = sorted({f"{lo + 0.05 * i:.2f}".rstrip("0").rstrip(".") for i in range(steps + 1)}, key=len, reverse=True)
    vals = [("0" if v in ("-0", "") else v) for v in vals]
    return "(?:" + "|".join(re.escape(v) for v in dict.fromkeys(vals)) + ")"


def arg_regex(a: SkillArg) -> str:
    if a.type == "int":
        return int_range_regex(int(a.min if a.min is not None else 0), int(a.max if a.max is not None else 999))
    if a.type == "float":
        return _float_regex(a.min, a.max)
    if a.type == "bool":
        return "(?:True|False)"
    n = min(int(getattr(a, "max_length", None) or 32), 32)
    return f"'{_STR_BODY}{{0,{n - 1}}}'"


def call_regex(ss: SkillSet, returns: tuple[str, ...] | None = None) -> str:
    alts = []
    for s in sorted(ss.skills, key=lambda s: len(s.name), reverse=True):
        if returns is not None and s.returns not in returns:
            continue
        for sig in s.signatures:
            args = ",".join(arg_regex(a) for a in sig)
            alts.append(re.escape(s.name) + r"\(" + args + r"\)")
    return "(?:" + "|".join(alts) + ")"


_CACHE: dict[tuple[str, int], tuple[str, str, str]] = {}


def _parts(ss: SkillSet) -> tuple[str, str, str]:
    key = (ss.id, id(ss))
    if key not in _CACHE:
        _CACHE[key] = _build(ss)
    return _CACHE[key]


def _build(ss: SkillSet) -> tuple[str, str, str]:
    call = call_regex(ss)
    if ss.grammar != "minispec":
        return call, f"(?:{call};)+", ""
    cond = r"\?" + call_regex(ss, ("bool",)) + r"==(?:True|False)\{"
    top = f"(?:{call};|{cond}(?:{call};)+\\}};?)+"
    return call, top, cond


def plan_regex(ss: SkillSet) -> str | None:
    """Regex for a whole plan from its start (None: prose, unconstrained)."""
    if ss.grammar == "text":
        return None
    return _parts(ss)[1]


def continuation_regex(ss: SkillSet, plan_so_far: str) -> str | None:
    """Regex for the rest of a plan whose text so far is ``plan_so_far``."""
    if ss.grammar == "text":
        return None
    call, top, _ = _parts(ss)
    done = plan_so_far.rstrip()
    if not done:
        return top
    lead = ";?" if done.endswith(")") else ""  # cut at a call's ')': its ';' comes next
    depth = _open_blocks(done)
    if depth > 0 and ss.grammar == "minispec":
        return f"{lead}(?:{call};)*\\}};?(?:{top})?"
    return f"{lead}(?:{top})?"


def _open_blocks(text: str) -> int:
    """Blocks left open, by the language's lexer (a brace in a string is no block)."""
    lx = Lexer()
    depth = 0
    for t in lx.feed(text) + lx.end():
        if t.kind == "op" and t.value in ("{", "}"):
            depth += 1 if t.value == "{" else -1
    return depth
