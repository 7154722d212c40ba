"""An emulated Tello: a UDP server speaking the Tello SDK text protocol.

It listens on port 8889 like a real Tello (so run one per network namespace,
see :mod:`.netns`), answers the client at the address a command came from,
and after ``command`` sends state packets (``pitch:0;roll:0;yaw:..;h:..;bat:..;``)
to that client's port 8890 ten times a second, as the real drone does.

Control commands reply ``ok`` when the motion is over, after the duration of
the execution-time model (design §7) times ``speed`` (tests use a small
factor); the model is that of the skill performing the motion, found by
operation in the skill set (:mod:`timelyllm_ros.robots.tello_sdk`), so the
emulator names no skill. ``stop`` and ``emergency`` act at once, also during a command.
``stop`` follows the SDK 2.0 user guide ("Hovers in the air. Note: works at any time"):
whatever it cuts, the drone hovers where it is, in the air: a move or turn is cut
part-way (the distance flown so far counts), a take-off leaves it hovering at the
height reached, a landing leaves it hovering at the height it had come down to (in
either, below 1 dm, the SDK's height resolution, it settles on the ground). The
cut command is answered ``ok`` (the command is over, the drone hovers); after
``emergency`` the motors stop (on the ground) and it is answered ``error Motor stop``. Read
commands (``battery?``, ``height?`` ...) answer values; anything else answers
``error``. Every received command is written to a JSON-lines log:
``{"seq": 4, "t": .., "cmd": "forward 50", "reply": "ok"}``, written when the
reply goes out; ``seq`` numbers the commands in the order they were received
(``stop`` during a motion is answered first but received second).

Fault injection for tests: ``drop`` ignores the first N packets of a command
word (a lost UDP packet: the SDK client retries); ``late`` sends every reply to a
command word that many seconds late (a slow link or drone), holding the commands
behind it.

Run: ``python -m devtools.tello_emulator --speed 0.05 --log drone.jsonl``
(prints ``ready <ip> <port>`` once it listens).
"""

from __future__ import annotations

import argparse
import json
import math
import queue
import socket
import sys
import threading
import time
from pathlib import Path

from timelyllm_ros.robots.tello_sdk import SDK_MOVES, SDK_TURNS, motion_seconds
from timelyllm_ros.skills.exec_model import ExecTimeModel
from timelyllm_ros.skills.schema import SkillSet
from timelyllm_ros.skills.skill_files import load_skill_set

CONTROL_PORT = 8889
STATE_PORT = 8890
TAKEOFF_S = 5.0  # a real Tello needs ~5 s to take off and ~3 s to land (not in the paper's model)
TAKEOFF_HEIGHT_CM = 80
LAND_S = 3.0
UNMODELLED_MOTION_S = 2.0  # a motion no skill of the set performs (a custom skill set): some plausible time
READS = ("battery?", "speed?", "time?", "height?", "temp?", "attitude?", "baro?", "acceleration?", "tof?",
         "wifi?", "sdk?", "sn?")


