"""What a task's sentence adds to its MiniSpec grammar (skills/grammar.py builds the regexes from these).

The task's skill set narrows what a plan may call and with which amounts (:func:`task_skill_set`); a ``[Q]``
question gets an answer block per object and outcome (:func:`answers_blocks`); an emergency's given plan is
resumed by calls in the bounds its report states (:func:`given_call`); a count's loop repeats only calls that
make sense to repeat (:func:`repeatable`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

from timelyllm_ros.skills import task_analysis as ta
from timelyllm_ros.skills.regex_pieces import STR_BODY, call_regex, int_range_regex, rep
from timelyllm_ros.skills.schema import SkillArg, SkillSet
from timelyllm_ros.skills.task_names import TaskNames, asked_skill, leading_skills, move_phrases


def task_skill_set(ss: SkillSet, task: str, names: TaskNames | None) -> SkillSet:
    """The skills and bounds of a MiniSpec plan for this task: a normal task that asks for no movement
    (:func:`task_analysis.asks_to_move`) gets no movement by an amount (``md(100)`` before the asked-for photo;
    going to a named object stays); a normal task gets at most as many statements as it has things to do: its
    leading move or each amount it states (``80 cm``, ``30 degrees``), two per object it asks about (one per
    outcome of a test), one for the skill it asks for and its counts, so a plan that has done them ends rather
    than saying them again."""
    if ss.grammar != "minispec":
        return ss
    ps = ss.plan_structure
    if ta.tag(task) != "E" and not ta.asks_to_move(task, move_phrases(ss)):
        ss = only(ss, [sk.name for sk in ss.skills if not (sk.kind == "movement" and numeric(sk))])
    if ta.tag(task) != "E":
        ss = stated_amounts(ss, ta.amounts(task))
    if ta.tag(task) != "E" and ps.max_statements is not None and names is not None:
        moves = max(len(leading_skills(ss, task)) > 0, sum(map(len, ta.amounts(task).values())))
        things = moves + 2 * len(names.objects) + (asked_skill(ss, task) is not None)
        cap = max(2, min(ps.max_statements, things + sum(ta.counts(task))))
        ss = dataclasses.replace(ss, plan_structure=dataclasses.replace(ps, max_statements=cap))
    return ss


MAX_ANSWERED = 4  # objects of a question whose blocks get answers of their own (the regex grows with them)


@dataclass(frozen=True)
class Answer:
    """One block of a ``[Q]`` question's plan: a test of one object and its answer on one outcome."""

    opener: str  # ?iv('keys')==True{
    log: str  # the answer's log call
    other: str  # a call the block may add after it (not a log)

    @property
    def whole(self) -> str:
        return self.opener + self.body(0) + r"\};?"

    def body(self, written: int) -> str:
        """The block's calls left after ``written`` of them: the answer, then at most one other call."""
        more = rep(f"{self.other};", 0, 1) if self.other else ""
        return (f"{self.log};" + more) if written == 0 else (more if written == 1 else "")


def answers_blocks(ss: SkillSet, names: Sequence[str] | None, answers: tuple[str, ...],
             need: str | None) -> tuple[Answer, ...]:
    """A ``[Q]`` question about a few objects is answered object by object, in the task's order: a test of the
    object on True, then on False, each with its answer, which names that object and no other, says it is there
    on True and that it is not (``no wallet ...``) on False. So every outcome gets one answer, none is said
    twice and none is said before looking. () where the rule does not apply (more objects than
    :data:`MAX_ANSWERED`, no log skill, or the task asks for another skill)."""
    logs = [sk for sk in ss.skills if sk.op == "log" and len(sk.args) == 1 and sk.args[0].type == "str"]
    if not answers or len(answers) > MAX_ANSWERED or not logs or (need is not None and need != logs[0].name):
        return ()
    log = logs[0]
    n_max = min(int(log.args[0].max_length or 32), 32)
    out = []
    for n in answers:
        said = re.escape(n.replace("_", " "))
        rest = n_max - len(n) - 4  # "'no " and the name within the free strings' length
        test = call_regex(ss, ("bool",), [n])
        if rest < 2 or not re.fullmatch(f"{STR_BODY}*", n.replace("_", " ")) or not test:
            return ()
        other = call_regex(only(ss, [sk.name for sk in ss.skills if sk.op != "log"]), names=[n])
        yes = (f"(?:(?:the|a|an) )?{said} [a-z0-9_][a-z0-9_ ]{{0,{rest - 2}}}" if log.args[0].min_words >= 2
               else f"(?:(?:the|a|an) )?{said}[a-z0-9_ ]{{0,{rest}}}")
        for outcome, text in (("True", yes), ("False", f"no {said}[a-z0-9_ ]{{0,{rest}}}")):
            out.append(Answer(r"\?" + test + f"=={outcome}" + r"\{", re.escape(log.name) + rf"\('{text}'\)",
                               other))
    return tuple(out)


