"""Robots' side of a workload: send each job as a PlanTask goal at its time, and
record what the robots saw (segments, execution start/end from SegmentDone)
as core TaskRecords, so live runs are measured by the same metrics code as
simulations.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.node import Node

from timelyllm_ros.action import PlanTask
from timelyllm_ros.domain.plans import plan_templates
from timelyllm_ros.domain.types import TaskStatus
from timelyllm_ros.measure.records import SegRecord, TaskRecord
from timelyllm_ros.msg import PlanResult, SegmentDone
from timelyllm_ros.ros.actions import SafeActionClient
from timelyllm_ros.ros.client import check_goal
from timelyllm_ros.ros.convert import (
    ClockBridge,
    feedback_msg,
    goal_msg,
    result_request,
    started,
    status_from_code,
    tuf_to_msg,
)
from timelyllm_ros.ros.topics import (
    GET_PLAN_RESULT_SERVICE,
    PLAN_RESULTS,
    PLAN_TASK_ACTION,
    RELIABLE,
    RESULTS_QOS,
    SEGMENT_DONE,
    in_fleet,
)
from timelyllm_ros.sim.workloads import Job
from timelyllm_ros.srv import GetPlanResult


def robot_type_of(job: Job) -> str:
    """The skill-set robot type of the job's task type (its robot_type / robot_system / trace_id)."""
    t = plan_templates().get(job.task_key)
    if t is None:  # never guess a drone: an arm job would be planned as drone tasks
        raise ValueError(f"job {job.job_id}: unknown task type {tuple(job.task_key)}")
    return t.robot_type


def robot_id_of(job: Job) -> str:
    return f"{robot_type_of(job)}_{job.agent_id}"


def task_id_of(job_id: int) -> str:
    return f"job{job_id}"


# A goal whose response has not come within this is sent again (the same task_id: the planner joins it to the open
# task). The action server's endpoints can be discovered before it has discovered ours: a goal sent then is lost.
GOAL_RESPONSE_TIMEOUT_S = 2.0
MAX_GOAL_ATTEMPTS = 4


