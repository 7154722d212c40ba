"""Latency-guided admission (design §6): the deadline-protecting rule and the previous cutoff rule; the
step-time estimate it runs on; the admission each policy gets."""

import math
import random

import pytest

from timelyllm_ros import paths
from timelyllm_ros.domain.clock import SimClock
from timelyllm_ros.domain.tuf import LEVELS
from timelyllm_ros.domain.types import TaskSpec
from timelyllm_ros.engines.base import StepModel
from timelyllm_ros.engines.latency import PAPER_PRIOR, PREFILL_WINDOW, LatencyEstimator
from timelyllm_ros.engines.sim_engine import SimEngine, SimEngineConfig
from timelyllm_ros.planner.admission import VLLM_MAX_NUM_SEQS, AdmissionView, LatencyGuided, make_admission
from timelyllm_ros.planner.config import CoreConfig
from timelyllm_ros.planner.core import PlannerCore
from timelyllm_ros.planner.generation import Generation
from timelyllm_ros.planner.policies import make_policy


def gen(level="normal", arrival=0.0, k=0, prev_end=math.nan, seq=0, tok=5.0, prefill=0.026):
    g = Generation(TaskSpec(robot_id=f"r{seq}", prompt="p", tuf=LEVELS[level]), f"t{seq}", arrival, seq)
    g.k, g.prev_end, g.tok_est, g.prefill_est_s = k, prev_end, tok, prefill
    return g


def view(running, now=0.0):
    return AdmissionView(list(running), now, 0.008, 0.1, LatencyEstimator())


def test_names_and_modes():
    assert make_admission("adaptive").name == "adaptive"
    assert make_admission("adaptive-tuf").name == "adaptive-tuf" and make_admission("adaptive-tuf").weigh
    # auto weighs (issue 37: simultaneous urgent goals otherwise share one long prefill); adaptive is the rule without
    assert make_admission("auto", segmented=True).weigh and not make_admission("adaptive-ert").weigh
    assert make_admission("auto", segmented=True).name == "adaptive-tuf"
    assert make_admission("adaptive").mode == "protect"
    assert make_admission("adaptive-cutoff").mode == "cutoff"
    assert make_admission("adaptive-cutoff").name == "adaptive-cutoff"
    with pytest.raises(ValueError):
        LatencyGuided(mode="nope")


def test_idle_engine_always_admits():
    assert LatencyGuided().admit(view([]), gen("normal"))


def test_normal_prefill_kept_out_of_an_urgent_first_segment():
    # prefill pending, 5 tokens expected: ready at ~0.17 s, ~0.195 s with the normal's prefill (ERT 0.2 s - hop)
    urgent = gen("urgent", arrival=0.0, seq=1)
    normal = gen("normal", arrival=0.0, seq=2)
    adm = LatencyGuided()
    assert not adm.admit(view([urgent], now=0.03), normal)
    assert adm.admit(view([urgent], now=0.0), normal)  # earlier, both fit
    # design §6's worst case (10 tokens) already makes the urgent one late: protect it too
    assert not LatencyGuided(worst_case=True).admit(view([urgent], now=0.0), normal)
    # the previous rule measured slack to the 0.5 s cutoff and let it in
    assert make_admission("adaptive-cutoff").admit(view([urgent], now=0.03), normal)


def test_more_urgent_candidate_is_never_blocked_by_a_less_urgent_runner():
    normal = gen("normal", arrival=0.0, seq=1)
    urgent = gen("urgent", arrival=0.0, seq=2)
    assert LatencyGuided().admit(view([normal], now=0.01), urgent)


def test_candidate_that_cannot_wait_is_admitted():
    # Two urgent tasks of one burst: the second cannot wait for the first and still
    # make its own ERT, so it joins (one prefill step for both beats two in a row).
    a = gen("urgent", arrival=0.0, seq=1)
    b = gen("urgent", arrival=0.001, seq=2)
    assert LatencyGuided().admit(view([a], now=0.01), b)


