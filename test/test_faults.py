"""Fault injection across real processes: the delivery contract (topics.py) and journal recovery, end to end.

The planner (simulated engine, wall-clock) and the simulated fleets run as child processes (test/procs.py);
this process plays the clients: PlanTask goals, /plan_results, /get_plan_result, and the robots' own
reports (/segment_done, /segment_acks) and the segments as sent (/plan_segments and /<robot>/plan_segments).
Faults: SIGKILL of the planner (restart from its journal), SIGKILL of a fleet process, a fleet that
starts after the segments were produced, 5 % packet loss on a veth link into a network namespace (root
and nftables; the robots' reports then reach this process through an observer process, see
procs.observe), and a clean SIGINT stop with goals open.

What is asserted is what happened -- results, their number, the order and count of executed segments,
the texts -- never how fast; every wait is bounded.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import procs as procs_mod
import pytest
import yaml
from procs import OBSERVER_READY, Procs
from waiting import wait_until

rclpy = pytest.importorskip("rclpy")

from timelyllm_ros.action import PlanTask  # noqa: E402
from timelyllm_ros.domain.plans import plan_templates  # noqa: E402
from timelyllm_ros.msg import PlanResult, PlanSegment, SegmentAck, SegmentDone, TimeUtility  # noqa: E402
from timelyllm_ros.paths import config_dir  # noqa: E402
from timelyllm_ros.ros import topics  # noqa: E402
from timelyllm_ros.ros.actions import SafeActionClient  # noqa: E402
from timelyllm_ros.ros.spin import PooledExecutor, Spinner  # noqa: E402
from timelyllm_ros.srv import GetPlanResult  # noqa: E402

pytestmark = pytest.mark.ros

PLANNER = "timelyllm_ros.ros.planner_node"
FLEET = "timelyllm_ros.ros.sim_fleet_node"
PLANNER_READY = r"planner ready"
FLEET_READY = r"simulated drone robots"
# A generous utility function: no task is refused as overdue while processes restart (cutoff 160 s).
LENIENT = TimeUtility(level="", alpha=-0.01, beta=1.0, ert=60.0)
SUCCEEDED = PlanTask.Result.STATUS_SUCCEEDED
ROBOT_FAILED = PlanTask.Result.STATUS_ROBOT_FAILED
STATUS = {v: k.removeprefix("STATUS_") for k, v in vars(PlanTask.Result).items() if k.startswith("STATUS_")}
DRONE_TASKS = [t.task_input for t in sorted(plan_templates().values(), key=lambda t: t.trace_id)
               if t.robot_type == "drone"]
MULTI = [t.task_input for t in plan_templates().values() if t.name == "keys_or_wallet"][0]  # 5 segments


# -- processes -----------------------------------------------------------------------------------------
def _child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)  # ROS_DOMAIN_ID and ROS_AUTOMATIC_DISCOVERY_RANGE from conftest
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def engine_yaml(tmp_path: Path, time_scale: float) -> str:
    """config/engine_sim.yaml with another wall-clock time scale."""
    cfg = yaml.safe_load((config_dir() / "engine_sim.yaml").read_text())
    cfg["time_scale"] = float(time_scale)
    path = tmp_path / f"engine_sim_x{time_scale:g}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def start_planner(procs: Procs, *, engine: str, state_dir: Path | None = None, env=None, name: str = "planner",
                  **params) -> object:
    args = ["-p", f"engine_config:={engine}", "-p", "warm_up:=false"]
    if state_dir is not None:
        args += ["-p", f"state_dir:={state_dir}"]
    for k, v in params.items():
        args += ["-p", f"{k}:={v}"]
    return procs.python(name, PLANNER, *args, env=env, ready=PLANNER_READY, timeout=90)


def start_fleet(procs: Procs, robots: list[str], *, time_scale: float = 0.3, prefix=(), env=None,
                name: str = "fleet", wait: bool = True):
    # planner_node '': the fleet also runs the probes this process sends to learn that its reports come back
    args = ["-p", f"robots:=[{', '.join(robots)}]", "-p", f"time_scale:={time_scale}", "-p", "planner_node:=''"]
    return procs.python(name, FLEET, *args, prefix=prefix, env=env, ready=FLEET_READY if wait else None,
                        timeout=90)


@pytest.fixture(autouse=True)
def own_domain(monkeypatch):
    """A ROS domain of this test's own, outside the 1..100 that test/conftest.py draws from: other test
    runs on this machine (LOCALHOST discovery still reaches every process of the host) must not ack or
    run these segments, nor these robots run theirs. 215..232 are valid Linux domain ids (ports below
    65536) outside the ephemeral port range."""
    monkeypatch.setenv("ROS_DOMAIN_ID", str(random.SystemRandom().randint(215, 232)))


@pytest.fixture()
def procs(tmp_path):
    p = Procs(tmp_path / "logs", env=_child_env())
    try:
        yield p
    finally:
        p.close()
        print(p.report())  # shown by pytest when the test failed


# -- the clients ----------------------------------------------------------------------------------------
class Clients:
    """One rclpy context in this process: PlanTask action client, result topic and service, robot reports."""

    def __init__(self, robots: list[str] = (), *, own_reports: bool = True) -> None:
        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx)
        self.node = rclpy.create_node("fault_clients", context=self.ctx)
        self.action = SafeActionClient(self.node, PlanTask, topics.PLAN_TASK_ACTION)
        self.get_result = self.node.create_client(GetPlanResult, topics.GET_PLAN_RESULT_SERVICE)
        self.lock = threading.Lock()
        self.results: list[PlanResult] = []
        self.done: list[SegmentDone] = []
        self.acks: list[SegmentAck] = []
        self.texts: dict[tuple[str, int], set[str]] = defaultdict(set)  # every text seen for (task, index)
        self.copies: dict[tuple[str, int], int] = defaultdict(int)  # copies seen on the robots' topics
        self.feedback: dict[str, list[PlanSegment]] = defaultdict(list)
        self._probe_pubs: dict[str, object] = {}
        self._probe_ids = itertools.count()
        n = self.node
        self.subs = {
            "results": n.create_subscription(PlanResult, topics.PLAN_RESULTS, self._on(self.results),
                                             topics.RESULTS_QOS),
            "segments": n.create_subscription(PlanSegment, topics.ALL_SEGMENTS, self._segment, topics.REPORTS),
        }
        if own_reports:  # else: fed by an observer process (observer_line)
            self.subs["done"] = n.create_subscription(SegmentDone, topics.SEGMENT_DONE, self._on(self.done),
                                                      topics.REPORTS)
            self.subs["acks"] = n.create_subscription(SegmentAck, topics.SEGMENT_ACKS, self._on(self.acks),
                                                      topics.REPORTS)
        for r in robots:
            self.subs[r] = n.create_subscription(PlanSegment, topics.segment_topic(r),
                                                 lambda m: self._segment(m, robot_copy=True), topics.RELIABLE)
        self.ex = PooledExecutor(num_threads=4, context=self.ctx)
        self.ex.add_node(self.node)
        self.thread = Spinner(self.ex)
        self.thread.start()

    def _on(self, sink: list):
        def cb(msg):
            with self.lock:
                sink.append(msg)
        return cb

    def observer_line(self, line: str) -> None:
        """One line of ``procs.py observe``: a report or an acknowledgement as the observer received it."""
        kind, _, rest = line.partition(" ")
        if kind in ("done", "ack") and rest.startswith("{"):
            rec = SimpleNamespace(**json.loads(rest))
            with self.lock:
                (self.done if kind == "done" else self.acks).append(rec)

    def _segment(self, msg: PlanSegment, robot_copy: bool = False) -> None:
        with self.lock:
            if not topics.is_end_marker(msg.text, msg.is_final):
                self.texts[(msg.task_id, msg.segment_index)].add(msg.text)
            if robot_copy:
                self.copies[(msg.task_id, msg.segment_index)] += 1

    def close(self) -> None:
        self.ex.shutdown(timeout_sec=5)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.ctx)

    # -- matching ---------------------------------------------------------------------------------------
    def wait_publishers(self, sub: str, n: int = 1, timeout: float = 30.0) -> None:
        assert wait_until(lambda: self.subs[sub].get_publisher_count() >= n, timeout), \
            f"no {n} publisher(s) matched on {self.subs[sub].topic_name}"

    def wait_fleet(self, n_processes: int = 1, timeout: float = 30.0) -> None:
        """The fleet processes' reports reach this process (publishers matched)."""
        self.wait_publishers("done", n_processes, timeout)
        self.wait_publishers("acks", n_processes, timeout)

    def probe_fleet(self, robot: str, timeout: float = 45.0) -> None:
        """Wait until the fleet serving ``robot`` delivers its reports to this process: publish a segment that
        does not parse for a task of our own until its refusal (SegmentDone, success false) comes back. A
        report published before the executor's writer has matched a reader is lost to that reader (VOLATILE),
        and matching is not symmetric: our subscription seeing the writer does not mean the writer sees us."""
        pub = self._probe_pubs.get(robot)
        if pub is None:
            pub = self._probe_pubs[robot] = self.node.create_publisher(PlanSegment, topics.segment_topic(robot),
                                                                       topics.RELIABLE)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            tid = f"probe-{robot}-{next(self._probe_ids)}"
            pub.publish(PlanSegment(task_id=tid, robot_id=robot, segment_index=0, text="probe(", is_final=True))
            if wait_until(lambda tid=tid: bool(self.reports_of(tid)), 1.0):
                return
        raise AssertionError(f"the fleet serving {robot} never reported back to this process")

    def wait_planner(self, timeout: float = 30.0) -> None:
        assert self.action.wait_for_server(timeout_sec=timeout), "no /plan_task action server"
        assert self.get_result.wait_for_service(timeout_sec=timeout), "no /get_plan_result service"

    # -- goals ------------------------------------------------------------------------------------------
    def send(self, task_id: str, robot: str, task: str, tuf: TimeUtility = LENIENT):
        goal = PlanTask.Goal(task_id=task_id, robot_id=robot, robot_type="drone", task=task, tuf=tuf)
        fut = self.action.send_goal_async(goal, feedback_callback=lambda m: self._feedback(task_id, m))
        assert wait_until(fut.done, 30), f"{task_id}: no goal response"
        handle = fut.result()
        assert handle.accepted, f"{task_id}: goal not accepted"
        return handle

    def _feedback(self, task_id: str, m) -> None:
        with self.lock:
            self.feedback[task_id].append(m.feedback.segment)
            seg = m.feedback.segment
            self.texts[(seg.task_id, seg.segment_index)].add(seg.text)

    def action_result(self, handle, timeout: float = 60.0):
        fut = handle.get_result_async()
        assert wait_until(fut.done, timeout), "action result never came"
        return fut.result().result

    def query(self, task_id: str, timeout: float = 5.0, tries: int = 6) -> GetPlanResult.Response | None:
        """/get_plan_result; None if unanswered. A request sent while the service's reader has not matched
        ours yet (a restarted planner: the graph still lists the dead one until its lease expires) is lost
        without an answer, so a bounded number of tries."""
        for _ in range(tries):
            fut = self.get_result.call_async(GetPlanResult.Request(task_id=task_id))
            if wait_until(fut.done, timeout):
                return fut.result()
            self.get_result.remove_pending_request(fut)
        return None

    # -- what happened ----------------------------------------------------------------------------------
    def results_of(self, task_id: str) -> list[PlanResult]:
        with self.lock:
            return [r for r in self.results if r.task_id == task_id]

    def reports_of(self, task_id: str) -> list[SegmentDone]:
        """The executions the robot reported, in order. A robot answers a re-sent copy of a segment it already
        finished with the *same* report again (same start and finish stamps: the planner may have missed it
        while restarting); that repeats one execution, it is not a second one, so it is counted once."""
        seen, out = set(), []
        with self.lock:
            for d in self.done:
                if d.task_id != task_id:
                    continue
                key = (d.segment_index, _stamp(d.start), _stamp(d.finish), d.success)
                if key not in seen:
                    seen.add(key)
                    out.append(d)
        return out

    def n_done(self) -> int:
        with self.lock:
            return len(self.done)

    def final(self, task_id: str) -> PlanResult | None:
        """The task's latest result: /plan_results, else /get_plan_result (None while active/unknown)."""
        rs = self.results_of(task_id)
        if rs:
            return rs[-1]
        resp = self.query(task_id, tries=1)
        return resp.result if resp is not None and resp.state == GetPlanResult.Response.STATE_DONE else None

    def wait_ended(self, task_ids: list[str], timeout: float) -> dict[str, PlanResult | None]:
        """Wait (bounded) until every task has a terminal result; returns the latest of each."""
        end = time.monotonic() + timeout
        out: dict[str, PlanResult | None] = {}
        while True:
            out = {t: self.final(t) for t in task_ids}
            if all(r is not None for r in out.values()) or time.monotonic() > end:
                return out
            time.sleep(0.2)

    def wait_executed(self, results: dict[str, PlanResult | None], timeout: float) -> bool:
        """Wait (bounded) until every SUCCEEDED task's robot has reported all its segments."""
        def complete():
            return all(len(self.reports_of(t)) >= r.num_segments
                       for t, r in results.items() if r is not None and r.status == SUCCEEDED)
        return wait_until(complete, timeout, interval=0.1)

    def describe(self, task_ids: list[str]) -> str:
        lines = []
        for t in task_ids:
            rs = [f"{STATUS.get(r.status, r.status)}({r.message[:80]!r}, n={r.num_segments})"
                  for r in self.results_of(t)]
            reps = [(d.segment_index, d.success) for d in self.reports_of(t)]
            lines.append(f"{t}: results={rs} reports={reps}")
        return "\n".join(lines)


