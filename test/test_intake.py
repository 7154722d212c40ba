"""Intake under a flood (issue 39): rate limits per robot id and for robot ids new to the planner, an answer with
the reason for every refused goal, bounded memory (robot links), urgent goals first, and refusals logged once per
claimed sender rather than once per message."""

from __future__ import annotations

import json
import logging
from collections import Counter

import pytest
from service_stack import ServiceStack
from waiting import wait_until

from timelyllm_ros.domain.types import TaskStatus
from timelyllm_ros.planner.service_io import GoalError

DOG = "Scene: [dog x:0.48 y:0.51 width:0.2 height:0.4] Task: [E] a dog is chasing you"


@pytest.fixture()
def stack():
    made: list[ServiceStack] = []

    def make(**kw) -> ServiceStack:
        s = ServiceStack(**kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def test_forged_reports_are_logged_once_per_claimed_sender_not_once_per_report(stack, caplog):
    """Issue 39: 5,000 forged reports from 7 claimed senders wrote 5,007 log lines (the core logged each one)."""
    caplog.set_level(logging.INFO, logger="timelyllm_ros")
    s = stack()
    tid, refusal = s.send(s.request("drone_0", task_id="victim"))
    assert refusal is None
    assert wait_until(lambda: ("victim", 0) in {(t, i) for t, _, i, _ in s.sender.segments}, 30)
    senders = [f"mallory_{k}" for k in range(7)]
    for n in range(5000):
        s.service.segment_done("victim", 0, senders[n % 7], False, "forged", None, None)
    assert s.rejected.counts["report"] == 5000
    # every line the planner wrote (its node logger and the core's Python loggers) that speaks of a report
    lines = [m for m in s.log.at("info", "warning", "error") if "report" in m]
    lines += [r.getMessage() for r in caplog.records if "report" in r.getMessage()]
    assert len(lines) == 7, (len(lines), lines[:3])
    assert s.core.task_status("victim") is not TaskStatus.ROBOT_FAILED


def test_refusals_of_ever_new_senders_are_logged_within_a_line_budget(stack):
    """A forger that claims a new sender per message must not flood the log either."""
    s = stack()
    for n in range(3000):
        s.service.segment_done("nothing", 0, f"forger_{n}", False, "forged", None, None)
    assert s.rejected.counts["report"] == 3000
    lines = [m for m in s.log.at("warning") if "refused report" in m]
    assert 1 <= len(lines) <= 20, len(lines)


# -- intake limits (PlannerService, no ROS) ------------------------------------------------------------------------
def _refusals(results) -> Counter:
    return Counter(str(r).split(" (")[0] for _, r in results if isinstance(r, GoalError))


def test_a_flood_of_new_robot_ids_is_held_to_the_new_robot_limit_and_each_refusal_names_it(stack):
    """Issue 39: 10,000 goals from 10,000 robot ids were all taken in, first come first served: 4,772 segment writers
    kept 600 s. Robot ids new to the planner now share one budget; every goal beyond it is refused BUSY, naming it."""
    s = stack(intake_new_robots_burst=20, intake_new_robots_per_s=5.0)
    out = [s.send(s.request(f"flood_{i:05d}")) for i in range(3000)]
    accepted = [tid for tid, r in out if r is None]
    refused = [r for _, r in out if isinstance(r, GoalError)]
    assert len(accepted) + len(refused) == 3000  # every one answered
    assert 20 <= len(accepted) <= 20 + 5 * 10, len(accepted)  # the burst, and what the rate refilled meanwhile
    assert all(r.status is TaskStatus.BUSY for r in refused)
    assert _refusals(out) == {"robot_id: intake rate limit for robot ids new to this planner": len(refused)}
    assert "intake_new_robots_per_s=5" in str(refused[0]) and "retry in" in str(refused[0])
    assert len(s.links) == len(accepted)  # a segment writer only for what was taken in
    # a robot of the fleet (its executor's reader on the graph) is not held by the new robots' limit
    s.present.add("real_0")
    tid, refusal = s.send(s.request("real_0", "[E] a dog is chasing you", level="urgent"))
    assert refusal is None, refusal
    # nor is a robot served before (its link held)
    tid, refusal = s.send(s.request(f"flood_{out.index((accepted[0], None)):05d}"))
    assert refusal is None, refusal


def test_a_flood_from_one_robot_id_is_held_to_its_own_limit(stack):
    s = stack(intake_goals_burst_per_robot=5, intake_goals_per_robot_s=1.0)
    s.present.add("drone_0")
    out = [s.send(s.request("drone_0")) for _ in range(200)]
    assert 5 <= sum(r is None for _, r in out) <= 8
    assert _refusals(out) == {"robot_id: intake rate limit of 'drone_0'": sum(r is not None for _, r in out)}
    s.present.add("drone_1")
    assert s.send(s.request("drone_1"))[1] is None  # another robot is not held by it


def test_robot_ids_names_the_fleet_and_refuses_any_other_id(stack):
    s = stack(robot_ids=["drone_0", "drone_1"], intake_new_robots_burst=1)
    assert s.send(s.request("drone_0"))[1] is None
    assert s.send(s.request("drone_1"))[1] is None  # in the fleet: not new, whatever the new robots' budget
    _, refusal = s.send(s.request("mallory"))
    assert refusal.status is TaskStatus.INVALID and str(refusal) == (
        "robot_id: 'mallory' is not one of this planner's robots (parameter robot_ids)")



def test_a_robot_id_in_robot_ids_that_cannot_name_a_topic_is_refused_at_start_naming_the_parameter():
    with pytest.raises(ValueError, match=r"parameter robot_ids: 'drone 0' has ' ' at position 5"):
        ServiceStack(robot_ids=["drone_1", "drone 0"])

def test_max_robots_bounds_the_segment_writers_and_frees_the_least_recently_used_idle_one(stack):
    s = stack(max_robots=3, robot_idle_release_s=0.0, intake_new_robots_per_s=0.0)
    for r in ("a_0", "a_1", "a_2"):
        assert s.send(s.request(r))[1] is None
    _, refusal = s.send(s.request("a_3"))  # all three still run their tasks
    assert refusal.status is TaskStatus.BUSY and "max_robots=3" in str(refusal), refusal
    assert set(s.links) == {"a_0", "a_1", "a_2"}
    # a_0's plan ends and its robot reports it all: it owes nothing more, and its writer is the one freed for a_3
    assert wait_until(lambda: any(r.robot_id == "a_0" for r in list(s.sender.results)), 30)
    for tid, robot, index, _ in list(s.sender.segments):
        if robot == "a_0":
            s.service.segment_done(tid, index, "a_0", True, "", None, None)
    for (tid, index) in [(m.task_id, m.segment_index) for t in {x[0] for x in s.sender.segments if x[1] == "a_0"}
                         for m in s.delivery.waiting(t)]:
        s.service.segment_ack(tid, index, "a_0", False, None)  # the end-of-plan marker, if one went out
    assert wait_until(lambda: "a_0" not in s.core.robots_in_use() and not s.delivery.pending_for("a_0"), 10)
    assert s.send(s.request("a_3"))[1] is None
    assert set(s.links) == {"a_1", "a_2", "a_3"}



def test_a_robot_whose_reader_never_matched_has_its_writer_released_once_not_busy():
    """Issue 39: a flood's made-up robot ids kept a segment writer each for robot_idle_release_s (4,772 for 600 s).
    One no executor ever listened to goes as soon as it owes nothing, idle release on or off; a robot whose reader
    matched keeps its writer for the idle time."""
    import time

    from timelyllm_ros.transport.delivery import RobotLinks

    destroyed: list[str] = []
    listening = {"real_0"}
    links = RobotLinks(lambda r: r, destroyed.append, lambda link: link in listening)
    for r in ("real_0", "ghost_0", "ghost_1"):
        links.get(r)
    assert links.reachable("real_0")
    now = time.monotonic()
    assert links.release_idle(now, float("inf"), lambda r: r == "ghost_1") == 1  # ghost_1 still owes a task
    assert destroyed == ["ghost_0"] and links.has("real_0") and links.has("ghost_1")
    assert links.release_idle(now, float("inf"), lambda r: False) == 1
    assert destroyed == ["ghost_0", "ghost_1"] and links.has("real_0")
    assert links.release_idle(now + 700, 600.0, lambda r: False) == 1 and not links.has("real_0")

def test_a_goal_whose_prompt_is_being_rendered_holds_up_neither_screening_nor_the_engines_segments(stack):
    """The flood test's urgent goal came late on a busy machine: the engine thread waited, before sending each
    segment, for the service's lock, which intake held while it rendered a goal's prompt and while it screened
    every goal of the flood. Rendering and screening now run outside it: with one goal's rendering held, other
    goals are screened and taken in, and a running task's segments and result go out."""
    import threading
    import time

    s = stack()
    prompts = s.service._prompts
    render, held, release = prompts.render, threading.Event(), threading.Event()

    def slow_render(robot_type: str, task: str):
        if "slow" in task:
            held.set()
            assert release.wait(30)
        return render(robot_type, task)

    prompts.render = slow_render
    tid, refusal = s.send(s.request("drone_0", task_id="fast-0"))
    assert refusal is None
    slow: list = []
    t = threading.Thread(target=lambda: slow.append(s.send(s.request("drone_1", "[A] slow: find the dog",
                                                                          task_id="slow-1"))))
    t.start()
    try:
        assert held.wait(30)
        s.service.screen(s.request("drone_2", task_id="other-2"))  # answered while the rendering is held
        assert s.send(s.request("drone_2", task_id="other-2"))[1] is None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not {"fast-0", "other-2"} <= {r.task_id for r in s.sender.results}:
            time.sleep(0.01)
        assert {"fast-0", "other-2"} <= {r.task_id for r in s.sender.results}, "the engine waited for the rendering"
        assert not slow  # still rendering
    finally:
        release.set()
        t.join(30)
    assert slow and slow[0][1] is None


def test_a_short_ascii_task_is_not_tokenized_to_be_counted(stack):
    """Taking a goal in tokenized its task twice: to count it against max_task_tokens, then in its prompt. A task
    that cannot pass the limit (hygiene.fits_in_tokens) is counted no more; a longer or non-ASCII one still is."""
    s = stack(max_task_tokens=40)
    counted: list[str] = []
    count = s.service._prompts.count_tokens
    s.service._prompts.count_tokens = lambda text: counted.append(text) or count(text)
    assert s.send(s.request("drone_0", "[A] find the cat", task_id="short"))[1] is None
    assert counted == []
    tid, refusal = s.send(s.request("drone_1", "[A] find the cat " + "and the dog " * 40, task_id="long"))
    assert isinstance(refusal, GoalError) and "max_task_tokens=40" in str(refusal), refusal
    assert s.send(s.request("drone_2", "[A] find the caf\u00e9 cat", task_id="accent"))[1] is None
    assert len(counted) == 2


# -- a flood over ROS, and a real urgent goal ---------------------------------------------------------------------
@pytest.mark.ros
def test_a_goal_flood_gets_every_goal_answered_and_starves_no_urgent_goal():
    """Issue 39's Done-when, sized for the suite (the 10,000-id figures: bench/flood.py): a plain rclpy ActionClient
    in another process floods the planner with goals from 1,500 robot ids; half-way, a robot of the fleet sends an
    urgent goal. Every flooding goal gets an answer (planned, or a result naming why not), the urgent goal's first
    segment comes within its ERT plus one engine step of its own send stamp, and the planner holds a segment writer
    only for what it took in."""
    import subprocess
    import sys
    import time
    from collections import deque
    from pathlib import Path

    import rclpy
    from rclpy.parameter import Parameter

    from timelyllm_ros.action import PlanTask
    from timelyllm_ros.domain.tuf import LEVELS
    from timelyllm_ros.engines.sim_realtime import RealtimeSimEngine
    from timelyllm_ros.msg import TimeUtility
    from timelyllm_ros.ros import topics
    from timelyllm_ros.ros.actions import SafeActionClient
    from timelyllm_ros.ros.convert import time_msg
    from timelyllm_ros.ros.planner_node import build_planner
    from timelyllm_ros.ros.sim_fleet_node import SimFleetNode
    from timelyllm_ros.ros.spin import PooledExecutor, Spinner

    class TimedEngine(RealtimeSimEngine):
        """The simulated engine, each step's start and end kept (what 'one engine step' is measured by)."""

        def __init__(self) -> None:
            super().__init__()
            self.steps: deque[tuple[float, float]] = deque(maxlen=100_000)

        def step(self):
            t0 = time.monotonic()
            try:
                return super().step()
            finally:
                self.steps.append((t0, time.monotonic()))

    n = 1500
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    engine = TimedEngine()
    planner, sched = build_planner([Parameter("warm_up", value=False)], engine=engine, context=ctx)
    fleet = SimFleetNode(context=ctx, parameter_overrides=[Parameter("robots", value=["real_0"])])
    robot = rclpy.create_node("real_robot", context=ctx)
    client = SafeActionClient(robot, PlanTask, topics.PLAN_TASK_ACTION)
    ex = PooledExecutor(num_threads=8, context=ctx)
    for node in (planner, sched, fleet, robot):
        ex.add_node(node)
    spin = Spinner(ex)
    spin.start()
    flood = None
    try:
        assert client.wait_for_server(timeout_sec=30)
        assert wait_until(lambda: planner.count_subscribers(topics.segment_topic("real_0")) > 0, 30)
        root = Path(__file__).resolve().parents[1]
        flood = subprocess.Popen([sys.executable, "-m", "bench.flood", "client", "--goals", str(n), "--rate", "1350",
                                  "--settle", "90"], cwd=root, stdout=subprocess.PIPE, text=True)
        assert flood.stdout.readline().strip() == "FLOOD_HALF"
        sent = time.monotonic()
        goal = PlanTask.Goal(task_id="urgent-1", robot_id="real_0", robot_type="drone", task=DOG,
                             tuf=TimeUtility(level="urgent"), stamp=time_msg(time.time()))
        client.send_goal_async(goal)
        summary = json.loads(flood.stdout.readline())
        assert flood.wait(30) == 0
        assert wait_until(lambda: planner.core.result("urgent-1") is not None, 30)
        res = planner.core.result("urgent-1")
        errors = list(spin.errors)  # a callback that raised (a goal it would have left unanswered)
        writers = [name for name, _ in robot.get_topic_names_and_types() if name != topics.ALL_SEGMENTS
                   and name.endswith(topics.segment_topic("x").removeprefix("/x"))
                   and any(e.node_name == "planner" for e in robot.get_publishers_info_by_topic(name))]
    finally:
        if flood is not None and flood.poll() is None:
            flood.kill()
        planner.shutdown()
        spin.stop()
        ex.shutdown(timeout_sec=5)
        for node in (robot, fleet, sched, planner):
            node.destroy_node()
        rclpy.shutdown(context=ctx)
    assert not errors, errors[0]
    # every flooding goal answered: planned, or a result that says why not
    assert summary["sent"] == n and summary["unanswered"] == 0, summary
    assert summary["empty_reasons"] == 0, summary
    assert any(k.startswith("robot_id: intake rate limit") for k in summary["reasons"]), summary
    # the urgent goal: planned, its first segment within its ERT plus one engine step of its own send stamp
    assert res.status is TaskStatus.DONE, res.reason
    first = res.segments[0].dispatch
    running = [b - a for a, b in engine.steps if b > sent - 1.0 and a < first + 1.0] or [0.0]
    bound = LEVELS["urgent"].ert + max(running) + planner.core.cfg.comm_s
    assert res.response_time_from_send <= bound, (res.response_time_from_send, bound, max(running))
    # memory: a segment writer only for the robots taken in: the fleet's, and the new robots' budget (burst 20, 5/s)
    refused = sum(v for k, v in summary["reasons"].items() if k.startswith("robot_id: intake rate limit"))
    assert n - refused <= 20 + 5 * 30, summary
    assert topics.segment_topic("real_0") in writers and len(writers) <= 1 + n - refused, (len(writers), summary)
