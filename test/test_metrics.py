import math

from timelyllm_ros.sim.metrics import percentile, summarize, to_markdown
from timelyllm_ros.sim.simulator import SegRecord, TaskRecord


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
