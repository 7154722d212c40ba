"""Plan lengths learned per task (planner/lengths.py) and the scheduler planning with them (issue 27, item 5)."""

import pytest
from test_scheduler import drain

from timelyllm_ros.domain.clock import SimClock
from timelyllm_ros.domain.tuf import LEVELS
from timelyllm_ros.domain.types import TaskSpec, TaskStatus
from timelyllm_ros.engines.sim_engine import SimEngine
from timelyllm_ros.planner import telemetry
from timelyllm_ros.planner.config import CoreConfig
from timelyllm_ros.planner.core import PlannerCore
from timelyllm_ros.planner.lengths import PlanLengths, Welford, text_key, type_key
from timelyllm_ros.planner.policies import make_policy

PRIOR = {"drone": 6.0, "arm": 12.0}


def sp(text, robot_type="drone", level="normal", task_type=None):
    return TaskSpec(robot_id="r", prompt=text, tuf=LEVELS[level], robot_type=robot_type, task_type=task_type)


def learn(m, spec, plans):
    for toks in plans:
        for k, n in enumerate(toks):
            m.observe_segment(spec, k, n)
        m.observe_plan(spec, toks)


def test_welford_matches_the_sample_statistics():
    w = Welford()
    xs = [4.0, 8.0, 5.0, 9.0, 1.0]
    for x in xs:
        w.add(x)
    mean = sum(xs) / len(xs)
    assert w.n == 5 and w.mean == pytest.approx(mean)
    assert w.var == pytest.approx(sum((x - mean) ** 2 for x in xs) / 4)


def test_keys_normalise_text_and_derive_a_type_without_scene_or_numbers():
    assert text_key("  Move  UP 50\n") == "move up 50"
    a = type_key("Scene: [table_1 x:0.28 y:0.15] Task: [A] move up 50 cm")
    b = type_key("Scene: [bed_2 x:0.5 y:0.5] Task: [A] Move up 80 cm")
    assert a == b == "task: [a] move up # cm"


def test_learns_each_segment_index_and_what_is_left():
    m = PlanLengths(PRIOR)
    s = sp("find the cat")
    learn(m, s, [[4, 8, 2]] * 3)
    p0 = m.predict(s, 0)
    assert (p0.seg_mean, p0.seg_std, p0.seg_level) == (4.0, 0.0, "text")
    assert (p0.rem_segments, p0.rem_tokens_mean, p0.rem_level) == (3.0, 14.0, "text")
    p1 = m.predict(s, 1)
    assert (p1.seg_mean, p1.rem_segments, p1.rem_tokens_mean) == (8.0, 2.0, 10.0)
    assert m.predict(s, 2).seg_mean == 2.0


def test_fallback_chain_text_type_robot_prior():
    m = PlanLengths(PRIOR, min_obs=2)
    known = sp("Scene: [a] Task: [A] move up 50 cm")
    learn(m, known, [[9, 3], [9, 3]])
    assert m.predict(known, 0).seg_level == "text"
    same_type = sp("Scene: [other scene] Task: [A] move up 80 cm")  # new text, same derived type
    p = m.predict(same_type, 0)
    assert (p.seg_level, p.seg_mean, p.rem_level, p.rem_tokens_mean) == ("type", 9.0, "type", 12.0)
    named = sp("another text", task_type="lift")  # a caller-named type is its own key
    learn(m, named, [[20], [20]])
    assert m.predict(sp("yet another text", task_type="lift"), 0).seg_mean == 20.0
    other = sp("land now")  # same robot type only
    assert m.predict(other, 0).seg_level == "robot"
    arm = m.predict(sp("stack the blocks", robot_type="arm"), 0)
    assert (arm.seg_level, arm.seg_mean, arm.rem_level) == ("prior", 12.0, "prior")
    assert arm.seg_std == pytest.approx(6.0)  # prior_cv x the prior
    assert m.predict(sp("x", robot_type="chatbot"), 0).seg_mean == 8.0  # no prior: the default


def test_an_index_never_seen_falls_back_to_the_tasks_other_segments_then_wider():
    m = PlanLengths(PRIOR)
    s = sp("find the cat")
    learn(m, s, [[4, 8], [4, 8]])
    p = m.predict(s, 5)  # past every plan of the task
    assert p.seg_level == "text" and p.seg_mean == pytest.approx(6.0)  # any segment of the task
    assert p.rem_segments >= 1 and p.rem_tokens_mean >= p.seg_mean  # something is always left