def stated_amounts(ss: SkillSet, amounts: dict[str, tuple[int, ...]]) -> SkillSet:
    """A task that states amounts in a unit (``go up 30 cm``, ``turn 45 degrees``) gets them, not others, in
    the arguments of that unit: from its least to its largest stated amount, within the skill's own bounds.
    Units the task does not state stay free."""
    if not amounts:
        return ss

    def arg(a: SkillArg) -> SkillArg:
        vals = amounts.get(a.unit)
        if a.type != "int" or not vals:
            return a
        lo, hi = max(min(vals), a.min if a.min is not None else min(vals)), min(max(vals), a.max if a.max
                                                                                  is not None else max(vals))
        return dataclasses.replace(a, min=lo, max=hi) if lo <= hi else a

    skills = tuple(dataclasses.replace(sk, signatures=tuple(tuple(arg(a) for a in sig) for sig in sk.signatures))
                   for sk in ss.skills)
    return dataclasses.replace(ss, skills=skills, _by_name={})


_OPPOSITE = {"forward": "back", "back": "forward", "left": "right", "right": "left", "up": "down", "down": "up"}


def opposite(ss: SkillSet, a: str, b: str) -> bool:
    """Skills ``a`` and ``b`` move the same way in opposite directions (``md`` and ``mu``)."""
    sa, sb = ss.get(a), ss.get(b)
    if sa is None or sb is None or sa.op != sb.op:
        return False
    da, db = sa.op_args.get("direction"), sb.op_args.get("direction")
    return da is not None and _OPPOSITE.get(str(da)) == db


def given_call(ss: SkillSet, skill: str, least: int, most: int) -> str:
    """The regex of one call of a plan an emergency was given (``ml`` from 50 to 100 cm: ``ml(50)`` ... ``ml(100)``),
    "" where the skill set has no such skill with one whole-number argument."""
    sk = ss.get(skill)
    sig = next((s for s in sk.signatures if len(s) == 1 and s[0].type == "int"), None) if sk else None
    if sig is None:
        return ""
    a = sig[0]
    lo, hi = max(least, int(a.min if a.min is not None else least)), min(most, int(a.max if a.max is not None
                                                                                    else most))
    return re.escape(sk.name) + r"\(" + int_range_regex(lo, hi) + r"\)" if lo <= hi else ""


def repeatable(sk) -> bool:
    """A call a count's loop may repeat beside the counted one: a move, turn or wait by an amount, or an action
    with no arguments that returns nothing (a photo); not a call on a name, a log, a question or a re-plan."""
    if sk.kind in ("movement", "control"):
        return numeric(sk)
    return sk.kind == "perception" and all(not sig for sig in sk.signatures) and not sk.returns


def numeric(sk) -> bool:
    return any(a.type in ("int", "float") for sig in sk.signatures for a in sig)


def only(ss: SkillSet, skills: Sequence[str]) -> SkillSet:
    return dataclasses.replace(ss, skills=tuple(sk for sk in ss.skills if sk.name in skills))
