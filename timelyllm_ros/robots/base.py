"""What every executor shares: errors and the stop signal."""

from __future__ import annotations

import threading


class ExecutionError(RuntimeError):
    """A segment could not be executed; the message is what SegmentDone reports."""


class RefusedError(ExecutionError):
    """Refused before anything reached the robot (unknown skill, argument out of bounds, bad structure)."""


class RobotConnectionError(ExecutionError):
    """The robot stopped answering (after the SDK's retries)."""


class Interrupted(ExecutionError):
    """Execution was stopped on purpose (emergency stop or preemption); ``reason`` says which."""


class StopSignal:
    """A settable stop with a reason, checked by executors between (and during) robot commands."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def set(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
        self._event.set()

    def clear(self) -> None:
        self.reason = ""
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

    def check(self) -> None:
        """Raise Interrupted if a stop was requested."""
        if self._event.is_set():
            raise Interrupted(self.reason or "stopped")
