"""Plans are bounded: the worst-case cost of statements fed one by one (loops unrolled, every branch taken, every
call at its model's longest), and the skill set's bounds on it. The parser counts as it parses
(:mod:`timelyllm_ros.skills.minispec`, which re-exports these names).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from timelyllm_ros.skills.call_time import call_estimate
from timelyllm_ros.skills.plan_ast import EndBlock, If, Loop, SkillCall, Statement, statement_calls

if TYPE_CHECKING:
    from timelyllm_ros.skills.schema import SkillSet

@dataclass(frozen=True)
class Cost:
    """What running statements costs, loops unrolled: execution time by the model and iterations (skill
    executions plus loop passes: an empty loop body still costs its passes)."""

    min_s: float = 0.0
    max_s: float = 0.0
    iterations: int = 0

    def __add__(self, o: Cost) -> Cost:
        return Cost(self.min_s + o.min_s, self.max_s + o.max_s, self.iterations + o.iterations)

    def times(self, k: int) -> Cost:
        return Cost(self.min_s * k, self.max_s * k, self.iterations * k)


CallCost = Callable[[SkillCall], tuple[float, float]]  # one call's (min, max) seconds
_PASS = Cost(iterations=1)


class CostCounter:
    """Cost of a plan fed statement by statement (blocks may span segments), by the interpreter's rules:
    a loop runs its body once as it arrives and count-1 more times at its ``}``; every call runs once per pass
    (worst case: every branch taken, no early return).

    :meth:`feed` returns what a statement costs when the robot runs it (a loop's ``}``: the replays);
    :attr:`total` is the plan so far with its open blocks closed, which never shrinks as text is added: a plan
    prefix over a bound can only end over it.
    """

    def __init__(self, call_cost: CallCost) -> None:
        self.call_cost = call_cost
        self._done = Cost()  # statements outside open blocks
        self._frames: list[tuple[int, Cost]] = []  # open blocks: (loop count, 0 for a conditional; body so far)

    def copy(self) -> CostCounter:
        c = CostCounter(self.call_cost)
        c._done, c._frames = self._done, list(self._frames)
        return c

    def calls(self, s: Statement) -> Cost:
        lo = hi = 0.0
        calls = statement_calls(s)
        for c in calls:
            a, b = self.call_cost(c)
            lo, hi = lo + a, hi + b
        return Cost(lo, hi, len(calls))

    def feed(self, s: Statement) -> Cost:
        if isinstance(s, EndBlock):
            if not self._frames:  # closes a block opened before this counter's first statement: kind unknown
                return Cost()
            count, body = self._frames.pop()
            self._add(_closed(count, body))
            return (body + _PASS).times(count - 1) if count else Cost()
        now = self.calls(s)
        if isinstance(s, Loop):
            self._frames.append((s.count, now))
            return now + _PASS
        if isinstance(s, If):
            self._frames.append((0, now))  # its condition is evaluated again on every pass of an outer loop
            return now
        self._add(now)
        return now

    def _add(self, c: Cost) -> None:
        if self._frames:
            count, body = self._frames[-1]
            self._frames[-1] = (count, body + c)
        else:
            self._done = self._done + c

    @property
    def total(self) -> Cost:
        acc = Cost()
        for count, body in reversed(self._frames):
            acc = _closed(count, body + acc)
        return self._done + acc


def _closed(count: int, body: Cost) -> Cost:
    return (body + _PASS).times(count) if count else body


def bound_error(ss: SkillSet, cost: Cost) -> str | None:
    """Why a plan of this worst-case cost is refused (naming the bound and the value), or None."""
    if cost.max_s > ss.max_plan_exec_s:
        return (f"plan exceeds max_plan_exec_s = {ss.max_plan_exec_s:g} s: it may run {cost.max_s:.1f} s "
                "(loops unrolled, every call at its longest)")
    if cost.iterations > ss.max_plan_iterations:
        return (f"plan exceeds max_plan_iterations = {ss.max_plan_iterations}: it may run {cost.iterations} "
                "skill executions and loop passes (loops unrolled)")
    return None


def model_cost(ss: SkillSet) -> CallCost:
    """The skill set's execution-time model (YAML, nothing learned) as a call cost: what bounds are checked with."""
    def cost(call: SkillCall) -> tuple[float, float]:
        e = call_estimate(ss[call.name], call)
        return e.min_s, e.max_s

    return cost
