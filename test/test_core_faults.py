"""PlannerCore under faults, without ROS: engine death, silent or late-failing robots, bounded results,
restoring a journaled task, learning per robot type (SimClock + SimEngine: deterministic)."""

import pytest
from test_scheduler import drain, make_core, spec

from timelyllm_ros.domain.clock import SimClock
from timelyllm_ros.domain.tuf import LEVELS
from timelyllm_ros.domain.types import Segment, TaskSpec, TaskStatus
from timelyllm_ros.transport.delivery import SegmentDelivery


def _step_until(core, clock, pred, limit=1000):
    for _ in range(limit):
        if pred():
            return
        rep = core.start_step()
        if rep is None:
            w = core.next_wakeup()
            assert w is not None, "idle before the condition held"
            clock.set(max(w, clock.now()))
            continue
        clock.advance(rep.duration_s)
        core.complete_step(rep)
    raise AssertionError("condition never held")


def test_fail_all_ends_every_open_task_at_once_and_a_new_engine_serves():
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    for i in range(4):
        core.submit(spec(i, plan="tc(30);mf(50);tc(10);"))
    _step_until(core, clock, lambda: len(segs) >= 2)
    assert core.fail_all("planner engine failure: boom") == 4
    assert sorted(r.task_id for r in results) == ["t0", "t1", "t2", "t3"]
    assert all(r.status is TaskStatus.FAILED and "boom" in r.reason for r in results)
    assert core.pending() == 0
    from timelyllm_ros.engines.sim_engine import SimEngine

    core.replace_engine(SimEngine())
    core.submit(spec(9))
    drain(core, clock)
    assert results[-1].task_id == "t9" and results[-1].status is TaskStatus.DONE


def test_replace_engine_refuses_while_tasks_are_open():
    core, _, _ = make_core()
    core.submit(spec(0))
    with pytest.raises(RuntimeError, match="open tasks"):
        core.replace_engine(core.engine)


def test_a_failure_reported_after_the_generation_ended_revises_the_result():
    clock = SimClock()
    core, segs, results = make_core(clock=clock)
    core.submit(spec(0))
    drain(core, clock)
    assert results[-1].status is TaskStatus.DONE
    core.report_segment_done("t0", 1, clock.now(), success=False, error="motor stalled")
    assert len(results) == 2 and results[-1].status is TaskStatus.ROBOT_FAILED
    assert "motor stalled" in results[-1].reason and core.result("t0").status is TaskStatus.ROBOT_FAILED


def test_a_silent_robot_fails_its_task_and_only_its_task():
    clock = SimClock()
    core, segs, results = make_core(clock=clock, robot_timeout_s=5.0)
    core.submit(spec(0))  # r0 never reports
    core.submit(spec(1))
    drain(core, clock)
    for r in results:  # r1 reports every segment
        if r.task_id == "t1":
            for s in r.segments:
                core.report_segment_done("t1", s.index, s.pred_end)
    assert core.expire_silent(clock.now()) == []  # not yet late
    clock.advance(60.0)
    assert core.expire_silent(clock.now()) == ["t0"]
    assert core.result("t0").status is TaskStatus.ROBOT_FAILED and "silent" in core.result("t0").reason
    assert core.result("t1").status is TaskStatus.DONE
    assert core.expire_silent(clock.now()) == []  # once


def test_a_segment_the_robot_never_acknowledged_is_not_its_silence():
    """A segment lost on the way (5 % packet loss, every copy of it for 11 s) is delivery's to re-send and,
    past its bound, to fail; only once the robot has it does its silence about it count."""
    clock = SimClock()
    core, _, results = make_core(clock=clock, robot_timeout_s=5.0)
    core.submit(spec(0, plan="tc(30);mf(50);"))
    drain(core, clock)
    last = max(s.index for s in results[0].segments)
    for s in results[0].segments:
        if s.index != last:
            core.report_segment_done("t0", s.index, s.pred_end)
    acked: set[tuple[str, int]] = set()
    clock.advance(60.0)
    assert core.expire_silent(clock.now(), unacked=lambda t, i: (t, i) not in acked) == []
    assert core.result("t0").status is TaskStatus.DONE
    acked.add(("t0", last))  # it arrived, and the robot still says nothing about it
    assert core.expire_silent(clock.now(), unacked=lambda t, i: (t, i) not in acked) == ["t0"]
    assert core.result("t0").status is TaskStatus.ROBOT_FAILED


