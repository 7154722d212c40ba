"""PlanClient over real rclpy: planner + simulated fleet in one process (test_planner_node.Stack), lost feedback,
lost goal responses, broken action connections, and a planner process that is killed and restarts."""

from __future__ import annotations

import math
import os
import threading

import pytest
from waiting import wait_until

rclpy = pytest.importorskip("rclpy")
from rclpy.action import ActionServer, GoalResponse  # noqa: E402
from test_planner_node import CAT, DOG, NORMAL, URGENT, Stack  # noqa: E402

from timelyllm_ros.action import PlanTask  # noqa: E402
from timelyllm_ros.domain.plans import plan_templates  # noqa: E402
from timelyllm_ros.ros import client as client_mod  # noqa: E402
from timelyllm_ros.ros.client import (  # noqa: E402
    SOURCE_ACTION,
    SOURCE_RESULTS_TOPIC,
    SOURCE_SERVICE,
    GoalOutcome,
    PlanClient,
    PlanClientError,
    PlanTimeoutError,
    send_task,
)
from timelyllm_ros.ros.spin import PooledExecutor, Spinner  # noqa: E402

pytestmark = pytest.mark.ros

S = PlanTask.Result
DRONE_TASKS = [t.task_input for t in plan_templates().values() if t.robot_type == "drone"]


@pytest.fixture(scope="module")
def stack():
    s = Stack(robots=6)
    # Count what the planner's core is asked to plan, per task id (a retry must not plan twice).
    s.submits = {}
    submit = s.planner.core.submit

    def counting_submit(spec):
        s.submits[spec.task_id] = s.submits.get(spec.task_id, 0) + 1
        return submit(spec)

    s.planner.core.submit = counting_submit
    yield s
    s.close()


_seq = iter(range(10**6))


def make_client(stack, cls=PlanClient, **kw) -> PlanClient:
    """A robot node of its own in the stack's context and executor, with a PlanClient (or subclass)."""
    node = rclpy.create_node(f"client_{next(_seq)}", context=stack.ctx)
    stack.ex.add_node(node)
    pc = cls(node, **kw)
    assert pc.wait_for_server(10)
    return pc


def goal(robot: str, task: str = CAT, tuf=NORMAL, task_id: str = "") -> PlanTask.Goal:
    return PlanTask.Goal(task_id=task_id, robot_id=robot, robot_type="drone", task=task, tuf=tuf)


def collect(pc: PlanClient, g: PlanTask.Goal, **kw):
    seen: list = []
    h = pc.send(g, on_segment=seen.append, **kw)
    return h, seen


def how(h) -> str:
    """What a failed assertion needs to say about a handle: where its segments and result came from."""
    attempts = [(a.n, a.rejoin, a.responded, a.broken) for a in h.tracking.attempt_list]
    return (f"{h!r} source={h.source} fallback={h.fallback_reason!r} segments from feedback/result/topic "
            f"{h.from_feedback}/{h.from_result}/{h.from_topic} missing={h.missing} attempts={attempts} "
            f"polls={h.polls}")


def assert_once_in_order(h, seen) -> None:
    assert h.done() and h.result is not None, (h, h.error)
    idx = [s.segment_index for s in seen]
    assert idx == list(range(len(seen))), (idx, how(h))
    assert [s.text for s in seen] == [s.text for s in h.result.segments], how(h)
    assert "".join(s.text for s in seen) == h.result.plan_text, how(h)
    assert h.complete, how(h)


class LossyFeedback(PlanClient):
    """Drops the feedback messages ``drop(segment)`` picks before they reach the helper (as rclpy does for
    a goal whose result arrives at the same time, or a reader history that overflowed)."""

    def __init__(self, *a, drop=lambda seg: False, **kw) -> None:
        super().__init__(*a, **kw)
        self.drop, self.dropped = drop, []

    def _on_feedback(self, h, msg) -> None:
        if self.drop(msg.feedback.segment):
            self.dropped.append((msg.feedback.segment.task_id, msg.feedback.segment.segment_index))
            return
        super()._on_feedback(h, msg)


def test_segments_arrive_once_in_order_with_the_result(stack):
    pc = make_client(stack)
    sent = [collect(pc, goal(f"drone_{i}", t, URGENT if "[E]" in t else NORMAL)) for i, t in
            enumerate(DRONE_TASKS[:6])]
    for h, seen in sent:
        assert h.wait(30)
        assert h.result.status == S.STATUS_SUCCEEDED, h.result.message
        assert h.source == SOURCE_ACTION and h.attempts == 1
        assert_once_in_order(h, seen)
        assert len(seen) >= 2
        assert h.task_id.startswith(h.robot_id + "-") and h.sent_wall > 0
        assert math.isfinite(h.result.response_time_from_send)  # the planner got our send stamp


