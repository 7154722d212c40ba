"""The engine thread and its restarts (pure Python): :class:`EngineSupervisor` runs PlannerCore.serve_forever
in a thread of its own and, when the engine crashes, fails every open task, rebuilds the engine (backing off
while that fails), hands the new one to the core and to the prompt renderer, and serves again."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from timelyllm_ros.planner.service_io import Log

if TYPE_CHECKING:
    from timelyllm_ros.planner.core import PlannerCore


def _no_handover(engine: Any) -> None:
    pass


class EngineSupervisor:
    """Owns the planner's engine, the engine thread, its stop event, the restart count and the engine error.

    ``lock``: the planner service's lock, which also guards :attr:`error` (goals are refused while it is set).
    Per configure, :meth:`adopt` hands it the engine (and how to build a fresh one), :meth:`attach` the core it
    drives and the handover of a replacement engine to the prompt renderer.
    """

    def __init__(self, log: Log, restart_backoff_s: float, lock: threading.RLock) -> None:
        self._log, self._restart_backoff, self._lock = log, restart_backoff_s, lock
        self.engine: Any = None
        self.error: str | None = None  # set while the engine is down (goals are refused)
        self.restarts = 0
        self._factory: Callable[[], Any] = self._reuse_engine
        self._owns_engine = False
        self._core: PlannerCore | None = None
        self._handover: Callable[[Any], None] = _no_handover
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def adopt(self, engine: Any, factory: Callable[[], Any] | None, owns: bool) -> None:
        """The engine to serve with; ``factory`` builds a fresh one after a crash (None: the same one, cleared);
        ``owns``: built for this planner, so :meth:`release` closes it."""
        self._owns_engine = owns
        self.engine = engine
        self._factory = factory or self._reuse_engine

    def attach(self, core: PlannerCore, handover: Callable[[Any], None]) -> None:
        """The core to serve; ``handover`` gets each replacement engine (the prompt renderer's)."""
        self._core, self._handover = core, handover
        self._stop = threading.Event()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def thread_alive(self) -> bool | None:
        """Whether the engine thread runs; None before :meth:`start`."""
        thread = self._thread
        return None if thread is None else thread.is_alive()

    def start(self) -> None:
        """Start the engine thread."""
        self._thread = threading.Thread(target=self._engine_loop, name="timelyllm-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the engine thread to stop (the caller wakes the core, then :meth:`join`)."""
        self._stop.set()

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def release(self) -> None:
        """After the thread stopped: close an engine this planner built, and forget it."""
        if self.engine is not None and self._owns_engine:
            try:
                self.engine.close()
            except Exception as e:  # noqa: BLE001 - a broken engine may not close cleanly
                self._log.warning(f"closing the engine: {e!r}")
        self.engine = None
        self._core, self._handover = None, _no_handover  # nothing keeps the engine (its renderer) alive

    def _engine_loop(self) -> None:
        backoff = self._restart_backoff
        while not self._stop.is_set():
            try:
                self._core.serve_forever(self._stop)
                return
            except Exception as e:  # noqa: BLE001 - every accepted task must still get an answer
                with self._lock:
                    self.error = f"engine failure: {e!r}"
                self._log.error(f"engine loop crashed: {e!r}; failing every open task, rebuilding the engine")
                n = self._core.fail_all(f"planner engine failure: {e!r}")
                self._log.error(f"{n} open tasks ended FAILED")
            while not self._stop.wait(backoff):
                try:
                    self._restart()
                except Exception as e:  # noqa: BLE001
                    backoff = min(backoff * 2, 30.0)
                    self._log.error(f"engine restart failed: {e!r}; next try in {backoff:g} s")
                    continue
                with self._lock:
                    self.error = None
                self.restarts += 1
                backoff = self._restart_backoff
                self._log.warning(f"engine restarted ({self.restarts}); serving again")
                break

    def _restart(self) -> None:
        """A fresh engine for the core and the prompts; the failed one closed (unless it is the same one)."""
        engine = self._factory()
        self._core.fail_all("planner engine failure (task accepted during the restart)")
        self._core.replace_engine(engine)
        old, self.engine = self.engine, engine
        self._handover(engine)
        if old is not engine:
            try:
                old.close()
            except Exception as e:  # noqa: BLE001 - a broken engine may not close cleanly
                self._log.warning(f"closing the failed engine: {e!r}")

    def _reuse_engine(self) -> Any:
        """Restart for an engine handed in without a factory: drop whatever it still holds."""
        for gid in self.engine.running_ids() | self.engine.suspended_ids():
            self.engine.abort(gid)
        return self.engine


__all__ = ["EngineSupervisor"]