@pytest.fixture()
def clients():
    made: list[Clients] = []

    def make(robots: list[str] = (), **kw) -> Clients:
        c = Clients(robots, **kw)
        made.append(c)
        return c
    try:
        yield make
    finally:
        for c in made:
            c.close()


# -- shared checks ------------------------------------------------------------------------------------------
def journal_texts(state_dir: Path) -> dict[tuple[str, int], str]:
    """(task_id, index) -> text of every segment the planner journaled as sent (read-only). Segments that a
    restarted planner produced before this process's subscriptions matched it were seen by nobody here."""
    import sqlite3

    from timelyllm_ros.planner.journal import DB_NAME

    conn = sqlite3.connect(f"file:{state_dir / DB_NAME}?mode=ro", uri=True, timeout=10)
    try:
        return {(t, i): text for t, i, text in conn.execute("SELECT task_id, idx, text FROM segments WHERE marker = 0")}
    finally:
        conn.close()


def _stamp(t) -> tuple[int, int]:
    """A Time message, or [sec, nanosec] as relayed by the observer subprocess."""
    return (t.sec, t.nanosec) if hasattr(t, "sec") else tuple(t)


def execution_problems(cl: Clients, task_id: str, res: PlanResult | None,
                       sent: dict[tuple[str, int], str] | None = None) -> list[str]:
    """What is wrong with how the robot ran the task: each segment must run (be reported) at most once, in
    index order, with one text per index (as seen on the wire here, and as journaled in ``sent``); a
    SUCCEEDED task's segments must all have run, successfully, and concatenated they must be its plan."""
    reports = cl.reports_of(task_id)
    idx = [d.segment_index for d in reports]
    if len(set(idx)) != len(idx):
        return [f"{task_id}: a segment was executed more than once: {idx}"]
    if idx != list(range(len(idx))):
        return [f"{task_id}: segments executed out of order: {idx}"]
    with cl.lock:
        texts = {i: set(cl.texts.get((task_id, i), ())) for i in idx}
    for i in idx:
        if sent and (task_id, i) in sent:
            texts[i].add(sent[(task_id, i)])
    out = [f"{task_id}[{i}]: {len(ts)} different texts were sent for one index: {ts}"
           for i, ts in texts.items() if len(ts) != 1]
    if out or res is None or res.status != SUCCEEDED:
        return out
    if len(idx) != res.num_segments:
        return [f"{task_id}: SUCCEEDED with {res.num_segments} segments but the robot executed {idx}"]
    failed = [(d.segment_index, d.error) for d in reports if not d.success]
    if failed:
        return [f"{task_id}: SUCCEEDED but the robot reported failures {failed}"]
    ran = "".join(next(iter(texts[i])) for i in idx)
    if ran != res.plan_text:
        return [f"{task_id}: executed {ran!r} != plan {res.plan_text!r}"]
    return []


