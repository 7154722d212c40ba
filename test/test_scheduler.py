import threading

import pytest

from timelyllm_ros.domain.clock import RealClock, SimClock
from timelyllm_ros.domain.tuf import LEVELS
from timelyllm_ros.domain.types import TaskSpec, TaskStatus
from timelyllm_ros.engines.latency import LatencyEstimator
from timelyllm_ros.engines.sim_engine import SimEngine
from timelyllm_ros.planner import telemetry
from timelyllm_ros.planner.admission import FixedCap, make_admission
from timelyllm_ros.planner.config import CoreConfig
from timelyllm_ros.planner.core import PlannerCore
from timelyllm_ros.planner.policies import make_policy


def make_core(policy="pud", clock=None, **cfg):
    segs, results = [], []
    core = PlannerCore(SimEngine(), make_policy(policy), clock or SimClock(), config=CoreConfig(**cfg),
                       on_segment=lambda t, s: segs.append((t.task_id, s.index, s.text)),
                       on_result=results.append)
    return core, segs, results


def spec(i, plan="tc(30);mf(50);", level="normal", arrival=0.0):
    return TaskSpec(robot_id=f"r{i}", prompt=f"task {i}", tuf=LEVELS[level], task_id=f"t{i}", arrival=arrival,
                    extra={"plan_text": plan})


def drain(core, clock, limit=10000):
    for _ in range(limit):
        rep = core.start_step()
        if rep is not None:
            clock.advance(rep.duration_s)
            core.complete_step(rep)
            continue
        w = core.next_wakeup()
        if w is None:
            return
        clock.set(max(w, clock.now()))
    raise AssertionError("did not drain")


def test_segments_dispatched_and_resumed_open_loop():
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    core.submit(spec(0))
    drain(core, clock)
    assert [s[2] for s in segs] == ["tc(30);", "mf(50);"]
    (res,) = results
    assert res.status is TaskStatus.DONE and res.plan == "tc(30);mf(50);"
    assert res.response_time is not None and res.utility == 1.0
    s0, s1 = res.segments
    # resumed only near the predicted end of s0 (exec-model minimum of tc(30))
    assert s1.gen_start >= s0.pred_end - 0.5


def test_report_done_moves_resume_time():
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    core.submit(spec(0))
    while not segs:
        rep = core.start_step()
        clock.advance(rep.duration_s)
        core.complete_step(rep)
    g = core.generation("t0")
    assert g.eligible_at < clock.now() + 2.0  # predicted from the model's minimum
    core.report_segment_done("t0", 0, finish_time=clock.now() + 5.0)
    assert core.generation("t0").eligible_at > clock.now() + 4.5
    core.report_segment_done("t0", 0, finish_time=clock.now() + 0.01)
    assert core.next_wakeup() == clock.now()  # resume now
    drain(core, clock)
    assert results[0].status is TaskStatus.DONE


def test_cancel_and_failure_reach_the_robot():
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    core.submit(spec(0))
    core.submit(spec(1))
    assert core.cancel("t0")
    rep = core.start_step()
    clock.advance(rep.duration_s)
    core.complete_step(rep)
    assert core.cancel("t1")  # running: applied at the next decision
    core.start_step()
    st = {r.task_id: r.status for r in results}
    assert st == {"t0": TaskStatus.CANCELLED, "t1": TaskStatus.CANCELLED}
    assert not core.cancel("t0")
    core.submit(spec(2, plan="this is not a plan at all and it never ends " * 8))
    drain(core, clock)
    bad = results[-1]
    assert bad.status is TaskStatus.FAILED and "max_segment_tokens" in bad.reason


