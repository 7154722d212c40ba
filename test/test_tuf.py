import math

import pytest

from timelyllm_ros.domain.tuf import LEVELS, TimeUtility


def test_tuf0_tuf1_exact():
    u = TimeUtility(alpha=-2.0, beta=1.0, ert=1.0)
    assert u.tuf0(0.3) == 1.0
    assert u.tuf0(1.0) == 1.0
    assert u.tuf0(1.25) == pytest.approx(0.5)
    assert u.tuf0(1.5) == pytest.approx(0.0)
    assert u.tuf0(2.0) == pytest.approx(-1.0)  # not clamped at 0
    assert u.tuf1(-3.0) == 1.0 and u.tuf1(0.0) == 1.0
    assert u.tuf1(0.25) == pytest.approx(0.5)
    assert u.tuf1(1.0) == pytest.approx(-1.0)


def test_deadline_and_segment_utility():
    u = TimeUtility(alpha=-2.0, beta=1.0, ert=1.0)
    # s_0 must start by arrival + ERT; s_k (k > 0) by the end of s_{k-1} (the arrival does not matter)
    assert u.deadline(0, 10.0) == 11.0 and u.deadline(0, 10.0, 99.0) == 11.0
    assert u.deadline(1, 10.0, 12.5) == 12.5 and u.deadline(3, -5.0, 12.5) == 12.5
    # Eq. 3 terms: TUF_0 of the response time for s_0, TUF_1 of the wait after
    assert u.utility(0, 1.25) == u.tuf0(1.25) == pytest.approx(0.5)
    assert u.utility(2, 0.25) == u.tuf1(0.25) == pytest.approx(0.5)
    assert u.utility(1, -1.0) == 1.0  # a segment ready before its deadline earns beta, no more
    # starting at the deadline keeps beta, for every segment; each second later costs -alpha
    for k, prev_end in ((0, math.nan), (1, 12.0)):
        dl = u.deadline(k, 10.0, prev_end)
        origin = 10.0 if k == 0 else prev_end  # where W(s_k) starts counting
        assert u.utility(k, dl - origin) == 1.0
        assert u.utility(k, dl + 0.5 - origin) == pytest.approx(0.0)


def test_from_trace_and_levels():
    u = TimeUtility.from_trace([2, 0.2, 0.5])
    assert u.alpha == pytest.approx(-6.6667, abs=1e-3) and u.level == "urgent"
    assert u.tuf0(0.5) == pytest.approx(0.0)
    assert TimeUtility.from_trace([1, 1, 1.5]).level == "normal"
    assert LEVELS["normal"].cutoff == pytest.approx(1.5)
    assert TimeUtility.named("urgent").to_trace() == pytest.approx([2, 0.2, 0.5])
    with pytest.raises(ValueError, match="unknown urgency level"):
        TimeUtility.named("panic")


@pytest.mark.parametrize("kw,field", [
    ({"alpha": 1.0, "beta": 1.0, "ert": 1.0}, "alpha"),
    ({"alpha": -1.0, "beta": 0.0, "ert": 1.0}, "beta"),
    ({"alpha": -1.0, "beta": 1.0, "ert": -0.1}, "ert"),
    ({"alpha": math.nan, "beta": 1.0, "ert": 1.0}, "alpha"),
    ({"alpha": -1.0, "beta": math.inf, "ert": 1.0}, "beta"),
])
def test_validation_names_field(kw, field):
    with pytest.raises(ValueError, match=field):
        TimeUtility(**kw)


def test_trace_cutoff_must_follow_ert():
    with pytest.raises(ValueError):
        TimeUtility.from_trace([1, 1, 0.5])
