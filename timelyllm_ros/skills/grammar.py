"""Regexes for constrained decoding to a skill set (vLLM structured outputs).

Built from the skill set (skills/*.yaml), so every constrained plan uses only known skills with arguments of
the right type inside their bounds. The regexes are a subset of what the language front end accepts up to
the plan bounds (every string they match is a valid plan, :meth:`SkillSet.validate_plan`, unless it runs
longer than ``max_plan_exec_s`` or ``max_plan_iterations``: a regex cannot add up execution times; checked by
hypothesis in test/test_minispec.py and test/test_grammar.py):

* ``calls`` (arm): ``(CALL;)+``;
* ``minispec`` (drone): statements ``CALL;`` and one level of conditionals ``?BOOLCALL==True{(CALL;)+};?``
  (a regex cannot count nested braces).

With a task, the grammar is that task's: a string argument declared ``from_task`` (an
object or a place) takes only a name that the task text or its scene uses, so a small model can neither
misname the object (``iv('keyboard')`` for keys) nor turn a hazard into a skill. A skill set's
``plan_structure`` adds the shape of its plans: ``unit`` (the arm's move_to / pick / move_to / place per
object, the same name in the calls of one ``$variable``), and bounds on units and statements, so every
constrained plan can end and must end within them.

The task's sentence shapes the MiniSpec plan too (skills/task_analysis.py reads it): a count is a loop of the
skill it repeats; amounts the task states bound the arguments of their unit; a ``[Q]`` question is answered
object by object on both outcomes; what the task asks for if it finds something is done under a test on True;
an emergency moves away, then resumes the plan its report says it was given; a log says at least two words.

A suspended generation is resubmitted as a new vLLM request, whose grammar starts from scratch, so
:func:`continuation_regex` builds the regex for the state the plan so far left off in (inside an open block,
right after a call cut at its ``)``, part-way through a unit, with the statements left).
"""

from __future__ import annotations

import dataclasses
import re
from collections import OrderedDict
from dataclasses import dataclass

from timelyllm_ros.skills import task_analysis as ta
from timelyllm_ros.skills.grammar_rules import (
    Answer,
    answers_blocks,
    given_call,
    only,
    opposite,
    repeatable,
    task_skill_set,
)
from timelyllm_ros.skills.grammar_units import Ordered, unit_regex
from timelyllm_ros.skills.minispec import SkillParseError
from timelyllm_ros.skills.plan_scan import need_scan, open_block, open_loop, progress
from timelyllm_ros.skills.regex_pieces import (  # noqa: F401 (int_range_regex, arg_regex: public here too)
    STR_BODY,
    arg_regex,
    args_regex,
    call_regex,
    int_range_regex,
    names_regex,
    rep,
)
from timelyllm_ros.skills.schema import PlanStructure, SkillSet
from timelyllm_ros.skills.task_names import (  # noqa: F401 (the task-reading names: public here too)
    STOPWORDS,
    TaskNames,
    asked_skill,
    counted_skill,
    counted_skills,
    leading_skills,
    split_task,
    task_mentions,
    task_moves,
    task_names,
    task_units,
)

NEED_GAP = 1  # statements allowed before, and after, the statement that makes an asked-for call
_CACHE_LEN = 256  # grammars kept (per skill set and task names)

_TAG_LETTER = re.compile(r"^\s*\[([A-Z])\]")