@pytest.mark.parametrize("lose", ["first", "middle", "all", "all but last"])
def test_lost_feedback_is_filled_from_the_result(stack, lose):
    def drop(seg):
        if lose == "first":
            return seg.segment_index == 0
        if lose == "middle":
            return seg.segment_index == 1
        if lose == "all":
            return True
        return not seg.is_final

    pc = make_client(stack, LossyFeedback, drop=drop)
    sent = [collect(pc, goal(f"drone_{i}", t)) for i, t in enumerate(DRONE_TASKS[:4])]
    for h, seen in sent:
        assert h.wait(30)
        assert h.result.status == S.STATUS_SUCCEEDED, h.result.message
        assert_once_in_order(h, seen)
        lost = {i for tid, i in pc.dropped if tid == h.task_id}
        assert lost, "the test dropped nothing"
        assert h.from_result >= len(lost) and h.from_feedback + h.from_result == len(seen)


def test_reordered_feedback_is_delivered_in_index_order(stack):
    """Feedback that arrives out of order (a multi-threaded executor) is held back until the gap fills."""
    held: list = []

    class Reorder(PlanClient):
        def _on_feedback(self, h, msg):
            if msg.feedback.segment.segment_index == 0 and not held:
                held.append((h, msg))  # segment 0 comes after segment 1
                return
            super()._on_feedback(h, msg)
            if held and msg.feedback.segment.segment_index == 1:
                super()._on_feedback(*held[0])

    pc = make_client(stack, Reorder)
    h, seen = collect(pc, goal("drone_5", DRONE_TASKS[1]))
    assert h.wait(30) and h.ok
    assert held, "segment 0 was never held back"
    assert_once_in_order(h, seen)
    assert h.from_feedback == len(seen)  # nothing needed the result: the gap filled from feedback


class DropFirstGoalResponse(PlanClient):
    """The first goal response never reaches the helper (a lost service response)."""

    def _on_goal_response(self, h, att, fut):
        if att.n == 1:
            return
        super()._on_goal_response(h, att, fut)


def test_a_lost_goal_response_is_retried_with_the_same_task_id_and_planned_once(stack):
    pc = make_client(stack, DropFirstGoalResponse, goal_response_timeout=0.5, retry_backoff=0.05)
    h, seen = collect(pc, goal("drone_0", DRONE_TASKS[2]))
    assert h.wait(30)
    assert h.result.status == S.STATUS_SUCCEEDED, h.result.message
    assert h.attempts == 2 and pc.stats["retries"] == 1
    assert stack.submits[h.task_id] == 1, "the retry was planned a second time"
    assert_once_in_order(h, seen)
    # the robot executed every segment once
    assert wait_until(lambda: len([e for e in stack.fleet.robots["drone_0"].executed if e[0] == h.task_id])
                      == len(seen), 15)
    assert sorted(e[1] for e in stack.fleet.robots["drone_0"].executed if e[0] == h.task_id) == \
        list(range(len(seen)))


def test_the_same_request_twice_joins_one_task_and_different_content_is_rejected(stack):
    pc = make_client(stack)
    g = pc.prepare(goal("drone_1", DRONE_TASKS[0]))
    (h1, s1), (h2, s2) = collect(pc, g), collect(pc, g)
    assert h1.task_id == h2.task_id == g.task_id
    assert h1.wait(30) and h2.wait(30)
    assert h1.ok and h2.ok and h1.result.plan_text == h2.result.plan_text
    assert_once_in_order(h1, s1)
    assert_once_in_order(h2, s2)
    assert stack.submits[g.task_id] == 1
    # a finished task: the same request again gets its result at once
    h3, s3 = collect(pc, g)
    assert h3.wait(30) and h3.ok and [s.text for s in s3] == [s.text for s in s1]
    assert stack.submits[g.task_id] == 1
    # same id, different content: REJECTED (an explicit result, not a client error)
    bad = pc.prepare(goal("drone_1", DOG, URGENT, task_id=g.task_id))
    h4 = pc.send(bad)
    assert h4.wait(30) and h4.result.status == S.STATUS_REJECTED and "task_id" in h4.result.message


