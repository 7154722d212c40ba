"""Record a real planner run (simulated engine + simulated fleet, in-process), read it back, replay it.

One stack per module keeps it fast: planner + scheduler (RealtimeSimEngine), a
simulated drone fleet, a robot-side client, a witness subscriber and the live
metrics collector, all under one PooledExecutor.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict

import pytest
from waiting import wait_until

rclpy = pytest.importorskip("rclpy")
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import DurabilityPolicy, QoSProfile, QoSReliabilityPolicy  # noqa: E402
from std_msgs.msg import String  # noqa: E402
from std_srvs.srv import SetBool  # noqa: E402

from timelyllm_ros.action import PlanTask  # noqa: E402
from timelyllm_ros.bags import read_bag  # noqa: E402
from timelyllm_ros.bags.convert import load_requests  # noqa: E402
from timelyllm_ros.bags.io import stamp_ns  # noqa: E402
from timelyllm_ros.bags.records import bag_metrics, records_from_bag  # noqa: E402
from timelyllm_ros.engines.sim_realtime import RealtimeSimEngine  # noqa: E402
from timelyllm_ros.msg import PlanResult, PlanSegment, SegmentDone, TaskRequest, TimeUtility  # noqa: E402
from timelyllm_ros.ros.actions import SafeActionClient  # noqa: E402
from timelyllm_ros.ros.live_metrics import LiveMetrics  # noqa: E402
from timelyllm_ros.ros.planner_node import build_planner  # noqa: E402
from timelyllm_ros.ros.recorder_node import RecorderNode, start_recorder  # noqa: E402
from timelyllm_ros.ros.replay_node import Replayer  # noqa: E402
from timelyllm_ros.ros.sim_fleet_node import SimFleetNode  # noqa: E402
from timelyllm_ros.ros.spin import PooledExecutor, Spinner  # noqa: E402

pytestmark = pytest.mark.ros

CAT = "Scene: [] Task: [A] Could you find the cat? If so, go to it."
BOOK = ("Scene: [cabinet_1 x:0.48 y:0.55 width:0.49 height:0.91] Task: [A] Move up and then check the top of the "
        "cabinet, if you see a book, take a picture of it.")
DOG = ("Scene: [dog x:0.48 y:0.51 width:0.2 height:0.4] Task: [E] You provided me with plan ml,100, but I "
       "encountered a failure because a dog is attempting to catch me. Execution history: ml(50)")
ROBOTS = ["drone_0", "drone_1", "drone_2", "drone_3"]
RELIABLE_TOPICS = {"/plan_requests": TaskRequest, "/plan_segments": PlanSegment, "/segment_done": SegmentDone,
                   "/plan_results": PlanResult}
# (delay before sending s, robot, robot type, task, tuf): three robots, both urgency levels, one refused goal
GOALS = [(0.0, "drone_0", "drone", CAT, TimeUtility(level="normal")),
         (0.05, "drone_1", "drone", BOOK, TimeUtility(level="normal")),
         (0.3, "drone_2", "drone", DOG, TimeUtility(level="urgent")),
         (0.35, "drone_0", "submarine", CAT, TimeUtility(level="normal")),  # refused: unknown robot type
         # an idle robot: on drone_1 its higher beta would preempt BOOK when a replay compresses time
         (0.6, "drone_3", "drone", CAT, TimeUtility(level="", alpha=-1.0, beta=1.5, ert=0.8))]


def _wait(pred, timeout: float = 20.0) -> bool:
    return wait_until(pred, timeout)


def _writer(node, topic: str):
    """``node``'s one publisher on ``topic``."""
    (pub,) = [p for p in node.publishers if p.topic_name == topic]
    return pub


def _writers(stack) -> list:
    """The writers whose messages a recording of one task must hold."""
    p = stack.planner
    return [_writer(p, "/plan_requests"), _writer(p, "/plan_segments"), _writer(p, "/plan_results"),
            _writer(stack.fleet, "/segment_done")]