def test_too_few_observations_fall_back():
    m = PlanLengths(PRIOR, min_obs=3)
    s = sp("find the cat")
    learn(m, s, [[10], [10]])
    assert m.predict(s, 0).seg_level == "prior"
    learn(m, s, [[10]])
    assert m.predict(s, 0).seg_level == "text"


def test_uncertainty_from_the_spread_and_quantiles():
    m = PlanLengths(PRIOR)
    s = sp("keys or wallet")
    learn(m, s, [[4], [6], [8], [10]])
    p = m.predict(s, 0)
    assert p.seg_mean == 7.0 and p.seg_std == pytest.approx(2.582, abs=1e-3)
    assert p.seg_quantile(0.5) == 7.0
    assert p.seg_quantile(0.9) > p.seg_mean > p.seg_quantile(0.1)
    assert p.seg_quantile(0.9) == pytest.approx(7.0 + 1.2816 * 2.582, abs=1e-2)
    assert p.rem_quantile(0.9) > p.rem_tokens_mean
    steady = sp("steady task")
    learn(m, steady, [[5], [5], [5]])
    assert m.predict(steady, 0).seg_quantile(0.99) == 5.0  # no spread, no margin


def test_memory_is_bounded_lru_and_keeps_the_robot_key():
    m = PlanLengths(PRIOR, max_keys=6)
    for i in range(200):
        learn(m, sp(f"task number {i} of many", task_type=f"type{i}"), [[3 + i % 5], [3 + i % 5]])
    assert len(m) <= 6
    assert m.describe()["robot"] == 1  # touched by every update: never the one evicted
    assert m.predict(sp("task number 0 of many", task_type="type0"), 0).seg_level == "robot"  # evicted
    assert m.predict(sp("task number 199 of many", task_type="type199"), 0).seg_level == "text"  # recent: kept
    with pytest.raises(ValueError):
        PlanLengths(PRIOR, max_keys=2)


def test_indexes_past_max_index_share_the_last_slot():
    m = PlanLengths(PRIOR, max_index=4)
    s = sp("a long loop")
    learn(m, s, [[2] * 10, [2] * 10])
    assert m.predict(s, 9).seg_mean == 2.0
    assert m.predict(s, 2).rem_tokens_mean == 16.0


# -- the scheduler --------------------------------------------------------------------------------------

LONG = "?iv('keyboard')==True{g('keyboard');};tp();mu(50);"
SHORT = "d(3);"


def make_core(clock, **cfg):
    results = []
    core = PlannerCore(SimEngine(), make_policy("pud"), clock, config=CoreConfig(**cfg), on_result=results.append)
    return core, results


def task(i, text, plan, level="normal"):
    return TaskSpec(robot_id=f"r{i}", prompt=text, tuf=LEVELS[level], task_id=f"t{i}", arrival=None,
                    extra={"plan_text": plan})


def trained(clock, **cfg):
    core, results = make_core(clock, **cfg)
    for i in range(3):
        core.submit(task(i, "look for the keyboard and go there", LONG))
        core.submit(task(100 + i, "descend", SHORT))
        drain(core, clock)
    assert all(r.status is TaskStatus.DONE for r in results) and len(results) == 6
    core.trained_results = results
    return core


def test_the_scheduler_plans_a_long_task_longer_after_learning():
    clock = SimClock()
    core = trained(clock)
    assert core.snapshot()["length_model"] == "learned"
    core.submit(task(10, "look for the keyboard and go there", LONG))
    core.submit(task(11, "descend", SHORT))
    long_g, short_g = core.generation("t10"), core.generation("t11")
    firsts = {r.task_id: len(r.segments[0].token_ids) for r in core.trained_results}
    assert long_g.tok_est == pytest.approx(firsts["t0"])  # exactly its first segment's tokens
    assert short_g.tok_est == pytest.approx(firsts["t100"])
    assert long_g.tok_est > short_g.tok_est
    assert long_g.rem_tok_est > 2 * short_g.rem_tok_est  # the whole plan left
    # PUD ranks with it: G = tok_est x the step time (the short task's first segment is cheaper)
    rows = {r["task_id"]: r for r in telemetry.queue_view(core)}
    assert rows["t10"]["slack_s"] < rows["t11"]["slack_s"]
    drain(core, clock)


