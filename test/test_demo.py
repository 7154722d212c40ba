"""The README's main command, on the simulated engine: the default policy and vLLM-style fcfs on the same tasks in one
run, each policy's admission stated, and a timeline of what every robot did."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from timelyllm_ros.planner.policies import DEFAULT_POLICY

pytest.importorskip("rclpy")

pytestmark = pytest.mark.ros


def test_demo_compares_the_default_policy_with_fcfs_and_draws_what_each_robot_did(tmp_path):
    out = tmp_path / "demo"
    cmd = [sys.executable, "-m", "timelyllm_ros.demo", "--engine", "engine_sim.yaml", "--events", "1",
           "--per-event", "6", "--fleet-time-scale", "0.05", "--no-record", "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    md = (out / "results.md").read_text()
    # the default policy (pud-shed) and fcfs, each under the admission it gets in the simulator too
    assert f"## {DEFAULT_POLICY} (admission adaptive-tuf;" in md and "## fcfs (admission cap256;" in md, md
    # the robots ran in a process of their own, and every result is set beside this run's bound
    assert "robots: a process of their own" in md, md
    assert md.count("| share of bound |") == 2 and "The bound: each task's first" in md, md
    assert (out / "bound.csv").read_text().count("pud-shed") == 3
    assert md.count("seeded from the simulated engine's own step model") == 2, md
    recs = json.loads((out / "records.json").read_text())
    assert set(recs) == {DEFAULT_POLICY, "fcfs"}
    for policy, rs in recs.items():
        assert len(rs) == 6, policy
        assert all(r["status"] == "done" for r in rs), [(r["task_type"], r["status"], r["reason"]) for r in rs]
        assert [r["job_id"] for r in rs] == [r["job_id"] for r in recs[DEFAULT_POLICY]]  # the same tasks
    for png in ("timeline.png", "utility_per_task_type.png", "response_time.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG", png
    assert "nan" not in md.lower().replace("nanosec", "")


def test_a_bag_already_in_the_results_folder_is_refused_before_anything_runs(tmp_path):
    (tmp_path / f"bag_{DEFAULT_POLICY}").mkdir()
    p = subprocess.run([sys.executable, "-m", "timelyllm_ros.demo", "--engine", "engine_sim.yaml", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "a bag is already there" in p.stderr and "--no-record" in p.stderr, p.stderr
    assert "loading the engine" not in p.stdout
