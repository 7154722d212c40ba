"""Recovery after a restart, and the journal's record format (pure Python).

The record format has this one home: what a task's request is journaled as (:func:`spec_record`, read back by
:func:`request_of_record`), what its result is journaled as (:func:`result_record`, read back by
:func:`task_result_from_record` and :func:`journaled_result`), and the results recovery writes itself. The journal
(``planner/journal.py``) stores them as JSON without looking inside.

:class:`Recovery` resumes what a killed planner left in the journal: it re-opens unfinished tasks in the core,
re-adopts finished ones whose robot may still run them, and sends again what was not acknowledged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from timelyllm_ros.domain.clock import WallOffset
from timelyllm_ros.domain.tuf import TufRequest
from timelyllm_ros.domain.types import Segment, TaskResult, TaskSpec, TaskStatus
from timelyllm_ros.planner.journal import ACTIVE, Journal, JournaledTask
from timelyllm_ros.planner.service_io import EndMarker, GoalError, Log, PlannerSender, PlanRequest
from timelyllm_ros.transport.delivery import RobotLinks

if TYPE_CHECKING:
    from timelyllm_ros.planner.core import PlannerCore
    from timelyllm_ros.planner.hooks import SkillHooks


# -- the record format ---------------------------------------------------------------------------------------------
def spec_record(spec: TaskSpec, tuf: TufRequest, bridge: WallOffset) -> dict:
    """The request as the robot sent it (the TUF fields as given, so a retry after a restart matches)."""
    return {"task": spec.prompt, "tuf": {"level": tuf.level, "alpha": tuf.alpha, "beta": tuf.beta, "ert": tuf.ert},
            "sent_wall": bridge.to_wall(spec.sent)}


def request_of_record(spec: dict) -> tuple[str, TufRequest, float | None]:
    """A journaled request (:func:`spec_record`): its task text, its TUF as given, and when it was sent (wall s;
    None where unknown)."""
    t = spec["tuf"]
    return (spec["task"], TufRequest(level=t["level"], alpha=t["alpha"], beta=t["beta"], ert=t["ert"]),
            spec["sent_wall"] if spec.get("sent_wall") else None)


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
    """A finished task's result as journaled: what a restarted planner answers a retry or a result query with."""
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


@dataclass(frozen=True)
class JournaledResult:
    """A journaled result as read back (:func:`journaled_result`): what a result message says of it. ``message``
    may be empty (the status then says it); ``response_time`` etc. None where the task had none."""

    task_id: str
    robot_id: str
    status: TaskStatus
    message: str
    plan_text: str
    num_segments: int
    response_time: float | None
    response_time_from_send: float | None
    utility: float | None


def journaled_result(rec: dict) -> JournaledResult:
    return JournaledResult(task_id=rec.get("task_id", ""), robot_id=rec.get("robot_id", ""),
                           status=status_of_record(rec), message=rec.get("message") or "",
                           plan_text=rec.get("plan_text", ""), num_segments=int(rec.get("num_segments", 0)),
                           response_time=rec.get("response_time"),
                           response_time_from_send=rec.get("response_time_from_send"), utility=rec.get("utility"))


# -- recovery ------------------------------------------------------------------------------------------------------
@dataclass
class RecoveryHost:
    """What recovery needs of the planner service: its request checks, skill-set ids and open-task table."""

    validate: Callable[..., TaskSpec]  # PlannerService.validate
    skillset_id: Callable[[str], str]
    reopen: Callable[[str, str, str, tuple, int, bool], None]  # task_id, robot_id, robot_type, key, sent, final_sent
    drop: Callable[[str], None]  # an open task reopened by mistake (ended at once)
    open_robot_type: Callable[[str], str | None]  # an open task's robot type; None where not open


def restored_segments(jt: JournaledTask, hooks: SkillHooks, comm_s: float, bridge: WallOffset) -> list[Segment]:
    """A journaled task's segments (its end marker left out) as the core's, in this clock, with their
    predictions as the core made them when it sent them."""
    segs: list[Segment] = []
    for js in jt.segments:
        if js.marker:
            continue
        calls = hooks.parse(jt.robot_type, js.text)
        dispatch = bridge.to_core_s(js.dispatch_wall)
        seg = Segment(index=js.index, text=js.text, token_ids=list(js.token_ids), calls=calls,
                      gen_start=dispatch, ready=dispatch, dispatch=dispatch, est_exec_s=js.est_exec_s,
                      max_exec_s=hooks.exec_range(jt.robot_type, calls)[1], final=js.is_final)
        seg.predict(comm_s, segs[-1].end if segs else None)
        if js.reported:
            seg.real_end, seg.success, seg.error = (bridge.to_core_s(js.finish_wall)
                                                    if js.finish_wall else seg.pred_end), js.success, js.error
        segs.append(seg)
    return segs


