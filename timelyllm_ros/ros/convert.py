"""Conversions between core types and ROS 2 messages (the only place that knows both)."""

from __future__ import annotations

import math
import time

from builtin_interfaces.msg import Duration, Time

from timelyllm_ros.action import PlanTask
from timelyllm_ros.engines.base import EngineStats
from timelyllm_ros.engines.pool import MemberStats, PoolStats
from timelyllm_ros.measure.records import result_robot_waiting
from timelyllm_ros.model.tuf import LEVELS, TimeUtility
from timelyllm_ros.model.types import STATUS_CODE, STATUS_FROM_CODE, TaskResult, TaskSpec, TaskStatus
from timelyllm_ros.msg import EngineMember, PlanResult, PlanSegment, SegmentAck, SegmentDone, SkillCall
from timelyllm_ros.msg import TimeUtility as TimeUtilityMsg
from timelyllm_ros.sched.journal_records import status_of_record


def nan_if_none(x: float | None) -> float:
    return float(x) if x is not None else math.nan


def duration_msg(seconds: float) -> Duration:
    seconds = max(0.0, float(seconds)) if math.isfinite(seconds) else 0.0
    sec = int(seconds)
    return Duration(sec=sec, nanosec=int(round((seconds - sec) * 1e9)) % 1_000_000_000)


def duration_s(d: Duration) -> float:
    return d.sec + d.nanosec * 1e-9


def time_msg(wall_seconds: float) -> Time:
    wall_seconds = max(0.0, wall_seconds)
    sec = int(wall_seconds)
    return Time(sec=sec, nanosec=int((wall_seconds - sec) * 1e9))


def time_s(t: Time) -> float:
    return t.sec + t.nanosec * 1e-9


def segment_done_msg(task_id: str, robot_id: str, index: int, start: float | None, finish: float, ok: bool,
                     error: str) -> SegmentDone:
    """A robot's report of one segment; ``start`` None: it never started (a zero stamp on the wire, which
    :func:`started` reads back)."""
    return SegmentDone(task_id=task_id, robot_id=robot_id, segment_index=index,
                       start=time_msg(start) if start is not None else Time(), finish=time_msg(finish),
                       success=ok, error=error)


def segment_ack_msg(task_id: str, robot_id: str, index: int, stamp: float, *, running: bool = False) -> SegmentAck:
    """A robot's acknowledgement of a received segment; ``running``: a heartbeat of the segment it executes now."""
    return SegmentAck(task_id=task_id, robot_id=robot_id, segment_index=index, stamp=time_msg(stamp), running=running)


def started(t: Time) -> bool:
    """A report's start stamp is set: the robot started the segment (refused or dropped ones carry zero)."""
    return bool(t.sec or t.nanosec)


def _clock_pair(tries: int = 5) -> tuple[float, float]:
    """(monotonic, wall) read as nearly at once as this host allows: the wall reading bracketed by two
    monotonic ones, the narrowest bracket of ``tries``, monotonic taken at its middle."""
    best: tuple[float, float, float] | None = None
    for _ in range(tries):
        m0 = time.monotonic()
        w = time.time()
        m1 = time.monotonic()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, (m0 + m1) / 2, w)
    return best[1], best[2]


class ClockBridge:
    """Maps the core's monotonic clock to ROS (wall) time stamps and back.

    The core schedules on a monotonic clock; messages carry wall time. The
    offset is taken once, so both directions agree to the nanosecond. It is
    read between two monotonic readings, the tightest of a few tries: a thread
    preempted between the two clock reads (a busy host: milliseconds) would
    otherwise shift every stamp by that much (seen: a bag's reception time
    1.6 ms before the planner's arrival stamp).
    """

    def __init__(self, core_now: float | None = None, wall_now: float | None = None) -> None:
        if core_now is None and wall_now is None:
            core_now, wall_now = _clock_pair()
        else:
            core_now = time.monotonic() if core_now is None else core_now
            wall_now = time.time() if wall_now is None else wall_now
        self.offset = wall_now - core_now

    def to_msg(self, core_t: float | None) -> Time:
        return Time() if core_t is None else time_msg(core_t + self.offset)

    def to_core(self, t: Time) -> float:
        return time_s(t) - self.offset

    def to_wall(self, core_t: float | None) -> float | None:
        return None if core_t is None else core_t + self.offset

    def to_core_s(self, wall_s: float) -> float:
        return wall_s - self.offset


def status_code(status: TaskStatus) -> int:
    """The STATUS_* code of PlanResult / PlanTask.Result for a terminal status (model.types.STATUS_CODE);
    a status that is not terminal never reaches a robot as success: it reads as FAILED."""
    return STATUS_CODE.get(status, STATUS_CODE[TaskStatus.FAILED])


def status_from_code(code: int) -> TaskStatus | None:
    """The TaskStatus of a PlanResult / PlanTask.Result code; None for a code this build does not know."""
    return STATUS_FROM_CODE.get(int(code))


def status_name(code: int) -> str:
    """A result code as its TaskStatus value ("done", "invalid", "overdue", ...); an unknown code as its number."""
    st = status_from_code(code)
    return st.value if st is not None else str(code)


