"""Which segments a robot runs: only those its planner wrote. Every executor node and the simulated fleet admit a
segment through one :class:`SegmentGate`, so the fleet that every demo and benchmark uses obeys no other node than
the real robots do (issue 39: a rogue ``PlanSegment mf(500)`` on ``/drone_1/plan_segments`` made the simulated
fleet heartbeat 17 times and report success).

The writer check: a segment counts only if its writer (the publisher GID rclpy hands the callback, looked up in the
ROS graph) belongs to the node named by ``planner_node`` ('' = any node). Anything else is neither run nor
acknowledged, counted for /diagnostics and logged once per writing node. A segment whose writer the graph does not
know yet is not acknowledged either: the planner re-sends what is really its own (delivery contract). Without DDS
security a node can take the planner's name: README "Threat model". With a fleet key (``fleet_key_file``,
``ros/fleet_auth.py``) a segment must also carry a valid tag and a counter not taken before: one that does not is
refused the same way, whoever wrote it, and logged once per reason.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from rclpy.node import Node

from timelyllm_ros.interfaces import segment_topic
from timelyllm_ros.ros.fleet_auth import FleetAuth

ADMIT, REFUSE, UNKNOWN_WRITER = "admit", "refuse", "unknown_writer"


class SegmentGate:
    """The writer check of one node that runs segments for ``robots`` (one executor: its own robot; the simulated
    fleet: all of its robots). ``log``: where the first refusal from each writer goes (the node's logger's error);
    ``debug``: the node's logger's debug; ``auth``: the fleet key (none: no tag is checked)."""

    KEEP_WRITERS = 256  # writers remembered (they come and go with restarts): the latest are kept

    def __init__(self, node: Node, planner_node: str, log: Callable[[str], Any], debug: Callable[[str], Any],
                 auth: FleetAuth | None = None) -> None:
        if planner_node and not planner_node.startswith("/"):  # relative: the planner of this node's namespace
            planner_node = f"{node.get_namespace().rstrip('/')}/{planner_node}"
        self._node, self.planner_node = node, planner_node
        self.auth = auth if auth is not None else FleetAuth(None)
        self._log, self._debug = log, debug
        self._senders: dict[bytes, str] = {}  # publisher GID -> its node's name, for writers the graph named
        self._lock = threading.Lock()
        self.refused = 0  # segments refused so far (/diagnostics)
        self._refused_at: deque[float] = deque(maxlen=1000)
        self._refused_from: set[str] = set()  # writers already logged (bounded by the writers the graph named)

    def check(self, robot_id: str, msg: Any, info: dict | None) -> str:
        """ADMIT, REFUSE (counted, logged once per writer) or UNKNOWN_WRITER (not yet in the graph: left for the
        planner's re-send). Call it from the subscription callback, before the segment is acknowledged."""
        why = self.auth.check(msg)
        if why is not None:
            self._refuse(robot_id, msg, f"fleet key: {why}", f"fleet key: {why.split(' (')[0]}")
            return REFUSE
        if not self.planner_node:
            return ADMIT
        sender = self._sender(robot_id, info)
        if sender == self.planner_node:
            return ADMIT
        if sender is None:
            self._debug(f"{robot_id}: {msg.task_id}[{msg.segment_index}] from a writer not yet in the graph: left "
                        "for the planner's re-send")
            return UNKNOWN_WRITER
        self._refuse(robot_id, msg, f"written by node {sender!r}: only {self.planner_node!r} (parameter "
                     "planner_node) plans for this robot", sender)
        return REFUSE

    def refused_recent(self, window_s: float) -> int:
        """Segments refused within the last ``window_s``."""
        since = time.monotonic() - window_s
        with self._lock:
            return sum(1 for t in self._refused_at if t >= since)

    def _sender(self, robot_id: str, info: dict | None) -> str | None:
        """The fully qualified name of the node that wrote a message (by its publisher GID), None if the graph
        does not know the writer yet."""
        gid = (info or {}).get("publisher_gid") or {}
        key = bytes(gid.get("data", b""))
        with self._lock:
            name = self._senders.get(key)
        if name is None:
            found = {bytes(ep.endpoint_gid): f"{ep.node_namespace.rstrip('/')}/{ep.node_name}"
                     for ep in self._node.get_publishers_info_by_topic(segment_topic(robot_id))}
            with self._lock:
                self._senders.update(found)
                name = self._senders.get(key)
                if len(self._senders) > self.KEEP_WRITERS:
                    for old in list(self._senders)[:self.KEEP_WRITERS // 2]:
                        del self._senders[old]
        return name

    def _refuse(self, robot_id: str, msg: Any, what: str, key: str) -> None:
        with self._lock:
            self.refused += 1
            self._refused_at.append(time.monotonic())
            first = key not in self._refused_from
            if first and len(self._refused_from) < 10_000:
                self._refused_from.add(key)
        if first:
            self._log(f"{robot_id}: refused segment {msg.task_id}[{msg.segment_index}]: {what}; further "
                      "ones like it are only counted")


__all__ = ["ADMIT", "REFUSE", "UNKNOWN_WRITER", "SegmentGate"]