def _reader_nodes(stack, topic: str) -> set[str]:
    infos = stack.client.get_subscriptions_info_by_topic(topic)
    return {f"{i.node_namespace.rstrip('/')}/{i.node_name}" for i in infos}


def _readers_now(stack) -> list[set[str]]:
    """The nodes reading each writer's topic now (before a recorder starts)."""
    return [_reader_nodes(stack, w.topic_name) for w in _writers(stack)]


def _one_more_reader(stack, before: list[set[str]], timeout: float = 20.0, also=lambda: False) -> bool:
    """A node that was not there before reads every topic, and each writer has matched every reader in the
    graph: a new recorder will get what they send. (The writer's side, not the recorder's: each side of a DDS
    match is made on its own.) Names, not counts: a recorder of an earlier test whose process has gone is
    still counted until its discovery lease runs out, and a count taken before that made the next recorder
    look never ready (seen: 120 s under a CPU hog)."""
    def ready() -> bool:
        for w, old in zip(_writers(stack), before, strict=True):
            if not (_reader_nodes(stack, w.topic_name) - old):
                return False
            if w.get_subscription_count() < stack.client.count_subscribers(w.topic_name):
                return False
        return True
    return _wait(lambda: also() or ready(), timeout)


class Stack:
    def __init__(self) -> None:
        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx)
        self.planner, self.sched = build_planner(
            [Parameter("state_period_s", value=0.1)], engine=RealtimeSimEngine(time_scale=0.5), context=self.ctx)
        self.fleet = SimFleetNode(context=self.ctx, parameter_overrides=[
            Parameter("robots", value=ROBOTS), Parameter("time_scale", value=0.05)])
        self.client = rclpy.create_node("bag_test_client", context=self.ctx)
        self.action = SafeActionClient(self.client, PlanTask, "/plan_task")
        self.witness: list[tuple[str, object]] = []
        self.witness_lock = threading.Lock()
        for topic, typ in RELIABLE_TOPICS.items():
            self.client.create_subscription(typ, topic, lambda m, t=topic: self._witness(t, m),
                                            QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.RELIABLE))
        self.live = LiveMetrics(self.client)
        self.ex = PooledExecutor(num_threads=16, context=self.ctx)
        for n in (self.planner, self.sched, self.fleet, self.client):
            self.ex.add_node(n)
        self.thread = Spinner(self.ex)
        self.thread.start()
        ok = False
        try:
            ok = self.action.wait_for_server(timeout_sec=30)
        finally:
            if not ok:  # left running, this planner would answer every later test's goals
                self.close()
        assert ok, "the planner's action server never became visible"

    def _witness(self, topic, msg) -> None:
        with self.witness_lock:
            self.witness.append((topic, msg))

    def seen(self, topic: str) -> list:
        with self.witness_lock:
            return [m for t, m in self.witness if t == topic]

    def run_goals(self) -> list:
        """Send GOALS at their delays; returns the results in GOALS order."""
        handles = []
        t0 = time.monotonic()
        for delay, robot, rtype, task, tuf in GOALS:
            while time.monotonic() < t0 + delay:
                time.sleep(0.005)
            fut = self.action.send_goal_async(PlanTask.Goal(robot_id=robot, robot_type=rtype, task=task, tuf=tuf))
            assert _wait(fut.done)
            handles.append(fut.result().get_result_async())
        assert _wait(lambda: all(h.done() for h in handles), 60), "results missing"
        return [h.result().result for h in handles]

    def settle(self) -> None:
        """Until every dispatched segment was reported done (the fleet reports after the planner's result)."""
        assert _wait(lambda: len(self.seen("/segment_done")) >= len(self.seen("/plan_segments")), 30)
        time.sleep(0.3)

    def close(self) -> None:
        self.planner.shutdown()
        self.thread.stop()  # before the executor's shutdown, which destroys what in-flight handlers still use
        self.ex.shutdown(timeout_sec=5)
        for n in (self.client, self.fleet, self.sched, self.planner):
            n.destroy_node()
        rclpy.shutdown(context=self.ctx)
        # The spinner logs a raising callback and goes on (rclpy's spin would have stopped every node here)
        assert not self.thread.errors, f"{len(self.thread.errors)} callback(s) raised; first:\n{self.thread.errors[0]}"


