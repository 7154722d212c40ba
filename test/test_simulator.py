from timelyllm_ros.sim.simulator import simulate
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
