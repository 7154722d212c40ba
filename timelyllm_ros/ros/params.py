"""Node parameters: a descriptor for every one, and refusals with a reason instead of clamping.

:func:`declare` declares one parameter with a ParameterDescriptor (description, range, ``read_only``,
``additional_constraints``) and checks the value it starts with (the default, a ``--params-file`` or a
``-p``): a value the node cannot use raises ``ValueError("parameter NAME: why")``, so no node is built
with it. At run time (``ros2 param set``, ``Node.set_parameters``):

* rclpy refuses a read-only parameter, a value of another type and one outside the descriptor's range,
  with a reason that names the parameter;
* what a descriptor cannot say (a bound that excludes 0, a finite number, a non-empty list, known
  names) is refused by an on-set-parameters callback, with the reason ``NAME: why``;
* :func:`on_change` applies an accepted value (a post-set callback), so a parameter that is not
  read-only takes effect.

Nothing is clamped: a value is used as given, or refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, SetParametersResult
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.node import Node
from rclpy.parameter import Parameter

if TYPE_CHECKING:  # only its fields are read: the executors' nodes need not import the planner
    from timelyllm_ros.planner.settings import Setting

Check = Callable[[Any], "str | None"]  # a value -> why it is refused, or None

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# Declared by rclpy itself on every node (no description of ours to give).
RCLPY_PARAMETERS = frozenset({"use_sim_time", "start_type_description_service"})

_CHECKS = "_timelyllm_param_checks"


def non_empty(value: Any) -> str | None:
    """A list with at least one entry, and no empty one."""
    if not value or value == [""]:
        return "must name at least one entry"
    return "entries must not be empty" if any(not str(v).strip() for v in value) else None


def distinct(value: Any) -> str | None:
    dup = sorted({v for v in value if list(value).count(v) > 1})
    return f"must not repeat entries, got {dup} more than once" if dup else None


def not_blank(value: str) -> str | None:
    return None if value.strip() else "must not be empty"


def all_of(*checks: Check) -> Check:
    def check(value: Any) -> str | None:
        return next((why for c in checks if (why := c(value))), None)
    return check


def declare(node: Node, name: str, default: Any, description: str, *, read_only: bool = False,
            min: float | None = None, max: float | None = None, above: float | None = None,  # noqa: A002
            check: Check | None = None, constraints: str = "") -> Any:
    """Declare ``name`` on ``node`` and return its value (ValueError naming it if the node cannot use it).

    ``min``/``max``: inclusive bounds (the descriptor's range); ``above``: an exclusive lower bound (the
    range starts there, a callback refuses the bound itself); a double with any bound must also be finite.
    ``check``: value -> why it is refused (``constraints`` says what it wants, for ``ros2 param describe``).
    ``read_only``: the node reads it at start-up only (rclpy refuses a later change).
    """
    is_bool = isinstance(default, bool)
    is_int = isinstance(default, int) and not is_bool
    is_float = isinstance(default, float)
    d = ParameterDescriptor(description=description, read_only=read_only)
    checks: list[Check] = []
    notes: list[str] = []
    if (min is not None or max is not None or above is not None) and not (is_int or is_float):
        raise TypeError(f"parameter {name}: a range needs an integer or double default, got {default!r}")
    if is_int and (min is not None or max is not None or above is not None):
        lo = int(above) + 1 if above is not None else (int(min) if min is not None else INT64_MIN)
        d.integer_range = [IntegerRange(from_value=lo, to_value=int(max) if max is not None else INT64_MAX, step=0)]
    elif is_float and (min is not None or max is not None or above is not None):
        lo = float(above) if above is not None else (float(min) if min is not None else -math.inf)
        d.floating_point_range = [FloatingPointRange(from_value=lo, to_value=float(max) if max is not None
                                                     else math.inf, step=0.0)]
        if above is not None:
            bound = float(above)
            checks.append(lambda v: None if v > bound else f"must be > {bound:g}, got {v}")
            notes.append(f"> {bound:g}")
        checks.append(lambda v: None if math.isfinite(v) else f"must be a finite number, got {v}")
    if check is not None:
        checks.append(check)
        if constraints:
            notes.append(constraints)
    d.additional_constraints = "; ".join(notes)
    try:
        value = node.declare_parameter(name, default, d).value
    except (InvalidParameterTypeException, InvalidParameterValueException) as e:
        raise ValueError(f"parameter {name}: {_reason(e, name)}") from None
    for c in checks:
        if why := c(value):
            raise ValueError(f"parameter {name}: {why}")
    if checks and not read_only:
        _checks(node)[name] = checks
    return value


def declare_setting(node: Node, st: Setting) -> Any:
    """Declare a planner setting (``planner/settings.py``) on ``node``, read-only: its description and range,
    checked by the setting's own rule (:meth:`Setting.problem`), the one the service and the core apply."""
    return declare(node, st.name, st.default, st.description, read_only=True, min=st.min, max=st.max,
                   above=st.above, check=st.problem, constraints=st.constraints)


def on_change(node: Node, handlers: dict[str, Callable[[Any], None]]) -> None:
    """Apply accepted run-time values: ``handlers[name](value)`` after each successful set.

    Call it after the declarations (rclpy also runs post-set callbacks for each declaration)."""
    def apply(params: list[Parameter]) -> None:
        for p in params:
            if p.name in handlers:
                handlers[p.name](p.value)
    node.add_post_set_parameters_callback(apply)


def refuse(name: str, why: str) -> SetParametersResult:
    return SetParametersResult(successful=False, reason=f"{name}: {why}")


def descriptors(node: Node, names: Iterable[str] | None = None) -> dict[str, ParameterDescriptor]:
    """The descriptors of the node's parameters (rclpy's own left out)."""
    if names is None:
        names = [n for n in node.list_parameters([], 0).names if n not in RCLPY_PARAMETERS]
    return dict(zip(names, node.describe_parameters(list(names)), strict=True))


def _checks(node: Node) -> dict[str, list[Check]]:
    table = node.__dict__.get(_CHECKS)
    if table is None:
        table = node.__dict__[_CHECKS] = {}

        def on_set(params: list[Parameter]) -> SetParametersResult:
            for p in params:
                for c in table.get(p.name, ()):
                    if why := c(p.value):
                        return refuse(p.name, why)
            return SetParametersResult(successful=True)
        node.add_on_set_parameters_callback(on_set)
    return table


def _reason(e: Exception, name: str) -> str:
    """rclpy's text without its decoration ('Invalid parameter value (v) for parameter. Reason: ...: name')."""
    text = str(e).removesuffix(f": {name}")
    return text.split("Reason: ", 1)[-1]


__all__ = ["RCLPY_PARAMETERS", "all_of", "declare", "declare_setting", "descriptors", "distinct", "non_empty",
           "not_blank", "on_change", "refuse"]