def test_finished_results_are_bounded_and_their_ids_reusable():
    clock = SimClock()
    core, _, results = make_core(clock=clock, keep_results_max=3)
    for i in range(6):
        core.submit(spec(i))
        drain(core, clock)
    assert [core.result(f"t{i}") is not None for i in range(6)] == [False] * 3 + [True] * 3
    core.submit(spec(0))  # t0 was forgotten: the id may be used again
    drain(core, clock)
    assert core.result("t0").status is TaskStatus.DONE


def test_learning_uses_the_tasks_own_robot_type_after_the_generation_ended():
    clock = SimClock()
    core, _, results = make_core(clock=clock)
    arm = TaskSpec(robot_id="a0", prompt="stack", tuf=LEVELS["normal"], robot_type="arm", task_id="a",
                   arrival=0.0, extra={"plan_text": "pick('red_box');place('blue_box');"})
    core.submit(arm)
    drain(core, clock)
    res = core.result("a")
    assert res.status is TaskStatus.DONE and res.robot_type == "arm", res.reason
    model = core.hooks.exec_model("arm")
    before = model.estimate(res.segments[-1].calls).min_s
    s = res.segments[-1]
    core.report_segment_done("a", s.index, s.pred_start + 50.0, start_time=s.pred_start)
    assert model.estimate(s.calls).min_s != before  # the arm model learned, not the drone's


def test_restore_resumes_a_journaled_generation_from_its_token_ids():
    clock = SimClock()
    ref, _, ref_results = make_core(clock=clock)
    ref.submit(spec(0, plan="tc(30);mf(50);tc(10);"))
    drain(ref, clock)
    full = ref_results[-1]
    assert full.status is TaskStatus.DONE
    # a new core (the restarted planner) gets the first segment as journaled, and finishes the plan
    clock2 = SimClock(start=clock.now())
    core, segs, results = make_core(clock=clock2)
    s0 = full.segments[0]
    restored = Segment(index=0, text=s0.text, token_ids=list(s0.token_ids), calls=s0.calls, gen_start=s0.gen_start,
                       ready=s0.ready, dispatch=s0.dispatch, est_exec_s=s0.est_exec_s, pred_start=s0.pred_start,
                       pred_end=s0.pred_end)
    core.restore(spec(0, plan="tc(30);mf(50);tc(10);"), [restored])
    drain(core, clock2)
    assert [s[1] for s in segs] == [1, 2]  # nothing sent twice
    assert results[-1].status is TaskStatus.DONE and results[-1].plan == full.plan


def test_restore_of_a_finished_plan_ends_done_without_generating():
    core, segs, results = make_core()
    seg = Segment(index=0, text="tc(30);", token_ids=[1], calls=[], gen_start=0.0, ready=0.0, dispatch=0.0,
                  final=True)
    core.restore(spec(0), [seg])
    assert segs == [] and results[-1].status is TaskStatus.DONE


def test_delivery_resends_until_acknowledged_and_gives_up_explicitly():
    sent = []
    d = SegmentDelivery(lambda robot, msg: sent.append((robot, msg.task_id, msg.segment_index)), period_s=0.1,
                        max_period_s=0.4, give_up_s=5.0)

    class M:
        def __init__(self, t, i):
            self.task_id, self.segment_index = t, i

    d.send("r0", M("a", 0), now=0.0)
    d.send("r1", M("b", 0), now=0.0)
    assert d.due(0.05) == [] and len(sent) == 2
    d.due(0.1)
    assert sent[2:] == [("r0", "a", 0), ("r1", "b", 0)]
    assert d.ack("a", 0) and not d.ack("a", 0)  # a duplicate ack is harmless
    times = [0.3, 0.7, 1.1, 1.5]
    for t in times:
        d.due(t)
    assert all(x[1] == "b" for x in sent[4:]) and d.pending() == 1
    assert d.due(5.5) == [("b", 0, "r1")] and d.pending() == 0