@pytest.fixture(scope="module")
def stack():
    s = Stack()
    yield s
    s.close()


@pytest.fixture(scope="module")
def recorded(stack, tmp_path_factory):
    """One recorded run: (bag path, action results, witness snapshot)."""
    path = tmp_path_factory.mktemp("bags") / "run"
    before = _readers_now(stack)
    handle = start_recorder(stack.ctx, path)  # own node and thread in the stack's context
    # the planner's publishers must see the recorder before the first goal
    assert _one_more_reader(stack, before)
    results = stack.run_goals()
    stack.settle()
    counts = handle.counts
    assert handle.stop() == path
    with stack.witness_lock:
        witness = list(stack.witness)
    return path, results, witness, counts


def _fields(m) -> dict:
    """Comparable content of a TaskRequest / PlanSegment / SegmentDone (rclpy or rosbags message)."""
    out = {}
    for k in ("task_id", "robot_id", "robot_type", "task", "accepted", "error", "segment_index", "text", "is_final",
              "success"):
        if hasattr(m, k):
            out[k] = getattr(m, k)
    for k in ("stamp", "stamp_generated", "start", "finish"):
        if hasattr(m, k):
            out[k] = stamp_ns(getattr(m, k))
    if hasattr(m, "tuf"):
        out["tuf"] = (m.tuf.level, m.tuf.alpha, m.tuf.beta, m.tuf.ert)
    if hasattr(m, "skills"):
        out["skills"] = [(c.name, c.raw, list(c.args)) for c in m.skills]
    return out


def test_recorded_bag_holds_every_message_in_order_with_types_and_timestamps(recorded):
    path, results, witness, counts = recorded
    statuses = [r.status for r in results]
    assert statuses == [0, 0, 0, PlanTask.Result.STATUS_REJECTED, 0], [r.message for r in results]
    msgs = list(read_bag(path))
    assert msgs, "empty bag"
    # file order is timestamp order (what ros2 bag play replays)
    assert all(a.timestamp_ns <= b.timestamp_ns for a, b in zip(msgs, msgs[1:], strict=False))
    by_topic = Counter(m.topic for m in msgs)
    assert by_topic == Counter({k: v for k, v in counts.items() if v})
    types = {m.topic: m.msgtype for m in msgs}
    assert types["/plan_requests"] == "timelyllm_ros/msg/TaskRequest"
    assert types["/plan_segments"] == "timelyllm_ros/msg/PlanSegment"
    assert types["/segment_done"] == "timelyllm_ros/msg/SegmentDone"
    assert types["/scheduler_state"] == "timelyllm_ros/msg/SchedulerState"  # best effort, 10 Hz: some arrive
    assert types["/engine_state"] == "timelyllm_ros/msg/EngineState"
    # every reliable message the witness saw is in the bag, in the same order, with the same content
    for topic in RELIABLE_TOPICS:
        seen = [_fields(m) for t, m in witness if t == topic]
        got = [_fields(m.msg) for m in msgs if m.topic == topic]
        assert got == seen, topic
    assert len([m for m in msgs if m.topic == "/plan_requests"]) == len(GOALS)
    assert sum(len(r.segments) for r in results) == by_topic["/plan_segments"]
    # bag time = reception: after the stamp the publisher put in, and not long after
    for m in msgs:
        stamp = {"/plan_requests": "stamp", "/plan_segments": "stamp_generated", "/segment_done": "finish",
                 "/plan_results": "stamp", "/scheduler_state": "stamp", "/engine_state": "stamp"}[m.topic]
        lag = (m.timestamp_ns - stamp_ns(getattr(m.msg, stamp))) * 1e-9
        assert -0.001 <= lag < 10.0, (m.topic, lag)  # stamped at reception; not a latency target


