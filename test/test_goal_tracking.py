"""The goal state machine of PlanClient (ros/goal_tracking.py) without ROS: a fake client records the I/O the
tracker asks for, plain objects stand in for segments, goal handles and results. And the rule that keeps it the
one state machine: no other module changes a goal's tracking state or its report."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from timelyllm_ros.domain.types import STATUS_CODE, TERMINAL_STATUSES, TaskStatus
from timelyllm_ros.ros.goal_tracking import (
    SOURCE_ACTION,
    SOURCE_RESULTS_TOPIC,
    SOURCE_SERVICE,
    Attempt,
    GoalIO,
    GoalOutcome,
    GoalReport,
    GoalTracker,
)

ROOT = Path(__file__).resolve().parents[1]
Out = GoalOutcome
DONE_CODE, INVALID_CODE = STATUS_CODE[TaskStatus.DONE], STATUS_CODE[TaskStatus.INVALID]


class Future:
    def __init__(self) -> None:
        self.finished = False

    def done(self) -> bool:
        return self.finished


class GoalHandle:
    def __init__(self, accepted: bool = True) -> None:
        self.accepted, self.cancels = accepted, 0

    def cancel_goal_async(self) -> None:
        self.cancels += 1


class FakeClient:
    """The GoalClient a tracker talks to: PlanClient's defaults, a server whose state the test sets, and a log of
    every request."""

    def __init__(self, **kw) -> None:
        self.server_timeout, self.goal_response_timeout, self.max_attempts = 10.0, 5.0, 4
        self.retry_backoff, self.max_backoff, self.poll_period, self.poll_timeout = 0.5, 8.0, 1.0, 3.0
        self.stale_after, self.result_grace, self.server_lost_grace, self.unknown_limit = 10.0, 2.0, 2.0, 3
        self.cancel_on_timeout = True
        self.__dict__.update(kw)
        self.server = SimpleNamespace(ready=True, epoch=1)
        self.stats: dict[str, int] = {}
        self.goals: list[Attempt] = []
        self.polls: list[Future] = []
        self.dropped: list[Future] = []
        self.unregistered: list = []
        self.logs: list[tuple[str, str]] = []
        self.subs = 0
        self.service_ready = True
        self.send_error: Exception | None = None
        self.io = GoalIO(count=self._count, send_goal=self._send_goal, get_result=self._get_result,
                         send_poll=self._send_poll, drop_poll=self._drop_poll, fallback_subs=self._ensure_fallback_subs,
                         unregister=self._unregister, log=self._log,
                         to_result=lambda msg: Result(msg.status, [], msg.message))

    def _count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    def _send_goal(self, h, att: Attempt):
        if self.send_error is not None:
            raise self.send_error
        self.goals.append(att)
        return Future()

    def _get_result(self, h, att, gh):
        return Future()

    def _send_poll(self, h):
        if not self.service_ready:
            return None
        self.polls.append(Future())
        return self.polls[-1]

    def _drop_poll(self, fut) -> None:
        self.dropped.append(fut)

    def _ensure_fallback_subs(self) -> None:
        self.subs += 1

    def _unregister(self, h) -> None:
        self.unregistered.append(h)

    def _log(self, level: str, message: str) -> None:
        self.logs.append((level, message))


def Seg(i: int, final: bool = False):
    return SimpleNamespace(segment_index=i, is_final=final, text=f"s{i} ")


def Result(status: int = DONE_CODE, segments=(), message: str = ""):
    return SimpleNamespace(status=status, segments=list(segments), message=message)


def PlanResultMsg(n: int, status: int = DONE_CODE):
    return SimpleNamespace(status=status, num_segments=n, message="")


def make(robot_id: str = "drone_0", timeout: float = 60.0, **kw):
    c = FakeClient(**kw)
    seen, ended = [], []
    r = GoalReport("t1", robot_id, seen.append, ended.append, timeout)
    return GoalTracker(r, c), r, c, seen, ended


def accepted(t: GoalTracker, c: FakeClient, now: float | None = None) -> tuple[Attempt, GoalHandle]:
    t.start(t.report.t_created if now is None else now)
    att, gh = c.goals[-1], GoalHandle()
    t.goal_response(att, gh)
    return att, gh


# -- the vocabulary ------------------------------------------------------------------------------------------
def test_one_outcome_vocabulary():
    """Every terminal TaskStatus is an outcome of the same value; open phases and client failures are apart."""
    for st in TERMINAL_STATUSES:
        assert Out(st.value) == st and Out.of_code(STATUS_CODE[st]).value == st.value
        assert not Out(st.value).open and not Out(st.value).client_error
    assert Out.of_code(999) is Out.FAILED
    assert {o for o in Out if o.open} == {Out.WAIT_SERVER, Out.SENDING, Out.ACCEPTED, Out.FALLBACK}
    assert {o for o in Out if o.timed_out} == {Out.NO_SERVER, Out.NO_RESPONSE, Out.TIMEOUT}
    assert {o for o in Out if o.client_error} == {Out.NO_SERVER, Out.NOT_ACCEPTED, Out.NO_RESPONSE, Out.LOST,
                                                  Out.TIMEOUT, Out.CLOSED}
    assert len(Out) == 4 + len(TERMINAL_STATUSES) + 6
    assert Out.NOT_ACCEPTED == "not_accepted" and f"{Out.SENDING}" == "sending"  # strings for bench/ and logs


# -- the action path ---------------------------------------------------------------------------------------
def test_sent_accepted_feedback_in_order_then_the_result_fills_the_rest():
    t, r, c, seen, ended = make()
    assert t.outcome is Out.WAIT_SERVER
    t.start(r.t_created)
    assert t.outcome is Out.SENDING and r.attempts == 1 and c.stats == {"attempts": 1}
    att, gh = c.goals[0], GoalHandle()
    t.goal_response(att, gh)
    assert t.outcome is Out.ACCEPTED and r.accepted and r.responses == 1 and att.responded
    assert att.result_future is not None and t.response_deadline == math.inf and t.epoch == 1
    t.offer(Seg(1), "feedback")  # held: 0 is missing
    assert seen == [] and 1 in t.held
    t.offer(Seg(0), "feedback")
    t.offer(Seg(0), "feedback")  # twice: once only
    assert [s.segment_index for s in seen] == [0, 1] and r.from_feedback == 2 and r.t_first_segment is not None
    t.action_result(att, Result(DONE_CODE, [Seg(0), Seg(1), Seg(2), Seg(3, True)]))
    assert [s.segment_index for s in seen] == [0, 1, 2, 3] and r.from_result == 2
    assert t.outcome is Out.DONE and r.source == SOURCE_ACTION and r.complete and r.error_kind is None
    assert ended == [r] and c.unregistered == [r] and t.event.is_set() and r.t_done is not None
    # a done goal takes nothing more
    t.offer(Seg(4), "feedback")
    t.fail(Out.TIMEOUT, "late")
    assert len(seen) == 4 and t.outcome is Out.DONE and r.error is None and ended == [r]


def test_not_accepted_is_a_failure_and_a_result_code_this_build_does_not_know_reads_failed():
    t, r, c, _, ended = make()
    t.start(r.t_created)
    t.goal_response(c.goals[0], GoalHandle(accepted=False))
    assert t.outcome is Out.NOT_ACCEPTED and r.error_kind is Out.NOT_ACCEPTED and ended == [r] and r.result is None
    t2, r2, c2, _, _ = make()
    att, _ = accepted(t2, c2)
    t2.action_result(att, Result(99))
    assert t2.outcome is Out.FAILED and r2.result.status == 99


def test_a_goal_that_could_not_be_sent_fails_no_response():
    t, r, c, _, _ = make()
    c.send_error = RuntimeError("context shut down")
    t.start(r.t_created)
    assert t.outcome is Out.NO_RESPONSE and "could not send" in r.error and t.attempt_list[0].broken


def test_no_server_within_server_timeout():
    t, r, c, _, _ = make()
    t0 = r.t_created
    t.step(t0 + 1, ready=False, down_for=1)
    assert t.outcome is Out.WAIT_SERVER
    t.step(t0 + c.server_timeout, ready=False, down_for=10)
    assert t.outcome is Out.NO_SERVER and r.attempts == 0


def test_unanswered_sends_are_retried_with_backoff_then_the_fallback_polls_until_unknown_ends_it():
    t, r, c, _, _ = make(max_attempts=3, goal_response_timeout=1.0)
    t0 = r.t_created
    t.start(t0)
    t.step(t0 + 1.0, True, 0)  # no response: wait retry_backoff (0.5)
    assert t.next_send_at == pytest.approx(t0 + 1.5) and r.attempts == 1
    t.step(t0 + 1.5, True, 0)
    assert r.attempts == 2 and c.stats["retries"] == 1 and t.outcome is Out.SENDING
    t.step(t0 + 2.5, True, 0)  # backoff doubles
    assert t.next_send_at == pytest.approx(t0 + 3.5)
    t.step(t0 + 3.5, True, 0)
    assert r.attempts == 3
    t.step(t0 + 4.5, True, 0)  # max_attempts: the fallback, which polls from the next tick on
    assert t.outcome is Out.FALLBACK and r.fallback_reason == "no goal response after 3 attempts" and not c.polls
    t.step(t0 + 4.6, True, 0)
    assert c.subs == 1 and c.stats["fallbacks"] == 1 and len(c.polls) == 1 and r.polls == 1
    unknown = SimpleNamespace(segments=[])
    for k in range(c.unknown_limit):
        t.poll_answer(c.polls[-1], unknown, "unknown")
        assert t.poll_future is None
        if k < c.unknown_limit - 1:
            assert t.outcome is Out.FALLBACK
            t.step(t.poll_due, True, 0)
    assert t.outcome is Out.NO_RESPONSE and r.error_kind is Out.NO_RESPONSE


def test_timeout_cancels_the_accepted_goal():
    t, r, c, _, ended = make(timeout=5.0)
    _, gh = accepted(t, c)
    t.step(t.deadline, True, 0)
    assert t.outcome is Out.TIMEOUT and gh.cancels == 1 and ended == [r] and "phase accepted" in r.error


def test_cancel_reaches_accepted_goals_and_goals_accepted_later():
    t, r, c, _, _ = make()
    _, gh = accepted(t, c)
    t.cancel()
    assert t.cancel_requested and gh.cancels == 1
    t2, _, c2, _, _ = make()
    t2.start(t2.report.t_created)
    t2.cancel()
    gh2 = GoalHandle()
    t2.goal_response(c2.goals[0], gh2)
    assert gh2.cancels == 1


# -- the fallback --------------------------------------------------------------------------------------------
def test_a_new_server_instance_falls_back_and_get_plan_result_brings_every_segment():
    t, r, c, seen, _ = make()
    accepted(t, c)
    t.offer(Seg(0), "feedback")
    c.server.epoch = 2  # the planner restarted
    now = r.t_created + 1
    t.step(now, True, 0)
    assert t.outcome is Out.FALLBACK and r.fallback_reason == "the action server went away" and len(c.polls) == 1
    t.poll_answer(c.polls[0], SimpleNamespace(segments=[Seg(0), Seg(1), Seg(2, True)], result=PlanResultMsg(3)),
                  "done")
    assert [s.segment_index for s in seen] == [0, 1, 2] and r.from_service == 2
    assert t.outcome is Out.DONE and r.source == SOURCE_SERVICE and r.complete and t.candidate_n == 3
    assert [s.segment_index for s in r.result.segments] == [0, 1, 2]


def test_an_active_task_in_the_fallback_is_rejoined_once_per_server_instance():
    t, r, c, _, _ = make()
    att, _ = accepted(t, c)
    t.action_result(att, None, "the action server does not know the goal (restarted?)")
    assert t.outcome is Out.FALLBACK and att.broken and "does not know" in r.fallback_reason
    active = SimpleNamespace(segments=[])
    t.poll_answer(c.polls[-1] if c.polls else None, active, "active")
    assert r.rejoins == 1 and c.goals[-1].rejoin and t.rejoined_epoch == 1 and c.stats["rejoins"] == 1
    t.poll_answer(None, active, "active")  # the rejoin is pending: nothing re-sent
    assert r.rejoins == 1
    rejoin, gh = c.goals[-1], GoalHandle()
    t.goal_response(rejoin, gh)
    assert t.outcome is Out.FALLBACK and r.attempts == 1  # a rejoin is no new attempt and no phase change
    rejoin.result_future.finished = True
    t.poll_answer(None, active, "active")  # answered in this epoch: not again
    assert r.rejoins == 1
    # the rejoin's refusal says nothing of the task; its real result ends the goal
    t.action_result(rejoin, Result(INVALID_CODE, message="busy"))
    assert t.outcome is Out.FALLBACK and rejoin.broken and c.logs[-1][0] == "warning"
    t2, r2, c2, _, _ = make()
    att2, _ = accepted(t2, c2)
    t2.action_result(att2, None)
    t2.poll_answer(None, active, "active")
    t2.action_result(c2.goals[-1], Result(DONE_CODE, [Seg(0), Seg(1, True)]))
    assert t2.outcome is Out.DONE and r2.source == SOURCE_ACTION and r2.complete


def test_a_published_result_waits_for_the_action_result_then_falls_back_when_segments_are_missing():
    t, r, c, seen, _ = make(result_grace=2.0, goal_response_timeout=1.0)
    accepted(t, c)
    t.offer(Seg(0), "feedback")
    t.offer_result(PlanResultMsg(3), SOURCE_RESULTS_TOPIC)
    assert t.outcome is Out.ACCEPTED and t.candidate is not None
    _, _, until = t.candidate
    t.step(until, True, 0)  # the action result never came, segments missing: fallback (and poll)
    assert t.outcome is Out.FALLBACK and "did not come" in r.fallback_reason
    t.topic_segment(Seg(1))
    t.topic_segment(Seg(2, True))
    assert [s.segment_index for s in seen] == [0, 1, 2] and r.from_topic == 2
    t.step(until + 0.01, True, 0)  # nothing missing now: take it
    assert t.outcome is Out.DONE and r.source == SOURCE_RESULTS_TOPIC and r.complete


def test_a_result_with_a_gap_leaves_the_held_segments_undelivered():
    t, r, c, seen, _ = make()
    att, _ = accepted(t, c)
    t.offer(Seg(0), "feedback")
    t.offer(Seg(2), "feedback")
    t.fail(Out.CLOSED, "destroyed")
    assert [s.segment_index for s in seen] == [0] and r.missing == [1]
    assert [s.segment_index for s in r.undelivered] == [2] and r.error_kind is Out.CLOSED and not r.complete


def test_follow_by_id_starts_at_the_first_index_seen_and_a_stale_poll_is_dropped():
    t, r, c, seen, _ = make(robot_id="")
    t.follow_by_id(r.t_created)
    assert t.outcome is Out.FALLBACK and t.next == -1 and r.fallback_reason == "tracking a task by id"
    t.step(r.t_created, True, 0)
    first = c.polls[0]
    t.step(r.t_created + c.poll_timeout, True, 0)  # no answer within poll_timeout: dropped, asked again
    assert c.dropped == [first] and len(c.polls) == 2
    t.topic_segment(Seg(3))
    t.topic_segment(Seg(4, True))
    assert [s.segment_index for s in seen] == [3, 4]
    t.poll_answer(c.polls[-1], SimpleNamespace(segments=[], result=PlanResultMsg(5)), "done")
    assert t.outcome is Out.FALLBACK  # 2 of 5 segments seen: the result waits result_grace for better
    t.step(t.candidate[2], True, 0)
    assert t.outcome is Out.DONE and r.source == SOURCE_SERVICE and r.missing == [] and not r.complete
    c.service_ready = False
    t3, r3, c3, _, _ = make()
    c3.service_ready = False
    t3.follow_by_id(r3.t_created)
    t3.step(r3.t_created, True, 0)
    assert r3.polls == 0 and t3.poll_future is None


# -- one owner ------------------------------------------------------------------------------------------------
TRACKER_METHODS = {n for n, v in vars(GoalTracker).items() if callable(v) and not n.startswith("_")}
# what a goal's tracking and report hold: only goal_tracking.py writes them (task_id/robot_id: also a goal's fields)
OWNED = (set(GoalTracker.__slots__) | set(Attempt.__slots__)
         | set(vars(GoalReport("t", "r", None, None, 1.0))) - {"task_id", "robot_id"})
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "setdefault", "add",
            "discard", "set"}


def tracking_offenders(source: str, name: str) -> list[str]:
    """Where ``source`` changes a goal's tracking state or report, or reaches into ``.tracking`` for anything but
    the tracker's events (and reading ``outcome``, ``event.is_set()``, ``event.wait()``)."""
    tree = ast.parse(source)
    parent = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    bad = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for tgt in targets:
            for sub in ast.walk(tgt):
                on_self = isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self"
                if isinstance(sub, ast.Attribute) and (sub.attr in OWNED or sub.attr == "tracking") and not (
                        on_self and sub.attr in ("tracking", "client")):  # PlanHandle's own links
                    bad.append(f"{name}:{node.lineno}: assigns .{sub.attr}")
        if isinstance(node, ast.Attribute) and node.attr in MUTATORS and isinstance(node.value, ast.Attribute) \
                and node.value.attr in OWNED and node.value.attr != "event":
            bad.append(f"{name}:{node.lineno}: .{node.value.attr}.{node.attr}()")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "tracking":
            up = parent.get(node)
            if node.attr in TRACKER_METHODS and isinstance(up, ast.Call) and up.func is node:
                continue
            if node.attr == "outcome" and isinstance(node.ctx, ast.Load) and not isinstance(up, ast.Attribute):
                continue
            if node.attr == "event" and isinstance(up, ast.Attribute) and up.attr in ("is_set", "wait"):
                continue
            bad.append(f"{name}:{node.lineno}: .tracking.{node.attr}")
    return bad


