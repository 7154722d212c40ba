"""The engine pool's latency estimate is per member (issue 13 item 2): each member's own LatencyEstimator, fed
from its own steps, and the scheduler's estimate answers for the member placement would put a generation on.

Members are simulated engines of different speeds (a fast GPU server and a slow one); their steps are
modelled, so the learned figures are deterministic. No wall-clock assertion.
"""

from __future__ import annotations

import dataclasses

import pytest
from test_engine_pool import _Clock, _Flaky, _owner, _req
from test_scheduler import drain, spec

from timelyllm_ros.domain.clock import SimClock
from timelyllm_ros.domain.tuf import LEVELS
from timelyllm_ros.engines import driver
from timelyllm_ros.engines.base import EngineRequest, StepModel
from timelyllm_ros.engines.latency import LatencyEstimator
from timelyllm_ros.engines.pool import EnginePool, PoolLatencyEstimator
from timelyllm_ros.engines.sim_engine import SimEngine, SimEngineConfig
from timelyllm_ros.planner.admission import make_admission
from timelyllm_ros.planner.core import PlannerCore
from timelyllm_ros.planner.policies import make_policy

DECLARED = StepModel(0.03, 0.025, 1e-4, "the shared config's step model")


class _Declared(_Flaky):
    """A member that declares :data:`DECLARED` whatever it runs at: one config for a GPU and a CPU server."""

    def __init__(self, config: SimEngineConfig) -> None:
        super().__init__(config)
        self.info = dataclasses.replace(self.info, step_model=DECLARED)


def _members(decode: list[float], *, max_batch: int = 4, declared: bool = False,
             prefill: list[float] | None = None) -> list[_Flaky]:
    cls = _Declared if declared else _Flaky
    return [cls(SimEngineConfig(max_batch=max_batch, decode_s=d, prefill_s_per_token=(prefill or [1e-4] * 9)[i]))
            for i, d in enumerate(decode)]


def _unaffine(i: int) -> EngineRequest:
    """A generation no member has affinity for (its own robot type): placement goes by capacity and speed,
    as the pool's estimate assumes."""
    r = _req(i)
    r.extra["robot_type"] = f"type{i}"
    return r


def _run(pool: EnginePool, n: int) -> None:
    """``n`` whole plans, each resumed at once after its segments (many steps at each batch size)."""
    driver.run(pool, [_unaffine(i) for i in range(n)])


def test_each_member_learns_its_own_speed_from_its_own_steps():
    # both declare 30 ms per token; one runs at 10 ms, the other at 50 ms
    members = _members([0.01, 0.05], max_batch=3, declared=True)
    pool = EnginePool(members, background_probes=False)
    assert pool.member_estimator(0).step_time(1) == pytest.approx(0.03)  # seeded from the declared model
    _run(pool, 12)
    for i, m in enumerate(members):
        est = pool.member_estimator(i)
        assert est.describe()["decode_samples"] > 0
        for b in (1, 2):
            assert est.step_time(b) == pytest.approx(m.cfg.step_time(b), rel=0.05), (i, b)
    # a streamed (remote) member is fed the time between two collections, which includes the server's step
    streamed = _members([0.02], declared=True)
    streamed[0].info = dataclasses.replace(streamed[0].info, streamed=True)
    pool1 = EnginePool(streamed, background_probes=False)
    _run(pool1, 3)
    est = pool1.member_estimator(0)
    b = max(range(1, 4), key=est.samples_at)  # the batch size it saw most
    assert est.samples_at(b) >= 3 and est.step_time(b) >= streamed[0].cfg.step_time(b) * 0.999
    # /engine_state's member values: what the scheduler plans with for each member (idle: batch 1)
    assert [s.est_time_per_token_s for s in pool.members()] == [pool.member_estimator(i).step_time(1)
                                                                for i in range(2)]