def check_executed_once_in_order(cl: Clients, task_id: str, res: PlanResult | None) -> None:
    problems = execution_problems(cl, task_id, res)
    assert not problems, "\n".join(problems)


# -- 1. planner SIGKILL and restart from its journal ------------------------------------------------------
def test_planner_sigkill_and_restart_resumes_every_task_exactly_once(tmp_path, procs, clients):
    robots = [f"drone_{i}" for i in range(5)]
    engine = engine_yaml(tmp_path, 5.0)  # slow generation: tasks are in flight when the planner dies
    state = tmp_path / "state"
    params = dict(robot_timeout_s=5.0)  # default 10 s: the same, later
    fleet = start_fleet(procs, robots)
    planner = start_planner(procs, engine=engine, state_dir=state, **params)
    cl = clients(robots)
    cl.wait_planner()
    cl.wait_fleet()
    cl.probe_fleet(robots[0])
    ids = [f"kill-{i}" for i in range(10)]
    for i, tid in enumerate(ids):
        cl.send(tid, robots[i % 5], DRONE_TASKS[i % len(DRONE_TASKS)])
    assert wait_until(lambda: cl.n_done() >= 3, 60), "no segment was reported before the kill"
    planner.kill()
    before = {t: len(cl.results_of(t)) for t in ids}
    start_planner(procs, engine=engine, state_dir=state, name="planner2", **params)

    results = cl.wait_ended(ids, 90)
    assert all(r is not None for r in results.values()), \
        f"tasks without a terminal result after the restart:\n{cl.describe(ids)}"
    assert cl.wait_executed(results, 60), f"robots did not finish the plans:\n{cl.describe(ids)}"
    time.sleep(params["robot_timeout_s"] + 2.0)  # late revisions (robot-silent watchdog) and duplicates show now
    assert fleet.alive()
    sent = journal_texts(state)
    problems = [p for t in ids for p in execution_problems(cl, t, results[t], sent)]
    for t in ids:
        rs = cl.results_of(t)
        if len(rs) > 1:
            problems.append(f"{t}: {len(rs)} results on /plan_results: {[STATUS[r.status] for r in rs]}")
        r = cl.final(t)
        if r.status != SUCCEEDED:
            problems.append(f"{t}: ended {STATUS[r.status]}: {r.message}")
    assert not problems, "\n".join(problems) + f"\nresults before the kill: {before}\n{cl.describe(ids)}"
    for t in ids:
        q = cl.query(t)
        assert q is not None, f"/get_plan_result({t}) never answered"
        assert q.state == GetPlanResult.Response.STATE_DONE and q.result.status == SUCCEEDED, (t, q)
        assert [g.segment_index for g in q.segments] == list(range(q.result.num_segments)), (t, q.segments)
        assert "".join(g.text for g in q.segments) == q.result.plan_text, (t, q)
    assert not re.search(r"Traceback", procs.report(400)), procs.report(400)