def test_a_forgotten_task_is_never_re_sent_but_what_it_keeps_is():
    """A task that ended without running its plan: a late copy of its segment 0 would start it on a robot that
    now runs another task; its end marker may still go out."""
    sent = []

    class M:
        def __init__(self, t, i, text="mf(50);"):
            self.task_id, self.segment_index, self.text = t, i, text

    d = SegmentDelivery(lambda robot, msg: sent.append((msg.task_id, msg.segment_index)), period_s=0.1)
    d.send("r0", M("a", 0), 0.0)
    d.send("r0", M("a", 1), 0.0)
    d.send("r0", M("a", 2, text=""), 0.0)  # the end marker
    d.send("r0", M("b", 0), 0.0)
    assert d.forget("a", keep=lambda m: not m.text) == 2
    sent.clear()
    d.due(0.5)
    assert sorted(sent) == [("a", 2), ("b", 0)]
    assert not d.unacked("a", 0) and d.unacked("a", 2) and d.forget("zzz") == 0


def test_an_ack_of_a_later_segment_resends_a_lost_earlier_one_at_once():
    sent = []

    class M:
        def __init__(self, t, i):
            self.task_id, self.segment_index = t, i

    d = SegmentDelivery(lambda robot, msg: sent.append(msg.segment_index), matched_period_s=3.0)
    d.send("r0", M("a", 0), 0.0, matched=True)  # lost: the robot's reader had not matched yet
    d.send("r0", M("a", 1), 0.1, matched=True)
    assert d.due(0.2) == [] and sent == [0, 1]  # matched: no re-send before 3 s ...
    d.ack("a", 1, now=0.3)  # ... but the robot has 1 and not 0: 0 was lost
    d.due(0.3)
    assert sent == [0, 1, 0] and d.pending() == 1


def test_an_ack_of_a_copy_sent_later_to_the_same_robot_resends_a_lost_one_of_another_task():
    """One topic per robot, in order: the robot acknowledging a copy sent after another one's latest copy
    means that one never arrived, whichever task it belongs to; other robots' copies are not concerned."""
    sent = []

    class M:
        def __init__(self, t, i):
            self.task_id, self.segment_index = t, i

    d = SegmentDelivery(lambda robot, msg: sent.append((robot, msg.task_id)), matched_period_s=3.0)
    d.send("r0", M("a", 0), 0.0, matched=True)  # lost
    d.send("r1", M("c", 0), 0.05, matched=True)  # another robot: still on its way
    d.send("r0", M("b", 0), 0.1, matched=True)
    d.send("r0", M("d", 0), 0.1, matched=True)  # sent at the same time as b: no evidence either way
    d.ack("b", 0, now=0.2)
    d.due(0.2)
    assert sent[4:] == [("r0", "a")] and d.pending() == 3
    d.due(2.9)
    assert sent[5:] == []  # the re-sent copy waits its period again


def test_a_robot_that_is_behind_gets_no_duplicates_before_twice_the_ack_lag():
    """While acknowledgements take 20 s (a starved fleet process), a copy that went to a matched reader of a
    robot that keeps answering is queued, not lost: no re-send before 40 s. One known lost goes at once."""
    sent = []

    class M:
        def __init__(self, t, i):
            self.task_id, self.segment_index = t, i

    d = SegmentDelivery(lambda robot, msg: sent.append((msg.task_id, msg.segment_index, round(now, 1))),
                        matched_period_s=3.0, matched_max_period_s=12.0, give_up_s=100.0)
    now = 0.0
    d.send("r0", M("old", 0), 0.0, matched=True)
    now = 1.0
    d.send("r0", M("a", 0), 1.0, matched=True)
    d.send("r0", M("a", 1), 1.0, matched=True)
    d.send("r0", M("b", 0), 1.0, matched=True)
    d.send("r1", M("unmatched", 0), 1.0)  # not matched: re-sent on its fast period as before
    assert d.ack("old", 0, now=20.0)  # 20 s from send to ack
    for k in range(201, 721):
        now = k / 10
        d.heard("r0", now)
        if k == 300:
            d.ack("a", 1, now=now)  # a[1] arrived, a[0] did not: a[0] is lost
        d.due(now)
    a0 = [t for task, i, t in sent if (task, i) == ("a", 0)]
    assert a0 == [1.0, 30.0], a0  # sent at once when known lost, then waits for the queue again
    b0 = [t for task, i, t in sent if (task, i) == ("b", 0)]
    # a[1]'s ack took 29 s: b waits past 2 x 29 s after its copy, to its next due time (checked from 20.1 s:
    # 26.1, 38.1, 50.1, 62.1)
    assert b0 == [1.0, 62.1], b0
    assert len([x for x in sent if x[0] == "unmatched"]) > 20


