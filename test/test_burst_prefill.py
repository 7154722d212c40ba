"""Urgent bursts (issue 37): the prefill a step carries is scheduled, the step-time estimate starts from this engine,
and the same emergency reported by several robots is prefilled once.

Everything here runs the real PlannerCore on the simulated engine with a CPU-like step model (prefill dominant: a
task's own turn behind its cached examples costs ~30 ms per step plus ~1.4 ms a token; figures measured on the
bundled model, bench/results/urgent_burst/) and a simulated clock.
"""

import dataclasses
import math

import pytest

from timelyllm_ros.domain.clock import SimClock
from timelyllm_ros.domain.tuf import TimeUtility
from timelyllm_ros.domain.types import TaskSpec
from timelyllm_ros.engines.latency import LatencyEstimator
from timelyllm_ros.engines.sim_engine import SimEngine, SimEngineConfig
from timelyllm_ros.planner.config import CoreConfig
from timelyllm_ros.planner.core import PlannerCore
from timelyllm_ros.planner.policies import make_policy
from timelyllm_ros.planner.prefill import PrefillModel, block_hashes
from timelyllm_ros.planner.warmup import Calibration, calibrate, calibrate_core, probe_task

CPU = SimEngineConfig(decode_s=0.0085, batch_slowdown=0.12, prefill_s_per_token=0.0014, prefill_step_s=0.03,
                      block_size=32, max_batch=8, kv_capacity_tokens=46592)
SLOW = SimEngineConfig(decode_s=0.017, batch_slowdown=0.12, prefill_s_per_token=0.0028, prefill_step_s=0.06,
                       block_size=32, max_batch=8, kv_capacity_tokens=46592)
SHARED = list(range(100, 1892))  # the robot type's cached examples: 56 blocks of 32
# The paper's urgent TUF stretched x2 and the normal one, as the CPU demo serves them; x3 for the slow machine; and
# the paper's own.
URGENT = TimeUtility(alpha=-2.0 / 0.6, beta=2.0, ert=0.4, level="urgent")
URGENT1 = TimeUtility(alpha=-2.0 / 0.3, beta=2.0, ert=0.2, level="urgent")
NORMAL1 = TimeUtility(alpha=-2.0, beta=1.0, ert=1.0, level="normal")
URGENT3 = TimeUtility(alpha=-2.0 / 0.9, beta=2.0, ert=0.6, level="urgent")
NORMAL = TimeUtility(alpha=-1.0 / 1.0, beta=1.0, ert=2.0, level="normal")
EVADE = "mb(100);mf(50);"


def turn(i: int, n: int = 75) -> list[int]:
    """A task's own turn: tokens no other task has."""
    return [50_000 + 1000 * i + j for j in range(n)]


class Fleet:
    """A core on a simulated engine whose prefix cache holds SHARED (the planner's warm-up), and the first segment
    of each task as its robot gets it."""

    def __init__(self, engine_cfg: SimEngineConfig, seed_model: SimEngineConfig | None = None,
                 admission: str = "auto", policy: str = "pud-shed", gather_s: float = 0.0) -> None:
        self.clock = SimClock(10.0)
        self.first: dict[str, float] = {}
        self.ended: dict[str, str] = {}
        self.engine = SimEngine(engine_cfg)
        est = LatencyEstimator.from_step_model((seed_model or engine_cfg).step_model("test seed"),
                                               prefill_step_s=(seed_model or engine_cfg).prefill_step_s)
        self.core = PlannerCore(self.engine, make_policy(policy), self.clock, admission=admission,
                                config=CoreConfig(gather_ms=gather_s * 1000), estimator=est,
                                on_segment=lambda r, s: self.first.setdefault(r.task_id, self.clock.now()),
                                on_result=lambda r: self.ended.setdefault(r.task_id, r.status.value))
        self.engine.warm_prefix(SHARED + [7] * 40)
        self.core.note_warm_prompt("drone", SHARED + [7] * 40)

    def submit(self, tid: str, ids: list[int], tuf: TimeUtility, plan: str = EVADE, at: float | None = None) -> None:
        self.core.submit(TaskSpec(robot_id=f"robot_{tid}", prompt=tid, tuf=tuf, task_id=tid,
                                  arrival=self.clock.now() if at is None else at, prompt_token_ids=ids,
                                  extra={"plan_text": plan}))

    def drive(self, until_s: float = 30.0) -> None:
        end = self.clock.now() + until_s
        while self.clock.now() < end:
            rep = self.core.start_step()
            if rep is None:
                w = self.core.next_wakeup()
                if w is None:
                    return
                self.clock.set(max(w, self.clock.now()))
                continue
            self.clock.advance(rep.duration_s)
            self.core.complete_step(rep)

    def response(self, tid: str, t0: float) -> float:
        return self.first.get(tid, math.inf) - t0


