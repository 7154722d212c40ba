"""Tello SDK motion commands, and the skill whose execution-time model times each one.

Both ends of the SDK link need to know how long a motion takes:
:class:`~timelyllm_ros.robots.tello_backend.TelloBackend` sizes its reply timeout by it, and the emulator
(``devtools/tello_emulator.py``) answers ``ok`` after it. Neither names a skill. An SDK command maps to
the drone operation it performs (``move``/``rotate`` in :data:`~timelyllm_ros.robots.interpreter.OPERATIONS`),
and the skill set says which skill runs that operation (``op``/``op_args`` in skills/*.yaml). So renaming or
reordering skills in YAML needs no code change here.

No SDK client here: the emulator imports this module and must not depend on the library it emulates.
"""

from __future__ import annotations

from typing import Any

from timelyllm_ros.robots.interpreter import OPERATIONS
from timelyllm_ros.skills.exec_model import ExecTimeModel
from timelyllm_ros.skills.minispec import SkillCall
from timelyllm_ros.skills.schema import SkillSet, SkillSpec

# The SDK's motion words ("<word> <value>"). The move words are also the interpreter's directions.
SDK_MOVES: tuple[str, ...] = ("forward", "back", "left", "right", "up", "down")  # value: cm, 20..500
SDK_TURNS: dict[str, bool] = {"cw": True, "ccw": False}  # value: degrees, 1..360; True: clockwise


def sdk_operation(word: str) -> tuple[str, dict[str, Any], str] | None:
    """The drone operation behind an SDK motion word: (op, its fixed parameters, the parameter the command's
    value fills), e.g. ``forward`` -> ``("move", {"direction": "forward"}, "cm")``; None for other words."""
    if word in SDK_MOVES:
        op, fixed = "move", {"direction": word}
    elif word in SDK_TURNS:
        op, fixed = "rotate", {"clockwise": SDK_TURNS[word]}
    else:
        return None
    (value_param,) = (p.name for p in OPERATIONS[op] if p.name not in fixed)
    return op, fixed, value_param


def motion_call(skillset: SkillSet, word: str, value: int) -> SkillCall | None:
    """The skill call that performs SDK command ``<word> <value>`` (for its execution-time model).

    A skill that takes the value as its argument (``mf(50)``) is preferred over one that fixes it in
    ``op_args`` (``a()``: forward 100 cm), wherever they sit in the YAML: the former is the motion's own
    model. Not :meth:`SkillSet.skill_for_op`, which would return such a fixed-value skill for any value
    when it comes first. None when no skill of the set performs the command."""
    found = sdk_operation(word)
    if found is None:
        return None
    op, fixed, value_param = found
    params = {**fixed, value_param: value}
    fixed_value: SkillSpec | None = None
    for spec in skillset.skills:
        if spec.op != op or any(k not in params or params[k] != v for k, v in spec.op_args.items()):
            continue
        if value_param not in spec.op_args:
            sig = next((s for s in spec.signatures if len(s) == 1), None)
            if sig is not None:
                return SkillCall(name=spec.name, long_name=spec.long_name, args=(value,), raw=f"{spec.name}({value})",
                                 skillset_id=skillset.id, arg_names=(sig[0].name,))
        elif fixed_value is None and any(len(s) == 0 for s in spec.signatures):
            fixed_value = spec
    if fixed_value is None:
        return None
    return SkillCall(name=fixed_value.name, long_name=fixed_value.long_name, args=(), raw=f"{fixed_value.name}()",
                     skillset_id=skillset.id)


def motion_seconds(model: ExecTimeModel, word: str, value: int) -> float | None:
    """Typical duration (s) of SDK command ``<word> <value>`` by the model's skill set; None when no skill
    performs it (the caller picks its own fallback)."""
    call = motion_call(model.skillset, word, value)
    return None if call is None else model.estimate([call]).typical_s


__all__ = ["SDK_MOVES", "SDK_TURNS", "motion_call", "motion_seconds", "sdk_operation"]
