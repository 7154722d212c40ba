"""What a task's text names and asks of a skill set: its things (scene objects and runs of content words), the
skill it begins with or asks for, its units and moves. The grammar builds each task's regex from these
(:mod:`timelyllm_ros.skills.grammar`); the plan judge reads tasks with the same words (:data:`STOPWORDS`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from timelyllm_ros.skills import task_analysis as ta

if TYPE_CHECKING:
    from timelyllm_ros.skills.schema import SkillSet

MAX_NAMES = 32  # names offered per task: bounds the regex (and the model's choice)

# Words that name nothing: function words, and the verbs and words of tasks and their failure reports (an
# object or place is a run of the other words of the task).
STOPWORDS = frozenset("""
a an the and or but if so then than to of in on at by for from with without into onto near under over above
below behind beside between inside outside it its is are be been was were there here this that these those
you your me my i we our us can could would will shall should please do does did have has had not no yes
what which who whom where when how whether up down out off as also just all any some each every again
finally first second then next after before while until myself yourself let s
find look search locate seek check see try go fly move turn rise climb approach come pick drop put place
take grab bring get lift set leave tell report say answer show photo photograph picture snapshot image
provided plan encountered failure because execution history attempting walking passing approaching
running flying jumping catch coming towards toward cm degrees seconds
""".split())
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*|[^A-Za-z0-9\s]")
_SCENE = re.compile(r"Scene:\s*\[(?P<scene>.*?)\]\s*,?\s*Task:\s*(?P<task>.*)$", re.S)
_SCENE_NAME = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_]*?)(?:_\d+)?(?=[\s:]|$)")
_TAG = re.compile(r"^\s*\[[A-Z]\]\s*")
_TASK_LABEL = re.compile(r"^\s*Task:\s*")


def split_task(task_input: str) -> tuple[str, str]:
    """(scene, task text) of "Scene: [...] Task: ..." (LRTrace's form), "Task: ..." or a bare task."""
    m = _SCENE.match(task_input.strip())
    return (m["scene"], m["task"]) if m else ("", _TASK_LABEL.sub("", task_input))


_PLACE = frozenset("under on in near at behind beside between inside outside above below onto into over beneath "
                   "underneath by".split())
_ARTICLE = frozenset("the a an my your this that these those".split())


class TaskNames(tuple):
    """The names of a task (a tuple of str), with ``objects``: those it asks about or to act on, i.e. not
    introduced as a place (``the toy under the bed``: the toy; ``keys on the countertop``: the keys)."""

    objects: tuple[str, ...]

    def __new__(cls, names: Sequence[str], objects: Sequence[str]) -> TaskNames:
        t = super().__new__(cls, names)
        t.objects = tuple(objects) or tuple(names)  # a task that names only places: any of them
        return t


def _scan(task: str) -> list[tuple[str, bool]]:
    """(name, introduced by a place word) for each run of words of a task text between function words,
    verbs, adjectives of state, number words and punctuation, in order (``the red box`` is ``red_box``, three
    words at most)."""
    out: list[tuple[str, bool]] = []
    run: list[str] = []
    before = ""  # the word before the run, articles skipped
    prev = ""  # the word before this one
    for tok in [*_WORD.findall(_TAG.sub("", task)), "."]:
        w, prev_w = tok.lower(), prev
        prev = tok.lower()
        # a name word (not a verb, an adjective of state or a number word: task_analysis), a function word only
        # after an article ("the can")
        if ta.is_name(w, prev_w, STOPWORDS):
            run.append(w)
            continue
        if run and (name := "_".join(ta.end_run(run)[:3])):
            out.append((name, before in _PLACE))
        run = []
        if w not in _ARTICLE:
            before = w
    return out


def task_names(task_input: str, limit: int = MAX_NAMES) -> TaskNames:
    """The names a task uses for things: its scene's objects (``countertop_1`` is ``countertop``; places,
    unless its text names them otherwise), then each run of words of its text (:func:`_scan`: the whole name,
    ``pen_holder``, not its parts), lower case, in order of appearance, at most ``limit``."""
    scene, task = split_task(task_input)
    names: dict[str, None] = {}
    places: set[str] = set()
    for entry in scene.split(","):
        sm = _SCENE_NAME.match(entry)
        if sm:
            names[sm[1].lower()] = None
            places.add(sm[1].lower())
    scanned = _scan(task)
    for name, _ in scanned:
        names[name] = None
    places |= {n for n, place in scanned if place}
    places -= {n for n, place in scanned if not place}
    kept = tuple(names)[:limit]
    return TaskNames(kept, [n for n in kept if n not in places])


def task_mentions(task_input: str) -> tuple[str, ...]:
    """The names of the task text (not its scene) in the order it mentions them, repeats kept (``Pick up
    the red box ... on the blue box. Then ... drop it on the red box``: red_box, blue_box, ..., red_box)."""
    out: list[str] = []
    for name, _ in _scan(split_task(task_input)[1]):
        if not out or out[-1] != name:
            out.append(name)
    return tuple(out)


def leading_skills(ss: SkillSet, task_input: str) -> tuple[str, ...]:
    """The skill a task begins with, by its words (``Move up and check ...``: mu; a skill's ``phrases``),
    as the one skill a plan may begin with; () when the task begins with none. A clause of time comes in its
    order: ``after climbing 50 cm, ...`` begins with mu; ``before you photograph it, climb ...`` too."""
    toks = [w.lower() for w in _WORD.findall(_TAG.sub("", split_task(task_input)[1]))]
    if toks[:1] == ["before"] and "," in toks:  # "before you photograph the vase, climb 40 cm": the main clause
        toks = toks[toks.index(",") + 1:]
    elif toks[:1] == ["after"]:  # "after climbing 50 cm, ...", "after you rise, ...": the clause's own verb
        toks = toks[2:] if toks[1:2] == ["you"] else toks[1:]
    text = " ".join(w for w in toks if w[0].isalnum())
    best = max(((len(v), sk.name) for sk in ss.skills for p in sk.phrases for v in _ing_forms(p)
                if (text + " ").startswith(v + " ")), default=None)
    return (best[1],) if best else ()


def move_phrases(ss: SkillSet) -> list[str]:
    """The phrases of the skill set's movement skills (``move up``, ``back away``; not ``wait``)."""
    return [p for sk in ss.skills if sk.kind == "movement" for p in sk.phrases]


def asked_skill(ss: SkillSet, task_input: str) -> str | None:
    """The first skill the task asks for by its words anywhere (``... take a picture of it``, ``taking a
    photo``: tp; a skill's ``asked_by``), which the plan must call; None when it asks for none."""
    text = " " + " ".join(w.lower() for w in _WORD.findall(split_task(task_input)[1]) if w[0].isalnum()) + " "
    hits = [(text.find(f" {v} "), sk.name) for sk in ss.skills for p in sk.asked_by for v in _ing_forms(p)
            if f" {v} " in text]
    return min(hits)[1] if hits else None


def _ing_forms(phrase: str) -> tuple[str, ...]:
    """A phrase and the same with its verb in the -ing form (``taking a photo``, ``snapping``, ``telling``)."""
    verb, _, rest = phrase.partition(" ")
    forms = {verb + "ing", verb[:-1] + "ing" if verb.endswith("e") else verb + verb[-1] + "ing"}
    return (phrase, *(" ".join(filter(None, (f, rest))) for f in sorted(forms)))


def counted_skill(ss: SkillSet, task_input: str) -> str | None:
    """The skill the task's first count (:func:`task_analysis.counted`) repeats, by the words of its sentence:
    the skill one of whose ``asked_by`` ends with the thing counted (``snap three pictures``: tp), else the
    last skill the sentence names before the count (``phrases``, ``asked_by``: ``go up by 30 cm two times``:
    mu), else the first it names after it (``a full turn in four steps, a photo after each``: tp); None when
    the task has no count or its sentence names no skill."""
    skills = counted_skills(ss, task_input)
    return skills[0] if skills else None


def counted_skills(ss: SkillSet, task_input: str) -> tuple[str, ...]:
    """What the task's first count repeats: :func:`counted_skill`'s one skill; or, where the count points back
    at what its sentence said before it (``go forward 100 cm, then turn right, and do that four times``, ``wait
    a second and repeat this``, ``once more``), the first two skills named before it, in order."""
    cs = ta.counted(task_input)
    if not cs:
        return ()
    at = cs[0][0]
    ws = ta.words(_TAG.sub("", split_task(task_input)[1]))
    thing = ws[at + 1] if at + 1 < len(ws) else ""
    for w in (thing, thing[:-1] if thing.endswith("s") else thing):
        hit = next((sk.name for sk in ss.skills for p in sk.asked_by if p.split()[-1] == w), None)
        if hit:
            return (hit,)
    ends = {".", "!", "?", ";"}
    lo = max((i for i in range(at) if ws[i] in ends), default=-1) + 1
    hi = next((i for i in range(at, len(ws)) if ws[i] in ends), len(ws))
    named: list[tuple[int, int, str]] = []  # (start, -length, skill) of each phrase the sentence says
    for sk in ss.skills:
        for p in (*sk.phrases, *sk.asked_by):
            pw = p.split()
            named += [(i, -len(pw), sk.name) for i in range(lo, hi - len(pw) + 1) if ws[i:i + len(pw)] == pw]
    starts = sorted({n[0] for n in named})  # the longest phrase at each named position
    said = [min(n for n in named if n[0] == i) for i in starts]
    before = [n[2] for n in said if n[0] < at]
    after = [n[2] for n in said if n[0] > at]
    if len(before) > 1 and ta.points_back(task_input):
        return tuple(dict.fromkeys(before))[:2]
    if before:
        return (before[-1],)
    return (after[0],) if after else ()


def task_units(ss: SkillSet, task_input: str) -> int:
    """The units a plan for this task may have (``plan_structure``): one per ``unit_verbs`` word of the
    task (``Pick up X ... Then, pick up Y`` moves two objects), at least 1, at most ``max_units``."""
    ps = ss.plan_structure
    if not ps.unit_verbs:
        return ps.max_units
    words = [w.lower() for w in _WORD.findall(split_task(task_input)[1])]
    return max(1, min(ps.max_units, sum(w in ps.unit_verbs for w in words)))


def task_moves(ss: SkillSet, task_input: str) -> tuple[tuple[str, str], ...]:
    """(object, destination) per object the task moves, from its sentence's structure
    (:func:`task_analysis.moves`: ``put the A and the B in the C``, ``move the A from the X to the Y``,
    ``into the C, drop the A``); () where it reads none, or the skill set moves no objects (no ``unit_verbs``)."""
    verbs = ss.plan_structure.unit_verbs
    if not verbs:
        return ()
    return ta.moves(task_input, STOPWORDS - ta.VERBS, set(verbs) | ta.VERBS)