def test_bag_reads_back_with_mcap_and_the_ros2_decoder(recorded):
    path, *_ = recorded
    from mcap.reader import make_reader
    from mcap_ros2.decoder import DecoderFactory

    with open(next(path.glob("*.mcap")), "rb") as f:
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        decoded = [(c.topic, s.name, m.log_time, d) for s, c, m, d in reader.iter_decoded_messages(log_time_order=True)]
    ours = list(read_bag(path))
    assert [(t, n, ts) for t, n, ts, _ in decoded] == [(m.topic, m.msgtype, m.timestamp_ns) for m in ours]
    for (topic, _, _, d), m in zip(decoded, ours, strict=True):
        if topic in RELIABLE_TOPICS:
            assert _fields(d) == _fields(m.msg)


def test_metrics_from_the_bag_equal_the_live_metrics(recorded, stack):
    path, results, *_ = recorded
    bag_rows = bag_metrics(path)
    live_rows = stack.live.summary()
    assert [r.group for r in bag_rows] == [r.group for r in live_rows]
    for a, b in zip(bag_rows, live_rows, strict=True):
        for k, v in asdict(a).items():
            w = getattr(b, k)
            assert (isinstance(v, float) and math.isnan(v) and math.isnan(w)) or v == w, (a.group, k, v, w)
    # and they agree with what the planner answered each robot
    recs = records_from_bag(path)
    assert [r.status for r in recs] == ["done", "done", "done", "invalid", "done"]
    for rec, res in zip([r for r in recs if r.status != "invalid"], [r for r in results if r.status == 0],
                        strict=True):
        assert rec.plan == res.plan_text and len(rec.segments) == len(res.segments)
        assert 0 < rec.response_time < 5 and math.isfinite(rec.utility())
    overall = bag_rows[-1]
    assert overall.n == len(GOALS) and overall.served == len(GOALS) - 1 and overall.failed == 1


def test_replay_sends_the_same_requests_at_the_same_relative_times(recorded, stack):
    path, results, *_ = recorded
    reqs = load_requests(path)
    before = len(stack.seen("/plan_requests"))
    speed = 2.0
    node = rclpy.create_node("bag_test_replay", context=stack.ctx)
    stack.ex.add_node(node)
    try:
        rep = Replayer(node, reqs, speed=speed).run(timeout_s=60)
    finally:
        stack.ex.remove_node(node)
        node.destroy_node()
    assert rep.complete, rep.counts()
    assert [r.status for r in rep.results] == ["done", "done", "done", "invalid", "done"]
    assert _wait(lambda: len(stack.seen("/plan_requests")) >= before + len(reqs))
    arrived = stack.seen("/plan_requests")[before:]
    original = [m.msg for m in read_bag(path, ["/plan_requests"])]
    key = lambda m: (m.robot_id, m.robot_type, m.task, m.tuf.level, m.tuf.alpha, m.tuf.beta, m.tuf.ert)  # noqa: E731
    assert Counter(map(key, arrived)) == Counter(map(key, original))
    assert [m.accepted for m in arrived] == [m.accepted for m in original]
    # Each goal leaves at its original offset / speed plus however late this (possibly loaded) machine let the
    # replayer be; that lateness is measured, not asserted (no timing targets in tests). Times are judged where
    # the goal leaves (its send stamp, as the planner received it), not at arrival, which adds this host's load.
    late = rep.lateness_s
    assert min(late) >= -0.01, late  # never early
    assert all(stamp_ns(m.sent) > 0 for m in arrived), "the replayer stamps every goal it sends"
    arrived.sort(key=lambda m: stamp_ns(m.sent))
    assert [key(m) for m in arrived] == [key(m) for m in sorted(original, key=lambda m: stamp_ns(m.stamp))]
    sent = [stamp_ns(m.sent) * 1e-9 for m in arrived]
    t_old = sorted(stamp_ns(m.stamp) * 1e-9 for m in original)  # the recording's arrival times
    for r, s, b, lt in zip(rep.results, sent, t_old, late, strict=True):
        assert abs((s - sent[0]) - ((b - t_old[0]) / speed + lt - late[0])) < 1e-3, (r.request, s - sent[0])
    for m in arrived:  # a goal cannot reach the planner before it left: checks the stamps against another clock
        assert stamp_ns(m.stamp) >= stamp_ns(m.sent) - 1_000_000, (m.robot_id, m.stamp, m.sent)
    for r in rep.results:  # the planner measured each served goal from its send stamp too; sent <= arrival
        if r.status == "done":
            assert r.response_time_from_send_s >= r.response_time_s - 1e-3, r
    stack.settle()


