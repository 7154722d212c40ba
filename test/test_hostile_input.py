"""Hostile plan text (issue 23): plans are bounded, and the validator, the stop checker and the interpreter
refuse whatever text they are given (documented exceptions only), agree on what is valid, and never let an
accepted plan run past its skill set's bounds."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_executors_interpreter import RecordingDrone
from test_minispec import valid_programs
from test_scheduler import drain, make_core, spec

from timelyllm_ros.domain.clock import SimClock
from timelyllm_ros.domain.types import TaskStatus
from timelyllm_ros.robots.arm_backend import ArmExecutor
from timelyllm_ros.robots.base import ExecutionError, RefusedError
from timelyllm_ros.robots.interpreter import MiniSpecInterpreter
from timelyllm_ros.robots.perception import ScriptedScene
from timelyllm_ros.skills.exec_model import ExecTimeModel
from timelyllm_ros.skills.minispec import (
    MAX_BLOCK_DEPTH,
    MAX_NESTING,
    SkillParseError,
    parse_program,
    stream_cost,
    tokenize,
)
from timelyllm_ros.skills.schema import SkillSetError
from timelyllm_ros.skills.segmenter import split_segments
from timelyllm_ros.skills.skill_files import load_skill_set, skill_set_from_dict

DRONE = load_skill_set("drone")
ARM = load_skill_set("arm")
MODEL = ExecTimeModel(DRONE, learn=False)
SCENE = "Scene: [cat x:0.5 y:0.5 dis:150] [book x:0.7 y:0.4 bearing:90]"
TC90 = 0.0165 * 90 + 0.784
MF100 = 0.0072 * 100 + 1.8144
# g('x') = o('x') (0 to 4 turns of 1.0315 s, plus 1 ms) then mf(100): the skill set's own models of what it runs
G_LO, G_HI = 0.001 + MF100, 0.001 + 4 * 1.0315 + MF100


def _interpreter() -> tuple[RecordingDrone, MiniSpecInterpreter]:
    drone = RecordingDrone()
    return drone, MiniSpecInterpreter(DRONE, drone, ScriptedScene(SCENE))


# -- 1. bounded plans ---------------------------------------------------------------------------------
def test_the_skill_sets_declare_their_bounds() -> None:
    assert (DRONE.max_plan_exec_s, DRONE.max_plan_iterations) == (300, 400)
    assert (ARM.max_plan_exec_s, ARM.max_plan_iterations) == (300, 100)


@pytest.mark.parametrize("plan, bound, value", [
    ("20{20{20{mf(500);}}}", "max_plan_iterations = 400", "it may run 420 "),  # 40 km of flight
    ("20{20{20{20{d(60)}}}}", "max_plan_iterations = 400", "it may run 420 "),  # 9.6 M s of hovering
    ("3{3{3{d(60)}}}", "max_plan_exec_s = 300 s", "it may run 1620.0 s"),
    ("6{d(60)}", "max_plan_exec_s = 300 s", "it may run 360.0 s"),
    ("mu(500);mu(500);mu(500);mu(500);mu(500);mu(500);mu(500)", "max_plan_exec_s = 300 s", "it may run 320.0 s"),
])
def test_a_plan_over_a_bound_is_refused_naming_it(plan: str, bound: str, value: str) -> None:
    err = DRONE.validate_plan(plan)
    assert err is not None and bound in err and value in err, err
    assert DRONE.validate(plan) == err  # the segment alone is over it: refused without any context
    drone, it = _interpreter()
    with pytest.raises(RefusedError, match=bound.split(" ")[0]):
        it.execute_segment(plan, final=True)
    assert drone.cmds == []


def test_plans_within_the_bounds_are_accepted() -> None:
    assert DRONE.validate_plan("20{mf(500);}") is None  # 20 x 5.4 s
    assert stream_cost(DRONE, "", "20{mf(500);}")[1].max_s == pytest.approx(20 * (0.0072 * 500 + 1.8144))
    assert DRONE.validate_plan("20{iv('cat');iv('cat')}") is None
    assert stream_cost(DRONE, "", "20{iv('cat');iv('cat')}")[1].iterations == 60  # 20 passes + 40 calls
    assert DRONE.validate_plan("8{?iv('cat')==True{->True};tc(45)}->False") is None  # TypeFly's scan


def test_the_bound_is_exactly_inclusive() -> None:
    assert DRONE.validate_plan("5{d(60)}") is None  # 300 s
    assert "max_plan_exec_s" in DRONE.validate_plan("5{d(60)};tp()")
    ss = skill_set_from_dict({**_drone_raw(), "max_plan_iterations": 3})
    assert ss.validate_plan("mf(50);mf(50);mf(50)") is None
    assert "max_plan_iterations = 3: it may run 4" in ss.validate_plan("mf(50);mf(50);mf(50);mf(50)")
    assert "max_plan_iterations = 3: it may run 4" in ss.validate_plan("2{mf(50)}")  # 2 passes + 2 calls


def test_streamed_plan_over_a_bound_is_refused_at_the_segment_that_takes_it_over() -> None:
    # Each segment is within the bound alone (4 x 30 s); nested, the second makes 4 x (30 + 4 x 30) = 600 s.
    segments = split_segments(DRONE, ["4{", "d(30);", "4{", "d(30);", "}}"])  # as a tokenizer writes it
    assert segments == ["4{d(30);", "4{d(30);", "}}"]
    assert "max_plan_exec_s" in DRONE.validate_plan("".join(segments))
    assert all(DRONE.validate(s) is None for s in segments)
    with pytest.raises(SkillParseError, match=r"max_plan_exec_s = 300 s: it may run 600\.0 s"):
        stream_cost(DRONE, segments[0], segments[1])
    # The robot refuses the same segment, before it moves.
    drone, it = _interpreter()
    it.execute_segment(segments[0])
    before = list(drone.cmds)
    with pytest.raises(RefusedError, match="max_plan_exec_s"):
        it.execute_segment(segments[1])
    assert drone.cmds == before


@pytest.mark.parametrize("policy", ["pud", "fcfs"])
def test_the_planner_never_dispatches_a_segment_over_a_bound(policy: str) -> None:
    clock = SimClock()
    core, segs, results = make_core(policy, clock=clock)
    core.submit(spec(0, plan="4{d(30);4{d(30);}}"))
    core.submit(spec(1, plan="4{d(30);}4{d(30);}"))  # 240 s: fine
    drain(core, clock)
    by_id = {r.task_id: r for r in results}
    bad = by_id["t0"]
    assert bad.status is TaskStatus.FAILED, bad
    assert "invalid plan output in segment 1" in bad.reason and "max_plan_exec_s = 300 s" in bad.reason, bad.reason
    sent = [text for tid, _, text in segs if tid == "t0"]
    assert sent == (["4{d(30);"] if policy == "pud" else [])  # fcfs holds a plan back until its end
    assert by_id["t1"].status is TaskStatus.DONE
    assert core.pending() == 0


def test_the_interpreter_counts_the_running_plan_and_stops_before_a_bound() -> None:
    drone, it = _interpreter()
    it.execute_segment("3{tc(90);")
    it.execute_segment("}")
    assert drone.cmds == ["takeoff"] + ["cw 90"] * 3
    assert it.ran_iterations == 6 and it.ran_s == pytest.approx(3 * TC90)
    # A safety net behind the validator's worst case: the call that would go over is refused unsent.
    it.ran_s = DRONE.max_plan_exec_s - 1.0
    with pytest.raises(RefusedError, match=r"refused mf\(50\): the plan would exceed max_plan_exec_s = 300 s"):
        it.execute_segment("mf(50);")
    it.ran_iterations = DRONE.max_plan_iterations
    with pytest.raises(RefusedError, match="refused a loop pass: the plan would exceed max_plan_iterations = 400"):
        it.execute_segment("2{")
    assert drone.cmds == ["takeoff"] + ["cw 90"] * 3
    it.reset()  # a new task starts from nothing
    assert (it.ran_s, it.ran_iterations) == (0.0, 0)
    it.execute_segment("mf(50);")


def test_a_variable_argument_counts_at_its_real_value() -> None:
    drone, it = _interpreter()
    it.execute_segment("_1=od('cat');mf(_1);")  # the cat is 150 cm away
    assert drone.cmds == ["takeoff", "forward 150"]
    assert it.ran_s == pytest.approx(0.001 + 0.0072 * 150 + 1.8144)


# -- loop segments are predicted with their replays --------------------------------------------------
def test_a_loop_close_segment_is_predicted_with_its_replays() -> None:
    assert MODEL.segment_range("", "3{tc(90);") == pytest.approx((TC90, TC90))
    assert MODEL.segment_range("3{tc(90);", "}") == pytest.approx((2 * TC90, 2 * TC90))
    # Nested loops multiply: the inner '}' replays its body twice, the outer one its whole body (3 turns) once.
    assert MODEL.segment_range("2{3{tc(90);", "}") == pytest.approx((2 * TC90, 2 * TC90))
    assert MODEL.segment_range("2{3{tc(90);}", "}") == pytest.approx((3 * TC90, 3 * TC90))
    # A conditional's condition is evaluated again on each replay; its range stays a range.
    lo, hi = MODEL.segment_range("2{?s('cat')==True{", "g('cat')};}")
    s_lo, s_hi = 1.5275, 8 * 1.5275
    assert (lo, hi) == pytest.approx((G_LO + s_lo + G_LO, G_HI + s_hi + G_HI))
    # The whole plan streamed: the segment predictions add up to the plan's unrolled time.
    plan = "2{tc(90);3{mf(50);}};"
    segments = split_segments(DRONE, list(plan))
    total = sum(MODEL.segment_range("".join(segments[:i]), s)[1] for i, s in enumerate(segments))
    assert total == pytest.approx(2 * (TC90 + 3 * (0.0072 * 50 + 1.8144)))
    assert total == pytest.approx(stream_cost(DRONE, "", plan)[1].max_s)


def test_learned_factors_apply_to_replays() -> None:
    model = ExecTimeModel(DRONE, alpha=1.0)
    model.observe(DRONE.parse("tc(90)"), 2 * TC90)
    assert model.factor("tc") == pytest.approx(2.0)
    assert model.segment_range("3{tc(90);", "}") == pytest.approx((4 * TC90, 4 * TC90))


def test_the_planner_predicts_a_loop_close_segment_with_its_replays() -> None:
    clock = SimClock()
    core, segs, results = make_core("pud", clock=clock)
    core.submit(spec(0, plan="3{tc(90);}"))
    drain(core, clock)
    (res,) = results
    assert res.status is TaskStatus.DONE, res.reason
    assert [s.text for s in res.segments] == ["3{tc(90);", "}"]
    assert [x for s in res.segments for x in (s.est_exec_s, s.max_exec_s)] == pytest.approx([TC90] * 2 + [2 * TC90] * 2)


# -- a composite skill costs what it runs (issue 39) -------------------------------------------------------
def test_goto_is_modelled_as_the_worst_case_of_what_it_runs() -> None:
    """Issue 39: g() was a constant 2.5 s while it runs an orient (up to 4 turns) and mf(100) (2.53 s alone)."""
    e = MODEL.estimate_text("g('cat')")
    assert (e.min_s, e.max_s) == pytest.approx((G_LO, G_HI))
    assert MODEL.estimate_text("a()").max_s == pytest.approx(MF100)  # approach = mf(100), the same model


def test_a_plan_of_gotos_over_the_bound_is_refused_and_one_within_it_runs() -> None:
    """20{6{g('cat')}} was accepted at exactly 300.0 s; under the skill file's own models it may run ~799 s."""
    err = DRONE.validate_plan("20{6{g('cat')}}")
    assert err is not None and "max_plan_exec_s = 300 s: it may run 799.4 s" in err, err
    err = DRONE.validate_plan("7{7{g('cat')}}")
    assert err is not None and "it may run 326.4 s" in err, err  # 49 gotos
    assert DRONE.validate_plan("3{15{g('cat')}}") is None  # 45 gotos: 299.8 s at worst