def sim_probe(rt: str, n: int, objects: int, urgent: bool) -> tuple[list[int], dict]:
    """A calibration task for the simulated engine: the cached examples, then a turn of its own."""
    return SHARED + [90_000 + 100 * n + j for j in range(20 + 25 * objects)], {"plan_text": EVADE + "tc(90);" * 6}


# -- the step-time estimate: a fixed cost per prefilling step and a cost per token ---------------------------------
def test_the_estimate_tells_the_fixed_cost_of_a_prefill_step_from_the_cost_per_token():
    est = LatencyEstimator(decode_s=0.017, slope_s=0.002, prefill_s_per_token=0.0003)  # a wrong prior, no fixed part
    for tokens in (10, 75, 10, 150, 40, 75, 300, 10) * 3:
        est.observe(1, 0.017 + 0.03 + tokens * 0.0014, tokens)
    assert est.prefill_step_s == pytest.approx(0.03, abs=0.004)
    assert est.prefill_s_per_token == pytest.approx(0.0014, rel=0.05)
    assert est.prefill_time(75) == pytest.approx(0.03 + 75 * 0.0014, rel=0.03)
    assert est.prefill_join_time(75) == pytest.approx(75 * 0.0014, rel=0.05)  # a step that prefills anyway
    assert est.prefill_time(0) == 0.0


def test_calibrate_replaces_the_seed_and_what_was_learned():
    est = LatencyEstimator()
    for _ in range(20):
        est.observe(2, 0.5)
    est.calibrate({1: 0.017, 2: 0.021, 4: 0.031}, 0.03, 0.0014, "measured")
    assert est.source == "measured" and est.describe()["seed"] == "measured"
    assert est.step_time(1) == pytest.approx(0.017) and est.step_time(4) == pytest.approx(0.031)
    assert 0.031 < est.step_time(8) < 0.06  # the line through the sizes measured
    assert (est.prefill_step_s, est.prefill_s_per_token) == (0.03, 0.0014)
    with pytest.raises(ValueError, match="decode"):
        est.calibrate({}, 0.0, 0.001, "x")


# -- learning this machine at start -----------------------------------------------------------------------------
def test_calibration_measures_the_engine_it_runs_on_not_the_model_it_was_seeded_with():
    """A machine twice as slow as the step model the estimate was seeded with: the warm-up's measurement finds it."""
    f = Fleet(SLOW, seed_model=CPU)
    before = f.core.estimator.step_time(1)
    cal = calibrate_core(f.core, sim_probe, ["drone"], {"drone"})
    assert isinstance(cal, Calibration)
    assert before == pytest.approx(CPU.decode_s)
    assert cal.decode_s[1] == pytest.approx(SLOW.decode_s, rel=0.02)
    assert cal.decode_s[4] == pytest.approx(SLOW.decode_s * (1 + 3 * SLOW.batch_slowdown), rel=0.02)
    assert cal.prefill_step_s == pytest.approx(SLOW.prefill_step_s, rel=0.05)
    assert cal.prefill_s_per_token == pytest.approx(SLOW.prefill_s_per_token, rel=0.05)
    assert f.core.estimator.step_time(1) == pytest.approx(SLOW.decode_s, rel=0.02)
    assert f.core.estimator.prefill_time(75) == pytest.approx(SLOW.step_time(0, 75), rel=0.05)
    assert f.core.estimator.source.startswith("measured at warm-up")
    lone = cal.first_segment_s["drone/urgent"]  # modelled time of a lone first segment, not wall time
    assert lone == pytest.approx(0.0, abs=0.05)  # (the simulated engine takes no wall time)
    assert not f.engine.has_work() and f.core.calibration is cal


