"""The real djitellopy against emulated Tellos in network namespaces (no ROS)."""

from __future__ import annotations

import re
import time

import pytest

from devtools.netns import emulated_drones, netns_unavailable_reason
from timelyllm_ros.robots.base import RefusedError, RobotConnectionError
from timelyllm_ros.robots.interpreter import MiniSpecInterpreter
from timelyllm_ros.robots.perception import ScriptedScene
from timelyllm_ros.robots.tello_backend import TelloBackend
from timelyllm_ros.skills.skill_files import load_skill_set

_WHY = netns_unavailable_reason()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"emulated Tellos need network namespaces: {_WHY}")
SPEED = 0.02  # emulated time factor: mf(50) takes 2.17 s * 0.02


def _netns_names() -> str:
    import subprocess

    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_a_plan_moves_the_emulated_drone_with_exactly_the_expected_sdk_commands():
    with emulated_drones(1, speed=SPEED) as (drone,):
        backend = TelloBackend(drone.host, time_scale=SPEED)
        try:
            assert backend.connect() == 87
            it = MiniSpecInterpreter(load_skill_set("drone"), backend,
                                     ScriptedScene("Scene: [cat x:0.5 y:0.5 width:0.2 height:0.3]"))
            for seg in ["mf(50);", "?iv('cat')==True{", "tc(90);", "};", "2{", "mu(30)", "};", "?iv('cat')==True{",
                        "mb(20);", "}", "tu(45);"]:
                it.execute_segment(seg)
            time.sleep(0.3)  # state packets at 10 Hz
            assert backend.tello.get_yaw() == 45  # djitellopy's state receiver parsed the emulator's packets
        finally:
            backend.close()
        assert drone.commands() == ["command", "battery?", "takeoff", "forward 50", "cw 90", "up 30", "up 30",
                                    "ccw 45", "land"]
    assert drone.net.netns not in _netns_names().split()  # torn down


def test_unknown_skills_and_out_of_range_arguments_never_reach_the_emulator(caplog):
    with emulated_drones(1, speed=SPEED) as (drone,):
        backend = TelloBackend(drone.host, time_scale=SPEED)
        try:
            backend.connect()
            it = MiniSpecInterpreter(load_skill_set("drone"), backend,
                                     ScriptedScene("Scene: [wall x:0.5 y:0.5 dis:800]"))
            for bad in ["flip('left');", "mf(501);", "tc(0);", "mf(50", "emergency();"]:
                with pytest.raises(RefusedError):
                    it.execute_segment(bad)
            it.execute_segment("_1=od('wall');")
            with pytest.raises(RefusedError, match="800"):
                it.execute_segment("mf(_1);")  # only known on the robot: checked with the real value
        finally:
            backend.close()
        assert drone.commands() == ["command", "battery?"]


def test_a_lost_command_packet_is_retried_as_the_sdk_does():
    with emulated_drones(1, speed=SPEED, drop={0: ["forward:1"]}) as (drone,):
        backend = TelloBackend(drone.host, time_scale=SPEED, timeout_margin_s=1.0)
        try:
            backend.connect()
            backend.takeoff()
            t0 = time.monotonic()
            backend.move("forward", 50)
            assert 1.0 <= time.monotonic() - t0 < 30.0  # one reply timeout, then the retry (bounded, no hang)
        finally:
            backend.close(land=False)
        log = drone.log()
        assert [(e["cmd"], e.get("dropped", False)) for e in log] == [
            ("command", False), ("battery?", False), ("takeoff", False), ("forward 50", True), ("forward 50", False)]


def test_connection_loss_is_a_clear_error_after_the_retries():
    with emulated_drones(1, speed=SPEED) as (drone,):
        backend = TelloBackend(drone.host, time_scale=SPEED, retry_count=2, timeout_margin_s=1.0)
        try:
            backend.connect()
            backend.takeoff()
            drone.kill()
            t0 = time.monotonic()
            with pytest.raises(RobotConnectionError, match=r"connection lost: no reply to 'forward 50' \(2 tries"):
                backend.move("forward", 50)
            assert time.monotonic() - t0 < 30.0  # bounded by the retries, no hang
        finally:
            backend.close(land=False)


