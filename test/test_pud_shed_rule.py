"""pud-shed's shedding rule (issue 28): a first segment is shed only when its best case, given the work the
policy runs before it, cannot earn positive utility. Deterministic: simulated clock and engine."""

from test_scheduler import drain

from timelyllm_ros.domain.clock import SimClock
from timelyllm_ros.domain.tuf import LEVELS
from timelyllm_ros.domain.types import TaskSpec, TaskStatus
from timelyllm_ros.engines.sim_engine import SimEngine
from timelyllm_ros.planner.config import CoreConfig
from timelyllm_ros.planner.core import PlannerCore
from timelyllm_ros.planner.policies import make_policy

COMM = CoreConfig().comm_s


def make_core(policy: str, clock: SimClock, **cfg):
    results = []
    core = PlannerCore(SimEngine(), make_policy(policy), clock, config=CoreConfig(**cfg), on_result=results.append)
    return core, results


def task(tid: str, level: str, arrival: float, plan: str, prompt: list[int] | None = None) -> TaskSpec:
    return TaskSpec(robot_id=f"r-{tid}", prompt=f"task {tid}", tuf=LEVELS[level], task_id=tid, arrival=arrival,
                    prompt_token_ids=prompt, extra={"plan_text": plan})


def step(core, clock):
    rep = core.start_step()
    assert rep is not None
    clock.advance(rep.duration_s)
    core.complete_step(rep)


def test_a_short_first_segment_is_judged_by_its_own_length_not_the_mean():
    """The drone trace at 2x load: urgent ``d(3);`` (4 tokens) were shed while running because the mean segment
    (12-13 tokens) at the batch's step time would have missed the cutoff; PUD served them inside it. The best case
    is the shortest first segment the robot type has written, less what is written."""
    clock = SimClock(0.0)
    # A mean of 14 tokens per segment, as long MiniSpec conditionals make it; the first plan teaches the minimum.
    core, results = make_core("pud-shed", clock, segment_tokens_prior={"drone": 14.0})
    core.submit(task("teach", "normal", 0.0, "d(3);"))
    drain(core, clock)
    assert results[-1].status is TaskStatus.DONE and core.overload.fewest_tokens("drone", True) == 4  # d ( 3 );
    t0 = clock.now() + 1.0
    clock.set(t0)
    core.submit(task("u", "urgent", t0 - 0.2, "d(3);"))  # queued 0.2 s already (a burst ahead of it)
    step(core, clock)  # admitted: prefill and its first token
    assert core.running_ids() == ["u"]
    per_token = core.estimator.step_time(1)
    clock.set(t0 - 0.2 + 0.40)  # 0.40 s after arrival, 3 tokens to go: ~0.47 s at best, inside the 0.5 s cutoff
    mean_left = (core.lengths.mean("drone") - 1) * per_token
    assert LEVELS["urgent"].tuf0(0.40 + mean_left + COMM) < 0  # what the mean-based rule shed
    assert LEVELS["urgent"].tuf0(0.40 + 3 * per_token + COMM) > 0
    drain(core, clock)
    res = {r.task_id: r for r in results}
    assert res["u"].status is TaskStatus.DONE and res["u"].utility > 0


def _two_urgent_behind_one_prefill(policy: str):
    """Two urgent tasks queued 0.1 s, each with a 1760-token prompt the cache does not hold (~0.2 s of prefill):
    the first in the policy's order can make its cutoff; the second waits for the first's prefill as well."""
    clock = SimClock(0.1)
    core, results = make_core(policy, clock)
    for i, tid in enumerate(("a", "b")):
        prompt = [10_000 + 5_000 * i + n for n in range(1760)]
        core.submit(task(tid, "urgent", 0.0, "d(3);", prompt))
    return core, results, clock


