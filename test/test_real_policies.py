"""bench real-policies: the replay of a run, the step-model fit, the per-task error and the report.

The real runs need the vLLM engine and minutes; here the runs come from the simulator, whose step
model is known, so the bench's machinery can be checked against a truth: a replay with the model the
run was stepped with must give the run back."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from bench import cli
from bench.real_policies import (
    fit_service_steps,
    per_task_errors,
    replay_of,
    save_jobs,
    save_run,
    service_step_times,
)
from timelyllm_ros.engines.sim_engine import SimEngineConfig, bpe_pieces
from timelyllm_ros.measure.records import SegRecord, TaskRecord
from timelyllm_ros.sim.simulator import Replay, SimConfig, Simulator
from timelyllm_ros.sim.workloads import Workload, load_workload

# The engine's geometry (KV blocks, capacity, batch) as in the bench fit the report refits from: the report
# refits step costs only, so "the model is right" needs the same blocks (they decide what the prefix cache saves).
STEP_MODEL = SimEngineConfig(decode_s=0.03, batch_slowdown=0.05, prefill_s_per_token=0.0011, prefill_step_s=0.012,
                             max_batch=8, block_size=32, kv_capacity_tokens=46592)


def _jobs(n: int = 14):
    return load_workload("wid2", 0).jobs[:n]


def _run(jobs, policy: str, seed: int, model: SimEngineConfig):
    """A "real" run: the simulator with a known step model, every step logged as the bench logs the planner's."""
    sim = Simulator(Workload("w", list(jobs)), SimConfig(policy=policy, seed=seed, engine=model))
    steps: list[tuple[int, int, float]] = []
    step = sim.engine.step

    def logged():
        rep = step()
        steps.append((rep.batch_size, rep.prefill_tokens, rep.duration_s))
        return rep

    sim.engine.step = logged
    res = sim.run()
    replay = replay_of(res.records, jobs, bpe_pieces, lambda ids: ids[0],
                       lambda job, rt: sim.prompt_ids(job, rt))
    return res, steps, replay


def test_the_fit_recovers_the_step_model_the_steps_came_from() -> None:
    _, steps, _ = _run(_jobs(), "pud", 0, STEP_MODEL)
    assert any(pf > 0 for _, pf, _ in steps) and len({b for b, pf, _ in steps if pf == 0}) > 1
    # the engine reports every live request as its batch; the fit caps it at the base model's max_batch
    fit = fit_service_steps(steps, SimEngineConfig(max_batch=8, block_size=32))
    assert fit.decode_s == pytest.approx(STEP_MODEL.decode_s, rel=1e-6)
    assert fit.batch_slowdown == pytest.approx(STEP_MODEL.batch_slowdown, rel=1e-6)
    # a prefill step's decode part is priced at the step's batch, which may count the prefilling request
    assert fit.prefill_s_per_token == pytest.approx(STEP_MODEL.prefill_s_per_token, rel=0.01)
    assert fit.prefill_step_s == pytest.approx(STEP_MODEL.prefill_step_s, rel=0.05)
    assert fit.block_size == 32  # the rest comes from the base model


def test_a_step_lasts_until_the_next_one_starts_while_the_engine_stays_busy() -> None:
    # (batch, prefill, engine's own s, call start, call end): 10 ms of the engine thread's own work after
    # the first step; then the engine went idle for a second, so the second step keeps its call's time
    steps = [(1, 0, 0.030, 0.0, 0.031), (1, 0, 0.030, 0.041, 0.072), (2, 0, 0.032, 1.072, 1.105), (1, 5, 0.05)]
    got = service_step_times(steps)
    assert [round(d, 3) for _, _, d in got] == [0.041, 0.031, 0.033, 0.05]
    assert [(b, pf) for b, pf, _ in got] == [(1, 0), (1, 0), (2, 0), (1, 5)]


def test_the_fit_refuses_steps_without_decoding() -> None:
    with pytest.raises(ValueError, match="no decode steps"):
        fit_service_steps([(1, 100, 0.2)], SimEngineConfig())