def test_normal_admitted_once_the_urgent_is_nearly_done():
    urgent = gen("urgent", arrival=0.0, seq=1, tok=6.0)
    normal = gen("normal", arrival=0.0, seq=2)
    adm = LatencyGuided()
    v = view([urgent], now=0.05)
    assert not adm.admit(v, normal)
    # Pretend the urgent segment has 9 of its 10 worst-case tokens and its prefill is done:
    # one more step with the normal's prefill still ends well before its 0.2 s deadline.
    urgent.req = type("R", (), {"output_token_ids": [0] * 9})()
    urgent.seg_start_len = 0
    assert adm.admit(v, normal)


def test_a_prefill_budget_spreads_new_prompts_over_steps_but_never_holds_back_one_that_cannot_wait():
    """prefill_step_s: a step cannot be cut, so an urgent goal arriving during it waits for all of it; the
    budget keeps the prompts one step prefills short. Normal tasks with time to spare go one step later."""
    adm = LatencyGuided(prefill_step_s=0.05)
    first = gen("normal", arrival=0.0, seq=1, prefill=0.03)
    second = gen("normal", arrival=0.0, seq=2, prefill=0.03)
    assert adm.admit(view([], now=0.0), first)  # an idle engine takes any prompt, however long
    assert not adm.admit(view([first], now=0.0), second)  # 60 ms of prefill in one step: wait a step
    assert LatencyGuided().admit(view([first], now=0.0), second)  # without the budget (the default): the same step
    first.req = type("R", (), {"output_token_ids": [0]})()  # its prompt is through: nothing prefills
    first.seg_start_len = 0
    assert adm.admit(view([first], now=0.0), second)
    long = gen("normal", arrival=0.0, seq=3, prefill=0.4)
    assert adm.admit(view([first], now=0.0), long)  # a prompt over the budget goes alone, not never
    # an urgent candidate that cannot wait a step for a normal prompt is admitted beside it
    normal = gen("normal", arrival=0.0, seq=4, prefill=0.03)
    urgent = gen("urgent", arrival=0.0, seq=5, prefill=0.03, tok=12.0)
    assert adm.admit(view([normal], now=0.0), urgent)
    with pytest.raises(ValueError, match="prefill_step_s"):
        LatencyGuided(prefill_step_s=0)


def test_the_core_config_sets_the_prefill_budget_of_the_admission_it_builds():
    cfg = CoreConfig(prefill_step_ms=50.0)
    for spec in ("auto", "latency", None):
        core = PlannerCore(SimEngine(), make_policy("pud-shed"), SimClock(), admission=spec, config=cfg)
        assert core.admission.prefill_step_s == 0.05
    core.set_policy(make_policy("edf-seg"))  # 'auto' is rebuilt for the new policy, with the budget
    assert core.admission.prefill_step_s == 0.05
    assert PlannerCore(SimEngine(), make_policy("pud-shed"), SimClock(), admission="auto").admission.prefill_step_s \
        is None  # off by default
    core = PlannerCore(SimEngine(), make_policy("fcfs"), SimClock(), admission="auto", config=cfg)
    assert not isinstance(core.admission, LatencyGuided)  # vLLM's own admission for the baseline: no budget
    with pytest.raises(ValueError, match="prefill_step_ms"):
        CoreConfig(prefill_step_ms=-1.0)


def test_resumed_segment_with_tight_slack_is_not_starved():
    urgent = gen("urgent", arrival=0.0, seq=1)
    # a normal generation resuming s_1: its robot finishes s_0 in 60 ms, so it cannot wait
    resumed = gen("normal", arrival=-5.0, k=1, prev_end=0.07, seq=2)
    assert LatencyGuided().admit(view([urgent], now=0.01), resumed)


def _drive(core: PlannerCore, clock: SimClock, steps: int = 5000) -> None:
    """Run the core on its simulated engine until nothing is left to do."""
    for _ in range(steps):
        rep = core.start_step()
        if rep is None:
            w = core.next_wakeup()
            if w is None:
                return
            clock.set(max(w, clock.now()))
            continue
        clock.advance(rep.duration_s)
        core.complete_step(rep)


