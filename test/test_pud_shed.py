"""pud-shed (feasibility-aware utility accrual) on hand-built cases, and the load-sweep bench command."""

import json
import math

import pytest
from test_scheduler import drain, spec

from timelyllm_ros.domain.clock import SimClock
from timelyllm_ros.domain.tuf import LEVELS
from timelyllm_ros.domain.types import TaskSpec, TaskStatus
from timelyllm_ros.engines.sim_engine import SimEngine
from timelyllm_ros.planner.core import PlannerCore
from timelyllm_ros.planner.generation import Generation
from timelyllm_ros.planner.policies import POLICIES, RankContext, make_policy

CTX = RankContext(comm_s=0.008, per_token_s=0.02, slack_floor_s=0.001)


def gen(level="normal", arrival=0.0, k=0, prev_end=math.nan, seq=0, tok=5.0, prefill=0.0):
    g = Generation(TaskSpec(robot_id="r", prompt="p", tuf=LEVELS[level]), f"t{seq}", arrival, seq)
    g.k, g.prev_end, g.tok_est, g.prefill_est_s = k, prev_end, tok, prefill
    return g


def test_pud_shed_is_registered_and_orders_exactly_as_pud():
    assert "pud-shed" in POLICIES
    shed, pud = make_policy("pud-shed"), make_policy("pud")
    assert shed.sheds and shed.segmented and shed.streams and not pud.sheds
    gens = [gen("normal", seq=0), gen("urgent", arrival=0.05, seq=1), gen("urgent", arrival=-2.0, seq=2),
            gen("normal", k=1, prev_end=0.4, seq=3)]
    assert shed.priorities(gens, 0.1, CTX) == pud.priorities(gens, 0.1, CTX)


def test_hopeless_only_when_even_the_estimate_cannot_earn_positive_utility():
    shed = make_policy("pud-shed")
    urgent = gen("urgent", arrival=0.0)  # ERT 0.2 s, utility 0 at 0.5 s
    assert not shed.hopeless(urgent, 0.2, 0.1, 0.008)  # response 0.308 s: late, still positive
    assert shed.hopeless(urgent, 0.45, 0.1, 0.008)  # response 0.558 s: past the cutoff
    assert shed.hopeless(urgent, 0.5 - 0.108, 0.1, 0.008)  # exactly at the cutoff: 0 is not positive
    normal = gen("normal", arrival=0.0)  # utility 0 at 1.5 s
    assert not shed.hopeless(normal, 1.3, 0.1, 0.008) and shed.hopeless(normal, 1.4, 0.1, 0.008)
    # A later segment is never shed (the robot is mid-plan), however late; PUD never sheds.
    assert not shed.hopeless(gen("normal", k=2, prev_end=0.0), 100.0, 0.1, 0.008)
    assert not make_policy("pud").hopeless(urgent, 100.0, 0.1, 0.008)


def make_core(policy="pud-shed", clock=None):
    results = []
    core = PlannerCore(SimEngine(), make_policy(policy), clock or SimClock(), on_result=results.append)
    return core, results


def test_core_sheds_a_hopeless_queued_task_with_an_explicit_result():
    clock = SimClock(10.0)
    core, results = make_core(clock=clock)
    core.submit(spec(0, level="urgent", arrival=9.0))  # 1 s old: past its 0.5 s cutoff before anything runs
    core.submit(spec(1, level="normal", arrival=10.0))
    drain(core, clock)
    st = {r.task_id: r for r in results}
    assert set(st) == {"t0", "t1"}  # every task ends in a result
    assert st["t0"].status is TaskStatus.OVERDUE and "queued, shed by pud-shed" in st["t0"].reason
    assert st["t0"].segments == [] and st["t1"].status is TaskStatus.DONE


def test_pud_serves_the_same_hopeless_task_late():
    clock = SimClock(10.0)
    core, results = make_core("pud", clock=clock)
    core.submit(spec(0, level="urgent", arrival=9.0))
    drain(core, clock)
    (res,) = results
    assert res.status is TaskStatus.DONE and res.utility < 0


