"""A PlannerService without ROS, for tests of the planner's own logic (intake, refusals, recovery): the simulated
engine in real time, the real SegmentDelivery, RobotLinks and RejectedMessages, and a PlannerSender that records
what the node would have sent and hands each segment to delivery as the node does."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from timelyllm_ros.domain.clock import WallOffset
from timelyllm_ros.domain.tuf import TufRequest
from timelyllm_ros.domain.types import Segment, TaskResult
from timelyllm_ros.planner.service import PlannerService
from timelyllm_ros.planner.service_io import EndMarker, GoalError, PlanRequest
from timelyllm_ros.planner.settings import PARAMETERS
from timelyllm_ros.transport.delivery import RejectedMessages, RobotLinks, SegmentDelivery


class Lines:
    """A logger that keeps its lines (and the refusal log's): what an operator would read."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def _add(self, level: str, msg: str) -> None:
        with self._lock:
            self.lines.append((level, msg))

    def debug(self, msg: str) -> None:
        self._add("debug", msg)

    def info(self, msg: str) -> None:
        self._add("info", msg)

    def warning(self, msg: str) -> None:
        self._add("warning", msg)

    def error(self, msg: str) -> None:
        self._add("error", msg)

    def at(self, *levels: str) -> list[str]:
        with self._lock:
            return [m for lv, m in self.lines if lv in levels]


class Sender:
    """The node's side, recorded: segments go to delivery (as the node's ``_deliver`` does); results are kept."""

    lifecycle_state = "active"

    def __init__(self) -> None:
        self.delivery: SegmentDelivery | None = None
        self.segments: list[tuple[str, str, int, str]] = []  # (task, robot, index, text)
        self.results: list[TaskResult] = []
        self.goal_results: dict[Any, TaskResult] = {}
        self.first_segment_at: dict[str, float] = {}  # task -> monotonic time its segment 0 went out
        # (task, segment, skill set id): what the node builds its PlanSegment from (the core's own segment, not a
        # copy: a flood must not slow the engine thread; a later report may move its predictions)
        self.sent: list[tuple[str, Segment, str]] = []
        self.resent_journaled: list[tuple[str, Segment | EndMarker, str]] = []
        self.end_markers: list[tuple[str, int, float]] = []  # (task, index, core time it was generated)

    def _msg(self, task_id: str, robot_id: str, index: int, text: str, final: bool) -> SimpleNamespace:
        return SimpleNamespace(task_id=task_id, robot_id=robot_id, segment_index=index, text=text, is_final=final)

    def send_segment(self, task_id, robot_id, seg, skillset_id, goals) -> None:
        if seg.index == 0:
            self.first_segment_at.setdefault(task_id, time.monotonic())
        self.segments.append((task_id, robot_id, seg.index, seg.text))
        self.sent.append((task_id, seg, skillset_id))
        self.delivery.send(robot_id, self._msg(task_id, robot_id, seg.index, seg.text, bool(seg.final)),
                           time.monotonic(), matched=True)

    def resend_segment(self, task_id, robot_id, seg, skillset_id) -> None:
        self.delivery.send(robot_id, self._msg(task_id, robot_id, seg.index, seg.text, bool(seg.final)),
                           time.monotonic(), matched=True)

    def send_end_marker(self, task_id, robot_id, index, generated) -> None:
        self.end_markers.append((task_id, index, generated))
        self.delivery.send(robot_id, self._msg(task_id, robot_id, index, "", True), time.monotonic(), matched=True)

    def resend_journaled(self, task_id, robot_id, seg, skillset_id) -> None:
        self.resent_journaled.append((task_id, seg, skillset_id))
        marker = isinstance(seg, EndMarker)
        self.delivery.send(robot_id, self._msg(task_id, robot_id, seg.index, "" if marker else seg.text,
                                               marker or bool(seg.final)), time.monotonic(), matched=True)

    def finish_goals(self, goals, res: TaskResult) -> None:
        for g in goals:
            self.goal_results[g] = res

    def publish_result(self, res: TaskResult) -> None:
        self.results.append(res)

    def publish_journaled_result(self, rec) -> None:
        pass


class ServiceStack:
    """A configured, started, active PlannerService (simulated engine, real time). ``links``: the robots' links
    made so far (robot id -> a token standing for its DDS writer), released ones removed."""

    def __init__(self, policy: str = "pud-shed", bridge: WallOffset | None = None, **params: Any) -> None:
        p = {st.name: st.fresh_default() for st in PARAMETERS}
        p.update(engine_config="engine_sim.yaml", warm_up=False)
        p.update(params)
        self.log = Lines()
        self.sender = Sender()
        self.rejected = RejectedMessages(self.log.warning)
        self.links: dict[str, object] = {}
        self.present: set[str] = set()  # robots whose executor would be on the graph (a reader of their segments)
        self.robots = RobotLinks(self._make_link, self._destroy_link, lambda link: True, self.present.__contains__)
        self.bridge = bridge if bridge is not None else WallOffset()  # core <-> wall time, as the node's
        self.service = PlannerService(p, self.sender, self.log, self.rejected, self.robots, self.bridge)
        self.delivery = SegmentDelivery(lambda robot, msg: None, period_s=p["resend_period_s"],
                                        max_period_s=p["resend_max_period_s"], give_up_s=p["delivery_timeout_s"])
        self.sender.delivery = self.delivery
        self.service.configure(policy, self.delivery)
        self.service.start()
        self.service.recover()
        self.service.set_active(True)
        self.core = self.service.core

    def _make_link(self, robot_id: str) -> object:
        link = self.links[robot_id] = object()
        return link

    def _destroy_link(self, link: object) -> None:
        for r, v in list(self.links.items()):
            if v is link:
                del self.links[r]

    def request(self, robot_id: str, task: str = "[A] find the cat", *, task_id: str = "", level: str = "normal",
                robot_type: str = "drone") -> PlanRequest:
        return PlanRequest(task_id, robot_id, robot_type, task, TufRequest(level=level))

    def send(self, req: PlanRequest) -> tuple[str, TaskResult | GoalError | None]:
        """Accept a request as the node does: (its task id, its refusal or None while it runs)."""
        goal = object()
        try:
            acc = self.service.accept(req, goal=goal)
        except GoalError as e:
            return e.task_id, e
        return acc.task_id, acc.result

    def journal_status(self, task_id: str) -> str | None:
        return self.service.journal.status(task_id)

    def close(self) -> None:
        self.service.shutdown()
        self.service.release()
