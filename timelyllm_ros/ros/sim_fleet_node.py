"""A fleet of simulated robots: each executes its segments in order, taking a
duration sampled from the execution-time model, and reports SegmentDone.

Every segment is validated against the robot's skill set first (LLM output is
untrusted); one that does not parse is reported as failed, never executed. Only
the planner's segments run (``planner_node``, default ``planner`` in the fleet's namespace): the fleet
admits them through the executors' own :class:`~timelyllm_ros.ros.segment_gate.SegmentGate`,
so a rogue node's segment is neither run nor acknowledged here either.

Delivery contract, the real executors' own (``robot_endpoint.py``'s RobotEndpoint, the
writer check, acks, heartbeats and reports, and the same RobotSession): every received
copy of a segment is acknowledged on ``/segment_acks`` (silent robots too: acks
are the transport layer; "silent" only means no SegmentDone), and each robot's
:class:`~timelyllm_ros.transport.session.RobotSession` -- the one the executors
use -- drops duplicates, releases a task's segments by index, refuses the held
segments of a task whose gap (segment 0, typically) did not fill within
``reorder_timeout_s``, and runs one task at a time: segment 0 of a different
task while a task is active (its plan has not run to its end) preempts it. The
running segment then ends at once, reported failed with ``preempted by task
<id>`` and its real start; the queued ones never start (reported failed with a
zero start), and the old task's later segments are refused. A segment that
fails (it does not parse) ends its task, as on a real robot. An end marker
(is_final, empty text) is acknowledged, never run nor reported. The planner
sends a busy robot another task's segment 0 only when it preempts (scheduler
"one task per robot").
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

from timelyllm_ros.msg import PlanSegment
from timelyllm_ros.ros.params import all_of, declare, distinct, non_empty, on_change
from timelyllm_ros.ros.robot_endpoint import RobotEndpoint
from timelyllm_ros.ros.spin import run_nodes
from timelyllm_ros.ros.topics import DEFAULT_HEARTBEAT_PERIOD_S, PLANNER_NODE, in_fleet, is_end_marker
from timelyllm_ros.skills.exec_model import ExecTimeModel
from timelyllm_ros.skills.skill_files import load_skill_set
from timelyllm_ros.transport.inbox import DEFAULT_REORDER_TIMEOUT_S
from timelyllm_ros.transport.session import RobotSession

REPORTS_KEPT_FLEET = 16384  # reports kept for re-sent copies, over all the fleet's robots


@dataclass
class SimRobot:
    robot_id: str
    robot_type: str
    session: RobotSession  # dedup / order / hold, one task, preemption (the real executors' own)
    silent: bool = False  # never reports SegmentDone (tests the planner's fallback); still acknowledges
    busy_until: float | None = None
    # [task_id, index, text, start, finish, ok, is_final]
    executed: deque = field(default_factory=lambda: deque(maxlen=10000))
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
    """Parameters: ``robots``, ``robot_type``, ``seed``, ``reorder_timeout_s``, ``planner_node`` and
    ``fleet_key_file`` are read at start-up (read-only); ``time_scale`` and ``silent_robots`` can change at run time."""

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
        # relative by default: the fleet runs beside its planner, in the namespace it was launched in
        planner_node = str(declare(self, "planner_node", PLANNER_NODE.lstrip("/"), "name of the planner node whose "
                                   "segments the robots run, relative to this node's namespace unless it starts with "
                                   "'/' ('' = any node on the domain)", read_only=True))
        # the delivery contract's robot side (writer check, fleet key, acks, heartbeats, reports): the executors' own
        self.endpoint = RobotEndpoint(self, planner_node, topic=in_fleet)
        self.skillset = load_skill_set(robot_type)
        self.model = ExecTimeModel(self.skillset, learn=False)
        self.rng = random.Random(seed)
        kept = max(256, REPORTS_KEPT_FLEET // len(robots))  # the whole fleet's reports bounded, not each robot's
        self.robots = {r: SimRobot(r, robot_type, RobotSession(self.reorder_timeout_s, reports_kept=kept),
                                   silent=r in silent) for r in robots}
        self._lock = threading.Condition()
        for rob in self.robots.values():
            # No QoS event callbacks: with a hundred robots their waitables slow the whole executor.
            self.endpoint.subscribe(rob.robot_id, lambda m, now, rob=rob: self._received(rob, m, now), rob.acks,
                                    event_callbacks=SubscriptionEventCallbacks(use_default_callbacks=False))
        self.create_timer(min(0.1, self.reorder_timeout_s / 4), self._expire)  # held segments past the timeout
        self.endpoint.start_heartbeats(self.heartbeat_period_s, self._running_now)
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

    def _received(self, rob: SimRobot, msg: PlanSegment, now: float) -> None:
        """A copy the gate admitted (the endpoint acknowledges it after, silent robots too)."""
        with self._lock:
            arrival = self.endpoint.receive(rob.robot_id, rob.session, msg, now)
            if arrival.duplicate:
                return
            if arrival.preempted:
                self._stop_running(rob, arrival.preempted, now)
            for r in arrival.refused:
                self._refuse(rob, r.payload, r.reason, now)
            if rob.busy_until is None:
                self._start_next(rob, now)
            self._lock.notify()

    def _running_now(self) -> list[tuple[str, str, int]]:
        """Every robot running a segment, for the endpoint's heartbeat (silent robots too: they are alive, they only
        never report)."""
        with self._lock:
            return [(r.robot_id, r.executed[-1][0], r.executed[-1][1]) for r in self.robots.values()
                    if r.busy_until is not None]

    def _expire(self) -> None:
        now = time.time()
        with self._lock:
            for rob in self.robots.values():
                for r in rob.session.expire(now):
                    self._refuse(rob, r.payload, r.reason, now)

    def _refuse(self, rob: SimRobot, msg: PlanSegment, reason: str, now: float) -> None:
        """Never started: reported failed with a zero start."""
        if is_end_marker(msg.text, msg.is_final):
            return
        self.get_logger().warning(f"{rob.robot_id}: refused segment {msg.task_id}[{msg.segment_index}]: {reason}")
        self._report(rob, msg, None, now, False, reason)

    def _stop_running(self, rob: SimRobot, reason: str, now: float) -> None:
        """The active task was preempted (caller holds the lock): its running segment ends here, failed."""
        self.get_logger().warning(f"{rob.robot_id}: {reason}: stopping")
        if rob.busy_until is not None:  # its scheduled finish is void
            entry = rob.executed[-1]
            entry[4], entry[5] = now, False
            self._report(rob, entry, entry[3], now, False, reason)
            rob.busy_until = None

    def _start_next(self, rob: SimRobot, now: float) -> None:
        while (msg := rob.session.next()) is not None:
            if is_end_marker(msg.text, msg.is_final):  # every earlier segment has run: the plan is over
                rob.session.reached_end(msg.task_id)
                continue
            try:
                calls = self.skillset.parse(msg.text) if msg.text.strip() else []
            except ValueError as e:  # refuse: never execute what does not parse; the task ends here
                err = f"invalid segment: {e}"
                self.get_logger().warning(f"{rob.robot_id}: refused segment {msg.task_id}[{msg.segment_index}]: {e}")
                self._report(rob, msg, None, now, False, err)
                for r in rob.session.ran(msg.task_id, msg.segment_index, msg.is_final, False, err):
                    self._refuse(rob, r.payload, r.reason, now)
                continue
            dur = self.model.sample(calls, self.rng) * self.time_scale if calls else 0.0
            rob.busy_until = now + dur
            entry = [msg.task_id, msg.segment_index, msg.text, now, now + dur, True, msg.is_final]
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
        self.endpoint.report(rob.robot_id, rob.session, task_id, index, start, finish, ok, error)

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
                rob.session.ran(entry[0], entry[1], entry[6], True)
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