def test_the_offender_check_sees_direct_changes():
    src = ("h.tracking.outcome = 1\nh.attempts += 1\nh.tracking.held.pop(0)\nh.segments.append(s)\n"
           "x = h.tracking.deadline\nh.tracking.event.set()\natt.broken = True\n")
    bad = tracking_offenders(src, "x")
    assert {int(b.split(":")[1]) for b in bad} == set(range(1, 8)), bad
    assert tracking_offenders("h.tracking.step(1, True, 0)\nh.tracking.outcome\ng.task_id = 'x'\n", "x") == []


def test_only_goal_tracking_changes_a_goals_state():
    """PlanClient, PlanHandle and every other module that reaches a handle's ``tracking`` call the tracker's
    events; none sets its fields or its report's (test_client.py reads them for its messages, and is not checked)."""
    ros = ROOT / "timelyllm_ros" / "ros"
    files = {ros / "client.py", ros / "plan_handle.py"} | {
        p for d in ("timelyllm_ros", "bench") for p in (ROOT / d).rglob("*.py") if ".tracking" in p.read_text()}
    files.discard(ros / "goal_tracking.py")
    bad = []
    for py in sorted(files):
        bad += tracking_offenders(py.read_text(), str(py.relative_to(ROOT)))
    assert not bad, bad