def test_burst_urgent_first_segments_meet_ert_with_normals_in_the_queue():
    """A burst of 2 urgent + 6 normal tasks on an idle engine: the normals' prefills wait."""
    clock = SimClock()
    first_ready = {}
    core = PlannerCore(SimEngine(), make_policy("pud"), clock, config=CoreConfig(),
                       on_segment=lambda t, s: first_ready.setdefault(t.task_id, clock.now()))
    ctx = [7] * 150  # per-task context that misses the prefix cache
    for i in range(8):
        level = "urgent" if i in (1, 2) else "normal"
        core.submit(TaskSpec(robot_id=f"r{i}", prompt="p", tuf=LEVELS[level], task_id=f"t{i}", arrival=0.001 * i,
                             prompt_token_ids=list(range(100, 400)) + [i] * 16 + ctx,
                             extra={"plan_text": "tc(30);mf(50);"}))
    clock.set(0.008)  # the whole burst is queued before the first decision
    _drive(core, clock)
    for t in ("t1", "t2"):
        assert first_ready[t] + 0.008 - 0.001 * int(t[1]) <= LEVELS["urgent"].ert
    for t in ("t0", "t3", "t4", "t5", "t6", "t7"):
        assert first_ready[t] + 0.008 - 0.001 * int(t[1]) <= LEVELS["normal"].ert


def test_weighing_the_tufs_lets_two_of_five_simultaneous_urgent_prompts_go_first():
    """5 urgent goals at once, each ~70 ms of prefill: on the deadlines alone they tie, so none blocks another and
    all share one long prefill step. Weighed, a third joining would push the two admitted past their deadline
    by more than waiting costs it."""
    est = LatencyEstimator(decode_s=0.02, slope_s=0.001, prefill_s_per_token=0.0008)
    burst = [gen("urgent", seq=i, tok=6.0, prefill=0.075) for i in range(5)]
    for weigh, taken in ((False, 5), (True, 2)):
        adm, running = LatencyGuided(weigh=weigh), []
        for g in burst:
            if adm.admit(AdmissionView(running, 0.005, 0.008, 0.1, est), g):
                running.append(g)
        assert len(running) == taken, weigh
    # in series, the third's decode no longer runs beside theirs: tasks waiting behind it near their deadline
    # start that much later, and weigh for joining now
    behind = [gen("normal", arrival=-0.6, seq=10 + i, tok=8.0) for i in range(3)]
    assert not LatencyGuided(weigh=True).admit(AdmissionView(burst[:2], 0.005, 0.008, 0.1, est, burst[2:]), burst[2])
    assert LatencyGuided(weigh=True).admit(AdmissionView(burst[:2], 0.005, 0.008, 0.1, est, burst[2:] + behind),
                                           burst[2])
    # a candidate that cannot earn either way is no reason to refuse, nor are running ones past their cut-off
    late = gen("urgent", arrival=-0.6, seq=9, tok=6.0, prefill=0.075)
    assert LatencyGuided(weigh=True).admit(AdmissionView(burst[:2], 0.005, 0.008, 0.1, est), late)
    assert LatencyGuided(weigh=True).admit(AdmissionView([late], 0.005, 0.008, 0.1, est), burst[0])


def test_a_normal_prompt_that_cannot_wait_still_does_not_join_when_it_costs_urgent_first_segments_more():
    """Issue 37, seen in the demo at the paper's TUFs: 4 urgent first segments decoding, past their ERT and short of
    their cut-off, and 5 normal prompts that could not wait without missing their own ERT joined their step: its
    prefill took the urgent ones past the cut-off (-1.7 each). Weighed, the normal prompt's loss from waiting
    (~0.2) is less than what it costs the urgent ones (~3.4), so it waits."""
    from types import SimpleNamespace

    est = LatencyEstimator(decode_s=0.02, slope_s=0.001, prefill_s_per_token=0.0008)
    urgent = [gen("urgent", seq=i, tok=6.0, prefill=0.075) for i in range(4)]
    for g in urgent:
        g.req = SimpleNamespace(output_token_ids=[7])  # prefilled, one token written
    normal = gen("normal", arrival=-0.3, seq=9, tok=20.0, prefill=0.2)
    at = AdmissionView(urgent, 0.25, 0.008, 0.1, est)
    assert LatencyGuided(weigh=False).admit(at, normal)  # it cannot afford to wait: the deadline rule takes it
    assert not LatencyGuided(weigh=True).admit(at, normal)
    # nothing to protect: the urgent ones end in time with it, or are past their cut-off either way
    assert LatencyGuided(weigh=True).admit(AdmissionView(urgent, 0.0, 0.008, 0.1, est), gen("normal", seq=8))
    assert LatencyGuided(weigh=True).admit(AdmissionView(urgent, 0.49, 0.008, 0.1, est), normal)


