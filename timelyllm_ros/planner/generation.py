"""Generation: the scheduler-side state of one task's generation, and the one home of what is computed from it.

The next segment's generation time G (:meth:`Generation.gen_time`), its wait and slack, when a suspended one
resumes, and the moves between QUEUED, RUNNING, SUSPENDED and an end are methods here; the policies, admission,
the boundary decision, shedding and telemetry call them rather than recompute them (test_generation checks that
no other module multiplies a token estimate by a step time or adds the prefill estimate), so a change to how G is
estimated is made once.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from timelyllm_ros.domain.types import Segment, TaskResult, TaskSpec, TaskStatus
from timelyllm_ros.engines.base import EngineRequest

if TYPE_CHECKING:
    from timelyllm_ros.skills.segmenter import StopChecker


class Generation:
    """Scheduler-side state of one task's generation (hot fields are plain slots)."""

    __slots__ = (
        "task_id", "robot_id", "robot_type", "spec", "tuf", "alpha", "beta", "ert", "arrival",
        "k", "prev_end", "enqueued_at", "eligible_at", "tok_est", "prefill_est_s", "seq", "status",
        "req", "segments", "seg_start_len", "gen_start", "wait_version", "reason", "pending_abort",
        "held", "checker", "abort_status", "rem_tok_est", "warm_hit", "prompt_blocks",
    )

    def __init__(self, spec: TaskSpec, task_id: str, arrival: float, seq: int) -> None:
        self.task_id, self.robot_id, self.robot_type = task_id, spec.robot_id, spec.robot_type
        self.spec = spec
        self.tuf = spec.tuf
        self.alpha, self.beta, self.ert = spec.tuf.alpha, spec.tuf.beta, spec.tuf.ert
        self.arrival = arrival
        self.k = 0
        self.prev_end = math.nan
        self.enqueued_at = arrival
        self.eligible_at = arrival
        self.tok_est = 8.0  # tokens of the next segment (the scheduler's length estimate, see CoreConfig.length_model)
        self.rem_tok_est = 8.0  # tokens left in the plan, the next segment included (telemetry.queue_view)
        self.prefill_est_s = 0.0  # its prompt's prefill in a step of its own (k == 0; PrefillModel.price)
        self.prompt_blocks: tuple[int, list[int]] | None = None  # (block size, its prompt's block hashes), kept
        # prompt tokens the prefix cache holds from a warmed prompt (PlannerCore); None: no warmed prompt known
        self.warm_hit: int | None = None
        self.seq = seq
        self.status = TaskStatus.QUEUED
        self.req: EngineRequest | None = None
        self.segments: list[Segment] = []
        self.seg_start_len = 0  # len(output_token_ids) at the start of the current segment
        self.gen_start = arrival
        self.wait_version = 0
        self.reason = ""
        self.pending_abort = False
        self.abort_status = TaskStatus.CANCELLED  # how a pending abort ends the task
        self.held: list[Segment] = []  # produced but not yet sent (non-streaming policies)
        self.checker: StopChecker | None = None

    # -- time estimates ----------------------------------------------------------------------------------
    def gen_time(self, step_s: float, prefill: bool = True) -> float:
        """G(s_k): the estimated generation time of the next segment, its tokens at ``step_s`` a token, plus
        (``prefill`` and k == 0) its prompt's prefill estimate."""
        G = self.tok_est * step_s
        return G + self.prefill_est_s if prefill and self.k == 0 else G

    def tokens_left(self) -> float:
        """Tokens of the segment being written still to come (at least one)."""
        return max(1.0, self.tok_est - self.seg_tokens())

    def segment_left_s(self, step_s: float) -> float:
        """Time until the segment being written ends, at ``step_s`` a token."""
        return self.tokens_left() * step_s

    def plan_left_s(self, step_s: float) -> float:
        """Time until the plan being written ends (at least a token), at ``step_s`` a token."""
        return max(1.0, self.rem_tok_est - self.seg_tokens()) * step_s

    def wait(self, now: float, G: float, comm_s: float) -> float:
        """W(s_k; now): the response time of s_0 (from the arrival), or, for k > 0, the robot's wait for s_k after
        s_{k-1} ends (negative while it is early; TUF_1 clamps at 0), if it is generated from ``now`` in ``G``."""
        if self.k == 0:
            return now - self.arrival + G + comm_s
        return now + G + comm_s - self.prev_end

    def deadline(self) -> float:
        """Deadline of the segment to generate next (TimeUtility.deadline)."""
        return self.tuf.deadline(self.k, self.arrival, self.prev_end)

    def slack(self, now: float, G: float) -> float:
        """L(s_k): the time left until its deadline once its generation (``G``) is done."""
        return self.deadline() - now - G

    def resume_time(self, now: float, step_s: float, comm_s: float, lead_s: float) -> float:
        """Set and return when a suspended generation is eligible again: its next segment reaches the robot as
        the one before ends (reported or predicted; one held, not sent: now), ``lead_s`` early."""
        last = self.segments[-1] if self.segments else None
        if last is not None and last.end is not None:
            self.prev_end = last.end
        elif last is not None:  # held (not streamed): resume at once
            self.prev_end = now
        G = self.gen_time(step_s, prefill=False)
        self.eligible_at = self.prev_end - G - comm_s - lead_s
        return self.eligible_at

    # -- status transitions ------------------------------------------------------------------------------
    def start(self, now: float) -> None:
        """QUEUED or SUSPENDED -> RUNNING: admitted into the batch now."""
        self.status = TaskStatus.RUNNING
        self.gen_start = now

    def begin_segment(self) -> None:
        """The engine's output from here on is the next segment's."""
        self.seg_start_len = len(self.req.output_token_ids)

    def suspend(self) -> None:
        """RUNNING -> SUSPENDED at a segment boundary (or restored after a restart): the next segment is k."""
        self.status = TaskStatus.SUSPENDED
        self.k = len(self.segments)

    def stream_on(self) -> None:
        """RUNNING past a boundary in place: the next segment is now the one being written."""
        self.begin_segment()
        self.k = len(self.segments)
        if self.segments and self.segments[-1].end is not None:
            self.prev_end = self.segments[-1].end

    def abort_later(self, reason: str, status: TaskStatus | None = None) -> None:
        """Running in the engine: it ends (``status``, else as set before: CANCELLED) once the engine thread
        has aborted it."""
        self.pending_abort = True
        self.reason = reason
        if status is not None:
            self.abort_status = status

    def end(self, status: TaskStatus, reason: str) -> None:
        """-> a terminal ``status``; waiters on the old state see the change (``wait_version``)."""
        self.status = status
        self.reason = reason
        self.wait_version += 1

    # -- segments ----------------------------------------------------------------------------------------
    def seg_tokens(self) -> int:
        return len(self.req.output_token_ids) - self.seg_start_len if self.req is not None else 0

    def plan_text(self) -> str:
        return "".join(s.text for s in self.segments)

    def dispatch(self, seg: Segment, now: float, comm_s: float) -> None:
        """``seg`` leaves for the robot now (:meth:`Segment.predict`)."""
        seg.dispatch = now
        seg.predict(comm_s, self.segments[seg.index - 1].end if seg.index > 0 else None)

    def repredict(self, from_index: int, comm_s: float) -> None:
        """Segment ``from_index`` has a real finish time: shift the predictions of the sent ones after it."""
        segs = self.segments
        for seg in segs[from_index + 1:]:
            if seg.dispatch is None or seg.real_end is not None:
                continue
            seg.predict(comm_s, segs[seg.index - 1].end)

    # -- what leaves the scheduler -------------------------------------------------------------------------
    def engine_request(self, ids: list[int], segmented: bool, checker: Any, output: list[int] | None = None
                       ) -> EngineRequest:
        spec = self.spec
        return EngineRequest(gen_id=self.task_id, prompt_token_ids=list(ids), stop_checker=checker,
                             output_token_ids=list(output or []), max_new_tokens=spec.max_new_tokens,
                             max_segment_tokens=spec.max_segment_tokens, suspend_at_boundary=segmented,
                             extra={"robot_type": self.robot_type, **spec.extra})

    def segment_view(self) -> TaskResult:
        """What ``on_segment`` gets of an open task."""
        return TaskResult(task_id=self.task_id, robot_id=self.robot_id, status=self.status, plan="",
                          segments=self.segments, response_time=None, utility=None, meta=self.spec.meta)

    def result(self, comm_s: float) -> TaskResult:
        """The ended task's result: W(s_0) as the planner predicts it (dispatch + comm - arrival) and its utility."""
        s0 = self.segments[0] if self.segments else None
        rt = (s0.dispatch + comm_s - self.arrival) if s0 is not None and s0.dispatch is not None else None
        sent = self.spec.sent
        return TaskResult(task_id=self.task_id, robot_id=self.robot_id, status=self.status,
                          plan=self.plan_text(), segments=self.segments,
                          response_time=rt, utility=self.tuf.tuf0(rt) if rt is not None else None,
                          reason=self.reason, meta=self.spec.meta, robot_type=self.robot_type,
                          response_time_from_send=(rt + self.arrival - sent) if rt is not None and sent is not None
                          else None)
