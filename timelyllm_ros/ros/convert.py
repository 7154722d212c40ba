"""Conversions between core types and ROS 2 messages (the only place that knows both)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from builtin_interfaces.msg import Duration, Time

from timelyllm_ros.action import PlanTask
from timelyllm_ros.domain.clock import WallOffset
from timelyllm_ros.domain.tuf import LEVELS, TimeUtility, TufRequest
from timelyllm_ros.domain.types import STATUS_CODE, STATUS_FROM_CODE, Segment, TaskResult, TaskStatus
from timelyllm_ros.engines.base import EngineInfo, EngineStats
from timelyllm_ros.engines.pool import MemberStats, PoolStats
from timelyllm_ros.measure.records import result_robot_waiting
from timelyllm_ros.msg import (
    EngineMember,
    EngineState,
    PlanResult,
    PlanSegment,
    QueuedGeneration,
    SchedulerState,
    SegmentAck,
    SegmentDone,
    SkillCall,
    TaskRequest,
)
from timelyllm_ros.msg import TimeUtility as TimeUtilityMsg
from timelyllm_ros.planner.recovery import journaled_result
from timelyllm_ros.srv import GetPlanResult, Plan

if TYPE_CHECKING:  # annotations only: executors import this module, not the planner's
    from timelyllm_ros.planner.service_io import TaskLookup


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


class ClockBridge(WallOffset):
    """:class:`WallOffset` with ROS time stamps: the core's monotonic clock to ``builtin_interfaces/Time`` and
    back."""

    def to_msg(self, core_t: float | None) -> Time:
        return Time() if core_t is None else time_msg(core_t + self.offset)

    def to_core(self, t: Time) -> float:
        return time_s(t) - self.offset


def status_code(status: TaskStatus) -> int:
    """The STATUS_* code of PlanResult / PlanTask.Result for a terminal status (domain.types.STATUS_CODE);
    a status that is not terminal never reaches a robot as success: it reads as FAILED."""
    return STATUS_CODE.get(status, STATUS_CODE[TaskStatus.FAILED])


def status_from_code(code: int) -> TaskStatus | None:
    """The TaskStatus of a PlanResult / PlanTask.Result code; None for a code this build does not know."""
    return STATUS_FROM_CODE.get(int(code))


def status_name(code: int) -> str:
    """A result code as its TaskStatus value ("done", "invalid", "overdue", ...); an unknown code as its number."""
    st = status_from_code(code)
    return st.value if st is not None else str(code)


def tuf_request(msg: TimeUtilityMsg) -> TufRequest:
    """A TimeUtility message's fields as given (a named level, or custom alpha/beta/ert)."""
    return TufRequest(level=msg.level, alpha=msg.alpha, beta=msg.beta, ert=msg.ert)


def tuf_from_msg(msg: TimeUtilityMsg) -> TimeUtility:
    """Named level (fields left at 0 take the level's values) or custom alpha/beta/ert.

    Raises ValueError naming the field on bad input (NaN, wrong sign, unknown level).
    """
    return tuf_request(msg).resolve()


def tuf_msg(level: str, alpha: float, beta: float, ert: float) -> TimeUtilityMsg:
    """A TimeUtility message as a robot asks for it (a named level, or custom alpha/beta/ert)."""
    return TimeUtilityMsg(level=level, alpha=alpha, beta=beta, ert=ert)


def tuf_to_msg(tuf: TimeUtility) -> TimeUtilityMsg:
    return tuf_msg(tuf.level if tuf.level in LEVELS else "", tuf.alpha, tuf.beta, tuf.ert)


def goal_msg(task_id: str, robot_id: str, robot_type: str = "", task: str = "", tuf: TimeUtilityMsg | None = None,
             stamp: Time | None = None) -> PlanTask.Goal:
    """A PlanTask goal; ``task_id`` empty: the planner assigns one; ``stamp`` None: zero (no send stamp)."""
    return PlanTask.Goal(task_id=task_id, robot_id=robot_id, robot_type=robot_type, task=task,
                         tuf=TimeUtilityMsg() if tuf is None else tuf, stamp=Time() if stamp is None else stamp)


def result_request(task_id: str) -> GetPlanResult.Request:
    """/get_plan_result's request for ``task_id`` (empty: a probe that the service answers)."""
    return GetPlanResult.Request(task_id=task_id)


def skill_call_msg(call, skillset_id: str) -> SkillCall:
    args = getattr(call, "args", ())
    return SkillCall(name=getattr(call, "name", ""), long_name=getattr(call, "long_name", "") or "",
                     raw=getattr(call, "raw", "") or "", args=[_arg_text(a) for a in args],
                     skillset_id=getattr(call, "skillset_id", "") or skillset_id)