# -- grammars -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Grammar:
    call: str
    stmt: str  # one top-level statement
    top: str  # a whole plan
    names: tuple[str, ...] | None  # the task's (None: no task)
    max_units: int
    mentions: tuple[str, ...] | None = None  # plan_structure.order task: the names in the task's order
    exact: bool = False  # ... and exactly max_units units
    need_skill: str | None = None  # a skill the plan must call (asked_skill)
    need_call: str = ""  # its calls' regex
    need_stmt: str = ""  # a statement that calls it
    head: int = 0  # statements the plan must begin with (first_by_tag, leading_skills)
    need_gap: int | None = None  # statements allowed before and after the need statement (each side)
    stmt_nn: str = ""  # a statement that does not call it
    call_nn: str = ""  # a call of any other skill
    unit_plan: bool = False  # the plan is made of plan_structure units (else free calls: no unit fits the task's names)
    head_skills: tuple[str, ...] = ()  # the skills the plan must begin with (first_by_tag, leading_skills)
    after_head: str = ""  # the regex of the plan after its first statement
    ps: PlanStructure | None = None  # the task's plan structure (its bounds: task_skill_set)
    tss: SkillSet | None = None  # the task's skill set (task_skill_set: its skills and argument bounds)
    answers: tuple[Answer, ...] = ()  # a [Q] question's plan after its head: these blocks in this order
    need_loop: bool = False  # the need statement is a loop of the task's count (a count's skill)
    loop_call: str = ""  # ... whose other call (at most one, after the counted one) is one of these
    loop_must: bool = False  # ... and it is there (the task asks for it on each repeat)
    after_stmt: str = ""  # the statement right after the count's loop (the asked skill, or any: the task goes on)
    after_call: str = ""  # ... the asked skill's calls, which that statement makes (or "": any statement)
    after_nn: str = ""  # ... a call of any other skill
    after_skill: str | None = None  # ... the asked skill
    need_first: bool = False  # the need statement is the plan's first (the task begins with its skill)
    need_if_true: bool = False  # ... is a test on True that calls it (the task asks for it if it finds something)
    then: tuple[tuple[str, str], ...] = ()  # an emergency's given plan: (skill, its call's regex) per call
    after_heads: tuple[tuple[str, str], ...] = ()  # (head skill, the plan's regex after it) where they differ


_CACHE: OrderedDict[tuple[int, str | None], _Grammar] = OrderedDict()


def _grammar(ss: SkillSet, task: str | None) -> _Grammar:
    key = (id(ss), task)
    g = _CACHE.get(key)
    if g is None:
        names = None
        if task is not None:
            tn = task_names(task)  # not a skill's name: "plan mf,100"
            names = TaskNames([n for n in tn if n not in ss], [n for n in tn.objects if n not in ss])
        units = task_units(ss, task) if task is not None else ss.plan_structure.max_units
        mentions = None
        if task is not None and ss.plan_structure.order == "task":
            mentions = tuple(n for n in task_mentions(task) if n not in ss) or None
            pairs = task_moves(ss, task)
            if pairs and names is not None and all(n in names for n in ta.flatten(pairs)):
                mentions, units = ta.flatten(pairs), min(len(pairs), ss.plan_structure.max_units)
        tag = _TAG_LETTER.match(split_task(task)[1]) if task is not None else None
        first = ss.plan_structure.first_by_tag.get(tag[1], ()) if tag else ()
        if task is not None and not first:
            first = leading_skills(ss, task)
        need = asked_skill(ss, task) if task is not None else None
        counts = [k for k in ta.counts(task) if 2 <= k <= ss.max_loop_count] if task else []
        loops = tuple(sorted(set(counts)))
        need_loop, need_first = 0, False
        after: tuple[str | None, bool, bool, tuple[str, ...], str | None] = (None, False, False, (), None)
        if loops and ss.grammar == "minispec" and ta.tag(task) not in ("E", "Q"):
            # a count is honoured: the skill it repeats is called in a loop of that count (not once, not as
            # the same statement written again); a task that begins with that skill begins with its loop
            # The skill the task asks for beside it is not lost: in the loop if the task asks for it on each
            # repeat ("a photo after each move"), else in the statement after the loop; a task that goes on
            # after its count ("twice, then find the dog") has a statement after the loop.
            seq = counted_skills(ss, task)  # two where the count points back at both ("do that four times")
            counted = seq[0] if seq else None
            if counted is not None:  # its loop has the first count; a later loop, another count of the task
                after_skill = need if need not in (None, *seq) else None
                each, goes_on = ta.count_scope(task)
                later = tuple(n for n in ta.names_after_count(task, STOPWORDS) if n in names.objects) if names else ()
                after = (after_skill, each, goes_on, later, seq[1] if len(seq) > 1 else None)
                # the count's loop replaces a leading statement of its skill; another skill still leads
                # ("climb 50 cm, then shoot two photos": mu, then the photos' loop)
                need, need_first, need_loop = counted, counted in first, counts[0]
                first = () if need_first else first
                loops = tuple(sorted(set(counts[1:])))
        need_if_true = bool(task) and ta.tag(task) not in ("E", "Q") and not need_loop and ta.conditional(task)
        then = ()
        if tag and tag[1] == "E" and first:  # after moving away, the plan the report says it was given
            then = tuple((c[0], given_call(ss, *c)) for c in ta.given_plan(task))
            then = then if all(r for _, r in then) else ()
        tss = task_skill_set(ss, task, names) if task is not None else ss
        answers = ()
        if task is not None and names is not None and ta.tag(task) == "Q":  # in the order the question asks
            said = [n for n in task_mentions(task) if n in names.objects]
            answers = tuple(dict.fromkeys([*said, *names.objects]))
        g = _CACHE[key] = _build(tss, names, units, mentions, first, None if need in first else need, loops,
                                 answers, need_loop, need_first, need_if_true, then, after)
        g = _CACHE[key] = dataclasses.replace(g, ps=tss.plan_structure, tss=tss)
        while len(_CACHE) > _CACHE_LEN:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return g


