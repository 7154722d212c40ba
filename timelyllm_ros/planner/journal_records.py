"""The journal's record of a finished task, to and from the core's :class:`TaskResult` (pure Python): what a
restarted planner answers a retry or a result query with."""

from __future__ import annotations

from timelyllm_ros.domain.types import TaskResult, TaskStatus


def status_of_record(rec: dict) -> TaskStatus:
    """The terminal status of a journaled result; journals from before OVERDUE was split from INVALID
    wrote the overdue policy's refusals as "rejected"."""
    name = rec.get("status", "")
    if name == "rejected":
        return TaskStatus.OVERDUE
    try:
        return TaskStatus(name)
    except ValueError:
        return TaskStatus.FAILED


def result_record(res: TaskResult) -> dict:
    key = res.meta.get("request_key")
    return {"task_id": res.task_id, "robot_id": res.robot_id, "robot_type": res.robot_type,
            "status": res.status.value, "message": res.reason, "plan_text": res.plan,
            "num_segments": len(res.segments), "response_time": res.response_time,
            "response_time_from_send": res.response_time_from_send, "utility": res.utility,
            "request_key": list(key) if key is not None else None}


def task_result_from_record(task_id: str, rec: dict) -> TaskResult:
    """A journaled result (from before a restart) as a TaskResult; its segments are not journaled with it."""
    key = rec.get("request_key")
    return TaskResult(task_id=task_id, robot_id=rec.get("robot_id", ""),
                      status=status_of_record(rec),
                      plan=rec.get("plan_text", ""), segments=[], response_time=rec.get("response_time"),
                      utility=rec.get("utility"),
                      reason=rec.get("message", ""), meta={"request_key": tuple(key) if key else None},
                      robot_type=rec.get("robot_type", "drone"),
                      response_time_from_send=rec.get("response_time_from_send"))