def test_a_machine_twice_as_slow_still_gets_a_sensible_schedule_from_its_first_event():
    """Five urgent goals and three normal ones in the same instant, on an engine twice as slow as the estimate's
    seed. Measured at warm-up, the estimate serves the urgent goals one after another, the first inside its ERT;
    left at the seed, the prefills look cheap, go in together, and all five come late."""
    def first_event(calibrated: bool) -> dict[str, float]:
        f = Fleet(SLOW, seed_model=CPU)
        if calibrated:
            calibrate_core(f.core, sim_probe, ["drone"], {"drone"})
        t0 = f.clock.now()
        for i in range(3):
            f.submit(f"n{i}", SHARED + turn(10 + i), NORMAL, plan="?s('cat')==True{g('cat');}")
        for i in range(5):
            f.submit(f"u{i}", SHARED + turn(i), URGENT3)
        f.drive()
        return {t: f.response(t, t0) for t in (*(f"u{i}" for i in range(5)), "n0", "n1", "n2")}

    def utility(r: dict[str, float]) -> float:
        return sum(max(0.0, URGENT3.tuf0(r[f"u{i}"])) for i in range(5))

    seeded, measured = first_event(False), first_event(True)
    urgent_m = sorted(measured[f"u{i}"] for i in range(5))
    urgent_s = sorted(seeded[f"u{i}"] for i in range(5))
    assert urgent_m[0] <= URGENT3.ert, measured  # the first ones on time ...
    assert urgent_m[-1] - urgent_m[0] > 0.3, measured  # ... the rest after them, not all in one shared step
    assert all(t > URGENT3.ert for t in urgent_s), seeded  # left at the seed: four together, all late
    assert utility(measured) > utility(seeded) + 0.5, (measured, seeded)
    assert all(measured[n] < math.inf for n in ("n0", "n1", "n2"))  # the normal ones are served too
    # measured at warm-up, the schedule is the one an estimate seeded with the slow machine's own model makes
    f = Fleet(SLOW)
    t0 = f.clock.now()
    for i in range(3):
        f.submit(f"n{i}", SHARED + turn(10 + i), NORMAL, plan="?s('cat')==True{g('cat');}")
    for i in range(5):
        f.submit(f"u{i}", SHARED + turn(i), URGENT3)
    f.drive()
    assert {t: f.response(t, t0) for t in measured} == pytest.approx(measured, abs=0.01)


# -- the same emergency from several robots is prefilled once ---------------------------------------------------
def test_a_prompt_admitted_counts_as_cached_for_the_ones_after_it():
    f = Fleet(CPU)
    f.submit("a", SHARED + turn(1), URGENT)
    f.submit("b", SHARED + turn(1), URGENT)  # the same report from another robot
    f.submit("c", SHARED + turn(2), URGENT)
    ga, gb, gc = (f.core.generation(t) for t in "abc")
    assert ga.warm_hit == gb.warm_hit == gc.warm_hit == len(SHARED)  # before any is admitted: the examples only
    f.core.start_step()
    first, copy = (ga, gb) if f.core.running_ids()[0] == "a" else (gb, ga)
    assert copy.task_id in f.core.running_ids()  # admitted beside it: it costs one partial block
    assert first.warm_hit == len(SHARED)
    assert copy.warm_hit == (len(SHARED) + 75) // 32 * 32  # all of it but the last, partial block
    assert copy.prefill_est_s < gc.prefill_est_s / 2