def _build(ss: SkillSet, names: tuple[str, ...] | None, units: int,
           mentions: tuple[str, ...] | None = None, first: tuple[str, ...] = (), need: str | None = None,
           loops: tuple[int, ...] = (), answers: tuple[str, ...] = (), need_loop: int = 0,
           need_first: bool = False, need_if_true: bool = False,
           then: tuple[tuple[str, str], ...] = (),
           after: tuple[str | None, bool, bool, tuple[str, ...], str | None] = (None, False, False, (), None)
           ) -> _Grammar:
    ps = ss.plan_structure
    # a count of the task (task_analysis.counts: "twice", "in four steps") may be a loop of that count, one level
    # deep like a conditional; no other loop count
    if need_loop and not (need and call_regex(only(ss, (need,)), names=names)):  # the counted skill is out
        loops, need_loop = tuple(sorted({*loops, need_loop})), 0
    loop = "(?:" + "|".join(str(k) for k in loops) + r")\{" if loops and ss.grammar == "minispec" else ""
    call = call_regex(ss, names=names)
    if ss.grammar != "minispec":
        if ps.unit and mentions:
            for exact in (True, False):  # as many units as the task has, if its mentions allow
                top = Ordered(ss, mentions, exact).whole(-1, units, optional=False)
                if top:
                    return _Grammar(call, "", top, names, units, mentions, exact, unit_plan=True)
        if ps.unit:
            unit = unit_regex(ss, ps.unit, names)
            if unit:
                return _Grammar(call, unit, rep(unit, 1, units), names, units, unit_plan=True)
        return _Grammar(call, f"{call};", rep(f"{call};", 1, ps.max_statements), names, units)
    blocks = answers_blocks(ss, names, answers, need)
    if blocks:
        need = None  # the answers are the plan
    stmt = f"{call};"
    boolcall = call_regex(ss, ("bool",), names)
    if boolcall:
        stmt += r"|\?" + boolcall + r"==(?:True|False)\{" + rep(f"{call};", 1, ps.max_block_statements) + r"\};?"
    if loop:
        stmt += "|" + loop + rep(f"{call};", 1, ps.max_block_statements) + r"\};?"
    n_max = ps.max_statements
    need_call = call_regex(only(ss, (need,)), names=names) if ss.grammar == "minispec" and need else ""
    need_stmt = stmt_nn = call_nn = loop_call = after_stmt = after_call = after_nn = ""
    loop_must = False
    if need_call:
        # Unambiguous, so a resumed plan's grammar (continuation_regex) is exactly what is left of this one:
        # the statements before the first one that calls the asked-for skill call it nowhere.
        m = ps.max_block_statements
        others = [sk.name for sk in ss.skills if sk.name != need]
        call_nn = call_regex(only(ss, others), names=names)
        bool_nn = call_regex(only(ss, others), ("bool",), names)
        stmt_nn = f"{call_nn};"
        need_loop = need_loop if ss.grammar == "minispec" else 0
        need_stmt = "" if need_loop or need_if_true else f"{need_call};"
        side = None if m is None else m - 1
        conds = ([(r"|\?" + bool_nn + r"==(?:True|False)\{", True)] if bool_nn else []) + ([("|" + loop, False)]
                                                                                         if loop else [])
        if need_loop:
            # The count's loop repeats a small pattern: it begins with the counted call, then at most one
            # repeatable call (a move or turn by an amount, a photo, a wait: no name, no log), or exactly the
            # asked skill's when the task asks for it on each repeat. It is the plan's one loop before it: no
            # other loop to fill with what the count does not repeat.
            also, each, goes_on, later, inner = after
            in_loop = bool(also and each and not inner and (sk := ss.get(also)) is not None and repeatable(sk))
            must = inner or (also if in_loop else None)  # the loop's second call, which it must make
            pool = [must] if must else [k.name for k in ss.skills if k.name not in (need, also) and repeatable(k)]
            loop_call = call_regex(only(ss, pool), names=names)
            loop_must = bool(must and loop_call)
            around = f"{loop_call};" if loop_must else rep(f"{loop_call};", 0, 1) if loop_call else ""
            need_stmt = f"{need_loop}" + r"\{" + f"{need_call};" + around + r"\};?"
            conds = [c for c in conds if c[1]]
            after_call = call_regex(only(ss, (also,)), names=names) if also and not in_loop else ""
            if after_call:  # the asked call, or a test whose block makes it first or second
                after_nn = call_regex(only(ss, [sk.name for sk in ss.skills if sk.name != also]), names=names)
                after_stmt = f"{after_call};" + (r"|\?" + boolcall + r"==(?:True|False)\{" + rep(f"{after_nn};", 0, 1)
                                                 + f"{after_call};" + rep(f"{call};", 0, None if m is None else m - 2)
                                                 + r"\};?" if boolcall else "")
            elif goes_on:  # a test on what the task names after its count ("then find the dog"), else anything
                test = call_regex(ss, ("bool",), later) if later and not loops else ""  # (a later count: its loop)
                after_stmt = (r"\?" + test + r"==(?:True|False)\{" + rep(f"{call};", 1, m) + r"\};?") if test else stmt
        for cond, is_if in conds:
            if not need_if_true:  # a test before the one that finds it would only say the same again
                stmt_nn += cond + rep(f"{call_nn};", 1, m) + r"\};?"
            if (is_if and need_loop) or (need_if_true and not is_if):
                continue  # a count's skill is looped; what the task asks if it finds something, under a test
            before = side
            if need_if_true:  # on finding it, what the task asks for comes first or second, not after chatter
                cond, before = cond.replace("==(?:True|False)", "==True"), 1
            alt = cond + rep(f"{call_nn};", 0, before) + f"{need_call};" + rep(f"{call};", 0, side) + r"\};?"
            need_stmt += alt if need_stmt else alt[1:]
    head = ""
    after_heads: tuple[tuple[str, str], ...] = ()
    if first:
        head = f"{call_regex(only(ss, first), names=names)};"
        first = tuple(sk for sk in first if args_regex(ss, sk, names))
        n_max = None if n_max is None else n_max - 1
    gap_n = None if n_max is None else max(0, n_max - 1)
    if blocks:
        top = head + "".join(b.whole for b in blocks)
    elif then and head:
        # Away, then the plan it was given; unless the way away is the opposite of that plan's first move (the
        # danger lies that way: a fan above, a plan going up), which leaves what follows to the plan
        resume = "".join(f"{r};" for _, r in then)
        free = rep(stmt, 0, n_max)
        after_heads = tuple((h, free if opposite(ss, h, then[0][0]) else resume) for h in first)
        top = "(?:" + "|".join(f"{call_regex(only(ss, [h]), names=names)};{rest}" for h, rest in after_heads) + ")"
    elif need_stmt:
        # Close to the start, and the plan ends soon after it: with the whole bound on each side, a model that
        # left the call out of its first statements wandered (20 segments of scans) before it was made to.
        gap_n = NEED_GAP if gap_n is None else min(gap_n, NEED_GAP)
        if not gap_n:  # no statement left after it
            after_stmt = after_call = ""
        post = f"(?:{after_stmt})" + rep(stmt, 0, gap_n - 1) if after_stmt else rep(stmt, 0, gap_n)
        top = head + rep(stmt_nn, 0, 0 if need_first else gap_n) + f"(?:{need_stmt})" + post
    else:
        top = head + rep(stmt, 0 if head else 1, n_max)
    return _Grammar(call, stmt, top, names, units, need_skill=need if need_call else None, need_call=need_call,
                    need_stmt=need_stmt, need_loop=bool(need_call and need_loop), loop_call=loop_call,
                    loop_must=bool(need_call and need_loop) and loop_must,
                    after_stmt=after_stmt if need_call else "", after_call=after_call if need_call else "",
                    after_nn=after_nn, after_skill=after[0] if after_call and need_call else None,
                    need_first=bool(need_call) and need_first, need_if_true=bool(need_call) and need_if_true,
                    then=then if head and not blocks else (), after_heads=after_heads,
                    head=1 if head else 0, need_gap=gap_n, stmt_nn=stmt_nn, call_nn=call_nn,
                    head_skills=first if head else (),
                    after_head=top[len(head):] if head and not after_heads else "",
                    answers=blocks)


