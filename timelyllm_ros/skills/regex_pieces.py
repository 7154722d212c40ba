"""Regex pieces of a skill-set grammar: integer and float ranges, one argument, any call of a skill set.

Each matches exactly what :meth:`SkillArg.check` accepts (decimal ints without leading zeros, floats on the
declared grid), so :mod:`timelyllm_ros.skills.grammar` composes plans from them without re-checking.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from timelyllm_ros.skills.schema import SkillArg, SkillSet

STR_BODY = "[a-z][a-z0-9_ ]"  # a string argument's characters: lower-case names, as the skill sets declare them


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
    # longest first (a shorter literal would match a prefix of a longer one), then by text: one regex text in
    # every process, whatever the set's hash order
    vals = sorted({f"{lo + 0.05 * i:.2f}".rstrip("0").rstrip(".") for i in range(steps + 1)},
                  key=lambda v: (-len(v), v))
    vals = [("0" if v in ("-0", "") else v) for v in vals]
    return "(?:" + "|".join(re.escape(v) for v in dict.fromkeys(vals)) + ")"


def names_regex(a: SkillArg, names: Sequence[str]) -> str | None:
    """The names this argument accepts, as a quoted alternation (None: none of them fits it)."""
    ok = []
    for n in names:
        try:
            a.check(n, "grammar")
        except ValueError:
            continue
        if re.fullmatch(f"{STR_BODY}*", n):
            ok.append(n)
    if not ok:
        return None
    return "'(?:" + "|".join(re.escape(n) for n in sorted(ok, key=len, reverse=True)) + ")'"


def arg_regex(a: SkillArg, names: Sequence[str] | None = None) -> str | None:
    """Regex of one argument; None when it is ``from_task`` and the task names nothing that fits it."""
    if a.type == "int":
        return int_range_regex(int(a.min if a.min is not None else 0), int(a.max if a.max is not None else 999))
    if a.type == "float":
        return _float_regex(a.min, a.max)
    if a.type == "bool":
        return "(?:True|False)"
    if a.from_task and names is not None:
        return names_regex(a, getattr(names, "objects", names) if a.from_task == "object" else names)
    n = min(int(getattr(a, "max_length", None) or 32), 32)
    if a.min_words >= 2:  # words of up to 12 characters, one space between them
        return rf"'[a-z][a-z0-9_]{{0,11}}(?: [a-z0-9_]{{1,12}}){{{a.min_words - 1},{max(a.min_words - 1, 7)}}}'"
    return f"'{STR_BODY}{{0,{n - 1}}}'"


def call_regex(ss: SkillSet, returns: tuple[str, ...] | None = None, names: Sequence[str] | None = None) -> str:
    """Any call of the skill set (of those returning ``returns``); "" when there is none. Skills with the
    same argument regex share one alternative (``(?:s|iv|g)\\('(?:cat|dog)'\\)``): a task's names appear once."""
    by_args: dict[str, list[str]] = {}
    for s in sorted(ss.skills, key=lambda s: len(s.name), reverse=True):
        if returns is not None and s.returns not in returns:
            continue
        for sig in s.signatures:
            parts = [arg_regex(a, names) for a in sig]
            if any(p is None for p in parts):
                continue  # names an object, and the task names none
            by_args.setdefault(",".join(parts), []).append(re.escape(s.name))  # type: ignore[arg-type]
    alts = [(f"(?:{'|'.join(ns)})" if len(ns) > 1 else ns[0]) + r"\(" + args + r"\)" for args, ns in by_args.items()]
    return "(?:" + "|".join(alts) + ")" if alts else ""


def args_regex(ss: SkillSet, skill: str, names: Sequence[str] | None) -> str:
    """The parenthesised arguments of any call of ``skill`` (``call_regex`` of it less its name); "" when no
    signature of it can be called (it names an object, and the task names none)."""
    alts = []
    for sig in ss[skill].signatures:
        parts = [arg_regex(a, names) for a in sig]
        if all(p is not None for p in parts):
            alts.append(r"\(" + ",".join(parts) + r"\)")  # type: ignore[arg-type]
    return "(?:" + "|".join(alts) + ")" if alts else ""


def rep(x: str, lo: int, hi: int | None) -> str:
    if hi is None:
        return f"(?:{x})" + ("*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}")
    if hi <= 0:
        return ""
    return f"(?:{x}){{{lo},{hi}}}"