def test_recorder_node_starts_and_stops_by_service_and_parameter(stack, tmp_path):
    before = _readers_now(stack)  # the node subscribes at once; recording only opens a bag
    rec = RecorderNode(context=stack.ctx, parameter_overrides=[
        Parameter("output_dir", value=str(tmp_path)), Parameter("recording", value=False)])
    paths: list[str] = []
    latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    stack.client.create_subscription(String, "/recorder/bag_path", lambda m: paths.append(m.data), latched)
    srv = stack.client.create_client(SetBool, "/recorder/set_recording")
    stack.ex.add_node(rec)
    try:
        assert srv.wait_for_service(timeout_sec=10)
        assert not rec.recorder.recording

        def call(on: bool) -> SetBool.Response:
            fut = srv.call_async(SetBool.Request(data=on))
            assert _wait(fut.done, 10)
            return fut.result()

        r = call(True)
        assert r.success and rec.recorder.recording and r.message.startswith(str(tmp_path))
        first = r.message
        assert rec.recorder.wait_ready(5)
        assert _one_more_reader(stack, before)
        fut = stack.action.send_goal_async(PlanTask.Goal(robot_id="drone_2", robot_type="drone", task=CAT,
                                                         tuf=TimeUtility(level="urgent")))
        assert _wait(fut.done)
        res = fut.result().get_result_async()
        assert _wait(res.done, 30) and res.result().result.status == 0
        stack.settle()
        r = call(False)
        assert r.success and r.message == first and not rec.recorder.recording
        assert call(False).message.startswith("not recording")
        msgs = list(read_bag(first))
        assert [m.msg.task for m in msgs if m.topic == "/plan_requests"] == [CAT]
        assert len([m for m in msgs if m.topic == "/segment_done"]) == len(res.result().result.segments)
        # the parameter starts a second bag and stops it
        assert rec.set_parameters([Parameter("recording", value=True)])[0].successful
        second = str(rec.recorder.path)
        assert second != first and rec.recorder.recording
        assert rec.set_parameters([Parameter("recording", value=False)])[0].successful
        assert not rec.recorder.recording and (tmp_path / second).joinpath("metadata.yaml").is_file()
        assert not rec.set_parameters([Parameter("recording", value="yes")])[0].successful
        assert _wait(lambda: paths[-1:] == [second], 5), paths
    finally:
        stack.ex.remove_node(rec)
        rec.destroy_node()