def test_the_estimate_follows_the_plan_segment_by_segment():
    clock = SimClock()
    core = trained(clock)
    core.submit(task(20, "look for the keyboard and go there", LONG))
    seen = []
    for _ in range(2000):
        g = core.generation("t20")
        if g is None:
            break
        seen.append((len(g.segments), g.tok_est))
        rep = core.start_step()
        if rep is not None:
            clock.advance(rep.duration_s)
            core.complete_step(rep)
        else:
            clock.set(max(core.next_wakeup() or clock.now(), clock.now()))
    by_k = dict(seen)
    (before,) = [r for r in core.trained_results if r.task_id == "t0"]
    # (and one more index: a plan that ends at a segment boundary writes its end of text in a step of its own)
    assert len(before.segments) >= 3 and set(range(len(before.segments))) <= set(by_k)
    for k, seg in enumerate(before.segments):  # each index planned with what that segment really took
        assert by_k[k] == pytest.approx(len(seg.token_ids)), k
    assert len({len(s.token_ids) for s in before.segments}) > 1  # the plan's segments do differ


def test_urgent_tasks_plan_with_a_high_quantile():
    clock = SimClock()
    core, _ = make_core(clock)
    s = TaskSpec(robot_id="x", prompt="varies", tuf=LEVELS["normal"])
    for n in (4, 6, 8, 10, 4, 6, 8, 10):  # taught directly: the spread of a model's sampled plans
        core.lengths.learned.observe_segment(s, 0, n)
    core.submit(task(1, "varies", SHORT, level="normal"))
    core.submit(task(2, "varies", SHORT, level="urgent"))
    normal, urgent = core.generation("t1").tok_est, core.generation("t2").tok_est
    assert normal == pytest.approx(7.0)
    assert urgent > 9.0  # the 90 % quantile


def test_ewma_keeps_todays_per_robot_type_estimate():
    clock = SimClock()
    core = trained(clock, length_model="ewma")
    core.submit(task(10, "look for the keyboard and go there", LONG))
    core.submit(task(11, "descend", SHORT))
    assert core.generation("t10").tok_est == core.generation("t11").tok_est == core.lengths.mean("drone")
    assert core.lengths.learned.predict(core.generation("t10").spec, 0).seg_level == "text"  # still learned, not used
    drain(core, clock)


def test_length_settings_are_checked():
    with pytest.raises(ValueError, match="length_model"):
        CoreConfig(length_model="oracle")
    with pytest.raises(ValueError, match="length_quantile_urgent"):
        CoreConfig(length_quantile_urgent=1.0)


# -- the benchmark ------------------------------------------------------------------------------------------

def test_bench_cuts_recorded_plans_as_the_planner_does_and_beats_todays_estimate():
    from bench.plan_lengths import prediction_error, recorded_plans, segment
    from timelyllm_ros.engines.sim_engine import bpe_pieces
    from timelyllm_ros.planner.hooks import SkillHooks

    pieces = bpe_pieces("?s('cat')==True{g('cat');};")
    toks, calls = segment(SkillHooks(learn=False), "drone", pieces)
    assert sum(toks) == len(pieces) and len(toks) >= 2 and calls[0] and not calls[-1]  # '};' calls nothing
    plans = recorded_plans()
    real = plans["real engine (real_policies runs)"]
    assert len(real) > 100
    e = prediction_error(real[:300], CoreConfig().segment_tokens_prior)
    assert e["segments"] == sum(len(p.seg_tokens) for p in real[:300])
    assert e["mae"]["learned"] < e["mae"]["ewma"]
    assert 0.0 <= e["coverage_10_90"] <= 1.0


def test_bench_runs_both_length_models_on_one_workload():
    from bench.plan_lengths import VARIANTS, _sim, summarize
    from timelyllm_ros.sim.workloads import Workload, load_workload

    wl = load_workload("wid2")
    wl = Workload("wid2-head", wl.jobs[:12], wl.config)
    point = {"scenario": "s", "policy": "pud", "x": 1, **{v: _sim(wl, "pud", 0, v) for v in VARIANTS}}
    (row,) = summarize([point])
    assert set(VARIANTS) <= set(point) and row["runs"] == 1
    assert -2.0 <= row["ewma_all"] <= 1.0 and -2.0 <= row["learned_all"] <= 1.0
