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
from timelyllm_ros.ros.convert import ClockBridge, started, status_from_code, tuf_to_msg
from timelyllm_ros.ros.topics import PLAN_RESULTS, PLAN_TASK_ACTION, RELIABLE, RESULTS_QOS, SEGMENT_DONE
from timelyllm_ros.sim.workloads import Job


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


class WorkloadClient(Node):
    """Sends jobs at ``arrival / speed`` seconds after :meth:`start`; collects TaskRecords."""

    def __init__(self, jobs: list[Job], *, speed: float = 1.0, action: str = PLAN_TASK_ACTION,
                 on_segment: Callable[[TaskRecord, SegRecord], None] | None = None,
                 on_done: Callable[[TaskRecord], None] | None = None, node_name: str = "workload_client",
                 **node_kw: Any) -> None:
        super().__init__(node_name, **node_kw)
        if speed <= 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self.jobs, self.speed = jobs, speed
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
        self.create_subscription(SegmentDone, SEGMENT_DONE, self._segment_done, RELIABLE,
                                 callback_group=self._group)
        # A finished plan the robot did not run to the end (preempted, failed late) is revised only here.
        self.create_subscription(PlanResult, PLAN_RESULTS, self._plan_result, RESULTS_QOS,
                                 callback_group=self._group)

    def wait_for_planner(self, timeout: float = 120.0) -> bool:
        return self._action.wait_for_server(timeout_sec=timeout)

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

    def _send(self, job: Job) -> None:
        rec = self.records[job.job_id]
        task_id = task_id_of(job.job_id)
        with self._lock:
            self._by_task[task_id] = rec
        rec.arrival = time.monotonic()
        goal = PlanTask.Goal(task_id=task_id, robot_id=robot_id_of(job), robot_type=rec.robot_type,
                             task=job.task_input, tuf=tuf_to_msg(job.time_utility))
        try:
            check_goal(goal)  # a task with NUL would be planned cut short: refused, never sent
        except ValueError as e:
            self._close(rec, TaskStatus.INVALID, f"refused by the client: {e}")
            return
        fut = self._action.send_goal_async(goal, feedback_callback=lambda m, r=rec: self._feedback(r, m.feedback))
        fut.add_done_callback(lambda f, r=rec: self._accepted(r, f))

    def _feedback(self, rec: TaskRecord, fb: PlanTask.Feedback) -> None:
        s = fb.segment
        seg = SegRecord(index=s.segment_index, text=s.text, skills=len(s.skills),
                        dispatch=self._bridge.to_core(s.stamp_generated), recv=time.monotonic())
        with self._lock:
            while len(rec.segments) <= s.segment_index:
                rec.segments.append(None)  # type: ignore[arg-type]  # filled below; feedback may reorder
            rec.segments[s.segment_index] = seg
            early = self._early.pop((s.task_id, s.segment_index), None)
        if early is not None:
            self._segment_done(early)
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
        if handle is None or not handle.accepted:
            self._close(rec, TaskStatus.INVALID, "goal not accepted")
            return
        handle.get_result_async().add_done_callback(lambda f, r=rec: self._result(r, f.result().result))

    def _result(self, rec: TaskRecord, res: PlanTask.Result) -> None:
        rec.plan = res.plan_text
        # Feedback and result travel separately: feedback still in flight when the result
        # arrives is dropped by the action client. The result lists every segment sent.
        for s in res.segments:
            if s.segment_index >= len(rec.segments) or rec.segments[s.segment_index] is None:
                self._feedback(rec, PlanTask.Feedback(segment=s))
        self._close(rec, status_from_code(res.status) or TaskStatus.FAILED, res.message)

    def _close(self, rec: TaskRecord, status: TaskStatus, reason: str) -> None:
        with self._lock:
            revised = self._revised.get(task_id_of(rec.job_id))
            if status is TaskStatus.DONE and revised is not None:  # the revision came first
                status, reason = revised
            rec.status, rec.reason, rec.finished = status.value, reason, time.monotonic()
            rec.segments = [s for s in rec.segments if s is not None]
            self._open -= 1
            done = self._open == 0
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
