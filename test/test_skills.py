"""Skill sets: YAML loading/validation, plan parsing and error messages."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from timelyllm_ros.skills.schema import SkillParseError, SkillSet, SkillSetError, Var
from timelyllm_ros.skills.skill_files import load_skill_set, load_skill_set_file, skills_dir

DRONE_SHORT = ["mf", "mb", "ml", "mr", "mu", "md", "tc", "tu", "d", "g", "s", "sa", "iv", "ox", "oy", "ow", "oh",
               "od", "l", "tp", "rp", "p"]


@pytest.fixture(scope="module")
def drone() -> SkillSet:
    return load_skill_set("drone")


@pytest.fixture(scope="module")
def arm() -> SkillSet:
    return load_skill_set("arm")


# -- loading ------------------------------------------------------------------
def test_load_by_id_robot_type_and_path_is_cached() -> None:
    a = load_skill_set("drone_minispec")
    assert load_skill_set("drone") is a
    assert load_skill_set(skills_dir() / "drone_minispec.yaml") is a
    assert a.id == "drone_minispec" and a.robot_type == "drone"
    assert a.segmenter == "minispec" and a.lmax == 10
    arm = load_skill_set("arm")
    assert (arm.segmenter, arm.lmax, arm.grammar) == ("semicolon", 20, "calls")
    chat = load_skill_set("chatbot")
    assert (chat.segmenter, chat.lmax, chat.skills) == ("sentence", 20, ())


def test_unknown_skill_set_names_the_known_ones() -> None:
    with pytest.raises(FileNotFoundError, match="drone_minispec"):
        load_skill_set("submarine")


def test_drone_has_the_minispec_skills(drone: SkillSet) -> None:
    for n in DRONE_SHORT:
        assert n in drone, n
    assert drone["mf"].long_name == "move_forward"
    assert drone.get("move_forward") is drone["mf"]
    mf = drone["mf"].args[0]
    assert (mf.type, mf.min, mf.max) == ("int", 20, 500)
    assert (drone["tc"].args[0].min, drone["tc"].args[0].max) == (1, 360)
    assert drone["iv"].returns == "bool" and drone["ox"].returns == "float"
    assert drone["iv"].kind == "perception" and drone["mf"].kind == "movement"


def test_describe_for_prompt_lists_every_skill(drone: SkillSet, arm: SkillSet) -> None:
    text = drone.describe_for_prompt()
    for s in drone.skills:
        assert f"- {s.name}(" in text
    assert "20..500 cm" in text and "?cond{" in text
    text = arm.describe_for_prompt()
    assert "move_to(x: float -0.8..0.8 m" in text and "take" in text


# -- parsing valid plans --------------------------------------------------------
DESIGN_PLAN = "tc(30);?s('cat')==True{g('cat')};"


def test_parse_design_example(drone: SkillSet) -> None:
    calls = drone.parse(DESIGN_PLAN, complete=True)
    assert [(c.name, c.args, c.role) for c in calls] == [
        ("tc", (30,), "statement"), ("s", ("cat",), "condition"), ("g", ("cat",), "statement")]
    assert calls[0].raw == "tc(30)" and calls[1].raw == "s('cat')" and calls[1].position == 8
    assert all(c.skillset_id == "drone_minispec" for c in calls)
    assert calls[0].long_name == "turn_cw" and calls[0].arg("degrees") == 30


@pytest.mark.parametrize("plan", [
    "?iv('cat')==True{g('cat')};",
    "?ox('cat')>0.6{tc(15)};",
    "_1=ox('cat');?_1>0.6{tc(15)};?_1<0.4{tu(15)};",
    "s('cat');?iv('cat')==True{g('cat');->True};->False;",
    "8{?iv('book')==True{->True}tc(45)}->False;",
    "4{_1=ox('x');?_1>0.6{tc(15)};?_1<0.4{tu(15)};_2=ox('x');?_2<0.6&_2>0.4{->True}}->False;",
    "mu(50);\nmf(100);\nl('done');",
    '?iv("keys")|iv("wallet"){l("found")}',
    "_1=sa('Is there something to cut paper?');?_1!=False{l(_1);g(_1)};",
    "d(1.5);tp();rp();",
    "move_forward(50);turn_cw(90);",  # long names are accepted too
    "mf(distance=50);",
    "?!(iv('cat')==False){mf(20)}",
])
def test_valid_plans(drone: SkillSet, plan: str) -> None:
    assert drone.parse(plan, complete=True)
    assert drone.validate(plan, complete=True) is None


def test_design_segments_parse_as_fragments(drone: SkillSet) -> None:
    assert [c.name for c in drone.parse("?s('cat')==True{")] == ["s"]
    assert [c.name for c in drone.parse("g('cat')")] == ["g"]
    assert drone.parse("};") == []
    with pytest.raises(SkillParseError, match="unclosed '{'"):
        drone.parse("?s('cat')==True{", complete=True)
    with pytest.raises(SkillParseError, match="unmatched '}'"):
        drone.parse("};", complete=True)


def test_variable_arguments_are_kept_for_the_robot_to_check(drone: SkillSet) -> None:
    calls = drone.parse("_1=od('cat');mf(_1);")
    assert calls[1].args == (Var("_1"),)
    with pytest.raises(ValueError, match="outside"):
        drone["mf"].check_args([900])
    assert drone["mf"].check_args([50.0]) == ((50,), ("distance",))


def test_arm_plans(arm: SkillSet) -> None:
    calls = arm.parse("sc();move_to(0.45, -0.2);take('red_box');move_to('tray');drop('tray');", complete=True)
    assert [c.name for c in calls] == ["sc", "move_to", "pick", "move_to", "place"]
    assert calls[1].args == (0.45, -0.2) and calls[1].arg_names == ("x", "y")
    assert calls[3].arg_names == ("target",)
    assert calls[2].raw == "take('red_box')"  # as written, with the canonical name beside it


def test_chatbot_parses_to_no_calls() -> None:
    assert load_skill_set("chatbot").parse("Hello! mf(900) is not a skill here.") == []


# -- invalid plans: untrusted output must not pass -----------------------------
@pytest.mark.parametrize("plan, message, position", [
    ("mf(50);fly(3);", "unknown skill 'fly'", 7),
    ("mf(900);", "argument 'distance' of mf = 900 outside [20, 500]", 0),
    ("mf(10);", "argument 'distance' of mf = 10 outside [20, 500]", 0),
    ("tc(361);", "argument 'degrees' of tc = 361 outside [1, 360]", 0),
    ("mf(50.5);", "argument 'distance' of mf must be an integer", 0),
    ("mf('far');", "argument 'distance' of mf must be a number", 0),
    ("iv(cat);", "unknown name 'cat'", 3),
    ("iv(3);", "argument 'object_name' of iv must be a quoted string", 0),
    ("mf(50, 60);", "mf takes 1 argument(s)", 0),
    ("tp(1);", "tp takes 0 argument(s)", 0),
    ("mf(50", "unclosed argument list of mf", 5),
    ("l('oops);", "unterminated string", 2),
    ("mf;", "skill 'mf' must be called with '(...)'", 0),
    ("99{mf(50)}", "loop count 99 outside [1, 20]", 0),
    ("?iv('cat'){mf(50)", "unclosed '{'", 10),
    ("mf(50)};", "unmatched '}'", 6),
    ("mf(50) # go", "unexpected character '#'", 7),
    ("mf(dist=50);", "mf has no argument 'dist'", 0),
    ("?iv('a')=={", "expected a value in condition", 10),
    ("mf(iv('x'));", "nested call", 3),
    ("l('" + "x" * 300 + "');", "argument 'text' of l has length 300", 0),
])
def test_invalid_plans_have_clear_errors(drone: SkillSet, plan: str, message: str, position: int) -> None:
    with pytest.raises(SkillParseError) as ei:
        drone.parse(plan, complete=True)
    assert message in str(ei.value)
    assert ei.value.position == position
    assert str(ei.value).endswith(f"at {position}")
    assert isinstance(ei.value, ValueError)


@pytest.mark.parametrize("plan, message", [
    ("move_to(1.5, 0);", "argument 'x' of move_to = 1.5 outside [-0.8, 0.8]"),
    ("pick('box; rm -rf /');", "does not match"),
    ("?gt('cup'){pick('cup')}", "expected a skill call, found '?'"),
    ("_1=gt('cup');", "expected a skill call"),
    ("mf(50);", "unknown skill 'mf'"),
    ("pick();", "pick takes 1 argument(s)"),
])
def test_invalid_arm_plans(arm: SkillSet, plan: str, message: str) -> None:
    with pytest.raises(SkillParseError, match=None) as ei:
        arm.parse(plan)
    assert message in str(ei.value)


# -- YAML validation -------------------------------------------------------------
def _write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _base() -> dict:
    return {
        "id": "t", "robot_type": "toy", "segmenter": "semicolon", "lmax": 5,
        "skills": [{"name": "go", "args": [{"name": "n", "type": "int", "min": 0, "max": 3}],
                    "exec_time": {"model": "linear", "arg": "n", "a": 1.0, "b": 0.5}}],
    }


def test_minimal_yaml_loads(tmp_path: Path) -> None:
    ss = load_skill_set_file(_write(tmp_path, _base()))
    assert ss.parse("go(2);")[0].args == (2,)
    assert ss.grammar == "calls"  # follows from the segmenter
    assert (ss["go"].op, ss["go"].op_args) == (None, {})


def test_skills_name_their_operation(drone: SkillSet, arm: SkillSet) -> None:
    assert (drone["mf"].op, drone["mf"].op_args) == ("move", {"direction": "forward"})
    assert (drone["a"].op, drone["a"].op_args) == ("move", {"direction": "forward", "cm": 100})
    assert (drone["tu"].op, drone["tu"].op_args) == ("rotate", {"clockwise": False})
    assert all(s.op for s in (*drone.skills, *arm.skills))
    assert arm["gt"].op == "locate"
    assert drone.skill_for_op("move", direction="up") is drone["mu"]
    assert drone.skill_for_op("rotate", clockwise=False) is drone["tu"]
    assert drone.skill_for_op("move", direction="sideways") is None


@pytest.mark.parametrize("mutate, field, problem", [
    (lambda d: d.pop("robot_type"), "robot_type", "missing"),
    (lambda d: d.update(segmenter="regex"), "segmenter", "'regex' is not one of"),
    (lambda d: d.update(lmax="ten"), "lmax", "expected an integer"),
    (lambda d: d.update(colour="red"), "", "unknown field(s) colour"),
    (lambda d: d["skills"][0]["args"][0].update(type="double"), "skills[0] (go).args[0].type", "'double' is not"),
    (lambda d: d["skills"][0]["args"][0].update(min=5), "skills[0] (go).args[0].min", "min 5.0 > max 3.0"),
    (lambda d: d["skills"][0]["args"][0].update(max="x"), "skills[0] (go).args[0].max", "expected a number"),
    (lambda d: d["skills"][0].pop("exec_time"), "skills[0] (go).exec_time", "missing"),
    (lambda d: d["skills"][0]["exec_time"].update(model="magic"), "skills[0] (go).exec_time.model", "'magic'"),
    (lambda d: d["skills"][0]["exec_time"].pop("a"), "skills[0] (go).exec_time.a", "required by model 'linear'"),
    (lambda d: d["skills"][0]["exec_time"].update(arg="m"), "skills[0] (go).exec_time.arg", "numeric argument"),
    (lambda d: d["skills"][0].update(name="9go"), "skills[0].name", "not an identifier"),
    (lambda d: d["skills"].append(dict(d["skills"][0])), "", "skill name 'go' is used twice"),
    (lambda d: d.update(skills=[]), "skills", "needs at least one skill"),
    (lambda d: d["skills"][0].update(op="fly away"), "skills[0] (go).op", "expected an operation name"),
    (lambda d: d["skills"][0].update(op_args={"n": 1}), "skills[0] (go).op_args", "given without op"),
    (lambda d: d["skills"][0].update(op="move", op_args=[1]), "skills[0] (go).op_args", "expected a mapping"),
    (lambda d: d["skills"][0].update(op="move", op_args={"to": [1]}), "skills[0] (go).op_args.to",
     "expected a string, number or boolean"),
    (lambda d: d["skills"][0].update(exec_time={"model": "repeated", "unit": 1, "min_count": 1, "max_count": 3,
                                                "count_weights": [1, 2]}),
     "skills[0] (go).exec_time.count_weights", "expected 3 non-negative weights"),
])
def test_yaml_errors_name_file_and_field(tmp_path: Path, mutate, field: str, problem: str) -> None:
    d = _base()
    mutate(d)
    p = _write(tmp_path, d)
    with pytest.raises(SkillSetError) as ei:
        load_skill_set_file(p)
    msg = str(ei.value)
    assert msg.startswith(str(p)), msg
    assert f": {field}: " in msg if field else True, msg
    assert problem in msg, msg


def test_yaml_syntax_error_names_file(tmp_path: Path) -> None:
    p = tmp_path / "broken.yaml"
    p.write_text("id: [unclosed\n")
    with pytest.raises(SkillSetError, match="broken.yaml: not valid YAML"):
        load_skill_set_file(p)
    p.write_text("id: x\nrobot_type: drone: 1\n")  # and where in it: one line, no "<unicode string>"
    with pytest.raises(SkillSetError, match="broken.yaml: not valid YAML at line 2, column 18: mapping values"):
        load_skill_set_file(p)


def test_shipped_skill_sets_are_valid() -> None:
    for name in ("drone_minispec.yaml", "arm.yaml", "chatbot.yaml"):
        load_skill_set_file(skills_dir() / name)