def plan_regex(ss: SkillSet, task: str | None = None) -> str | None:
    """Regex for a whole plan from its start (None: prose, unconstrained). ``task``: the task's input text,
    whose names (:func:`task_names`) and units (:func:`task_units`) the plan may use; None leaves
    ``from_task`` arguments free strings."""
    if ss.grammar == "text":
        return None
    return _grammar(ss, task).top


def plan_head(ss: SkillSet, task: str) -> tuple[tuple[str, str], ...]:
    """A fresh plan split after the name of its first skill, where the task makes it begin with one of a few
    (``first_by_tag``: an emergency's evasive move; ``leading_skills``): for each such skill, its name and the
    regex of the rest of the plan. () where the plan may begin with anything.

    name + rest, over the pairs, is exactly :func:`plan_regex`'s language. It exists for a backend that
    constrains tokens, not text: there the first skill can be asked for as the one token the prompt spells it
    with. Text alone lets a model that prefers a masked skill (``mf``, not evasive) spell an allowed one letter
    by letter (``m``, ``b``), a sequence n-gram speculation never finds in the prompt: 5 steps to the first
    segment where 2 do."""
    if ss.grammar == "text":
        return ()
    g = _grammar(ss, task)
    after = dict(g.after_heads)
    return tuple((sk, args_regex(g.tss or ss, sk, g.names) + ";" + after.get(sk, g.after_head))
                 for sk in g.head_skills)