def test_the_interpreter_counts_a_goto_at_the_worst_case_of_what_it_runs() -> None:
    """The run-time counter charged the same 2.5 s, so it did not catch a plan of gotos either."""
    drone, it = _interpreter()
    it.execute_segment("g('cat')")
    assert drone.cmds[-1] == "forward 100"
    assert it.ran_s == pytest.approx(G_HI)
    drone, it = _interpreter()
    it.ran_s = 300 - G_HI + 0.01  # what the plan ran before, for the count: one more goto may pass the bound
    with pytest.raises(RefusedError, match="max_plan_exec_s"):
        it.execute_segment("g('cat')", final=True)
    assert drone.cmds == []


def test_the_simulated_fleet_draws_a_goto_from_what_it_runs() -> None:
    rng = random.Random(3)
    draws = [MODEL.sample("g('cat')", rng) for _ in range(200)]
    assert all(G_LO - 1e-9 <= d <= G_HI + 1e-9 for d in draws) and max(draws) > 3.5, (min(draws), max(draws))


@pytest.mark.parametrize("runs, message", [
    ("zz()", "not calls of this skill set"),
    ("2{mf(50)}", "only calls"),
    ("g('x')", "in a cycle"),
])
def test_a_composite_skill_that_runs_nothing_it_can_count_is_a_schema_error(runs: str, message: str) -> None:
    raw = _drone_raw()
    for sk in raw["skills"]:
        if sk["name"] == "g":
            sk["exec_time"] = {"model": "composite", "runs": runs}
    with pytest.raises(SkillSetError, match=message):
        skill_set_from_dict(raw)


