"""rclpy's ActionClient and ActionServer, fixed for load: every PlanTask client and server of ours uses them;
and :class:`ActionServerWatch`, which tells a client whether the server is there and which instance it is.

rclpy's ``take_data`` (client and server) takes one message of each kind per
executor wake-up. A node that sent 200 goals at once had 180 goal responses
waiting in its reader when the planner had finished every task (test_client,
busy host): retries went out for goals long accepted, and results were read
tens of seconds late; the server read the retries just as slowly. Here every
wake-up takes what is there (up to ``MAX_TAKE`` per kind).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from rclpy.action import ActionClient, ActionServer
from rclpy.node import Node
from rclpy.task import Future

# Requests, responses and messages taken per kind and executor wake-up (bounded: other entities get their turn).
MAX_TAKE = 256
# Goal requests a server takes at once: all that wait, within reason, so that an urgent goal behind a flood is
# handled first (BatchedActionServer's ``order``); taking one is a few microseconds.
MAX_TAKE_GOALS = 4096
# Goals handled before the server looks again for goals that arrived meanwhile (an urgent one goes first then).
GOAL_CHUNK = 32


def _drain(takes: dict[str, Callable[[], Any]], limits: dict[str, int] | None = None) -> dict[str, list[Any]]:
    """Call each ``take`` until it comes back empty (None, or (None, None) for a service message)."""
    data: dict[str, list[Any]] = {}
    for kind, take in takes.items():
        got = []
        limit = (limits or {}).get(kind, MAX_TAKE)
        while len(got) < limit:
            item = take()
            if item is None or (isinstance(item, tuple) and item[0] is None):
                break
            got.append(item)
        if got:
            data[kind] = got
    return data


class SafeActionClient(ActionClient):
    """An ``ActionClient`` whose goal futures always complete.

    - rclpy's ``__init__`` registers the client with its node before it creates ``_lock``: an executor
      already spinning that node can call into the half-built client (AttributeError in the spin thread).
    - rclpy 9.1.2's ``send_goal_async`` registers the goal's future under the lock, then registers a second
      future for the same sequence number after releasing it, and returns the second. A goal response taken
      by another executor thread in between completes the first one: the caller's future never completes
      (a goal that was accepted, but whose sender never hears so), and every goal leaks a future into the
      waitable. Here the one returned future is registered before the response can be taken (``take_data``
      takes responses under the same lock), and a feedback callback is registered before the goal is sent.
    - Batched takes (module doc). A goal's feedback is handed over before results taken in the same batch:
      rclpy forgets a goal's feedback callback once its result is read, so a result handled first would
      drop the feedback that arrived before it.
    """

    _ORDER = ("goal", "cancel", "feedback", "result", "status")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def send_goal_async(self, goal: Any, feedback_callback: Callable[[Any], None] | None = None,
                        goal_uuid: Any = None) -> Future:
        if not isinstance(goal, self._action_type.Goal):
            raise TypeError(f"expected a {self._action_type.Goal.__name__} goal, got {type(goal).__name__}")
        request = self._action_type.Impl.SendGoalService.Request()
        request.goal_id = self._generate_random_uuid() if goal_uuid is None else goal_uuid
        request.goal = goal
        if feedback_callback is not None:
            self._feedback_callbacks[bytes(request.goal_id.uuid)] = feedback_callback
        future: Future = Future()
        with self._lock:
            seq = self._client_handle.send_goal_request(request)
            if seq in self._pending_goal_requests:
                raise RuntimeError(f"goal request sequence number {seq} is already pending")
            self._pending_goal_requests[seq] = future
            self._goal_sequence_number_to_goal_id[seq] = request.goal_id
            future.add_done_callback(self._remove_pending_goal_request)
            self.add_future(future)
        return future

    def take_data(self) -> dict[str, list[Any]]:
        h, impl = self._client_handle, self._action_type.Impl
        with self._lock:
            return _drain({
                "goal": lambda: h.take_goal_response(impl.SendGoalService.Response),
                "cancel": lambda: h.take_cancel_response(impl.CancelGoalService.Response),
                "result": lambda: h.take_result_response(impl.GetResultService.Response),
                "feedback": lambda: h.take_feedback(impl.FeedbackMessage),
                "status": lambda: h.take_status(impl.GoalStatusMessage),
            })

    async def execute(self, taken_data: dict[str, list[Any]]) -> None:
        pending = {"goal": self._pending_goal_requests, "cancel": self._pending_cancel_requests,
                   "result": self._pending_result_requests}
        for kind in self._ORDER:
            for item in taken_data.get(kind, ()):
                if kind in pending:
                    fut = pending[kind].get(item[0])
                    if fut is not None and fut.done():
                        # A second answer to one request (two servers on the action) in the same batch; rclpy
                        # would raise "Two goals were accepted with the same ID" and stop the executor.
                        self._node.get_logger().warning(
                            f"ignoring a second {kind} response to request {item[0]}: is more than one server "
                            f"serving {self._action_name}?")
                        continue
                await super().execute({kind: item})


class BatchedActionServer(ActionServer):
    """An ``ActionServer`` that takes every waiting goal, cancel and result request at each wake-up (module doc);
    goal expiry as rclpy does it.

    ``order(goal) -> key``: the goals taken at one wake-up are handled in this order (stable): an urgent goal behind
    a flood in the same batch goes first.

    ``screen(goal) -> (status, result) or None``: called for each goal before rclpy makes a goal handle. An answer is
    final: the goal is accepted and its result kept for the client's result request (at most ``answers_max``, for
    ``result_timeout`` s), with no goal handle. rclpy keeps a handle per accepted goal for ``result_timeout`` and
    publishes the status of every handle it keeps at each change of any: a flood of goals refused through handles
    (10,000 in 7 s) cost the server O(n) per goal and every action client a status message of thousands of entries.
    Such a goal never appears in a status message; its result, accepted-then-aborted, is what a handle gave."""

    def __init__(self, *args: Any, screen: Callable[[Any], tuple[int, Any] | None] | None = None,
                 order: Callable[[Any], Any] | None = None, answers_max: int = 20_000, **kwargs: Any) -> None:
        self._screen, self._order = screen, order
        self._answers: OrderedDict[bytes, tuple[float, int, Any]] = OrderedDict()  # goal id -> (when, status, result)
        self._answers_max = answers_max
        self._keep_answers_s = float(kwargs.get("result_timeout", 10))  # rclpy's default too
        self._answers_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    async def _execute_goal_request(self, request_header_and_message: Any) -> None:
        header, request = request_header_and_message
        answer = self._screen(request.goal) if self._screen is not None else None
        if answer is None:
            await super()._execute_goal_request(request_header_and_message)
            return
        now = time.monotonic()
        with self._answers_lock:
            self._answers[bytes(request.goal_id.uuid)] = (now, *answer)
            while len(self._answers) > self._answers_max or (
                    self._answers and now - next(iter(self._answers.values()))[0] > self._keep_answers_s):
                self._answers.popitem(last=False)
        response = self._action_type.Impl.SendGoalService.Response(accepted=True,
                                                                    stamp=self._node.get_clock().now().to_msg())
        try:
            with self._lock:
                self._handle.send_goal_response(header, response)
        except Exception:  # noqa: BLE001 - the client went away (rclpy does the same)
            self._node.get_logger().debug("could not send a goal response (the client may have gone away)")

    async def _execute_get_result_request(self, request_header_and_message: Any) -> None:
        header, request = request_header_and_message
        with self._answers_lock:
            answer = self._answers.get(bytes(request.goal_id.uuid))
        if answer is None:
            await super()._execute_get_result_request(request_header_and_message)
            return
        response = self._action_type.Impl.GetResultService.Response(status=answer[1], result=answer[2])
        try:
            with self._lock:
                self._handle.send_result_response(header, response)
        except Exception:  # noqa: BLE001 - the client went away
            self._node.get_logger().debug("could not send a result response (the client may have gone away)")

    def take_data(self) -> dict[str, Any]:
        h, impl = self._handle, self._action_type.Impl
        with self._lock:
            data: dict[str, Any] = _drain({
                "goal": lambda: h.take_goal_request(impl.SendGoalService.Request),
                "cancel": lambda: h.take_cancel_request(impl.CancelGoalService.Request),
                "result": lambda: h.take_result_request(impl.GetResultService.Request),
            }, {"goal": MAX_TAKE_GOALS})
            if self._is_goal_expired:
                data["expired"] = h.expire_goals(len(self._goal_handles))
        return data

    async def execute(self, taken_data: dict[str, Any]) -> None:
        goals = taken_data.get("goal", ())
        if self._order is None:
            for item in goals:
                await super().execute({"goal": item})
        else:  # in ``order``, a chunk at a time, with what arrives meanwhile joining the ones still waiting
            waiting: list[tuple[Any, int, Any]] = []
            seq = itertools.count()
            while goals or waiting:
                for item in goals:
                    heapq.heappush(waiting, (self._order(item[1].goal), next(seq), item))
                for _ in range(min(GOAL_CHUNK, len(waiting))):
                    await super().execute({"goal": heapq.heappop(waiting)[2]})
                goals = self._take_goals() if waiting else ()
        for kind in ("cancel", "result"):
            for item in taken_data.get(kind, ()):
                await super().execute({kind: item})
        if "expired" in taken_data:
            await super().execute({"expired": taken_data["expired"]})

    def _take_goals(self) -> list[Any]:
        h, impl = self._handle, self._action_type.Impl
        with self._lock:
            return _drain({"goal": lambda: h.take_goal_request(impl.SendGoalService.Request)},
                          {"goal": MAX_TAKE_GOALS}).get("goal", [])


class ActionServerWatch:
    """Is an action's server there, and is it a new instance? A restarted server's endpoints can show up before
    the killed one's have timed out (discovery leases), so instances are told apart by the endpoint GIDs of their
    status publishers: ``epoch`` goes up by one each time one not seen before appears. ``ready`` and
    ``down_since`` (monotonic; None while ready) are as of the last :meth:`update`."""

    def __init__(self, node: Node, client: ActionClient, action_name: str) -> None:
        name = node.resolve_topic_name(action_name)  # as rcl_action names it: namespace and remaps applied
        self._node, self._client = node, client
        self._status_topic = f"{name}/_action/status"
        self._seen_gids: set[bytes] = set()  # every status publisher seen
        self._lock = threading.Lock()
        self.ready = False
        self.epoch = 0
        self.down_since: float | None = time.monotonic()

    def update(self, now: float) -> bool:
        """Look at the graph now (``now``: monotonic); returns ``ready``."""
        try:
            ready = self._client.server_is_ready()
            gids = {bytes(i.endpoint_gid) for i in self._node.get_publishers_info_by_topic(self._status_topic)}
        except Exception:  # noqa: BLE001 - destroyed
            ready, gids = False, set()
        with self._lock:
            fresh = gids - self._seen_gids
            if fresh:
                self._seen_gids |= fresh
                self.epoch += 1
            if ready:
                self.down_since = None
            elif self.ready or self.down_since is None:
                self.down_since = now
            self.ready = ready
        return ready


def complete_goal(goal_handle: Any, result: Any, *, succeeded: bool, cancelled: bool, log: Any) -> None:
    """Finish a goal without having held a thread for it: rclpy runs the execute callback once, at once, and it
    returns the finished result. A cancelled task is reported canceled only if the client asked to cancel it."""
    def finish(h: Any) -> Any:
        if succeeded:
            h.succeed()
        elif cancelled and h.is_cancel_requested:
            h.canceled()
        else:
            h.abort()
        return result
    try:
        goal_handle.execute(finish)
    except Exception as e:  # noqa: BLE001 - e.g. the client's goal already expired
        log.warning(f"could not complete goal of task {getattr(result, 'task_id', '?')!r}: {e!r}")
