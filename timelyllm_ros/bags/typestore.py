"""A rosbags typestore that knows our interfaces, and the topics a planner bag holds.

No rclpy here: bags are written and read with ``rosbags`` alone, so analysis
works on any machine. The types are registered from the package's own .msg
files, so the definitions embedded in a bag (and their RIHS01 hashes) are the
ones ``rosidl`` builds on a standard install.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

from timelyllm_ros import interfaces as names
from timelyllm_ros import paths

PACKAGE = "timelyllm_ros"


def msg_dir() -> Path:
    """Folder with our .msg files: an installed share/timelyllm_ros/msg first, else the package's share folder
    (the source tree in a checkout)."""
    candidates = [Path(p) / "share" / PACKAGE / "msg" for p in os.environ.get("AMENT_PREFIX_PATH", "").split(":") if p]
    for c in candidates:
        if (c / "TaskRequest.msg").is_file():
            return c
    c = paths.share_dir() / "msg"  # without a share folder this raises, naming where it looked
    candidates.append(c)
    if (c / "TaskRequest.msg").is_file():
        return c
    raise FileNotFoundError(f"{PACKAGE} message definitions not found; looked in {', '.join(map(str, candidates))}")


@cache
def typestore() -> Any:
    """ROS 2 Kilted standard types (Jazzy-compatible for everything we use) plus timelyllm_ros/msg/*."""
    ts = get_typestore(Stores.ROS2_KILTED)
    types: dict = {}
    for f in sorted(msg_dir().glob("*.msg")):
        types.update(get_types_from_msg(f.read_text(), f"{PACKAGE}/msg/{f.stem}"))
    ts.register(types)
    return ts


def msg_class(msgtype: str) -> Any:
    """The rosbags dataclass of ``msgtype`` (e.g. ``timelyllm_ros/msg/TaskRequest``)."""
    return typestore().types[msgtype]


def _qos(reliable: bool, depth: int) -> Qos:
    zero = QosTime(0, 0)  # 0 = the RMW default (infinite deadline / lifespan / lease)
    return Qos(QosHistory.KEEP_LAST, depth, QosReliability.RELIABLE if reliable else QosReliability.BEST_EFFORT,
               QosDurability.VOLATILE, zero, zero, QosLiveliness.AUTOMATIC, zero, False)


@dataclass(frozen=True)
class TopicSpec:
    """A recorded topic: name, type, and the QoS its publisher offers (``ros2 bag play`` republishes with it)."""

    name: str
    msgtype: str
    reliable: bool = True
    depth: int = 50

    @property
    def qos(self) -> Qos:
        return _qos(self.reliable, self.depth)


REQUESTS = TopicSpec(names.PLAN_REQUESTS, f"{PACKAGE}/msg/TaskRequest")
SEGMENTS = TopicSpec(names.ALL_SEGMENTS, f"{PACKAGE}/msg/PlanSegment")
SEGMENT_DONE = TopicSpec(names.SEGMENT_DONE, f"{PACKAGE}/msg/SegmentDone")
RESULTS = TopicSpec(names.PLAN_RESULTS, f"{PACKAGE}/msg/PlanResult")
SCHEDULER_STATE = TopicSpec(names.SCHEDULER_STATE, f"{PACKAGE}/msg/SchedulerState", reliable=False, depth=5)
ENGINE_STATE = TopicSpec(names.ENGINE_STATE, f"{PACKAGE}/msg/EngineState", reliable=False, depth=5)
# LRTrace side channel: the job record (JSON) of each request of a converted workload, so
# JSON -> bag -> JSON is lossless (trace id, agent id, measured skill times, exact trigger time).
LRTRACE_JOBS = TopicSpec(names.LRTRACE_JOBS, "std_msgs/msg/String")

# What the recorder takes by default: every goal (as a request), every segment fleet-wide,
# robot reports, how each task ended, and the two telemetry streams. The per-robot segment
# topics duplicate /plan_segments.
DEFAULT_TOPICS: tuple[TopicSpec, ...] = (REQUESTS, SEGMENTS, SEGMENT_DONE, RESULTS, SCHEDULER_STATE, ENGINE_STATE)
KNOWN_TOPICS: dict[str, TopicSpec] = {t.name: t for t in (*DEFAULT_TOPICS, LRTRACE_JOBS)}


def topic_spec(name: str, msgtype: str | None = None) -> TopicSpec:
    """Spec of a known topic, or a reliable one of ``msgtype``."""
    if name in KNOWN_TOPICS and msgtype in (None, KNOWN_TOPICS[name].msgtype):
        return KNOWN_TOPICS[name]
    if msgtype is None:
        raise ValueError(f"topic {name!r}: unknown; give its type (known: {sorted(KNOWN_TOPICS)})")
    return TopicSpec(name, msgtype)
