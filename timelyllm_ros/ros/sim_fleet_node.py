"""A fleet of simulated robots: each executes its segments in order, taking a
duration sampled from the execution-time model, and reports SegmentDone.

Every segment is validated against the robot's skill set first (LLM output is
untrusted); one that does not parse is reported as failed, never executed.

Delivery contract, as the real executors (``executor_base.py``): every received
copy of a segment is acknowledged on ``/segment_acks`` (silent robots too: acks
are the transport layer; "silent" only means no SegmentDone), and one
:class:`~timelyllm_ros.robots.inbox.SegmentInbox` per robot drops duplicates,
releases a task's segments by index and refuses the held segments of a task
whose gap (segment 0, typically) did not fill within ``reorder_timeout_s``. An
end marker (is_final, empty text) is acknowledged, never run nor reported.

One task per robot, as the real executors: segments run in the order they are
released, and segment 0 of a different task while a task is still active (a
segment running or queued, or its plan not yet ended) preempts it: the running
segment ends at once, reported failed with ``preempted by task <id>`` and its
real start; the queued ones never start (reported failed with a zero start),
and the old task's later segments are refused. The planner sends a busy robot
another task's segment 0 only when it preempts (scheduler "one task per robot").
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.node import Node

from timelyllm_ros.msg import PlanSegment, SegmentAck, SegmentDone
from timelyllm_ros.robots.inbox import DEFAULT_REORDER_TIMEOUT_S, ReportCache, SegmentInbox
from timelyllm_ros.ros.convert import segment_ack_msg, segment_done_msg
from timelyllm_ros.ros.params import all_of, declare, distinct, non_empty, on_change
from timelyllm_ros.ros.spin import run_nodes
from timelyllm_ros.ros.topics import (
    DEFAULT_HEARTBEAT_PERIOD_S,
    RELIABLE,
    REPORTS,
    REPORTS_KEPT,
    SEGMENT_ACKS,
    SEGMENT_DONE,
    is_end_marker,
    publish_or_log,
    segment_topic,
)
from timelyllm_ros.skills.exec_model import ExecTimeModel
from timelyllm_ros.skills.schema import load_skill_set


@dataclass
class SimRobot:
    robot_id: str
    robot_type: str
    silent: bool = False  # never reports SegmentDone (tests the planner's fallback); still acknowledges
    inbox: SegmentInbox = field(default_factory=SegmentInbox)  # dedup / order / hold
    queue: deque = field(default_factory=deque)  # released segments, in order
    busy_until: float | None = None
    task: str | None = None  # the task it runs (its latest segment 0)
    task_open: bool = False  # that task's plan has not ended (no final segment or end marker released yet)
    executed: deque = field(default_factory=lambda: deque(maxlen=10000))  # [task_id, index, text, start, finish, ok]
    acks: deque = field(default_factory=lambda: deque(maxlen=10000))  # (task_id, index) acknowledged


def _known_skill_set(robot_type: str) -> str | None:
    try:
        load_skill_set(robot_type)
    except (OSError, ValueError) as e:
        return f"no skill set {robot_type!r}: {e}"
    return None


def _subset(ids: list[str], robots: list[str]) -> str | None:
    unknown = sorted(set(ids) - {""} - set(robots))
    return f"unknown robot(s) {unknown}; robots are {robots}" if unknown else None


class SimFleetNode(Node):
    """Parameters: ``robots``, ``robot_type``, ``seed`` and ``reorder_timeout_s`` are read at start-up
    (read-only); ``time_scale`` and ``silent_robots`` can change at run time."""

    def __init__(self, node_name: str = "sim_fleet", **kw) -> None:
        super().__init__(node_name, **kw)
        robots = list(declare(self, "robots", ["drone_0", "drone_1", "drone_2"], "simulated robot ids (each "
                              "listens on /<robot_id>/plan_segments)", read_only=True,
                              check=all_of(non_empty, distinct), constraints="non-empty, distinct"))
        robot_type = declare(self, "robot_type", "drone", "skill set of every robot (skills/<robot_type>.yaml)",
                             read_only=True, check=_known_skill_set, constraints="a skill set in skills/")
        silent = set(declare(self, "silent_robots", [""], "robots that acknowledge segments but never report "
                             "SegmentDone (tests the planner's robot_timeout_s); [''] = none",
                             check=lambda v: _subset(v, robots), constraints="ids from robots")) - {""}
        self.time_scale = float(declare(self, "time_scale", 1.0, "sampled execution times are multiplied by this "
                                        "(< 1: faster than real time); applies to segments started after a change",
                                        above=0.0))
        seed = int(declare(self, "seed", 0, "seed of the sampled execution times", read_only=True))
        self.reorder_timeout_s = float(declare(
            self, "reorder_timeout_s", float(DEFAULT_REORDER_TIMEOUT_S), "seconds an early segment waits for the "
            "missing ones before it, then it is refused (default: the planner's delivery_timeout_s)",
            read_only=True, above=0.0))
        self.heartbeat_period_s = float(declare(
            self, "heartbeat_period_s", DEFAULT_HEARTBEAT_PERIOD_S, "while a robot runs a segment, its ack is "
            "re-sent with running=true this often, as the real executors do (0 = off)", read_only=True, min=0.0))
        self.skillset = load_skill_set(robot_type)
        self.model = ExecTimeModel(self.skillset, learn=False)
        self.rng = random.Random(seed)
        self.robots = {r: SimRobot(r, robot_type, silent=r in silent, inbox=SegmentInbox(self.reorder_timeout_s))
                       for r in robots}
        self._done_pub = self.create_publisher(SegmentDone, SEGMENT_DONE, REPORTS_KEPT)
        self._reports = ReportCache(max_entries=16384)
        self._ack_pub = self.create_publisher(SegmentAck, SEGMENT_ACKS, REPORTS)
        self._lock = threading.Condition()
        for r in robots:
            # No QoS event callbacks: with a hundred robots their waitables slow the whole executor.
            self.create_subscription(PlanSegment, segment_topic(r), lambda m, r=r: self._received(r, m), RELIABLE,
                                     event_callbacks=SubscriptionEventCallbacks(use_default_callbacks=False))
        self.create_timer(min(0.1, self.reorder_timeout_s / 4), self._expire)  # held segments past the timeout
        if self.heartbeat_period_s > 0:
            self.create_timer(self.heartbeat_period_s, self._heartbeat)
        self._events: list[tuple[float, str]] = []  # (finish wall time, robot id)
        self._stop = False
        self._worker = threading.Thread(target=self._run, name="sim-fleet", daemon=True)
        self._worker.start()
        on_change(self, {"time_scale": self._set_time_scale, "silent_robots": self._set_silent})
        self.get_logger().info(f"{len(robots)} simulated {robot_type} robots: {', '.join(robots)}")

    def _set_time_scale(self, value: float) -> None:
        with self._lock:
            self.time_scale = float(value)

    def _set_silent(self, value: list[str]) -> None:
        with self._lock:
            for rob in self.robots.values():
                rob.silent = rob.robot_id in value

    def _received(self, robot_id: str, msg: PlanSegment) -> None:
        now = time.time()
        rob = self.robots[robot_id]
        try:
            with self._lock:
                if rob.inbox.is_duplicate(msg.task_id, msg.segment_index):
                    report = self._reports.get(msg.task_id, msg.segment_index)
                    if report is not None:  # re-sent: the planner has no report for it (e.g. it restarted)
                        publish_or_log(self._done_pub, report, self.get_logger(),
                                       f"{robot_id}'s report of {msg.task_id}[{msg.segment_index}]")
                    return
                for seg in rob.inbox.offer(msg.task_id, msg.segment_index, msg.text, msg.is_final, now, payload=msg):
                    if seg.refused:
                        self._refuse(rob, msg=seg.payload, reason=seg.refused, now=now)
                        continue
                    if seg.task_id != rob.task:
                        if seg.index > 0:  # the inbox releases k > 0 only after 0: the task was replaced
                            reason = f"segment {seg.index} of task {seg.task_id}, which this robot no longer runs"
                            self._refuse(rob, seg.payload, reason, now)
                            for old in rob.inbox.end_task(seg.task_id, reason):
                                self._refuse(rob, old.payload, old.refused, now)
                            continue
                        if seg.is_end_marker:  # an empty plan: nothing to run, nothing to preempt
                            continue
                        self._preempt(rob, seg.task_id, now)
                        rob.task, rob.task_open = seg.task_id, True
                    if seg.is_final:
                        rob.task_open = False
                    if not seg.is_end_marker:  # a marker only ends the plan: nothing to run or report
                        rob.queue.append(seg.payload)
                if rob.busy_until is None:
                    self._start_next(rob, now)
                self._lock.notify()
        finally:  # every received copy, duplicates and end markers included (silent robots too)
            rob.acks.append((msg.task_id, msg.segment_index))
            ack = segment_ack_msg(msg.task_id, robot_id, msg.segment_index, now)
            publish_or_log(self._ack_pub, ack, self.get_logger(),
                           f"{robot_id}'s ack of {msg.task_id}[{msg.segment_index}]")

    def _heartbeat(self) -> None:
        """Every robot that is running a segment says so (silent robots too: they are alive, they only never
        report)."""
        now = time.time()
        with self._lock:
            running = [(r.robot_id, r.executed[-1][0], r.executed[-1][1]) for r in self.robots.values()
                       if r.busy_until is not None]
        for robot_id, task_id, index in running:
            publish_or_log(self._ack_pub, segment_ack_msg(task_id, robot_id, index, now, running=True),
                           self.get_logger(), f"{robot_id}'s heartbeat of {task_id}[{index}]")

    def _expire(self) -> None:
        now = time.time()
        with self._lock:
            for rob in self.robots.values():
                for seg in rob.inbox.expired(now):
                    self._refuse(rob, seg.payload, seg.refused, now)

    def _refuse(self, rob: SimRobot, msg: PlanSegment, reason: str, now: float) -> None:
        """Never started: reported failed with a zero start."""
        if is_end_marker(msg.text, msg.is_final):
            return
        self.get_logger().warning(f"{rob.robot_id}: refused segment {msg.task_id}[{msg.segment_index}]: {reason}")
        self._report(rob, msg, None, now, False, reason)

    def _preempt(self, rob: SimRobot, new_task: str, now: float) -> None:
        """Segment 0 of ``new_task`` while another task is active: stop now (caller holds the lock)."""
        if rob.task is None or not (rob.task_open or rob.queue or rob.busy_until is not None):
            return
        reason = f"preempted by task {new_task}"
        self.get_logger().warning(f"{rob.robot_id}: task {rob.task} {reason}: stopping")
        for old in rob.inbox.end_task(rob.task, reason):
            self._refuse(rob, old.payload, old.refused, now)
        if rob.busy_until is not None:  # the running segment ends here, failed; its scheduled finish is void
            entry = rob.executed[-1]
            entry[4], entry[5] = now, False
            self._report(rob, entry, entry[3], now, False, reason)
            rob.busy_until = None
        while rob.queue:
            self._refuse(rob, rob.queue.popleft(), reason, now)

    def _start_next(self, rob: SimRobot, now: float) -> None:
        while rob.queue:
            msg = rob.queue.popleft()
            try:
                calls = self.skillset.parse(msg.text) if msg.text.strip() else []
            except ValueError as e:  # refuse: never execute what does not parse
                self.get_logger().warning(f"{rob.robot_id}: refused segment {msg.task_id}[{msg.segment_index}]: {e}")
                self._report(rob, msg, None, now, False, f"invalid segment: {e}")
                continue
            dur = self.model.sample(calls, self.rng) * self.time_scale if calls else 0.0
            rob.busy_until = now + dur
            entry = [msg.task_id, msg.segment_index, msg.text, now, now + dur, True]
            rob.executed.append(entry)
            heapq.heappush(self._events, (now + dur, rob.robot_id, id(entry)))
            return
        rob.busy_until = None

    def _report(self, rob: SimRobot, msg_or_entry, start: float | None, finish: float, ok: bool,
                error: str = "") -> None:
        """``start`` None: never started (a zero stamp on the wire)."""
        if rob.silent:
            return
        task_id = msg_or_entry.task_id if isinstance(msg_or_entry, PlanSegment) else msg_or_entry[0]
        index = msg_or_entry.segment_index if isinstance(msg_or_entry, PlanSegment) else msg_or_entry[1]
        report = segment_done_msg(task_id, rob.robot_id, index, start, finish, ok, error)
        self._reports.put(task_id, index, report)
        publish_or_log(self._done_pub, report, self.get_logger(), f"{rob.robot_id}'s report of {task_id}[{index}]")

    def _run(self) -> None:
        with self._lock:
            while not self._stop:
                if not self._events:
                    self._lock.wait(0.5)
                    continue
                t, rid, key = self._events[0]
                now = time.time()
                if t > now:
                    self._lock.wait(t - now)
                    continue
                heapq.heappop(self._events)
                rob = self.robots[rid]
                entry = rob.executed[-1]
                if id(entry) != key or not entry[5]:
                    continue  # preempted: already reported, and the robot moved on
                self._report(rob, entry, entry[3], entry[4], True)
                self._start_next(rob, now)

    def destroy_node(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()
        self._worker.join(timeout=2)
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    return run_nodes(lambda: [SimFleetNode()], args)


if __name__ == "__main__":
    import sys

    sys.exit(main())
