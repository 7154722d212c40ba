import math

import pytest

from timelyllm_ros.domain.tuf import TimeUtility
from timelyllm_ros.domain.types import TERMINAL_STATUSES, Segment, TaskResult, TaskStatus
from timelyllm_ros.measure import records
from timelyllm_ros.measure.metrics import not_done_text, percentile, summarize, summary_dicts, to_markdown
from timelyllm_ros.measure.records import SegRecord, TaskRecord


def rec(job, level, arrival, starts, execs, beta=1.0, alpha=-2.0, ert=1.0):
    r = TaskRecord(job, 0, "t", "drone", level, 0, arrival, alpha, beta, ert, status="done")
    for i, (s, e) in enumerate(zip(starts, execs, strict=True)):
        r.segments.append(SegRecord(i, "x", 1, s - 0.008, s, s, s + e, e))
    return r


def test_summary_numbers():
    a = rec(0, "normal", 0.0, [1.25, 3.25], [2.0, 1.0])  # response 1.25 -> utility 0.5, wait 1.25 + 0
    b = rec(1, "normal", 0.0, [0.5], [1.0])
    rows = summarize([a, b])
    allrow = rows[-1]
    assert allrow.group == "all" and allrow.n == 2
    assert allrow.utility == (0.5 + 1.0) / 2
    assert allrow.waiting_mean == (1.25 + 0.5) / 2
    assert allrow.completion_mean == (4.25 + 1.5) / 2
    assert allrow.miss_rate == 0.5
    assert "U/beta" in to_markdown(rows)


def test_percentile():
    assert percentile([1, 2, 3, 4], 0.5) == 2.5
    assert math.isnan(percentile([], 0.5))


# -- one definition of each figure (measure/records.py) --------------------------------------------------
def unserved(job, status, level="normal", beta=1.0, alpha=-2.0, ert=1.0):
    return TaskRecord(job, 0, "t", "drone", level, 0, 0.0, alpha, beta, ert, status=status)


def test_response_and_robot_waiting_definitions():
    r = rec(0, "normal", 10.0, [10.5, 12.0], [1.0, 0.5])
    r.segments.append(SegRecord(2, "};", 0, 13.0, 13.0, 14.0, 14.0, 0.0))  # a closer: nothing to wait for
    assert r.response_time == pytest.approx(0.5) == records.response_time(10.0, 10.5)
    assert r.waits() == pytest.approx([0.5, 0.5])  # W(s_0) from arrival, W(s_1) from the end of s_0
    assert r.robot_waiting == pytest.approx(1.0) == records.robot_waiting_time(10.0, [s.span for s in r.segments])
    # Eq. 3: TUF_0(W(s_0)) + TUF_1(W(s_1)); the per-segment rule is TimeUtility.utility
    assert r.segment_utilities() == pytest.approx([1.0, 0.0]) and r.total_utility() == pytest.approx(1.0)
    assert r.tuf.utility(1, 0.5) == r.segment_utilities()[1]
    # negative gaps (clock skew) are not time gained; unknown times stay unknown
    assert records.wait_time(5.0, 4.9) == 0.0 and math.isnan(records.wait_time(5.0, math.nan))
    assert unserved(1, "overdue").response_time is None and unserved(1, "overdue").robot_waiting is None


def test_action_result_robot_waiting_is_the_records_definition():
    """The planner's robot_waiting_time and the metrics' robot waiting are one function of the same times."""
    tuf = TimeUtility(alpha=-2.0, beta=1.0, ert=1.0)
    comm, arrival = 0.008, 100.0

    def seg(i, dispatch, start, end, calls):
        return Segment(index=i, text="x", token_ids=[], calls=calls, gen_start=dispatch, ready=dispatch,
                       dispatch=dispatch, pred_start=start, pred_end=end, real_end=end)

    segs = [seg(0, 100.4, 100.4 + comm, 101.0, ["c"]), seg(1, 101.5, 101.5 + comm, 102.0, ["c"]),
            seg(2, 102.6, 102.6 + comm, 102.6 + comm, [])]  # a closer, sent late: nobody waits for it
    segs.append(Segment(index=3, text="y", token_ids=[], calls=["c"], gen_start=103.0, ready=103.0))  # never sent
    res = TaskResult(task_id="t", robot_id="r", status=TaskStatus.DONE, plan="", segments=segs,
                     response_time=100.4 + comm - arrival, utility=tuf.tuf0(0.408))
    r = TaskRecord(0, 0, "t", "drone", "normal", 0, arrival, tuf.alpha, tuf.beta, tuf.ert, status="done")
    for s in segs[:3]:
        r.segments.append(SegRecord(s.index, s.text, len(s.calls), s.dispatch, s.pred_start, s.pred_start, s.end,
                                    s.end - s.pred_start))
    assert records.result_robot_waiting(res) == pytest.approx(r.robot_waiting) == pytest.approx(0.408 + 0.508)
    assert records.result_robot_waiting(TaskResult("t", "r", TaskStatus.OVERDUE, "", [], None, None)) == 0.0


