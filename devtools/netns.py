"""Emulated Tello drones in network namespaces (needs root and ``ip``).

djitellopy binds UDP 8889/8890 on all interfaces of its process and talks to
(drone_ip, 8889), so every emulated drone needs an address of its own with
its own port 8889. Each drone gets a namespace ``tllm<pid>d<i>`` joined to
the root namespace by a veth pair with a /30 from the benchmarking range
198.18.0.0/15 (RFC 2544; never routed): host side ``.4i+1``, drone ``.4i+2``.
Traffic goes only between the root namespace and these namespaces.

Names carry the creating process id, so :func:`sweep_stale` can remove what
a killed run left behind without touching a live run's namespaces.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "tllm"
_NAME_RE = re.compile(rf"^{PREFIX}(\d+)d(\d+)$")
MAX_DRONES = 32


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be created here (not root, no ``ip``, no kernel support)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=check)


def netns_unavailable_reason() -> str | None:
    """None if namespaces can be made here, else why not (for pytest skips)."""
    if shutil.which("ip") is None:
        return "the 'ip' tool (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    name = f"{PREFIX}{os.getpid()}probe"
    try:
        r = _ip("netns", "add", name, check=False)
        if r.returncode != 0:
            return f"'ip netns add' failed: {r.stderr.strip()}"
    finally:
        _ip("netns", "del", name, check=False)
    return None


_GENERATIONS = itertools.count()


def _subnet_base(pid: int, generation: int = 0) -> ipaddress.IPv4Address:
    # A /24 per network inside 198.18.0.0/15, picked by pid so concurrent runs rarely collide, and
    # moved on for every new network of this process: djitellopy keys its state by host address and a
    # garbage-collected Tello of an earlier fleet deletes its host's entry (Tello.__del__ -> end()).
    k = (pid + 37 * generation) % 512
    return ipaddress.IPv4Address(f"198.{18 + k // 256}.{k % 256}.0")


@dataclass
class DroneNet:
    index: int
    netns: str
    host_if: str
    host_ip: str  # root-namespace side (where djitellopy is)
    drone_ip: str  # the emulated drone's address


@dataclass
class DroneNetwork:
    """N namespaces with a veth link each. Use as a context manager; :meth:`down` is idempotent."""

    count: int
    pid: int = field(default_factory=os.getpid)
    generation: int = field(default_factory=lambda: next(_GENERATIONS))
    drones: list[DroneNet] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_DRONES:
            raise ValueError(f"count must be in 1..{MAX_DRONES}, got {self.count}")
        base = _subnet_base(self.pid, self.generation)
        for i in range(self.count):
            self.drones.append(DroneNet(i, f"{PREFIX}{self.pid}d{i}", f"tl{self.pid}h{i}",
                                        str(base + 4 * i + 1), str(base + 4 * i + 2)))

    def up(self) -> DroneNetwork:
        reason = netns_unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        try:
            for d in self.drones:
                peer = f"tl{self.pid}d{d.index}"
                _ip("netns", "add", d.netns)
                _ip("link", "add", d.host_if, "type", "veth", "peer", "name", peer)
                _ip("link", "set", peer, "netns", d.netns)
                _ip("addr", "add", f"{d.host_ip}/30", "dev", d.host_if)
                _ip("link", "set", d.host_if, "up")
                _ip("-n", d.netns, "link", "set", "lo", "up")
                _ip("-n", d.netns, "addr", "add", f"{d.drone_ip}/30", "dev", peer)
                _ip("-n", d.netns, "link", "set", peer, "up")
        except subprocess.CalledProcessError as e:
            self.down()
            raise NetnsUnavailable(f"setting up {e.cmd}: {e.stderr.strip()}") from None
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        for d in self.drones:
            remove_namespace(d.netns, d.host_if)

    def __enter__(self) -> DroneNetwork:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()


def remove_namespace(netns: str, host_if: str | None = None) -> None:
    """Kill what runs in ``netns`` (processes we started there), delete it and its veth; no error if absent."""
    r = _ip("netns", "pids", netns, check=False)
    for pid in r.stdout.split() if r.returncode == 0 else []:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", netns, check=False)
    if host_if:
        _ip("link", "del", host_if, check=False)  # normally gone with its peer


def sweep_stale() -> list[str]:
    """Remove namespaces of ours whose creating process is dead (a run that was killed)."""
    r = _ip("netns", "list", check=False)
    removed = []
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME_RE.match(name)
        if m is None:
            continue
        pid = int(m.group(1))
        try:
            os.kill(pid, 0)
            continue  # alive: not ours to touch
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        remove_namespace(name, f"tl{pid}h{m.group(2)}")
        removed.append(name)
    return removed


@dataclass
class EmulatedDrone:
    net: DroneNet
    log_path: Path
    proc: subprocess.Popen

    @property
    def host(self) -> str:
        return self.net.drone_ip

    def log(self) -> list[dict]:
        import json

        if not self.log_path.exists():
            return []
        entries = [json.loads(x) for x in self.log_path.read_text().splitlines() if x.strip()]
        return sorted(entries, key=lambda e: e["seq"])  # in the order received

    def commands(self) -> list[str]:
        """Commands the drone received (dropped packets excluded), in the order received."""
        return [e["cmd"] for e in self.log() if not e.get("dropped")]

    def kill(self) -> None:
        """Simulate a drone that is gone (power loss)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)


