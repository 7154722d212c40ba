"""Topic names and QoS profiles: the one module every node imports (executors never import the planner).

Delivery contract (README, "Delivery guarantees"): segments travel RELIABLE
and VOLATILE on ``/<robot_id>/plan_segments``; the executor acknowledges each
one on ``/segment_acks`` and the planner re-sends it until it is
acknowledged, so a subscription that matches late, a dropped packet or a
restarted planner loses nothing. Executors drop duplicates by
(task_id, segment_index). VOLATILE (not TRANSIENT_LOCAL) on purpose: a
restarted executor must not be handed old plans from a history cache.
"""

from __future__ import annotations

import re
from typing import Any

from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.qos import QoSDurabilityPolicy, QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy

RELIABLE = QoSProfile(depth=50, reliability=QoSReliabilityPolicy.RELIABLE, history=QoSHistoryPolicy.KEEP_LAST)
# Robot reports and acknowledgements: a burst of 1000 goals must not overflow a history.
REPORTS = QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.RELIABLE, history=QoSHistoryPolicy.KEEP_LAST)
# The planner's readers of reports and acknowledgements: a deep KEEP_LAST, so a busy planner's history does not
# drop a report before it was taken (a dropped report makes a healthy robot look silent). Not KEEP_ALL: a full
# KEEP_ALL reader pushes back on the robots' writers until their publish() fails.
REPORTS_IN = QoSProfile(depth=20000, reliability=QoSReliabilityPolicy.RELIABLE, history=QoSHistoryPolicy.KEEP_LAST)
# Robot reports (SegmentDone) as written: the writer keeps its last 1000 for late-joining TRANSIENT_LOCAL readers.
# A robot runs a segment as soon as its *segment reader* has matched the planner, which says nothing of whether
# its report writer has matched a monitor yet (discovery is per endpoint pair): a VOLATILE monitor (a test's
# witness, the demo's metrics) could miss the first report. The planner reads VOLATILE (REPORTS_IN; it needs no
# history: a segment it re-sends is answered with the cached report) and is compatible with this writer.
REPORTS_KEPT = QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.RELIABLE, history=QoSHistoryPolicy.KEEP_LAST,
                          durability=QoSDurabilityPolicy.TRANSIENT_LOCAL)
TELEMETRY = QoSProfile(depth=5, reliability=QoSReliabilityPolicy.BEST_EFFORT, history=QoSHistoryPolicy.KEEP_LAST)
LATCHED = QoSProfile(depth=1, reliability=QoSReliabilityPolicy.RELIABLE,
                     durability=QoSDurabilityPolicy.TRANSIENT_LOCAL)
# How tasks ended: a client whose action connection broke (or a planner that restarted) can still
# read its result; late-joining TRANSIENT_LOCAL subscribers get the recent ones.
RESULTS_QOS = QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.RELIABLE, history=QoSHistoryPolicy.KEEP_LAST,
                         durability=QoSDurabilityPolicy.TRANSIENT_LOCAL)

PLAN_TASK_ACTION = "/plan_task"
PLAN_SERVICE = "/plan"
GET_PLAN_RESULT_SERVICE = "/get_plan_result"
ALL_SEGMENTS = "/plan_segments"
SEGMENT_DONE = "/segment_done"
SEGMENT_ACKS = "/segment_acks"
PLAN_REQUESTS = "/plan_requests"
PLAN_RESULTS = "/plan_results"
# Executors re-send the ack of the segment they run this often (SegmentAck.running): the planner's liveness signal.
DEFAULT_HEARTBEAT_PERIOD_S = 1.0


def publish_or_log(pub: Any, msg: Any, logger: Any, what: str) -> bool:
    """Publish a message the delivery protocol sends again if it is lost (a segment, an ack, a robot report).

    A RELIABLE writer whose history is full of unacknowledged samples fails ``publish()`` on a loaded host
    (seen: a fleet process's report writer). Raised inside a subscription callback that kills the whole node;
    logged, the planner re-sends the segment and the robot answers with its cached report."""
    try:
        pub.publish(msg)
        return True
    except _rclpy.RCLError as e:
        logger.warning(f"could not publish {what} ({e}); it is sent again by the delivery protocol")
        return False


def segment_topic(robot_id: str) -> str:
    """Per-robot segment topic: /<robot_id>/plan_segments."""
    return f"/{robot_id}/plan_segments"


# rmw's RMW_TOPIC_MAX_NAME_LENGTH (255 - 8, room for the DDS prefix): the longest full topic name rcl accepts.
TOPIC_MAX_LEN = 247
_TOPIC_CHARS = re.compile(r"[^A-Za-z0-9_/]")


def robot_id_problem(robot_id: str) -> str | None:
    """Why ``robot_id`` cannot name its segment topic (:func:`segment_topic`) under rcl's topic-name rules,
    or None if it can. Checked when a goal is accepted: rcl would otherwise refuse the topic only when the
    planner creates its publisher, and the goal would fail as a planner error instead of being refused.
    Namespaced ids (``fleet_a/drone_0``) are fine; pure (no ROS needed), agreeing with
    ``rclpy.validate_full_topic_name`` on ``segment_topic(robot_id)``."""
    if not robot_id:
        return "must not be empty"
    bad = _TOPIC_CHARS.search(robot_id)
    if bad:
        return (f"{robot_id!r} has {bad.group()!r} at position {bad.start()}: a ROS topic name takes only ASCII "
                f"letters, digits, '_' and '/' between names")
    for name in robot_id.split("/"):
        if not name:
            return f"{robot_id!r} must not start or end with '/' nor hold '//' (an empty name in a ROS topic)"
        if name[0].isdigit():
            return f"{robot_id!r}: {name!r} starts with a digit; a name in a ROS topic starts with a letter or '_'"
    topic = segment_topic(robot_id)
    if len(topic) > TOPIC_MAX_LEN:
        return (f"{len(robot_id)} characters: its topic {topic[:40]}... would be {len(topic)} characters, more "
                f"than ROS allows ({TOPIC_MAX_LEN})")
    return None


def is_end_marker(text: str, is_final: bool) -> bool:
    """An end-of-plan marker: is_final with no text (the plan ended after the previous segment)."""
    return is_final and not text
