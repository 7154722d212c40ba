"""The plan-quality checker (timelyllm_ros/skills/quality.py) on hand-written plans: no model, no timings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from timelyllm_ros.domain.plans import plan_templates
from timelyllm_ros.skills.quality import QualitySpec, QualitySpecError, judge, template_spec
from timelyllm_ros.skills.skill_files import load_skill_set

DRONE = load_skill_set("drone")
ARM = load_skill_set("arm")
TEMPLATES = {t.name: t for t in plan_templates().values()}


def _spec(name: str) -> QualitySpec:
    return template_spec(TEMPLATES[name])


def _judge(name: str, plan: str):
    t = TEMPLATES[name]
    return judge(plan, load_skill_set(t.robot_type), _spec(name))


# -- the declared checks -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_every_template_declares_checks_that_its_own_plan_passes(name: str) -> None:
    spec = _spec(name)
    assert not spec.empty, f"{name} declares no quality checks"
    v = _judge(name, TEMPLATES[name].plan)
    assert v.valid and v.acceptable, v


@pytest.mark.parametrize("name", [n for n, t in TEMPLATES.items() if t.level == "urgent"])
def test_urgent_templates_reject_the_long_wait_the_model_copied(name: str) -> None:
    """The issue's complaint: `d(50);` (the 50 of the task text) before the evasive move."""
    v = _judge(name, "d(50);mr(100);")
    assert v.valid and not v.acceptable
    assert any(f.startswith("evasive:") and "50 s pass" in f for f in v.failures), v.failures
    assert any("d(50)" in f and f.startswith("numbers:") for f in v.failures), v.failures


def test_evasive_accepts_a_short_wait_and_refuses_moving_on_first() -> None:
    assert _judge("avoid_human_injury", "d(1);mr(100);mf(100);").acceptable
    assert _judge("avoid_human_injury", "d(3);ml(50);").acceptable  # at the bound
    v = _judge("avoid_human_injury", "mf(100);mr(100);")
    assert [f for f in v.failures if f.startswith("evasive:")] == [
        "evasive: mf(100) moves the robot before it evades (evasive moves: mb, md, ml, mr, mu)"]
    v = _judge("avoid_human_injury", "tp();l('aerial robot');")
    assert v.failures == ("evasive: no evasive move (mb, md, ml, mr, mu)",)


def test_evasive_counts_slow_skills_before_the_move_by_their_typical_time() -> None:
    # s() rotates up to 8 x 1.5 s: its typical time (over 3 s) already breaks the 3 s budget; iv() is instant.
    assert not _judge("prevent_collision", "?s('dog')==True{mu(100)};").acceptable
    assert _judge("prevent_collision", "?iv('dog')==True{mu(100)};").acceptable
    assert not _judge("prevent_collision", "md(100);").acceptable  # down towards the dog: not an escape here


def test_hovering_counts_as_evading_only_where_declared_and_only_briefly() -> None:
    assert _judge("evade_animal", "d(2);mf(100);").acceptable  # let the boy pass, then go on
    assert not _judge("evade_animal", "mf(100);").acceptable  # straight on into him
    assert not _judge("evade_animal", "d(0.5);mf(100);").acceptable  # too short a hover to be the evasion
    assert not _judge("avoid_human_injury", "d(2);mf(100);").acceptable  # no hover_s there: waiting is not evading


def test_sequence_needs_the_calls_in_order_and_aliases_and_spelling_do_not_matter() -> None:
    good = "move_to('red box');take('Red_Box');move_to('blue_box');drop('blue-box');pick('green_box');place('red_box');"
    assert _judge("object_stacking", good).acceptable
    swapped = "pick('green_box');place('red_box');pick('red_box');place('blue_box');"
    v = _judge("object_stacking", swapped)
    assert v.valid and v.failures == ("sequence: no pick('green_box') after place('blue_box')",)
    v = _judge("object_stacking", "pick('red_box');")
    assert v.failures == ("sequence: no place('blue_box') after pick('red_box')",)


def test_require_alternatives_and_number_ranges() -> None:
    assert _judge("find_cat", "?iv('cat')==True{g('cat');}").acceptable  # iv is as good as s here
    assert _judge("find_cat", "?s('cat')==True{g('cat');}").acceptable
    v = _judge("find_cat", "g('cat');")
    assert v.failures == ("sequence: no s('cat') or iv('cat')",)
    v = _judge("book_on_cabinet", "mu(400);?iv('book')==True{tp();}")
    assert v.valid and v.failures == ("numbers: mu(400): distance = 400 outside [20, 150]",)
    v = _judge("keys_or_wallet", "?iv('keys')==True{l('yes');}")
    assert v.failures == ("require: no iv('wallet') or s('wallet')",)