def continuation_regex(ss: SkillSet, plan_so_far: str, task: str | None = None) -> str | None:
    """Regex for the rest of a plan whose text so far is ``plan_so_far`` (a segment boundary, or a call cut
    at its ``)``), for the same ``task``."""
    if ss.grammar == "text":
        return None
    # "(?:)": nothing more may come but the end (an empty string would read as no grammar at all)
    return _continuation(ss, plan_so_far, _grammar(ss, task)) or "(?:)"


def _continuation(ss: SkillSet, plan_so_far: str, g: _Grammar) -> str:
    done = plan_so_far.rstrip()
    if not done:
        return g.top
    ps = g.ps or ss.plan_structure
    cut = done.endswith(")")  # cut at a call's ')': its ';' comes next
    if ss.grammar == "minispec":
        top, depth, block = progress(done)
        left = None if ps.max_statements is None else ps.max_statements - top
        if g.answers:
            return _answers_rest(g, done, cut, top, depth, block)
        if g.then and depth <= 0:  # an emergency that resumes its given plan after the head it began with
            began = re.match(r"\s*([a-z]+)\(", done)
            if began and dict(g.after_heads).get(began[1]) == "".join(f"{r};" for _, r in g.then):
                return (";" if cut else "") + "".join(f"{r};" for _, r in g.then[max(0, top - g.head):])
        if g.need_skill:
            return _need_rest(ps, g, done, cut)
        if depth <= 0:  # a call cut at its ')' ends the plan, or its ';' comes before the next statement
            more = rep(g.stmt, 0, left)
            return (f"(?:;{more})?" if more else ";?") if cut else more
        lead = ";" if cut else ""
        # inside a block: its calls left, its '}', then the statements left after it
        blk = None if ps.max_block_statements is None else ps.max_block_statements - block
        close = r"\};?" * depth
        after = None if left is None else left - 1
        return lead + rep(f"{g.call};", 0 if block else 1, blk) + close + rep(g.stmt, 0, after)
    lead = ";" if cut else ""
    if g.unit_plan:  # the rest of the units; a plan of free calls goes on with free calls, whatever it began with
        tail = _unit_tail(ss, done, g)
        if tail is not None:
            return lead + tail
    n = _calls(ss, done)
    left = None if ps.max_statements is None or n is None else ps.max_statements - len(n)
    return lead + rep(f"{g.call};", 0, left)