def _five_urgent_at_once(policy: str, admission: str) -> dict[str, float]:
    """Response times of 5 urgent goals that arrive together at a CPU-like simulated engine whose prefix cache
    holds their shared prompt prefix (each prompt has ~90 tokens of its own to prefill)."""
    from timelyllm_ros.domain.tuf import TimeUtility

    clock = SimClock()
    first: dict[str, float] = {}
    eng = SimEngine(SimEngineConfig(decode_s=0.02, batch_slowdown=0.05, prefill_s_per_token=0.0008))
    core = PlannerCore(eng, make_policy(policy), clock, admission=admission,
                       on_segment=lambda t, s: first.setdefault(t.task_id, clock.now()))
    shared = list(range(100, 1900))

    # warm the cache with a relaxed task, as the planner warms each robot type's prompts at start-up
    core.submit(TaskSpec(robot_id="w", prompt="p", tuf=TimeUtility(alpha=-0.1, beta=1.0, ert=5.0), task_id="warm",
                         arrival=0.0, prompt_token_ids=shared + [9] * 90, extra={"plan_text": "mb(100);"}))
    _drive(core, clock)
    core.prefill.note_warm_prompt("drone", shared + [9] * 90)
    t0 = clock.now() + 1.0
    clock.set(t0)
    for i in range(5):
        core.submit(TaskSpec(robot_id=f"r{i}", prompt="p", tuf=LEVELS["urgent"], task_id=f"t{i}", arrival=t0,
                             prompt_token_ids=shared + [i] * 90, extra={"plan_text": "mb(100);mf(50);"}))
    clock.set(t0 + 0.005)
    _drive(core, clock)
    return {t: v - t0 for t, v in first.items() if t != "warm"}


def test_pud_shed_serves_two_of_five_simultaneous_urgent_goals_in_time_where_one_shared_step_lost_all():
    tuf = LEVELS["urgent"]
    weighed = _five_urgent_at_once("pud-shed", "adaptive-tuf")
    assert _five_urgent_at_once("pud-shed", "auto") == weighed  # the default
    alone = _five_urgent_at_once("pud-shed", "adaptive")
    assert len(weighed) == 2 and all(tuf.tuf0(t) > 0.5 * tuf.beta for t in weighed.values()), weighed
    assert alone == {}  # all five in one step: none can make the cut-off, all shed
    # a policy that does not shed serves all five near the cut-off
    edf = _five_urgent_at_once("edf-seg", "adaptive")
    assert len(edf) == 5 and all(0 <= tuf.tuf0(t) < 0.1 * tuf.beta for t in edf.values()), edf


# -- the step-time estimate --------------------------------------------------------------------------------
CPU = StepModel(decode_s=0.045, batch_slowdown=0.11, prefill_s_per_token=0.0021, source="test CPU")


def _steps(model: StepModel, n: int, seed: int = 0):
    """Steps of an engine that follows ``model`` with ±10 % noise: most decode only, some with a prompt."""
    rng = random.Random(seed)
    for _ in range(n):
        b = rng.randint(1, 6)
        prefill = rng.choice([0, 0, 0, 0, rng.randint(5, 31), rng.randint(100, 400)])
        t = model.decode_s * (1 + model.batch_slowdown * (b - 1)) + prefill * model.prefill_s_per_token
        yield b, t * rng.uniform(0.9, 1.1), prefill


