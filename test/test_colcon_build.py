"""The package builds with colcon in a fresh workspace and works from that install space alone.

The workspace is the session's ``colcon_ws`` (test/colcon_ws.py: the repository's ``git ls-files`` copied into
``<tmp>/ws/src/timelyllm_ros`` and built exactly as README.md says). Every check then runs in a fresh ``bash``
that sources only ``ws/install/setup.bash``: the checkout's own install/ and source tree are off every path, and
the checks assert that what they import comes from the workspace.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from colcon_ws import PKG, ROOT, VENV, clean_env, under

from timelyllm_ros.ros import NODE_EXECUTABLES

pytestmark = pytest.mark.colcon

RUN_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def ws(colcon_ws) -> Path:
    return colcon_ws


def _run_installed(ws: Path, *cmd: str) -> subprocess.CompletedProcess:
    """Run cmd in a bash that sourced only the workspace's install/setup.bash (besides the venv's wheels),
    from a folder outside the checkout (python -c puts the working directory first on sys.path)."""
    script = '. "$1" && shift && exec "$@"'
    return subprocess.run(["bash", "-c", script, "_", str(ws / "install" / "setup.bash"), *cmd],
                          cwd=ws.parent, env=clean_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def _probe(ws: Path, code: str) -> dict:
    p = _run_installed(ws, str(VENV / "bin" / "python"), "-c", code)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1])


_IMPORT_PROBE = """
import importlib, json, os, sys
import timelyllm_ros
names = {names!r}
found = {{}}
for kind, types in names.items():
    mod = importlib.import_module("timelyllm_ros." + kind)
    for t in types:
        cls = getattr(mod, t)
        found[kind + "/" + t] = sys.modules[cls.__module__].__file__
from rclpy.serialization import deserialize_message, serialize_message
from timelyllm_ros.msg import PlanSegment
seg = PlanSegment(robot_id="drone_0", task_id="t1", segment_index=3, text="takeoff()", is_final=True)
back = deserialize_message(serialize_message(seg), PlanSegment)
import timelyllm_ros.ros.client
print(json.dumps({{
    "pkg_file": timelyllm_ros.__file__, "pkg_path": list(timelyllm_ros.__path__),
    "client_file": timelyllm_ros.ros.client.__file__, "types": found, "sys_path": sys.path,
    "roundtrip": back == seg, "env": {{k: os.environ.get(k, "") for k in
        ("PYTHONPATH", "LD_LIBRARY_PATH", "AMENT_PREFIX_PATH")}},
}}))
"""


def test_interfaces_and_python_package_import_from_the_install_space(ws):
    src = ws / "src" / PKG
    names = {kind: sorted(f.stem for f in (src / kind).glob(f"*.{kind}")) for kind in ("msg", "srv", "action")}
    assert all(names.values()), names
    r = _probe(ws, _IMPORT_PROBE.format(names=names))
    install = ws / "install"
    assert under(r["pkg_file"], install), f"timelyllm_ros imported from {r['pkg_file']}, not from {install}"
    assert all(under(p, install) for p in r["pkg_path"]), r["pkg_path"]
    assert under(r["client_file"], install), r["client_file"]
    assert set(r["types"]) == {f"{k}/{t}" for k, ts in names.items() for t in ts}
    assert all(under(f, install) for f in r["types"].values()), r["types"]
    assert r["roundtrip"], "PlanSegment did not survive serialize/deserialize (typesupport libraries)"
    # the checkout is on no path, except the venv that holds the ROS 2 wheels
    leaks = [p for p in r["sys_path"] if p and under(p, ROOT) and not under(p, VENV)]
    assert not leaks, f"the checkout is on sys.path: {leaks}"
    for var, value in r["env"].items():
        leaks = [p for p in value.split(os.pathsep) if p and under(p, ROOT) and not under(p, VENV)]
        assert not leaks, f"{var} names the checkout: {leaks}"


def test_installed_node_executables_and_help(ws):
    libexec = ws / "install" / PKG / "lib" / PKG
    missing = [n for n in NODE_EXECUTABLES if not ((libexec / n).is_file() and os.access(libexec / n, os.X_OK))]
    assert not missing, f"not installed as executables in {libexec}: {missing}"
    p = _run_installed(ws, str(libexec / "plan_client"), "--help")
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert p.stdout.startswith("usage: plan_client") and "--robot-id" in p.stdout, p.stdout


_SHARE_PROBE = """
import json, os
from ament_index_python.packages import get_package_prefix, get_package_share_directory
from timelyllm_ros import paths
share = get_package_share_directory("timelyllm_ros")
def ls(sub, pattern):
    import glob
    return sorted(os.path.relpath(f, share) for f in glob.glob(os.path.join(share, sub, pattern)))
print(json.dumps({
    "prefix": get_package_prefix("timelyllm_ros"), "share": share, "share_dir": str(paths.share_dir()),
    "launch": ls("launch", "*.launch.py"), "config": ls("config", "*.yaml"), "skills": ls("skills", "*.yaml"),
}))
"""


def test_ament_index_finds_launch_files_config_and_skills(ws):
    r = _probe(ws, _SHARE_PROBE)
    share = ws / "install" / PKG / "share" / PKG
    assert Path(r["prefix"]).resolve() == (ws / "install" / PKG).resolve(), r["prefix"]
    assert Path(r["share"]).resolve() == share.resolve(), r["share"]
    # the package's own data lookup (TIMELYLLM_SHARE unset) lands on the same folder
    assert Path(r["share_dir"]).resolve() == share.resolve(), r["share_dir"]

    def copied(sub: str, pattern: str) -> list[str]:
        src = ws / "src" / PKG
        return sorted(str(f.relative_to(src)) for f in (src / sub).glob(pattern))

    for sub, pattern in (("launch", "*.launch.py"), ("config", "*.yaml"), ("skills", "*.yaml")):
        assert r[sub] and r[sub] == copied(sub, pattern), (sub, r[sub])
    assert (share / "package.xml").is_file()
