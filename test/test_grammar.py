"""Each task's constrained-decoding grammar (skills/grammar.py) against the validator, on generated programs:
a grammar never allows what the validator refuses, a plan cut at a segment boundary resumes into a plan,
and the grammar is what the skill set declares (names the task uses, the arm's ordered units, an
emergency's evasive start). The prompt library's own plans fit their tasks' grammars, and llguidance (vLLM's
structured-output backend in our configs) takes the regexes as Python's re does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_segmenter import bpe_like

from timelyllm_ros import paths
from timelyllm_ros.domain.plans import plan_templates
from timelyllm_ros.engines.prompts import PromptConfig
from timelyllm_ros.skills import grammar
from timelyllm_ros.skills import task_analysis as ta
from timelyllm_ros.skills.schema import SkillSetError
from timelyllm_ros.skills.segmenter import split_segments
from timelyllm_ros.skills.skill_files import load_skill_set, skill_set_from_dict

DRONE = load_skill_set("drone")
ARM = load_skill_set("arm")
HELD_OUT = Path(__file__).resolve().parents[1] / "bench" / "heldout" / "plans.yaml"
TEMPLATES = list(plan_templates().values())
LIBRARY = {rt: PromptConfig.load(rt).examples for rt in ("drone", "arm")}
# Tasks the grammars are drawn for: the templates, the library's, and tasks of words nobody wrote before.
TASKS = {"drone": [t.task_input for t in TEMPLATES if t.robot_type == "drone"]
                  + [ex["input"] for ex in LIBRARY["drone"]]
                  + ["Scene: [] Task: [A] Look for the zebra and photograph it.",
                     "Scene: [shed_2 x:0.1 y:0.2] Task: [E] a wasp is attacking me",
                     "Scene: [] Task: hover here",  # names nothing: no perception call fits
                     "Scene: [] Task: [A] Turn right in three steps, then take two photos of the kite.",  # loops
                     "Scene: [] Task: [A] If you meet the postman, say good morning to him twice.",
                     "Scene: [] Task: [A] Fly up 40 cm three times, then take a picture.",  # begins with its loop
                     "Scene: [roof_1 x:0.5] Task: [Q] Is there a kite on the roof?",  # a capped question
                     "Scene: [] Task: [A] Rise 20 cm twice, then tell me if you see the door.",  # asked after
                     "Scene: [] Task: [A] Fly forward 30 cm four times, taking a photo after each move.",
                     "Scene: [] Task: [A] Turn right 45 degrees two times, then look for the exit sign."],
         "arm": [t.task_input for t in TEMPLATES if t.robot_type == "arm"]
                + [ex["input"] for ex in LIBRARY["arm"]]
                + ["Scene: [], Task: Pick up the teapot and put it next to the kettle.",
                   "Task: Put the lid away.",  # one name: no unit (object, place) fits, any call order
                   "Scene: [], Task: [A] Into the sink, put the spoon and the fork.",  # roles from the structure
                   "Scene: [], Task: [A] Move the key from the hook to the bowl, then put the coin on the key."]}
SETS = {"drone": DRONE, "arm": ARM}


def _valid_or_over_a_bound(ss, text: str) -> bool:
    err = ss.validate_plan(text)
    assert err is None or "max_plan_" in err, (text, err)
    return err is None


@st.composite
def task_and_plan(draw, robot_type: str) -> tuple[str, str]:
    task = draw(st.sampled_from(TASKS[robot_type]))
    return task, draw(st.from_regex(grammar.plan_regex(SETS[robot_type], task), fullmatch=True))


@pytest.mark.parametrize("robot_type", ["drone", "arm"])
def test_every_string_of_a_task_grammar_is_a_valid_plan_naming_only_what_the_task_names(robot_type):
    ss = SETS[robot_type]

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(tp=task_and_plan(robot_type))
    def check(tp):
        task, plan = tp
        if not _valid_or_over_a_bound(ss, plan):
            return
        names = set(grammar.task_names(task))
        for call in ss.parse(plan):
            skill = ss[call.name]
            sig = next(sig for sig in skill.signatures if len(sig) == len(call.args))
            for arg, value in zip(sig, call.args, strict=True):
                if arg.from_task:
                    assert value in names, (task, plan, value)

    check()


@pytest.mark.parametrize("robot_type", ["drone", "arm"])
def test_a_plan_cut_at_a_segment_boundary_resumes_under_exactly_the_rest_of_its_grammar(robot_type):
    ss = SETS[robot_type]

    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data(), tp=task_and_plan(robot_type))
    def check(data, tp):
        task, plan = tp
        segments = split_segments(ss, bpe_like(plan))
        assume(len(segments) > 1)
        done = "".join(segments[:data.draw(st.integers(1, len(segments) - 1))])
        cont = grammar.continuation_regex(ss, done, task)
        # exactly what is left of the whole grammar: the plan's own rest fits (a resubmitted generation decodes
        # under the same mask as one resumed in place, so greedy plans are the same either way) ...
        assert re.fullmatch(cont, plan[len(done):]), (task, done, plan[len(done):])
        rest = data.draw(st.from_regex(cont, fullmatch=True))  # ... and nothing it adds leaves the grammar
        _valid_or_over_a_bound(ss, done + rest)
        whole = grammar.plan_regex(ss, task)  # a MiniSpec plan's last ';' may be left out
        assert re.fullmatch(whole, done + rest) or re.fullmatch(whole, done + rest + ";"), (task, done, rest)

    check()


def test_names_mentions_units_and_leading_skills_are_read_from_the_task():
    stack = next(t for t in TEMPLATES if t.name == "object_stacking").task_input
    assert grammar.task_names(stack) == ("red_box", "blue_box", "green_box")
    assert grammar.task_mentions(stack) == ("red_box", "blue_box", "green_box", "red_box")
    assert grammar.task_units(ARM, stack) == 2  # two "pick up"
    assert grammar.task_names("Scene: [countertop_1 x:0.48] Task: [Q] Are there keys and a wallet?") == (
        "countertop", "keys", "wallet")  # a scene object without its number
    assert grammar.task_names("Task: Drop it in the pen holder.") == ("pen_holder",)  # the whole name
    assert grammar.leading_skills(DRONE, "Scene: [] Task: [A] Move up and take a photo.") == ("mu",)
    assert grammar.leading_skills(DRONE, "Scene: [] Task: [A] Turn left, then fly back.") == ("tu",)
    assert grammar.leading_skills(DRONE, "Scene: [] Task: [A] Look for the moon.") == ()
    assert grammar.task_units(ARM, "Task: tidy up") == 1 and grammar.task_units(ARM, "pick " * 20) == 6


@pytest.mark.parametrize(("task", "names"), [
    ("Scene: [] Task: [A] Turn left 45 degrees, then move back 60 cm.", ()),  # adverbs of direction
    ("Scene: [] Task: [A] Put the green ball back in the box.", ("green_ball", "box")),  # ... at a name's end
    ("Scene: [] Task: [A] Fly to the left shelf.", ("left_shelf",)),  # ... before a name word, part of it
    ("Scene: [] Task: [A] Fly a square, then do two clockwise rotations.", ()),  # the shapes of a path
    ("Scene: [] Task: [A] Go down twice, looking for the lost ring.", ("lost_ring",)),  # a verb's -ing form
    ("Scene: [] Task: [A] Circle the landing pad once more.", ("landing_pad",)),  # ... not inside a name
    ("Scene: [] Task: [A] Gather the pen and the cup.", ("pen", "cup")),  # a verb
])
def test_object_names_are_noun_phrases_not_directions_manoeuvres_or_verbs(task: str, names: tuple) -> None:
    assert grammar.task_names(task) == names


def test_a_number_before_a_thing_is_a_count_and_an_ing_form_asks_for_its_skill() -> None:
    assert ta.counts("Scene: [] Task: [A] Take 3 photos of the statue.") == (3,)
    assert ta.counts("Scene: [] Task: [A] Rise 30 cm, wait 2 seconds.") == ()  # amounts, not counts
    assert grammar.counted_skill(DRONE, "Scene: [] Task: [A] Take 3 photos of the statue.") == "tp"
    assert grammar.asked_skill(DRONE, "Scene: [] Task: [A] Fly up, taking a photo.") == "tp"
    assert ta.count_scope("Scene: [] Task: [A] Go up twice, taking a photo each time.") == (True, False)
    assert ta.count_scope("Scene: [] Task: [A] Go up twice and afterwards look for the cat.") == (False, True)
    assert ta.count_scope("Scene: [] Task: [A] Go up twice.") == (False, False)


def test_a_clause_of_time_leads_in_its_order_and_turns_said_in_words_bound_the_degrees() -> None:
    lead = grammar.leading_skills
    assert lead(DRONE, "Scene: [] Task: [A] After climbing 50 cm, search for a hat.") == ("mu",)
    assert lead(DRONE, "Scene: [] Task: [A] Before you photograph the vase, go down 40 cm.") == ("md",)
    assert lead(DRONE, "Scene: [] Task: [A] After you turn left, take a photo.") == ("tu",)
    amounts = {"Spin around on the spot twice.": {"deg": (360,)},
               "Make a full turn in four steps and take a photo after every step.": {"deg": (90,)},
               "Turn around, then fly back 50 cm.": {"deg": (180,), "cm": (50,)},
               "Do a quarter turn.": {"deg": (90,)},
               "Turn a full circle in three steps of 100 degrees.": {"deg": (100,)},  # stated degrees come first
               "Turn right.": {}}
    for task, want in amounts.items():
        assert ta.amounts(f"Scene: [] Task: [A] {task}") == want, task
    r = grammar.plan_regex(DRONE, "Scene: [] Task: [A] Spin around on the spot twice.")
    assert re.fullmatch(r, "2{tc(360);};") and not re.fullmatch(r, "2{tc(2);};")


def test_the_arm_grammar_takes_roles_from_the_sentence_and_the_drone_grammar_counts_as_loops():
    both = "Scene: [], Task: [A] Into the sink, put the spoon and the fork."
    r = grammar.plan_regex(ARM, both)
    assert re.fullmatch(r, "move_to('spoon');pick('spoon');move_to('sink');place('sink');"
                           "move_to('fork');pick('fork');move_to('sink');place('sink');")
    assert not re.fullmatch(r, "move_to('sink');pick('sink');move_to('spoon');place('spoon');")
    src = "Scene: [], Task: [A] Move the key from the hook to the bowl."
    assert grammar.plan_regex(ARM, src) == grammar.plan_regex(ARM, "Scene: [], Task: [A] Move the key to the bowl.")
    turns = "Scene: [] Task: [A] Turn right in three steps, then take two photos of the kite."
    r = grammar.plan_regex(DRONE, turns)
    assert re.fullmatch(r, "tc(120);3{tc(120);};2{tp();}") or re.fullmatch(r, "3{tc(120);};2{tp();};")
    assert not re.fullmatch(r, "4{tc(90);};tp();")  # no loop count the task does not ask for
    assert grammar.task_names("Scene: [] Task: [Q] Is the garage door shut?") == ("garage_door",)
    assert grammar.task_names("Scene: [] Task: [A] Spin around on the spot twice.") == ("spot",)


@pytest.mark.parametrize(("task", "looped", "refused"), [
    ("Scene: [] Task: [A] Fly up 40 cm three times, then take a picture.", "3{mu(40);};tp();",
     "mu(40);mu(40);mu(40);tp();"),
    ("Scene: [kite_1 x:0.5] Task: [A] Snap four pictures of the kite.", "?iv('kite')==True{g('kite');};4{tp();}",
     "?iv('kite')==True{tp();tp();tp();tp();}"),
    ("Scene: [] Task: [A] Turn around twice.", "2{tc(180);}", "tc(180);"),  # turning around: 180 degrees
    ("Scene: [] Task: [A] Turn right 90 degrees in four steps and take a photo after each.", "4{tc(90);tp();}",
     "tc(90);tp();"),
])
def test_a_count_is_a_loop_of_the_skill_it_repeats(task: str, looped: str, refused: str) -> None:
    r = grammar.plan_regex(DRONE, task)
    assert re.fullmatch(r, looped) and not re.fullmatch(r, refused)
    assert not re.fullmatch(r, re.sub(r"[0-9]\{", "9{", looped))  # no count the task does not ask for
    # resumed inside a conditional block, the counted skill still waits for its loop
    rest = grammar.continuation_regex(DRONE, "?iv('kite')==True{", task)
    counted = grammar.counted_skill(DRONE, task)
    assert not re.fullmatch(rest, f"{counted}();}}") and not re.fullmatch(rest, f"{counted}(90);}}")


def test_a_count_s_loop_repeats_a_small_pattern_and_comes_first_when_the_task_begins_with_it() -> None:
    up = "Scene: [] Task: [A] Fly up 40 cm three times, then take a picture."
    r = grammar.plan_regex(DRONE, up)
    assert re.fullmatch(r, "3{mu(40);};tp();") and re.fullmatch(r, "3{mu(40);d(1);};tp();")
    for wrong in ("tp();3{mu(40);};",  # the task begins with the counted move
                  "3{mu(40);tp();};",  # "then take a picture": one picture, after the loop
                  "3{mu(40);};",  # ... and not none: the asked skill is not lost to the count's
                  "3{tp();mu(40);};",  # the count's loop begins with the call it counts
                  "3{mu(40);l('going up');};",  # no log, no call on a name in the count's loop
                  "3{mu(40);tp();tp();};",  # one call at most each side of the counted one
                  "2{tp();};3{mu(40);};",  # no other loop before the count's
                  "3{mu(40);};3{tp();};"):  # nor one after it: the task has one count
        assert not re.fullmatch(r, wrong), wrong
    rest = grammar.continuation_regex(DRONE, "3{mu(40);", up)
    assert re.fullmatch(rest, "};tp();") and re.fullmatch(rest, "d(1);};tp();") and not re.fullmatch(rest, "d(1);};")
    assert not re.fullmatch(rest, "l('up');};") and not re.fullmatch(rest, "d(1);d(1);};")
    kite = "Scene: [kite_1 x:0.5] Task: [A] Snap four pictures of the kite."
    assert not re.fullmatch(grammar.plan_regex(DRONE, kite), "?iv('kite')==True{g('kite');};4{g('kite');tp();}")


def test_a_count_keeps_what_the_task_asks_beside_it_on_each_repeat_or_after_the_loop() -> None:
    each = "Scene: [] Task: [A] Fly forward 30 cm four times, taking a photo after each move."
    r = grammar.plan_regex(DRONE, each)
    assert re.fullmatch(r, "4{mf(30);tp();};")
    for wrong in ("4{mf(30);};", "4{mf(30);};tp();", "4{mf(30);d(1);};"):  # a photo on each repeat, in the loop
        assert not re.fullmatch(r, wrong), wrong
    assert re.fullmatch(grammar.continuation_regex(DRONE, "4{mf(30);", each), "tp();};")
    assert not re.fullmatch(grammar.continuation_regex(DRONE, "4{mf(30);", each), "};")
    cases = [  # (task, a plan, a plan refused, a plan so far, its rest, a rest refused)
        # the task goes on after its count: a statement after the loop, which the continuation keeps too
        ("Scene: [] Task: [A] Turn right 45 degrees two times, then look for the exit sign.",
         "2{tc(45);};?s('exit_sign')==True{g('exit_sign');};", "2{tc(45);};",
         "2{tc(45);}", ";?s('exit_sign')==True{g('exit_sign');};", ";"),
        # after the loop, a test whose block makes the asked call (a log)
        ("Scene: [] Task: [A] Rise 20 cm twice, then tell me if you see the door.",
         "2{mu(20);};?iv('door')==True{l('the door is there');};", "2{mu(20);};?iv('door')==True{g('door');};",
         "2{mu(20);};?iv('door')==True{g('door');", "l('the door is near');};", "};")]
    for task, plan, refused, done, rest, refused_rest in cases:
        r = grammar.plan_regex(DRONE, task)
        assert re.fullmatch(r, plan) and not re.fullmatch(r, refused), task
        cont = grammar.continuation_regex(DRONE, done, task)
        assert re.fullmatch(cont, rest) and not re.fullmatch(cont, refused_rest), task
    dog = "Scene: [] Task: [A] Fly backward 50 cm twice, then find the dog."  # the test is on what it names
    r = grammar.plan_regex(DRONE, dog)
    assert re.fullmatch(r, "2{mb(50);};?s('dog')==True{g('dog');};") and not re.fullmatch(r, "2{mb(50);};tp();")
    again = "Scene: [] Task: [A] Go forward 25 cm, pause for two seconds, and do it once more."
    assert ta.counts(again) == (2,) and ta.counts("Scene: [] Task: [A] Rise, then do that two more times.") == (3,)
    assert re.fullmatch(grammar.plan_regex(DRONE, again), "2{mf(25);d(2);};")
    # a count that points back repeats what its sentence said before it, in order
    square = "Scene: [] Task: [A] Go forward 100 cm, then turn right 90 degrees, and do that four times."
    assert grammar.counted_skills(DRONE, square) == ("mf", "tc")
    r = grammar.plan_regex(DRONE, square)
    assert re.fullmatch(r, "4{mf(100);tc(90);};") and not re.fullmatch(r, "mf(100);4{tc(90);};")
    assert re.fullmatch(grammar.continuation_regex(DRONE, "4{mf(100);", square), "tc(90);};")
    lead = "Scene: [] Task: [A] Go up 30 cm and take three pictures."  # another skill's count keeps the lead
    r = grammar.plan_regex(DRONE, lead)
    assert re.fullmatch(r, "mu(30);3{tp();};") and not re.fullmatch(r, "3{tp();};")


def test_stated_amounts_bound_the_arguments_of_their_unit_and_a_log_is_never_one_word() -> None:
    task = "Scene: [] Task: [A] Fly forward 80 cm, turn left 30 degrees, then say what you see."
    r = grammar.plan_regex(DRONE, task)
    assert re.fullmatch(r, "mf(80);tu(30);l('i see a door');")
    assert not re.fullmatch(r, "mf(50);tu(30);l('i see a door');")  # 50 cm: the task says 80
    assert not re.fullmatch(r, "mf(80);tu(90);l('i see a door');")  # 90 degrees: the task says 30
    assert not re.fullmatch(r, "mf(80);tu(30);l('door');")  # a fragment
    free = grammar.plan_regex(DRONE, "Scene: [] Task: [A] Fly forward, then turn left.")  # no amount: free
    assert re.fullmatch(free, "mf(50);tu(90);")
    two = "Scene: [countertop_1 x:0.48] Task: [Q] Are there keys and a wallet on the countertop?"
    r = grammar.plan_regex(DRONE, two)  # an answer is more than the object's name
    assert re.fullmatch(r, KEYS_WALLET)
    assert not re.fullmatch(r, "?iv('keys')==True{l('keys');}")
    assert not re.fullmatch(r, "?iv('keys')==True{l('the keys');}")


KEYS_WALLET = ("?iv('keys')==True{l('the keys are here');};?iv('keys')==False{l('no keys here');};"
               "?iv('wallet')==True{l('the wallet is here');};?iv('wallet')==False{l('no wallet');}")


def test_a_question_is_answered_on_every_outcome_once_and_a_speech_act_is_said() -> None:
    q = "Scene: [shelf_1 x:0.5] Task: [Q] Are a cup and a spoon on the shelf?"
    r = grammar.plan_regex(DRONE, q)
    cup = "?iv('cup')==True{l('the cup is there');};?iv('cup')==False{l('no cup here');g('cup');}"
    spoon = "?iv('spoon')==True{l('a spoon is there');};?iv('spoon')==False{l('no spoon here');}"
    assert re.fullmatch(r, cup + ";" + spoon)
    assert not re.fullmatch(r, "l('the cup is on the shelf');l('the spoon is on the shelf');")  # said unseen
    assert not re.fullmatch(r, cup + ";" + spoon.split(";")[0] + ";")  # the spoon missing answers no
    assert not re.fullmatch(r, cup + ";" + cup + ";" + spoon)  # an answer said twice
    assert not re.fullmatch(r, cup.replace("no cup here", "the cup is here") + ";" + spoon)  # "yes" on False
    assert not re.fullmatch(r, cup.replace("the cup is there", "no cup there") + ";" + spoon)  # "no" on True
    by = grammar.plan_regex(DRONE, "Scene: [gate_1 x:0.5] Task: [Q] Are the bike and the ball by the gate?")
    bike = "?iv('bike')==True{l('the bike is here');};?iv('bike')==False{l('no bike here');}"
    ball = "?iv('ball')==True{l('the ball is here');};?iv('ball')==False{l('no ball here');}"
    assert re.fullmatch(by, bike + ";" + ball)  # in the order asked; the gate is where, not what is asked
    assert not re.fullmatch(by, ball + ";" + bike)
    rest = grammar.continuation_regex(DRONE, "?iv('cup')==True{l('the cup is there');};?iv('cup')==False{", q)
    assert re.fullmatch(rest, "l('no cup here');};" + spoon) and not re.fullmatch(rest, "l('no spoon here');}")
    warn = "Scene: [] Task: [A] Find the painter and warn him about the wet paint."
    r = grammar.plan_regex(DRONE, warn)
    assert re.fullmatch(r, "?s('painter')==True{g('painter');l('careful the paint is wet');}")
    assert not re.fullmatch(r, "?s('painter')==True{g('painter');}")  # found him, said nothing


def test_an_emergency_resumes_the_plan_it_was_given_unless_it_fled_the_other_way() -> None:
    dog = ("Scene: [dog x:0.5] Task: [E] You provided me with plan ml,100, but I encountered a failure because a "
           "dog is attempting to catch me. Execution history: ml(50)")
    r = grammar.plan_regex(DRONE, dog)
    assert re.fullmatch(r, "mu(100);ml(100);") and re.fullmatch(r, "mb(80);ml(50);")  # the given move, 50-100
    assert not re.fullmatch(r, "mb(100);mf(100);") and not re.fullmatch(r, "mu(100);ml(30);")
    assert not re.fullmatch(r, "mu(100);")
    assert re.fullmatch(r, "mr(100);mf(50);")  # fled right, against the given left: the rest is the plan's
    heads = dict(grammar.plan_head(DRONE, dog))
    assert re.fullmatch(heads["mu"], "(100);ml(100);") and not re.fullmatch(heads["mu"], "(100);mf(100);")
    rest = grammar.continuation_regex(DRONE, "mu(100);", dog)
    assert re.fullmatch(rest, "ml(60);") and not re.fullmatch(rest, "mf(60);")


def test_what_a_task_asks_for_if_it_finds_something_is_done_on_finding_it() -> None:
    book = "Scene: [cabinet_1 x:0.5] Task: [A] Fly up, and if you see a book on the cabinet, take a picture of it."
    r = grammar.plan_regex(DRONE, book)
    assert re.fullmatch(r, "mu(50);?iv('book')==True{tp();}")
    assert not re.fullmatch(r, "mu(50);?iv('book')==False{l('no book here');tp();}")  # a photo of no book
    assert not re.fullmatch(r, "mu(50);tp();")  # whether or not it is there
    assert not re.fullmatch(r, "mu(50);?iv('book')==True{l('a book is here');};?iv('book')==True{tp();}")  # twice
    rest = grammar.continuation_regex(DRONE, "mu(50);?iv('book')==True{", book)
    assert re.fullmatch(rest, "tp();}") and re.fullmatch(rest, "l('a book is here');tp();}")
    assert not re.fullmatch(rest, "l('a book is here');}")  # found it, and no photo
    assert not re.fullmatch(rest, "l('a book is here');l('a book is here');tp();}")  # chatter before the photo
    keys = "Scene: [] Task: [A] If you don't find the keys on the desk, tell me."  # on not finding: either test
    assert re.fullmatch(grammar.plan_regex(DRONE, keys), "?iv('keys')==False{l('the keys are not here');}")


def test_the_counted_skill_is_read_from_the_count_s_sentence() -> None:
    c = grammar.counted_skill
    assert c(DRONE, "Scene: [] Task: [A] Go down 30 cm twice and look for the cat.") == "md"  # named before
    assert c(DRONE, "Scene: [] Task: [A] Three times, take a photo of the sky.") == "tp"  # named after
    assert c(DRONE, "Scene: [] Task: [A] Fly to the car and shoot five photographs.") == "tp"  # the thing counted
    assert c(DRONE, "Scene: [] Task: [A] Look for two dogs. Then move up.") is None  # not in its sentence
    assert c(DRONE, "Scene: [] Task: [A] Move up 50 cm.") is None  # no count
    assert c(DRONE, "Scene: [] Task: [A] Rotate counterclockwise in three steps.") == "tu"  # the skill's phrases
    assert c(DRONE, "Scene: [] Task: [A] Lower yourself 30 cm two times.") == "md"
    assert grammar.asked_skill(DRONE, "Scene: [] Task: [A] Rise, then snap a picture.") == "tp"


def test_no_movement_by_an_amount_unless_asked_and_a_question_ends_once_answered():
    photo = "Scene: [window_1 x:0.6] Task: [A] Look for a kite near the window and take a photo of it."
    r = grammar.plan_regex(DRONE, photo)
    assert re.fullmatch(r, "?s('kite')==True{g('kite');tp();}")
    assert not re.fullmatch(r, "md(100);?s('kite')==True{tp();}")
    assert re.fullmatch(grammar.plan_regex(DRONE, "Scene: [] Task: [A] Fly up and take a photo of the kite."),
                        "mu(50);?iv('kite')==True{tp();}")
    q = "Scene: [] Task: [Q] Is there a kite on the roof?"  # one object: two statements, one per outcome
    r = grammar.plan_regex(DRONE, q)
    yes_no = "?iv('kite')==True{l('a kite is on the roof');};?iv('kite')==False{l('no kite on the roof');}"
    assert re.fullmatch(r, yes_no) and not re.fullmatch(r, yes_no + ";?iv('kite')==False{l('no kite here');}")
    assert grammar.continuation_regex(DRONE, yes_no + ";", q) == "(?:)"
    down = "Scene: [chair_2 x:0.45] Task: [A] Fly down and look for a kite under the chair."  # move + 2 outcomes
    r = grammar.plan_regex(DRONE, down)
    assert re.fullmatch(r, "md(40);" + yes_no) and not re.fullmatch(r, "md(40);" + yes_no + ";tp();")
    two = "Scene: [countertop_1 x:0.48] Task: [Q] Are there keys and a wallet on the countertop?"
    r = grammar.plan_regex(DRONE, two)  # an answer under a test names the object tested, no other
    assert re.fullmatch(r, KEYS_WALLET)
    assert not re.fullmatch(r, KEYS_WALLET.replace("no keys here", "no wallet on the countertop"))
    rest = grammar.continuation_regex(DRONE, KEYS_WALLET.split("False{")[0] + "False{", two)
    assert re.fullmatch(rest, KEYS_WALLET.split("False{", 1)[1]) and not re.fullmatch(rest, "l('no wallet here');}")


def test_the_arm_grammar_takes_the_task_s_objects_in_the_order_it_mentions_them():
    fruit = next(t for t in TEMPLATES if t.name == "fruit_vegetable_sorting")
    r = grammar.plan_regex(ARM, fruit.task_input)
    right = fruit.plan.replace("take", "pick").replace("drop", "place")
    assert re.fullmatch(r, right)
    units = right.split(";")[:-1]
    assert not re.fullmatch(r, ";".join(units[:8]) + ";")  # three "pick up": all three units
    swapped = right.replace("place('carrot')", "place('lemon')").replace("move_to('carrot')", "move_to('lemon')")
    assert not re.fullmatch(r, swapped)  # the apple goes where the task says, not to a later name
    # a task whose verbs outnumber what its mentions allow gets fewer units rather than no plan
    two = "Scene: [], Task: Pick up the cup and put it in the sink."
    assert re.fullmatch(grammar.plan_regex(ARM, two), "move_to('cup');pick('cup');move_to('sink');place('sink');")


def test_an_emergency_plan_starts_by_moving_away_and_every_plan_ends():
    task = "Scene: [dog x:0.48] Task: [E] a dog is attempting to catch me. Execution history: ml(50)"
    r = grammar.plan_regex(DRONE, task)
    assert re.fullmatch(r, "mu(100);ml(100);") and re.fullmatch(r, "mb(80);")
    assert not re.fullmatch(r, "mf(50);mu(100);") and not re.fullmatch(r, "d(1);mu(100);")
    assert not re.fullmatch(r, "mu(100);" * 7)  # max_statements
    assert grammar.continuation_regex(DRONE, "mu(100);" * 6, task) == "(?:)"  # nothing but the end


def test_the_prompt_library_fits_its_grammars_and_copies_no_task_we_judge_plans_on():
    held_out = [t.task_input for f in (HELD_OUT, HELD_OUT.with_name("phrasings.yaml"))
                for t in plan_templates(str(f)).values()]

    def words(text: str) -> set[str]:  # what a task is about: its words but the function words and the
        # boilerplate of a failure report ("You provided me with plan ..."), which every [E] task shares
        return set(re.findall(r"[a-z]{2,}", text.lower().split("task:")[-1])) - grammar.STOPWORDS - set(DRONE.names)

    for rt, examples in LIBRARY.items():
        cfg = PromptConfig.load(rt)
        assert cfg.shots is not None and cfg.shots < len(examples)
        for ex in examples:
            assert re.fullmatch(grammar.plan_regex(SETS[rt], ex["input"]), ex["plan"]), ex
            for judged in [t.task_input for t in TEMPLATES] + held_out:
                a, b = words(ex["input"]), words(judged)
                assert len(a & b) < 3 or len(a & b) / len(a | b) < 0.5, (ex["input"], judged)  # a copy


def test_a_malformed_plan_structure_is_refused_naming_the_field():
    base = {"id": "t", "robot_type": "t", "segmenter": "semicolon", "lmax": 5,
            "skills": [{"name": "pick", "args": [{"name": "o", "type": "str", "from_task": True}],
                        "exec_time": {"model": "constant", "value": 1.0}},
                       {"name": "wait", "args": [{"name": "s", "type": "int", "min": 0, "max": 5}],
                        "exec_time": {"model": "constant", "value": 1.0}}]}
    cases = [({"unit": ["pick($a)", "wait($a)"]}, r"plan_structure.unit\[1\]: wait takes no single string"),
             ({"unit": ["pick($a)", "pick($b)", "pick($a)"]}, r"\$a must be used by consecutive calls only"),
             ({"unit": ["fly($a)"]}, r"unknown skill 'fly'"),
             ({"first_by_tag": {"E": ["jump"]}}, r"first_by_tag.E: unknown skill 'jump'"),
             ({"order": "random"}, r"plan_structure.order")]
    for structure, msg in cases:
        with pytest.raises(SkillSetError, match=msg):
            skill_set_from_dict(dict(base, plan_structure=structure))
    bad_arg = dict(base, skills=[dict(base["skills"][1], args=[{"name": "s", "type": "int", "from_task": True}])])
    with pytest.raises(SkillSetError, match=r"from_task: only string arguments name things, this one is int"):
        skill_set_from_dict(bad_arg)


def test_llguidance_takes_the_task_grammars_as_python_does():
    """vLLM hands our regexes to llguidance (structured_outputs_config.backend guidance): a plan Python's re
    matches is one llguidance lets the model write, token by token, and it refuses what re refuses."""
    import llguidance
    import llguidance.hf
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(paths.share_dir() / "models" / "SmolLM2-135M-Instruct"))
    info = llguidance.hf.from_tokenizer(tok)

    def accepts(regex: str, text: str) -> bool:
        m = llguidance.LLMatcher(info, llguidance.LLMatcher.grammar_from_regex(regex))
        assert not m.is_error(), m.get_error()
        ok = all(m.consume_token(t) for t in tok.encode(text, add_special_tokens=False))
        return ok and m.is_accepting()

    for t in TEMPLATES:
        ss = SETS[t.robot_type]
        r = grammar.plan_regex(ss, t.task_input)
        plan = t.plan.replace("take(", "pick(").replace("drop(", "place(")
        assert accepts(r, plan) == bool(re.fullmatch(r, plan)), t.name
        assert not accepts(r, "fly_away();")
    cut = grammar.continuation_regex(DRONE, "mu(100);" * 6, "Scene: [] Task: [E] a wasp")
    assert accepts(cut, "") and not accepts(cut, "mu(100);")


@pytest.mark.parametrize("robot_type", ["drone", "arm"])
def test_a_plan_split_after_its_first_skill_s_name_is_the_same_language(robot_type):
    """plan_head: for each skill a task's plan must begin with, its name and the regex of the rest. name + rest
    over the pairs is plan_regex's language, both ways; a task whose plan may begin anyhow has no head."""
    ss = SETS[robot_type]
    heads = {t: grammar.plan_head(ss, t) for t in TASKS[robot_type]}
    assert all(not h for h in heads.values()) if robot_type == "arm" else sum(bool(h) for h in heads.values()) >= 5

    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data(), task=st.sampled_from([t for t, h in heads.items() if h] or [None]))
    def check(data, task):
        if task is None:
            return
        head, top = heads[task], grammar.plan_regex(ss, task)
        plan = data.draw(st.from_regex(top, fullmatch=True))
        assert any(plan.startswith(n) and re.fullmatch(r, plan[len(n):]) for n, r in head), (task, plan)
        name, rest = data.draw(st.sampled_from(head))
        plan = name + data.draw(st.from_regex(rest, fullmatch=True))
        assert re.fullmatch(top, plan), (task, plan)

    check()