def test_the_pools_estimate_follows_the_member_placement_picks():
    pool = EnginePool(_members([0.05, 0.01], max_batch=2, prefill=[4e-4, 1e-4]), background_probes=False)
    est = pool.latency_estimator()
    assert isinstance(est, PoolLatencyEstimator) and LatencyEstimator.for_engine(pool) is est
    fast, slow = pool.member_estimator(1), pool.member_estimator(0)
    assert est.step_time(1) == fast.step_time(1) < slow.step_time(1)
    # the n-th generation: fast member until it is full, then the slow one, then (all full) the fast one again
    owners = []
    for n in range(1, 6):
        step, prefill = est.step_time(n), est.prefill_time(100)
        pool.add(_unaffine(n))
        o = _owner(pool, f"g{n}")
        owners.append(o)
        assert step == pool.member_estimator(o).step_time(len(pool.member_engine(o).running_ids())), n
        assert prefill == pool.member_estimator(o).prefill_time(100), n
    assert owners == [1, 1, 0, 0, 1]
    assert est.step_time(3) == slow.step_time(1) > est.step_time(2) == fast.step_time(2)
    est.observe(4, 10.0)  # the merged report the core hands over changes nothing: members learn their own
    assert est.step_time(1) == fast.step_time(1)


def test_a_member_going_down_leaves_the_estimate_to_the_others_none_up_falls_back_and_a_rejoined_one_relearns():
    members, clock = _members([0.05, 0.01], declared=True), _Clock()
    pool = EnginePool(members, background_probes=False, clock=clock,
                      rebuild=[None, lambda: _Declared(SimEngineConfig(decode_s=0.01))])
    _run(pool, 8)
    est, slow = pool.latency_estimator(), pool.member_estimator(0)
    assert est.step_time(1) == pytest.approx(0.01, rel=0.05)
    members[1].crash = True
    pool.add(_unaffine(20))  # goes to the fast member, whose step raises: it is down, the generation moves
    pool.step()
    assert [s.up for s in pool.members()] == [True, False]
    assert pool.members()[1].est_time_per_token_s is None
    assert est.step_time(1) == slow.step_time(1) == pytest.approx(0.05, rel=0.05)
    assert est.step_time(3) == slow.step_time(3) and est.prefill_time(50) == slow.prefill_time(50)
    members[0].crash = True
    pool.step()
    assert not any(s.up for s in pool.members())
    assert est.step_time(1) == pytest.approx(DECLARED.decode_s)
    assert est.prefill_time(50) == pytest.approx(50 * DECLARED.prefill_s_per_token)
    assert "no pool member up" in est.describe()["seed"]
    # the fast member is rebuilt and rejoins: it counts again, learning afresh from its declared model
    clock.t += 10.0
    pool.step()
    assert [s.up for s in pool.members()] == [False, True]
    assert est.step_time(1) == pool.member_estimator(1).step_time(1) == pytest.approx(DECLARED.decode_s)
    _run(pool, 4)
    assert est.step_time(1) == pytest.approx(0.01, rel=0.05)


def _admitted_next_to_an_urgent(estimator: LatencyEstimator | None) -> tuple[PlannerCore, bool, list]:
    """A core over a slow (200 ms) and a fast (10 ms) member serves some tasks, then an urgent one; one step
    later a normal one arrives: is it admitted beside the urgent one? Two slots each: the first six tasks
    overflow onto the slow member, so the merged steps mix both (placement leaves the slow one idle else)."""
    pool = EnginePool(_members([0.2, 0.01], max_batch=2), background_probes=False)
    clock, results = SimClock(), []
    est = estimator(pool) if estimator is not None else None
    # the warm-up admits all six at once (a cap): latency-guided admission over a well-placed pool would keep
    # the slow member idle, and the merged estimate would never see it
    core = PlannerCore(pool, make_policy("pud"), clock, admission="cap6", estimator=est, on_result=results.append)
    for i in range(6):
        core.submit(spec(i, plan="tc(30);mf(50);tc(10);"))
    drain(core, clock)
    core.admission = make_admission("adaptive", segmented=True)
    core.submit(spec(10, level="urgent", arrival=clock.now()))
    rep = core.start_step()
    clock.advance(rep.duration_s)
    core.complete_step(rep)
    core.submit(spec(11, arrival=clock.now()))
    rep = core.start_step()
    admitted = "t11" in core.running_ids()
    clock.advance(rep.duration_s)
    core.complete_step(rep)
    drain(core, clock)
    return core, admitted, results


