"""Robot execution-time model: design §7 numbers, ranges, sampling, learning."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.skills.exec_model import ExecEstimate, ExecTimeModel
from timelyllm_ros.skills.minispec import SkillParseError
from timelyllm_ros.skills.skill_files import load_skill_set

DRONE = load_skill_set("drone")


def cubic(v: float) -> float:
    return 8e-7 * v**3 - 0.0003 * v**2 + 0.0388 * v + 1.3195


@pytest.mark.parametrize("plan, seconds", [
    ("mf(50)", 0.0072 * 50 + 1.8144),
    ("mb(500)", 0.0072 * 500 + 1.8144),
    ("ml(20)", 0.0072 * 20 + 1.8144),
    ("mr(100)", 0.0072 * 100 + 1.8144),
    ("mu(50)", cubic(50)),
    ("md(300)", cubic(300)),
    ("tc(90)", 0.0165 * 90 + 0.784),
    ("tu(360)", 0.0165 * 360 + 0.784),
    ("d(3)", 3.0),
    ("a()", 0.0072 * 100 + 1.8144),  # approach runs mf(100); g('cat') is a range (test_hostile_input)
    ("iv('cat')", 0.001),
    ("ox('cat')", 0.001),
    ("od('cat')", 0.001),
    ("l('hi')", 0.001),
    ("tp()", 0.001),
    ("rp()", 0.001),
    ("p('is it red?')", 0.041),
    ("mf(50);tc(90);", 0.0072 * 50 + 1.8144 + 0.0165 * 90 + 0.784),
])
def test_formulas_match_design(plan: str, seconds: float) -> None:
    e = ExecTimeModel(DRONE).estimate_text(plan)
    assert e.min_s == pytest.approx(seconds) and e.typical_s == pytest.approx(seconds)
    assert e.max_s == pytest.approx(seconds)


def test_trace_values() -> None:
    # LRTrace drone WID 2 reports d=3 and mu ~2.50..2.59 s for its plans.
    m = ExecTimeModel("drone")
    assert m.estimate_text("d(3)").typical_s == 3
    assert 2.45 < m.estimate_text("mu(50)").typical_s < 2.65


def test_scan_takes_one_to_eight_turns() -> None:
    m = ExecTimeModel(DRONE)
    e = m.estimate_text("s('cat')")
    assert e.min_s == pytest.approx(1.5275) and e.max_s == pytest.approx(8 * 1.5275)
    assert e.min_s < e.typical_s < e.max_s
    e = m.estimate_text("sa('anything to cut paper?')")
    assert (e.min_s, e.max_s) == (pytest.approx(1.5675), pytest.approx(8 * 1.5675))
    rng = random.Random(0)
    draws = {round(m.sample("s('cat')", rng) / 1.5275, 6) for _ in range(2000)}
    assert draws == {float(k) for k in range(1, 9)}


def test_arm_uniform_ranges() -> None:
    m = ExecTimeModel("arm")
    for plan, lo, hi in [("move_to(0.3, 0.1)", 1, 3), ("move_to('tray')", 1, 3), ("pick('a')", 3, 4.2),
                         ("take('a')", 3, 4.2), ("drop('tray')", 3, 4.2), ("place('tray')", 3, 4.2),
                         ("gt('cup')", 0.8, 5.5), ("sc()", 1, 3)]:
        e = m.estimate_text(plan)
        assert (e.min_s, e.typical_s, e.max_s) == (pytest.approx(lo), pytest.approx((lo + hi) / 2), pytest.approx(hi))
        assert e.scheduling_s == e.min_s  # design §7: schedule with the minimum
    rng = random.Random(1)
    xs = [m.sample("gt('cup')", rng) for _ in range(500)]
    assert 0.8 <= min(xs) < 1.2 and 5.1 < max(xs) <= 5.5


def test_variable_argument_spans_the_bounds() -> None:
    e = ExecTimeModel(DRONE).estimate_text("_1=od('cat');mf(_1);")
    assert e.min_s == pytest.approx(0.001 + 0.0072 * 20 + 1.8144)
    assert e.max_s == pytest.approx(0.001 + 0.0072 * 500 + 1.8144)
    assert e.typical_s == pytest.approx(0.001 + 0.0072 * 50 + 1.8144)  # the YAML's typical 50 cm


def test_estimate_accepts_calls_and_rejects_invalid_text() -> None:
    m = ExecTimeModel(DRONE)
    calls = DRONE.parse("mf(50);tc(90);")
    assert m.estimate(calls) == m.estimate_text("mf(50);tc(90);") == m.estimate("mf(50);tc(90);")
    assert m.estimate([]) == ExecEstimate(0, 0, 0)
    with pytest.raises(SkillParseError):
        m.estimate_text("mf(900)")
    with pytest.raises(ValueError, match="skill set 'arm'"):
        m.estimate(load_skill_set("arm").parse("sc();"))


def test_chatbot_reading_time() -> None:
    m = ExecTimeModel("chatbot")
    e = m.estimate_text("One two three four five six.")
    assert (e.min_s, e.typical_s, e.max_s) == (pytest.approx(1.5), pytest.approx(1.98), pytest.approx(3.0))
    assert 1.5 <= m.sample("One two three four five six.", random.Random(0)) <= 3.0


# -- ranges and sampling for every skill, any in-bounds argument ----------------------
def _call_text(draw: st.DrawFn, spec_name: str) -> str:
    spec = DRONE[spec_name]
    vals = []
    for a in spec.args:
        if a.type == "int":
            vals.append(str(draw(st.integers(int(a.min), int(a.max)))))
        elif a.type == "float":
            vals.append(repr(draw(st.floats(a.min, a.max))))
        else:
            vals.append("'box'")
    return f"{spec.name}({', '.join(vals)})"


@st.composite
def drone_segments(draw: st.DrawFn) -> str:
    names = draw(st.lists(st.sampled_from(DRONE.names), min_size=1, max_size=4))
    return ";".join(_call_text(draw, n) for n in names) + ";"


@settings(max_examples=200, deadline=None)
@given(seg=drone_segments(), seed=st.integers(0, 2**32 - 1))
def test_min_le_typical_le_max_and_samples_in_range(seg: str, seed: int) -> None:
    m = ExecTimeModel(DRONE)
    e = m.estimate_text(seg)
    assert 0 <= e.min_s <= e.typical_s <= e.max_s
    rng = random.Random(seed)
    for _ in range(5):
        assert e.min_s - 1e-9 <= m.sample(seg, rng) <= e.max_s + 1e-9


def test_sampling_is_reproducible() -> None:
    m = ExecTimeModel("arm")
    a = [m.sample("pick('a');gt('b')", random.Random(7)) for _ in range(3)]
    assert len(set(a)) == 1


# -- learning ------------------------------------------------------------------------------
def test_learning_moves_the_estimate_toward_observations() -> None:
    m = ExecTimeModel(DRONE, alpha=0.3)
    base = m.estimate_text("mf(100)").min_s
    observed = base * 1.5
    errors = []
    for _ in range(30):
        m.observe("mf(100);", observed)
        errors.append(abs(m.estimate_text("mf(100)").min_s - observed))
    assert errors[0] < abs(base - observed)
    assert all(b <= a + 1e-12 for a, b in zip(errors, errors[1:], strict=False))
    assert errors[-1] < 0.01 * observed
    assert m.factor("mf") == pytest.approx(1.5, rel=0.01)
    assert m.factor("move_forward") == m.factor("mf")
    # other skills are untouched; the range scales with the factor
    assert m.factor("tc") == 1.0
    assert m.estimate_text("mf(50)").typical_s == pytest.approx(1.5 * (0.0072 * 50 + 1.8144), rel=0.01)
    # sampling stands for the real robot and ignores what was learned
    assert m.sample("mf(50)", random.Random(0)) == pytest.approx(0.0072 * 50 + 1.8144)


def test_learning_shares_the_error_in_mixed_segments() -> None:
    m = ExecTimeModel(DRONE, alpha=0.5)
    for _ in range(50):
        m.observe("mf(100);tc(90);", 0.8 * m.estimate_text("mf(100);tc(90);").typical_s / m.factor("mf"))
    assert m.factor("mf") < 1 and m.factor("tc") < 1


def test_learning_off_means_no_change() -> None:
    m = ExecTimeModel(DRONE, learn=False)
    before = m.estimate_text("mf(100);tc(90)")
    for _ in range(10):
        m.observe("mf(100);tc(90)", 20.0)
    assert m.estimate_text("mf(100);tc(90)") == before
    assert m.factors() == {} and m.observations == 0


def test_short_and_outlier_observations() -> None:
    m = ExecTimeModel(DRONE)
    m.observe("iv('cat')", 0.5)  # perception-only: report latency would dominate
    assert m.factors() == {}
    for _ in range(100):
        m.observe("mf(100)", 1000.0)
    assert m.factor("mf") == 4.0  # clamped
    m.reset_learning()
    assert m.factor("mf") == 1.0


def test_concurrent_observations_are_safe() -> None:
    m = ExecTimeModel(DRONE, alpha=0.05)

    def work(obs: float) -> None:
        for _ in range(500):
            m.observe("mf(100);", obs)
            m.estimate_text("mf(100);tc(90)")

    threads = [threading.Thread(target=work, args=(2.0 + 0.2 * i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert m.observations == 2000
    assert 2.0 <= m.estimate_text("mf(100)").typical_s <= 2.6


def test_bad_parameters() -> None:
    with pytest.raises(ValueError, match="alpha"):
        ExecTimeModel(DRONE, alpha=0)
    with pytest.raises(ValueError, match="factor_bounds"):
        ExecTimeModel(DRONE, factor_bounds=(2.0, 3.0))
