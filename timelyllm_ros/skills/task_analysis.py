"""What a task's sentence says, read from its structure: its counts, whether it is a question, its names that
are noun phrases, and (for a robot that moves objects) which object goes where.

Word classes, not phrasings: a name is a run of content words, never a verb, an adjective of state or a number
word; a count is a number word before ``times``/``steps`` or a thing (``three pictures``), or ``twice``; the
roles of a manipulation task come from its prepositions and conjunctions (``from`` marks a source, ``in``,
``on``, ``to``, ``near`` ... a destination, ``and`` coordinates objects, a pronoun refers to the objects of the
verb before it, a destination may come first: ``into the bin, drop the can``).

No NLP library (yet): the planner's venv has no spaCy, NLTK or stanza; spaCy's English pipelines are published
outside the package index (on the index only as third parties' mirrors) and NLTK's tagger needs a data download
of its own, so either is an install step the CPU image does not have; its cost per task is unmeasured.
The word classes are small closed lists (number words,
prepositions, pronouns) plus two open ones kept short on purpose (verbs of the skill sets' tasks, adjectives
of state); a word they miss is read as part of a name, which the judge's noun-phrase check and the grammar's
name list then still confine to words of the task.

Pure Python: the grammar (skills/grammar.py) and the judge (skills/quality.py) both read tasks through it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*|[0-9]+|[^A-Za-z0-9\s]")
_SCENE = re.compile(r"Scene:\s*\[(?P<scene>.*?)\]\s*,?\s*Task:\s*(?P<task>.*)$", re.S)
_TAG = re.compile(r"^\s*\[([A-Z])\]\s*")
_TASK_LABEL = re.compile(r"^\s*Task:\s*")

NUMBER_WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
                "ten": 10, "twice": 2, "thrice": 3}
NUMBER_ONLY = frozenset({"one", "once", "zero", "none", "both", "pair", "couple", "half", "times", "time",
                         "steps", "step", "first", "second", "third", "fourth", "last", "every", "each"})
# Adjectives and participles of state: what a yes/no question asks about an object, never part of its name
# ("is the door closed?": the door).
STATE_WORDS = frozenset("""
open opened closed shut locked unlocked lit unlit dark bright empty full broken clean dirty wet dry running
working plugged unplugged switched turned ready upright tidy messy hot cold warm charged dead alive off
""".split())
# Verbs of the tasks the skill sets serve (imperatives and speech acts), never part of a name.
VERBS = frozenset("""
find look search locate seek check see try go fly move turn rise climb approach come pick drop put place take
grab bring get lift set leave tell report say answer show photograph snap shoot spin rotate circle hover wait
land greet thank welcome ask warn stack transfer carry insert return lay make track count inspect scan capture
record follow watch comes appears shows enters gets goes gather collect repeat pause lower raise descend ascend
""".split())
UNITS = frozenset("cm centimetres centimeters m metres meters mm degrees degree deg seconds second s".split())
PRONOUNS = frozenset("it them one ones".split())  # what a verb phrase's object may be instead of a noun
# Words that stand for a person or thing without naming it, interjections and adverbs of direction: never an
# object's name.
NOT_NAMES = frozenset("""
him her them they he she someone somebody something anyone anybody anything everyone everybody everything
hello hi hey goodbye bye thanks please around away about along across through more again afterwards
""".split())
# Adverbs of direction: part of a name before a name word ("the left shelf"), never at its end ("turn left",
# "put the ball back").
DIRECTIONS = frozenset("""
left right forward forwards backward backwards back upward upwards downward downwards sideways clockwise
counterclockwise anticlockwise
""".split())
# The shapes of a path the robot flies: a run of words that ends in one names a manoeuvre, not a thing ("fly a
# square", "two clockwise rotations").
PATH_SHAPES = frozenset("""
square squares circle circles triangle rectangle loop loops lap laps rotation rotations revolution revolutions
spin spins turn turns zigzag spiral
""".split())


def end_run(run: Sequence[str]) -> list[str]:
    """A run of name words as a name: without the adverbs of direction at its end; nothing when it ends in a
    path's shape, or is a task verb's -ing form alone ("looking for", "taking a photo"; "landing pad" stays)."""
    out = list(run)
    while out and out[-1] in DIRECTIONS:
        out.pop()
    if out and out[-1] in PATH_SHAPES:
        return []
    return [] if len(out) == 1 and _verb_ing(out[0]) else out


def _verb_ing(w: str) -> bool:
    stem = w[:-3] if w.endswith("ing") else ""
    return bool(stem) and (stem in VERBS or stem + "e" in VERBS or (len(stem) > 2 and stem[-1] == stem[-2]
                                                                     and stem[:-1] in VERBS))
_SOURCE = frozenset({"from", "off"})
_DEST = frozenset("in into on onto near to beside inside over above under behind by next atop".split())
_SIDE = frozenset("top front side middle centre center end back left right".split())  # "on top of the X"
_BREAK = frozenset({".", ";", "!", "?", ":", "then", "finally", "afterwards", "next", "after"})


def split_task(task_input: str) -> tuple[str, str]:
    """(scene, task text) of "Scene: [...] Task: ..." (LRTrace's form), "Task: ..." or a bare task."""
    m = _SCENE.match(task_input.strip())
    return (m["scene"], m["task"]) if m else ("", _TASK_LABEL.sub("", task_input))


def tag(task_input: str) -> str | None:
    """The task's tag letter ("[Q] ...": Q), None without one."""
    m = _TAG.match(split_task(task_input)[1])
    return m[1] if m else None


def words(text: str) -> list[str]:
    """Lower-case words, numbers and punctuation marks, in order."""
    return [w.lower() for w in _WORD.findall(text)]


def is_question(task_input: str) -> bool:
    """The task asks for an answer: a ``[Q]`` task, or its text asks one (``?``, ``whether``)."""
    text = split_task(task_input)[1]
    return tag(task_input) == "Q" or "?" in text or "whether" in words(text)


MOTION_VERBS = frozenset("move fly go turn rotate rise ascend climb descend spin circle lower raise".split())


def asks_to_move(task_input: str, phrases: Iterable[str] = ()) -> bool:
    """The task asks the robot to move by its own words: a motion verb, or one of a skill's ``phrases`` whole
    (``back away``; not its first word alone: ``report back`` asks for no move)."""
    ws = words(split_task(task_input)[1])
    text = " " + " ".join(ws) + " "
    return bool(set(ws) & MOTION_VERBS) or any(f" {p.strip()} " in text for p in phrases if p.strip())


_MAX_DIGITS = 6  # a longer number is no count or amount a robot takes (int() of 4300+ digits raises)


def counted(task_input: str) -> tuple[tuple[int, int], ...]:
    """(word index, count) of each count the task text asks for, in order, the index into
    ``words(task text without its tag)``: ``twice`` (2), ``three times``, ``in four steps``, ``snap three
    pictures``, ``take 3 photos`` (3: a number before a thing, not before a unit: ``30 cm`` is an amount);
    ``once more`` (2) and ``two more times`` (3) count the first time too."""
    ws = words(_TAG.sub("", split_task(task_input)[1]))
    out: list[tuple[int, int]] = []
    for i, w in enumerate(ws):
        nxt = ws[i + 1] if i + 1 < len(ws) else ""
        more = nxt == "more" and i + 2 < len(ws) and ws[i + 2] in ("times", "time")  # "two more times": 3 in all
        if w in ("twice", "thrice"):
            out.append((i, NUMBER_WORDS[w]))
        elif (w == "once" and nxt == "more") or (w == "one" and more):  # "do it once more": twice in all
            out.append((i, 2))
        elif w in NUMBER_WORDS and more:
            out.append((i, NUMBER_WORDS[w] + 1))
        elif w in NUMBER_WORDS and nxt[:1].isalpha() and nxt not in UNITS:
            out.append((i, NUMBER_WORDS[w]))
        elif (w.isdigit() and len(w) <= _MAX_DIGITS and int(w) > 1
              and (nxt in ("times", "steps") or (nxt[:1].isalpha() and nxt not in UNITS and nxt not in _UNIT_OF))):
            out.append((i, int(w)))
    return tuple(out)


def _first_count(task_input: str) -> tuple[list[str], int] | None:
    """(the task text's words, the index of its first count), None without a count."""
    cs = counted(task_input)
    return (list(words(_TAG.sub("", split_task(task_input)[1]))), cs[0][0]) if cs else None


_EACH = frozenset({"each", "every"})
_GOES_ON = frozenset({"then", "afterwards", "finally", "next"})


def count_scope(task_input: str) -> tuple[bool, bool]:
    """(each, goes on) for the task's first count: its sentence asks for something on each repeat (``take a
    photo after each move``, ``each time``); the task goes on after it (``twice, then find the dog``,
    ``afterwards``, ``after that``). (False, False) without a count."""
    first = _first_count(task_input)
    if first is None:
        return False, False
    ws, at = first
    lo = max((i for i in range(at) if ws[i] in _ENDS), default=-1) + 1
    hi = next((i for i in range(at, len(ws)) if ws[i] in _ENDS), len(ws))
    each = any(w in _EACH for w in ws[lo:hi])
    after = ws[at + 1:]
    goes_on = any((w in _GOES_ON or (w == "after" and nxt in ("that", "this", "which")))
                  and any(x[:1].isalpha() for x in after[i + 1:])
                  for i, (w, nxt) in enumerate(zip(after, [*after[1:], ""], strict=True)))
    return each, goes_on


_ENDS = frozenset({".", "!", "?", ";"})
_BACK = frozenset({"that", "this", "it", "these", "repeat", "again"})


def points_back(task_input: str) -> bool:
    """The task's first count repeats what was said before it: ``do that four times``, ``repeat this twice``,
    ``once more``, ``two more times``."""
    first = _first_count(task_input)
    if first is None:
        return False
    ws, at = first
    return (ws[at + 1:at + 2] == ["more"] or (at + 2 < len(ws) and ws[at + 2] == "more")
            or bool(_BACK & set(ws[max(0, at - 3):at])))


def names_after_count(task_input: str, stopwords: Iterable[str] = ()) -> tuple[str, ...]:
    """The names the task text says after its first count (``twice, then find the dog``: dog), in order."""
    first = _first_count(task_input)
    return name_runs(" ".join(first[0][first[1] + 1:]), stopwords) if first else ()


def counts(task_input: str) -> tuple[int, ...]:
    """The counts the task text asks for, in order (:func:`counted`)."""
    return tuple(k for _, k in counted(task_input))


_UNIT_OF = {**dict.fromkeys(("cm", "centimetres", "centimeters"), ("cm", 1)),
            **dict.fromkeys(("m", "metre", "metres", "meter", "meters"), ("cm", 100)),
            **dict.fromkeys(("degrees", "degree", "deg"), ("deg", 1)),
            **dict.fromkeys(("seconds", "second", "s"), ("s", 1))}


def amounts(task_input: str) -> dict[str, tuple[int, ...]]:
    """The amounts the task text states, by the unit the skill files use (``cm``, ``deg``, ``s``), in order:
    ``go up 30 cm`` (cm: 30), ``1 m`` (cm: 100), ``turn 90 degrees`` (deg: 90). A whole number before a unit
    word; a decimal (``1.5 m``) is left out, which leaves that unit's amounts to the plan. Degrees the task
    says in words (``spin around``, ``a quarter turn``: :func:`_turn_words`) where it states none."""
    ws = words(_TAG.sub("", split_task(task_input)[1]))
    out: dict[str, list[int]] = {}
    for i, w in enumerate(ws[:-1]):
        if (w.isdigit() and len(w) <= _MAX_DIGITS and ws[i + 1] in _UNIT_OF
                and not (i >= 2 and ws[i - 1] == "." and ws[i - 2].isdigit())):
            unit, scale = _UNIT_OF[ws[i + 1]]
            out.setdefault(unit, []).append(int(w) * scale)
    if "deg" not in out and (turn := _turn_words(ws)):
        out["deg"] = [turn]
    return {u: tuple(v) for u, v in out.items()}


_TURN_NOUNS = frozenset("turn turns rotation rotations revolution revolutions circle circles spin spins".split())
_TURN_PARTS = {"full": 360, "complete": 360, "whole": 360, "half": 180, "quarter": 90}


def _turn_words(ws: Sequence[str]) -> int | None:
    """The degrees of each turn a task says in words, where it states none: a full turn (rotation, revolution)
    360, a half turn 180, a quarter turn 90, spin around 360, turn around 180; one turn in N steps (``a full turn
    in four steps``) is its N-th. None where it says none."""
    total = None
    for i, w in enumerate(ws):
        nxt = ws[i + 1] if i + 1 < len(ws) else ""
        if w in _TURN_PARTS and (nxt in _TURN_NOUNS or ws[i + 2:i + 3] and ws[i + 2] in _TURN_NOUNS):
            total = _TURN_PARTS[w]  # "a full turn", "one full clockwise rotation"
        elif w in ("spin", "spinning") and nxt == "around":
            total = 360
        elif w in ("turn", "turning") and nxt == "around":
            total = 180
        if total:
            break
    if total is None:
        return None
    steps = next((n for j in range(len(ws) - 2) if ws[j] == "in" and ws[j + 2] in ("steps", "stages", "parts")
                  and (n := NUMBER_WORDS.get(ws[j + 1]) or (int(ws[j + 1]) if ws[j + 1].isdigit()
                                                            and len(ws[j + 1]) <= 2 else 0))), 1)
    return total // steps if total % steps == 0 else None


_IF = frozenset({"if", "when", "whenever", "once"})


_NEGATION = frozenset({"not", "no", "never", "cannot", "nothing", "nobody", "none"})


def conditional(task_input: str) -> bool:
    """The task makes what it asks for depend on what the robot finds (``if you see a book, take a picture``,
    ``when a person comes into view, say hello``). Not when the sentence negates (``if you don't find the
    keys, tell me``: what it asks for is on not finding)."""
    ws = words(_TAG.sub("", split_task(task_input)[1]))
    negated = bool(_NEGATION & set(ws)) or any(a == "'" and b == "t" for a, b in zip(ws, ws[1:], strict=False))
    return bool(_IF & set(ws)) and not negated


_GIVEN = re.compile(r"plan\s+((?:[a-z]+,\s*\d{1,6}(?!\d)\s*;?\s*)+)")
_DONE = re.compile(r"([a-z]+)\((\d{1,6})\)")


def given_plan(task_input: str) -> tuple[tuple[str, int, int], ...]:
    """The plan an emergency report says it was given (``You provided me with plan ml,100 ... Execution
    history: ml(50)``), as (skill, least, most) per call: most is the amount given, least what is left of it
    after the history's calls of the same skill (``ml``, 50, 100). () when the report gives none."""
    text = split_task(task_input)[1]
    m = _GIVEN.search(text)
    if not m:
        return ()
    hist = text[text.find("history"):] if "history" in text else ""
    done: dict[str, int] = {}
    for sk, n in _DONE.findall(hist):
        done[sk] = done.get(sk, 0) + int(n)
    out = []
    for part in m[1].split(";"):
        sk, _, n = part.strip().partition(",")
        if sk and n.strip().isdigit():
            most = int(n)
            left = most - done.pop(sk, 0)
            out.append((sk, left if left > 0 else most, most))
    return tuple(out)


def is_name_word(w: str) -> bool:
    """A word that may be part of an object's name: a content word of two letters or more, not a verb, an
    adjective of state, a number word or a unit."""
    return (len(w) > 1 and w[0].isalpha() and not any(c.isdigit() for c in w) and w not in VERBS
            and w not in STATE_WORDS and w not in NUMBER_WORDS and w not in NUMBER_ONLY and w not in UNITS
            and w not in NOT_NAMES)


def scene_names(task_input: str) -> tuple[str, ...]:
    """The scene's object names (``countertop_1`` is ``countertop``)."""
    out = []
    for entry in split_task(task_input)[0].split(","):
        m = re.match(r"^\s*([A-Za-z][A-Za-z0-9_]*?)(?:_\d+)?(?=[\s:]|$)", entry)
        if m:
            out.append(m[1].lower())
    return tuple(out)


ARTICLES = frozenset("the a an my your his her their our this that these those".split())


MODALS = frozenset("can could will would shall should may might must".split())


def is_name(w: str, prev: str, stop: frozenset[str]) -> bool:
    """``w`` (after ``prev``) is part of a name: a name word, not a function word (``stop``) or its plural,
    unless it is a modal verb that an article makes a noun (``the can``)."""
    if w.endswith("s") and w[:-1] in stop:  # the plural of a function word of the tasks ("pictures")
        return False
    return is_name_word(w) and (w not in stop or (prev in ARTICLES and w in MODALS))


def name_runs(task_input: str, stopwords: Iterable[str] = ()) -> tuple[str, ...]:
    """The names of the task text in order, repeats kept: each run of consecutive name words (three at most:
    ``the red box`` is ``red_box``). Words in ``stopwords`` (function words) break runs."""
    stop = frozenset(stopwords)
    out: list[str] = []
    run: list[str] = []
    prev = ""
    for w in [*words(_TAG.sub("", split_task(task_input)[1])), "."]:
        if is_name(w, prev, stop):
            run.append(w)
        elif run:
            if name := "_".join(end_run(run)[:3]):
                out.append(name)
            run = []
        prev = w
    return tuple(out)


def noun_phrases(task_input: str, stopwords: Iterable[str] = ()) -> frozenset[str]:
    """Every name the task can mean by its words: each run of up to three consecutive name words of its text
    (``the fruit bowl``: fruit, bowl, fruit_bowl), joined by ``_``, and its scene's names."""
    out = set(scene_names(task_input))
    for run in name_runs(task_input, stopwords):
        ws = run.split("_")
        out.update("_".join(ws[i:j]) for i in range(len(ws)) for j in range(i + 1, len(ws) + 1))
    return frozenset(out)


def moves(task_input: str, stopwords: Iterable[str], verbs: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """(object, destination) for each object a manipulation task moves, in the order it is to be moved.

    Read clause by clause: a verb of ``verbs`` opens a verb phrase; the noun phrases after it are its objects
    (coordinated by ``and`` / ``,``), one after ``from`` its source (not a destination), one after a
    destination preposition its destination; a pronoun (``drop it``) or a verb phrase without objects takes the
    objects of the one before; a destination before the verb (``into the bin, drop the can``) is the next verb
    phrase's. Each object goes to its verb phrase's destination, so ``put the A and the B in the C`` is
    (A, C), (B, C) and ``move the A from the X to the Y`` is (A, Y). () when the task moves nothing it can
    place: the caller falls back on the task's order of mention."""
    stop, vb = frozenset(stopwords), frozenset(verbs)
    out: list[tuple[str, str]] = []
    objs: list[str] = []
    dest: str | None = None
    carried: list[str] = []  # objects of an earlier verb phrase without a destination (for a pronoun)
    role: str | None = None  # what the next noun phrase is: object, source, dest, None (not a role)
    has_verb = False
    run: list[str] = []

    def np() -> None:
        nonlocal run, dest
        if run:
            name = "_".join(end_run(run)[:3])
            if name and role == "object":
                objs.append(name)
            elif name and role == "dest":
                dest = name
            run = []

    def flush(end: bool) -> None:
        nonlocal objs, dest, carried, has_verb, role
        np()
        if objs and dest:
            out.extend((o, dest) for o in objs)
            objs, dest, carried = [], None, []
        elif objs:
            carried, objs = objs, []
        if end and has_verb:  # a destination before its verb waits for it; one after a verb ends with its sentence
            dest = None
        has_verb, role = False, None

    ws = words(_TAG.sub("", split_task(task_input)[1]))
    for i, w in enumerate([*ws, "."]):
        nxt = ws[i + 1] if i + 1 < len(ws) else ""
        if w in vb:
            if has_verb:
                flush(False)
            np()
            has_verb, role = True, "object"
        elif w in PRONOUNS and has_verb and role == "object":
            np()
            objs.extend(o for o in carried if o not in objs)
        elif w in _SOURCE:
            np()
            role = "source"
        elif w in _DEST:
            np()
            role = "dest"
        elif role == "dest" and w in _SIDE and nxt == "of":  # "on top of", "in front of": the place follows
            continue
        elif w in _BREAK:
            flush(True)
        elif is_name(w, ws[i - 1] if i else "", stop):
            run.append(w)
        else:  # a function word, an article, "and", a comma: the noun phrase so far ends, the role stays
            np()
    return tuple(out)


def flatten(pairs: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """The names of ``pairs`` in order (object, destination, object, destination, ...)."""
    return tuple(n for p in pairs for n in p)