def test_a_replay_takes_the_runs_plans_prompts_and_robot_times() -> None:
    jobs = _jobs(6)
    res, _, replay = _run(jobs, "pud", 0, STEP_MODEL)
    again = Simulator(Workload("w", jobs), SimConfig(policy="pud", seed=5, engine=STEP_MODEL), replay=replay).run()
    for a, b in zip(res.records, again.records, strict=True):
        assert b.plan == a.plan
        for sa, sb in zip(a.segments, b.segments, strict=True):
            assert sb.exec_s == pytest.approx(sa.exec_s)  # another seed: the times are the replayed ones
    # and a replayed plan is what the engine writes, whatever the template says
    job = jobs[0]
    forced = Replay(plan_pieces={job.job_id: bpe_pieces("tc(90);")})
    rec = Simulator(Workload("w", [job]), SimConfig(engine=STEP_MODEL), replay=forced).run().records[0]
    assert rec.plan.strip() == "tc(90);"


def test_the_planners_warm_up_puts_each_shared_prompt_in_the_cache() -> None:
    job = _jobs(1)
    warm = Simulator(Workload("w", job), SimConfig(engine=STEP_MODEL)).run()
    cold = Simulator(Workload("w", job), SimConfig(engine=STEP_MODEL, warm_prefix=False)).run()
    shared = SimConfig().prompt_shared_tokens
    assert cold.prefill_tokens - warm.prefill_tokens >= shared - STEP_MODEL.block_size
    assert warm.records[0].response_time < cold.records[0].response_time


def _rec(job_id: int, start: float) -> TaskRecord:
    r = TaskRecord(job_id, 0, "find_cat", "drone", "normal", job_id, 0.0, 1.0, 1.0, 1.0, status="done")
    r.segments.append(SegRecord(0, "tc(90);", 1, 0.0, 0.0, start, start + 1.0))
    return r


def test_per_task_error_compares_tasks_served_on_both_sides_only() -> None:
    real = [_rec(0, 1.0), _rec(1, 2.0), _rec(2, 1.0), _rec(3, math.nan)]
    sim = [_rec(0, 1.5), _rec(1, 2.0), _rec(2, math.nan), _rec(3, 1.0)]
    e = per_task_errors(real, sim)
    assert e["tasks_compared"] == 2 and e["median_abs_err"] == pytest.approx(0.25)
    assert e["served_real_only"] == 1 and e["served_sim_only"] == 1


def _saved_runs(tmp_path, model: SimEngineConfig, policies=("pud", "fcfs"), reps=2):
    jobs = _jobs()
    save_jobs(tmp_path, jobs, 1.0, "simulated")
    truth = {}
    for rep in range(reps):
        for p in policies:
            res, steps, replay = _run(jobs, p, rep, model)
            save_run(tmp_path, p, rep, res.admission, res.sim_time_s, steps, res.records, replay)
            truth[(rep, p)] = res
    return truth


def test_the_report_from_saved_runs_gives_the_runs_back_when_the_model_is_right(tmp_path) -> None:
    _saved_runs(tmp_path, STEP_MODEL)
    assert cli.main(["real-policies", "--from-runs", str(tmp_path), "--out", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "results.json").read_text())
    assert rep["reps"] == 2 and rep["tasks"] == 14 and rep["tasks_compared_all"] > 0
    # fitted to the other repetition's steps, which came from the same model: the replay is the run (within
    # the fit's error on the prefill cost)
    assert rep["median_abs_err_all"] < 0.01
    assert rep["ranking"]["real"] == rep["ranking"]["replay"]
    for row in rep["table"]:
        assert row["replay_all_u"] == pytest.approx(row["real_all_u"], abs=0.02)
    # the default --sim-engine (the engine bench fit to this CPU) is another model: its replay shows the error
    assert rep["median_abs_err_bench_fit"] > 0.05
    md = (tmp_path / "results.md").read_text()
    assert "pud" in md and "fcfs" in md and "±" in md
    assert (tmp_path / "real_policies.png").stat().st_size > 10_000


