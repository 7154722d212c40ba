"""A Tello drone through the real djitellopy library.

djitellopy facts this relies on (djitellopy 2.5.0, read from its source):

* one process-wide UDP socket bound to port 8889 on all interfaces; replies
  are filed per drone by their source IP, so one process serves a fleet (one
  :class:`TelloBackend` per drone host) and a second process on the same host
  cannot bind; emulated drones therefore live in network namespaces;
* state packets arrive on port 8890; ``connect()`` waits for the first one;
* ``send_control_command`` sends, waits up to ``timeout`` (an int) for a
  reply and retries ``retry_count`` times until a reply contains ``ok``,
  then raises ``TelloException``; a timed-out attempt returns a text
  ("Aborting command ..."), never raises by itself;
* replies are popped first-in-first-out from a list that is never cleared, so
  a late reply (after a timeout, or to ``stop``/``emergency``, which are sent
  without waiting) would be taken as the answer to the next command. We clear
  the drone's reply list before each command for that reason.

Preemption (:meth:`TelloBackend.halt`) sends SDK ``stop``, whatever is in flight. The SDK 2.0 user guide
documents ``stop`` as "Hovers in the air. Note: works at any time"; it does not say at what height a cut
take-off or landing leaves the drone, nor whether one cut just after the motors started is airborne at all.
So after a cut take-off or landing the backend does not guess: before the next motion it asks the drone
(``height?``, in dm) and takes off again if it is on the ground. An urgent evasion that preempts a take-off
thus starts at once from a hovering drone (or after a fresh take-off), instead of failing with
``error Not flying`` (what the preempted fleet did) or waiting for the whole take-off.

Motions go through ``send_control_command`` with the same SDK strings that
``move_forward``/``rotate_clockwise`` send, but with a timeout sized to the
motion (the library's fixed 7 s is too short for a 500 cm move at some speeds
and far too long to notice a lost drone quickly). The motion's duration is the
execution-time model of the skill that performs it, found by operation in the
skill set (:mod:`.tello_sdk`), so no skill name is written here.
"""

from __future__ import annotations

import logging
import math
import threading
import time

from djitellopy import Tello, TelloException

from timelyllm_ros.robots.base import ExecutionError, Interrupted, RobotConnectionError, StopSignal
from timelyllm_ros.robots.tello_sdk import SDK_MOVES, motion_seconds
from timelyllm_ros.skills.exec_model import ExecTimeModel
from timelyllm_ros.skills.schema import SkillSet
from timelyllm_ros.skills.skill_files import load_skill_set

log = logging.getLogger(__name__)
Tello.LOGGER.setLevel(logging.WARNING)  # djitellopy logs every command at INFO

_NO_REPLY = "did not receive a response"  # djitellopy's timeout text, lower-cased


