"""``timelyllm-bench`` tables and the overhead probe, on tiny inputs (no ROS)."""

import argparse

from bench import cli
from timelyllm_ros.sim.workloads import Workload, load_workload


def test_overhead_probe_uses_the_cores_public_accessor():
    row = cli.measure_overhead(16, "pud", reps=3)
    assert row["n"] == 16 and row["median_ms"] > 0


def test_side_by_side_reports_all_tasks_and_statuses(tmp_path):
    wl = load_workload("wid2")
    wl = Workload("wid2-head", wl.jobs[:12], wl.config)
    args = argparse.Namespace(seed=0, context_tokens=150, resume_lead=0.05, engine_config=None)
    results = [cli.run_policy(wl, p, None, args) for p in ("fcfs", "pud")]
    header, rows = cli.side_by_side(results)
    assert "U/b all" in header[1] and rows[-1][0] == "not done" and rows[-1][1:] == ["0", "0"]
    cli.save_results(tmp_path, results, wl, "test")
    assert "U/beta all" in (tmp_path / "summary.md").read_text()
    assert "n_overdue" in (tmp_path / "summary.csv").read_text().splitlines()[0]