def test_no_goal_response_at_all_ends_explicitly_after_bounded_retries(stack):
    class Deaf(PlanClient):
        def _on_goal_response(self, h, att, fut):
            pass

    pc = make_client(stack, Deaf, goal_response_timeout=0.2, retry_backoff=0.05, max_attempts=3, poll_period=0.1)
    h = pc.send(goal("drone_2", DRONE_TASKS[3]))
    assert h.wait(30)
    # every attempt reached the planner (and joined one task); the helper never heard back, so it asked
    # /get_plan_result, which knows the task: the result comes from the fallback, the task planned once.
    assert h.attempts == 3
    assert h.result is not None and h.result.status == S.STATUS_SUCCEEDED, (h.error, h.fallback_reason)
    assert h.source in (SOURCE_SERVICE, SOURCE_RESULTS_TOPIC)
    assert stack.submits[h.task_id] == 1


def test_a_result_request_answered_unknown_falls_back_to_get_plan_result(stack):
    """As a restarted planner answers: the result request comes back STATUS_UNKNOWN."""

    class Unknown(PlanClient):
        def _on_result_response(self, h, att, fut):
            if att.rejoin:  # the re-sent goal (after the fallback) gets its real result
                return super()._on_result_response(h, att, fut)

            class _R:
                status = 0  # GoalStatus.STATUS_UNKNOWN
                result = None

            class _F:
                @staticmethod
                def result():
                    return _R()

            super()._on_result_response(h, att, _F())

    pc = make_client(stack, Unknown, poll_period=0.2)
    sent = [collect(pc, goal(f"drone_{i}", t)) for i, t in enumerate(DRONE_TASKS[4:7])]
    for h, seen in sent:
        assert h.wait(30)
        assert h.result is not None and h.result.status == S.STATUS_SUCCEEDED, h.error
        assert h.fallback_reason and "does not know" in h.fallback_reason
        # a fallback result carries no segment list: what feedback lost comes with the re-sent goal's result
        # (a /plan_results copy with segments missing triggers the re-send: it joins the finished task)
        assert h.source in (SOURCE_SERVICE, SOURCE_RESULTS_TOPIC) or (h.source == SOURCE_ACTION and h.rejoins)
        assert [s.segment_index for s in seen] == list(range(len(seen)))
        assert "".join(s.text for s in seen) == h.result.plan_text
        assert h.complete


def test_a_result_that_never_comes_is_found_by_the_stale_probe(stack):
    class NoResult(PlanClient):
        def _on_result_response(self, h, att, fut):
            pass  # the result response was lost

    pc = make_client(stack, NoResult, stale_after=0.5, result_grace=0.3)
    h, seen = collect(pc, goal("drone_3", DRONE_TASKS[5], URGENT))
    assert h.wait(30)
    assert h.result is not None and h.result.status == S.STATUS_SUCCEEDED, h.error
    assert h.source in (SOURCE_SERVICE, SOURCE_RESULTS_TOPIC) and h.complete


def test_a_client_that_lost_every_feedback_and_result_gets_the_whole_plan_from_get_plan_result(stack):
    """Nothing of the action reaches the client after the goal response: /get_plan_result's answer for the
    finished task carries every segment, so the robot still gets the whole plan, in order."""

    class Cut(PlanClient):
        def _on_feedback(self, h, msg):
            pass

        def _on_result_response(self, h, att, fut):
            pass

    pc = make_client(stack, Cut, stale_after=0.5, result_grace=0.3, poll_period=0.2)
    h, seen = collect(pc, goal("drone_2", DRONE_TASKS[1]))
    assert h.wait(30)
    assert h.result is not None and h.result.status == S.STATUS_SUCCEEDED, (h.error, h.fallback_reason)
    assert h.complete and h.from_feedback == h.from_result == 0 and h.from_service > 0, \
        (h.from_topic, h.from_service, h.source)
    assert [s.segment_index for s in seen] == list(range(len(seen)))
    assert "".join(s.text for s in seen) == h.result.plan_text
    assert stack.submits[h.task_id] == 1


def test_track_a_task_known_only_by_its_id(stack):
    """A robot that restarted knows only its task id: /get_plan_result and /plan_results answer."""
    fb, handle = stack.send("drone_4", CAT, NORMAL, task_id="tracked-cat-1")
    r = stack.result(handle)
    assert r.status == S.STATUS_SUCCEEDED
    pc = make_client(stack, poll_period=0.2)
    h = pc.track("tracked-cat-1")
    assert h.wait(30)
    assert h.result.status == S.STATUS_SUCCEEDED and h.result.plan_text == r.plan_text
    assert h.source in (SOURCE_SERVICE, SOURCE_RESULTS_TOPIC)
    # an id the planner never saw: an explicit "lost" after a few polls
    h2 = pc.track("never-sent-anywhere", timeout=30)
    assert h2.wait(30) and h2.result is None and h2.error_kind == "lost"


