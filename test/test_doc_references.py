"""Names in the package's docstrings and comments still exist: a rename or a move cannot leave a stale reference.

What is read: every docstring (any string statement) and every comment of ``timelyllm_ros/``. What counts as a
reference there:

* a Sphinx role, ``:meth:`X```, ``:class:``, ``:func:``, ``:attr:``, ``:mod:`` (``~`` and a trailing ``()``
  dropped);
* a double-backticked dotted name, ````a.b.c```` (a trailing ``()`` dropped);
* a bare dotted name whose first part is a class of the package, ``PlannerCore.queue``, the package itself or
  one of its former subpackages (below).

The rule, honest but not brittle: a dotted reference is checked only where its first part is ours, i.e. a class
defined in the package, a module of the package named by a tail of its path at least two parts long
(``planner.core``, ``timelyllm_ros.planner.core``: a lone ``core.x`` or ``planner.x`` reads as a variable as
often), the package itself, or a subpackage the package once had (:data:`FORMER_SUBPACKAGES`: such a path is stale
by definition). Anything else (``vllm.LLM``, ``rclpy.node.Node``, ``self.x``, ``g.tok_est``) is not ours and is
left alone; so is a file name (``core.py``).

A checked reference resolves against the real package: the modules are imported and the parts after the first
looked up with ``getattr``; a member also counts where the class only assigns it (``self.name = ...`` in a method
of the class or a base, or an annotation: instance attributes, dataclass fields). A role with a single, undotted
name (``:meth:`submit```) must name something of the module it is written in (a module-level name, a member of one
of its classes, a builtin) or, failing that, a class, module or module-level name anywhere in the package.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import io
import pkgutil
import re
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType

import timelyllm_ros

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "timelyllm_ros"

# Subpackages the package had before the redesign into domain/ planner/ engines/ transport/ measure/ ros/ (git
# history): a reference into one of them points at something that moved.
FORMER_SUBPACKAGES = frozenset({"model", "sched", "executors"})

FILE_SUFFIXES = frozenset({"py", "yaml", "yml", "json", "md", "txt", "csv", "mcap", "db", "sh", "xml"})

ROLE = re.compile(r":(?:py:)?(meth|class|func|attr|mod|data|exc|obj):`!?~?([\w.]+?)(?:\(\))?`")
BACKTICKED = re.compile(r"``([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?``")
BARE = re.compile(r"(?<![\w.`~])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)")


@cache
def modules() -> dict[str, ModuleType]:
    """Every module of the package by its dotted path under ``timelyllm_ros`` (``planner.core``)."""
    out = {}
    for m in pkgutil.walk_packages(timelyllm_ros.__path__, "timelyllm_ros."):
        if not m.name.endswith("__main__"):
            out[m.name.removeprefix("timelyllm_ros.")] = importlib.import_module(m.name)
    return out


@cache
def classes() -> dict[str, list[type]]:
    """Every class defined in the package, by name (a name may be used in more than one module)."""
    out: dict[str, list[type]] = {}
    for mod in modules().values():
        for obj in vars(mod).values():
            if inspect.isclass(obj) and obj.__module__ == mod.__name__:
                out.setdefault(obj.__name__, []).append(obj)
    return out


@cache
def assigned(cls: type) -> frozenset[str]:
    """What the class annotates and, for a class of ours, what its methods assign on ``self`` (instance
    attributes)."""
    names = set(vars(cls).get("__annotations__", {}))
    if not cls.__module__.startswith("timelyllm_ros."):
        return frozenset(names)
    for node in ast.walk(ast.parse(inspect.getsource(cls).lstrip())):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign | ast.AugAssign) else []
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                    names.add(sub.attr)
    return frozenset(names)


MISSING = object()


def member(obj: object, name: str) -> object:
    """``obj.name``, or ``obj`` itself where ``obj`` is a class whose instances get ``name``; MISSING if neither."""
    try:
        return getattr(obj, name)
    except AttributeError:
        pass
    if inspect.isclass(obj) and any(name in assigned(c) for c in obj.__mro__):
        return obj
    return MISSING


def resolves(start: object, rest: list[str]) -> bool:
    obj = start
    for part in rest:
        if (obj := member(obj, part)) is MISSING:
            return False
    return True


def starts(parts: list[str]) -> list[tuple[object, list[str]]] | None:
    """The readings of ``parts`` as ours: (the object its head names, the parts left). None: not ours."""
    out: list[tuple[object, list[str]]] = []
    if parts[0] in FORMER_SUBPACKAGES:
        return out
    for cls in classes().get(parts[0], ()):
        out.append((cls, parts[1:]))
    for path, mod in modules().items():
        mod_parts = path.split(".")
        for i in range(2, len(parts) + 1):
            if mod_parts[-i:] == parts[:i]:
                out.append((mod, parts[i:]))
    return out or None


def check(ref: str) -> bool | None:
    """True: resolves; False: ours and stale; None: not ours."""
    if ref.rsplit(".", 1)[-1] in FILE_SUFFIXES:  # ``core.py``: a file, not a name
        return None
    parts = ref.split(".")
    if parts[0] == "timelyllm_ros":  # a full path
        modules()  # every module imported: each is then an attribute of its package
        return resolves(timelyllm_ros, parts[1:])
    if (readings := starts(parts)) is None:
        return None
    return any(resolves(obj, rest) for obj, rest in readings)


def check_single(name: str, mod: ModuleType) -> bool:
    """An undotted name in a role: something of ``mod`` (or a builtin), else anything of the package so named."""
    own_classes = [c for c in vars(mod).values() if inspect.isclass(c) and c.__module__ == mod.__name__]
    if hasattr(mod, name) or hasattr(builtins, name) or any(member(c, name) is not MISSING for c in own_classes):
        return True
    return name in classes() or any(hasattr(m, name) or p.split(".")[-1] == name for p, m in modules().items())


def texts(py: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of each docstring and comment of ``py``."""
    source = py.read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            yield node.lineno, node.value.value
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def references(text: str) -> Iterator[tuple[str, str]]:
    """(kind, reference) in one docstring or comment: 'role' for a single name in a role, else 'dotted'."""
    for m in ROLE.finditer(text):
        yield ("dotted" if "." in m[2] else "role"), m[2]
    for m in BACKTICKED.finditer(text):
        yield "dotted", m[1]
    for m in BARE.finditer(text):  # prose: only what is surely a name of ours (a module tail would read a variable)
        if (head := m[1].split(".")[0]) in classes() or head in FORMER_SUBPACKAGES or head == "timelyllm_ros":
            yield "dotted", m[1]


