"""MiniSpec interpreter, scripted perception and arm trajectories (pure Python, no network)."""

from __future__ import annotations

import pytest

from timelyllm_ros.robots.arm_backend import JOINTS, ArmExecutor
from timelyllm_ros.robots.base import ExecutionError, Interrupted, RefusedError, StopSignal
from timelyllm_ros.robots.interpreter import MiniSpecInterpreter
from timelyllm_ros.robots.perception import ScriptedScene, parse_scene
from timelyllm_ros.skills.schema import load_skill_set


class RecordingDrone:
    """A DroneBackend that records commands (the interpreter's interface, not djitellopy)."""

    def __init__(self) -> None:
        self.flying = False
        self.cmds: list[str] = []

    def takeoff(self) -> None:
        self.flying = True
        self.cmds.append("takeoff")

    def land(self) -> None:
        self.flying = False
        self.cmds.append("land")

    def move(self, direction: str, cm: int) -> None:
        self.cmds.append(f"{direction} {cm}")

    def rotate(self, degrees: int, clockwise: bool) -> None:
        self.cmds.append(f"{'cw' if clockwise else 'ccw'} {degrees}")

    def hover(self, seconds: float, stop: StopSignal) -> None:
        self.cmds.append(f"hover {seconds}")


def run(segments: list[str], scene: str = "") -> tuple[RecordingDrone, MiniSpecInterpreter]:
    drone = RecordingDrone()
    it = MiniSpecInterpreter(load_skill_set("drone"), drone, ScriptedScene(scene))
    for s in segments:
        it.execute_segment(s)
    return drone, it


def test_conditionals_loops_and_variables_across_segments():
    drone, it = run(["?iv('cat')==True{", "mf(50);", "};", "?iv('dog')==True{", "mb(50);", "};",
                     "_1=od('cat');", "?_1>100{", "mu(20)", "}", "3{", "tc(30);", "};"],
                    scene="Scene: [cat x:0.5 y:0.5 width:0.2 height:0.3 dis:150]")
    assert drone.cmds == ["takeoff", "forward 50", "up 20", "cw 30", "cw 30", "cw 30"]
    assert it.vars == {"_1": 150.0}


def test_scan_turns_until_the_object_behind_is_visible_then_goto_orients_and_approaches():
    drone, it = run(["?s('cat')==True{", "g('cat');", "};"], scene="Scene: [cat x:0.7 y:0.5 bearing:90]")
    # 45-degree scan steps, one 15-degree orienting turn (x 0.7 -> 0.52), approach = forward 100
    assert drone.cmds == ["takeoff", "cw 45", "cw 45", "cw 15", "forward 100"]
    assert it.heading == 105


def test_loop_replays_nested_conditionals_with_fresh_conditions():
    drone, _ = run(["2{", "?iv('cat')==True{", "tc(90)", "};", "mf(20);", "};"],
                   scene="Scene: [cat x:0.5 y:0.5]")
    # the cat is visible only on the first pass: after tc(90) it is out of view
    assert drone.cmds == ["takeoff", "cw 90", "forward 20", "forward 20"]


def test_return_ends_the_program_and_later_statements_are_skipped():
    drone, it = run(["mf(20);", "->True;", "mf(30);", "tc(10);"])
    assert drone.cmds == ["takeoff", "forward 20"]
    assert it.finished and it.return_value is True


@pytest.mark.parametrize("segment, match", [
    ("fly(50);", "unknown skill 'fly'"),
    ("mf(5000);", "outside"),
    ("tc(-90);", "outside"),
    ("mf('far');", "must be a number"),
    ("};", "closes no open block"),
    ("21{", "loop count"),
])
def test_invalid_segments_are_refused_before_anything_runs(segment, match):
    drone = RecordingDrone()
    it = MiniSpecInterpreter(load_skill_set("drone"), drone, ScriptedScene())
    with pytest.raises(RefusedError, match=match):
        it.execute_segment(segment)
    assert drone.cmds == []


def test_a_variable_out_of_bounds_is_refused_at_run_time():
    drone = RecordingDrone()
    it = MiniSpecInterpreter(load_skill_set("drone"), drone, ScriptedScene("Scene: [cat x:0.5 dis:900]"))
    it.execute_segment("_1=od('cat');")
    with pytest.raises(RefusedError, match=r"mf\(_1\).*900"):
        it.execute_segment("mf(_1);")
    assert drone.cmds == []  # od is perception only; the move never went out


def test_stop_interrupts_between_statements():
    drone = RecordingDrone()
    stop = StopSignal()
    it = MiniSpecInterpreter(load_skill_set("drone"), drone, ScriptedScene(), stop=stop)
    it.execute_segment("mf(20);")
    stop.set("preempted by task urgent-1")
    with pytest.raises(Interrupted, match="preempted by task urgent-1"):
        it.execute_segment("mf(30);")
    assert drone.cmds == ["takeoff", "forward 20"]


def test_scene_parsing():
    objs = parse_scene("Scene: [red_block x:0.42 y:-0.10] [blue_block x:0.35 y:0.18], Task: stack")
    assert [(o.name, o.x, o.y) for o in objs] == [("red_block", 0.42, -0.10), ("blue_block", 0.35, 0.18)]
    assert parse_scene("Scene: [] Task: [A] find the cat") == []
    with pytest.raises(ValueError, match="unknown field"):
        parse_scene("Scene: [cat colour:1]")
    scene = ScriptedScene("Scene: [chair_1 x:0.3 y:0.5 width:0.2 height:0.4]")
    assert scene.find("chair") is not None and scene.find("Chair_1") is not None and scene.find("cat") is None
    assert scene.probe("Is there a chair?") == "chair_1" and scene.probe("a cat?") is False


def test_arm_skills_become_trajectories_in_order_and_bad_calls_are_refused():
    sent = []
    arm = ArmExecutor(load_skill_set("arm"), ScriptedScene("Scene: [red_box x:0.40 y:0.10, tray x:0.30 y:-0.40]"),
                      lambda plan, stop: sent.append(plan), time_scale=0.01)
    assert arm.run_segment("move_to('red_box');pick('red_box');") == ["move_to('red_box')", "pick('red_box')"]
    arm.run_segment("place('tray');")
    assert [p.label for p in sent] == ["move_to('red_box')", "pick('red_box')", "place('tray')"]
    assert all(p.joint_names == JOINTS and p.points for p in sent)
    assert 3.0 * 0.01 <= sent[1].duration <= 4.2 * 0.01  # design §7: pick U(3, 4.2) s, scaled
    assert sent[1].points[-1][0][-1] == 0.0 and sent[2].points[-1][0][-1] > 0  # gripper closed, then open
    with pytest.raises(RefusedError):
        arm.run_segment("move_to(2.0, 0.0);")
    with pytest.raises(RefusedError):
        arm.run_segment("weld('red_box');")
    with pytest.raises(ExecutionError, match="nothing is held"):
        arm.run_segment("place('tray');")
    assert len(sent) == 3
