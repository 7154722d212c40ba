"""rclpy's ActionClient with two races of rclpy 9.1.x fixed; every PlanTask client of ours uses it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from rclpy.action import ActionClient
from rclpy.task import Future


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
    """

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