def test_five_reports_of_two_emergencies_take_two_prefills_and_every_report_comes():
    """3 robots report one emergency, 2 another, in the same instant: each emergency's turn is prefilled once, the
    copies ride on it, and all five first segments come well before five separate prefills would have allowed."""
    f = Fleet(CPU)
    t0 = f.clock.now()
    for i, which in enumerate((1, 1, 2, 1, 2)):
        f.submit(f"u{i}", SHARED + turn(which), URGENT)
    f.drive()
    times = sorted(f.response(f"u{i}", t0) for i in range(5))
    assert f.engine.total_prefill_tokens - 0 < 3 * 75 + 5 * 32, f.engine.total_prefill_tokens
    serial_five = 5 * CPU.step_time(1, 75)
    assert times[-1] < 0.6 * serial_five, times
    assert all(URGENT.tuf0(t) > 0 for t in times), times


def test_copies_of_an_admitted_emergency_ride_along_when_a_report_ranked_before_them_is_refused():
    """The fleet demo's first event: reports of emergencies A, B, C, B, B in the same instant. Once B's first report
    is admitted its copies cost one partial block each; admission refusing C, which ranks before the last copies,
    must not keep them waiting for a step of their own (they waited until shed in the demo)."""
    f = Fleet(CPU)
    t0 = f.clock.now()
    for i, which in enumerate((1, 2, 3, 2, 2)):
        f.submit(f"u{i}", SHARED + turn(which), URGENT, at=t0 + 0.0005 * i)
    f.clock.set(t0 + 0.008)
    f.drive()
    t = {i: f.response(f"u{i}", t0) for i in range(5)}
    assert t[1] == t[3] == t[4] <= URGENT.ert, t  # B's copies come with its first report, inside the ERT
    assert t[0] <= URGENT.ert and t[2] > t[1], t  # A first; C, refused beside them, after
    assert all(f.ended[f"u{i}"] == "done" for i in range(5)), f.ended


def test_a_prompt_rides_when_the_cache_holds_all_but_its_last_partial_block():
    f = Fleet(CPU)
    f.submit("a", SHARED + turn(1), URGENT)
    f.submit("b", SHARED + turn(1), URGENT)
    ga, gb = f.core.generation("a"), f.core.generation("b")
    assert not f.core.prefill.rides(gb, f.engine)  # only the examples are cached: its turn is 75 tokens
    f.core.start_step()
    assert not f.core.prefill.rides(ga, f.engine)  # running: no longer a new prompt
    f.submit("c", SHARED + turn(1), URGENT)
    f.core.prefill.reprice([f.core.generation("c")], f.engine, f.core.estimator)
    assert f.core.prefill.rides(f.core.generation("c"), f.engine)


def test_the_prefix_index_counts_whole_blocks_and_forgets_what_it_drops():
    m = PrefillModel(kv_block_tokens=4)
    eng = SimEngine(SimEngineConfig(block_size=4))
    m.note_warm_prompt("drone", list(range(10)), eng)
    spec = TaskSpec(robot_id="r", prompt="p", tuf=URGENT, prompt_token_ids=list(range(9)) + [99, 98])
    assert m.warm_hit(spec, eng) == 8  # two whole blocks shared
    assert block_hashes(list(range(10)), 4) == block_hashes(list(range(8)), 4)
    for i in range(80):  # served prompts are bounded; the warmed ones stay
        m.note_served("drone", [1000 + i] * 12, eng)
    assert m.warm_hit(spec, eng) == 8
    v = m.version
    m.forget_warm()
    assert m.warm_hit(spec, eng) is None and m.version > v


# -- a burst is ranked together ------------------------------------------------------------------------------------
def test_an_idle_engine_waits_for_the_rest_of_a_burst_and_serves_the_urgent_goal_first():
    """A normal goal comes 4 ms before an urgent one of the same event: without the wait the normal prompt's
    prefill holds the engine and the urgent goal waits for all of it."""
    def run(gather: float) -> dict[str, float]:
        f = Fleet(CPU, gather_s=gather)
        t0 = f.clock.now()
        f.submit("n", SHARED + turn(9), NORMAL1, plan="?s('cat')==True{g('cat');}")
        f.clock.set(t0 + 0.002)
        rep = f.core.start_step()  # the engine thread decides now: only the normal goal has come
        f.submit("u", SHARED + turn(1), URGENT1, at=t0 + 0.004)
        if rep is not None:
            f.clock.advance(rep.duration_s)
            f.core.complete_step(rep)
        f.drive()
        return {"n": f.response("n", t0), "u": f.response("u", t0 + 0.004)}

    waited, eager = run(0.01), run(0.0)
    assert waited["u"] <= URGENT1.ert < eager["u"], (waited, eager)
    assert waited["n"] < NORMAL1.ert  # the normal goal loses nothing by it