def _arg_text(a) -> str:
    return repr(a) if isinstance(a, str) else str(a)


def segment_msg(task_id: str, robot_id: str, seg: Segment, bridge: ClockBridge, skillset_id: str) -> PlanSegment:
    """A core Segment as a PlanSegment message: live, re-sent, in a result, or journaled by a planner that died
    (restored as the core's, planner/recovery.py ``restored_segments``), every segment is sent alike."""
    return _plan_segment(task_id, robot_id, seg.index, seg.text, [skill_call_msg(c, skillset_id) for c in seg.calls],
                         bool(seg.final), bridge.to_msg(seg.ready), duration_msg(seg.est_exec_s),
                         bridge.to_msg(seg.pred_end))


def end_marker_msg(task_id: str, robot_id: str, index: int, generated: Time) -> PlanSegment:
    """The end of a plan on its robot's topic: an empty final segment after the last one sent."""
    return _plan_segment(task_id, robot_id, index, "", [], True, generated, Duration(), Time())


def _plan_segment(task_id: str, robot_id: str, index: int, text: str, skills: list[SkillCall], is_final: bool,
                  generated: Time, predicted: Duration, deadline: Time) -> PlanSegment:
    """The one place a PlanSegment is made (test_convert): a segment and an end marker fill the same fields."""
    return PlanSegment(task_id=task_id, robot_id=robot_id, segment_index=index, text=text, skills=skills,
                       is_final=is_final, stamp_generated=generated, predicted_execution=predicted,
                       next_segment_deadline=deadline)


def feedback_msg(segment: PlanSegment) -> PlanTask.Feedback:
    return PlanTask.Feedback(segment=segment, utility_estimate=math.nan)


def scheduler_state_msg(stamp: Time, policy: str, queue: list[dict], running_task_ids: list[str], snapshot: dict,
                        decision_times: Sequence[float]) -> SchedulerState:
    """SchedulerState from the core's ranked queue (planner/telemetry.py ``queue_view``), its running tasks and
    ``snapshot()``; ``decision_times``: the scheduler's decision durations, the last one reported."""
    return SchedulerState(
        stamp=stamp, policy=policy,
        queue=[QueuedGeneration(task_id=q["task_id"], robot_id=q["robot_id"], segment_index=q["k"],
                                suspended=q["k"] > 0, priority=_finite(q["priority"]),
                                slack_s=_finite(q["slack_s"]), waiting_s=_finite(q["waiting_s"]))
               for q in queue],
        running_task_ids=running_task_ids, tasks_active=snapshot["tasks"], tasks_done=snapshot["done"],
        last_decision_time_s=decision_times[-1] if decision_times else 0.0)


def _finite(x: float) -> float:
    """0 for a figure that has none (an infinite slack): a message field must be finite for every reader."""
    return float(x) if math.isfinite(x) else 0.0


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


def engine_state_msg(stats: EngineStats, info: EngineInfo, stamp: Time, estimate: dict | None = None,
                     lone_first_segment_s: float = 0.0) -> EngineState:
    """``estimate``: the scheduler's LatencyEstimator.describe(); ``lone_first_segment_s``: the warm-up's
    calibration (planner/warmup.py), 0 where none was measured."""
    described = {"dtype": info.dtype, "dtype_reason": info.dtype_reason, "speculative": info.speculative}
    if estimate is not None:
        described |= {"estimate_source": str(estimate.get("seed", "")),
                      "est_decode_s_per_token": float(estimate.get("decode_ms_b1", 0.0)) / 1e3,
                      "est_prefill_step_s": float(estimate.get("prefill_step_ms", 0.0)) / 1e3,
                      "est_prefill_s_per_token": float(estimate.get("prefill_ms_per_token", 0.0)) / 1e3,
                      "lone_first_segment_s": float(lone_first_segment_s)}
    fields = EngineState.get_fields_and_field_types()
    described = {k: v for k, v in described.items() if k in fields}  # interfaces built before these fields
    return EngineState(
        stamp=stamp, backend=info.name, model=info.model, **described, running=stats.running,
        waiting=stats.waiting, max_batch=stats.max_batch, tokens_per_second=float(stats.tokens_per_s),
        step_time_s=float(stats.step_time_s), kv_cache_usage=float(stats.kv_cache_usage),
        members=[engine_member_msg(m) for m in pool_members(stats)])


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
    r = journaled_result(rec)
    return PlanResult(task_id=r.task_id, robot_id=r.robot_id, status=status_code(r.status),
                      message=r.message or r.status.value, plan_text=r.plan_text, num_segments=r.num_segments,
                      response_time=duration_msg(r.response_time or 0.0),
                      response_time_from_send=nan_if_none(r.response_time_from_send), utility=nan_if_none(r.utility))