# -- 2. a fleet process dies --------------------------------------------------------------------------------
def test_killed_executor_fails_its_task_and_others_still_succeed(tmp_path, procs, clients):
    engine = engine_yaml(tmp_path, 3.0)
    fleet0 = start_fleet(procs, ["drone_0"], name="fleet0")
    start_fleet(procs, ["drone_1"], name="fleet1")
    start_planner(procs, engine=engine, robot_timeout_s=1.0, delivery_timeout_s=2.0)
    cl = clients(["drone_0", "drone_1"])
    cl.wait_planner()
    cl.wait_fleet(2)
    for robot in ("drone_0", "drone_1"):
        cl.probe_fleet(robot)
    # Both robots work, and the planner's segment publishers have matched them, before anything is killed.
    # The planner creates a robot's publisher at the robot's first goal, and matching a new publisher can
    # take longer than the small delivery_timeout_s here: a first goal may end ROBOT_FAILED ("never
    # acknowledged segment 0") with a healthy robot, so up to 4 tries (printed on failure).
    warm_log = []
    for robot in ("drone_0", "drone_1"):
        for k in range(4):
            tid = f"warm-{robot}-{k}"
            r = cl.action_result(cl.send(tid, robot, DRONE_TASKS[0]), 60)
            warm_log.append(f"{tid}: {STATUS[r.status]} {r.message}")
            if r.status != SUCCEEDED:
                continue
            # A plan written at once (nothing waiting) is SUCCEEDED before its robot acknowledged anything, and
            # revised to ROBOT_FAILED if the robot never does: wait for all its reports, or that revision.

            def settled(tid=tid):
                f = cl.final(tid)
                return f is not None and (f.status != SUCCEEDED or len(cl.reports_of(tid)) >= f.num_segments)

            assert wait_until(settled, 30), cl.describe([tid])
            f = cl.final(tid)
            if f.status == SUCCEEDED:
                break
            warm_log.append(f"{tid}: revised {STATUS[f.status]} {f.message}")
        else:
            pytest.fail("warm-up never succeeded:\n" + "\n".join(warm_log))
    print("warm-up:", *warm_log, sep="\n  ")

    h0 = cl.send("doomed", "drone_0", MULTI)
    assert wait_until(lambda: cl.reports_of("doomed"), 60), "drone_0 never reported a segment"
    fleet0.kill()
    r0 = cl.action_result(h0, 60)
    h1 = cl.send("survivor", "drone_1", MULTI)
    r1 = cl.action_result(h1, 60)
    # The doomed task ends ROBOT_FAILED: at once, or as a revision of a result sent when its generation ended.
    assert wait_until(lambda: (r := cl.final("doomed")) is not None and r.status == ROBOT_FAILED, 30), \
        f"action result {STATUS[r0.status]} ({r0.message})\n{cl.describe(['doomed'])}"
    assert "robot" in cl.final("doomed").message, cl.final("doomed").message
    assert r1.status == SUCCEEDED, f"{r1.message}\n{cl.describe(['survivor'])}"
    res1 = cl.wait_ended(["survivor"], 30)
    assert cl.wait_executed(res1, 30), cl.describe(["survivor"])
    check_executed_once_in_order(cl, "survivor", res1["survivor"])
    assert [r.status for r in cl.results_of("survivor")] == [SUCCEEDED]
    ran = [d.segment_index for d in cl.reports_of("doomed") if d.success]
    assert ran == list(range(len(ran))) and ran, ran  # what drone_0 did run, it ran once and in order


