"""Robot-arm skills as joint trajectories (pure Python; the ROS node sends them to a controller).

Each skill call becomes one trajectory over 6 arm joints and the gripper:
``move_to`` goes to a hover pose above the target; ``pick`` descends, closes
the gripper and lifts; ``place`` descends, opens and lifts; ``locate``/``survey``
hold the pose while the wrist camera looks (the stand-in perception answers).
Which operation runs a skill is data (``op`` in skills/arm.yaml); plan text is
parsed by the one skill-language front end (:meth:`SkillSet.parse`). The
trajectory lasts a duration drawn from the skill's execution-time model
(design §7) times ``time_scale``; a controller follows it over time.

Kinematics is a simple stand-in for an Indy7-like arm: base yaw towards the
target, a 2-link planar shoulder/elbow solution for the reach, and a wrist
pitch that keeps the gripper vertical.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from timelyllm_ros.robots.base import ExecutionError, RefusedError, StopSignal
from timelyllm_ros.robots.perception import ScriptedScene
from timelyllm_ros.skills.exec_model import ExecTimeModel
from timelyllm_ros.skills.minispec import SkillCall, SkillParseError
from timelyllm_ros.skills.schema import SkillSet

JOINTS = ("joint0", "joint1", "joint2", "joint3", "joint4", "joint5", "gripper")
UPPER_ARM_M, FOREARM_M, BASE_HEIGHT_M = 0.45, 0.35, 0.30
HOVER_Z_M, GRASP_Z_M = 0.15, 0.02
GRIPPER_OPEN, GRIPPER_CLOSED = 0.04, 0.0
HOME = (0.40, 0.0)

# Operations a skill's ``op`` may name, with the argument types each accepts (one tuple per form).
ARM_OPERATIONS: dict[str, tuple[tuple[str, ...], ...]] = {
    "move_to": (("float", "float"), ("str",)),  # above a point (x, y) or a named object / location
    "pick": (("str",),),
    "place": (("str",),),
    "locate": (("str",),),  # wrist camera: where is the object
    "survey": ((),),  # wrist camera: what is on the table
}


def arm_operations(skillset: SkillSet) -> dict[str, str]:
    """Skill name -> arm operation for every skill; ValueError naming the skill if one does not fit."""
    out = {}
    for spec in skillset.skills:
        where = f"skill set {skillset.id!r}: skill {spec.name!r}"
        forms = ARM_OPERATIONS.get(spec.op or "")
        if forms is None:
            raise ValueError(f"{where}: op {spec.op!r} is not an arm operation ({', '.join(ARM_OPERATIONS)})")
        if spec.op_args:
            raise ValueError(f"{where}: arm operations take no op_args")
        for sig in spec.signatures:
            if tuple("float" if a.type == "int" else a.type for a in sig) not in forms:
                raise ValueError(f"{where}: arguments {spec.signature_text(sig)} do not fit op {spec.op!r}")
        out[spec.name] = spec.op
    return out


@dataclass(frozen=True)
class TrajectoryPlan:
    """What a controller must follow: positions per joint at times from the start (s)."""

    label: str  # the skill call, for logs
    joint_names: tuple[str, ...]
    points: tuple[tuple[tuple[float, ...], float], ...]  # (positions, time_from_start)

    @property
    def duration(self) -> float:
        return self.points[-1][1] if self.points else 0.0


def inverse_kinematics(x: float, y: float, z: float) -> tuple[float, ...]:
    """6 joint angles (rad) putting the gripper at (x, y, z) in the base frame, pointing down."""
    yaw = math.atan2(y, x)
    r = math.hypot(x, y)
    dz = z - BASE_HEIGHT_M
    d = min(math.hypot(r, dz), UPPER_ARM_M + FOREARM_M - 1e-6)
    cos_elbow = (d * d - UPPER_ARM_M ** 2 - FOREARM_M ** 2) / (2 * UPPER_ARM_M * FOREARM_M)
    elbow = math.acos(max(-1.0, min(1.0, cos_elbow)))
    shoulder = math.atan2(dz, r) + math.atan2(FOREARM_M * math.sin(elbow), UPPER_ARM_M + FOREARM_M * math.cos(elbow))
    wrist = -(math.pi / 2) - shoulder + elbow  # keep the gripper vertical
    return (round(yaw, 6), round(shoulder, 6), round(-elbow, 6), 0.0, round(wrist, 6), round(yaw, 6))


class ArmExecutor:
    """One arm: validates each segment, turns its calls into trajectories and hands them to ``execute``.

    ``execute(plan, stop)`` must block until the controller finished the trajectory, raise Interrupted when
    ``stop`` is set, and ExecutionError when the controller fails."""

    def __init__(self, skillset: SkillSet, perception: ScriptedScene,
                 execute: Callable[[TrajectoryPlan, StopSignal], None], *, time_scale: float = 1.0,
                 rng: random.Random | None = None, stop: StopSignal | None = None,
                 on_log: Callable[[str], None] | None = None) -> None:
        if skillset.grammar != "calls":
            raise ValueError(f"skill set {skillset.id!r} is not an arm skill set (grammar 'calls')")
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.skillset = skillset
        self.ops = arm_operations(skillset)
        self.perception = perception
        self.execute = execute
        self.time_scale = time_scale
        self.model = ExecTimeModel(skillset, learn=False)
        self.rng = rng or random.Random(0)
        self.stop = stop or StopSignal()
        self.on_log = on_log or (lambda m: None)
        self.xy = HOME
        self.gripper = GRIPPER_OPEN
        self.holding: str | None = None

    def begin_task(self) -> None:
        """Arm state (pose, held object) is physical: it carries over between tasks."""

    def validate(self, text: str) -> list[SkillCall]:
        try:
            calls = self.skillset.parse(text)
        except SkillParseError as e:
            raise RefusedError(f"invalid segment: {e}") from None
        for c in calls:  # second lock: bounds again right before execution
            try:
                self.skillset[c.name].check_args(c.args)
            except ValueError as e:
                raise RefusedError(f"refused {c.raw}: {e}") from None
        return calls

    def run_segment(self, text: str) -> list[str]:
        """Validate (RefusedError: nothing moved), then execute every call in order."""
        calls = self.validate(text)
        done = []
        for c in calls:
            self.stop.check()
            self._run_call(c)
            done.append(c.raw)
        return done

    def trajectory_for(self, c: SkillCall) -> tuple[TrajectoryPlan, tuple[float, float], float, str | None]:
        """The trajectory of one call, and the pose/gripper/held object after it."""
        dur = self.model.sample([c], self.rng) * self.time_scale
        x, y = self.xy
        grip, holding = self.gripper, self.holding
        op = self.ops[c.name]
        if op == "move_to":
            if len(c.args) == 2:
                tx, ty = float(c.args[0]), float(c.args[1])
            else:
                pos = self.perception.position(str(c.args[0]))
                if pos is None:
                    raise ExecutionError(f"{c.raw}: no {c.args[0]!r} in the scene")
                tx, ty = pos
            poses = [(tx, ty, HOVER_Z_M, grip)]
            x, y = tx, ty
        elif op == "pick":
            obj = str(c.args[0])
            if holding is not None:
                raise ExecutionError(f"{c.raw}: the gripper already holds {holding!r}")
            pos = self.perception.position(obj)
            if pos is None:
                raise ExecutionError(f"{c.raw}: no {obj!r} in the scene")
            x, y = pos
            poses = [(x, y, HOVER_Z_M, GRIPPER_OPEN), (x, y, GRASP_Z_M, GRIPPER_OPEN),
                     (x, y, GRASP_Z_M, GRIPPER_CLOSED), (x, y, HOVER_Z_M, GRIPPER_CLOSED)]
            grip, holding = GRIPPER_CLOSED, obj
        elif op == "place":
            loc = str(c.args[0])
            if holding is None:
                raise ExecutionError(f"{c.raw}: nothing is held")
            pos = self.perception.position(loc)
            if pos is not None:
                x, y = pos
            poses = [(x, y, HOVER_Z_M, GRIPPER_CLOSED), (x, y, GRASP_Z_M, GRIPPER_CLOSED),
                     (x, y, GRASP_Z_M, GRIPPER_OPEN), (x, y, HOVER_Z_M, GRIPPER_OPEN)]
            grip, holding = GRIPPER_OPEN, None
        else:  # locate, survey: look with the wrist camera, holding the pose
            poses = [(x, y, HOVER_Z_M, grip)]
        n = len(poses)
        points = tuple((inverse_kinematics(px, py, pz) + (pg,), round(dur * (i + 1) / n, 6))
                       for i, (px, py, pz, pg) in enumerate(poses))
        return TrajectoryPlan(c.raw, JOINTS, points), (x, y), grip, holding

    def _run_call(self, c: SkillCall) -> None:
        plan, xy, grip, holding = self.trajectory_for(c)
        self.execute(plan, self.stop)
        self.xy, self.gripper, self.holding = xy, grip, holding
        if self.ops[c.name] == "locate":
            self.on_log(f"{c.raw} -> {self.perception.position(str(c.args[0]))}")
        elif self.ops[c.name] == "survey":
            self.on_log(f"{c.raw} -> {[o.name for o in self.perception.objects()]}")