def test_all_tasks_columns_do_not_reward_refusing():
    """Refusing half the tasks must not beat serving them late (utility >= 0) on the all-tasks U/beta,
    though it does on the served-only one (why the all-tasks figures exist)."""
    on_time = [rec(i, "normal", 0.0, [0.5], [1.0]) for i in range(4)]
    late = [rec(4 + i, "normal", 0.0, [1.4], [1.0]) for i in range(4)]  # TUF_0 = 0.2
    refused = [unserved(4 + i, s) for i, s in enumerate(("overdue", "invalid", "failed", "cancelled"))]
    serves, refuses = summarize(on_time + late)[-1], summarize(on_time + refused)[-1]
    assert refuses.utility_norm > serves.utility_norm  # served-only: refusing looks better
    assert serves.utility_norm_all == pytest.approx(0.6) and refuses.utility_norm_all == pytest.approx(0.5)
    assert refuses.utility_norm_all < serves.utility_norm_all
    assert refuses.total_utility_all == pytest.approx(0.5) and serves.total_utility_all == pytest.approx(0.6)
    assert (refuses.n, refuses.served, refuses.failed) == (8, 4, 4)
    assert refuses.statuses == {"done": 4, "invalid": 1, "overdue": 1, "failed": 1, "robot_failed": 0,
                                "cancelled": 1, "busy": 0, "other": 0}
    assert set(refuses.statuses) == {s.value for s in TERMINAL_STATUSES} | {"other"}


def test_a_task_that_failed_after_serving_counts_zero_in_all_tasks():
    ok = rec(0, "urgent", 0.0, [0.1], [1.0], beta=2.0, alpha=-2.0 / 0.3, ert=0.2)
    broke = rec(1, "urgent", 0.0, [0.1], [1.0], beta=2.0, alpha=-2.0 / 0.3, ert=0.2)
    broke.status = "robot_failed"
    row = summarize([ok, broke])[-1]
    assert row.utility_norm == 1.0 and row.utility_norm_all == 0.5 and row.statuses["robot_failed"] == 1
    # not finished (a recording cut off mid-run): counted, as "other", with utility 0
    pending = rec(2, "urgent", 0.0, [0.1], [1.0], beta=2.0, alpha=-2.0 / 0.3, ert=0.2)
    pending.status = "incomplete"
    assert summarize([ok, pending])[-1].statuses["other"] == 1


def test_tables_carry_all_tasks_and_status_columns():
    rows = summarize([rec(0, "normal", 0.0, [0.5], [1.0]), unserved(1, "overdue")])
    md = to_markdown(rows)
    header = md.splitlines()[0]
    assert "| U/beta | U/beta all |" in header and "| overdue |" in header and "| other |" not in header
    assert "U/beta all" in md.splitlines()[-1]  # the legend says which columns average over what
    d = summary_dicts(rows, policy="p")[-1]
    assert d["policy"] == "p" and d["utility_norm_all"] == 0.5 and d["n_overdue"] == 1 and d["n_done"] == 1
    assert "statuses" not in d
    assert not_done_text(rows[-1]) == "1: overdue 1"
    assert not_done_text(summarize([rec(2, "normal", 0.0, [0.5], [1.0])])[-1]) == "0"


def test_timeline_rows_are_what_each_robot_started_with_misses_marked(tmp_path):
    """The demo's timeline: per robot, tasks in arrival order, only segments the robot started, a
    miss where the first segment started after arrival + ERT or never started."""
    from timelyllm_ros.measure.metrics import timeline_plot, timeline_rows

    on_time = rec(0, "urgent", 10.0, [10.5, 12.0], [1.0, 0.5])  # ERT 1: starts 0.5 s after arrival
    late = rec(1, "normal", 11.0, [12.5], [1.0])  # 1.5 s after arrival: missed
    never = rec(2, "urgent", 12.0, [], [])
    never.status = "robot_failed"
    never.segments.append(SegRecord(0, "x", 1, 12.1, 12.2))  # sent and received, never started
    late.agent_id, never.agent_id = 10, 2
    rows = timeline_rows([late, never, on_time])
    assert list(rows) == ["drone_0", "drone_2", "drone_10"]  # natural order, whatever the input order
    t0, = rows["drone_0"]
    assert (t0.arrival, t0.deadline, t0.segments, t0.missed) == (0.0, 1.0, [(0.5, 1.5), (2.0, 2.5)], False)
    t1, = rows["drone_10"]
    assert t1.missed and t1.started and t1.segments == [(2.5, 3.5)]
    t2, = rows["drone_2"]
    assert t2.missed and not t2.started and t2.segments == []
    png = tmp_path / "timeline.png"
    timeline_plot(png, {"pud": [on_time, late, never], "fcfs": [on_time]}, "test")
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