def stale_references() -> list[str]:
    out = []
    for py in sorted(PKG.rglob("*.py")):
        rel = py.relative_to(PKG).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
        mod = modules().get(rel)
        for line, text in texts(py):
            for kind, ref in references(text):
                ok = check(ref) if kind == "dotted" else (mod is None or check_single(ref, mod))
                if ok is False:
                    out.append(f"{py.relative_to(ROOT)}:{line}: {ref}")
    return sorted(set(out))


def test_the_resolver_tells_stale_from_live_and_leaves_others_alone():
    assert check("PlannerCore.submit") and check("planner.core.PlannerCore.submit")
    assert check("timelyllm_ros.planner.core.PlannerCore")
    assert check("planner.core.PlannerCore.cfg")  # an instance attribute, set in __init__
    assert check("CoreConfig.comm_s") and check("TaskStatus.CANCELLED")
    assert check("PlannerCore.no_such_member") is False and check("sched.service.PlannerHealth") is False
    assert check("timelyllm_ros.planner.nowhere") is False and check("planner.core.nowhere") is False
    assert check("core.py") is None and check("planner.health") is None  # a file; a variable named planner
    assert check("vllm.LLM") is None and check("self.x") is None and check("rclpy.node.Node") is None
    assert check("types.SimpleNamespace") is None  # the standard library's, not domain/types.py
    assert list(references("see :meth:`~PlannerCore.submit` and ``Engine.step()``; PlannerCore.cfg, self.x, "
                           "model.types.X, e.g. :func:`declare`")) == [
        ("dotted", "PlannerCore.submit"), ("role", "declare"), ("dotted", "Engine.step"),
        ("dotted", "PlannerCore.cfg"), ("dotted", "model.types.X")]


def test_docstrings_and_comments_name_only_what_exists():
    stale = stale_references()
    assert not stale, "\n".join(stale)