# -- schema of the bounds ---------------------------------------------------------------------------
def _drone_raw() -> dict:
    import yaml

    assert DRONE.path is not None
    return yaml.safe_load(DRONE.path.read_text())


@pytest.mark.parametrize("field, value, message", [
    ("max_plan_exec_s", 0, "max_plan_exec_s: must be > 0 s, got 0"),
    ("max_plan_exec_s", -5, "max_plan_exec_s: must be > 0 s"),
    ("max_plan_exec_s", "5 min", "max_plan_exec_s: expected a number, got '5 min'"),
    ("max_plan_exec_s", float("inf"), "max_plan_exec_s: expected a number"),
    ("max_plan_exec_s", True, "max_plan_exec_s: expected a number"),
    ("max_plan_iterations", 0, "max_plan_iterations: must be >= 1, got 0"),
    ("max_plan_iterations", 2.5, "max_plan_iterations: expected an integer, got 2.5"),
])
def test_bad_bounds_are_schema_errors_naming_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(SkillSetError, match=message.replace("(", r"\(")):
        skill_set_from_dict({**_drone_raw(), field: value})


def test_bounds_default_when_a_skill_set_does_not_declare_them_and_are_refused_for_prose() -> None:
    raw = _drone_raw()
    del raw["max_plan_exec_s"], raw["max_plan_iterations"]
    ss = skill_set_from_dict(raw)
    assert (ss.max_plan_exec_s, ss.max_plan_iterations) == (600.0, 1000)
    chat = {"id": "c", "robot_type": "chatbot", "segmenter": "sentence", "lmax": 20, "max_plan_exec_s": 60}
    with pytest.raises(SkillSetError, match="max_plan_exec_s: only for skill languages"):
        skill_set_from_dict(chat)


