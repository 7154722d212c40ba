"""The strict judge (skills/quality.py, ``judge(..., task=...)``) and the task analysis it reads tasks with
(skills/task_analysis.py): hand-written plans and tasks, no model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from timelyllm_ros.domain.plans import plan_templates
from timelyllm_ros.engines.prompts import PromptConfig
from timelyllm_ros.skills import task_analysis as ta
from timelyllm_ros.skills.quality import judge, template_spec
from timelyllm_ros.skills.skill_files import load_skill_set
from timelyllm_ros.skills.task_names import STOPWORDS

DRONE = load_skill_set("drone")
ARM = load_skill_set("arm")
HELD_OUT = ("bench/heldout/plans.yaml", "bench/heldout/phrasings.yaml")


def _strict(plan: str, task: str, ss=DRONE) -> tuple[str, ...]:
    v = judge(plan, ss, None, task=task)
    assert v.valid, v.error
    return v.failures


def _checks(failures: tuple[str, ...]) -> set[str]:
    return {f.split(":")[0] for f in failures}


@pytest.mark.parametrize("path", [None, *HELD_OUT])
def test_every_reference_plan_passes_the_strict_judge(path) -> None:
    for t in plan_templates(path).values():
        ss = load_skill_set(t.robot_type)
        v = judge(t.plan, ss, template_spec(t, ss), task=t.task_input)
        assert v.acceptable, (t.name, v)


@pytest.mark.parametrize("robot_type", ["drone", "arm"])
def test_every_example_of_the_prompt_library_passes_the_strict_judge(robot_type: str) -> None:
    """The small model copies its examples: none may show what the strict judge refuses."""
    ss = load_skill_set(robot_type)
    for ex in PromptConfig.load(robot_type).examples:
        v = judge(ex["plan"], ss, None, task=ex["input"])
        assert v.acceptable, (ex, v)


def test_without_the_task_the_judge_is_the_old_one() -> None:
    plan = "?iv('keys')==True{l('the wallet is there');}"
    assert judge(plan, DRONE, None).acceptable
    assert not judge(plan, DRONE, None, task="Task: [Q] Are there keys and a wallet on the countertop?").acceptable


# -- repeat ----------------------------------------------------------------------------------------------------------
def test_identical_statements_back_to_back_are_refused_at_any_block_level() -> None:
    task = "Task: [A] Look for a plant and take a photo of it."
    assert "repeat" in _checks(_strict("?s('plant')==True{l('a plant');l('a plant');tp();}", task))
    assert "repeat" in _checks(_strict("?s('plant')==True{tp();};?s('plant')==True{tp();}", task))
    assert "repeat" not in _checks(_strict("?s('plant')==True{tp();g('plant');tp();}", task))  # not back to back


@given(k=st.integers(2, 5), asked=st.integers(2, 5))
def test_a_run_of_identical_calls_is_accepted_only_as_the_count_the_task_asks_for(k: int, asked: int) -> None:
    word = {2: "two", 3: "three", 4: "four", 5: "five"}[asked]
    fails = _checks(_strict("tp();" * k, f"Task: [A] Take {word} pictures."))
    assert ("repeat" in fails) == (k != asked)
    assert ("count" in fails) == (k != asked)


def test_a_loop_body_may_repeat_and_a_loop_honours_the_count() -> None:
    task = "Task: [A] Spin around twice."
    assert "count" not in _checks(_strict("2{tc(180);tc(180);}", task))
    assert _checks(_strict("2{tc(360);}", task)) == set()
    assert _checks(_strict("tc(360);tc(360);", task)) == set()
    assert "count" in _checks(_strict("tc(360);", task))


# -- log -------------------------------------------------------------------------------------------------------------
def test_fragment_logs_and_the_same_log_twice_are_refused() -> None:
    task = "Task: [A] Find the dog and tell me where it is."
    assert "log" in _checks(_strict("?s('dog')==True{l('dog');}", task))  # a one-word fragment
    assert "log" in _checks(_strict("?s('dog')==True{l('');}", task))
    assert "log" in _checks(_strict("?s('dog')==True{l('the dog is here');g('dog');l('the dog is here');}", task))
    assert "log" not in _checks(_strict("?s('dog')==True{l('the dog is in front of me');}", task))
    # a bare yes answers a question; a greeting is a whole utterance
    assert "log" not in _checks(_strict("?iv('dog')==True{l('yes');};?iv('dog')==False{l('no');}",
                                         "Task: [Q] Is there a dog?"))
    assert "log" not in _checks(_strict("?s('person')==True{l('Hello!');}", "Task: [A] Say hello to a person."))


def test_an_answer_names_only_what_its_conditions_observed() -> None:
    task = "Scene: [countertop_1 x:0.48] Task: [Q] Are there keys and a wallet on the countertop?"
    fails = _strict("?iv('keys')==True{l('the wallet is there');};?iv('keys')==False{l('no keys');}", task)
    assert any(f.startswith("log:") and "wallet" in f for f in fails)
    ok = ("_1=iv('keys');_2=iv('wallet');?_1==True&_2==True{l('the keys and the wallet are there');};"
          "?_1==False|_2==False{l('not both are there');}")
    assert _strict(ok, task) == ()  # variables are read through their assignment


# -- names -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("task", "bad", "good"), [
    ("Task: [Q] Is the garage door shut?", "garage_door_shut", "garage_door"),  # an adjective of state
    ("Task: [A] Spin around on the spot twice.", "spin", "spot"),  # a verb
    ("Task: [Q] Are both the umbrella and the coat by the door?", "both", "umbrella"),  # a number word
    ("Task: [A] Find my backpack.", "bag", "backpack"),  # not in the task at all
])
def test_object_names_must_be_noun_phrases_of_the_task(task: str, bad: str, good: str) -> None:
    assert "names" in _checks(_strict(f"?iv('{bad}')==True{{g('{bad}');}}", task))
    assert "names" not in _checks(_strict(f"?iv('{good}')==True{{g('{good}');}}", task))


def test_scene_names_count_as_names_and_the_arm_is_judged_the_same_way() -> None:
    task = "Scene: [tray x:0.5 y:0.0], Task: [A] Put the can away."
    assert "names" not in _checks(_strict("move_to('can');pick('can');move_to('tray');place('tray');", task, ARM))
    fails = _strict("move_to('can');pick('can');move_to('stack');place('stack');", task, ARM)
    assert "names" in _checks(fails)


# -- answer ----------------------------------------------------------------------------------------------------------
def test_a_question_is_answered_on_every_outcome() -> None:
    task = "Task: [Q] Is there a laptop on the sofa?"
    assert "answer" in _checks(_strict("?iv('laptop')==True{l('a laptop is on the sofa');}", task))
    both = "?iv('laptop')==True{l('a laptop is on the sofa');};?iv('laptop')==False{l('no laptop here');}"
    assert "answer" not in _checks(_strict(both, task))
    assert "answer" not in _checks(_strict("_1=p('Is there a laptop on the sofa?');l(_1);", task))
    two = "Task: [Q] Can you see a clock or a mirror?"
    part = "?iv('clock')==True{l('a clock is here');};?iv('mirror')==True{l('a mirror is here');}"
    assert "answer" in _checks(_strict(part, two))  # neither seen: no answer
    assert "answer" not in _checks(_strict(part + ";?iv('clock')==False&iv('mirror')==False{l('neither is here');}",
                                           two))


def test_a_task_that_is_no_question_needs_no_answer_on_each_outcome() -> None:
    assert "answer" not in _checks(_strict("?s('cat')==True{g('cat');l('the cat is here');}",
                                           "Task: [A] Find the cat and go to it."))


# -- unasked ---------------------------------------------------------------------------------------------------------
def test_a_movement_by_an_amount_the_task_does_not_ask_for_is_refused() -> None:
    task = "Task: [A] Look for a plant and take a photo of it."
    assert "unasked" in _checks(_strict("md(100);?s('plant')==True{tp();}", task))
    assert "unasked" not in _checks(_strict("?s('plant')==True{g('plant');tp();}", task))  # going to it is asked
    assert "unasked" not in _checks(_strict("mu(50);?iv('plant')==True{tp();}",
                                            "Task: [A] Fly up and take a photo of the plant."))
    evade = "Scene: [dog x:0.5] Task: [E] You provided me with plan mf,100, but a dog is attempting to catch me."
    assert "unasked" not in _checks(_strict("mu(100);mf(100);", evade))  # an emergency: the evasive check's


# -- the task analysis -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("task", "counts"), [
    ("Spin around on the spot twice.", (2,)),
    ("Make a full turn in four steps and take a photo after every step.", (4,)),
    ("Snap three pictures of the fountain.", (3,)),
    ("Go up by 30 cm two times.", (2,)),
    ("Go up 60 cm and look for the lamp.", ()),  # an amount, not a count
    ("Circle the table 3 times.", (3,)),
])
def test_counts_are_read_from_number_words_before_things_times_and_steps(task: str, counts) -> None:
    assert ta.counts(f"Task: [A] {task}") == counts


ARM_VERBS = set(ARM.plan_structure.unit_verbs) | ta.VERBS


@pytest.mark.parametrize(("task", "moves"), [
    ("Put the lime and the peach in the fruit bowl.", (("lime", "fruit_bowl"), ("peach", "fruit_bowl"))),
    ("Move the stapler from the shelf to the drawer.", (("stapler", "drawer"),)),
    ("Into the recycling bin, drop the can.", (("can", "recycling_bin"),)),
    ("On top of the green block, stack the yellow block.", (("yellow_block", "green_block"),)),
    ("Pick up the cup and drop it on the plate. Then, pick up the bowl and drop it near the cup.",
     (("cup", "plate"), ("bowl", "cup"))),
    ("One at a time, set the red cup, the blue cup and the white cup on the saucer.",
     (("red_cup", "saucer"), ("blue_cup", "saucer"), ("white_cup", "saucer"))),
    ("Pick up the cup.", ()),  # no destination: not read
])
def test_moves_take_roles_from_prepositions_conjunctions_and_pronouns(task: str, moves) -> None:
    assert ta.moves(f"Task: [A] {task}", STOPWORDS - ta.VERBS, ARM_VERBS) == moves


def test_amounts_are_read_by_unit_from_a_whole_number_before_a_unit_word() -> None:
    assert ta.amounts("Scene: [] Task: [A] Go up 30 cm, fly 2 m, turn 90 degrees and wait 3 seconds.") == {
        "cm": (30, 200), "deg": (90,), "s": (3,)}
    assert ta.amounts("Scene: [] Task: [A] Fly 1.5 m forward, take 3 photos.") == {}  # no decimal, no count


def test_a_huge_number_in_a_task_is_no_count_or_amount_and_raises_nothing() -> None:
    huge = "9" * 5000
    assert ta.amounts(f"Task: [A] Fly up {huge} cm.") == {} and ta.counts(f"Task: [A] Turn {huge} times.") == ()
    assert ta.given_plan(f"Task: [E] You provided me with plan mf,{huge}, but a dog. Execution history: mf(1)") == ()