def test_a_renamed_skill_set_flies_the_same_and_the_backend_times_it_the_same():
    import yaml

    from timelyllm_ros.skills.skill_files import skill_set_from_dict, skills_dir

    raw = yaml.safe_load((skills_dir() / "drone_minispec.yaml").read_text())
    names = {"mf": "fwd", "tc": "turn_right", "tu": "turn_left", "mu": "climb"}
    for s in raw["skills"]:
        if s["name"] in names:
            s.update(name=names[s["name"]], long_name=names[s["name"]], aliases=[])
    for s in raw["skills"]:  # a composite's time model names the skills it runs
        runs = s.get("exec_time", {}).get("runs")
        if runs:
            s["exec_time"]["runs"] = re.sub(r"\b(\w+)\(", lambda m: names.get(m[1], m[1]) + "(", runs)
    tags = raw["plan_structure"]["first_by_tag"]  # the grammar names skills too
    raw["plan_structure"]["first_by_tag"] = {t: [names.get(n, n) for n in ns] for t, ns in tags.items()}
    renamed = skill_set_from_dict(raw)
    motions = [("forward", 500), ("up", 30), ("cw", 360), ("ccw", 45), ("down", 20)]
    with emulated_drones(1, speed=SPEED) as (drone,):
        timeouts = []
        for ss in ("drone", renamed):  # never connected, real time (so the timeouts differ): only their timeouts
            b = TelloBackend(drone.host, skillset=ss)
            timeouts.append([b.motion_timeout(w, v) for w, v in motions])
            b.close(land=False)
        assert timeouts[0] == timeouts[1] == [8, 5, 9, 4, 4], timeouts  # ceil(modelled s + 2 s margin)
        backend = TelloBackend(drone.host, time_scale=SPEED, skillset=renamed)
        try:
            backend.connect()
            it = MiniSpecInterpreter(renamed, backend, ScriptedScene())
            for seg in ["fwd(50);", "2{", "climb(30)", "};", "turn_right(90);turn_left(45);"]:
                it.execute_segment(seg)
        finally:
            backend.close()
        assert drone.commands() == ["command", "battery?", "takeoff", "forward 50", "up 30", "up 30", "cw 90",
                                    "ccw 45", "land"]


def _in_thread(fn):
    import threading

    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except Exception as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


SLOW = 0.4  # take-off 2 s, landing 1.2 s, forward 100 cm ~1.4 s: long enough to cut each half-way


def test_the_emulator_hovers_wherever_sdk_stop_cuts_a_take_off_a_move_or_a_landing():
    """SDK 2.0 user guide, ``stop``: "Hovers in the air. Note: works at any time"."""
    with emulated_drones(1, speed=SLOW) as (drone,):
        backend = TelloBackend(drone.host, time_scale=SLOW)
        tello = backend.tello
        try:
            backend.connect()
            for cmd, timeout in (("takeoff", 20), ("forward 100", 10), ("land", 10)):
                t, out = _in_thread(lambda cmd=cmd, timeout=timeout: tello.send_control_command(cmd, timeout))
                time.sleep(0.5)
                backend.halt()  # SDK 'stop'
                t.join(15)
                assert out.get("value") is True, (cmd, out)  # the cut command is over: 'ok'
                backend.clear_replies()  # the other 'ok' ('stop' and the cut command are both answered)
                backend.resume()
                dm = int(tello.send_read_command("height?").removesuffix("dm"))
                assert 0 < dm < 8 or cmd != "takeoff", (cmd, dm)  # part of the way up (80 cm)
                # hovering in the air: a move is accepted (it is refused on the ground: 'error Not flying')
                assert tello.send_control_command("up 20", 10) is True, cmd
                backend.clear_replies()
            tello.send_control_command("land", 10)
        finally:
            backend.close(land=False)
        log = {e["cmd"]: e["reply"] for e in drone.log()}
        assert log["takeoff"] == log["forward 100"] == log["land"] == "ok"


