"""``timelyllm-bench pool``: the projection part (a pool of simulated servers under virtual time) on a tiny
workload; no real vLLM, no timings asserted."""

import json

from bench import cli, pool_bench
from timelyllm_ros.engines.pool import EnginePool
from timelyllm_ros.engines.sim_engine import SimEngine

JOBS = 40


def test_pool_projection_accounts_for_every_task_and_uses_both_members(tmp_path):
    out = tmp_path / "pool"
    args = cli.build_parser().parse_args(
        ["pool", "--skip-real", "--servers", "1,2", "--member-batch", "2,256", "--seeds", "2", "--loads", "3",
         "--max-jobs", str(JOBS), "--out", str(out)])
    assert args.fn is pool_bench.cmd_pool
    args.command = "test"
    assert args.fn(args) == 0
    res = json.loads((out / "results.json").read_text())
    assert "real" not in res  # skipped, and nothing was there before
    points = res["projection"]["points"]
    assert {(p["load"], p["member_batch"], p["servers"]) for p in points} == {
        (3, 2, 1), (3, 2, 2), (3, 256, 1), (3, 256, 2)}
    assert res["projection"]["load_scaling"].startswith("fleet")
    for p in points:
        assert p["tasks"] == 3 * JOBS and p["seeds"] == 2  # load 3: three times the fleet, each robot's tasks
        for run in p["per_seed"]:
            assert run["tasks"] == 3 * JOBS  # every task has a terminal result (the simulator raises otherwise)
            assert sum(run["statuses"].values()) == 3 * JOBS and run["statuses"]["other"] == 0
            assert len(run["member_decode_tokens"]) == p["servers"]
            assert sum(run["member_decode_tokens"]) == run["tokens"] > 0
    # A member holds 2 at most: with 2 servers the pool must have placed work on the second one.
    two = next(p for p in points if (p["member_batch"], p["servers"]) == (2, 2))
    assert all(min(r["member_decode_tokens"]) > 0 for r in two["per_seed"])
    md = (out / "results.md").read_text()
    assert "Command: `test`" in md and "| 3 | 2 | 2 |" in md
    assert (out / "pool_projection.png").stat().st_size > 0


def test_a_skipped_part_keeps_its_previous_results(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"kept": 1}))
    args = cli.build_parser().parse_args(["pool", "--skip-real", "--servers", "1", "--member-batch", "4",
                                          "--loads", "1", "--seeds", "1", "--max-jobs", "8", "--out", str(tmp_path)])
    assert args.fn(args) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["kept"] == 1 and [p["servers"] for p in res["projection"]["points"]] == [1]


def test_sim_pool_sums_its_members_token_totals():
    members = [SimEngine(), SimEngine()]
    pool = pool_bench.SimPool(members, background_probes=False)
    assert isinstance(pool, EnginePool)
    members[0].total_decode_tokens, members[1].total_decode_tokens = 3, 4
    members[1].total_prefill_tokens = 5
    assert (pool.total_decode_tokens, pool.total_prefill_tokens) == (7, 5)


def test_a_pool_of_one_simulated_server_runs_as_the_lone_engine():
    """The projection's N=1 point is the simulator's own run: the pool adds no time and no placement effect."""
    import argparse

    from bench.load_sweep import scale_load
    from timelyllm_ros.engines.sim_engine import SimEngineConfig
    from timelyllm_ros.sim.simulator import SimConfig, Simulator
    from timelyllm_ros.sim.workloads import Workload, load_workload

    wl = load_workload("wid2")
    wl = scale_load(Workload("wid2-head", wl.jobs[:JOBS], wl.config), 3)
    one = pool_bench.simulate_pool(wl, 1, 0, SimEngineConfig(), argparse.Namespace(context_tokens=150,
                                                                                    resume_lead=0.05))
    cfg = SimConfig(policy="pud", seed=0, prompt_context_tokens=150, prompt_shared_tokens=2884 - 150)
    cfg.core.resume_lead_s = 0.05
    res = Simulator(wl, cfg).run()
    lone = pool_bench.figures(res.records, res.sim_time_s, res.decode_tokens)
    assert {k: one[k] for k in lone} == lone