def test_matched_resends_back_off_to_their_cap():
    """A robot whose reader matched gets a copy unless it died or is far behind: re-sends double from
    matched_period_s up to matched_max_period_s (a fixed period fed a storm of duplicates under load)."""
    sent = []

    class M:
        task_id, segment_index = "a", 0

    d = SegmentDelivery(lambda robot, msg: sent.append(round(now, 1)), matched_period_s=3.0,
                        matched_max_period_s=12.0, give_up_s=100.0)
    now = 0.0
    d.send("r0", M(), now, matched=True)
    d.heard("r0", 0.0)
    for k in range(1, 601):  # 60 s in steps of 0.1 s
        now = k / 10
        d.heard("r0", now)  # alive: never given up on
        d.due(now)
    assert sent == [0.0, 3.0, 9.0, 21.0, 33.0, 45.0, 57.0], sent
    with pytest.raises(ValueError, match="matched_max_period_s"):
        SegmentDelivery(lambda robot, msg: None, matched_period_s=3.0, matched_max_period_s=2.0)


def test_slow_acknowledgements_extend_the_silence_a_robot_is_allowed():
    """While the robots that do answer take 25 s to acknowledge (a loaded host), a robot silent for 30 s is
    behind, not dead: it is given up on only past give_up_s + that lag (and always by 4x give_up_s)."""

    class M:
        def __init__(self, t, i):
            self.task_id, self.segment_index = t, i

    d = SegmentDelivery(lambda robot, msg: None, give_up_s=30.0)
    d.send("slow", M("s", 0), 0.0, matched=True)
    d.send("quiet", M("q", 0), 0.0, matched=True)
    assert d.ack("s", 0, now=25.0)
    d.heard("slow", 25.0)
    assert d.due(31.0, lambda r: True) == []  # quiet: 31 s silent, but acks take 25 s
    assert d.due(56.0, lambda r: True) == [("q", 0, "quiet")]
    # the reason says what delivery knew: copies sent, the robot's silence (and a lag it allowed for)
    assert d.given_up_detail("q", 0) == "sent 1 time over 56.0 s; robot never heard"  # the lag is 31 s old
    assert d.given_up_detail("s", 0) == ""  # acknowledged: never given up on
    # no lag known: 30 s of silence is enough
    d2 = SegmentDelivery(lambda robot, msg: None, give_up_s=30.0)
    d2.send("quiet", M("q", 0), 0.0, matched=True)
    assert d2.due(31.0, lambda r: True) == [("q", 0, "quiet")]


def test_delivery_waits_longer_for_a_robot_it_has_not_discovered_yet():
    """Silence of a robot whose reader never matched says nothing (nothing could reach it): it gets the hard
    bound (4x give_up_s), a discovered silent robot gets give_up_s."""
    d = SegmentDelivery(lambda robot, msg: None, period_s=0.1, max_period_s=0.4, give_up_s=5.0)

    class M:
        def __init__(self, t, i):
            self.task_id, self.segment_index = t, i

    matched = {"near": True, "far": False}
    d.send("near", M("a", 0), now=0.0)
    d.send("far", M("b", 0), now=0.0)
    assert d.due(5.5, matched.__getitem__) == [("a", 0, "near")]
    assert d.due(19.0, matched.__getitem__) == [] and d.pending() == 1
    matched["far"] = True  # discovered late: now it is judged like any robot
    d.heard("far", 19.0)
    assert d.due(19.5, matched.__getitem__) == [] and d.pending() == 1
    assert d.due(20.5, matched.__getitem__) == [("b", 0, "far")]  # past the hard bound, whatever it says