def tuf_from_msg(msg: TimeUtilityMsg) -> TimeUtility:
    """Named level (fields left at 0 take the level's values) or custom alpha/beta/ert.

    Raises ValueError naming the field on bad input (NaN, wrong sign, unknown level).
    """
    for name in ("alpha", "beta", "ert"):
        if not math.isfinite(getattr(msg, name)):
            raise ValueError(f"tuf.{name} must be a finite number, got {getattr(msg, name)}")
    level = msg.level.strip()
    if level:
        if level not in LEVELS:
            raise ValueError(f"tuf.level: unknown urgency level {level!r}; known: {sorted(LEVELS)} or '' for custom")
        base = LEVELS[level]
        return TimeUtility(alpha=msg.alpha or base.alpha, beta=msg.beta or base.beta,
                           ert=msg.ert or base.ert, level=level)
    try:
        return TimeUtility(alpha=msg.alpha, beta=msg.beta, ert=msg.ert, level="custom")
    except ValueError as e:
        raise ValueError(f"tuf: {e} (or set tuf.level to one of {sorted(LEVELS)})") from None


def tuf_to_msg(tuf: TimeUtility) -> TimeUtilityMsg:
    return TimeUtilityMsg(level=tuf.level if tuf.level in LEVELS else "", alpha=tuf.alpha, beta=tuf.beta,
                          ert=tuf.ert)


def skill_call_msg(call, skillset_id: str) -> SkillCall:
    args = getattr(call, "args", ())
    return SkillCall(name=getattr(call, "name", ""), long_name=getattr(call, "long_name", "") or "",
                     raw=getattr(call, "raw", "") or "", args=[_arg_text(a) for a in args],
                     skillset_id=getattr(call, "skillset_id", "") or skillset_id)


def _arg_text(a) -> str:
    return repr(a) if isinstance(a, str) else str(a)


def segment_msg(task_id: str, robot_id: str, seg, bridge: ClockBridge, skillset_id: str) -> PlanSegment:
    """A core Segment as a PlanSegment message."""
    return PlanSegment(
        task_id=task_id, robot_id=robot_id, segment_index=seg.index, text=seg.text,
        skills=[skill_call_msg(c, skillset_id) for c in seg.calls], is_final=bool(seg.final),
        stamp_generated=bridge.to_msg(seg.ready), predicted_execution=duration_msg(seg.est_exec_s),
        next_segment_deadline=bridge.to_msg(seg.pred_end),
    )


def pool_members(stats: EngineStats) -> tuple[MemberStats, ...]:
    """An engine pool's members (none for a single engine)."""
    return stats.members if isinstance(stats, PoolStats) else ()


def engine_member_msg(m: MemberStats) -> EngineMember:
    """One pool member as an EngineMember message (NaN where a member that is down has no figure)."""
    st = m.stats
    return EngineMember(
        index=m.index, name=m.name, backend=m.backend, up=m.up, down_reason=m.down_reason, running=m.owned,
        waiting=int(st.waiting) if st is not None else 0, max_batch=m.max_batch,
        step_time_s=nan_if_none(m.step_time_s),
        kv_cache_usage=float(st.kv_cache_usage) if st is not None else math.nan,
        failovers=m.failovers, rejoins=m.rejoins)


# -- results: the core's TaskResult and the journal's record of one, as messages ---------------------------------
def result_msg(res: TaskResult, bridge: ClockBridge, skillset_id: str) -> PlanTask.Result:
    """The PlanTask action's result: the plan and every segment the robot was sent."""
    return PlanTask.Result(
        status=status_code(res.status), message=res.reason or res.status.value, task_id=res.task_id,
        plan_text=res.plan,
        segments=[segment_msg(res.task_id, res.robot_id, s, bridge, skillset_id) for s in res.segments],
        response_time=duration_msg(res.response_time if res.response_time is not None else 0.0),
        response_time_from_send=nan_if_none(res.response_time_from_send),
        robot_waiting_time=duration_msg(result_robot_waiting(res)), utility=nan_if_none(res.utility))


def plan_result_msg(res: TaskResult, stamp: Time) -> PlanResult:
    """How a task ended, on /plan_results and from /get_plan_result."""
    return PlanResult(
        stamp=stamp, task_id=res.task_id, robot_id=res.robot_id,
        status=status_code(res.status), message=res.reason or res.status.value, plan_text=res.plan,
        num_segments=len(res.segments), response_time=duration_msg(res.response_time or 0.0),
        response_time_from_send=nan_if_none(res.response_time_from_send), utility=nan_if_none(res.utility))


def plan_result_from_record(rec: dict) -> PlanResult:
    """A journaled result (from before a restart) as the message that says how its task ended."""
    status = status_of_record(rec)
    return PlanResult(task_id=rec.get("task_id", ""), robot_id=rec.get("robot_id", ""),
                      status=status_code(status),
                      message=rec.get("message") or status.value, plan_text=rec.get("plan_text", ""),
                      num_segments=int(rec.get("num_segments", 0)),
                      response_time=duration_msg(rec.get("response_time") or 0.0),
                      response_time_from_send=nan_if_none(rec.get("response_time_from_send")),
                      utility=nan_if_none(rec.get("utility")))


def spec_record(spec: TaskSpec, tuf_msg, bridge: ClockBridge) -> dict:
    """The request as the robot sent it (the TUF fields as given, so a retry after a restart matches)."""
    return {"task": spec.prompt, "tuf": {"level": tuf_msg.level, "alpha": tuf_msg.alpha, "beta": tuf_msg.beta,
                                         "ert": tuf_msg.ert},
            "sent_wall": bridge.to_wall(spec.sent)}