# -- 2. a validator that never raises --------------------------------------------------------------
_HOSTILE = [
    "?" + "(" * 400 + "True" + ")" * 400 + "{}",
    "->" + "(" * 400,
    "?" + "!" * 1200 + "True{}",
    "_1=" + "!" * 1200,
    "mf(" + "9" * 5000 + ")",
    "9" * 5000 + "{mf(50)}",
    "d(0." + "9" * 5000 + ")",
    "?" + "iv('a')&" * 200 + "iv('a'){}",
    "?" + "iv('a')|" * 200 + "iv('a'){}",
    "->" + "1<" * 100 + "1",
    "1{" * 100 + "tp()" + "}" * 100,
    "2{" * 100 + "tp()" + "}" * 100,
    "l('" + "a" * 100_000 + "')",
]


@pytest.mark.parametrize("text", _HOSTILE, ids=lambda t: repr(t[:16]) + f"..({len(t)})")
def test_hostile_text_is_refused_with_a_position(text: str) -> None:
    with pytest.raises(SkillParseError) as e:
        parse_program(DRONE, text, complete=True)
    assert 0 <= e.value.position <= len(text) and e.value.reason
    assert DRONE.validate_plan(text) == str(e.value)
    assert DRONE.validate(text) is not None
    with pytest.raises(SkillParseError):
        MODEL.segment_range("", text)
    segments = split_segments(DRONE, [text])  # the stop checker follows it without raising
    assert "".join(segments) == text
    drone, it = _interpreter()
    with pytest.raises(RefusedError, match="invalid segment"):
        it.execute_segment(text, final=True)
    assert drone.cmds == []