def test_llguidance_asks_for_an_emergency_plan_s_first_skill_as_one_token():
    """PromptBuilder.head_grammar_for: the Lark grammar vLLM's guidance backend gets for a plan's start. It takes
    the plans the regex takes when the first skill is its one token, and refuses that skill spelled letter by
    letter (the model did so under the regex: m, b), and a first skill the task rules out."""
    import llguidance
    import llguidance.hf
    from transformers import AutoTokenizer

    from timelyllm_ros.engines.prompts import PromptBuilder

    tok = AutoTokenizer.from_pretrained(str(paths.share_dir() / "models" / "SmolLM2-135M-Instruct"))
    info = llguidance.hf.from_tokenizer(tok)
    pb = PromptBuilder(tok, "drone")
    task = "Scene: [dog x:0.48] Task: [E] a dog is attempting to catch me. Execution history: ml(50)"
    lark = pb.head_grammar_for(task)("")
    assert lark and pb.head_grammar_for("Scene: [] Task: [A] find the cat") is None

    def accepts(tokens: list[int]) -> bool:
        m = llguidance.LLMatcher(info, llguidance.grammar_from("grammar", lark))
        assert not m.is_error(), m.get_error()
        return all(m.consume_token(t) for t in tokens) and m.is_accepting()

    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    for plan in ("mb(100);", "mu(50);mf(30);", "ml(40);?s('dog')==True{mr(60);};"):
        assert re.fullmatch(pb.regex_for(task)(""), plan)
        assert accepts(enc(plan)), plan
    assert enc("mb") == [tok.convert_tokens_to_ids("mb")]
    assert not accepts(enc("m") + enc("b(100);"))  # the name spelled letter by letter
    assert not accepts(enc("mf(100);"))  # not an evasive move
    assert not accepts(enc("mb(100)"))  # unfinished: the regex's rest still applies