def test_no_wait_when_a_goal_would_lose_utility_by_it_and_none_while_goals_are_still_taken_in():
    f = Fleet(CPU, gather_s=0.01)
    tight = TimeUtility(alpha=-10.0, beta=2.0, ert=0.15, level="urgent")  # its best case is right at its ERT
    f.submit("u", SHARED + turn(1), tight)
    assert f.core.start_step() is not None  # decided at once
    g = Fleet(CPU, gather_s=0.01)
    t0 = g.clock.now()
    g.submit("n", SHARED + turn(9), NORMAL)
    g.core.intake.begin(t0 + 0.008)  # a goal that came is still being rendered
    g.clock.set(t0 + 0.012)
    assert g.core.start_step() is None and g.core.next_wakeup() == pytest.approx(t0 + 0.018)
    g.core.intake.end()
    g.submit("n2", SHARED + turn(8), NORMAL, at=t0 + 0.008)  # taken in: its arrival counts
    g.clock.set(t0 + 0.0121)
    assert g.core.start_step() is None  # still inside the quiet gap after the last arrival
    g.clock.set(t0 + 0.05)
    assert g.core.start_step() is not None


class _OnePrefillSlowed(SimEngine):
    """A machine where another process takes the cores during one prefill step of the calibration."""

    def __init__(self, cfg: SimEngineConfig, slowed: int, factor: float) -> None:
        super().__init__(cfg)
        self.prefills, self.slowed, self.factor = 0, slowed, factor

    def step(self):
        rep = super().step()
        if rep.prefill_tokens:
            self.prefills += 1
            if self.prefills == self.slowed:
                rep = dataclasses.replace(rep, duration_s=rep.duration_s * self.factor)
        return rep


@pytest.mark.parametrize("slowed", range(1, 14))  # every prefill step of the calibration, in turn
def test_one_slowed_prefill_does_not_set_the_estimate(slowed):
    """One prefill step of the calibration takes 5x (a busy machine for a moment): the fit keeps the engine's own
    fixed cost and cost per token, so admission and shedding do not expect every later prefill to be slow."""
    f = Fleet(CPU)
    f.engine = _OnePrefillSlowed(CPU, slowed, 5.0)
    f.core.engine = f.engine
    f.engine.warm_prefix(SHARED + [7] * 40)
    cal = calibrate(f.engine, sim_probe, f.core.hooks.stop_checker, ["drone"], {"drone"})
    assert f.engine.prefills >= slowed
    assert cal.prefill_step_s == pytest.approx(CPU.prefill_step_s, rel=0.05)
    assert cal.prefill_s_per_token == pytest.approx(CPU.prefill_s_per_token, rel=0.05)


def test_probe_tasks_come_from_the_robot_types_examples_with_a_turn_no_cache_holds():
    exs = [{"input": "Scene: [] Task: [A] Find the cat.", "plan": "x"},
           {"input": "Scene: [dog x:0.5 y:0.5] Task: [E] A dog.", "plan": "y"}]
    a, b = probe_task(exs, 1, 2, False), probe_task(exs, 2, 2, False)
    assert a != b and a.startswith("Scene: [probe1_0") and a.endswith("] Task: [A] Find the cat.")
    assert "Task: [E]" in probe_task(exs, 3, 1, True) and "probe3_0" in probe_task(exs, 3, 1, True)
    assert probe_task(exs[:1], 1, 1, True) is None


def test_calibrate_refuses_a_busy_engine():
    f = Fleet(CPU)
    f.submit("u", SHARED + turn(1), URGENT)
    f.core.start_step()
    with pytest.raises(RuntimeError, match="already serving"):
        calibrate(f.engine, sim_probe, f.core.hooks.stop_checker, ["drone"])