@pytest.mark.parametrize("text, reason", [
    ("?" + "(" * 400 + "True" + ")" * 400 + "{}", f"'(' and '!' nested more than {MAX_NESTING} deep"),
    ("?" + "!" * 1200 + "True{}", f"'(' and '!' nested more than {MAX_NESTING} deep"),
    ("mf(" + "9" * 5000 + ")", "number of 5000 characters (at most 32)"),
    ("?" + "iv('a')&" * 200 + "iv('a'){}", f"expression nested more than {MAX_NESTING} operators deep"),
    ("1{" * 100 + "tp()" + "}" * 100, f"blocks nested {MAX_BLOCK_DEPTH + 1} deep (at most {MAX_BLOCK_DEPTH})"),
    ("2{" * 100 + "tp()" + "}" * 100, "plan exceeds max_plan_iterations = 400: it may run 510 "),
    ("l('" + "a" * 100_000 + "')", "string of 100000 characters (at most 1000)"),
])
def test_hostile_text_names_the_limit(text: str, reason: str) -> None:
    with pytest.raises(SkillParseError, match="^" + re.escape(reason)):
        parse_program(DRONE, text)


def test_nesting_within_the_limits_is_fine() -> None:
    n = MAX_NESTING
    assert DRONE.validate_plan("?" + "(" * n + "iv('cat')" + ")" * n + "{}") is None
    assert DRONE.validate_plan("?" + "!" * n + "iv('cat'){}") is None
    assert DRONE.validate_plan("1{" * MAX_BLOCK_DEPTH + "tp()" + "}" * MAX_BLOCK_DEPTH) is None
    # Blocks open in earlier segments count: the interpreter refuses the one that goes deeper.
    drone, it = _interpreter()
    for _ in range(MAX_BLOCK_DEPTH):
        it.execute_segment("1{")
    with pytest.raises(RefusedError, match="blocks nested"):
        it.execute_segment("1{")


@pytest.mark.parametrize("text", [
    "l('\x1b[2J\x1b[31mAll systems nominal')",  # ESC: terminal escapes into the operator's console
    "l('line one\nline two')",
    "l('a\\\nb')",  # escaped, still a newline
    "l('bell\x07')",
    "l('tab\there')",
    "l('rtl \u202e override')",  # format character (Cf)
    "l('del\x7f')",
    "?p('what is it?')=='\x1b'{tp()}",  # in a condition too
    "l(\"\x00\")",
])
def test_control_characters_in_strings_are_refused(text: str) -> None:
    err = DRONE.validate_plan(text)
    assert err is not None and "control character U+" in err, err
    drone, it = _interpreter()
    with pytest.raises(RefusedError, match="control character"):
        it.execute_segment(text, final=True)
    assert it.messages == [] and drone.cmds == []


