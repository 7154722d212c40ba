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


def test_plan_quality_is_a_bench_command_and_reports_hand_written_plans(tmp_path):
    """The report of `timelyllm-bench plan-quality` from given plans (no engine): counts, table, PNG."""
    from bench import plan_quality
    from timelyllm_ros.domain.plans import plan_templates

    args = cli.build_parser().parse_args(["plan-quality", "--label", "x", "--samples", "2"])
    assert args.fn is plan_quality.cmd_plan_quality and args.samples == 2
    tpls = [t for t in plan_templates().values() if t.name in ("find_cat", "avoid_human_injury")]
    plans = {"find_cat": [("?s('cat')==True{g('cat');}", True), ("g('cat');", True)],
             "avoid_human_injury": [("d(50);mf(50);", True), ("mr(100);", False)]}
    rows = plan_quality.evaluate(tpls, plans)
    by = {r["template"]: r for r in rows}
    assert (by["find_cat"]["valid"], by["find_cat"]["acceptable"], by["find_cat"]["greedy_acceptable"]) == (2, 1, True)
    assert (by["avoid_human_injury"]["valid"], by["avoid_human_injury"]["acceptable"]) == (1, 0)
    run = {"command": "test", "engine": "none", "samples": 2, "temperature": 0.7, "max_new_tokens": 8,
           "git": "x", "wall_s": 0.0, "host": "test", "rows": rows}
    plan_quality.write_report(tmp_path, {"runs": {"x / unconstrained": run}})
    md = (tmp_path / "results.md").read_text()
    assert "| find_cat | normal | yes | yes | yes | 2/2 (100 %) | 1/2 (50 %) | 1/2 (50 %) |" in md  # strict: 3rd, last
    assert "evasive: 50 s pass before the first evasive move" not in md  # mf(50) comes first: it moves on instead
    assert "mf(50) moves the robot before it evades" in md
    assert (tmp_path / "plan_quality.png").stat().st_size > 0