@contextlib.contextmanager
def emulated_drones(count: int, *, speed: float = 0.05, log_dir: str | Path | None = None,
                    drop: dict[int, list[str]] | None = None, late: dict[int, list[str]] | None = None,
                    start_timeout_s: float = 30.0,
                    max_lifetime_s: float = 1800.0) -> Iterator[list[EmulatedDrone]]:
    """``count`` Tello emulators, each in its own namespace; everything is removed on exit, also on errors.

    ``drop``: per drone index, ``WORD:N`` fault injections; ``late``: per drone index, ``WORD:SECONDS`` slow
    replies (see the emulator)."""
    sweep_stale()
    tmp = None
    if log_dir is None:
        tmp = tempfile.mkdtemp(prefix="tello_emu_")
        log_dir = tmp
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    net = DroneNetwork(count)
    drones: list[EmulatedDrone] = []
    try:
        net.up()
        for d in net.drones:
            log_path = log_dir / f"drone_{d.index}.jsonl"
            log_path.unlink(missing_ok=True)
            cmd = ["ip", "netns", "exec", d.netns, sys.executable, "-m", "devtools.tello_emulator",
                   "--bind", d.drone_ip, "--speed", str(speed), "--log", str(log_path),
                   "--max-lifetime", str(max_lifetime_s)]
            for spec in (drop or {}).get(d.index, []):
                cmd += ["--drop", spec]
            for spec in (late or {}).get(d.index, []):
                cmd += ["--late", spec]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    env=_child_env())
            drones.append(EmulatedDrone(d, log_path, proc))
        for e in drones:  # started in parallel above; now wait for each to listen
            _wait_ready(e, start_timeout_s)
        yield drones
    finally:
        for e in drones:
            if e.proc.poll() is None:
                e.proc.terminate()
        for e in drones:
            try:
                e.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                e.proc.kill()
            if e.proc.stdout:
                e.proc.stdout.close()
        net.down()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _child_env() -> dict[str, str]:
    env = os.environ.copy()
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _wait_ready(e: EmulatedDrone, timeout_s: float) -> None:
    import selectors

    sel = selectors.DefaultSelector()
    assert e.proc.stdout is not None
    sel.register(e.proc.stdout, selectors.EVENT_READ)
    end = time.monotonic() + timeout_s
    out = []
    try:
        while time.monotonic() < end:
            if not sel.select(timeout=max(0.0, end - time.monotonic())):
                break
            line = e.proc.stdout.readline()
            if not line:
                break
            out.append(line)
            if line.startswith("ready"):
                return
    finally:
        sel.close()
    raise RuntimeError(f"Tello emulator in {e.net.netns} did not start within {timeout_s} s: {''.join(out)[-2000:]}")