def test_a_queued_first_segment_counts_the_prefill_the_policy_runs_before_it():
    core, results, clock = _two_urgent_behind_one_prefill("pud-shed")
    own = core.estimator.prefill_time(1760)
    assert LEVELS["urgent"].tuf0(0.1 + own + core.estimator.step_time(1) + COMM) > 0  # alone, b could make it
    drain(core, clock)
    res = {r.task_id: r for r in results}
    assert res["b"].status is TaskStatus.OVERDUE and "queued, shed by pud-shed" in res["b"].reason
    assert res["a"].status is TaskStatus.DONE and res["a"].utility > 0
    # The shed was right: PUD, which serves it, gets no positive utility from it.
    core, results, clock = _two_urgent_behind_one_prefill("pud")
    drain(core, clock)
    res = {r.task_id: r for r in results}
    assert res["b"].status is TaskStatus.DONE and res["b"].utility <= 0


def test_a_shed_task_is_never_one_pud_would_serve_with_positive_utility():
    """A burst of 12 urgent tasks, queued 0.1 s already, with short first segments and cold 170-token prompts
    (as the traces' at 2x load): PUD serves every one inside the cutoff. The mean-based rule shed all twelve;
    whatever pud-shed sheds now, PUD could not have earned anything from it."""
    def run(policy):
        clock = SimClock(0.0)
        core, results = make_core(policy, clock, segment_tokens_prior={"drone": 14.0})
        core.submit(task("teach", "normal", 0.0, "d(3);"))
        drain(core, clock)
        t0 = clock.now() + 1.0
        clock.set(t0)
        for i in range(12):
            prompt = [20_000 + 400 * i + n for n in range(170)]
            core.submit(task(f"u{i}", "urgent", t0 - 0.1, "d(3);mf(50);", prompt))
        drain(core, clock)
        return {r.task_id: r for r in results if r.task_id != "teach"}

    shed, pud = run("pud-shed"), run("pud")
    assert all(r.utility > 0 for r in pud.values())
    gone = [t for t, r in shed.items() if r.status is TaskStatus.OVERDUE]
    assert all(pud[t].utility is None or pud[t].utility <= 0 for t in gone)
    assert sum(r.utility or 0.0 for r in shed.values()) >= sum(r.utility or 0.0 for r in pud.values())


def _urgent_then_long_prompts(policy: str):
    """An urgent task ranked first, admitted with four normal tasks whose 1500-token prompts are prefilled in
    the same steps (a batch cap that admits them all): chunked prefill puts ~0.23 s of their prompts in each of
    its steps, so after its first token it cannot finish its 4-token segment inside the cutoff."""
    from timelyllm_ros.planner.admission import FixedCap

    clock = SimClock(0.0)
    results = []
    core = PlannerCore(SimEngine(), make_policy(policy), clock, admission=FixedCap(16), on_result=results.append)
    core.submit(task("teach", "normal", 0.0, "d(3);", [1] * 2100))  # a 4-token first segment; a full prefill step
    drain(core, clock)
    t0 = clock.now() + 1.0
    clock.set(t0)
    core.submit(task("u", "urgent", t0 - 0.15, "d(3);", [2] * 100))
    for i in range(4):
        core.submit(task(f"n{i}", "normal", t0, "d(3);", [3 + i] * 1500))
    return core, results, clock


def test_a_running_first_segment_counts_the_prefill_its_steps_will_carry():
    core, results, clock = _urgent_then_long_prompts("pud-shed")
    step(core, clock)  # all five admitted; the urgent prompt, first in line, is through and writes a token
    assert "u" in core.running_ids() and not any(r.task_id == "u" for r in results)
    core.start_step()  # the next decision: 3 tokens to go, each step carrying ~2000 prompt tokens of the others
    res = {r.task_id: r for r in results}
    assert res["u"].status is TaskStatus.OVERDUE and "running, shed by pud-shed" in res["u"].reason
    # PUD serves it, past its cutoff.
    core, results, clock = _urgent_then_long_prompts("pud")
    drain(core, clock)
    res = {r.task_id: r for r in results}
    assert res["u"].status is TaskStatus.DONE and res["u"].utility <= 0
