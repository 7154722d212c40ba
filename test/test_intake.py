"""Intake under a flood (issue 39): rate limits per robot id and for robot ids new to the planner, an answer with
the reason for every refused goal, bounded memory (robot links), urgent goals first, and refusals logged once per
claimed sender rather than once per message."""

from __future__ import annotations

import logging

import pytest
from service_stack import ServiceStack
from waiting import wait_until

from timelyllm_ros.domain.types import TaskStatus


@pytest.fixture()
def stack():
    made: list[ServiceStack] = []

    def make(**kw) -> ServiceStack:
        s = ServiceStack(**kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def test_forged_reports_are_logged_once_per_claimed_sender_not_once_per_report(stack, caplog):
    """Issue 39: 5,000 forged reports from 7 claimed senders wrote 5,007 log lines (the core logged each one)."""
    caplog.set_level(logging.INFO, logger="timelyllm_ros")
    s = stack()
    tid, refusal = s.send(s.request("drone_0", task_id="victim"))
    assert refusal is None
    assert wait_until(lambda: ("victim", 0) in {(t, i) for t, _, i, _ in s.sender.segments}, 30)
    senders = [f"mallory_{k}" for k in range(7)]
    for n in range(5000):
        s.service.segment_done("victim", 0, senders[n % 7], False, "forged", None, None)
    assert s.rejected.counts["report"] == 5000
    # every line the planner wrote (its node logger and the core's Python loggers) that speaks of a report
    lines = [m for m in s.log.at("info", "warning", "error") if "report" in m]
    lines += [r.getMessage() for r in caplog.records if "report" in r.getMessage()]
    assert len(lines) == 7, (len(lines), lines[:3])
    assert s.core.task_status("victim") is not TaskStatus.ROBOT_FAILED


def test_refusals_of_ever_new_senders_are_logged_within_a_line_budget(stack):
    """A forger that claims a new sender per message must not flood the log either."""
    s = stack()
    for n in range(3000):
        s.service.segment_done("nothing", 0, f"forger_{n}", False, "forged", None, None)
    assert s.rejected.counts["report"] == 3000
    lines = [m for m in s.log.at("warning") if "refused report" in m]
    assert 1 <= len(lines) <= 20, len(lines)