# -- 3. executors that start after the planner began publishing ------------------------------------------
def test_late_executors_get_every_segment_exactly_once(tmp_path, procs, clients):
    robots = ["drone_0", "drone_1", "drone_2", "drone_3"]
    engine = engine_yaml(tmp_path, 1.0)
    start_planner(procs, engine=engine)
    cl = clients(robots)
    cl.wait_planner()
    # First segments that take the robot a moment (not keys_or_wallet's instant ones): this process's report
    # subscription must have been matched by the new fleet's writer before its first report, or it misses it.
    # One task per robot: a robot's second task waits until its first has been reported, which no robot can
    # do before the fleet starts.
    plan = {"late-0": ("drone_0", DRONE_TASKS[2]), "late-1": ("drone_1", DRONE_TASKS[0]),
            "late-2": ("drone_2", DRONE_TASKS[3]), "late-3": ("drone_3", DRONE_TASKS[5])}
    handles = {t: cl.send(t, r, task) for t, (r, task) in plan.items()}
    assert wait_until(lambda: all(cl.feedback[t] for t in plan), 30), "the planner produced no segments"
    with cl.lock:
        assert not cl.acks and not cl.done, "segments were acknowledged before any executor existed"
    start_fleet(procs, robots)
    results = {t: cl.action_result(h, 60) for t, h in handles.items()}
    ended = cl.wait_ended(list(plan), 30)
    assert cl.wait_executed(ended, 60), cl.describe(list(plan))
    time.sleep(1.0)  # duplicates (re-sends still in flight) would show now
    for t, r in results.items():
        assert r.status == SUCCEEDED, f"{t}: {STATUS[r.status]} {r.message}\n{cl.describe(list(plan))}"
        check_executed_once_in_order(cl, t, ended[t])
        assert [x.status for x in cl.results_of(t)] == [SUCCEEDED], cl.describe([t])