class TelloBackend:
    """One drone. Thread-safety: robot commands come from one executor thread; :meth:`halt` and
    :meth:`emergency_land` may be called from another (they send without waiting)."""

    def __init__(self, host: str, *, retry_count: int = Tello.RETRY_COUNT, time_scale: float = 1.0,
                 timeout_margin_s: float = 2.0, min_timeout_s: int = 1, takeoff_timeout_s: int = Tello.TAKEOFF_TIMEOUT,
                 skillset: SkillSet | str = "drone", reply_drain_s: float = 1.0) -> None:
        """``time_scale``: expected durations are multiplied by it (an emulator run faster than real time);
        a command's reply timeout is ``expected * time_scale + timeout_margin_s`` seconds (at least
        ``min_timeout_s``); ``skillset``: whose execution-time models give the expected durations (a motion
        no skill performs gets djitellopy's fixed timeout); ``reply_drain_s``: how long the next command waits
        for a reply a ``stop`` still owes (see :meth:`clear_replies`)."""
        if retry_count < 1:
            raise ValueError(f"retry_count must be >= 1, got {retry_count}")
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        if not reply_drain_s >= 0:
            raise ValueError(f"reply_drain_s must be >= 0, got {reply_drain_s}")
        self.host = host
        self.time_scale = time_scale
        self.timeout_margin_s = timeout_margin_s
        self.min_timeout_s = min_timeout_s
        self.takeoff_timeout_s = takeoff_timeout_s
        self.reply_drain_s = reply_drain_s
        try:
            self.tello = Tello(host=host, retry_count=retry_count)
        except OSError as e:  # the process-wide reply socket: one process per host serves every drone
            raise RobotConnectionError(f"tello {host}: cannot bind UDP port {Tello.CONTROL_UDP_PORT} for the drones' "
                                       f"replies ({e}): is another drone executor (or emulated fleet) running on "
                                       "this host? One process serves all its drones") from None
        self.model = ExecTimeModel(load_skill_set(skillset) if isinstance(skillset, str) else skillset, learn=False)
        self._flying = False
        self._lock = threading.Lock()  # one SDK command in flight from the executor thread
        # What is in flight, and whether a halt asked to stop motions, read and set together with halt(): a
        # motion sent just after a halt must not run to its end unnoticed.
        self._state_lock = threading.Lock()
        self._in_flight: str | None = None
        self._halted = False
        self._cut = False  # a halt came while the command in flight ran
        # Replies the drone still owes for the 'stop's halt() sent: each 'stop' is answered, and so is the command
        # it cut; the cut command's thread takes whichever comes first, so one reply per 'stop' is left over.
        self._owed = 0
        self.connected = False
        self._heard: float | None = None  # monotonic time of the latest reply or new state packet
        self._state_seen: object = None  # the state dict last seen by link_state (djitellopy replaces it per packet)
        self._battery: int | None = None  # from the latest battery? reply

    # -- DroneBackend -----------------------------------------------------------
    @property
    def flying(self) -> bool:
        """Airborne. Unknown after a take-off or landing that a halt cut (or that failed): the drone is asked."""
        if self._flying is None:
            with self._lock:
                self.clear_replies()
                try:
                    reply = self.tello.send_read_command("height?")
                except (TelloException, OSError) as e:
                    raise RobotConnectionError(f"tello {self.host}: height? failed: {_reason(e)}") from None
            dm = _leading_int(reply)
            if dm is None:
                raise ExecutionError(f"tello {self.host}: height? answered {reply!r}, not a height")
            self._set_flying(dm > 0)
            log.info("tello %s: %s after a cut take-off or landing (height %d dm)", self.host,
                     "hovering" if dm > 0 else "on the ground", dm)
        return bool(self._flying)

    def _set_flying(self, flying: bool | None) -> None:
        self._flying = flying
        self.tello.is_flying = flying is not False  # djitellopy lands at exit what it thinks may fly

    def connect(self) -> int:
        """Enter SDK mode and wait for state packets; returns the battery level (%)."""
        try:
            self.clear_replies()
            self.tello.connect()
        except TelloException as e:
            raise RobotConnectionError(f"tello {self.host}: connect failed: {_reason(e)}") from None
        self.connected = True
        self._heard = time.monotonic()
        return self.battery()

    def battery(self) -> int:
        self.clear_replies()
        try:
            self._battery = self.tello.query_battery()
        except (TelloException, ValueError) as e:
            raise RobotConnectionError(f"tello {self.host}: battery? failed: {_reason(e)}") from None
        self._heard = time.monotonic()
        return self._battery

    def link_state(self) -> tuple[bool, float | None, int | None]:
        """(connected, seconds since the drone was last heard, battery %) for diagnostics: cheap, sends nothing.

        Heard: a reply, or a state packet (10 per second from a connected Tello). djitellopy replaces its state dict
        with each packet; a new one is noticed when this is called, so the age is late by at most one call
        period. Battery: the state packets' ``bat``, else the latest ``battery?`` reply; None before either."""
        now = time.monotonic()
        try:
            state = self.tello.get_own_udp_object()["state"]
        except KeyError:  # closed: djitellopy forgot this drone
            return False, None if self._heard is None else now - self._heard, self._battery
        if state and state is not self._state_seen:
            self._state_seen, self._heard = state, now
        bat = state.get("bat") if state else None
        battery = int(bat) if isinstance(bat, (int, float)) else self._battery
        return self.connected, None if self._heard is None else now - self._heard, battery

    def takeoff(self) -> None:
        self._set_flying(None)  # until the drone says 'ok' to an uncut take-off
        cut = self._command("takeoff", self.takeoff_timeout_s)
        self._set_flying(None if cut else True)

    def land(self) -> None:
        self._set_flying(None)
        cut = self._command("land", self._timeout(3.0))
        self._set_flying(None if cut else False)

    def move(self, direction: str, cm: int) -> None:
        if direction not in SDK_MOVES:
            raise ExecutionError(f"unknown direction {direction!r}")
        self._motion(direction, int(cm))

    def rotate(self, degrees: int, clockwise: bool) -> None:
        self._motion("cw" if clockwise else "ccw", int(degrees))

    def motion_timeout(self, word: str, value: int) -> int:
        """Reply timeout (s) of SDK motion ``<word> <value>``: its modelled duration, scaled, plus the margin;
        djitellopy's fixed timeout for a motion no skill of the set performs."""
        expected = motion_seconds(self.model, word, value)
        return Tello.RESPONSE_TIMEOUT if expected is None else self._timeout(expected)

    def hover(self, seconds: float, stop: StopSignal) -> None:
        """Stay in place. The Tello lands by itself after 15 s without a command: keep it alive."""
        end = time.monotonic() + seconds * self.time_scale
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            if stop.wait(min(left, 10.0)):
                stop.check()
            if self._flying and end - time.monotonic() > 0:
                self._command("keepalive", self._timeout(0.0))

    # -- safety (called from other threads) ----------------------------------------
    def halt(self) -> None:
        """Preemption: hover now. SDK ``stop`` (sent without waiting) cuts whatever is in flight, a take-off or
        landing too (module doc). Motions sent after this are refused (Interrupted) until :meth:`resume`."""
        with self._state_lock:
            self._halted = True
            self._cut = self._in_flight is not None
            self._owed += 1
        self.tello.send_command_without_return("stop")

    def resume(self) -> None:
        """A new segment starts: motions are allowed again."""
        with self._state_lock:
            self._halted = False

    def emergency_land(self) -> bool:
        """Stop whatever is in flight at once, then land if airborne (waits for the landing). Used by the
        emergency stop. Returns whether it landed."""
        self.halt()
        with self._lock:  # the executor thread's command ends at once after 'stop'
            pass
        if self.flying:
            self.land()
            return True
        return False

    def close(self, land: bool = True) -> None:
        """Land if flying (best effort, bounded by the SDK timeouts) and forget this drone in djitellopy.

        Idempotent. Clears ``is_flying`` so that djitellopy's ``__del__`` does not try to land a drone
        that is gone (3 x 7 s of timeouts at interpreter exit)."""
        from djitellopy import tello as tello_mod

        if land and self._flying is not False:
            try:
                self.land()
            except Exception as e:  # noqa: BLE001 - best effort at teardown: never mask the caller's error
                log.warning("landing %s at close failed: %r", self.host, e)
        self._set_flying(False)
        tello_mod.drones.pop(self.host, None)

    # -- helpers --------------------------------------------------------------------
    def _motion(self, word: str, value: int) -> None:
        self._command(f"{word} {value}", self.motion_timeout(word, value))

    def _timeout(self, expected_s: float) -> int:
        return max(self.min_timeout_s, int(math.ceil(expected_s * self.time_scale + self.timeout_margin_s)))

    def clear_replies(self) -> None:
        """Drop the drone's replies not read yet (djitellopy queues them per address): a reply still queued, such
        as the 'ok' of a 'stop', would otherwise answer the next command. A reply a 'stop' still owes is waited
        for first (at most ``reply_drain_s``): one that came after the next command went out would answer it,
        e.g. a ``height?`` with 'ok' (a drone slow to answer the command it cut, or a busy host)."""
        with self._state_lock:
            owed, self._owed = self._owed, 0
        try:
            responses = self.tello.get_own_udp_object()["responses"]
        except KeyError:
            return
        deadline = time.monotonic() + self.reply_drain_s
        while len(responses) < owed and time.monotonic() < deadline:
            time.sleep(0.005)
        responses.clear()

    def _command(self, cmd: str, timeout: int) -> bool:
        """Send and wait for 'ok'; True when a :meth:`halt` came while it was in flight (it was cut)."""
        with self._lock:
            with self._state_lock:
                if self._halted and cmd.split(" ")[0] not in ("land", "keepalive"):
                    raise Interrupted(f"tello {self.host}: halted, {cmd!r} not sent")
                self._in_flight, self._cut = cmd, False
            self.clear_replies()
            try:
                self.tello.send_control_command(cmd, timeout=int(timeout))
                self._heard = time.monotonic()
            except TelloException as e:
                reason = _reason(e)
                if _NO_REPLY in reason.lower():
                    raise RobotConnectionError(f"tello {self.host}: connection lost: no reply to {cmd!r} "
                                               f"({self.tello.retry_count} tries, {timeout} s each)") from None
                raise ExecutionError(f"tello {self.host}: command {cmd!r} failed: {reason}") from None
            except OSError as e:  # e.g. network unreachable: the link is gone
                raise RobotConnectionError(f"tello {self.host}: connection lost sending {cmd!r}: {e}") from None
            finally:
                with self._state_lock:
                    self._in_flight = None
                    cut = self._cut
        return cut


def _leading_int(text: str) -> int | None:
    """The number a read command answers with its unit, e.g. ``'8dm'`` -> 8."""
    digits = ""
    for c in str(text).strip():
        if not c.isdigit():
            break
        digits += c
    return int(digits) if digits else None


def _reason(e: BaseException) -> str:
    return " ".join(str(e).split())