class TelloEmulator:
    """One emulated drone. ``start()`` binds and serves in background threads; ``close()`` stops them."""

    def __init__(self, bind_ip: str = "0.0.0.0", port: int = CONTROL_PORT, *, state_port: int = STATE_PORT,
                 speed: float = 1.0, log_path: str | Path | None = None, battery: int = 87,
                 drop: dict[str, int] | None = None, late: dict[str, float] | None = None,
                 state_period_s: float = 0.1,
                 skill_set: SkillSet | str = "drone") -> None:
        if speed <= 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self.bind_ip, self.port, self.state_port = bind_ip, port, state_port
        self.speed = speed
        self.battery = battery
        self.drop = dict(drop or {})
        self.late = dict(late or {})
        self.state_period_s = state_period_s
        self.model = ExecTimeModel(load_skill_set(skill_set) if isinstance(skill_set, str) else skill_set, learn=False)
        self.log_path = Path(log_path) if log_path else None
        self.log: list[dict] = []
        self._log_lock = threading.Lock()
        self.sdk_mode = False
        self.flying = False
        self.height_cm = 0
        self.yaw = 0
        self.pos = [0.0, 0.0]  # cm, x ahead at start, y to the left
        self.client: tuple[str, int] | None = None
        self._t0 = time.monotonic()
        self._work: queue.Queue = queue.Queue()
        self._seq = 0
        self._interrupt = threading.Event()
        self._interrupt_reply = "ok"
        self._closed = threading.Event()
        self._sock: socket.socket | None = None
        self._threads: list[threading.Thread] = []

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> TelloEmulator:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((self.bind_ip, self.port))
        self._sock.settimeout(0.2)  # so that close() is noticed
        for target, name in ((self._recv_loop, "recv"), (self._work_loop, "work"), (self._state_loop, "state")):
            t = threading.Thread(target=target, name=f"tello-emu-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def close(self) -> None:
        self._closed.set()
        self._interrupt.set()
        self._work.put(None)
        for t in self._threads:
            t.join(timeout=2)
        if self._sock is not None:
            self._sock.close()

    def __enter__(self) -> TelloEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def commands(self) -> list[str]:
        """Commands received and not dropped, in the order received."""
        with self._log_lock:
            return [e["cmd"] for e in sorted(self.log, key=lambda e: e["seq"]) if not e.get("dropped")]

    # -- protocol ------------------------------------------------------------------
    def _record(self, entry: dict) -> None:
        entry["t"] = round(time.time(), 4)
        with self._log_lock:
            self.log.append(entry)
            if self.log_path is not None:
                with self.log_path.open("a") as f:
                    f.write(json.dumps(entry) + "\n")

    def _reply(self, addr: tuple[str, int], text: str) -> None:
        try:
            assert self._sock is not None
            self._sock.sendto(text.encode(), addr)
        except OSError:
            pass  # client gone: a real drone does not care either

    def _recv_loop(self) -> None:
        assert self._sock is not None
        while not self._closed.is_set():
            try:
                data, addr = self._sock.recvfrom(1024)
            except TimeoutError:
                continue
            except OSError:
                return
            cmd = data.decode("utf-8", "replace").strip()
            word = cmd.split(" ")[0]
            self._seq += 1
            seq = self._seq
            if self.drop.get(word, 0) > 0:
                self.drop[word] -= 1
                self._record({"seq": seq, "cmd": cmd, "reply": None, "dropped": True})
                continue
            if cmd in ("stop", "emergency"):  # act at once, even during a motion
                self._interrupt_reply = "ok" if cmd == "stop" else "error Motor stop"
                self._interrupt.set()
                if cmd == "emergency":
                    self.flying, self.height_cm = False, 0
                self._record({"seq": seq, "cmd": cmd, "reply": "ok"})
                self._reply(addr, "ok")
                continue
            self._work.put((seq, cmd, addr))

    def _work_loop(self) -> None:
        while not self._closed.is_set():
            item = self._work.get()
            if item is None:
                return
            seq, cmd, addr = item
            self._interrupt.clear()
            reply = self._execute(cmd, addr)
            delay = self.late.get(cmd.split(" ")[0], 0.0)
            if delay > 0:
                time.sleep(delay)
            self._record({"seq": seq, "cmd": cmd, "reply": reply})
            self._reply(addr, reply)

    def _fly(self, seconds: float) -> float:
        """Fly for ``seconds`` (scaled); the share of it done (1.0: all, less when stop/emergency cut it)."""
        total = max(0.0, seconds * self.speed)
        t0 = time.monotonic()
        if not self._interrupt.wait(total):
            return 1.0
        return min(1.0, (time.monotonic() - t0) / total) if total > 0 else 1.0

    def _hover_at(self, height_cm: int) -> None:
        """Where a cut take-off or landing leaves the drone: hovering, unless it is still within the SDK's
        height resolution (1 dm) of the ground, where it settles on the ground with its motors off."""
        self.flying = height_cm >= 10
        self.height_cm = height_cm if self.flying else 0

    def _cut(self) -> str:
        """A command was cut: after ``emergency`` the motors are off (the drone drops), after ``stop`` it hovers."""
        if self._interrupt_reply != "ok":
            self.flying, self.height_cm = False, 0
        return self._interrupt_reply

    def _execute(self, cmd: str, addr: tuple[str, int]) -> str:
        parts = cmd.split()
        if not parts:
            return "error"
        word, args = parts[0], parts[1:]
        if word == "command" and not args:
            self.sdk_mode = True
            self.client = addr
            return "ok"
        if not self.sdk_mode:
            return "error Not in SDK mode"
        if word in READS and not args:
            return self._read(word)
        if word == "keepalive" and not args:
            return "ok"
        if word == "takeoff" and not args:
            if self.flying:
                return "error Already flying"
            done = self._fly(TAKEOFF_S)
            self._hover_at(int(TAKEOFF_HEIGHT_CM * done) if done < 1.0 else TAKEOFF_HEIGHT_CM)
            return "ok" if done >= 1.0 else self._cut()
        if word == "land" and not args:
            start = self.height_cm
            done = self._fly(LAND_S)
            if done >= 1.0:
                self.flying, self.height_cm = False, 0
                return "ok"
            self._hover_at(int(start * (1.0 - done)))  # stopped on the way down: hovering there
            return self._cut()
        if word == "speed" and len(args) == 1 and _int(args[0]) is not None and 10 <= _int(args[0]) <= 100:
            return "ok"
        if word in SDK_MOVES and len(args) == 1:
            v = _int(args[0])
            if v is None or not 20 <= v <= 500:
                return "error"
            if not self.flying:
                return "error Not flying"
            done = self._fly(self.motion_s(word, v))
            self._apply_move(word, v * done)
            return "ok" if done >= 1.0 else self._cut()
        if word in SDK_TURNS and len(args) == 1:
            v = _int(args[0])
            if v is None or not 1 <= v <= 360:
                return "error"
            if not self.flying:
                return "error Not flying"
            done = self._fly(self.motion_s(word, v))
            turned = int(round(v * done))
            self.yaw = _wrap(self.yaw + (turned if SDK_TURNS[word] else -turned))
            return "ok" if done >= 1.0 else self._cut()
        return "error"

    def motion_s(self, word: str, value: int) -> float:
        """Modelled duration (s, before ``speed``) of SDK motion ``<word> <value>``."""
        t = motion_seconds(self.model, word, value)
        return UNMODELLED_MOTION_S if t is None else t

    def _apply_move(self, word: str, v: float) -> None:
        if word in ("up", "down"):
            self.height_cm = max(0, int(self.height_cm + (v if word == "up" else -v)))
            return
        rel = {"forward": 0, "right": 90, "back": 180, "left": -90}[word]
        a = math.radians(self.yaw + rel)
        self.pos[0] += v * math.cos(a)
        self.pos[1] -= v * math.sin(a)

    def _read(self, word: str) -> str:
        return {
            "battery?": str(self.battery), "speed?": "100.0", "time?": f"{int(time.monotonic() - self._t0)}s",
            "height?": f"{self.height_cm // 10}dm", "temp?": "60~62C", "attitude?": f"pitch:0;roll:0;yaw:{self.yaw};",
            "baro?": "0.0", "acceleration?": "agx:0.00;agy:0.00;agz:-1000.00;", "tof?": f"{self.height_cm * 10}mm",
            "wifi?": "90", "sdk?": "30", "sn?": "0TQZEMU000001",
        }[word]

    def state_line(self) -> str:
        return (f"mid:-1;x:0;y:0;z:0;mpry:0,0,0;pitch:0;roll:0;yaw:{self.yaw};vgx:0;vgy:0;vgz:0;templ:60;temph:62;"
                f"tof:{max(10, self.height_cm)};h:{self.height_cm};bat:{self.battery};baro:0.00;"
                f"time:{int(time.monotonic() - self._t0)};agx:0.00;agy:0.00;agz:-1000.00;\r\n")

    def _state_loop(self) -> None:
        st = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            while not self._closed.wait(self.state_period_s):
                if self.client is not None:
                    try:
                        st.sendto(self.state_line().encode(), (self.client[0], self.state_port))
                    except OSError:
                        pass
        finally:
            st.close()


def _int(s: str) -> int | None:
    try:
        return int(s)
    except ValueError:
        return None


def _wrap(deg: int) -> int:
    return (deg + 180) % 360 - 180


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bind", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=CONTROL_PORT)
    ap.add_argument("--speed", type=float, default=1.0, help="time factor on the modelled durations")
    ap.add_argument("--log", default=None, help="JSON-lines command log")
    ap.add_argument("--battery", type=int, default=87)
    ap.add_argument("--skills", default="drone", help="skill set whose execution-time models time the motions")
    ap.add_argument("--drop", action="append", default=[], help="WORD:N ignore the first N packets of WORD")
    ap.add_argument("--late", action="append", default=[], help="WORD:S send every reply to WORD S seconds late")
    ap.add_argument("--max-lifetime", type=float, default=3600.0, help="exit after this many seconds (a bound)")
    a = ap.parse_args(argv)
    drop, late = {}, {}
    for opt, specs, kind, into in (("--drop", a.drop, int, drop), ("--late", a.late, float, late)):
        for d in specs:
            w, _, v = d.partition(":")
            try:
                into[w] = kind(v or 1)
            except ValueError:
                ap.error(f"{opt}: WORD:{'N' if kind is int else 'SECONDS'} expected, got {d!r}")
            if not w or into[w] < 0:
                ap.error(f"{opt}: WORD:{'N' if kind is int else 'SECONDS'} with a word and a value >= 0, got {d!r}")
    emu = TelloEmulator(a.bind, a.port, speed=a.speed, log_path=a.log, battery=a.battery, drop=drop, late=late,
                        skill_set=a.skills).start()
    print(f"ready {a.bind} {a.port}", flush=True)
    try:
        time.sleep(a.max_lifetime)
    except KeyboardInterrupt:
        pass
    finally:
        emu.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
