"""Segment when it pays, stream when it does not (issue 28 item 1): pud-shed suspends a generation at a segment
boundary only when a waiting generation gains more from its place than the resume costs (planner/boundaries.py,
SegmentOrStream.decide); otherwise the plan is written on in place, each segment still sent as it is detected."""

import pytest
from test_pud_shed_rule import step
from test_scheduler import drain

from timelyllm_ros.domain.clock import SimClock
from timelyllm_ros.domain.tuf import LEVELS
from timelyllm_ros.domain.types import TaskSpec, TaskStatus
from timelyllm_ros.engines.sim_engine import SimEngine, SimEngineConfig
from timelyllm_ros.planner.core import PlannerCore
from timelyllm_ros.planner.policies import DEFAULT_POLICY, make_policy

# 12 pick-and-place steps, as the published arm trace's long plans
ARM_PLAN = "".join(f"move_to('{a}');take('{a}');move_to('{b}');drop('{b}');"
                   for a, b in (("red_box", "blue_box"), ("green_box", "red_box"), ("blue_box", "green_box")))


def arm_spec(i=0, arrival=0.0):
    return TaskSpec(robot_id=f"arm{i}", prompt=f"stack the boxes {i}", tuf=LEVELS["normal"], robot_type="arm",
                    task_id=f"arm{i}", arrival=arrival, extra={"plan_text": ARM_PLAN},
                    prompt_token_ids=list(range(1000, 1300)) + [2000 + i])


def urgent_spec(arrival):
    return TaskSpec(robot_id="drone", prompt="evade", tuf=LEVELS["urgent"], task_id="urgent", arrival=arrival,
                    extra={"plan_text": "mb(50);"})


class CountingEngine(SimEngine):
    """A simulated engine that counts (re)submissions: each suspension is followed by one more."""

    def __init__(self, config=None):
        super().__init__(config)
        self.adds: dict[str, int] = {}

    def _backend_add(self, req):
        self.adds[req.gen_id] = self.adds.get(req.gen_id, 0) + 1
        super()._backend_add(req)


def core_for(policy, max_batch=256):
    clock = SimClock(0.0)
    results, segs = [], []
    engine = CountingEngine(SimEngineConfig(max_batch=max_batch))
    core = PlannerCore(engine, make_policy(policy), clock, on_result=results.append,
                       on_segment=lambda t, s: segs.append((t.task_id, s.index, clock.now())))
    return core, engine, clock, results, segs


def test_the_default_segments_when_it_pays_and_pud_suspends_at_every_boundary():
    assert DEFAULT_POLICY == "pud-shed" and make_policy("pud-shed").adaptive
    for name in ("pud", "edf-seg", "pud-shed-seg", "pud-degrade", "fcfs-stream"):
        assert not make_policy(name).adaptive, name


@pytest.mark.parametrize("policy, submissions", [("pud-shed", 1), ("pud", 13)])
def test_a_long_arm_plan_with_nothing_waiting_is_never_suspended(policy, submissions):
    core, engine, clock, results, segs = core_for(policy)
    core.submit(arm_spec())
    drain(core, clock)
    (res,) = results
    assert res.status is TaskStatus.DONE and res.plan == ARM_PLAN and len(res.segments) == 12
    # pud-shed: one submission, the plan written in place; pud: a resume (resubmission) after every boundary, the
    # last one only to end the plan
    assert engine.adds["arm0"] == submissions
    snap = core.snapshot()  # telemetry: what the decision chose at each of the 12 boundaries
    assert (snap["boundaries_suspended"], snap["boundaries_streamed"]) == ((0, 12) if policy == "pud-shed" else (12, 0))
    assert len(segs) == 12  # every segment sent as it was written either way
    if policy == "pud-shed":  # written ahead of the robot: each segment sent within a step or two of the one before
        gaps = [b[2] - a[2] for a, b in zip(segs, segs[1:], strict=False)]
        assert max(gaps) < 0.2, gaps


def test_a_streamed_plan_is_not_shed_as_a_late_first_segment():
    """A plan streamed in place moves on to its later segments (k): a 12-step arm plan takes longer to write than
    the normal TUF's 1.5 s cutoff at a slow engine, and shedding must not take it for a first segment still due."""
    clock = SimClock(0.0)
    results = []
    engine = SimEngine(SimEngineConfig(decode_s=0.04))  # ~150 tokens at 40 ms: ~6 s to write the plan
    core = PlannerCore(engine, make_policy("pud-shed"), clock, on_result=results.append)
    core.submit(arm_spec())
    drain(core, clock)
    (res,) = results
    assert res.status is TaskStatus.DONE and len(res.segments) == 12 and clock.now() > 1.5