def test_a_restored_planner_asks_for_missing_reports_at_once_and_judges_silence_from_the_restart():
    """Reports sent while the planner was dead are lost. Judged from the segment's old predicted end, the
    robot looked silent the moment the planner came back (CI: ROBOT_FAILED 1.5 s after a restart)."""
    clock = SimClock(start=100.0)
    core, _, results = make_core(clock=clock, robot_timeout_s=5.0)
    seg = Segment(index=0, text="tc(30);", token_ids=[1], calls=[], gen_start=0.0, ready=0.0, dispatch=1.0,
                  pred_start=1.0, pred_end=4.0)  # journaled long before: its predicted end + 5 s has passed
    core.restore(spec(0, plan="tc(30);mf(50);"), [seg])
    probes = core.unreported()
    assert [(t, s.index) for t, _, _, s in probes] == [("t0", 0)]  # re-sent at once: the robot answers again
    assert core.unreported() == [] and core.expire_silent() == []  # asked once; not silent yet
    clock.set(104.0)
    assert core.expire_silent() == []
    core.report_segment_done("t0", 0, 50.0, start_time=10.0)  # the cached report comes back
    clock.set(106.0)
    assert core.expire_silent() == [] and not [r for r in results if r.status is TaskStatus.ROBOT_FAILED]


def test_a_restored_segment_whose_robot_stays_silent_still_fails():
    clock = SimClock(start=100.0)
    core, _, results = make_core(clock=clock, robot_timeout_s=5.0)
    seg = Segment(index=0, text="tc(30);", token_ids=[1], calls=[], gen_start=0.0, ready=0.0, dispatch=1.0,
                  pred_start=1.0, pred_end=4.0, final=True)
    core.restore(spec(0), [seg])
    clock.set(105.5)
    assert core.expire_silent() == ["t0"]
    assert any(r.status is TaskStatus.ROBOT_FAILED and "robot silent" in r.reason for r in results)


def test_a_robot_inside_the_longest_time_the_model_allows_is_not_silent():
    """s('cat') takes 1.5 to 12.2 s by the drone's model. The next segment is planned with the minimum, but a
    robot still scanning 1.5 s + the timeout later is not silent (real CPU engine runs failed it at 11.5 s)."""
    clock = SimClock()
    core, _, results = make_core(clock=clock, robot_timeout_s=5.0)
    core.submit(spec(0, plan="?s('cat')==True{g('cat');}"))
    drain(core, clock)
    first = results[0].segments[0]
    assert first.est_exec_s == pytest.approx(1.5275) and first.max_exec_s == pytest.approx(12.22)
    clock.set(first.pred_start + first.est_exec_s + 5.0 + 1.0)  # past min + timeout: what was failed before
    assert core.expire_silent(clock.now()) == []
    clock.set(first.pred_start + first.max_exec_s + 5.0 + 1.0)  # past the longest + timeout: silent
    assert core.expire_silent(clock.now()) == ["t0"]
    assert "longest execution by the model (12.22 s)" in core.result("t0").reason


def test_a_robot_that_sends_heartbeats_is_silent_only_once_they_stop():
    """The emulated Tello scanned for 16.5 s where the model allows 12.2 s, and was failed as silent while still
    scanning. A robot that says it runs the segment is alive, however long the skill takes."""
    clock = SimClock()
    core, _, results = make_core(clock=clock, robot_timeout_s=5.0)
    core.submit(spec(0, plan="?s('cat')==True{g('cat');}"))
    drain(core, clock)
    start = clock.now()  # the plan was written; the robot is scanning
    assert core.robot_alive("t0", 0, "r0") is None  # the ack
    for k in range(40):  # 40 s of heartbeats: far past the model's longest 12.2 s + the 5 s timeout
        clock.set(start + k)
        assert core.robot_alive("t0", 0, "r0") is None
        assert core.expire_silent(clock.now()) == []
    last = clock.now()
    clock.set(last + 4.9)
    assert core.expire_silent(clock.now()) == []
    clock.set(last + 5.1)  # the heartbeats stopped: silent, whatever the model predicted
    assert core.expire_silent(clock.now()) == ["t0"]
    assert core.result("t0").status is TaskStatus.ROBOT_FAILED and "no heartbeat" in core.result("t0").reason


