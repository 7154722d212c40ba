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


def _clock_pair(tries: int = 5) -> tuple[float, float]:
    """(monotonic, wall) read as nearly at once as this host allows: the wall reading bracketed by two
    monotonic ones, the narrowest bracket of ``tries``, monotonic taken at its middle."""
    best: tuple[float, float, float] | None = None
    for _ in range(tries):
        m0 = time.monotonic()
        w = time.time()
        m1 = time.monotonic()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, (m0 + m1) / 2, w)
    return best[1], best[2]


class WallOffset:
    """Maps the core's monotonic clock to wall time and back (journal records, robots' stamps).

    The core schedules on a monotonic clock; the outside world stamps wall time. The offset is taken once,
    so both directions agree to the nanosecond. It is read between two monotonic readings, the tightest of
    a few tries: a thread preempted between the two clock reads (a busy host: milliseconds) would otherwise
    shift every stamp by that much (seen: a bag's reception time 1.6 ms before the planner's arrival stamp).
    """

    def __init__(self, core_now: float | None = None, wall_now: float | None = None) -> None:
        if core_now is None and wall_now is None:
            core_now, wall_now = _clock_pair()
        else:
            core_now = time.monotonic() if core_now is None else core_now
            wall_now = time.time() if wall_now is None else wall_now
        self.offset = wall_now - core_now

    def to_wall(self, core_t: float | None) -> float | None:
        return None if core_t is None else core_t + self.offset

    def to_core_s(self, wall_s: float) -> float:
        return wall_s - self.offset
