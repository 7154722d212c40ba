"""The bound a run is set beside (measure/bound.py): each task's first segment alone, a burst served one goal after
another, earliest deadline first; shares; and a decode step in the stack against the bare engine's."""

import math

import pytest

from timelyllm_ros.domain.tuf import LEVELS
from timelyllm_ros.measure import bound
from timelyllm_ros.measure.records import SegRecord, TaskRecord
from timelyllm_ros.sim.workloads import Job


def job(i: int, t: float, text: str, urgent: bool) -> Job:
    beta, ert, cut = (2.0, 0.2, 0.5) if urgent else (1.0, 1.0, 1.5)
    return Job(job_id=i, trigger_time=t, agent_id=i, trace_id=6 if urgent else 1, task_input=text,
               exe_time_detail=[], tuf=[beta, ert, cut])


def rec(j: Job, response: float | None, status: str = "done") -> TaskRecord:
    tuf = j.time_utility
    r = TaskRecord(job_id=j.job_id, trace_id=j.trace_id, task_type="t", robot_type="drone",
                   level="urgent" if j.tuf[0] > 1 else "normal", agent_id=j.agent_id, arrival=10.0,
                   alpha=tuf.alpha, beta=tuf.beta, ert=tuf.ert, status=status)
    if response is not None:
        r.segments = [SegRecord(0, "mb(100);", 1, dispatch=10.0, recv=10.0, start=10.0 + response, end=12.0)]
    return r


def test_a_burst_is_served_one_goal_after_another_earliest_deadline_first_and_hopeless_ones_are_left_out():
    jobs = [job(0, 0.0, "normal", False), *(job(i, 0.001 * i, "urgent", True) for i in range(1, 5)),
            job(5, 9.0, "urgent", True)]  # a later burst of its own
    lone = {"normal": 0.15, "urgent": 0.18}
    b = bound.serial_bound(jobs, lone)
    u = LEVELS["urgent"]
    # the urgent ones first (earlier deadlines): at ~0.18, ~0.36 (U ~0.93), ~0.54 (past the cut-off: left out)
    assert b[1] == pytest.approx(2.0) and b[2] == pytest.approx(u.tuf0(0.36 - 0.002 + 0.001), abs=0.02)
    assert b[3] == 0.0 and b[4] == 0.0
    assert b[0] == pytest.approx(1.0)  # the normal one after them, well inside its ERT
    assert b[5] == pytest.approx(2.0)  # the next burst starts on an idle engine
    with pytest.raises(KeyError, match="no lone first segment"):
        bound.serial_bound(jobs, {"normal": 0.1})


def test_shares_count_a_task_not_done_as_zero_and_the_lone_times_take_the_median():
    jobs = [job(1, 0.0, "u", True), job(2, 0.0, "u", True)]
    b = {1: 2.0, 2: 1.0}
    rows = {r.level: r for r in bound.shares([rec(jobs[0], 0.1), rec(jobs[1], None, "overdue")], b)}
    assert rows["urgent"].utility == pytest.approx(2.0) and rows["urgent"].bound == 3.0
    assert rows["urgent"].share == pytest.approx(2 / 3) and "normal" not in rows
    lone = bound.lone_times([("u", rec(jobs[0], 0.1)), ("u", rec(jobs[0], 0.3)), ("u", rec(jobs[0], 0.2)),
                             ("v", rec(jobs[1], None))])
    assert lone == {"u": pytest.approx(0.2)}


def test_the_stack_step_ratio_takes_decode_steps_at_measured_batch_sizes_only():
    steps = [(1, 0, 5, 0.040, 0.0), (1, 74, 1, 0.2, 0.0), (2, 0, 4, 0.060, 0.0), (3, 0, 3, 1.0, 0.0),
             (1, 0, 0, 1.0, 0.0)]
    r, n = bound.step_ratio(steps, {1: 0.034, 2: 0.05})
    assert n == 2 and r == pytest.approx((0.040 / 0.034 + 0.060 / 0.05) / 2)
    assert math.isnan(bound.step_ratio(steps, {})[0])


def test_the_prefill_step_ratio_sets_each_prefilling_step_beside_the_bare_model_of_it():
    steps = [(1, 74, 1, 0.2, 0.0), (3, 100, 3, 0.4, 0.0), (2, 0, 4, 0.060, 0.0), (9, 20, 9, 0.2, 0.0)]
    bare = {1: 0.03, 2: 0.04, 4: 0.06}  # decode steps; the warm-up took 0.02 (a token's decode) off each probe
    r, n = bound.prefill_step_ratio(steps, bare, 0.02, 0.03, 0.0015)
    want = [0.2 / (0.02 + 0.03 + 74 * 0.0015), 0.4 / (0.02 + 0.02 + 0.03 + 100 * 0.0015),
            0.2 / (0.03 + 0.02 + 0.03 + 20 * 0.0015)]
    assert n == 3 and r == pytest.approx(sorted(want)[1])  # batch 3 between 2 and 4; batch 9 as the largest, 4
    assert math.isnan(bound.prefill_step_ratio(steps, {}, 0.02, 0.03, 0.0015)[0])
