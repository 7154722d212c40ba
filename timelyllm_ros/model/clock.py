"""One clock abstraction so the same scheduler runs in real time and in simulation."""

from __future__ import annotations

import abc
import threading
import time


class Clock(abc.ABC):
    @abc.abstractmethod
    def now(self) -> float:
        """Current time in seconds (monotonic; the origin is arbitrary)."""

    @abc.abstractmethod
    def wait_until(self, t: float | None, wake: threading.Event | None = None) -> bool:
        """Block until time ``t`` (None: forever) or until ``wake`` is set.

        Returns True if woken by the event. The event is cleared on return so
        the caller can reuse it.
        """

    @property
    def simulated(self) -> bool:
        return False


class RealClock(Clock):
    def now(self) -> float:
        return time.monotonic()

    def wait_until(self, t: float | None, wake: threading.Event | None = None) -> bool:
        timeout = None if t is None else max(0.0, t - time.monotonic())
        if wake is None:
            if timeout is None:
                raise ValueError("waiting forever without a wake event would never return")
            time.sleep(timeout)
            return False
        woke = wake.wait(timeout)
        wake.clear()
        return woke


class SimClock(Clock):
    """Simulated time, advanced only by its owner (the discrete-event simulator)."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)

    def now(self) -> float:
        return self._t

    def set(self, t: float) -> None:
        if t < self._t - 1e-12:
            raise ValueError(f"simulated time cannot go back ({t} < {self._t})")
        self._t = max(self._t, float(t))

    def advance(self, dt: float) -> None:
        self.set(self._t + dt)

    def wait_until(self, t: float | None, wake: threading.Event | None = None) -> bool:
        # Nothing else can happen while a simulated thread waits: jump there.
        if wake is not None and wake.is_set():
            wake.clear()
            return True
        if t is None:
            raise RuntimeError("SimClock.wait_until(None): nothing would ever wake the simulation")
        self.set(max(t, self._t))
        return False

    @property
    def simulated(self) -> bool:
        return True