def test_a_plan_of_free_calls_resumes_under_free_calls_even_where_it_began_like_a_unit():
    """One name only: no pick-and-place unit fits (its object and place are distinct), so the arm's whole grammar
    is free calls. A plan that happens to begin like a unit must go on under those, not under the unit's rest
    (found by the property test above: 'sc();' fitted the whole grammar but not the continuation)."""
    ss = SETS["arm"]
    task, done = "Task: Put the lid away.", "move_to('lid');pick('lid');"  # 'away' names nothing
    assert re.fullmatch(grammar.plan_regex(ss, task), done + "sc();")
    assert re.fullmatch(grammar.continuation_regex(ss, done, task), "sc();")


def test_a_task_grammar_is_the_same_text_in_every_process() -> None:
    # The arm's free coordinates list their literals; in hash order they differed between processes (the
    # same language, but not the same text for a grammar cache or a comparison across runs).
    code = ("from timelyllm_ros.skills import grammar; from timelyllm_ros.skills.skill_files import load_skill_set;"
            "print(grammar.plan_regex(load_skill_set('arm'), 'Scene: [] Task: [A] Rise twice.'))")
    texts = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                            capture_output=True, text=True, check=True).stdout for seed in ("1", "2", "3")}
    assert len(texts) == 1 and "move_to" in texts.pop()
