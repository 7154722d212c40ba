"""pud-degrade / pud-degrade-eager (issue 28 item 3, "degrade instead of drop"): under overload a task keeps its
mandatory part (the segments already sent, at least its first) and its optional rest is ended explicitly, DONE
with a reason that says what was left out; the simulator and metrics count it."""

import math

from test_pud_shed import CTX, gen
from test_scheduler import drain, spec

from timelyllm_ros.domain.clock import SimClock
from timelyllm_ros.domain.types import DEGRADED_PREFIX, TaskStatus
from timelyllm_ros.engines.sim_engine import SimEngine
from timelyllm_ros.planner.admission import FixedCap
from timelyllm_ros.planner.core import PlannerCore
from timelyllm_ros.planner.policies import POLICIES, make_policy


def test_degrading_policies_are_registered_shed_too_and_order_exactly_as_pud():
    pud = make_policy("pud")
    for name in ("pud-degrade", "pud-degrade-eager", "pud-degrade-wide"):
        assert name in POLICIES
        p = make_policy(name)
        assert p.degrades and p.sheds and p.segmented and p.streams
        gens = [gen("normal", seq=0), gen("urgent", arrival=0.05, seq=1), gen("normal", k=1, prev_end=0.4, seq=3)]
        assert p.priorities(gens, 0.1, CTX) == pud.priorities(gens, 0.1, CTX)
    assert not make_policy("pud-shed").degrades and not make_policy("pud-degrade").eager
    assert make_policy("pud-degrade-eager").eager and make_policy("pud-degrade-eager").at_risk
    assert make_policy("pud-degrade-wide").eager and not make_policy("pud-degrade-wide").at_risk


def test_degradable_only_a_later_segment_that_cannot_earn_or_eagerly_a_late_one_under_contention():
    deg, eager = make_policy("pud-degrade"), make_policy("pud-degrade-eager")
    later = gen("normal", k=1, prev_end=1.0)  # TUF_1 reaches 0 at a 0.5 s wait
    # wait = now + left + comm - ready
    assert not deg.degradable(later, 1.3, 0.05, 0.008, 1.0, True)  # 0.358 s late: still earns
    assert deg.degradable(later, 1.5, 0.05, 0.008, 1.0, False)  # 0.558 s: cannot earn, however contended
    assert not deg.degradable(later, 1.5, 0.05, 0.008, 1.5, False)  # the robot may still be busy: not late
    assert eager.degradable(later, 1.1, 0.05, 0.008, 1.0, True)  # late while a first segment that earns waits
    assert not eager.degradable(later, 1.1, 0.05, 0.008, 1.0, False)  # no one waits for its place
    assert not eager.degradable(later, 0.9, 0.05, 0.008, 1.0, True)  # on time: kept
    # A first segment is never degraded, the most hopeless urgent one least of all (shedding decides about it).
    for p in (deg, eager, make_policy("pud-degrade-wide")):
        assert not p.degradable(gen("urgent", arrival=0.0), 100.0, 0.1, 0.008, math.nan, True)
    assert not make_policy("pud-shed").degradable(later, 100.0, 0.05, 0.008, 1.0, True)


def _core(policy, clock):
    results, segs = [], []
    core = PlannerCore(SimEngine(), make_policy(policy), clock, admission=FixedCap(1),
                       on_result=results.append, on_segment=lambda t, s: segs.append((t.task_id, s.index, s.text)))
    return core, results, segs


def _first_segment_sent(core, clock, segs, task_id):
    """Step until ``task_id`` has sent its first segment and is suspended (waiting for its robot)."""
    for _ in range(1000):
        if any(s[0] == task_id for s in segs) and core.running_ids() == []:
            return
        rep = core.start_step()
        assert rep is not None
        clock.advance(rep.duration_s)
        core.complete_step(rep)
    raise AssertionError("no first segment")


def _overloaded(policy, late_s, level="normal", plan="tc(30);mf(50);", age_s=0.0):
    """Task t0 sent its first segment; its robot reported it done; ``late_s`` later a normal task t1 (that arrived
    ``age_s`` before) is queued, and the one-slot batch (FixedCap(1)) can take only one of them: overload."""
    clock = SimClock(0.0)
    core, results, segs = _core(policy, clock)
    core.submit(spec(0, plan=plan, level=level, arrival=0.0))
    _first_segment_sent(core, clock, segs, "t0")
    ready = clock.now()
    assert core.report_segment_done("t0", 0, finish_time=ready) is None
    clock.set(ready + late_s)
    core.submit(spec(1, arrival=clock.now() - age_s))
    return core, clock, results, segs


def test_a_waiting_later_segment_that_cannot_earn_is_degraded_with_its_mandatory_part_delivered():
    core, clock, results, segs = _overloaded("pud-degrade", 0.6)  # TUF_1 of a normal task is 0 at 0.5 s
    core.start_step()  # t1 (earns) takes the slot; t0's next segment is left waiting and cannot earn
    (res,) = results
    assert res.task_id == "t0" and res.status is TaskStatus.DONE and res.degraded
    assert res.reason.startswith(DEGRADED_PREFIX) and "segments 1.." in res.reason and "pud-degrade" in res.reason
    assert "could not earn utility" in res.reason
    assert res.plan == "tc(30);" and [s.index for s in res.segments] == [0]  # the first segment, delivered
    assert res.segments[0].dispatch is not None and res.utility > 0
    drain(core, clock)
    by = {r.task_id: r for r in results}
    assert set(by) == {"t0", "t1"} and by["t1"].status is TaskStatus.DONE and not by["t1"].degraded
    assert [s for s in segs if s[0] == "t0"] == [("t0", 0, "tc(30);")]  # nothing of the rest was sent
    assert core.pending() == 0