def _answers_rest(g: _Grammar, done: str, cut: bool, top: int, depth: int, block: int) -> str:
    """The rest of a question's plan (:func:`answers_blocks`): what is left of the open block, then the blocks after
    it; before the first block, the head's ';' if it was cut."""
    i = top - g.head  # blocks closed
    if depth <= 0:
        rest = "".join(b.whole for b in g.answers[max(0, i):])
        return (";" if cut else ";?" if done.endswith("}") else "") + rest
    if i >= len(g.answers):
        return ""
    return ((";" if cut else "") + g.answers[i].body(block) + r"\};?"
            + "".join(b.whole for b in g.answers[i + 1:]))


def _need_rest(ps, g: _Grammar, done: str, cut: bool) -> str:
    """The rest of a plan that must call ``g.need_skill`` (:func:`_build`'s need grammar, exactly: the statements
    before the first that calls it call it nowhere, at most ``need_gap`` on each side of it)."""
    stmts, p, depth, b, in_blk, after_need = need_scan(done, g.need_skill or "", g.head)
    G, m = g.need_gap, ps.max_block_statements
    Gb = 0 if g.need_first else G  # statements allowed before it
    dec = lambda x, k: None if x is None else x - k  # noqa: E731
    # after it: the statement a count's loop must be followed by (_build), then the rest of the gap
    post_any = f"(?:{g.after_stmt})" + rep(g.stmt, 0, dec(G, 1)) if g.after_stmt else rep(g.stmt, 0, G)
    if depth <= 0:
        if p is not None and g.after_stmt and stmts == p + 1:  # the loop, and nothing after it yet
            return (";?" if done.endswith("}") else "") + post_any
        if p is not None:  # written: the statements after it are the rest of the gap after it
            more = rep(g.stmt, 0, dec(G, stmts - p - 1))
            return (f"(?:;{more})?" if more else ";?") if cut else more
        rest = rep(g.stmt_nn, 0, dec(Gb, stmts)) + f"(?:{g.need_stmt})" + post_any
        return (";" if cut else "") + rest
    lead = ";" if cut else ""
    close = r"\}" + r";?"
    if p is not None and g.after_skill and stmts == p + 1:  # the test after the count's loop
        _, _, _, _, made, since = need_scan(done, g.after_skill, g.head)
        if made:  # the asked call, then at most m - 2 others
            return lead + rep(f"{g.call};", 0, dec(m, 2 + since)) + close + rep(g.stmt, 0, dec(G, stmts - p))
        # not made yet: first or second in the block
        return (lead + rep(f"{g.after_nn};", 0, max(0, 1 - b)) + f"{g.after_call};" + rep(f"{g.call};", 0, dec(m, 2))
                + close + rep(g.stmt, 0, dec(G, stmts - p)))
    if p is not None:  # the open block is one more statement after it
        return (lead + rep(f"{g.call};", 0 if b else 1, dec(m, b)) + close
                + rep(g.stmt, 0, dec(G, stmts - p)))
    if g.need_loop and open_loop(done):  # the count's loop: one repeatable call at most on each side of it
        one = (lambda k: "" if not g.loop_call or k <= 0 else f"{g.loop_call};" if g.loop_must  # noqa: E731
               else rep(f"{g.loop_call};", 0, k))
        if in_blk:
            return lead + one(1 - after_need) + close + post_any
        return lead + f"{g.need_call};" + one(1) + close + post_any  # a fresh loop: the counted call first
    if in_blk:  # the open block calls it: it is the need statement
        return lead + rep(f"{g.call};", 0, dec(m, 1 + after_need)) + close + post_any
    alts = []
    if (m is None or b <= m - 1) and not g.need_loop and (not g.need_if_true or open_block(done) == "True"):
        # the block calls it before it closes
        alts.append(rep(f"{g.call_nn};", 0, max(0, 1 - b) if g.need_if_true else dec(m, 1 + b)) + f"{g.need_call};"
                    + rep(f"{g.call};", 0, dec(m, 1))
                    + close + post_any)
    if (Gb is None or stmts + 1 <= Gb) and not g.need_if_true:  # or it closes without, a later statement calls it
        alts.append(rep(f"{g.call_nn};", 0 if b else 1, dec(m, b)) + close + rep(g.stmt_nn, 0, dec(Gb, stmts + 1))
                    + f"(?:{g.need_stmt})" + post_any)
    return lead + "(?:" + "|".join(alts) + ")"


