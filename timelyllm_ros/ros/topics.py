"""QoS profiles beside the graph's names (``timelyllm_ros.interfaces``): the one module every node imports for
both (executors never import the planner).

Delivery contract (README, "Delivery guarantees"): segments travel RELIABLE
and VOLATILE on ``/<robot_id>/plan_segments``; the executor acknowledges each
one on ``/segment_acks`` and the planner re-sends it until it is
acknowledged, so a subscription that matches late, a dropped packet or a
restarted planner loses nothing. Executors drop duplicates by
(task_id, segment_index). VOLATILE (not TRANSIENT_LOCAL) on purpose: a
restarted executor must not be handed old plans from a history cache.
"""

from __future__ import annotations

from typing import Any

from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.qos import QoSDurabilityPolicy, QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy

# The names live in timelyllm_ros.interfaces (pure Python); nodes read them from here, beside their QoS.
from timelyllm_ros.interfaces import (  # noqa: F401 - re-exported
    ALL_SEGMENTS,
    DEFAULT_HEARTBEAT_PERIOD_S,
    DIAGNOSTICS,
    ENGINE_STATE,
    ESTIMATE_EXEC_TIME_SERVICE,
    GET_PLAN_RESULT_SERVICE,
    PLAN_REQUESTS,
    PLAN_RESULTS,
    PLAN_SERVICE,
    PLAN_TASK_ACTION,
    PLANNER_NODE,
    SCHEDULER_STATE,
    SEGMENT_ACKS,
    SEGMENT_DONE,
    TOPIC_MAX_LEN,
    emergency_stop_service,
    in_fleet,
    is_end_marker,
    reset_emergency_service,
    robot_id_problem,
    scene_topic,
    segment_topic,
    trajectory_status_topic,
    trajectory_topic,
)

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
SCENE_QOS = LATCHED  # a robot's scene: the latest one reaches an executor that starts later
# How tasks ended: a client whose action connection broke (or a planner that restarted) can still
# read its result; late-joining TRANSIENT_LOCAL subscribers get the recent ones.
RESULTS_QOS = QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.RELIABLE, history=QoSHistoryPolicy.KEEP_LAST,
                         durability=QoSDurabilityPolicy.TRANSIENT_LOCAL)
# Deep VOLATILE queues where a burst of hundreds of goals passes: the action and result clients, the planner's
# cancel service and feedback, recorders, live metrics, the diagnostics' readers of /plan_requests and
# /plan_results (VOLATILE there on purpose: results from before the reader existed are not the last minute's).
DEEP = QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.RELIABLE, history=QoSHistoryPolicy.KEEP_LAST,
                  durability=QoSDurabilityPolicy.VOLATILE)
# Goal and result requests a planner's reader holds before it takes them: a flood is answered, not lost (issue 39:
# 10,000 goals in 7.4 s; rclpy's default depth of 10 dropped them unanswered).
INTAKE_DEPTH = 16_384
INTAKE = QoSProfile(depth=INTAKE_DEPTH, reliability=QoSReliabilityPolicy.RELIABLE, history=QoSHistoryPolicy.KEEP_LAST)
# A recorder's reader of a best-effort topic (telemetry): what its publisher offers, a little deeper.
RECORD_BEST_EFFORT = QoSProfile(depth=50, reliability=QoSReliabilityPolicy.BEST_EFFORT,
                                history=QoSHistoryPolicy.KEEP_LAST)
# /diagnostics: RELIABLE + VOLATILE, what diagnostic_updater publishes with; readers of either reliability match.
DIAGNOSTICS_QOS = QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE, history=QoSHistoryPolicy.KEEP_LAST,
                             durability=QoSDurabilityPolicy.VOLATILE)


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
