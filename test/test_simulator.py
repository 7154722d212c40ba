import copy

import pytest

from timelyllm_ros.measure.metrics import summarize
from timelyllm_ros.planner.config import CoreConfig
from timelyllm_ros.sim.simulator import SimConfig, Simulator, simulate
from timelyllm_ros.sim.workloads import Workload, generate, load_workload


def small(n=40):
    wl = load_workload("wid2")
    return Workload("wid2-head", wl.jobs[:n], wl.config)


def key(res):
    return [(r.job_id, r.status, [(s.dispatch, s.start, s.end) for s in r.segments]) for r in res.records]


def test_every_task_ends_and_runs_are_deterministic():
    wl = small()
    for pol in ("fcfs", "fcfs-stream", "fcfs-seg", "edf-seg", "pud", "port-exp", "static-priority"):
        a = simulate(wl, pol, seed=1)
        assert all(r.status == "done" for r in a.records), pol
        assert all(r.plan and r.segments for r in a.records)
        assert key(a) == key(simulate(wl, pol, seed=1))


def test_fcfs_sends_whole_plan_at_once_and_streaming_earlier():
    wl = small(16)
    whole = simulate(wl, "fcfs")
    for r in whole.records:
        assert len({s.dispatch for s in r.segments}) == 1
    stream = simulate(wl, "fcfs-stream")
    assert sum(r.response_time for r in stream.records) < sum(r.response_time for r in whole.records)


def test_segments_match_plans_and_executions_follow_order():
    res = simulate(small(), "pud")
    for r in res.records:
        for a, b in zip(r.segments, r.segments[1:], strict=False):
            assert b.start >= a.end - 1e-9
            assert b.dispatch >= a.dispatch


def test_generated_arm_workload_runs():
    wl = generate("wid3", seed=2, duration_s=60)
    res = simulate(wl, "pud")
    assert all(r.status == "done" for r in res.records)


def test_simulator_does_not_change_the_callers_config():
    cfg = SimConfig(policy="pud", hop_s=0.02)
    before = copy.deepcopy(cfg)
    sim = Simulator(small(8), cfg)
    assert sim.cfg is not cfg and sim.core.cfg.comm_s == 0.02
    sim.run()
    assert cfg == before and cfg.core.comm_s == CoreConfig().comm_s
    # the same config object serves a second run unchanged: same results
    assert key(Simulator(small(8), cfg).run()) == key(Simulator(small(8), before).run())


def test_every_task_counts_in_the_all_tasks_figures():
    """With overdue tasks refused, the all-tasks U/beta counts them as 0 and the statuses add up to n."""
    cfg = SimConfig(policy="pud", admission=1)
    cfg.core.overdue = "reject"
    res = Simulator(small(40), cfg).run()
    row = summarize(res.records)[-1]
    assert sum(row.statuses.values()) == row.n == 40 and row.statuses["other"] == 0
    refused = row.n - row.statuses["done"]
    assert refused > 0 and row.failed == refused
    done_u = sum(r.utility() / r.beta for r in res.records if r.status == "done")
    assert row.utility_norm_all == pytest.approx(done_u / row.n)
