"""Regexes of plans made of ``plan_structure`` units (the arm's move_to / pick / move_to / place per object):
each unit's calls with the task's names tied to its ``$variables`` (:func:`unit_regex`), and units whose names
follow the task's order of mention (:class:`Ordered`). skills/grammar.py builds a task's grammar from these.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

from timelyllm_ros.skills.regex_pieces import arg_regex, names_regex
from timelyllm_ros.skills.schema import SkillArg, SkillSet

_MAX_ASSIGNMENTS = 400  # name assignments a unit enumerates before its variables are left untied


def unit_regex(ss: SkillSet, unit: Sequence[tuple[str, str | None]], names: Sequence[str] | None,
                bound: str | None = None) -> str:
    """The calls of ``unit``. With a task's names, every assignment of distinct names to its ``$variables``
    (an object is not put on itself), the first variable only ``bound`` when given; "" when no assignment
    fits. Without names (or with too many assignments), each call takes any name or string."""
    variables = list(dict.fromkeys(v for _, v in unit if v is not None))
    args = {s: name_arg(ss, s) for s, v in unit if v is not None}
    if names is not None and variables:
        choices = [[bound] if (bound is not None and i == 0 and unit[0][1] == v) else list(names)
                   for i, v in enumerate(variables)]
        n = 1
        for c in choices:
            n *= len(c)
        if n <= _MAX_ASSIGNMENTS:
            alts = []
            for combo in itertools.product(*choices):
                if len(set(combo)) < len(combo):
                    continue
                val = dict(zip(variables, combo, strict=True))
                if all(args[s] is not None and names_regex(args[s], [val[v]]) for s, v in unit if v is not None):
                    alts.append("".join(re.escape(s) + (f"\\('{re.escape(val[v])}'\\);" if v else r"\(\);")
                                        for s, v in unit))
            return "(?:" + "|".join(alts) + ")" if alts else ""
    return "".join(re.escape(s) + (r"\(" + (arg_regex(args[s], names) or "''") + r"\);" if v else r"\(\);")
                   for s, v in unit)


_MAX_ORDERED_LEN = 60_000  # characters of an ordered-units regex before the order is given up (too many names)


class Ordered:
    """Units whose names follow the task's order of mention (``plan_structure.order: task``): a unit's
    variables take consecutive mentions (the object, then where it goes: ``pick up the apple and drop it
    near the carrot``), each unit after the previous one's (mentions in between may be skipped), names
    distinct within a unit; ``exact``: as many units as the task has (:func:`task_units`). One regex,
    memoised by (mention, units left), so its size grows with mentions x units, not with the plans."""

    def __init__(self, ss: SkillSet, mentions: Sequence[str], exact: bool) -> None:
        self.ss, self.m, self.exact = ss, list(mentions), exact
        self.runs: list[tuple[str | None, list[str]]] = []  # (variable, its calls) in unit order
        for skill, var in ss.plan_structure.unit:
            if self.runs and var is not None and self.runs[-1][0] == var:
                self.runs[-1][1].append(skill)
            else:
                self.runs.append((var, [skill]))
        self.var_runs = [i for i, (v, _) in enumerate(self.runs) if v is not None]
        self._memo: dict[tuple[int, int, bool], str] = {}
        self._size = 0

    def _run_str(self, r: int, name: str | None, first: int = 0) -> str:
        calls = self.runs[r][1][first:]
        if name is None:
            return "".join(re.escape(c) + r"\(\);" for c in calls)
        return "".join(f"{re.escape(c)}\\('{re.escape(name)}'\\);" for c in calls)

    def _fits(self, r: int, name: str) -> bool:
        return all((a := name_arg(self.ss, c)) is not None and names_regex(a, [name]) for c in self.runs[r][1])

    def _unit(self, from_run: int, first_call: int, names: dict[int, str]) -> str | None:
        if len(set(names.values())) < len(names) or not all(self._fits(r, n) for r, n in names.items()):
            return None
        return "".join(self._run_str(r, names.get(r), first_call if r == from_run else 0)
                       for r in range(from_run, len(self.runs)))

    def whole(self, start: int, k: int, optional: bool = True) -> str:
        """Whole units with names mentioned after ``start``: exactly ``k`` if ``exact``, else 0 (1 if not
        ``optional``) to ``k``. "" if there is none."""
        if k <= 0 or self._size > _MAX_ORDERED_LEN:
            return ""
        key = (start, k, optional)
        if key not in self._memo:
            n = len(self.var_runs)
            alts = []
            for a in range(start + 1, len(self.m) - n + 1):
                body = self._unit(0, 0, {r: self.m[a + j] for j, r in enumerate(self.var_runs)})
                if body is None:
                    continue
                more = self.whole(a + n - 1, k - 1)
                if self.exact and k > 1 and not more:
                    continue
                alts.append(body + more)
            self._memo[key] = "(?:" + "|".join(alts) + ")" if alts else ""
            self._size += len(self._memo[key])
        r = self._memo[key] if self._size <= _MAX_ORDERED_LEN else ""
        return f"{r}?" if r and optional and not self.exact else r

    def continuation(self, calls: list, units_left: int) -> str | None:
        """The rest after ``calls`` (a plan so far that follows the units); None if its names do not follow
        the task's order (the plan so far was not made under this grammar)."""
        n_unit = len(self.ss.plan_structure.unit)
        done, pos = divmod(len(calls), n_unit)
        call_run = [r for r, (_, cs) in enumerate(self.runs) for _ in cs]
        idx = -1
        bound: dict[int, str] = {}
        for k, c in enumerate(calls):
            r = call_run[k % n_unit]
            if self.runs[r][0] is None or (k % n_unit and call_run[(k - 1) % n_unit] == r):
                continue  # no name, or the run's name was read at its first call
            name = c.args[0] if c.args and isinstance(c.args[0], str) else None
            first_var = r == self.var_runs[0]
            nxt = next((j for j in range(idx + 1, len(self.m)) if self.m[j] == name), -1) if first_var else idx + 1
            if nxt < 0 or nxt >= len(self.m) or self.m[nxt] != name:
                return None
            idx = nxt
            if k // n_unit == done:
                bound[r] = name
        if pos == 0:
            return self.whole(idx, units_left)
        r = call_run[pos]
        first = pos - call_run.index(r)
        if first == 0:
            bound.pop(r, None)
        todo = [v for v in self.var_runs if v >= r and v not in bound]
        names = dict(bound) | {v: self.m[idx + 1 + j] for j, v in enumerate(todo) if idx + 1 + j < len(self.m)}
        if len(names) < len([v for v in self.var_runs if v >= r]) + len([v for v in bound if v < r]):
            return None
        body = self._unit(r, first, {v: n for v, n in names.items() if v >= r})
        if body is None:
            return None
        more = self.whole(idx + len(todo), units_left - 1)
        if self.exact and units_left > 1 and not more:
            return None
        return body + more


def name_arg(ss: SkillSet, skill: str) -> SkillArg | None:
    """The argument of the skill's one-string-argument form (``move_to('tray')``, not ``move_to(x, y)``)."""
    return next((sig[0] for sig in ss[skill].signatures if len(sig) == 1 and sig[0].type == "str"), None)