def test_a_preemption_during_the_take_off_leaves_a_hovering_drone_that_evades_at_once():
    """The emulated fleet's urgent evasions failed with 'error Not flying': the SDK 'stop' sent by the preemption
    cut the take-off, and the backend still believed the drone airborne. After a cut take-off the backend asks
    the drone its height before the next motion."""
    from timelyllm_ros.robots.base import Interrupted, StopSignal

    with emulated_drones(1, speed=SLOW) as (drone,):
        backend = TelloBackend(drone.host, time_scale=SLOW)
        stop = StopSignal()
        it = MiniSpecInterpreter(load_skill_set("drone"), backend, ScriptedScene(), stop=stop)
        try:
            backend.connect()
            t, out = _in_thread(lambda: it.execute_segment("mf(100);"))  # takes off first
            time.sleep(1.0)  # half-way up
            stop.set("preempted by task urgent")
            backend.halt()
            t.join(15)
            assert isinstance(out.get("error"), Interrupted), out
            stop.clear()
            backend.resume()
            it.reset()
            it.execute_segment("mu(100);")  # the evasion: from the hovering drone, no second take-off
            # mid-move, a preemption cuts the motion with 'stop'; the drone hovers, flying
            t, out = _in_thread(lambda: (it.execute_segment("mf(200);"), stop.check()))  # as the runner does
            time.sleep(0.4)
            stop.set("preempted by task urgent2")
            backend.halt()
            t.join(15)
            assert isinstance(out.get("error"), Interrupted), out
            stop.clear()
            backend.resume()
            it.execute_segment("tc(90);")
        finally:
            backend.close()
        cmds = drone.commands()
        assert cmds[:5] == ["command", "battery?", "takeoff", "stop", "height?"], cmds
        assert "forward 100" not in cmds  # the preempted segment's move was never sent
        assert cmds[5] == "up 100" and cmds.count("takeoff") == 1
        assert cmds[cmds.index("forward 200") + 1] == "stop" and "cw 90" in cmds
        assert all(e["reply"] == "ok" for e in drone.log() if e["cmd"] in ("up 100", "cw 90"))


def test_the_reply_a_stop_leaves_over_never_answers_the_next_command_even_when_it_comes_late():
    """CI on a busy machine: the 'ok' of the take-off a 'stop' cut came after the backend's next command,
    ``height?``, went out, and answered it ('answered 'ok', not a height'). The emulator here sends every
    take-off reply 0.3 s late, so it comes after 'stop's own 'ok' every time."""
    with pytest.raises(ValueError, match="reply_drain_s must be >= 0"):
        TelloBackend("192.168.10.1", reply_drain_s=-1.0)
    with emulated_drones(1, speed=SLOW, late={0: ["takeoff:0.3"]}) as (drone,):
        backend = TelloBackend(drone.host, time_scale=SLOW)
        try:
            backend.connect()
            t, out = _in_thread(backend.takeoff)
            time.sleep(0.8)  # part of the way up
            backend.halt()
            t.join(15)
            assert "error" not in out, out
            assert backend.flying  # asks height?: the late 'ok' must not answer it
            backend.resume()
            backend.move("up", 20)
        finally:
            backend.close()
        log = drone.log()
        assert [e["cmd"] for e in log][2:6] == ["takeoff", "stop", "height?", "up 20"], log
        assert next(e for e in log if e["cmd"] == "height?")["reply"].endswith("dm")


def test_a_take_off_cut_near_the_ground_takes_off_again_before_the_evasion():
    from timelyllm_ros.robots.base import StopSignal

    with emulated_drones(1, speed=SLOW) as (drone,):
        backend = TelloBackend(drone.host, time_scale=SLOW)
        it = MiniSpecInterpreter(load_skill_set("drone"), backend, ScriptedScene(), stop=StopSignal())
        try:
            backend.connect()
            t, _ = _in_thread(backend.takeoff)
            time.sleep(0.05)  # the motors just started: still on the ground when cut
            backend.halt()
            t.join(15)
            backend.resume()
            it.execute_segment("mr(50);")
        finally:
            backend.close()
        cmds = drone.commands()
        assert cmds[2:7] == ["takeoff", "stop", "height?", "takeoff", "right 50"], cmds


def test_a_landing_cut_by_a_halt_leaves_a_hovering_drone_that_moves_without_a_take_off():
    from timelyllm_ros.robots.base import StopSignal

    with emulated_drones(1, speed=SLOW) as (drone,):
        backend = TelloBackend(drone.host, time_scale=SLOW)
        it = MiniSpecInterpreter(load_skill_set("drone"), backend, ScriptedScene(), stop=StopSignal())
        try:
            backend.connect()
            backend.takeoff()
            t, out = _in_thread(backend.land)
            time.sleep(0.3)  # a quarter of the way down
            backend.halt()
            t.join(15)
            assert "error" not in out and backend.flying
            backend.resume()
            it.execute_segment("mr(50);")
        finally:
            backend.close()
        cmds = drone.commands()
        assert cmds[2:7] == ["takeoff", "land", "stop", "height?", "right 50"], cmds
