"""The README's Tello demo workload, end to end on emulated Tellos driven through the real djitellopy (network
namespaces; the simulated engine, the paper's TUFs, real-time drones). It caught two failures that the simulated
fleet never shows: urgent evasions failing with 'error Not flying' after their preemption cut a take-off, and
drones still scanning failed as silent."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from devtools.netns import netns_unavailable_reason

pytest.importorskip("rclpy")

_WHY = netns_unavailable_reason()
pytestmark = [pytest.mark.ros, pytest.mark.netns,
              pytest.mark.skipif(_WHY is not None, reason=f"emulated Tellos need network namespaces: {_WHY}")]


def test_the_tello_demo_workload_runs_every_segment_once_in_order_and_every_preempting_evasion_flies(tmp_path):
    # In this process, not a child: djitellopy binds UDP 8889 once per process and keeps it, so after the other
    # emulated-Tello tests of the suite a child process could not bind it.
    from devtools import tello_demo
    from timelyllm_ros import demo

    out = tmp_path / "demo"
    hook = demo.FLEET_HOOK
    try:
        rc = tello_demo.main(["--engine", "engine_sim.yaml", "--compare", "", "--no-record", "--out", str(out),
                              "--fleet-log", str(out / "fleet")])
    finally:
        demo.FLEET_HOOK = hook
    assert rc == 0
    (records,) = json.loads((out / "records.json").read_text()).values()
    (ran,) = json.loads((out / "fleet" / "executions.json").read_text())
    by_task = {f"job{r['job_id']}": r for r in records}

    # healthy drones: nothing ends ROBOT_FAILED (5 of 30 did: 2 evasions after a preemption, 3 slow scans)
    failed = [(t, r["reason"]) for t, r in by_task.items() if r["status"] == "robot_failed"]
    assert not failed, failed

    runs: dict[str, list[tuple[int, bool, str]]] = defaultdict(list)
    for _robot, task, index, ok, error in ran:
        runs[task].append((index, ok, error))
    # every segment a robot ran, it ran once, in index order; a failure is only ever a preemption
    for task, rs in runs.items():
        done = [i for i, ok, _ in rs if ok]
        assert done == sorted(set(done)) == list(range(len(done))), (task, rs)
        assert all(ok or err.startswith("preempted by task ") for _, ok, err in rs), (task, rs)
        rec = by_task[task]
        if rec["status"] == "done":  # a finished plan ran every segment it was sent (end markers run nothing)
            assert len(done) == sum(1 for s in rec["segments"] if s["text"]), (task, rs, rec["segments"])

    # the workload has preemptions: each preempting task is urgent, and its evasion flew to its end
    preempting = {err.removeprefix("preempted by task ") for rs in runs.values() for _, ok, err in rs if not ok}
    assert preempting, "the workload no longer preempts: the test would show nothing"
    for task in preempting:
        rec = by_task[task]
        assert rec["level"] == "urgent" and rec["status"] == "done", (task, rec["status"], rec["reason"])
        assert runs[task] and all(ok for _, ok, _ in runs[task]), (task, runs[task])