def test_core_aborts_a_running_first_segment_that_became_hopeless():
    clock = SimClock(0.0)
    core, results = make_core(clock=clock)
    core.submit(spec(0, level="urgent", arrival=0.0))
    rep = core.start_step()  # admitted: in the engine's batch, no segment yet
    clock.advance(rep.duration_s)
    core.complete_step(rep)
    assert core.running_ids() == ["t0"] and not results
    clock.set(0.6)  # past the urgent cutoff (0.5 s) while its first segment is unfinished
    core.start_step()
    (res,) = results
    assert res.status is TaskStatus.OVERDUE and "running, shed by pud-shed" in res.reason
    assert core.running_ids() == [] and core.pending() == 0


def test_a_cold_prompt_does_not_make_the_next_ones_look_hopeless():
    """After a prompt missed the prefix cache, the ranking's prefill estimate (a running average of the hits)
    stays pessimistic for a while; shedding uses the best case (the largest hit seen), so an urgent task that
    can still make it is served, not shed."""
    clock = SimClock(0.0)
    core, results = make_core(clock=clock)
    prompt = list(range(3000))  # ~0.34 s to prefill uncached at the engine's prior cost

    def task(tid, level, arrival):
        return TaskSpec(robot_id=tid, prompt="p", tuf=LEVELS[level], task_id=tid, arrival=arrival,
                        prompt_token_ids=prompt, extra={"plan_text": "tc(30);"})

    core.submit(task("cold", "normal", 0.0))  # no hit
    drain(core, clock)
    core.submit(task("warm", "normal", clock.now()))  # all but a block cached: the average hit is 1/5 of it
    drain(core, clock)
    now = clock.now()
    core.submit(task("urgent", "urgent", now - 0.15))  # 0.15 s + an average-based prefill (~0.26 s) would be hopeless
    drain(core, clock)
    res = {r.task_id: r for r in results}
    assert [res[t].status for t in ("cold", "warm", "urgent")] == [TaskStatus.DONE] * 3
    assert res["urgent"].utility > 0


def test_sweep_helpers():
    from bench.load_sweep import mean_ci, scale_load
    from timelyllm_ros.sim.workloads import load_workload

    wl = load_workload("wid2")
    fast = scale_load(wl, 2.0)
    assert [j.trigger_time for j in fast.jobs] == pytest.approx([j.trigger_time / 2 for j in wl.jobs])
    assert len(fast.jobs) == len(wl.jobs) and wl.jobs[0].trigger_time > fast.jobs[0].trigger_time
    m, ci = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and ci == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    with pytest.raises(ValueError):
        scale_load(wl, 0.0)
    from bench.load_sweep import jitter

    assert jitter(wl, 0.0, 1) is wl
    a, b = jitter(wl, 0.02, 1), jitter(wl, 0.02, 1)
    assert [j.trigger_time for j in a.jobs] == [j.trigger_time for j in b.jobs]  # seeded
    shift = {j.job_id: j.trigger_time for j in a.jobs}
    d = [shift[j.job_id] - j.trigger_time for j in wl.jobs]
    assert all(0.0 <= x <= 0.02 for x in d) and len(set(d)) > 1
    first_event = [x for j, x in zip(wl.jobs, d, strict=True) if j.trigger_time - wl.jobs[0].trigger_time < 0.01]
    assert len(first_event) > 1 and max(first_event) - min(first_event) < 1e-12  # an event moves as one


def test_load_sweep_command_writes_results_and_counts_every_task(tmp_path):
    from bench import cli, load_sweep

    args = cli.build_parser().parse_args(
        ["load-sweep", "--workloads", "wid2", "--loads", "1,3", "--bursts", "8", "--seeds", "1", "--max-jobs", "12",
         "--policies", "pud-shed,pud,edf-seg", "--out", str(tmp_path)])
    assert args.fn is load_sweep.cmd_load_sweep
    assert args.fn(args) == 0
    for f in ("results.json", "summary.md", "load_wid2.png", "burst_wid2.png"):
        assert (tmp_path / f).stat().st_size > 0, f
    res = json.loads((tmp_path / "results.json").read_text())
    pts = res["sweeps"]["load-wid2"]["points"]
    assert {(p["x"], p["policy"]) for p in pts} == {(x, p) for x in (1.0, 3.0) for p in ("pud-shed", "pud", "edf-seg")}
    for p in pts + res["sweeps"]["burst-wid2"]["points"]:
        for run in p["per_seed"]:
            assert sum(run["statuses"].values()) == run["n"] and run["statuses"]["other"] == 0
            assert run["n_urgent"] + run["n_normal"] == run["n_all"] == run["n"]
    assert all(p["n"] == 12 * p["x"] for p in pts)  # load x3: three times the fleet (--scale fleet)
    assert res["load_scaling"].startswith("fleet")
    assert "diff_pud_all" in next(p for p in pts if p["policy"] == "pud-shed")
    assert "U/beta over **all** tasks" in (tmp_path / "summary.md").read_text()