class WorkloadClient(Node):
    """Sends jobs at ``arrival / speed`` seconds after :meth:`run` starts; collects TaskRecords."""

    def __init__(self, jobs: list[Job], *, speed: float = 1.0, action: str = in_fleet(PLAN_TASK_ACTION),
                 on_segment: Callable[[TaskRecord, SegRecord], None] | None = None,
                 on_done: Callable[[TaskRecord], None] | None = None, node_name: str = "workload_client",
                 robot_ids: dict[int, str] | None = None, **node_kw: Any) -> None:
        """``robot_ids``: job id -> the robot that sends it, where not :func:`robot_id_of` (its trace agent)."""
        super().__init__(node_name, **node_kw)
        if speed <= 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self.jobs, self.speed = jobs, speed
        self._robot_ids = dict(robot_ids or {})
        self.on_segment, self.on_done = on_segment, on_done
        self._group = ReentrantCallbackGroup()
        self._action = SafeActionClient(self, PlanTask, action, callback_group=self._group)
        self._bridge = ClockBridge()
        tpl = plan_templates()
        self.records: dict[int, TaskRecord] = {}
        for j in jobs:
            t = tpl.get(j.task_key)
            tuf = j.time_utility
            self.records[j.job_id] = TaskRecord(
                job_id=j.job_id, trace_id=j.trace_id, task_type=t.name if t else f"trace_{j.trace_id}",
                # the level stays named when the demo scales the TUFs
                robot_type=robot_type_of(j), level=t.level if t else tuf.level, agent_id=j.agent_id,
                arrival=float("nan"),
                alpha=tuf.alpha, beta=tuf.beta, ert=tuf.ert)
        self._by_task: dict[str, TaskRecord] = {}
        self._early: dict[tuple[str, int], SegmentDone] = {}  # reports that overtook their feedback
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._open = len(jobs)
        self._revised: dict[str, tuple[TaskStatus, str]] = {}  # task -> a finished plan's later end (/plan_results)
        self._handles: dict[str, Any] = {}  # task -> its goal handle (run_alone cancels after the first segment)
        self._firsts: dict[str, threading.Event] = {}  # task -> set when its first segment came (run_alone)
        self._unanswered: dict[str, tuple[Any, float, int]] = {}  # task -> (goal, last sent, attempts): no response
        self.resent = 0  # goals sent again for want of a response
        self.create_timer(GOAL_RESPONSE_TIMEOUT_S / 4, self._resend_unanswered, callback_group=self._group)
        # created last: its endpoints are announced after the action's (wait_for_planner)
        self._probe = self.create_client(GetPlanResult, in_fleet(GET_PLAN_RESULT_SERVICE), callback_group=self._group)
        self.create_subscription(SegmentDone, in_fleet(SEGMENT_DONE), self._segment_done, RELIABLE,
                                 callback_group=self._group)
        # A finished plan the robot did not run to the end (preempted, failed late) is revised only here.
        self.create_subscription(PlanResult, in_fleet(PLAN_RESULTS), self._plan_result, RESULTS_QOS,
                                 callback_group=self._group)

    def wait_for_planner(self, timeout: float = 120.0) -> bool:
        """Until the planner's action server is seen here and the planner has seen this node: an answer from its
        /get_plan_result proves the latter (discovery announces a node's endpoints in the order they were made,
        the action client's first). Goals sent before it were lost (each then waits GOAL_RESPONSE_TIMEOUT_S).
        Needs the node spinning."""
        end = time.monotonic() + timeout
        if not self._action.wait_for_server(timeout_sec=timeout):
            return False
        while (left := end - time.monotonic()) > 0:
            if not self._probe.wait_for_service(timeout_sec=left):
                return False
            answered = threading.Event()
            fut = self._probe.call_async(result_request(""))
            fut.add_done_callback(lambda _f, ev=answered: ev.set())
            if answered.wait(min(0.5, max(0.0, end - time.monotonic()))):
                return True
            self._probe.remove_pending_request(fut)
        return False

    def run(self, timeout: float = 600.0) -> list[TaskRecord]:
        """Send every job at its time (blocking this thread); wait for all results."""
        t0 = time.monotonic()
        first = min((j.trigger_time for j in self.jobs), default=0.0)
        for j in sorted(self.jobs, key=lambda j: j.trigger_time):
            delay = t0 + (j.trigger_time - first) / self.speed - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self._send(j)
        if not self._finished.wait(max(0.0, timeout - (time.monotonic() - t0))):
            raise TimeoutError(f"{self._open} of {len(self.jobs)} tasks had no result after {timeout} s")
        return [self.records[j.job_id] for j in self.jobs]

    def run_alone(self, timeout: float = 60.0) -> list[TaskRecord]:
        """Send the jobs one at a time, each on an engine with nothing else to do: wait for its first segment (or
        its result, where it ends without one), cancel the rest of its plan and wait for its result before the
        next (the bound a run is measured against: each task's first segment served alone). Their robots report
        the first segments' starts later (:meth:`wait_for_reports`)."""
        for j in self.jobs:
            tid = task_id_of(j.job_id)
            done = threading.Event()
            self._firsts[tid] = done
            self._send(j)
            rec = self.records[j.job_id]
            end = time.monotonic() + timeout
            if done.wait(timeout) and rec.status == "pending":
                # The feedback can overtake the goal's acceptance: cancel once its handle is known.
                while (handle := self._handles.get(tid)) is None and rec.status == "pending" \
                        and time.monotonic() < end:
                    time.sleep(0.002)
                if handle is not None:
                    handle.cancel_goal_async()
            while rec.status == "pending" and time.monotonic() < end:
                time.sleep(0.005)
            self._firsts.pop(tid, None)
        return [self.records[j.job_id] for j in self.jobs]

    def _send(self, job: Job) -> None:
        rec = self.records[job.job_id]
        task_id = task_id_of(job.job_id)
        with self._lock:
            self._by_task[task_id] = rec
        rec.arrival = time.monotonic()
        goal = goal_msg(task_id, self._robot_ids.get(job.job_id) or robot_id_of(job), rec.robot_type, job.task_input,
                        tuf_to_msg(job.time_utility))
        try:
            check_goal(goal)  # a task with NUL would be planned cut short: refused, never sent
        except ValueError as e:
            self._close(rec, TaskStatus.INVALID, f"refused by the client: {e}")
            return
        self._send_goal(rec, goal, 1)

    def _send_goal(self, rec: TaskRecord, goal: Any, attempt: int) -> None:
        with self._lock:
            self._unanswered[goal.task_id] = (goal, time.monotonic(), attempt)
        fut = self._action.send_goal_async(goal, feedback_callback=lambda m, r=rec: self._feedback(r, m.feedback))
        fut.add_done_callback(lambda f, r=rec: self._accepted(r, f))

    def _resend_unanswered(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [(t, g, n) for t, (g, sent, n) in self._unanswered.items() if now - sent > GOAL_RESPONSE_TIMEOUT_S]
        for task_id, goal, n in late:
            rec = self._by_task[task_id]
            if n >= MAX_GOAL_ATTEMPTS:
                with self._lock:
                    self._unanswered.pop(task_id, None)
                self._close(rec, TaskStatus.FAILED, f"no goal response after {n} attempts")
            else:
                self.resent += 1
                self._send_goal(rec, goal, n + 1)

    def _feedback(self, rec: TaskRecord, fb: PlanTask.Feedback) -> None:
        s = fb.segment
        seg = SegRecord(index=s.segment_index, text=s.text, skills=len(s.skills),
                        dispatch=self._bridge.to_core(s.stamp_generated), recv=time.monotonic())
        with self._lock:
            while len(rec.segments) <= s.segment_index:
                rec.segments.append(None)  # type: ignore[arg-type]  # filled below; feedback may reorder
            if rec.segments[s.segment_index] is not None:
                return  # also sent to a goal sent again (joined): the first copy is when the robot had it
            rec.segments[s.segment_index] = seg
            early = self._early.pop((s.task_id, s.segment_index), None)
        if early is not None:
            self._segment_done(early)
        if s.segment_index == 0 and (first := self._firsts.get(s.task_id)) is not None:
            first.set()
        if self.on_segment:
            self.on_segment(rec, seg)

    def _segment_done(self, msg: SegmentDone) -> None:
        with self._lock:
            rec = self._by_task.get(msg.task_id)
            if rec is None:
                return
            if msg.segment_index >= len(rec.segments) or rec.segments[msg.segment_index] is None:
                self._early[(msg.task_id, msg.segment_index)] = msg  # the robot was faster than the feedback
                return
            seg = rec.segments[msg.segment_index]
            ran = started(msg.start)  # else refused, or dropped for a preempting task
            seg.end = self._bridge.to_core(msg.finish)
            seg.start = self._bridge.to_core(msg.start) if ran else float("nan")
            seg.exec_s = seg.end - seg.start if ran else 0.0
            seg.preempted = "" if msg.success else msg.error

    def _plan_result(self, msg: PlanResult) -> None:
        st = status_from_code(msg.status)
        if st is None or st is TaskStatus.DONE:
            return
        with self._lock:
            self._revised[msg.task_id] = (st, msg.message)
            rec = self._by_task.get(msg.task_id)
            if rec is not None and rec.status == TaskStatus.DONE.value:
                rec.status, rec.reason = st.value, msg.message

    def _accepted(self, rec: TaskRecord, fut) -> None:
        handle = fut.result()
        with self._lock:
            if self._unanswered.pop(task_id_of(rec.job_id), None) is None:
                return  # an earlier attempt's response came already (or the goal was given up on)
        if handle is None or not handle.accepted:
            self._close(rec, TaskStatus.INVALID, "goal not accepted")
            return
        self._handles[task_id_of(rec.job_id)] = handle
        handle.get_result_async().add_done_callback(lambda f, r=rec: self._result(r, f.result().result))

    def _result(self, rec: TaskRecord, res: PlanTask.Result) -> None:
        rec.plan = res.plan_text
        # Feedback and result travel separately: feedback still in flight when the result
        # arrives is dropped by the action client. The result lists every segment sent.
        for s in res.segments:
            if s.segment_index >= len(rec.segments) or rec.segments[s.segment_index] is None:
                self._feedback(rec, feedback_msg(s))
        self._close(rec, status_from_code(res.status) or TaskStatus.FAILED, res.message)

    def _close(self, rec: TaskRecord, status: TaskStatus, reason: str) -> None:
        with self._lock:
            revised = self._revised.get(task_id_of(rec.job_id))
            if status is TaskStatus.DONE and revised is not None:  # the revision came first
                status, reason = revised
            rec.status, rec.reason, rec.finished = status.value, reason, time.monotonic()
            self._handles.pop(task_id_of(rec.job_id), None)
            first = self._firsts.get(task_id_of(rec.job_id))
            rec.segments = [s for s in rec.segments if s is not None]
            self._open -= 1
            done = self._open == 0
        if first is not None:  # run_alone waits no longer for a first segment that will not come
            first.set()
        if self.on_done:
            self.on_done(rec)
        if done:
            self._finished.set()

    def wait_for_reports(self, timeout: float = 60.0) -> bool:
        """Wait until every dispatched segment of a served task has its SegmentDone (robots finish)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                missing = [s for r in self.records.values() for s in r.segments if s.end != s.end]  # NaN
            if not missing:
                return True
            time.sleep(0.05)
        return False