def test_a_replay_with_the_wrong_step_model_shows_its_error(tmp_path) -> None:
    slow = dataclasses.replace(STEP_MODEL, decode_s=0.09)
    _saved_runs(tmp_path, STEP_MODEL, policies=("pud",), reps=1)
    assert cli.main(["real-policies", "--from-runs", str(tmp_path), "--out", str(tmp_path / "r"),
                     "--sim-engine", str(_yaml(tmp_path, slow))]) == 0
    rep = json.loads((tmp_path / "r" / "results.json").read_text())
    assert rep["median_abs_err_all"] < 0.01  # one repetition: fitted to its own steps
    assert rep["median_abs_err_bench_fit"] > max(0.1, 10 * rep["median_abs_err_all"])  # 3x slower decoding


def _yaml(tmp_path, cfg: SimEngineConfig):
    import yaml

    p = tmp_path / "model.yaml"
    p.write_text(yaml.safe_dump({"sim_engine": dataclasses.asdict(cfg)}))
    return p


def test_bad_arguments_are_refused_naming_them(tmp_path) -> None:
    with pytest.raises(SystemExit, match="--policies: unknown"):
        cli.main(["real-policies", "--policies", "pud,nope", "--from-runs", str(tmp_path)])
    with pytest.raises(SystemExit, match="no saved runs"):
        cli.main(["real-policies", "--from-runs", str(tmp_path)])


def test_resume_modes_side_by_side_report_the_engine_work_per_run(tmp_path) -> None:
    """--resume idle,room saves each mode's runs in its own folder; the report shows, per run and per policy,
    prefill steps and tokens, prompt tokens and resumes in place / resubmitted, and compares the modes."""
    jobs = _jobs()
    counted = {"idle": {"resumed_in_place": 1, "resubmitted": 9, "released_held": 0, "submissions": 23,
                        "prompt_tokens": 900, "cached_tokens": 600},
               "room": {"resumed_in_place": 8, "resubmitted": 2, "released_held": 1, "submissions": 16,
                        "prompt_tokens": 500, "cached_tokens": 200}}
    for mode in ("idle", "room"):
        folder = tmp_path / mode
        save_jobs(folder, jobs, 1.0, "simulated")
        for rep in range(2):
            res, steps, replay = _run(jobs, "pud", rep, STEP_MODEL)
            save_run(folder, "pud", rep, res.admission, res.sim_time_s, steps, res.records, replay,
                     engine=counted[mode] | {"resume": mode})
    assert cli.main(["real-policies", "--from-runs", str(tmp_path), "--out", str(tmp_path)]) == 0
    for mode in ("idle", "room"):
        md = (tmp_path / mode / "results.md").read_text()
        assert "prefill steps" in md and "in place / resubmitted" in md
        row = json.loads((tmp_path / mode / "results.json").read_text())["table"][0]
        assert row["engine_resubmitted"] == counted[mode]["resubmitted"] and row["engine_prefill_steps"] > 0
    cmp = json.loads((tmp_path / "comparison.json").read_text())
    (row,) = cmp["rows"]
    assert cmp["modes"] == ["idle", "room"] and row["reps"] == [0, 1]
    assert row["room_prompt_tokens_ratio"] == pytest.approx(500 / 900)
    assert row["room_resubmitted_paired"] == [pytest.approx(2 / 9)] * 2
    assert "room / idle" in (tmp_path / "comparison.md").read_text()
    assert (tmp_path / "comparison.png").stat().st_size > 10_000
    with pytest.raises(SystemExit, match="--resume"):
        cli.main(["real-policies", "--resume", "room,never", "--from-runs", str(tmp_path)])


def test_the_report_gives_each_run_as_a_share_of_the_bound_saved_beside_it(tmp_path) -> None:
    from bench.real_policies import save_bound
    from timelyllm_ros.measure.bound import serial_bound, shares

    truth = _saved_runs(tmp_path, STEP_MODEL, reps=2)
    jobs = _jobs()
    bound = serial_bound(jobs, {j.task_input: 0.15 for j in jobs})  # every task's first segment alone: 0.15 s
    save_bound(tmp_path, bound)
    assert cli.main(["real-policies", "--from-runs", str(tmp_path), "--out", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "results.json").read_text())
    assert rep["bound"] is True
    for row in rep["table"]:
        want = [next(s.share for s in shares(truth[(k, row["policy"])].records, bound) if s.level == "all")
                for k in range(2)]
        assert row["share_all"] == pytest.approx(sum(want) / 2)
    assert "share of bound" in (tmp_path / "results.md").read_text()
