"""One table of settings (``planner/settings.py``): the planner node's parameters and the core's CoreConfig come
from it, each value is judged by one rule wherever it enters, and no setting is declared anywhere else."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from timelyllm_ros.planner.config import CORE_SETTINGS, CoreConfig
from timelyllm_ros.planner.settings import BY_NAME, PARAMETERS, SETTINGS, check_params

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "timelyllm_ros"


def _literal(node: ast.expr | None) -> bool:
    """A default written out (a constant, or a list/tuple/set/dict display), other than None or an empty one."""
    if isinstance(node, ast.Constant):
        return node.value is not None and node.value != ""
    if isinstance(node, ast.Dict):
        return bool(node.keys)
    return isinstance(node, ast.List | ast.Tuple | ast.Set) and bool(node.elts)


def _second_declarations(py: Path) -> list[str]:
    """Where ``py`` declares a setting again: a ROS declaration naming it (``declare(node, "comm_s", ...)``), or
    a class field, class attribute or parameter named after it with a default of its own. A field or parameter
    of the same name without a default, defaulting to None or an empty value ("not given"), or taking its
    default from the table, only carries a value and is fine."""
    out = []
    for node in ast.walk(ast.parse(py.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if "declare" in fname and any(isinstance(a, ast.Constant) and a.value in BY_NAME for a in node.args[:2]):
                out.append(f"{node.lineno}: {ast.unparse(node)[:80]}")
        elif isinstance(node, ast.ClassDef):
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    pairs = [(st.target.id, st.value)]
                elif isinstance(st, ast.Assign):
                    pairs = [(t.id, st.value) for t in st.targets if isinstance(t, ast.Name)]
                else:
                    continue
                out += [f"{st.lineno}: {node.name}.{name}" for name, value in pairs
                        if name in BY_NAME and _literal(value)]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults, strict=True)) + list(
                zip(a.kwonlyargs, a.kw_defaults, strict=True))
            out += [f"{node.lineno}: {node.name}({arg.arg}=...)" for arg, d in pairs
                    if arg.arg in BY_NAME and _literal(d)]
    return out


def test_no_setting_is_declared_twice():
    assert len(BY_NAME) == len(SETTINGS), "a name twice in the table"
    offenders = [f"{py.relative_to(ROOT)}:{where}" for py in sorted(PKG.rglob("*.py"))
                 if py != PKG / "planner" / "settings.py" for where in _second_declarations(py)]
    assert not offenders, offenders


def test_the_scan_finds_a_second_declaration(tmp_path):
    py = tmp_path / "x.py"
    py.write_text('@dataclass\nclass A:\n    comm_s: float = 0.008\n    slack_floor_s: float\n'
                  '    robot_ids: list = field(default_factory=list)\n'
                  'def f(gather_ms=10.0, kv_block_tokens=None, overdue=BY_NAME["overdue"].default): ...\n'
                  'declare(node, "state_period_s", 0.5, "period")\n')
    assert _second_declarations(py) == ["3: A.comm_s", "6: f(gather_ms=...)",
                                        '7: declare(node, \'state_period_s\', 0.5, \'period\')']


def test_core_config_is_the_core_part_of_the_table():
    assert [f.name for f in dataclasses.fields(CoreConfig)] == [st.name for st in SETTINGS if st.applies == "core"]
    cfg = CoreConfig()
    for st in CORE_SETTINGS:
        assert getattr(cfg, st.name) == st.fresh_default(core=True), st.name
    # a core built from the node's parameters takes their values; the core's own settings stay at their defaults
    params = {st.name: st.fresh_default() for st in PARAMETERS}
    from_node = CoreConfig.from_params(params)
    assert from_node.gather_ms == BY_NAME["gather_ms"].default and from_node.gather_s == pytest.approx(0.010)
    assert from_node.silence_timeout_s == BY_NAME["robot_timeout_s"].default and cfg.silence_timeout_s is None
    assert from_node.length_model == cfg.length_model
    assert CoreConfig().segment_tokens_prior is not cfg.segment_tokens_prior  # not shared between configs


# (setting, a value its rule refuses): each refused alike by the parameter check and by CoreConfig
BAD = [("slack_floor_s", 0.0),  # once allowed by the parameter's range, refused by CoreConfig
       ("comm_s", -0.1), ("comm_s", float("nan")), ("resume_lead_s", 61.0), ("overdue", "later"),
       ("keep_results_s", 0.0), ("keep_results_max", 0), ("gather_ms", 1001.0), ("prefill_step_ms", -1.0),
       ("robot_timeout_s", -1.0)]


@pytest.mark.parametrize(("name", "bad"), BAD)
def test_a_value_is_judged_by_one_rule_at_the_parameters_and_at_the_core(name, bad):
    why = BY_NAME[name].problem(bad)
    assert why
    params = {st.name: st.fresh_default() for st in PARAMETERS} | {name: bad}
    with pytest.raises(ValueError) as by_params:
        check_params(params)
    with pytest.raises(ValueError) as by_core:
        CoreConfig(**{name: bad})
    assert str(by_params.value) == f"parameter {name}: {why}"
    assert str(by_core.value) == f"CoreConfig.{name}: {why}"


def test_every_default_passes_its_own_rule():
    for st in SETTINGS:
        assert st.problem(st.fresh_default()) is None, st.name
        assert st.problem(st.fresh_default(core=True)) is None, st.name
    check_params({st.name: st.fresh_default() for st in PARAMETERS})


@pytest.mark.ros
def test_the_nodes_declare_the_table_with_the_same_rule():
    """The planner node refuses at declaration what the table refuses, with the same reason; ``state_period_s``
    is one setting on both nodes."""
    rclpy = pytest.importorskip("rclpy")
    from rclpy.parameter import Parameter

    from timelyllm_ros.ros.planner_node import build_planner

    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    try:
        planner, sched = build_planner([Parameter("autostart", value=False),
                                        Parameter("state_period_s", value=0.25)], context=ctx)
        try:
            assert planner.get_parameter("state_period_s").value == sched.get_parameter("state_period_s").value
            assert {n for n in planner.list_parameters([], 0).names} >= {st.name for st in PARAMETERS}
            d = planner.describe_parameter("slack_floor_s")
            assert d.read_only and d.description == BY_NAME["slack_floor_s"].description
        finally:
            planner.destroy_node()
            sched.destroy_node()
        why = BY_NAME["slack_floor_s"].problem(0.0)
        with pytest.raises(ValueError, match=f"parameter slack_floor_s: {why}"):
            build_planner([Parameter("autostart", value=False), Parameter("slack_floor_s", value=0.0)], context=ctx)
        with pytest.raises(ValueError, match="parameter overdue: must be one of"):
            build_planner([Parameter("autostart", value=False), Parameter("overdue", value="later")], context=ctx)
    finally:
        rclpy.try_shutdown(context=ctx)