def test_a_slow_robot_that_sends_heartbeats_finishes_and_teaches_the_model_its_real_time():
    clock = SimClock()
    core, _, results = make_core(clock=clock, robot_timeout_s=5.0)
    core.submit(spec(0, plan="?s('cat')==True{g('cat');}"))
    drain(core, clock)
    first = results[0].segments[0]
    start = clock.now()
    for k in range(17):
        clock.set(start + k)
        core.robot_alive("t0", 0, "r0")
        assert core.expire_silent(clock.now()) == []
    model = core.hooks.exec_model("drone")
    before = model.estimate(first.calls).typical_s
    assert core.report_segment_done("t0", 0, start + 16.5, True, "", start, robot_id="r0") is None
    assert model.estimate(first.calls).typical_s > before  # learned from the slow scan, not failed by it
    assert core.result("t0").status is TaskStatus.DONE


def test_robot_messages_count_only_from_the_tasks_robot_for_a_segment_sent_to_it():
    """Any node on the domain can publish reports and acks: a forged failure from 'mallory' ended r0's task, a
    forged success freed a busy robot. Only the task's robot, about a segment sent to it, counts."""
    clock = SimClock()
    core, _, results = make_core(clock=clock, robot_timeout_s=5.0)
    core.submit(spec(0, plan="tc(30);mf(50);"))
    drain(core, clock)
    n = len(results[0].segments)
    why = core.report_segment_done("t0", 0, clock.now(), False, "forged", robot_id="mallory")
    assert "mallory" in why and "r0" in why
    assert core.robot_alive("t0", 0, "mallory") is not None
    assert "never sent" in core.report_segment_done("t0", n + 3, clock.now(), False, "forged", robot_id="r0")
    assert "unknown task" in core.report_segment_done("t9", 0, clock.now(), False, "forged", robot_id="r9")
    assert core.result("t0").status is TaskStatus.DONE and len(results) == 1  # unaffected
    # ... and a robot heard only through forged messages is still silent on time
    clock.advance(60.0)
    assert core.expire_silent(clock.now()) == ["t0"]
    # the end-of-plan marker (index n) is a message of the task's robot too, not a forgery
    assert core.robot_alive("t0", n, "r0") is None


def test_a_validator_that_raises_fails_its_task_alone():
    """A bug met by one plan's text (in the validator, or anywhere handling its segment) fails that task with
    the reason; the engine loop does not raise (which fails every open task and rebuilds the engine)."""
    clock = SimClock()
    core, _, results = make_core(clock=clock)
    real = core.hooks.skillset("drone")

    class _Buggy:  # the real skill set, with a validator that raises on one plan's text
        def __getattr__(self, name):
            return getattr(real, name)

        def validate(self, text):
            if "mf(13)" in text:
                raise TypeError("validator bug")
            return real.validate(text)

    core.hooks.use_skillset("drone", _Buggy())
    core.submit(spec(0, plan="tc(30);mf(13);"))
    core.submit(spec(1))
    drain(core, clock)
    by_id = {r.task_id: r for r in results}
    assert by_id["t0"].status is TaskStatus.FAILED
    assert by_id["t0"].reason == ("invalid plan output in segment 1 ('mf(13);'): the drone validator raised "
                                  "TypeError: validator bug"), by_id["t0"].reason
    assert by_id["t1"].status is TaskStatus.DONE


def test_an_event_the_core_cannot_handle_fails_its_task_alone(monkeypatch):
    clock = SimClock()
    core, _, results = make_core(clock=clock)
    validate = core.hooks.validate

    def buggy(robot_type, text):
        if "mf(13)" in text:
            raise KeyError("oops")
        return validate(robot_type, text)

    monkeypatch.setattr(core.hooks, "validate", buggy)
    core.submit(spec(0, plan="tc(30);mf(13);tc(10);"))
    core.submit(spec(1))
    drain(core, clock)
    by_id = {r.task_id: r for r in results}
    assert by_id["t0"].status is TaskStatus.FAILED
    assert by_id["t0"].reason == "planner error on segment 1 ('mf(13);'): KeyError: 'oops'", by_id["t0"].reason
    assert by_id["t1"].status is TaskStatus.DONE
    assert not core.engine.running_ids() and core.pending() == 0