# -- 4. packet loss between the planner and a fleet in its own network namespace -------------------------
def _netns_reason() -> str | None:
    from devtools.netns import netns_unavailable_reason

    if os.geteuid() != 0:
        return "network namespaces and nftables need root"
    why = netns_unavailable_reason()
    if why:
        return why
    if shutil.which("nft") is None:
        return "nftables ('nft') is not installed: apt-get install -y nftables"
    return None


_NETNS_WHY = _netns_reason()

# 5 % of the packets arriving in the namespace are dropped (input hook), and 5 % of those leaving it, at its
# veth end's egress (a silent loss, as on a wire: an output-hook drop would fail the sender's sendmsg).
LOSS_RULES = """
table inet tllm_loss {{
  chain in {{ type filter hook input priority 0; policy accept; counter; numgen random mod 100 < {pct} counter drop; }}
}}
table netdev tllm_loss_out {{
  chain out {{ type filter hook egress device "{dev}" priority 0; policy accept;
               counter; numgen random mod 100 < {pct} counter drop; }}
}}
"""


def _counters(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "exec", netns, "nft", "list", "ruleset"], capture_output=True,
                         text=True, timeout=10).stdout
    return [int(x) for x in re.findall(r"counter packets (\d+)", out)]


@pytest.mark.netns
@pytest.mark.skipif(_NETNS_WHY is not None, reason=f"packet loss test: {_NETNS_WHY}")
def test_five_percent_packet_loss_to_a_fleet_in_a_network_namespace(tmp_path, procs, clients):
    from devtools.netns import DroneNetwork, sweep_stale

    sweep_stale()
    robots = [f"drone_{i}" for i in range(10)]
    with DroneNetwork(1) as net:
        d = net.drones[0]
        peer_dev = f"tl{net.pid}d{d.index}"  # the veth end inside the namespace (netns.py's naming)
        rules = LOSS_RULES.format(pct=5, dev=peer_dev)
        subprocess.run(["ip", "netns", "exec", d.netns, "nft", "-f", "-"], input=rules, text=True, check=True,
                       capture_output=True, timeout=10)
        # Unicast discovery across the veth (no multicast, so nothing leaves the host), UDP only: shared
        # memory would bypass the link (and its losses) between processes of one machine.
        root_env = _child_env(ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", ROS_STATIC_PEERS=d.drone_ip,
                              FASTDDS_BUILTIN_TRANSPORTS="UDPv4")
        ns_env = _child_env(ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", ROS_STATIC_PEERS=d.host_ip,
                            FASTDDS_BUILTIN_TRANSPORTS="UDPv4")
        fleet = start_fleet(procs, robots, env=ns_env, prefix=["ip", "netns", "exec", d.netns])
        start_planner(procs, engine=engine_yaml(tmp_path, 1.0), env=root_env)
        # This process talks to the planner (loopback); the robots' reports come through an observer process:
        # Fast DDS takes a process's network interfaces at its first participant, before this veth existed.
        cl = clients(robots, own_reports=False)
        procs.start("observer", [sys.executable, procs_mod.__file__, "observe", "--probe", robots[0]], env=root_env,
                    on_line=cl.observer_line, ready=OBSERVER_READY, timeout=90)
        cl.wait_planner()
        ids = [f"lossy-{i}" for i in range(20)]
        handles = {t: cl.send(t, robots[i % len(robots)], DRONE_TASKS[i % len(DRONE_TASKS)])
                   for i, t in enumerate(ids)}
        results = {t: cl.action_result(h, 90) for t, h in handles.items()}
        ended = cl.wait_ended(ids, 30)
        assert cl.wait_executed(ended, 60), cl.describe(ids)
        time.sleep(1.0)
        counters = _counters(d.netns)
        assert fleet.alive()
    for t, r in results.items():
        assert r.status == SUCCEEDED, f"{t}: {STATUS[r.status]} {r.message}\n{cl.describe(ids)}"
        assert [x.status for x in cl.results_of(t)] == [SUCCEEDED], cl.describe([t])
        check_executed_once_in_order(cl, t, ended[t])
    # the traffic really crossed the lossy link: packets counted in both directions, some of them dropped
    seen_in, dropped_in, seen_out, dropped_out = counters
    assert seen_in > 100 and seen_out > 100 and dropped_in > 0 and dropped_out > 0, counters