def test_invalid_and_unfinished_plans_are_not_judged_further() -> None:
    v = _judge("find_cat", "pick_up_cat();")
    assert not v.valid and "unknown skill 'pick_up_cat'" in v.error and not v.failures
    v = _judge("book_on_cabinet", "mu(600);?iv('book')==True{tp();}")  # outside the skill's own bounds
    assert not v.valid and "outside [20, 500]" in v.error
    v = judge("mu(50);", DRONE, _spec("book_on_cabinet"), ended=False)
    assert not v.valid and not v.acceptable and "did not end" in v.error


@given(wait=st.floats(min_value=0, max_value=60, allow_nan=False), move=st.sampled_from(["mr", "ml", "mu", "mb"]))
def test_the_wait_bound_is_exactly_max_wait_s(wait: float, move: str) -> None:
    plan = f"d({wait:.2f});{move}(100);"
    v = judge(plan, DRONE, _spec("prevent_collision"))
    assert v.valid
    evasive_ok = not any(f.startswith("evasive:") for f in v.failures)
    assert evasive_ok == (round(wait, 2) <= 3)


# -- bad declarations name the field ---------------------------------------------------------------------------
@pytest.mark.parametrize("raw, words", [
    ({"require": ["fly('x')"]}, "quality.require[0]: \"fly('x')\" is not a call of skill set 'drone_minispec'"),
    ({"require": ["zz"]}, "quality.require[0]: skill set 'drone_minispec' has no skill 'zz'"),
    ({"sequence": "g"}, "quality.sequence: expected a list"),
    ({"numbers": {"iv": [0, 1]}}, "quality.numbers.iv: skill 'iv' takes no number"),
    ({"numbers": {"mf": [5, 1]}}, "quality.numbers.mf: expected [lo, hi] with lo <= hi"),
    ({"evasive": {"moves": ["mr"]}}, "quality.evasive: max_wait_s is required"),
    ({"evasive": {"moves": ["mr"], "max_wait_s": -1}}, "quality.evasive.max_wait_s: expected a number >= 0"),
    ({"evasive": {"moves": ["mr"], "max_wait_s": 1, "hover": [1, 2]}}, "quality.evasive: unknown key(s) ['hover']"),
    ({"musts": []}, "quality: unknown check(s) ['musts']"),
])
def test_bad_quality_blocks_are_refused_naming_the_field(raw: dict, words: str) -> None:
    with pytest.raises(QualitySpecError) as e:
        QualitySpec.from_dict(raw, DRONE)
    assert words in str(e.value)


def test_arm_hover_needs_a_wait_skill() -> None:
    with pytest.raises(QualitySpecError, match="has no wait skill"):
        QualitySpec.from_dict({"evasive": {"moves": ["move_to"], "max_wait_s": 1, "hover_s": [1, 2]}}, ARM)


def test_plans_yaml_refuses_a_quality_block_that_is_no_mapping(tmp_path) -> None:
    src = TEMPLATES["find_cat"]
    bad = tmp_path / "plans.yaml"
    bad.write_text(f"tasks:\n  - trace_id: 0\n    paper_task: 1\n    name: x\n    robot_type: drone\n"
                   f"    trace_robot_type: drone\n    robot_system: typefly\n    level: normal\n"
                   f"    task_input: \"{src.task_input}\"\n    plan: \"{src.plan}\"\n    quality: [g]\n")
    with pytest.raises(ValueError, match="task x: quality must be a mapping"):
        plan_templates(str(bad))


# -- the prompts the checks are measured with -------------------------------------------------------------------
def test_prompt_guidance_must_be_text(tmp_path) -> None:
    """An unquoted guidance line with ': ' is a YAML mapping; its repr once reached the drone prompt."""
    from timelyllm_ros.engines.prompts import PromptConfig, PromptConfigError, prompts_dir

    for p in sorted(prompts_dir().glob("*.yaml")):
        assert all(isinstance(g, str) for g in PromptConfig.load(p).guidance), p
    bad = tmp_path / "drone.yaml"
    bad.write_text("robot_type: drone\nskill_set: drone_minispec\nsystem: x\n"
                   "guidance:\n  - look for it: ?s('cat')==True{g('cat');}\n")
    with pytest.raises(PromptConfigError, match=r"guidance\[0\] must be a string, got dict"):
        PromptConfig.load(bad)
