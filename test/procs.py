"""Child processes for fault-injection tests: start, wait for a log line, kill, always clean up.

Each child runs in a session of its own (``start_new_session``), so a stop or kill reaches the
whole process group (``ip netns exec`` execs its command, the ROS wheel bootstrapper re-execs
Python: both keep the pid). Output (stdout and stderr together) is kept in memory and in a log
file, so a failing test can show what the child said.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path


class Proc:
    """One child process; use :class:`Procs` to make sure it is stopped."""

    def __init__(self, name: str, cmd: Sequence[str], *, env: dict[str, str] | None = None,
                 log_dir: str | os.PathLike[str] | None = None, cwd: str | None = None,
                 on_line: Callable[[str], None] | None = None) -> None:
        self.name = name
        self.on_line = on_line  # called (reader thread) with every output line
        self.cmd = list(cmd)
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.env.setdefault("RCUTILS_LOGGING_BUFFERED_STREAM", "0")
        self.cwd = cwd
        self.log_path = Path(log_dir) / f"{name}.log" if log_dir is not None else None
        self.lines: list[str] = []
        self._cv = threading.Condition()
        self.proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    # -- life cycle -----------------------------------------------------------------------------
    def start(self) -> Proc:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.env, cwd=self.cwd, text=True,
                                     errors="replace", bufsize=1, start_new_session=True)
        self._reader = threading.Thread(target=self._read, name=f"read-{self.name}", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        log = open(self.log_path, "a") if self.log_path is not None else None  # noqa: SIM115
        try:
            for line in self.proc.stdout:
                if log is not None:
                    log.write(line)
                    log.flush()
                if self.on_line is not None:
                    try:
                        self.on_line(line.rstrip("\n"))
                    except Exception as e:  # noqa: BLE001 - a broken parser must not stop the reading
                        print(f"{self.name}: on_line failed on {line!r}: {e!r}", file=sys.stderr)
                with self._cv:
                    self.lines.append(line.rstrip("\n"))
                    self._cv.notify_all()
        finally:
            if log is not None:
                log.close()
            with self._cv:
                self._cv.notify_all()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_for(self, pattern: str, timeout: float = 30.0, *, after: int = 0) -> str:
        """The first output line (from line ``after`` on) matching ``pattern`` (a regex); raises
        RuntimeError with the output's tail if the process exits or ``timeout`` passes first."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        seen = after
        with self._cv:
            while True:
                for line in self.lines[seen:]:
                    if rx.search(line):
                        return line
                seen = len(self.lines)
                left = end - time.monotonic()
                if left <= 0 or (not self.alive() and not (self._reader and self._reader.is_alive())):
                    break
                self._cv.wait(min(left, 0.2))
        state = "still running" if self.alive() else f"exited with {self.proc.returncode if self.proc else '?'}"
        raise RuntimeError(f"{self.name}: no line matching {pattern!r} within {timeout:g} s ({state}); "
                           f"output:\n{self.tail()}")

    def count(self, pattern: str) -> int:
        rx = re.compile(pattern)
        with self._cv:
            return sum(1 for line in self.lines if rx.search(line))

    def tail(self, n: int = 60) -> str:
        with self._cv:
            return "\n".join(self.lines[-n:])

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)  # its own session: pgid == pid

    def kill(self) -> int | None:
        """SIGKILL the process group at once (a crash) and reap it."""
        if self.proc is None:
            return None
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._join_reader()
        return self.proc.returncode

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGINT (a clean Ctrl-C), then SIGKILL if it has not exited within ``timeout``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self._signal_group(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=10)
        else:
            self._signal_group(signal.SIGKILL)  # anything it left behind in its group
        self._join_reader()
        return self.proc.returncode

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)
        if self.proc is not None and self.proc.stdout is not None and not (self._reader and self._reader.is_alive()):
            with contextlib.suppress(Exception):
                self.proc.stdout.close()