def _arm_streaming_then_urgent(policy):
    """An arm plan streams alone in a one-place engine; once it has sent two segments an urgent drone task arrives
    (it can only wait for the place). Earlier plans of the same task taught the planner how long such plans are
    (PlanLengths): when the place would free otherwise is the end of the plan in it."""
    core, engine, clock, results, segs = core_for(policy, max_batch=1)
    for i in range(2):  # PlanLengths predicts from two complete plans of a task
        core.submit(TaskSpec(**{**vars(arm_spec()), "task_id": f"earlier{i}", "robot_id": f"arm{9 + i}",
                                "arrival": clock.now()}))
        drain(core, clock)
    segs.clear()
    core.submit(arm_spec(arrival=clock.now()))
    while len([s for s in segs if s[0] == "arm0"]) < 2:
        step(core, clock)
    core.submit(urgent_spec(clock.now()))
    drain(core, clock)
    by = {r.task_id: r for r in results}
    return by, engine


def test_an_urgent_task_waiting_for_the_place_gets_it_at_the_next_boundary():
    by, engine = _arm_streaming_then_urgent("pud-shed")
    urgent, arm = by["urgent"], by["arm0"]
    # the arm generation left the engine at its next boundary and came back once for the rest of its plan
    assert engine.adds["arm0"] == 2
    assert urgent.status is TaskStatus.DONE and urgent.response_time < LEVELS["urgent"].ert + 0.1
    assert urgent.utility > 0.5 * LEVELS["urgent"].beta
    assert arm.status is TaskStatus.DONE and arm.plan == ARM_PLAN


def test_streaming_without_the_decision_leaves_the_urgent_task_behind_the_whole_plan():
    """What the decision buys: fcfs-stream never suspends, and the urgent task waits for the arm plan's end."""
    by, engine = _arm_streaming_then_urgent("fcfs-stream")
    assert engine.adds["arm0"] == 1
    assert by["urgent"].utility < 0  # past its 0.5 s cutoff


def test_a_waiting_task_that_gains_nothing_from_the_place_does_not_suspend_the_plan():
    """A normal task that waits for the place but starts well inside its ERT either way gains nothing: the arm
    plan streams on (the resume would cost a prefill and risk its robot idling)."""
    core, engine, clock, results, segs = core_for("pud-shed", max_batch=1)
    core.submit(TaskSpec(robot_id="arm0", prompt="short", tuf=LEVELS["normal"], robot_type="arm", task_id="arm0",
                         arrival=0.0, extra={"plan_text": "move_to('red_box');take('red_box');drop('blue_box');"}))
    while not segs:
        step(core, clock)
    core.submit(TaskSpec(robot_id="arm1", prompt="other", tuf=LEVELS["normal"], robot_type="arm", task_id="arm1",
                         arrival=clock.now(), extra={"plan_text": "move_to('red_box');"}))
    drain(core, clock)
    assert engine.adds["arm0"] == 1
    assert {r.task_id: r.status for r in results} == {"arm0": TaskStatus.DONE, "arm1": TaskStatus.DONE}
    assert next(r for r in results if r.task_id == "arm1").utility == LEVELS["normal"].beta


def test_a_resume_held_in_place_costs_no_prefill():
    """The resume cost counts only the resumes the engine resubmits (Engine.resume_counters)."""

    class InPlace(CountingEngine):
        def resume_counters(self):
            return {"resumed_in_place": 9, "resubmitted": 1, "released_held": 0}

    clock = SimClock(0.0)
    resub = PlannerCore(CountingEngine(), make_policy("pud-shed"), clock)
    held = PlannerCore(InPlace(), make_policy("pud-shed"), clock)
    for core in (resub, held):
        core.submit(arm_spec())
        core.start_step()
    g1, g2 = resub.generation("arm0"), held.generation("arm0")
    assert g1.task_id in resub.running_ids() and g2.task_id in held.running_ids()

    def cost(core: PlannerCore, g, tight: bool) -> float:
        return core.segmenting.resume_cost(g, tight, core.estimator, core.engine)

    assert cost(resub, g1, tight=False) > 0
    assert cost(held, g2, tight=False) == pytest.approx(0.1 * cost(resub, g1, tight=False))
    # with the KV cache tight, a resubmission recomputes all but the shared prefix
    assert cost(resub, g1, tight=True) > cost(resub, g1, tight=False)


def test_switching_to_pud_at_run_time_suspends_a_plan_written_in_place_again():
    core, engine, clock, results, segs = core_for("pud-shed")
    core.submit(arm_spec())
    while len(segs) < 2:
        step(core, clock)
    core.set_policy(make_policy("pud"))
    drain(core, clock)
    assert core.snapshot()["boundaries_suspended"] >= 9  # the rest of the plan, a suspension per boundary
    assert results[0].plan == ARM_PLAN