def test_a_plan_whose_sent_part_leaves_a_block_open_is_not_degraded_there():
    """The robot could not end a plan after ``?s('cat')==True{``: the rest is served (late) instead."""
    core, clock, results, segs = _overloaded("pud-degrade", 0.6, plan="?s('cat')==True{g('cat');};")
    assert [s[2] for s in segs if s[0] == "t0"] == ["?s('cat')==True{"]
    drain(core, clock)
    t0 = _t0(results)
    assert not t0.degraded and t0.plan == "?s('cat')==True{g('cat');};", t0.plan


def test_pud_shed_serves_the_same_rest_late_and_a_later_segment_that_earns_is_kept():
    core, clock, results, _ = _overloaded("pud-shed", 0.6)
    drain(core, clock)
    t0 = next(r for r in results if r.task_id == "t0")
    assert t0.status is TaskStatus.DONE and not t0.degraded and t0.plan == "tc(30);mf(50);"
    core, clock, results, _ = _overloaded("pud-degrade", 0.2)  # late, but it still earns: served
    drain(core, clock)
    t0 = next(r for r in results if r.task_id == "t0")
    assert not t0.degraded and t0.plan == "tc(30);mf(50);"


def _t0(results):
    return next(r for r in results if r.task_id == "t0")


def test_eager_gives_a_late_rest_up_for_a_first_segment_at_risk_and_keeps_the_urgent_first_move():
    # An urgent task's evasive first move was sent; its second segment is late (still earning: PUD ranks it
    # first), and a normal task's first segment, which can earn, waits for the one slot. It arrived 0.85 s ago:
    # waiting for the urgent task's next segment would push it past its ERT (1 s).
    core, clock, results, segs = _overloaded("pud-degrade-eager", 0.05, level="urgent", plan="mr(100);mf(100);",
                                             age_s=0.85)
    core.start_step()
    (res,) = results
    assert res.task_id == "t0" and res.degraded and res.plan == "mr(100);"  # the first move stays delivered
    assert "segments 1.." in res.reason and "was late" in res.reason
    assert "first segment that can still earn" in res.reason
    assert core.running_ids() == ["t1"]  # its place went to the first segment
    drain(core, clock)
    assert {r.task_id: r.status for r in results} == {"t0": TaskStatus.DONE, "t1": TaskStatus.DONE}
    # pud-degrade (not eager) serves that rest: it still earns
    core, clock, results, _ = _overloaded("pud-degrade", 0.05, level="urgent", plan="mr(100);mf(100);", age_s=0.85)
    drain(core, clock)
    assert not _t0(results).degraded and _t0(results).plan == "mr(100);mf(100);"


def test_eager_keeps_the_rest_when_the_waiting_first_segment_stays_inside_its_ert_and_wide_does_not():
    core, clock, results, _ = _overloaded("pud-degrade-eager", 0.05, level="urgent", plan="mr(100);mf(100);")
    drain(core, clock)  # t1 just arrived: it loses nothing by waiting one segment
    assert not _t0(results).degraded and _t0(results).plan == "mr(100);mf(100);"
    core, clock, results, _ = _overloaded("pud-degrade-wide", 0.05, level="urgent", plan="mr(100);mf(100);")
    drain(core, clock)
    assert _t0(results).degraded and _t0(results).plan == "mr(100);"
    assert {r.task_id: r.status for r in results} == {"t0": TaskStatus.DONE, "t1": TaskStatus.DONE}


def test_an_urgent_first_segment_left_waiting_is_never_degraded():
    clock = SimClock(0.0)
    core, results, _ = _core("pud-degrade-eager", clock)
    for i in range(4):  # four urgent tasks at once, one slot: three wait with nothing sent
        core.submit(spec(i, plan="mr(100);mf(100);", level="urgent", arrival=0.0))
    drain(core, clock)
    assert len(results) == 4
    for r in results:  # each either served whole or shed (nothing to keep), never cut before its first segment
        assert not r.degraded or r.segments
        assert r.status in (TaskStatus.DONE, TaskStatus.OVERDUE)
        if r.status is TaskStatus.DONE:
            assert r.segments and r.segments[0].text == "mr(100);"


def test_simulation_degrades_under_overload_loses_nothing_and_counts_degraded_tasks():
    from bench.load_sweep import jitter, scale_fleet
    from timelyllm_ros.measure import metrics
    from timelyllm_ros.sim.simulator import SimConfig, Simulator
    from timelyllm_ros.sim.workloads import load_workload

    wl = jitter(scale_fleet(load_workload("drone-wid2", seed=0), 3.0, 0), 0.02, 0)
    res = Simulator(wl, SimConfig(policy="pud-degrade-wide", seed=0)).run()  # raises if a task has no result
    recs = res.records
    assert all(r.status in {s.value for s in TaskStatus if s.terminal} for r in recs)
    deg = [r for r in recs if r.degraded]
    assert deg  # WID 2 at 3x is overloaded: some plans lose their rest
    for r in deg:
        assert r.done and r.served and r.reason.startswith(DEGRADED_PREFIX)
        assert 1 <= len(r.segments) and r.utility() is not None
        # Eq. 3 holds the segments run, nothing for those left out
        assert len(r.segment_utilities()) <= len(r.segments)
    (row,) = [s for s in metrics.summarize(recs) if s.group == "all"]
    assert row.degraded == len(deg) and row.statuses["done"] >= row.degraded
    md = metrics.to_markdown(metrics.summarize(recs))
    assert "| degraded |" in md and "mandatory part" in md
    assert "degraded" not in metrics.to_markdown(metrics.summarize([r for r in recs if not r.degraded]))
