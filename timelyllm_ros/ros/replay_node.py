"""Replay a workload against the planner: the same requests, from the same robot ids, at the original
relative times (divided by ``speed``), as PlanTask goals; collect every result.

    ros2 run timelyllm_ros replay_node --ros-args -p source:=bags/timelyllm_20250101-120000 -p speed:=2.0
    timelyllm bags replay data/lrtrace/drone-wid2 --speed 4 --results out.json

The source is a recorded bag (every TaskRequest on /plan_requests, accepted
or refused, exactly as sent), a bag converted from LRTrace, or an LRTrace
folder / jobs file. Task ids are left to the planner unless
``keep_task_ids`` (a planner refuses an id it has already seen).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import rclpy
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node

from timelyllm_ros.action import PlanTask
from timelyllm_ros.bags.convert import DEFAULT_ROBOT_ID_FORMAT, ReplayRequest, load_requests
from timelyllm_ros.ros.actions import SafeActionClient
from timelyllm_ros.ros.client import check_goal
from timelyllm_ros.ros.convert import duration_s, goal_msg, status_name, time_msg, tuf_msg
from timelyllm_ros.ros.params import declare, not_blank
from timelyllm_ros.ros.spin import PooledExecutor, Spinner
from timelyllm_ros.ros.topics import PLAN_TASK_ACTION, in_fleet


@dataclass
class ReplayResult:
    request: ReplayRequest
    sent_s: float = math.nan  # when the goal was sent, seconds after the replay started (its stamp: start + sent_s)
    status: str = "pending"  # a TaskStatus value (done, invalid, overdue, ...) | not_accepted | error
    message: str = ""
    task_id: str = ""
    segments: int = 0
    response_time_s: float = math.nan  # as the planner reports it: from the goal's arrival
    response_time_from_send_s: float = math.nan  # from the goal's send stamp (what the robot waited)
    utility: float = math.nan
    done_s: float = math.nan

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["request"] = {k: v for k, v in asdict(self.request).items() if k != "meta"}
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


@dataclass
class ReplayReport:
    results: list[ReplayResult]
    speed: float
    wall_s: float
    lateness_s: list[float] = field(default_factory=list)  # sent - scheduled, per goal

    @property
    def complete(self) -> bool:
        return all(r.status != "pending" for r in self.results)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(json.dumps({"speed": self.speed, "wall_s": self.wall_s, "counts": self.counts(),
                                 "results": [r.to_json() for r in self.results]}, indent=1))
        return p


def goal_of(req: ReplayRequest, keep_task_id: bool = False, task_id_suffix: str = "") -> PlanTask.Goal:
    return goal_msg((req.task_id + task_id_suffix) if keep_task_id and req.task_id else "", req.robot_id,
                    req.robot_type, req.task, tuf_msg(req.level, float(req.alpha), float(req.beta), float(req.ert)))


class Replayer:
    """Sends the goals of ``requests`` on time through an ActionClient of ``node`` (which some executor spins)."""

    def __init__(self, node: Node, requests: Sequence[ReplayRequest], *, speed: float = 1.0,
                 action: str = in_fleet(PLAN_TASK_ACTION), keep_task_ids: bool = False,
                 task_id_suffix: str = "") -> None:
        if not (speed > 0 and math.isfinite(speed)):
            raise ValueError(f"speed: must be a finite number > 0, got {speed}")
        self.node = node
        self.requests = list(requests)
        self.speed = float(speed)
        self.keep_task_ids = keep_task_ids
        self.task_id_suffix = task_id_suffix
        self.action = action
        self.client = SafeActionClient(node, PlanTask, action, callback_group=ReentrantCallbackGroup())
        self._done = threading.Semaphore(0)
        self._t0 = 0.0

    def run(self, *, timeout_s: float = 600.0, server_timeout_s: float = 30.0,
            stop: threading.Event | None = None) -> ReplayReport:
        """Block until every goal has a result (or ``timeout_s`` after the last one was sent)."""
        if not self.client.wait_for_server(timeout_sec=server_timeout_s):
            raise TimeoutError(f"no PlanTask action server {self.action!r} within {server_timeout_s} s")
        results = [ReplayResult(r) for r in self.requests]
        lateness = []
        wall0 = time.time()  # read first: a stamp is then never later than the moment its goal left
        self._t0 = t0 = time.monotonic()
        for res in results:
            due = t0 + res.request.offset_s / self.speed
            while (wait := due - time.monotonic()) > 0:
                if stop is not None and stop.wait(min(wait, 0.5)):
                    break
                if stop is None:
                    time.sleep(wait)
            if stop is not None and stop.is_set():
                break
            goal = goal_of(res.request, self.keep_task_ids, self.task_id_suffix)
            try:
                check_goal(goal)  # a recorded task with NUL would be planned cut short: refused, never sent
            except ValueError as e:
                res.status, res.message = "refused_by_client", str(e)
                continue
            res.sent_s = time.monotonic() - t0
            goal.stamp = time_msg(wall0 + res.sent_s)  # as a robot stamps its goal: one clock reading for both
            lateness.append(res.sent_s - res.request.offset_s / self.speed)
            fut = self.client.send_goal_async(goal)
            fut.add_done_callback(lambda f, res=res: self._on_goal(res, f))
        sent = sum(1 for r in results if not math.isnan(r.sent_s))
        deadline = time.monotonic() + timeout_s
        for _ in range(sent):
            if not self._done.acquire(timeout=max(0.0, deadline - time.monotonic())):
                break
        return ReplayReport(results, self.speed, time.monotonic() - t0, lateness)

    def _on_goal(self, res: ReplayResult, fut) -> None:  # noqa: ANN001 - rclpy Future
        handle = fut.result() if fut.exception() is None else None
        if handle is None or not handle.accepted:
            res.status, res.message = "not_accepted", str(fut.exception() or "goal not accepted by the server")
            res.done_s = time.monotonic() - self._t0
            self._done.release()
            return
        handle.get_result_async().add_done_callback(lambda f: self._on_result(res, f))

    def _on_result(self, res: ReplayResult, fut) -> None:  # noqa: ANN001 - rclpy Future
        try:
            r = fut.result().result
            res.status = status_name(r.status)
            res.message, res.task_id, res.segments = r.message, r.task_id, len(r.segments)
            res.response_time_s = duration_s(r.response_time) if r.segments else math.nan
            res.response_time_from_send_s = float(r.response_time_from_send) if r.segments else math.nan
            res.utility = float(r.utility)
        except Exception as e:  # noqa: BLE001 - a broken result is recorded, never fatal to the replay
            res.status, res.message = "error", repr(e)
        res.done_s = time.monotonic() - self._t0
        self._done.release()

    def destroy(self) -> None:
        self.client.destroy()


def _required(source: str) -> str | None:
    return None if source.strip() else "a bag or LRTrace workload is required"


class ReplayNode(Node):
    """Parameters (read at start-up, read-only): source, speed, action, robot_id_format, keep_task_ids,
    task_id_suffix, results, timeout_s."""

    def __init__(self, node_name: str = "replay", **kw: Any) -> None:
        super().__init__(node_name, **kw)
        self.source = declare(self, "source", "", "bag folder / .mcap, or LRTrace folder / jobs file (required)",
                              read_only=True, check=_required, constraints="required")
        self.speed = float(declare(self, "speed", 1.0, "time factor; 2 = twice as fast", read_only=True, above=0.0))
        self.action = declare(self, "action", in_fleet(PLAN_TASK_ACTION), "PlanTask action of the planner "
                              "(relative: in the node's namespace)", read_only=True, check=not_blank)
        fmt = declare(self, "robot_id_format", DEFAULT_ROBOT_ID_FORMAT, "robot id of an LRTrace agent, e.g. "
                      "{robot_type}_{agent_id}", read_only=True, check=not_blank)
        self.keep_task_ids = bool(declare(self, "keep_task_ids", False, "send the recorded task ids (a planner "
                                          "refuses an id it has already seen); false: the planner picks",
                                          read_only=True))
        self.task_id_suffix = declare(self, "task_id_suffix", "", "appended to kept task ids (replay a bag "
                                      "against the planner that recorded it)", read_only=True)
        self.results_path = declare(self, "results", "", "write the results JSON here; '' = nowhere",
                                    read_only=True)
        self.timeout_s = float(declare(self, "timeout_s", 600.0, "seconds to wait for the results after the last "
                                       "goal was sent", read_only=True, above=0.0))
        self.requests = load_requests(self.source, robot_id_format=fmt)
        self.replayer = Replayer(self, self.requests, speed=self.speed, action=self.action,
                                 keep_task_ids=self.keep_task_ids, task_id_suffix=self.task_id_suffix)

    def replay(self, stop: threading.Event | None = None) -> ReplayReport:
        span = self.requests[-1].offset_s / self.speed if self.requests else 0.0
        self.get_logger().info(f"replaying {len(self.requests)} requests from {self.source} over {span:.1f} s "
                               f"(speed {self.speed})")
        rep = self.replayer.run(timeout_s=self.timeout_s, stop=stop)
        self.get_logger().info(f"replay done in {rep.wall_s:.1f} s: {rep.counts()}")
        if self.results_path:
            self.get_logger().info(f"results: {rep.save(self.results_path)}")
        return rep


def run_replay(node: ReplayNode) -> ReplayReport:
    """Spin ``node`` in a background executor while the calling thread replays."""
    ex = PooledExecutor(num_threads=4, context=node.context)
    ex.add_node(node)
    t = Spinner(ex, name="timelyllm-replay")
    t.start()
    try:
        return node.replay()
    finally:
        ex.shutdown(timeout_sec=2)
        t.join(timeout=2)


def main(args: list[str] | None = None) -> int:
    rclpy.init(args=args)
    try:
        node = ReplayNode()
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"replay_node: {e}", flush=True)
        rclpy.try_shutdown()
        return 2
    try:
        rep = run_replay(node)
        return 0 if rep.complete else 1
    except (KeyboardInterrupt, ExternalShutdownException):
        return 130
    except TimeoutError as e:
        print(f"replay_node: {e}", flush=True)
        return 2
    finally:
        node.replayer.destroy()
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    import sys

    sys.exit(main())


__all__ = ["ReplayNode", "ReplayReport", "ReplayResult", "Replayer", "goal_of", "main", "run_replay"]
