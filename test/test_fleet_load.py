"""`timelyllm-bench fleet-load` with tiny numbers: real planner and fleet processes, nothing lost."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("rclpy")

from bench.cli import main as bench_main  # noqa: E402
from bench.fleet_load import make_schedule, pct  # noqa: E402

pytestmark = pytest.mark.ros


def test_schedule_has_the_poisson_goals_and_the_burst():
    robots = [f"drone_{i}" for i in range(5)]
    s = make_schedule(100, 10.0, 30, robots, seed=1)
    assert len(s) == 130 and [g.at for g in s] == sorted(g.at for g in s)
    assert all(0 <= g.at < 10.0 for g in s)
    burst = [g for g in s if g.burst]
    assert len(burst) == 30 and all(5.0 <= g.at < 6.0 for g in burst)
    assert {g.level for g in s} == {"normal", "urgent"} and {g.robot for g in s} <= set(robots)
    assert make_schedule(100, 10.0, 30, robots, seed=1) == s  # seeded
    assert pct([3.0, 1.0, 2.0], 0.5) == 2.0 and pct([], 0.5) != pct([], 0.5)


def test_fleet_load_smoke(tmp_path):
    out = tmp_path / "fleet_load"
    # a domain of its own: in-process planners of other test modules must not answer
    domain = (int(os.environ.get("ROS_DOMAIN_ID", "0")) + 41) % 100 + 1
    rc = bench_main(["fleet-load", "--goals", "20", "--robots", "4", "--duration", "5", "--burst", "10",
                     "--out", str(out), "--domain-id", str(domain), "--goal-timeout", "60", "--report-wait", "20"])
    res = json.loads((out / "results.json").read_text())
    s = res["summary"]
    assert rc == 0, s
    assert s["goals_sent"] == 30 and s["lost"] == 0
    assert s["terminal_results"] == 30 and s["goal_responses"] == 30
    assert s["accepted"] + s["rejected"] == 30
    assert s["accepted_missing_on_plan_results"] == 0
    assert s["delivered_exactly_once_in_order"] == s["tasks_with_segments"] > 0
    assert s["client_in_order"] == s["tasks_with_segments"]
    assert s["rss_kib"]["before"] and s["rss_kib"]["after"]
    assert len(res["goals"]) == 30
    for name in ("results.json", "results.md", "fleet_load.png", "planner.log", "sim_fleet.log"):
        assert (out / name).stat().st_size > 0, name
    assert "lost (sent, no terminal result)" in (out / "results.md").read_text()
