"""One colcon workspace per test session: the repository built as README.md says, in a fresh ``<tmp>/ws``.

The repository's files (``git ls-files``: tracked files plus untracked ones git does not ignore, so never
build/, install/, .venv/ or out/) are copied into ``ws/src/timelyllm_ros`` and built with
``colcon build --packages-select timelyllm_ros`` (AMENT_PREFIX_PATH and CMAKE_PREFIX_PATH at the venv that holds
the ROS 2 wheels). test_colcon_build checks the install space; test_launch runs the real ``ros2`` CLI on it. The
``colcon_ws`` fixture (conftest.py) builds it once for both.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(sys.prefix)  # the venv whose ROS 2 wheels (and colcon) the build uses
PKG = "timelyllm_ros"
BUILD_TIMEOUT_S = 1200  # a liveness bound: the build takes about a minute on 2 cores

# Variables that would let the checkout (env.sh) or an earlier Python start leak into the workspace:
# env.sh puts the source tree and ./install on PYTHONPATH, LD_LIBRARY_PATH and AMENT_PREFIX_PATH, and
# ros_wheels_bootstrapper's guard would stop the child's own re-exec that puts the wheels' libraries on
# LD_LIBRARY_PATH.
_STRIPPED = {"PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "AMENT_PREFIX_PATH", "CMAKE_PREFIX_PATH",
             "TIMELYLLM_SHARE", "_ROS_WHEELS_BOOTSTRAP_COMPLETE"}


def under(path: str | Path, parent: Path) -> bool:
    try:
        Path(path).resolve().relative_to(parent.resolve())
        return True
    except (ValueError, OSError):
        return False


def clean_env() -> dict[str, str]:
    """The caller's environment without the checkout: only the venv (ROS 2 wheels, colcon) is kept."""
    env = {k: v for k, v in os.environ.items() if k not in _STRIPPED and not k.startswith("COLCON")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and not under(p, ROOT)]
    env["PATH"] = os.pathsep.join([str(VENV / "bin"), *path])
    env["VIRTUAL_ENV"] = str(VENV)
    env["AMENT_PREFIX_PATH"] = str(VENV)  # without it: "No 'rosidl_typesupport_c' found"
    env["CMAKE_PREFIX_PATH"] = str(VENV)
    return env


def _repo_files() -> list[str]:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             check=True, capture_output=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.fail(f"`git ls-files` failed in {ROOT} (this test copies a git checkout's files): {e}")
    return [f for f in out.decode().split("\0") if f]


def copy_repo(dst: Path) -> None:
    n = 0
    for rel in _repo_files():
        src = ROOT / rel
        if not src.is_file() or src.is_symlink():  # deleted but still tracked; links are not package data
            continue
        out = dst / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out)
        n += 1
    assert n and (dst / "package.xml").is_file() and (dst / "CMakeLists.txt").is_file(), f"copied {n} files"


def _log_tail(ws: Path, pkg: str, lines: int = 80) -> str:
    log = ws / "log" / "latest_build" / pkg / "stdout_stderr.log"
    if not log.is_file():
        return f"(no {log})"
    return f"--- last {lines} lines of {log} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def colcon_build(ws: Path, pkg: str, *cmake_args: str) -> float:
    """``colcon build --packages-select pkg`` in ``ws`` (pytest.fail with the log's tail if it fails); seconds."""
    colcon = shutil.which("colcon", path=str(VENV / "bin"))
    if colcon is None:
        pytest.fail(f"colcon is not installed in {VENV}: run scripts/setup.sh (requirements/base.txt pins "
                    "colcon-common-extensions)")
    cmd = [colcon, "build", "--packages-select", pkg, "--cmake-args", f"-DPython3_EXECUTABLE={VENV / 'bin' / 'python'}",
           *cmake_args]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ws, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # colcon, cmake, make and the compilers
        out, _ = proc.communicate()
        pytest.fail(f"colcon build still running after {BUILD_TIMEOUT_S} s\n{out[-4000:]}\n{_log_tail(ws, pkg)}")
    took = time.monotonic() - t0
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed (exit {proc.returncode}, {took:.0f} s)\n{out[-4000:]}\n"
                    f"{_log_tail(ws, pkg)}")
    print(f"colcon build of {pkg} took {took:.1f} s")
    assert (ws / "install" / "setup.bash").is_file(), out
    return took


def build_workspace(root: Path) -> Path:
    """A fresh workspace ``root/ws`` with the repo in src/, built with colcon: the README's commands."""
    ws = root / "ws"
    copy_repo(ws / "src" / PKG)
    colcon_build(ws, PKG)
    return ws