def test_a_task_ended_while_suspended_is_released_in_the_engine_by_the_engine_thread():
    """A suspended generation may still hold engine state (a parked vLLM request, a kept cache): when its
    task ends, the engine hears abort, from the thread that steps it."""
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    aborted: list[str] = []
    abort = core.engine.abort
    core.engine.abort = lambda gid: (aborted.append(gid), abort(gid))[1]
    core.submit(spec(0))
    while not segs:  # to its first boundary: suspended until its robot nearly finishes
        rep = core.start_step()
        clock.advance(rep.duration_s)
        core.complete_step(rep)
    assert "t0" not in core.engine.running_ids()
    assert core.cancel("t0") and results[-1].status is TaskStatus.CANCELLED
    assert aborted == []  # not from the canceller's thread
    assert core.next_wakeup() == clock.now()
    core.start_step()
    assert aborted == ["t0"]


def test_overdue_reject_policy():
    clock = SimClock(10.0)
    core, segs, results = make_core(clock=clock, overdue="reject")
    core.submit(spec(0, level="urgent", arrival=9.0))  # already 1 s late: utility < 0
    core.submit(spec(1, level="normal", arrival=10.0))
    drain(core, clock)
    st = {r.task_id: r for r in results}
    assert st["t0"].status is TaskStatus.OVERDUE and "cutoff" in st["t0"].reason
    assert st["t1"].status is TaskStatus.DONE


def test_threads_submit_while_engine_thread_serves():
    core, segs, results = make_core(clock=RealClock())
    core.engine.cfg.decode_s = 1e-4  # modelled only; the real clock just runs
    stop = threading.Event()
    th = threading.Thread(target=core.serve_forever, args=(stop,), daemon=True)
    th.start()
    now = core.clock.now()
    subs = [threading.Thread(target=lambda i=i: core.submit(spec(i, plan="tc(30);", arrival=now))) for i in range(20)]
    for t in subs:
        t.start()
    for t in subs:
        t.join()
    for _ in range(200):
        if len(results) == 20:
            break
        threading.Event().wait(0.01)
    stop.set()
    core.wake.set()
    th.join(2)
    assert len(results) == 20 and all(r.status is TaskStatus.DONE for r in results)


def test_admission_and_estimator():
    assert make_admission("cap4").cap == 4 and make_admission(6).cap == 6
    assert make_admission("adaptive").name == "adaptive"
    assert FixedCap(2).max_batch() == 2
    est = LatencyEstimator(decode_s=0.02, slope_s=0.001)
    for b in (1, 2, 4, 8):
        for _ in range(50):
            est.observe(b, 0.03 + 0.002 * (b - 1))
    assert abs(est.step_time(16) - (0.03 + 0.002 * 15)) < 0.005


def test_invalid_llm_output_never_reaches_the_robot():
    # an unknown skill after a valid segment: the valid one is sent, the task then fails with the reason
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    core.submit(spec(0, plan="tc(30);fly(3);mf(50);"))
    drain(core, clock)
    assert [s[2] for s in segs] == ["tc(30);"]
    (res,) = results
    assert res.status is TaskStatus.FAILED and "fly" in res.reason and "segment 1" in res.reason
    assert "t0" not in core.engine.running_ids()


def test_out_of_range_argument_fails_before_anything_is_sent():
    for policy in ("pud", "fcfs", "fcfs-stream"):
        clock = SimClock()
        core, segs, results = make_core(policy, clock=clock)
        core.submit(spec(0, plan="mf(900);tc(30);"))
        drain(core, clock)
        assert segs == [], policy
        (res,) = results
        assert res.status is TaskStatus.FAILED and "900" in res.reason and "outside" in res.reason, res.reason


def test_fcfs_holds_a_plan_back_when_a_later_segment_is_invalid():
    clock = SimClock()
    core, segs, results = make_core("fcfs", clock=clock)
    core.submit(spec(0, plan="tc(30);mf(50);tc(999);"))
    drain(core, clock)
    assert segs == []  # fcfs sends the whole plan at the end, so nothing of it was sent
    assert results[0].status is TaskStatus.FAILED