def _calls(ss: SkillSet, text: str) -> list | None:
    try:
        return ss.parse(text if text.endswith(";") else text + ";")
    except SkillParseError:
        return None


def _unit_tail(ss: SkillSet, done: str, g: _Grammar) -> str | None:
    """The rest of a unit-structured plan after ``done``; None if ``done`` does not follow the units."""
    ps, names = ss.plan_structure, g.names
    calls = _calls(ss, done)
    if calls is None:
        return None
    u = ps.unit
    for k, c in enumerate(calls):
        if c.name != u[k % len(u)][0]:
            return None
    units, pos = divmod(len(calls), len(u))
    if g.mentions:
        ordered = Ordered(ss, g.mentions, g.exact).continuation(calls, g.max_units - units)
        if ordered is not None:
            return ordered
    unit = unit_regex(ss, u, names)
    if pos == 0:
        return rep(unit, 0, g.max_units - units) if unit else ""
    bound = None
    var = u[pos][1]
    if var is not None and u[pos - 1][1] == var and calls[-1].args and isinstance(calls[-1].args[0], str):
        bound = calls[-1].args[0]
    tail = unit_regex(ss, u[pos:], names, bound=bound)
    if not tail:
        return None
    return tail + (rep(unit, 0, g.max_units - units - 1) if unit else "")
