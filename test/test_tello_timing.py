"""Tello SDK motions are timed by the skill that performs them, found by operation in the skill YAML (no ROS,
no network namespace: the emulator runs on the loopback interface)."""

from __future__ import annotations

import re
import socket

import pytest
import yaml

from devtools.tello_emulator import TelloEmulator
from timelyllm_ros.robots.tello_sdk import SDK_MOVES, SDK_TURNS, motion_call, motion_seconds
from timelyllm_ros.skills.exec_model import ExecTimeModel
from timelyllm_ros.skills.skill_files import load_skill_set, skill_set_from_dict, skills_dir

# The names the backend and the emulator used to hard-code: what the stock skill set must still give.
_STOCK = {"forward": "mf", "back": "mb", "left": "ml", "right": "mr", "up": "mu", "down": "md", "cw": "tc",
          "ccw": "tu"}
_SAMPLES = {**{w: (20, 50, 100, 333, 500) for w in SDK_MOVES}, **{w: (1, 45, 90, 180, 360) for w in SDK_TURNS}}
_RENAMED = {"mf": "fwd", "mb": "back_off", "tc": "turn_right", "tu": "turn_left", "mu": "climb"}


def _renamed_set():
    """The stock drone skills, renamed, with the fixed-distance approach moved first (before any move skill)."""
    raw = yaml.safe_load((skills_dir() / "drone_minispec.yaml").read_text())
    for s in raw["skills"]:
        if s["name"] in _RENAMED:
            s.update(name=_RENAMED[s["name"]], long_name=_RENAMED[s["name"]], aliases=[])
    approach = next(s for s in raw["skills"] if s["name"] == "a")  # op move, op_args {forward, cm: 100}
    raw["skills"].remove(approach)
    raw["skills"].insert(0, approach)
    raw["id"] = "drone_renamed"
    for s in raw["skills"]:  # a composite's time model names the skills it runs
        if runs := s.get("exec_time", {}).get("runs"):
            s["exec_time"]["runs"] = re.sub(r"\b(\w+)\(", lambda m: _RENAMED.get(m[1], m[1]) + "(", runs)
    tags = raw["plan_structure"]["first_by_tag"]  # the grammar names skills too
    raw["plan_structure"]["first_by_tag"] = {t: [_RENAMED.get(n, n) for n in ns] for t, ns in tags.items()}
    return skill_set_from_dict(raw)


def test_the_stock_skill_set_times_every_sdk_motion_by_the_skill_it_always_did():
    model = ExecTimeModel(load_skill_set("drone"), learn=False)
    for word, values in _SAMPLES.items():
        for v in values:
            call = motion_call(model.skillset, word, v)
            assert call is not None and call.name == _STOCK[word] and call.args == (v,)
            old = model.estimate(model.skillset.parse(f"{_STOCK[word]}({v})")).typical_s
            assert motion_seconds(model, word, v) == pytest.approx(old)
    assert motion_call(model.skillset, "flip", 1) is None and motion_seconds(model, "speed", 50) is None


def test_renamed_and_reordered_skills_time_the_same_motions_the_same():
    stock, renamed = ExecTimeModel(load_skill_set("drone"), learn=False), ExecTimeModel(_renamed_set(), learn=False)
    for word, values in _SAMPLES.items():
        for v in values:
            call = motion_call(renamed.skillset, word, v)
            assert call is not None and call.name == _RENAMED.get(_STOCK[word], _STOCK[word])
            assert motion_seconds(renamed, word, v) == pytest.approx(motion_seconds(stock, word, v))


def test_a_skill_that_fixes_the_value_times_only_that_value_and_only_when_no_skill_takes_it_as_argument():
    raw = yaml.safe_load((skills_dir() / "drone_minispec.yaml").read_text())
    raw["skills"] = [s for s in raw["skills"] if s["name"] not in ("md", "tc")]
    tags = raw["plan_structure"]["first_by_tag"]  # the grammar names skills too
    raw["plan_structure"]["first_by_tag"] = {t: [n for n in ns if n != "md"] for t, ns in tags.items()}
    raw["skills"] += [
        {"name": "drop_30", "op": "move", "op_args": {"direction": "down", "cm": 30},
         "exec_time": {"model": "constant", "value": 1.25}},
        {"name": "about_face", "op": "rotate", "op_args": {"clockwise": True, "degrees": 180},
         "exec_time": {"model": "constant", "value": 3.0}},
    ]
    model = ExecTimeModel(skill_set_from_dict(raw), learn=False)
    assert motion_call(model.skillset, "down", 30).name == "drop_30"
    assert motion_seconds(model, "down", 30) == 1.25 and motion_seconds(model, "down", 40) is None
    assert motion_seconds(model, "cw", 180) == 3.0 and motion_seconds(model, "cw", 90) is None
    assert motion_call(model.skillset, "forward", 100).name == "mf"  # not `a`, which fixes cm = 100


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_emulator_flies_and_times_a_renamed_skill_set_like_the_stock_one():
    renamed = _renamed_set()
    stock_emu = TelloEmulator(speed=0.01)  # not started: only its timing
    for word, values in _SAMPLES.items():
        for v in values:
            assert TelloEmulator(speed=0.01, skill_set=renamed).motion_s(word, v) == stock_emu.motion_s(word, v)
    with TelloEmulator("127.0.0.1", _free_udp_port(), speed=0.01, skill_set=renamed) as emu, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.settimeout(10)
        client.bind(("127.0.0.1", 0))
        replies = []
        for cmd in ["command", "takeoff", "forward 50", "cw 90", "ccw 45", "up 30", "back 20", "forward 10"]:
            client.sendto(cmd.encode(), ("127.0.0.1", emu.port))
            replies.append(client.recvfrom(1024)[0].decode())
        assert replies == ["ok"] * 7 + ["error"]  # 10 cm is below the SDK's 20: refused as before
        assert emu.yaw == 45 and emu.height_cm == 110
        assert emu.commands() == ["command", "takeoff", "forward 50", "cw 90", "ccw 45", "up 30", "back 20",
                                  "forward 10"]