def test_a_plan_whose_segments_parse_but_whose_whole_does_not_ends_failed():
    """Each segment is valid alone; a plan that ends with a block still open is not a plan (never DONE)."""
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    core.submit(spec(0, plan="?iv('cat')==True{mf(50);"))
    core.submit(spec(1, plan="?iv('cat')==True{mf(50);}"))
    drain(core, clock)
    by_id = {r.task_id: r for r in results}
    assert by_id["t0"].status is TaskStatus.FAILED and "invalid plan at its end" in by_id["t0"].reason
    assert by_id["t1"].status is TaskStatus.DONE
    assert "".join(s[2] for s in segs if s[0] == "t0") == "?iv('cat')==True{mf(50);"  # streamed before the end


def test_the_decision_log_keeps_the_most_recent_decisions_only(monkeypatch):
    monkeypatch.setattr(PlannerCore, "DECISION_LOG_LEN", 5)
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    for i in range(6):
        core.submit(spec(i, plan="tc(30);mf(50);tc(90);"))
        drain(core, clock)
    assert len(results) == 6 and len(core.decision_times) == 5  # more decisions were taken than are kept
    assert core.step_count > 5


def _prefill_est(core, task_id):
    return next(q["prefill_est_s"] for q in telemetry.queue_view(core) if q["task_id"] == task_id)


def test_every_task_is_estimated_with_the_prefix_its_own_warmed_prompt_leaves_cached():
    """The planner warms one prompt per set of few-shot families; a task continues one of them, and the cache
    holds that prefix in whole KV blocks. Keeping only the last warmed prompt, a fresh pud-shed planner counted
    an emergency task as a near-cold prompt and shed it; with a robot type's mean hit, a prompt whose families
    leave a shorter prefix cached looked 3x cheaper to prefill than it was (bench/results/urgent_burst)."""
    core, _, _ = make_core()
    block = core.engine.info.kv_block_tokens
    system = list(range(1000, 1040))
    families = [system + list(range(k * 1000, k * 1000 + 60 + 40 * k)) for k in range(3)]
    for p in families:
        core.note_warm_prompt("drone", p)
    for i, fam in enumerate([0, 2, 1, 0]):  # not only the first task of the robot type
        task = spec(i)
        task.prompt_token_ids = families[fam] + [7, 8, 9] * (i + 1)  # a warmed prompt's families, its own turn
        core.submit(task)
        n = len(task.prompt_token_ids)
        hit = len(families[fam]) // block * block
        assert _prefill_est(core, f"t{i}") == pytest.approx(core.estimator.prefill_time(n - hit))
    short = spec(9)
    short.prompt_token_ids = families[1][:64]  # inside the warm prompt: all but its last token cached
    core.submit(short)
    assert _prefill_est(core, "t9") == pytest.approx(core.estimator.prefill_time(64 - min(64 // block * block, 63)))
    other = spec(10)
    other.robot_type = "arm"
    other.prompt_token_ids = families[0] + [9]
    core.submit(other)  # another robot type's prompt was never warmed: cold
    assert _prefill_est(core, "t10") == pytest.approx(core.estimator.prefill_time(len(families[0]) + 1))


def test_a_switch_to_a_streaming_policy_sends_the_held_segments_first_in_order():
    """fcfs holds a plan's segments until it ends; switched to a streaming policy mid-plan, the next segment goes
    out after the held ones, in order (not ahead of them, which a robot's inbox would hold back until the plan's
    end)."""
    clock = SimClock()
    core, segs, results = make_core("fcfs", clock=clock)
    core.submit(spec(0, plan="tc(30);mf(50);tc(90);"))
    for _ in range(1000):  # until the first segment is written and held
        rep = core.start_step()
        clock.advance(rep.duration_s)
        core.complete_step(rep)
        g = core.generation("t0")
        if g is not None and g.segments:
            break
    assert segs == [] and len(core.generation("t0").segments) == 1
    core.set_policy(make_policy("fcfs-stream"))
    drain(core, clock)
    assert [s[1] for s in segs] == [0, 1, 2] and results[0].status is TaskStatus.DONE
    s0, s1 = results[0].segments[:2]
    assert s0.dispatch == s1.dispatch  # the held one went out with the next, not at the plan's end
