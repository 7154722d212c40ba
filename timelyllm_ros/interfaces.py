"""Every name on the ROS graph: topics, services and the action, and the wire conventions that go with them.

Pure Python (no rclpy), so that the core, the bag tools and the robots' pure halves read the same names
as the nodes. ``ros/topics.py`` adds the QoS profiles; ``bags/typestore.py`` adds the message types.

The names are spelled as in the root namespace. A fleet's own nodes (planner, scheduler, exec_time, the
simulated fleet) and its clients (``plan_client``, PlanClient, replay) use them through :func:`in_fleet`, so a fleet
launched with ``namespace:=fleet_a`` lives under ``/fleet_a/`` (``/fleet_a/plan_task``,
``/fleet_a/drone_0/plan_segments``) and two fleets share one ROS domain without meeting. A robot's own names live
under ``/<robot_id>/``; the hardware executors, whose node namespace is the robot's, and the recorder (a bag's topic
names) use the absolute names: they serve the fleet in the root namespace.
"""

from __future__ import annotations

import re

# -- the planner's service ---------------------------------------------------------------------------------------
PLAN_TASK_ACTION = "/plan_task"  # PlanTask: a goal per task; feedback carries each segment
PLAN_SERVICE = "/plan"  # Plan: one call, the whole plan (no robot delivery)
GET_PLAN_RESULT_SERVICE = "/get_plan_result"  # GetPlanResult: how a task ended, for a client that lost its goal
ESTIMATE_EXEC_TIME_SERVICE = "/estimate_exec_time"  # EstimateExecTime (exec_time node)
PLANNER_NODE = "/planner"  # the planner node's default fully qualified name (executors accept segments only from it)

# -- fleet-wide topics -------------------------------------------------------------------------------------------
PLAN_REQUESTS = "/plan_requests"  # TaskRequest: every accepted goal (recorders, diagnostics)
ALL_SEGMENTS = "/plan_segments"  # PlanSegment: every segment sent to any robot (recorders, exec-time learning)
SEGMENT_DONE = "/segment_done"  # SegmentDone: robot reports
SEGMENT_ACKS = "/segment_acks"  # SegmentAck: receipt of each copy, and heartbeats while a segment runs
PLAN_RESULTS = "/plan_results"  # PlanResult: how each task ended
SCHEDULER_STATE = "/scheduler_state"  # SchedulerState telemetry
ENGINE_STATE = "/engine_state"  # EngineState telemetry
DIAGNOSTICS = "/diagnostics"  # diagnostic_msgs/DiagnosticArray
LRTRACE_JOBS = "/lrtrace/jobs"  # std_msgs/String: a converted LRTrace job record (bags only)

# Executors re-send the ack of the segment they run this often (SegmentAck.running): the planner's liveness signal.
DEFAULT_HEARTBEAT_PERIOD_S = 1.0


# -- one robot's names -------------------------------------------------------------------------------------------
def segment_topic(robot_id: str) -> str:
    """The robot's own segment topic (PlanSegment, RELIABLE, VOLATILE)."""
    return f"/{robot_id}/plan_segments"


def scene_topic(robot_id: str) -> str:
    """std_msgs/String: what the robot's simulated perception sees (emulated drones, simulated arms)."""
    return f"/{robot_id}/scene"


def trajectory_topic(robot_id: str) -> str:
    """trajectory_msgs/JointTrajectory: an arm executor's commands to its controller."""
    return f"/{robot_id}/joint_trajectory"


def trajectory_status_topic(robot_id: str) -> str:
    """std_msgs/Header: the arm controller's answer per trajectory (frame_id: the outcome)."""
    return f"/{robot_id}/trajectory_status"


def emergency_stop_service(robot_id: str) -> str:
    """std_srvs/Trigger: stop the robot now and refuse segments until reset."""
    return f"/{robot_id}/emergency_stop"


def reset_emergency_service(robot_id: str) -> str:
    """std_srvs/Trigger: accept segments again after an emergency stop."""
    return f"/{robot_id}/reset_emergency"


# -- a fleet in a namespace -------------------------------------------------------------------------------------
def in_fleet(name: str) -> str:
    """``name`` relative, as a fleet's node passes it to rclpy: rclpy resolves it in the node's namespace
    (``plan_task`` is ``/plan_task`` in the root namespace, ``/fleet_a/plan_task`` under ``-r __ns:=/fleet_a``)."""
    return name.lstrip("/")


# -- wire conventions --------------------------------------------------------------------------------------------
def is_end_marker(text: str, is_final: bool) -> bool:
    """An end-of-plan marker: is_final with no text (the plan ended after the previous segment)."""
    return is_final and not text


# rmw's RMW_TOPIC_MAX_NAME_LENGTH (255 - 8, room for the DDS prefix): the longest full topic name rcl accepts.
TOPIC_MAX_LEN = 247
_TOPIC_CHARS = re.compile(r"[^A-Za-z0-9_/]")


def robot_id_problem(robot_id: str) -> str | None:
    """Why ``robot_id`` cannot name its segment topic (:func:`segment_topic`) under rcl's topic-name rules,
    or None if it can. Checked when a goal is accepted: rcl would otherwise refuse the topic only when the
    planner creates its publisher, and the goal would fail as a planner error instead of being refused.
    Namespaced ids (``fleet_a/drone_0``) are fine; agrees with ``rclpy.validate_full_topic_name`` on
    ``segment_topic(robot_id)``."""
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