def task_request_msg(stamp: Time, task_id: str, robot_id: str, robot_type: str, task: str,
                     tuf: TimeUtilityMsg, sent: Time | None) -> TaskRequest:
    """A request as it came (``accepted`` False until the planner accepts it), for /plan_requests."""
    req = TaskRequest(stamp=stamp, task_id=task_id, robot_id=robot_id, robot_type=robot_type, task=task, tuf=tuf,
                      accepted=False)
    if sent is not None:
        req.sent = sent
    return req


def fill_plan_result(resp: GetPlanResult.Response, task_id: str, found: TaskLookup, bridge: ClockBridge,
                     stamp: Time) -> GetPlanResult.Response:
    """/get_plan_result's answer from what the planner knows of the task: how it ended and every segment sent."""
    if found.result is not None:
        res = found.result
        resp.state, resp.result = GetPlanResult.Response.STATE_DONE, plan_result_msg(res, stamp)
        resp.segments = [segment_msg(task_id, res.robot_id, sg, bridge, found.skillset_id) for sg in res.segments]
    elif found.record is not None:
        resp.state, resp.result = GetPlanResult.Response.STATE_DONE, plan_result_from_record(found.record)
        resp.segments = [segment_msg(task_id, found.robot_id, sg, bridge, found.skillset_id) for sg in found.journaled]
    else:
        active = found.state == "active"
        resp.state = GetPlanResult.Response.STATE_ACTIVE if active else GetPlanResult.Response.STATE_UNKNOWN
        resp.result = pending_plan_result(task_id)
    return resp


def fill_plan_response(resp: Plan.Response, res: TaskResult, bridge: ClockBridge, skillset_id: str) -> Plan.Response:
    """/plan's answer: the whole plan, or why there is none."""
    out = result_msg(res, bridge, skillset_id)
    ok = res.status is TaskStatus.DONE
    resp.status = Plan.Response.STATUS_OK if ok else Plan.Response.STATUS_FAILED
    resp.error = "" if ok else out.message
    resp.plan_text, resp.segments = out.plan_text, out.segments
    return resp


def plan_refusal(resp: Plan.Response, status: TaskStatus, error: str) -> Plan.Response:
    """/plan's answer when no plan is made: BUSY (try again later), FAILED (the planner broke) or REJECTED (what
    the request asked was refused)."""
    resp.status = {TaskStatus.BUSY: Plan.Response.STATUS_BUSY,
                   TaskStatus.FAILED: Plan.Response.STATUS_FAILED}.get(status, Plan.Response.STATUS_REJECTED)
    resp.error = error
    return resp


def result_from_plan_result(msg: PlanResult) -> PlanTask.Result:
    """A /plan_results or /get_plan_result message as the PlanTask result it stands for (without segments)."""
    return PlanTask.Result(status=msg.status, message=msg.message, task_id=msg.task_id, plan_text=msg.plan_text,
                           response_time=msg.response_time, response_time_from_send=msg.response_time_from_send,
                           utility=msg.utility)


def lookup_state(resp: GetPlanResult.Response) -> str:
    """/get_plan_result's state as the planner names it (TaskLookup.state): 'done', 'active' or 'unknown'."""
    return {GetPlanResult.Response.STATE_DONE: "done",
            GetPlanResult.Response.STATE_ACTIVE: "active"}.get(resp.state, "unknown")


# How /diagnostics counts a result that is not DONE (a DONE one is on time or late by its ERT).
_OUTCOME_KIND = {TaskStatus.CANCELLED: "cancelled", TaskStatus.OVERDUE: "overdue", TaskStatus.FAILED: "failed",
                 TaskStatus.ROBOT_FAILED: "robot_failed", TaskStatus.INVALID: "rejected", TaskStatus.BUSY: "busy"}


def outcome_kind(msg: PlanResult, ert: float | None) -> str:
    """A /plan_results message as /diagnostics counts it: 'on_time' or 'late' (after ``ert``; None: unknown) when
    DONE, else its status ('rejected' for INVALID; an unknown code counts as 'failed')."""
    status = status_from_code(msg.status)
    if status is TaskStatus.DONE:
        return "late" if ert is not None and duration_s(msg.response_time) > ert else "on_time"
    return _OUTCOME_KIND.get(status, "failed")


def refused_result(task_id: str, status: TaskStatus, message: str) -> PlanTask.Result:
    """The PlanTask result of a goal that was never planned (refused, or failed before planning)."""
    return PlanTask.Result(status=status_code(status), message=message, task_id=task_id)


def pending_plan_result(task_id: str) -> PlanResult:
    """/get_plan_result's answer for a task still open, or unknown: no figures yet."""
    return PlanResult(task_id=task_id, response_time_from_send=math.nan, utility=math.nan)
