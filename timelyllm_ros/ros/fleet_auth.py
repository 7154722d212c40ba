"""The fleet key on the wire (``transport/fleet_key.py``): which fields of a PlanSegment, SegmentAck and SegmentDone
its tag covers, and the parameter every node that sends or takes them declares (``fleet_key_file``, '' = off).

A segment's tag covers every field a robot acts on (its text and skills, stamps and deadline included); an ack's and
a report's every field. The kind is part of what is signed, so one cannot pass for another; the robot id too, so
one robot's message cannot pass for another's. Replays are judged per robot id: a segment's sender is the planner
writing to that robot, an ack's or a report's the robot.
"""

from __future__ import annotations

from typing import Any

from timelyllm_ros.msg import PlanSegment, SegmentAck, SegmentDone
from timelyllm_ros.transport.fleet_key import FleetKey, load_key

PARAMETER = "fleet_key_file"
PARAMETER_DOC = ("file holding the fleet key (at least 16 bytes) that signs and checks every segment, ack and report "
                 "(HMAC-SHA256 and a counter against replays; README 'Threat model'); '' = off")


def _t(t: Any) -> list[int]:
    return [int(t.sec), int(t.nanosec)]


def _kind_and_fields(msg: Any) -> tuple[str, list[object]]:
    base: list[object] = [msg.task_id, msg.robot_id, int(msg.segment_index)]
    if isinstance(msg, PlanSegment):
        skills = [[s.name, s.long_name, s.raw, list(s.args), s.skillset_id] for s in msg.skills]
        return "segment", [*base, msg.text, skills, bool(msg.is_final), _t(msg.stamp_generated),
                           _t(msg.predicted_execution), _t(msg.next_segment_deadline)]
    if isinstance(msg, SegmentAck):
        return "ack", [*base, _t(msg.stamp), bool(msg.running)]
    if isinstance(msg, SegmentDone):
        return "report", [*base, _t(msg.start), _t(msg.finish), bool(msg.success), msg.error]
    raise TypeError(f"no fleet key fields for {type(msg).__name__}")


class FleetAuth:
    """Signs messages before they are published and checks them as they arrive; with no key, does neither."""

    def __init__(self, key: FleetKey | None) -> None:
        self.key = key

    @classmethod
    def from_file(cls, path: str) -> FleetAuth:
        """From parameter ``fleet_key_file`` ('' = off); ValueError names the parameter and the file."""
        return cls(FleetKey(load_key(path, PARAMETER)) if path else None)

    @property
    def on(self) -> bool:
        return self.key is not None

    def sign(self, msg: Any) -> Any:
        """``msg`` with its counter and tag set (a fresh counter each time: a message sent again is signed again)."""
        if self.key is not None:
            kind, fields = _kind_and_fields(msg)
            msg.auth_seq, msg.auth_tag = self.key.sign(kind, fields)
        return msg

    def check(self, msg: Any) -> str | None:
        """Why ``msg`` is refused, or None (always None with no key)."""
        if self.key is None:
            return None
        kind, fields = _kind_and_fields(msg)
        return self.key.check(kind, f"{kind}:{msg.robot_id}", fields, int(msg.auth_seq), msg.auth_tag)


__all__ = ["PARAMETER", "PARAMETER_DOC", "FleetAuth"]