class Procs:
    """The processes of one test; :meth:`close` stops every one still running (fixture teardown)."""

    def __init__(self, log_dir: str | os.PathLike[str], env: dict[str, str] | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ if env is None else env)
        self.all: list[Proc] = []
        self._names: dict[str, int] = {}

    def start(self, name: str, cmd: Sequence[str], *, env: dict[str, str] | None = None,
              ready: str | None = None, timeout: float = 60.0, on_line: Callable[[str], None] | None = None) -> Proc:
        n = self._names[name] = self._names.get(name, 0) + 1
        p = Proc(name if n == 1 else f"{name}.{n}", cmd, env=env if env is not None else self.env,
                 log_dir=self.log_dir, on_line=on_line)
        self.all.append(p)
        p.start()
        if ready is not None:
            p.wait_for(ready, timeout)
        return p

    def python(self, name: str, module: str, *ros_args: str, prefix: Sequence[str] = (),
               env: dict[str, str] | None = None, ready: str | None = None, timeout: float = 60.0) -> Proc:
        """``[prefix...] python -m module --ros-args ros_args...``."""
        cmd = [*prefix, sys.executable, "-m", module]
        if ros_args:
            cmd += ["--ros-args", *ros_args]
        return self.start(name, cmd, env=env, ready=ready, timeout=timeout)

    def report(self, n: int = 40) -> str:
        return "\n".join(f"----- {p.name} (pid {p.proc.pid if p.proc else '-'}, "
                         f"{'running' if p.alive() else 'rc=' + str(p.proc.returncode if p.proc else None)}) -----\n"
                         f"{p.tail(n)}" for p in self.all)

    def close(self) -> None:
        for p in reversed(self.all):
            with contextlib.suppress(Exception):
                p.stop(timeout=8)


# -- a report observer in a process of its own ------------------------------------------------------------------
OBSERVER_READY = "observer ready"


def observe(argv: list[str] | None = None) -> int:
    """``python test/procs.py observe [--probe ROBOT]...``: print every SegmentDone and SegmentAck as one JSON
    line (``done {...}`` / ``ack {...}``) until SIGINT.

    Why a process: Fast DDS takes the host's network interfaces once per process, when the process creates its
    first participant; a test process that used ROS before a veth link existed can never talk over that link.

    ``--probe ROBOT``: before saying ready, publish a segment that does not parse for a task of our own to the
    robot until its refusal comes back, so the robot's reports are known to reach this process.
    """
    import argparse
    import json

    import rclpy

    from timelyllm_ros.msg import PlanSegment, SegmentAck, SegmentDone
    from timelyllm_ros.ros import topics
    from timelyllm_ros.ros.spin import PooledExecutor, Spinner

    ap = argparse.ArgumentParser(prog="procs.py observe")
    ap.add_argument("--probe", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args(argv)
    rclpy.init()
    node = rclpy.create_node("fault_observer")
    out_lock = threading.Lock()
    probes_back: set[str] = set()

    def emit(kind: str, m) -> None:
        rec = {"task_id": m.task_id, "robot_id": m.robot_id, "segment_index": int(m.segment_index)}
        if kind == "done":
            rec.update(success=bool(m.success), error=m.error, start=[m.start.sec, m.start.nanosec],
                       finish=[m.finish.sec, m.finish.nanosec])
            if m.task_id.startswith("probe-"):
                probes_back.add(m.task_id)
        with out_lock:
            print(f"{kind} {json.dumps(rec)}", flush=True)

    node.create_subscription(SegmentDone, topics.SEGMENT_DONE, lambda m: emit("done", m), topics.REPORTS_KEPT)
    node.create_subscription(SegmentAck, topics.SEGMENT_ACKS, lambda m: emit("ack", m), topics.REPORTS)
    ex = PooledExecutor(num_threads=2)
    ex.add_node(node)
    spinner = Spinner(ex)
    spinner.start()
    try:
        for robot in a.probe:
            pub = node.create_publisher(PlanSegment, topics.segment_topic(robot), topics.RELIABLE)
            end, k = time.monotonic() + a.timeout, 0
            while time.monotonic() < end:
                tid = f"probe-{robot}-{os.getpid()}-{k}"
                k += 1
                pub.publish(PlanSegment(task_id=tid, robot_id=robot, segment_index=0, text="probe(", is_final=True))
                t = time.monotonic()
                while tid not in probes_back and time.monotonic() - t < 1.0:
                    time.sleep(0.02)
                if tid in probes_back:
                    break
            else:
                print(f"observer: {robot} never answered a probe", flush=True)
                return 1
        print(OBSERVER_READY, flush=True)
        while spinner.is_alive():
            spinner.join(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        ex.shutdown(timeout_sec=2)
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["observe"]:
        sys.exit(observe(sys.argv[2:]))
    sys.exit(f"usage: {sys.argv[0]} observe [--probe ROBOT]...")