@pytest.mark.parametrize("sep", ["\u2028", "\u2029"])
def test_line_and_paragraph_separators_in_strings_are_refused(sep: str) -> None:
    """Issue 39: only Unicode category C was refused; U+2028 and U+2029 (Zl, Zp) break the console line too."""
    text = f"l('a{sep}b')"
    err = DRONE.validate_plan(text)
    assert err is not None and f"separator U+{ord(sep):04X} in a string" in err, err
    drone, it = _interpreter()
    with pytest.raises(RefusedError, match="separator"):
        it.execute_segment(text, final=True)
    assert it.messages == [] and drone.cmds == []


@pytest.mark.parametrize("text", ["mf(distance=50,distance=500)", "mf(distance = 500, distance = 50)"])
def test_a_keyword_argument_given_twice_is_refused(text: str) -> None:
    """Issue 39: the last one silently won (mf(distance=50,distance=500) flew 500 cm)."""
    err = DRONE.validate_plan(text)
    assert err is not None and "keyword argument 'distance' of mf given twice" in err, err
    drone, it = _interpreter()
    with pytest.raises(RefusedError, match="given twice"):
        it.execute_segment(text, final=True)
    assert drone.cmds == []


def test_printable_strings_are_fine() -> None:
    assert DRONE.validate_plan("l('Ça va? Grüße, 猫 found: 100 %');l('a b');l('')") is None


def test_tokenize_refuses_a_long_number_instead_of_raising_value_error() -> None:
    with pytest.raises(SkillParseError, match="number of 4301 characters"):
        tokenize("1" * 4301)
    assert tokenize("1" * 32)[0].value == int("1" * 32)


# -- fuzz: validator, stop checker and interpreter on any text ---------------------------------------
_FRAGMENTS = [
    "20{", "3{", "1{", "}", "{", "(", ")", "!", "(" * 40, "!" * 40, ";", " ", "\n", "mf(500)", "mf(50)", "d(60)",
    "d(_1)", "tc(90)", "tp()", "s('cat')", "g('cat')", "iv('cat')", "?iv('cat')==True{", "?", "==", "&", "|", "<",
    "-", "->", "->True", "_1=od('cat')", "_1=", "_2", "_1", "l('hi')", "l('\x1b[31m')", "l('a\nb')", "'", "\\",
    "9" * 40, "9" * 5000, "1e999", ".5", "1.", "mf(", "l('", "\x00", "\u202e", "\x1b", "猫", "True", "rp()",
    "?_1>100{", "4{d(30);", "sa('a cup?')",
]
_simple = st.sampled_from(["mf(500)", "mf(50)", "mu(500)", "d(60)", "d(1.5)", "tc(90)", "tp()", "s('cat')",
                           "sa('a cup?')", "g('cat')", "iv('cat')", "_1=od('cat')", "mf(_1)", "l('hi')", "->True",
                           "rp()"])


