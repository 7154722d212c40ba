"""Goal hygiene (issue 39, item 5): a task_id with a newline, TUFs outside the ranges a request may ask for, and a
task with NUL (which rclpy would cut short before it leaves the client) are refused, naming the field."""

from __future__ import annotations

import math

import pytest
from service_stack import ServiceStack

from timelyllm_ros.domain.tuf import LEVELS, TufRequest
from timelyllm_ros.domain.types import TaskStatus
from timelyllm_ros.planner.service_io import GoalError, PlanRequest


@pytest.fixture(scope="module")
def stack():
    s = ServiceStack()
    yield s
    s.close()


@pytest.mark.parametrize("task_id, pos", [("drone_0-1\nINFO forged line", 9), ("a\tb", 1), ("a\rb", 1)])
def test_a_task_id_with_a_line_break_or_tab_is_refused_naming_the_field(stack, task_id, pos):
    _, refusal = stack.send(stack.request("drone_0", task_id=task_id))
    assert isinstance(refusal, GoalError) and refusal.status is TaskStatus.INVALID, refusal
    assert str(refusal).startswith("task_id: control character") and f"at position {pos}" in str(refusal), refusal
    assert stack.core.task_status(task_id) is None


def test_a_newline_in_the_task_itself_is_still_fine(stack):
    tid, refusal = stack.send(stack.request("drone_1", "Scene: []\nTask: [A] find the cat", task_id="nl-ok"))
    assert refusal is None and tid == "nl-ok"


@pytest.mark.parametrize("tuf, field", [
    (TufRequest("", alpha=-1.0, beta=1e308, ert=1.0), "tuf.beta"),
    (TufRequest("", alpha=-1e-300, beta=1.0, ert=1.0), "tuf.alpha"),
    (TufRequest("", alpha=-1e9, beta=1.0, ert=1.0), "tuf.alpha"),
    (TufRequest("", alpha=-1.0, beta=1.0, ert=1e9), "tuf.ert"),
    (TufRequest("normal", beta=5000.0), "tuf.beta"),  # a level's override too
])
def test_a_tuf_outside_the_documented_ranges_is_refused_naming_the_field(stack, tuf, field):
    """Issue 39: beta = 1e308 and alpha = -1e-300 were accepted; the utility and priority arithmetic overflowed."""
    with pytest.raises(ValueError, match=rf"^{field} must be in \["):
        tuf.resolve()
    req = PlanRequest("", "drone_2", "drone", "[A] find the cat", tuf)
    _, refusal = stack.send(req)
    assert isinstance(refusal, GoalError) and str(refusal).startswith(field), refusal


def test_the_ranges_hold_the_named_levels_and_keep_the_arithmetic_finite():
    from timelyllm_ros.domain.tuf import REQUEST_RANGES

    for level in LEVELS.values():
        for name, (lo, hi, _) in REQUEST_RANGES.items():
            assert lo <= getattr(level, name) <= hi
    (a_lo, a_hi, _), (b_lo, b_hi, _), (_, e_hi, _) = (REQUEST_RANGES[k] for k in ("alpha", "beta", "ert"))
    extreme = TufRequest("", alpha=a_hi, beta=b_hi, ert=e_hi).resolve()  # the longest cut-off the ranges allow
    assert math.isfinite(extreme.cutoff) and math.isfinite(extreme.tuf0(1e9))
    steep = TufRequest("", alpha=a_lo, beta=b_hi, ert=0.0).resolve()
    assert math.isfinite(steep.tuf0(1e9)) and math.isfinite(steep.tuf0(1e9) * 1e6)