class Recovery:
    """Resumes what a killed planner left in its journal (:meth:`run`, once per configure), and remembers the
    finished tasks it re-adopted until their result comes again (:meth:`take_readopted`)."""

    def __init__(self, bridge: WallOffset, robots: RobotLinks, sender: PlannerSender, log: Log) -> None:
        self._bridge, self._robots, self._sender, self._log = bridge, robots, sender, log
        self._readopting: set[str] = set()  # finished tasks being re-adopted at recovery (_readopt)

    def take_readopted(self, task_id: str) -> bool:
        """True (once) for a task re-adopted at recovery: its result stands as journaled, nothing more to do."""
        if task_id in self._readopting:
            self._readopting.discard(task_id)
            return True
        return False

    def run(self, journal: Journal, core: PlannerCore, hooks: SkillHooks, host: RecoveryHost) -> None:
        """Resume what a killed planner left: re-open unfinished tasks, re-send unacknowledged segments."""
        now_wall = time.time()
        resumed = ended = 0
        for jt in journal.unfinished():
            task, tuf, sent_wall = request_of_record(jt.spec)
            arrival = self._bridge.to_core_s(jt.arrival_wall)
            sent = self._bridge.to_core_s(sent_wall) if sent_wall is not None else None
            try:
                spec = host.validate(jt.task_id, jt.robot_id, jt.robot_type, task, tuf, arrival=arrival, sent=sent)
            except GoalError as e:  # e.g. its robot type is no longer served: refused as invalid now
                journal.task_finished(jt.task_id, TaskStatus.INVALID.value,
                                      {"status": TaskStatus.INVALID.value, "message": f"after restart: {e}",
                                       "robot_id": jt.robot_id}, now_wall)
                ended += 1
                continue
            segs = restored_segments(jt, hooks, core.cfg.comm_s, self._bridge)
            marker = any(js.marker for js in jt.segments)
            key = PlanRequest(jt.task_id, jt.robot_id, jt.robot_type, task, tuf).key
            host.reopen(jt.task_id, jt.robot_id, jt.robot_type, key, len(segs), marker or any(x.final for x in segs))
            self._robots.get(jt.robot_id)
            if not segs and spec.tuf.tuf0(core.clock.now() - arrival) < 0:
                host.drop(jt.task_id)
                res_rec = {"status": TaskStatus.OVERDUE.value, "robot_id": jt.robot_id,
                           "message": "planner restarted after the task's utility cutoff; nothing was sent"}
                journal.task_finished(jt.task_id, TaskStatus.OVERDUE.value, res_rec, now_wall)
                self._sender.publish_journaled_result({"task_id": jt.task_id, **res_rec})
                ended += 1
                continue
            spec.meta["request_key"] = key
            core.restore(spec, segs, final=marker)
            resumed += 1
        readopted = self._readopt(journal, core, hooks, host)
        self._resend(journal, core, hooks, host)
        if resumed or ended or readopted:
            self._log.warning(f"journal: resumed {resumed} unfinished tasks, ended {ended}, re-adopted {readopted} "
                              "finished ones whose robots may still run them")

    def _resend(self, journal: Journal, core: PlannerCore, hooks: SkillHooks, host: RecoveryHost) -> None:
        """Send again what was not acknowledged, and what was acknowledged but never reported: the robot
        answers a copy of a finished segment with its report again."""
        sent: dict[str, dict[int, Segment]] = {}

        def as_sent(tid: str) -> dict[int, Segment]:
            """A task's journaled segments as restored (the stamp and deadline they went out with), by index."""
            if tid not in sent:
                jt = journal.task(tid)
                sent[tid] = {} if jt is None else {
                    s.index: s for s in restored_segments(jt, hooks, core.cfg.comm_s, self._bridge)}
            return sent[tid]

        resend: dict[tuple[str, int], tuple[str, str, Any]] = {
            (tid, js.index): (tid, robot_id, js) for tid, robot_id, js in journal.unacked()}
        for jt in journal.unfinished():
            for js in jt.segments:
                if not js.marker and not js.reported:
                    resend.setdefault((jt.task_id, js.index), (jt.task_id, jt.robot_id, js))
        for tid, robot_id, js in resend.values():
            if not js.marker and journal.status(tid) not in (ACTIVE, TaskStatus.DONE.value):
                continue  # ended without running its plan: see SegmentDelivery.forget
            rt = host.open_robot_type(tid)
            if rt is None:  # finished before the restart: its own robot type, as journaled
                jt = journal.task(tid)
                rt = jt.robot_type if jt is not None else ""
            if js.marker:
                at = None if js.dispatch_wall is None else self._bridge.to_core_s(js.dispatch_wall)
                self._sender.resend_journaled(tid, robot_id, EndMarker(js.index, at), "")
            elif (seg := as_sent(tid).get(js.index)) is not None:
                self._sender.resend_journaled(tid, robot_id, seg, host.skillset_id(rt))

    def _readopt(self, journal: Journal, core: PlannerCore, hooks: SkillHooks, host: RecoveryHost) -> int:
        """Tasks that ended DONE before the restart while a segment sent was not reported yet: their robot may
        still run them. Known to the core again (as finished), their robot's heartbeats and reports count and a
        failure revises the result (they were refused as 'unknown task' before); their result is not published
        again. Returns how many."""
        n = 0
        for jt in journal.with_status(TaskStatus.DONE.value):
            if all(js.marker or js.reported or js.dispatch_wall is None for js in jt.segments):
                continue
            task, tuf, _ = request_of_record(jt.spec)
            try:
                spec = host.validate(jt.task_id, jt.robot_id, jt.robot_type, task, tuf,
                                     arrival=self._bridge.to_core_s(jt.arrival_wall))
            except GoalError as e:  # e.g. its robot type is no longer served: its journaled result stands
                self._log.warning(f"journal: task {jt.task_id} not re-adopted: {e}")
                continue
            spec.meta["request_key"] = PlanRequest(jt.task_id, jt.robot_id, jt.robot_type, task, tuf).key
            self._robots.get(jt.robot_id)
            self._readopting.add(jt.task_id)
            core.restore(spec, restored_segments(jt, hooks, core.cfg.comm_s, self._bridge), final=True)
            n += 1
        return n


__all__ = ["JournaledResult", "Recovery", "RecoveryHost", "journaled_result", "request_of_record",
           "restored_segments", "result_record", "spec_record", "status_of_record", "task_result_from_record"]