def test_a_prompt_longer_than_those_served_counts_its_own_warmed_prefix_as_its_best_case():
    """Shedding's best case for a prompt is the most of it the cache can hold. The largest hit the robot type had
    was no such bound for a longer prompt: an emergency's two example families make the drone's longest prompt,
    and after a shorter normal prompt's hit its best case looked ~350 tokens of prefill too long; at the trace's
    own pace on the CPU pud-shed shed every urgent task, which edf-seg served inside the cut-off."""
    from timelyllm_ros.engines.sim_engine import SimEngineConfig

    clock = SimClock(0.0)
    results = []
    eng = SimEngine(SimEngineConfig(prefill_s_per_token=0.0003))
    core = PlannerCore(eng, make_policy("pud-shed"), clock, on_result=results.append)
    short, long_ = list(range(5000, 6000)), list(range(5000, 5500)) + list(range(9000, 11500))
    for p in (short, long_):
        eng.warm_prefix(p)
        core.note_warm_prompt("drone", p + [1, 2])
    first = spec(0, arrival=0.0)
    first.prompt_token_ids = short + [7, 8]
    core.submit(first)
    drain(core, clock)
    assert core.prefill.best_hit("drone") < len(long_) - 1000  # the hit the robot type has had: the short one's
    urgent = spec(1, level="urgent", arrival=clock.now())
    urgent.prompt_token_ids = long_ + [7, 8, 9]
    assert core.estimator.prefill_time(len(long_) - core.prefill.best_hit("drone")) > LEVELS["urgent"].cutoff
    core.submit(urgent)
    drain(core, clock)
    r = next(x for x in results if x.task_id == urgent.task_id)
    assert r.status == TaskStatus.DONE and r.response_time < LEVELS["urgent"].cutoff, r.reason


def test_a_prompt_sent_again_is_estimated_from_the_cache_its_first_sending_left():
    """The same emergency sent twice: the second finds all of its prompt but the last block in the cache, yet was
    estimated from the warmed prefix alone (~75 uncached tokens on the CPU where the engine computed < 32), which
    made shedding and admission plan with prefills 2-3x too long. A run of new tasks pushes no warmed prefix out."""
    from timelyllm_ros.planner.prefill import SERVED_PROMPTS_KEPT, WARM_PROMPTS_KEPT

    clock = SimClock(0.0)
    eng = SimEngine()
    core = PlannerCore(eng, make_policy("pud-shed"), clock)
    block = core.prefill.block_tokens(eng)
    shared = list(range(5000, 5000 + 40 * block))
    eng.warm_prefix(shared)
    core.note_warm_prompt("drone", shared + [1, 2])
    prompt = shared + list(range(9000, 9000 + 3 * block + 5))
    first = spec(0, level="urgent", arrival=0.0)
    first.prompt_token_ids = list(prompt)
    core.submit(first)
    assert core.generation(first.task_id).warm_hit == len(shared)
    drain(core, clock)
    again = spec(1, level="urgent", arrival=clock.now())
    again.prompt_token_ids = list(prompt)
    core.submit(again)
    g = core.generation(again.task_id)
    assert g.warm_hit == len(prompt) // block * block  # all but the last, partial block
    assert g.prefill_est_s == pytest.approx(core.estimator.prefill_time(len(prompt) - g.warm_hit))
    for i in range(2 * max(SERVED_PROMPTS_KEPT, WARM_PROMPTS_KEPT)):  # new tasks, each served
        core.prefill.note_served("drone", [7000 + i] * 50, eng)
    fresh = spec(2, arrival=clock.now())
    fresh.prompt_token_ids = shared + [3] * 40
    assert core.prefill.warm_hit(fresh, eng) == len(shared)  # the warmed prefix is still known
    drain(core, clock)
    core.replace_engine(SimEngine())
    assert core.prefill.warm_hit(again, core.engine) is None  # a new engine's cache holds nothing of them