def test_cli_record_in_its_own_process(stack, tmp_path):
    """`timelyllm bags record` records over DDS from another process and prints the bag path."""
    out = tmp_path / "cli_bag"
    before = _readers_now(stack)
    # Stopped with Ctrl-C once the task has ended, not after a fixed duration: on a busy machine a recorder
    # stopped by the clock could close its bag before the result arrived.
    proc = subprocess.Popen([sys.executable, "-m", "timelyllm_ros.cli", "bags", "record", "-o", str(out),
                             "--duration", "300"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # A liveness bound, not a speed figure: a fresh interpreter importing rclpy and rosbags on a loaded
        # machine took over 15 s to subscribe (the recorder exiting early fails at once instead).
        assert _one_more_reader(stack, before, 120, also=lambda: proc.poll() is not None), (
            "recorder never matched", before, _readers_now(stack),
            [(w.topic_name, w.get_subscription_count()) for w in _writers(stack)])
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.3)
        fut = stack.action.send_goal_async(PlanTask.Goal(robot_id="drone_1", robot_type="drone", task=BOOK,
                                                         tuf=TimeUtility(level="normal")))
        assert _wait(fut.done)
        res = fut.result().get_result_async()
        assert _wait(res.done, 30)
        stack.settle()
        proc.send_signal(signal.SIGINT)
        try:  # a liveness bound; on a timeout the recorder's threads are dumped (faulthandler on SIGUSR1)
            text, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            proc.kill()
            pytest.fail("the recorder did not stop within 120 s of Ctrl-C:\n" + proc.communicate()[0])
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, text
    assert f"bag: {out}" in text
    recs = records_from_bag(out)
    assert [(r.task_type, r.status) for r in recs] == [("book_on_cabinet", "done")]


def test_cli_replays_an_lrtrace_workload_and_records_it(stack, tmp_path):
    """`timelyllm bags replay <jobs.json> --record <bag>`: goals from another process, on time."""
    import json

    from timelyllm_ros.sim.workloads import load_trace

    wid2 = load_trace("drone-wid2")
    picked = [j for j in wid2.jobs if j.trace_id in (0, 5)][:3]
    jobs = []
    for i, j in enumerate(picked):  # three robots of the fleet, 0.4 s apart
        d = j.to_json()
        d.update({"job_id": i, "agent_id": i, "trigger time": 10.0 + 0.4 * i})
        jobs.append(d)
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    out, results = tmp_path / "replayed", tmp_path / "results.json"
    before = len(stack.seen("/plan_requests"))
    proc = subprocess.run(
        [sys.executable, "-m", "timelyllm_ros.cli", "bags", "replay", str(tmp_path / "jobs.json"), "--speed", "2",
         "--keep-task-ids", "--task-id-suffix=-cli",
         "--results", str(results), "--record", str(out), "--timeout", "60"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"bag: {out}" in proc.stdout
    rep = json.loads(results.read_text())
    assert rep["counts"] == {"done": 3}
    assert [r["task_id"] for r in rep["results"]] == ["j0-cli", "j1-cli", "j2-cli"]
    arrived = sorted(stack.seen("/plan_requests")[before:], key=lambda m: stamp_ns(m.sent))
    assert [(m.robot_id, m.task_id) for m in arrived] == [(f"drone_{i}", f"j{i}-cli") for i in range(3)]
    # judged where the goals left (their send stamps as the planner got them): 0.4 s / speed 2 apart, plus the
    # replayer's measured lateness (never early; how late a busy machine made it is not a test target)
    sent_s = [r["sent_s"] for r in rep["results"]]
    assert all(s >= 0.2 * i - 0.01 for i, s in enumerate(sent_s)), sent_s
    t = [stamp_ns(m.sent) * 1e-9 for m in arrived]
    assert [b - a for a, b in zip(t, t[1:], strict=False)] == pytest.approx(
        [b - a for a, b in zip(sent_s, sent_s[1:], strict=False)], abs=1e-3)
    assert all(stamp_ns(m.stamp) >= stamp_ns(m.sent) - 1_000_000 for m in arrived)  # none arrived before it left
    stack.settle()
    # the replayed run's own bag holds the three requests (its recorder matched before the first goal)
    assert [m.msg.task_id for m in read_bag(out, ["/plan_requests"])] == ["j0-cli", "j1-cli", "j2-cli"]