# -- 5. a clean stop (SIGINT) answers every open goal ----------------------------------------------------
def test_sigint_stop_answers_every_open_goal(tmp_path, procs, clients):
    engine = engine_yaml(tmp_path, 5.0)
    robots = [f"drone_{i}" for i in range(4)]  # one task each: a robot's second task would wait for its first
    start_fleet(procs, robots)
    planner = start_planner(procs, engine=engine, state_dir=tmp_path / "state")
    cl = clients(robots)
    cl.wait_planner()
    ids = [f"stop-{i}" for i in range(4)]
    handles = {t: cl.send(t, robots[i], MULTI) for i, t in enumerate(ids)}
    assert wait_until(lambda: all(cl.feedback[t] for t in ids), 60), "no segment was produced"
    assert all(cl.final(t) is None for t in ids), cl.describe(ids)  # still open
    futs = {t: h.get_result_async() for t, h in handles.items()}  # as a client does: asked before the stop
    rc = planner.stop(timeout=20)
    assert rc is not None and rc >= 0, f"the planner did not exit on SIGINT (rc={rc})"
    stop_log = planner.tail(40)
    # The robots' clients hear how their goals ended: the action result, and /plan_results (the contract) ...
    wait_until(lambda: all(f.done() for f in futs.values()), 10)
    problems = [f"{t}: no action result after SIGINT" for t, f in futs.items() if not f.done()]
    problems += [f"{t}: action result {STATUS[f.result().result.status]}" for t, f in futs.items()
                 if f.done() and f.result().result.status != PlanTask.Result.STATUS_CANCELED]
    problems += [f"{t}: /plan_results {[STATUS[r.status] for r in cl.results_of(t)]}" for t in ids
                 if [r.status for r in cl.results_of(t)] != [PlanTask.Result.STATUS_CANCELED]]
    # ... and the journal agrees: a restarted planner does not resume them behind the clients' backs.
    start_planner(procs, engine=engine, state_dir=tmp_path / "state", name="planner2")
    for t in ids:
        q = cl.query(t)
        if q is None or q.state != GetPlanResult.Response.STATE_DONE or \
                q.result.status != PlanTask.Result.STATUS_CANCELED:
            state = None if q is None else (q.state, STATUS.get(q.result.status))
            problems.append(f"{t}: after a restart /get_plan_result says (state, status) = {state}")
    assert not problems, "\n".join(problems) + f"\nplanner output at SIGINT:\n{stop_log}"