def test_preempt_audit_lists_the_tasks_the_policies_end_differently(tmp_path, monkeypatch):
    """bench.preempt_audit on the WID 1 trace at 2x the fleet: the tasks pud-shed, pud and edf-seg end differently,
    each with when its segments reached the robot, and what a task cut short by its robot's next one had earned."""
    import sys

    from bench import preempt_audit

    monkeypatch.setattr(sys, "argv", ["preempt_audit", "--seeds", "0", "--out", str(tmp_path)])
    assert preempt_audit.main() == 0
    run = json.loads((tmp_path / "preempt_audit.json").read_text())["runs"][0]
    assert run["rows"], "the policies ended every task alike"
    for row in run["rows"]:
        assert len({row[p]["status"] for p in preempt_audit.POLICIES}) > 1
        for p in preempt_audit.POLICIES:
            if row[p]["status"] == "cancelled":  # cut short by its robot's next task, after some segments
                assert "preempted by task" in row[p]["reason"] and row[p]["segments_at_s"]
    for p in preempt_audit.POLICIES:
        cut = sum(1 for row in run["rows"] if row[p]["status"] == "cancelled")
        assert run[f"{p}_cancelled_served"] >= cut
        assert 0 <= run[f"{p}_cancelled_u"] <= run[f"{p}_cancelled_served"]
    assert "Tasks lost to their own robot's next task" in (tmp_path / "preempt_audit.md").read_text()


def test_scale_fleet_adds_robots_at_the_traces_pace():
    from bench.load_sweep import scale_fleet
    from timelyllm_ros.sim.workloads import load_workload

    wl = load_workload("wid2")
    agents = sorted({j.agent_id for j in wl.jobs})

    def streams(w):  # each robot's task stream: (arrival, trace id, task) in order
        out: dict[int, list] = {}
        for j in w.jobs:
            out.setdefault(j.agent_id, []).append((j.trigger_time, j.trace_id, j.task_input))
        return out

    mine = streams(wl)
    for f, n_agents in ((2.0, 2 * len(agents)), (1.5, len(agents) + round(0.5 * len(agents))),
                        (0.5, round(0.5 * len(agents)))):
        big = scale_fleet(wl, f, seed=3)
        got = streams(big)
        assert len(got) == n_agents and len({j.job_id for j in big.jobs}) == len(big.jobs), f
        stride = max(agents) + 1
        # every robot runs one of the trace's robots' streams unchanged: no robot gets tasks faster
        assert all(s == mine[a % stride] for a, s in got.items()), f
        assert [j.trigger_time for j in big.jobs] == sorted(j.trigger_time for j in big.jobs)
        assert big.config["load_scaling"] == "fleet"
    assert scale_fleet(wl, 1.5, seed=3).jobs == scale_fleet(wl, 1.5, seed=3).jobs  # seeded
    assert streams(scale_fleet(wl, 1.0)) == mine
    with pytest.raises(ValueError, match="load factor"):
        scale_fleet(wl, 0.0)


@pytest.mark.parametrize("warmed", [True, False])
def test_the_first_task_after_warm_up_counts_the_warmed_prefix_as_cached(warmed):
    """A planner warms each robot type's shared prompt before serving. A cold 3000-token prompt at the
    GPU prior's prefill cost would take past an urgent cutoff, a warm one would not: the first urgent task
    must not be shed for a prefill the prefix cache already holds (it was, on the real CPU engine)."""
    from timelyllm_ros.engines.sim_engine import SimEngineConfig

    clock = SimClock(0.0)
    results = []
    eng = SimEngine(SimEngineConfig(prefill_s_per_token=0.0002))
    core = PlannerCore(eng, make_policy("pud-shed"), clock, on_result=results.append)
    shared = list(range(5000, 8000))
    if warmed:
        eng.warm_prefix(shared)
        core.note_warm_prompt("drone", shared + [1, 2])  # the warm-up's own task text follows the shared part
    s = spec(0, level="urgent", arrival=0.0)
    s.prompt_token_ids = shared + [7, 8, 9]
    assert core.estimator.prefill_time(len(s.prompt_token_ids)) > LEVELS["urgent"].cutoff  # cold: hopeless
    core.submit(s)
    drain(core, clock)
    (r,) = results
    if warmed:
        assert r.status == TaskStatus.DONE and r.response_time < LEVELS["urgent"].cutoff
    else:
        assert r.status == TaskStatus.OVERDUE  # what it did before: shed at once