def test_estimator_learns_prefill_and_decode_of_an_engine_far_from_its_prior():
    """From the paper's GPU prior (0.11 ms per prompt token) to a CPU 18x slower: both costs are learned."""
    est = LatencyEstimator()
    assert est.source == PAPER_PRIOR and est.prefill_s_per_token == pytest.approx(0.328 / 2884)
    for b, t, p in _steps(CPU, 600):
        est.observe(b, t, p)
    assert est.prefill_s_per_token == pytest.approx(CPU.prefill_s_per_token, rel=0.1)
    for b in (1, 3, 6, 10):
        assert est.step_time(b) == pytest.approx(CPU.decode_s * (1 + CPU.batch_slowdown * (b - 1)), rel=0.1)
    d = est.describe()
    assert d["seed"] == PAPER_PRIOR and d["prefill_samples"] == PREFILL_WINDOW  # bounded window
    assert d["decode_samples"] > 300


def test_prefill_steps_never_leak_into_the_decode_estimate():
    """A 300-token prompt on this CPU costs 0.6 s: read as decode it would make every step look 14x slower."""
    est = LatencyEstimator()
    before = [est.step_time(b) for b in (1, 2, 8)]
    for _ in range(100):
        est.observe(1, 0.045 + 300 * 0.0021, 300)
    assert [est.step_time(b) for b in (1, 2, 8)] == before
    assert est.prefill_s_per_token == pytest.approx((0.045 + 300 * 0.0021 - 0.022) / 300, rel=0.02)


def test_estimator_follows_an_engine_that_changes():
    """Old samples age out of the bounded window: a prefill that doubles in cost is followed."""
    est = LatencyEstimator.from_step_model(CPU)
    for _ in range(PREFILL_WINDOW):
        est.observe(1, CPU.decode_s + 200 * 2 * CPU.prefill_s_per_token, 200)
    assert est.prefill_s_per_token == pytest.approx(2 * CPU.prefill_s_per_token, rel=0.02)


def test_estimator_is_seeded_from_the_engine_it_serves():
    sim = SimEngine(SimEngineConfig(decode_s=0.045, batch_slowdown=0.11, prefill_s_per_token=0.0021))
    est = LatencyEstimator.for_engine(sim)
    assert est.step_time(1) == pytest.approx(0.045) and est.step_time(3) == pytest.approx(0.045 * 1.22)
    assert est.prefill_s_per_token == 0.0021 and "simulated engine" in est.source
    core = PlannerCore(sim, make_policy("pud"), SimClock())
    assert core.estimator.source == est.source  # the core's default is the same estimate


def test_simulator_learns_its_engines_prefill_cost_with_the_planners_code():
    """The simulator runs the planner's estimator; its engine follows the model exactly, so what the
    estimate learns from the steps is the configured cost, not the prior it might have kept."""
    from timelyllm_ros.sim.simulator import SimConfig, Simulator
    from timelyllm_ros.sim.workloads import generate

    eng = SimEngineConfig.from_yaml(paths.config_dir() / "sim_engine_fitted_cpu.yaml")
    sim = Simulator(generate("wid1", seed=1, duration_s=60.0), SimConfig(policy="pud", engine=eng))
    sim.core.estimator.restart_prefill(1e-4)  # start wrong: learning must bring it back
    sim.run()
    d = sim.core.estimator.describe()
    assert d["prefill_samples"] > 10 and d["decode_samples"] > 100
    assert sim.core.estimator.prefill_s_per_token == pytest.approx(eng.prefill_s_per_token, rel=0.05)


def test_auto_admission_gives_the_baselines_vllms_and_follows_a_policy_switch():
    assert make_admission("auto", segmented=True).name == "adaptive-tuf"
    assert make_admission("auto", segmented=False).name == f"cap{VLLM_MAX_NUM_SEQS}"
    with pytest.raises(ValueError, match="depends on the policy"):
        make_admission("auto")
    with pytest.raises(ValueError, match="unknown admission 'fast'"):
        make_admission("fast")
    core = PlannerCore(SimEngine(), make_policy("fcfs"), SimClock(), admission="auto")
    assert core.admission.name == "cap256" and core.snapshot()["admission"] == "cap256"
    core.set_policy(make_policy("pud"))
    assert core.admission.name == "adaptive-tuf"
    fixed = PlannerCore(SimEngine(), make_policy("fcfs"), SimClock(), admission="8")
    fixed.set_policy(make_policy("pud"))
    assert fixed.admission.name == "cap8"  # a fixed spec stays what it was given