def test_explicit_client_failures(stack):
    node = rclpy.create_node(f"client_{next(_seq)}", context=stack.ctx)
    stack.ex.add_node(node)
    # no server: bounded wait, then an explicit error
    pc = PlanClient(node, "/no_such_plan_task", server_timeout=0.3)
    h = pc.send(goal("drone_0"))
    assert h.wait(10) and h.error_kind == GoalOutcome.NO_SERVER and h.result is None
    with pytest.raises(PlanTimeoutError):
        h.result_or_raise()
    # a server that refuses the goal: "not accepted" is a failure, never retried
    ActionServer(node, PlanTask, "/refusing_plan_task", execute_callback=lambda gh: PlanTask.Result(),
                 goal_callback=lambda g: GoalResponse.REJECT)
    pc2 = PlanClient(node, "/refusing_plan_task")
    assert pc2.wait_for_server(10)
    h = pc2.send(goal("drone_0"))
    assert h.wait(10) and h.error_kind == GoalOutcome.NOT_ACCEPTED and h.attempts == 1
    with pytest.raises(PlanClientError) as e:
        h.result_or_raise()
    assert not isinstance(e.value, TimeoutError)


def test_hundreds_of_goals_on_one_node(stack):
    pc = make_client(stack)
    done = threading.Event()
    results = []

    def on_done(h):
        results.append(h)
        if len(results) == 200:
            done.set()

    seen: dict[str, list] = {}
    handles = []
    for i in range(200):
        g = pc.prepare(goal(f"drone_{i % 6}", DRONE_TASKS[i % len(DRONE_TASKS)], URGENT if i % 3 == 0 else NORMAL))
        seen[g.task_id] = []
        handles.append(pc.send(g, on_segment=seen[g.task_id].append, on_done=on_done))
    assert done.wait(120), f"{len(results)} of 200 done"
    for h in handles:
        assert h.result is not None, h.error
        assert h.result.status == S.STATUS_SUCCEEDED, h.result.message
        assert_once_in_order(h, seen[h.task_id])
    assert not pc.open_handles()
    # Every goal and result future the action client registered was completed and dropped (the removal runs
    # as an executor task after the result): rclpy 9.1.2's own send_goal_async leaves a never-completed
    # future behind per goal (see SafeActionClient).
    # (rclpy's own lists: it offers no public view of the futures an action client holds)
    action = pc.action_client
    assert wait_until(lambda: not action._futures and not action._pending_goal_requests, 60), \
        (len(action._futures), [f.done() for f in action._futures][:10])


def test_send_task_wrapper_and_blocking_plan(stack):
    """The old helper (spins the node itself) over a client node that is in no executor."""
    node = rclpy.create_node("script_client", context=stack.ctx)  # not in any executor: plan() spins it
    from rclpy.action import ActionClient

    fbs = []
    r = send_task(node, ActionClient(node, PlanTask, "/plan_task"), goal("drone_1", DOG, URGENT), timeout=30,
                  on_feedback=fbs.append)
    assert r.status == S.STATUS_SUCCEEDED
    assert [f.segment.segment_index for f in fbs] == list(range(len(r.segments)))
    pc = PlanClient(node)
    segs = []
    r2 = pc.plan(goal("drone_0", CAT), timeout=30, on_segment=segs.append)
    assert r2.status == S.STATUS_SUCCEEDED and "".join(x.text for x in segs) == r2.plan_text
    pc.destroy()
    node.destroy_node()


def test_plan_client_cli_main(stack):
    """The CLI in the default context, against the module's planner (one planner per domain: a second one
    would answer the same goals)."""
    assert client_mod.main(["plan_client", "--robot-id", "drone_1", "--task", CAT, "--timeout", "30"]) == 0