def _blocks(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    body = st.lists(inner, max_size=4).map(";".join)
    cond = st.sampled_from(["iv('cat')==True", "_1>100", "!iv('book')", "s('cat')&iv('cat')"])
    return st.one_of(st.tuples(st.integers(1, 20), body).map(lambda t: f"{t[0]}{{{t[1]}}}"),
                     st.tuples(cond, body).map(lambda t: f"?{t[0]}{{{t[1]}}}"))


# Plans with loops of any count, nested: many over a bound, many not.
_structured = st.lists(st.recursive(_simple, _blocks, max_leaves=12), min_size=1, max_size=6).map(";".join)


@st.composite
def _mutated(draw: st.DrawFn) -> str:
    text = draw(_structured)
    for _ in range(draw(st.integers(1, 2))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(_FRAGMENTS)) + text[at:]
    return text


hostile_texts = st.one_of(
    st.lists(st.sampled_from(_FRAGMENTS), max_size=40).map("".join),
    st.text(max_size=60),
    st.text(alphabet="ab_09.eE+-=<>!&|(){};,?'\"\\ \n\x1b", max_size=60),
    valid_programs, _structured, _structured, _mutated(),
)


def _only_refusals(f, *args, **kwargs):
    """f's result, or None if it refused with SkillParseError; anything else fails the test."""
    try:
        return f(*args, **kwargs)
    except SkillParseError as e:
        assert isinstance(e.position, int) and e.reason
        return None


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=hostile_texts, cut=st.integers(0, 10_000), open_blocks=st.integers(0, 3))
def test_the_validator_never_raises(text: str, cut: int, open_blocks: int) -> None:
    _only_refusals(tokenize, text)
    for complete in (True, False):
        _only_refusals(parse_program, DRONE, text, complete=complete)
        _only_refusals(parse_program, ARM, text, complete=complete)
    _only_refusals(parse_program, DRONE, text, open_blocks=open_blocks, declared=("_1",))
    assert isinstance(DRONE.validate(text), (str, type(None)))
    plan_err = DRONE.validate_plan(text)
    assert isinstance(plan_err, (str, type(None))) and isinstance(ARM.validate_plan(text), (str, type(None)))
    cut = min(cut, len(text))
    _only_refusals(MODEL.segment_range, text[:cut], text[cut:])
    got = _only_refusals(stream_cost, DRONE, "", text)
    if plan_err is None:  # accepted: within both bounds
        assert got is not None
        _, total = got
        assert total.max_s <= DRONE.max_plan_exec_s and total.iterations <= DRONE.max_plan_iterations


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=hostile_texts, data=st.data())
def test_the_stop_checker_never_raises_and_keeps_the_text(text: str, data: st.DataObject) -> None:
    pieces = data.draw(st.lists(st.integers(1, 8), max_size=len(text) + 1))
    out, i = [], 0
    for n in pieces:
        out.append(text[i:i + n])
        i += n
    out.append(text[i:])
    for ss in (DRONE, ARM, load_skill_set("chatbot")):
        assert "".join(split_segments(ss, out)) == text


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=hostile_texts)
def test_validator_stop_checker_and_interpreter_agree(text: str) -> None:
    """Whole or streamed in the stop checker's segments, the interpreter accepts exactly what validate_plan
    accepts; it raises only its documented errors; an accepted plan runs within its bounds, and its modelled
    time never exceeds the validator's worst case."""
    err = DRONE.validate_plan(text)
    if err is not None and err.startswith("empty plan"):  # the planner's rule: a robot runs an empty plan
        err = None
    drone, it = _interpreter()
    try:
        it.validate(text, final=True)
        whole_ok = True
    except RefusedError:
        whole_ok = False
    assert whole_ok == (err is None), (text, err)

    segments = split_segments(DRONE, list(text))
    drone, it = _interpreter()
    refused = False
    for i, seg in enumerate(segments):
        try:
            it.execute_segment(seg, final=i == len(segments) - 1)
        except RefusedError as e:
            if str(e).startswith("invalid segment"):
                refused = True
                break
            # A variable's value out of a skill's bounds at run time; never a plan bound: the validator's
            # worst case holds every plan it accepts.
            assert "max_plan_" not in str(e), (text, str(e))
            return
        except ExecutionError:  # e.g. comparing a string with a number: the plan fails on the robot
            return
    assert refused == (err is not None), (text, segments, err)
    if err is None:
        _, total = stream_cost(DRONE, "", text)
        assert it.ran_s <= total.max_s + 1e-9 and it.ran_iterations <= total.iterations
        assert it.ran_s <= DRONE.max_plan_exec_s and it.ran_iterations <= DRONE.max_plan_iterations


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=hostile_texts)
def test_the_arm_refuses_alike(text: str) -> None:
    arm = ArmExecutor(ARM, ScriptedScene(), lambda plan, stop: None)
    try:
        arm.validate(text)
        ok = True
    except RefusedError:
        ok = False
    assert ok == (ARM.validate(text) is None)