def test_admission_over_a_pool_plans_with_the_member_a_generation_goes_to():
    # before: one estimator seeded from the pool's declared model and fed the merged steps ("time per token
    # while n run in the pool"): a batch that mixed both members is learned at the slow member's step
    merged_core, _, _ = _admitted_next_to_an_urgent(lambda pool: LatencyEstimator.from_step_model(pool.info.step_model))
    core, admitted, results = _admitted_next_to_an_urgent(None)
    fast, slow = core.engine.member_estimator(1), core.engine.member_estimator(0)
    assert core.estimator.step_time(2) == fast.step_time(2)
    # four running (two per member): the merged figure says every one of them takes the slow member's time
    assert merged_core.estimator.step_time(4) > 10 * fast.step_time(2)
    assert core.estimator.step_time(4) == slow.step_time(2)  # only the 3rd and 4th land on the slow member
    # per member: the urgent one and a normal one fit on the fast member, and the urgent one meets its deadline
    assert admitted
    (urgent,) = [r for r in results if r.task_id == "t10"]
    assert urgent.utility == LEVELS["urgent"].beta


def test_a_single_member_pool_estimates_as_its_engine_alone():
    alone, clock = PlannerCore(SimEngine(), make_policy("pud"), SimClock()), None
    pooled = PlannerCore(EnginePool([SimEngine()], background_probes=False), make_policy("pud"), SimClock())
    for core in (alone, pooled):
        clock = core.clock
        for i in range(5):
            core.submit(spec(i, plan="tc(30);mf(50);"))
        drain(core, clock)
    assert pooled.estimator.describe()["decode_samples"] == alone.estimator.describe()["decode_samples"] > 0
    for b in (1, 2, 3, 5):
        assert pooled.estimator.step_time(b) == pytest.approx(alone.estimator.step_time(b))
    assert pooled.estimator.prefill_time(100) == pytest.approx(alone.estimator.prefill_time(100))


def test_replacing_the_engine_keeps_a_single_engines_estimate_and_follows_a_pools():
    core = PlannerCore(SimEngine(), make_policy("pud"), SimClock())
    single = core.estimator
    core.replace_engine(SimEngine())
    assert core.estimator is single  # the same model: what it learned still holds
    pool = EnginePool([SimEngine(), SimEngine()], background_probes=False)
    core.replace_engine(pool)
    assert core.estimator is pool.latency_estimator()
    core.replace_engine(SimEngine(SimEngineConfig(decode_s=0.05)))
    assert type(core.estimator) is LatencyEstimator and core.estimator.step_time(1) == pytest.approx(0.05)


def test_engine_state_shows_each_members_estimate():
    pytest.importorskip("diagnostic_msgs")
    from timelyllm_ros.ros.diagnostics import Status, add_pool_members

    pool = EnginePool(_members([0.05, 0.01]), background_probes=False)
    v = dict(add_pool_members(Status("planner: engine"), pool.stats()).values)
    assert (v["member_0_est_time_per_token_s"], v["member_1_est_time_per_token_s"]) == ("0.050", "0.010")


def test_a_member_with_neither_samples_nor_a_model_is_planned_as_the_measured_one_not_the_gpu_prior():
    """Placement prices such a member as the most measured one; the scheduler's estimate must agree."""
    members = _members([0.05, 0.05])
    for m in members:
        m.info = dataclasses.replace(m.info, step_model=None)
    pool = EnginePool(members, background_probes=False)
    est = pool.latency_estimator()
    for _ in range(20):
        pool.member_estimator(0).observe(1, 0.05)
    assert pool.member_estimator(1).decode_samples == 0
    # the second generation goes to member 1 (member 0 has one): planned at member 0's measured pace
    assert est.step_time(2) == pytest.approx(0.05, rel=0.05)
    assert pool.member_estimator(1).step_time(1) < 0.03  # its own: still the prior
    assert pool.members()[1].est_time_per_token_s == pytest.approx(0.05, rel=0.05)
