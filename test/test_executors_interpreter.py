"""MiniSpec interpreter, scripted perception and arm trajectories (pure Python, no network)."""

from __future__ import annotations

import pytest
import yaml

from timelyllm_ros.robots.arm_backend import JOINTS, ArmExecutor
from timelyllm_ros.robots.base import ExecutionError, Interrupted, RefusedError, StopSignal
from timelyllm_ros.robots.interpreter import MiniSpecInterpreter
from timelyllm_ros.robots.perception import ScriptedScene, parse_scene
from timelyllm_ros.skills.skill_files import load_skill_set, skill_set_from_dict, skills_dir


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


# -- skills are data: dispatch comes from the skill set -----------------------------------
def _drone_yaml() -> dict:
    return yaml.safe_load((skills_dir() / "drone_minispec.yaml").read_text())


def test_skills_renamed_or_added_in_yaml_need_no_interpreter_change():
    raw = _drone_yaml()
    mf = next(s for s in raw["skills"] if s["name"] == "mf")
    mf.update(name="fwd", long_name="forward")
    for s in raw["skills"]:  # composites name what they run in the data too (goto runs mf(100))
        if s["exec_time"]["model"] == "composite":
            s["exec_time"]["runs"] = s["exec_time"]["runs"].replace("mf(", "fwd(")
    raw["skills"] += [
        {"name": "turn_around", "op": "rotate", "op_args": {"clockwise": True, "degrees": 180},
         "exec_time": {"model": "constant", "value": 3.0}},
        {"name": "hop", "op": "move", "op_args": {"direction": "up", "cm": 30}, "exec_time": {"model": "constant",
                                                                                          "value": 1.0}},
        {"name": "look_for", "op": "scan", "op_args": {"step_deg": 90}, "returns": "bool",
         "args": [{"name": "object_name", "type": "str"}], "exec_time": {"model": "constant", "value": 1.0}},
    ]
    ss = skill_set_from_dict(raw)
    drone = RecordingDrone()
    it = MiniSpecInterpreter(ss, drone, ScriptedScene("Scene: [cat bearing:180]"))
    res = it.execute_segment("fwd(50);turn_around();hop();turn_around();?look_for('cat'){forward(20)}")
    assert drone.cmds == ["takeoff", "forward 50", "cw 180", "up 30", "cw 180", "cw 90", "cw 90", "forward 20"]
    assert res.executed[:2] == ["fwd(50)", "turn_around()"]
    with pytest.raises(RefusedError, match="unknown skill 'mf'"):
        it.execute_segment("mf(50);")


@pytest.mark.parametrize("change, match", [
    (lambda s: (s.pop("op"), s.pop("op_args")), "'mf' has no op"),
    (lambda s: s.update(op="teleport"), "unknown op 'teleport'"),
    (lambda s: s.update(op_args={"direction": "sideways"}),
     r"op_args.direction = 'sideways' does not fit direction: str in \('forward'"),
    (lambda s: s.update(op_args={"direction": "up", "speed": 3}), "op 'move' has no parameter 'speed'"),
    (lambda s: s.update(op_args={}), r"arguments \(distance: int 20..500 cm\) do not fill op 'move'"),
    (lambda s: s.update(op="hover", op_args={}), None),  # an int argument fills a float parameter
    (lambda s: s.update(op="log", op_args={}), "do not fill op 'log'"),
    (lambda s: s.update(op="scan", op_args={"step_deg": 0}), "op_args.step_deg = 0 does not fit step_deg: int >= 1"),
])
def test_skill_operations_are_checked_when_the_interpreter_is_built(change, match):
    raw = _drone_yaml()
    change(next(s for s in raw["skills"] if s["name"] == "mf"))
    ss = skill_set_from_dict(raw)
    if match is None:
        MiniSpecInterpreter(ss, RecordingDrone(), ScriptedScene())
        return
    with pytest.raises(ValueError, match=match):
        MiniSpecInterpreter(ss, RecordingDrone(), ScriptedScene())


def test_arm_operations_come_from_the_skill_set():
    raw = yaml.safe_load((skills_dir() / "arm.yaml").read_text())
    next(s for s in raw["skills"] if s["name"] == "pick").update(name="grab", long_name="grab", aliases=[])
    raw["plan_structure"]["unit"] = [u.replace("pick(", "grab(") for u in raw["plan_structure"]["unit"]]
    sent = []
    arm = ArmExecutor(skill_set_from_dict(raw), ScriptedScene("Scene: [red_box x:0.40 y:0.10]"),
                      lambda plan, stop: sent.append(plan), time_scale=0.01)
    arm.run_segment("grab('red_box');")
    assert sent[0].points[-1][0][-1] == 0.0  # gripper closed: it ran the pick operation
    next(s for s in raw["skills"] if s["name"] == "gt")["op"] = "weld"
    with pytest.raises(ValueError, match="op 'weld' is not an arm operation"):
        ArmExecutor(skill_set_from_dict(raw), ScriptedScene(), lambda plan, stop: None)


# -- the interpreter validates with what only the robot knows ----------------------------
def test_a_variable_no_statement_assigns_is_refused_before_anything_runs():
    drone = RecordingDrone()
    it = MiniSpecInterpreter(load_skill_set("drone"), drone, ScriptedScene("Scene: [cat dis:150]"))
    with pytest.raises(RefusedError, match="variable _1 is used before it is assigned"):
        it.execute_segment("mf(20);mf(_1);")
    assert drone.cmds == []
    it.validate("_1=od('cat');")  # validating alone declares nothing
    with pytest.raises(RefusedError, match="variable _1"):
        it.validate("mf(_1);")
    it.execute_segment("_1=od('cat');")
    it.execute_segment("mf(_1);")
    assert drone.cmds == ["takeoff", "forward 150"]


def test_the_final_segment_must_close_every_block():
    drone = RecordingDrone()
    it = MiniSpecInterpreter(load_skill_set("drone"), drone, ScriptedScene())
    it.execute_segment("2{")
    with pytest.raises(RefusedError, match=r"unclosed '\{'"):
        it.execute_segment("tc(10);", final=True)
    assert drone.cmds == []
    it.execute_segment("tc(10);}", final=True)
    assert drone.cmds == ["takeoff", "cw 10", "cw 10"]


def test_replan_in_a_condition_ends_the_program():
    drone, it = run(["?rp(){mf(20)};", "mf(30);"])
    assert drone.cmds == [] and it.finished and it.return_value == "re_plan"