def test_plan_client_cli_refuses_a_task_with_nul_with_a_clear_message_and_sends_nothing(stack, capsys):
    """Issue 39: rclpy cuts a string at its first NUL, so the planner would plan the text before it without a word.
    plan_client (and `timelyllm plan`, which runs it) refuses it, naming the field and the position."""
    rc = client_mod.main(["plan_client", "--robot-id", "drone_1", "--task", "find the cat \x00now", "--task-id",
                          "nul-cli", "--timeout", "30"])
    err = capsys.readouterr().err
    assert rc == 2 and "error: task: control character U+0000 (NULL) at position 13" in err, (rc, err)
    assert "nul-cli" not in stack.submits and stack.planner.core.task_status("nul-cli") is None


# -- a planner process that is killed and restarts (journal) ----------------------------------------------------
def test_planner_killed_mid_task_restarts_and_the_client_still_gets_the_result(tmp_path):
    procs_mod = pytest.importorskip("procs")

    from timelyllm_ros.ros.sim_fleet_node import SimFleetNode

    state = tmp_path / "state"
    # pud-shed-seg: generation paced by the robot (suspended at every boundary), so the planner dies with the plan
    # half written; the default pud-shed writes a plan with nothing waiting to its end at once, and the restarted
    # planner then only hands over a finished result
    planner_args = ["-p", "engine_config:=engine_sim.yaml", "-p", "warm_up:=false", "-p", f"state_dir:={state}",
                    "-p", "policy:=pud-shed-seg"]
    # A domain of its own: the module's in-process planner must not answer this test's goals.
    domain = (int(os.environ.get("ROS_DOMAIN_ID", "0")) + 17) % 100 + 1
    procs = procs_mod.Procs(tmp_path / "logs", env={**os.environ, "ROS_DOMAIN_ID": str(domain)})
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=domain)
    ex = PooledExecutor(num_threads=8, context=ctx)
    from rclpy.parameter import Parameter

    fleet = SimFleetNode(context=ctx, parameter_overrides=[Parameter("robots", value=["drone_0", "drone_1"]),
                                                           Parameter("time_scale", value=1.0)])
    node = rclpy.create_node("restart_client", context=ctx)
    ex.add_node(fleet)
    ex.add_node(node)
    th = Spinner(ex)
    th.start()
    try:
        procs.python("planner", "timelyllm_ros.ros.planner_node", *planner_args, ready="planner ready")
        pc = PlanClient(node, poll_period=0.3, server_lost_grace=0.5, stale_after=3.0)
        assert pc.wait_for_server(30)
        # a long plan, executed slowly: the planner dies between segments
        long_task = DRONE_TASKS[3]  # md(30); ?iv('toy')==True{ g('toy') };
        seen: list = []
        h = pc.send(goal("drone_0", long_task), on_segment=seen.append, timeout=90)
        assert wait_until(lambda: len(seen) >= 1, 30), procs.report()
        procs.all[0].kill()
        procs.python("planner", "timelyllm_ros.ros.planner_node", *planner_args, ready="planner ready")
        assert h.wait(90), (h, h.outcome, procs.report())
        assert h.result is not None, (h.error, procs.report())
        assert h.result.status == S.STATUS_SUCCEEDED, (h.result.message, procs.report())
        assert h.source in (SOURCE_SERVICE, SOURCE_RESULTS_TOPIC, SOURCE_ACTION)
        assert h.fallback_reason, ("the broken action connection went unnoticed", h.source, h.segments)
        # the restarted planner knew the task (journal): the client re-sent the same goal, joined the task and
        # got the whole segment list with its result (or saw the rest on /plan_segments): each once, in order
        attempts = [(a.n, a.rejoin, a.responded, a.broken, a.goal_handle is not None and a.goal_handle.accepted,
                     a.result_future is not None and a.result_future.done()) for a in h.tracking.attempt_list]
        assert h.rejoins >= 1 or h.from_topic > 0, (h.fallback_reason, h.source, attempts)
        assert [x.segment_index for x in seen] == list(range(len(seen)))
        assert h.complete and "".join(x.text for x in seen) == h.result.plan_text, (h.source, attempts, seen)
        print(f"restart: fallback {h.fallback_reason!r}, source {h.source}, rejoins {h.rejoins}, "
              f"segments from feedback/result/topic {h.from_feedback}/{h.from_result}/{h.from_topic}")
        # the robot executed each segment once, in order
        done = [e[1] for e in fleet.robots["drone_0"].executed if e[0] == h.task_id]
        assert done == sorted(set(done)), done
        pc.destroy()
    finally:
        procs.close()
        ex.shutdown(timeout_sec=5)
        fleet.destroy_node()
        node.destroy_node()
        rclpy.shutdown(context=ctx)
        th.join(timeout=5)

