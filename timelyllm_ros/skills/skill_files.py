"""Loading skill sets from skills/*.yaml: lookup by file, id or robot type (cached), and validation of every
field, each error naming the file and the field. The data model they load into is :mod:`timelyllm_ros.skills.schema`.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import replace
from pathlib import Path
from threading import Lock
from typing import Any

import yaml

from timelyllm_ros import paths
from timelyllm_ros.skills.call_time import call_estimate
from timelyllm_ros.skills.minispec import SKILL_NAME_RE, CallStatement, SkillParseError, parse_program
from timelyllm_ros.skills.schema import (
    ARG_TYPES,
    EXEC_MODELS,
    GRAMMARS,
    SEGMENTERS,
    ExecTimeSpec,
    PlanStructure,
    SkillArg,
    SkillSet,
    SkillSetError,
    SkillSpec,
)
from timelyllm_ros.yamlfile import YamlFileError, load_yaml_file

_ARG_MODELS = ("linear", "polynomial")  # models that read a numeric argument


def skills_dir() -> Path:
    return paths.skills_dir()


_CACHE: dict[Path, SkillSet] = {}
_RESOLVED: dict[tuple[str, str], Path] = {}
_CACHE_LOCK = Lock()


def load_skill_set(name_or_robot_type_or_path: str | Path) -> SkillSet:
    """Skill set by file path, file stem / id (``drone_minispec``) or robot
    type (``drone``), looked up in :func:`skills_dir`. Cached per file."""
    key = (str(name_or_robot_type_or_path), os.environ.get("TIMELYLLM_SHARE", ""))
    path = _RESOLVED.get(key)
    if path is None:  # resolving a robot type reads every YAML: do it once per key
        path = _RESOLVED[key] = _resolve(name_or_robot_type_or_path)
    with _CACHE_LOCK:
        ss = _CACHE.get(path)
        if ss is None:
            ss = _CACHE[path] = load_skill_set_file(path)
        return ss


def clear_skill_set_cache() -> None:
    with _CACHE_LOCK:
        _CACHE.clear()
        _RESOLVED.clear()


def available_skill_sets() -> dict[str, Path]:
    """id -> file for every skill set in :func:`skills_dir`."""
    out: dict[str, Path] = {}
    for p in sorted(skills_dir().glob("*.yaml")):
        try:
            out[load_skill_set(p).id] = p
        except SkillSetError:
            continue
    return out


def _resolve(key: str | Path) -> Path:
    p = Path(key)
    if p.suffix in (".yaml", ".yml") or p.is_file() or len(p.parts) > 1:
        if not p.is_file():
            raise FileNotFoundError(f"skill set file {p} not found")
        return p.resolve()
    d = skills_dir()
    for suffix in (".yaml", ".yml"):
        if (d / f"{key}{suffix}").is_file():
            return (d / f"{key}{suffix}").resolve()
    matches = []
    for f in sorted(d.glob("*.y*ml")):
        try:
            raw = yaml.safe_load(f.read_text()) or {}
        except yaml.YAMLError:
            continue
        if isinstance(raw, dict) and key in (raw.get("id"), raw.get("robot_type")):
            matches.append(f)
    if len(matches) == 1:
        return matches[0].resolve()
    if matches:
        raise SkillSetError(f"{key!r} matches several skill sets: {', '.join(m.name for m in matches)}; "
                            "name the file or the id")
    known = ", ".join(f.stem for f in sorted(d.glob("*.y*ml")))
    raise FileNotFoundError(f"no skill set {key!r} in {d} (known: {known})")


def load_skill_set_file(path: str | Path) -> SkillSet:
    """Load and validate one YAML file (uncached)."""
    path = Path(path)
    try:
        raw = load_yaml_file(path)
    except YamlFileError as e:  # names the file, line and column
        raise SkillSetError(str(e)) from None
    return skill_set_from_dict(raw, source=str(path), path=path)


def skill_set_from_dict(raw: Any, source: str = "<dict>", path: Path | None = None) -> SkillSet:
    v = _V(source)
    if not isinstance(raw, dict):
        v.fail("", "expected a mapping at the top level")
    ss_id = v.string(raw, "id", default=path.stem if path else None)
    robot_type = v.string(raw, "robot_type")
    segmenter = v.choice(raw, "segmenter", SEGMENTERS)
    default_grammar = {"minispec": "minispec", "semicolon": "calls", "sentence": "text"}[segmenter]
    grammar = v.choice(raw, "grammar", GRAMMARS, default=default_grammar)
    lmax = v.integer(raw, "lmax", lo=1)
    skills_raw = raw.get("skills", [])
    if not isinstance(skills_raw, list):
        v.fail("skills", "expected a list")
    if grammar != "text" and not skills_raw:
        v.fail("skills", f"grammar {grammar!r} needs at least one skill")
    skills = tuple(_skill(v, s, f"skills[{i}]") for i, s in enumerate(skills_raw))
    text_exec = raw.get("text_exec_time", {}) or {}
    if not isinstance(text_exec, dict):
        v.fail("text_exec_time", "expected a mapping")
    for k in ("min_per_word", "typical_per_word", "max_per_word"):
        if k in text_exec:
            v.number(text_exec, k, f"text_exec_time.{k}", lo=0)
    known = {"id", "robot_type", "description", "segmenter", "grammar", "lmax", "skills",
             "max_loop_count", "max_plan_exec_s", "max_plan_iterations", "min_segment_tokens", "text_exec_time",
             "plan_structure"}
    v.no_extra(raw, known, "")
    for k in ("max_plan_exec_s", "max_plan_iterations"):
        if grammar == "text" and k in raw:
            v.fail(k, f"only for skill languages: grammar 'text' runs no skills (remove {k})")
    max_exec = v.number(raw, "max_plan_exec_s", "max_plan_exec_s", default=SkillSet.max_plan_exec_s)
    if not max_exec > 0:
        v.fail("max_plan_exec_s", f"must be > 0 s, got {max_exec:g}")
    structure = _plan_structure(v, raw.get("plan_structure"), skills, grammar)
    return _resolve_composites(v, SkillSet(
        plan_structure=structure,
        id=ss_id, robot_type=robot_type, description=str(raw.get("description", "")).strip(),
        segmenter=segmenter, grammar=grammar, lmax=lmax, skills=skills, path=path,
        max_loop_count=v.integer(raw, "max_loop_count", lo=1, default=20),
        max_plan_exec_s=max_exec,
        max_plan_iterations=v.integer(raw, "max_plan_iterations", lo=1, default=SkillSet.max_plan_iterations),
        min_segment_tokens=v.integer(raw, "min_segment_tokens", lo=0, default=10),
        text_exec_time={k: float(x) for k, x in text_exec.items()},
    ))


def _resolve_composites(v: _V, ss: SkillSet) -> SkillSet:
    """A composite skill's time (``model: composite``) is that of what it runs, ``runs``: calls of this skill set, its
    (min, typical, max) the sum of theirs, composites within resolved first. So its worst case is that of what it
    runs, for the plan bounds and the interpreter's run-time count alike: goto was a constant 2.5 s while it runs an
    orient of up to 4 turns and mf(100) (6.66 s at worst), and 20{6{g('cat')}} passed the 300 s bound at 300.0 s."""
    def timed(s: SkillSpec, lo: float, typ: float, hi: float) -> SkillSpec:
        return replace(s, exec_time=replace(s.exec_time, params={**s.exec_time.params, "min": lo, "typical": typ,
                                                                 "max": hi}))

    todo = {s.name for s in ss.skills if s.exec_time.model == "composite"}
    # zero until resolved, so that the parser (which also counts plan bounds) can read a text that calls one
    ss = replace(ss, skills=tuple(timed(s, 0, 0, 0) if s.name in todo else s for s in ss.skills), _by_name={})
    while todo:
        done: dict[str, SkillSpec] = {}
        for name in sorted(todo):
            at = f"skills.{name}.exec_time.runs"
            try:
                prog = parse_program(ss, ss[name].exec_time.params["runs"], complete=True)
            except SkillParseError as e:
                v.fail(at, f"not calls of this skill set: {e}")
            if not all(isinstance(st, CallStatement) for st in prog.statements):
                v.fail(at, "only calls (no blocks, assignments or returns)")
            calls = [st.call for st in prog.statements]
            if not any(c.name in todo for c in calls):  # else it waits for the composites it runs
                est = [call_estimate(ss[c.name], c) for c in calls]
                done[name] = timed(ss[name], sum(e.min_s for e in est), sum(e.typical_s for e in est),
                                   sum(e.max_s for e in est))
        if not done:
            v.fail(f"skills.{min(todo)}.exec_time.runs", f"composite skills run each other in a cycle: {sorted(todo)}")
        ss = replace(ss, skills=tuple(done.get(s.name, s) for s in ss.skills), _by_name={})
        todo -= set(done)
    return ss


_UNIT_CALL = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\((?:\$([a-z_][a-z0-9_]*))?\)$")


def _plan_structure(v: _V, raw: Any, skills: tuple[SkillSpec, ...], grammar: str) -> PlanStructure:
    at = "plan_structure"
    if raw is None:
        return PlanStructure()
    if grammar == "text" or not isinstance(raw, dict):
        v.fail(at, "expected a mapping, and only for skill languages")
    v.no_extra(raw, {"unit", "max_units", "unit_verbs", "order", "first_by_tag", "max_statements",
                     "max_block_statements"}, at)
    by_name = {n: s for s in skills for n in (s.name, s.long_name, *s.aliases)}
    first_by_tag: dict[str, tuple[str, ...]] = {}
    fbt = raw.get("first_by_tag") or {}
    if not isinstance(fbt, dict):
        v.fail(f"{at}.first_by_tag", f"expected a mapping tag -> [skill, ...], got {fbt!r}")
    for tag, names in fbt.items():
        if not (isinstance(tag, str) and len(tag) == 1 and tag.isupper()):
            v.fail(f"{at}.first_by_tag", f"a tag is one capital letter (E for [E]), got {tag!r}")
        if not isinstance(names, list) or not names:
            v.fail(f"{at}.first_by_tag.{tag}", "expected a non-empty list of skills")
        for n in names:
            if n not in by_name:
                v.fail(f"{at}.first_by_tag.{tag}", f"unknown skill {n!r}")
        first_by_tag[tag] = tuple(by_name[n].name for n in names)
    unit: list[tuple[str, str | None]] = []
    for i, c in enumerate(raw.get("unit") or []):
        m = _UNIT_CALL.match(str(c).strip())
        if not m:
            v.fail(f"{at}.unit[{i}]", f"expected skill() or skill($name), got {c!r}")
        s = by_name.get(m[1])
        if s is None:
            v.fail(f"{at}.unit[{i}]", f"unknown skill {m[1]!r}")
        var = m[2]
        arity = 1 if var else 0
        if not any(len(sig) == arity and (not var or sig[0].type == "str") for sig in s.signatures):
            v.fail(f"{at}.unit[{i}]", f"{m[1]} takes no {'single string argument' if var else 'empty call'}")
        if var and unit and any(u[1] == var for u in unit) and unit[-1][1] != var:
            # a regex can only tie a name to the calls next to each other (grammar.py enumerates the names)
            v.fail(f"{at}.unit[{i}]", f"${var} must be used by consecutive calls only")
        unit.append((s.name, var))
    if grammar != "calls" and unit:
        v.fail(f"{at}.unit", "only for grammar 'calls'")
    max_units = v.integer(raw, "max_units", lo=1, default=10, at=f"{at}.max_units") if unit else 0
    verbs = raw.get("unit_verbs") or []
    if not isinstance(verbs, list) or not all(isinstance(w, str) and w.isalpha() for w in verbs):
        v.fail(f"{at}.unit_verbs", f"expected a list of words, got {verbs!r}")
    if verbs and not unit:
        v.fail(f"{at}.unit_verbs", "needs a unit")
    return PlanStructure(
        unit=tuple(unit), max_units=max_units, unit_verbs=frozenset(w.lower() for w in verbs),
        order=v.choice(raw, "order", ("any", "task"), at=f"{at}.order", default="any"), first_by_tag=first_by_tag,
        max_statements=v.integer(raw, "max_statements", lo=1, default=None, at=f"{at}.max_statements"),
        max_block_statements=v.integer(raw, "max_block_statements", lo=1, default=None,
                                       at=f"{at}.max_block_statements"))


def _skill(v: _V, s: Any, at: str) -> SkillSpec:
    if not isinstance(s, dict):
        v.fail(at, "expected a mapping")
    name = v.string(s, "name", at=f"{at}.name")
    if not SKILL_NAME_RE.fullmatch(name):
        v.fail(f"{at}.name", f"{name!r} is not an identifier")
    at = f"{at} ({name})"
    if "args" in s and "signatures" in s:
        v.fail(at, "give either args or signatures, not both")
    if "signatures" in s:
        sigs_raw = s["signatures"]
        if not isinstance(sigs_raw, list) or not sigs_raw or not all(isinstance(x, list) for x in sigs_raw):
            v.fail(f"{at}.signatures", "expected a non-empty list of argument lists")
    else:
        args_raw = s.get("args", [])
        if not isinstance(args_raw, list):
            v.fail(f"{at}.args", "expected a list")
        sigs_raw = [args_raw]
    sigs = tuple(
        tuple(_arg(v, a, f"{at}.{'signatures' if 'signatures' in s else 'args'}[{j}]") for j, a in enumerate(sig))
        for sig in sigs_raw
    )
    aliases = s.get("aliases", []) or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        v.fail(f"{at}.aliases", "expected a list of names")
    et = s.get("exec_time")
    if not isinstance(et, dict):
        v.fail(f"{at}.exec_time", "missing or not a mapping (the skill's execution-time model, design §7)")
    op = s.get("op")
    if op is not None and (not isinstance(op, str) or not SKILL_NAME_RE.fullmatch(op)):
        v.fail(f"{at}.op", f"expected an operation name, got {op!r}")
    op_args = s.get("op_args", {}) or {}
    if not isinstance(op_args, dict) or not all(isinstance(k, str) for k in op_args):
        v.fail(f"{at}.op_args", "expected a mapping of parameter names to values")
    for k, x in op_args.items():
        if not isinstance(x, (str, int, float, bool)):
            v.fail(f"{at}.op_args.{k}", f"expected a string, number or boolean, got {x!r}")
    if op_args and op is None:
        v.fail(f"{at}.op_args", "given without op")
    v.no_extra(s, {"name", "long_name", "description", "kind", "args", "signatures", "returns", "aliases",
                   "exec_time", "op", "op_args", "phrases", "asked_by"}, at)
    phrases, asked_by = s.get("phrases", []) or [], s.get("asked_by", []) or []
    for key, val in (("phrases", phrases), ("asked_by", asked_by)):
        if not isinstance(val, list) or not all(isinstance(p, str) and p.strip() for p in val):
            v.fail(f"{at}.{key}", "expected a list of phrases")
    return SkillSpec(
        name=name, long_name=v.string(s, "long_name", at=f"{at}.long_name", default=name),
        description=str(s.get("description", "")).strip(), kind=v.string(s, "kind", at=f"{at}.kind", default="other"),
        signatures=sigs, exec_time=_exec_time(v, et, f"{at}.exec_time", sigs),
        returns=None if s.get("returns") is None else str(s["returns"]), aliases=tuple(aliases),
        op=op, op_args=dict(op_args), phrases=tuple(" ".join(p.lower().split()) for p in phrases),
        asked_by=tuple(" ".join(p.lower().split()) for p in asked_by),
    )


def _arg(v: _V, a: Any, at: str) -> SkillArg:
    if not isinstance(a, dict):
        v.fail(at, "expected a mapping")
    v.no_extra(a, {"name", "type", "min", "max", "unit", "typical", "min_length", "max_length", "pattern",
                   "description", "from_task", "min_words"}, at)
    name = v.string(a, "name", at=f"{at}.name")
    typ = v.choice(a, "type", ARG_TYPES, at=f"{at}.type")
    lo = v.number(a, "min", f"{at}.min", default=None)
    hi = v.number(a, "max", f"{at}.max", default=None)
    if lo is not None and hi is not None and lo > hi:
        v.fail(f"{at}.min", f"min {lo} > max {hi}")
    typical = v.number(a, "typical", f"{at}.typical", default=None)
    if typical is not None and ((lo is not None and typical < lo) or (hi is not None and typical > hi)):
        v.fail(f"{at}.typical", f"{typical} outside [{lo}, {hi}]")
    pattern = a.get("pattern")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as e:
            v.fail(f"{at}.pattern", f"bad regex: {e}")
    return SkillArg(
        name=name, type=typ, min=lo, max=hi, unit=str(a.get("unit", "")), typical=typical,
        min_length=v.integer(a, "min_length", lo=0, default=1, at=f"{at}.min_length"),
        max_length=v.integer(a, "max_length", lo=0, default=100, at=f"{at}.max_length"),
        pattern=pattern, description=str(a.get("description", "")),
        from_task=_from_task(v, a, typ, at),
        min_words=v.integer(a, "min_words", lo=0, default=0, at=f"{at}.min_words"),
    )


def _from_task(v: _V, a: dict, typ: str, at: str) -> str:
    val = a.get("from_task", "")
    val = {True: "any", False: ""}.get(val, val) if isinstance(val, bool) else val
    if val not in ("", "any", "object"):
        v.fail(f"{at}.from_task", f"must be any, object, true or false, got {val!r}")
    if val and typ != "str":
        v.fail(f"{at}.from_task", f"only string arguments name things, this one is {typ}")
    return val


def _exec_time(v: _V, et: dict, at: str, sigs: tuple[tuple[SkillArg, ...], ...]) -> ExecTimeSpec:
    model = v.choice(et, "model", tuple(EXEC_MODELS), at=f"{at}.model")
    for k in EXEC_MODELS[model]:
        if k not in et:
            v.fail(f"{at}.{k}", f"required by model {model!r}")
    params: dict[str, Any] = {}
    for k, x in et.items():
        if k in ("model", "arg", "noise"):
            continue
        if k in ("coeffs", "count_weights"):
            if not isinstance(x, list) or not x or not all(_is_num(c) for c in x):
                v.fail(f"{at}.{k}", "expected a non-empty list of numbers")
            params[k] = tuple(float(c) for c in x)
        elif k in ("min_count", "max_count"):
            params[k] = v.integer(et, k, lo=0, at=f"{at}.{k}")
        elif k in ("value", "a", "b", "low", "high", "unit", "base"):
            params[k] = v.number(et, k, f"{at}.{k}")
        elif k == "runs" and model == "composite":
            params[k] = v.string(et, k, at=f"{at}.{k}")
        else:
            v.fail(f"{at}.{k}", f"unknown field for model {model!r}")
    arg = et.get("arg")
    if model in _ARG_MODELS:
        numeric = {a.name for sig in sigs for a in sig if a.type in ("int", "float")}
        if arg not in numeric:
            v.fail(f"{at}.arg", f"model {model!r} needs 'arg' naming a numeric argument (one of {sorted(numeric)})")
    if model == "uniform" and params["low"] > params["high"]:
        v.fail(f"{at}.low", "low > high")
    if model == "repeated":
        lo_k, hi_k = params["min_count"], params["max_count"]
        if lo_k > hi_k:
            v.fail(f"{at}.min_count", "min_count > max_count")
        w = params.get("count_weights")
        if w is not None and (len(w) != hi_k - lo_k + 1 or any(x < 0 for x in w) or sum(w) <= 0):
            v.fail(f"{at}.count_weights", f"expected {hi_k - lo_k + 1} non-negative weights (one per count)")
    noise = v.number(et, "noise", f"{at}.noise", default=0.0, lo=0)
    if noise >= 1:
        v.fail(f"{at}.noise", "must be < 1 (relative half-width)")
    return ExecTimeSpec(model=model, params=params, arg=arg, noise=noise)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class _V:
    """Field validators that name the file and the field in their errors."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, at: str, msg: str) -> Any:
        raise SkillSetError(f"{self.source}: {at + ': ' if at else ''}{msg}")

    def string(self, d: dict, key: str, at: str | None = None, default: Any = ...) -> str:
        at = at or key
        if key not in d or d[key] is None:
            if default is ... or default is None:
                self.fail(at, "missing")
            return default
        if not isinstance(d[key], str) or not d[key].strip():
            self.fail(at, f"expected a non-empty string, got {d[key]!r}")
        return d[key]

    def choice(self, d: dict, key: str, options: tuple[str, ...], at: str | None = None, default: Any = ...) -> str:
        at = at or key
        if key not in d:
            if default is ...:
                self.fail(at, f"missing (one of {', '.join(options)})")
            return default
        if d[key] not in options:
            self.fail(at, f"{d[key]!r} is not one of {', '.join(options)}")
        return d[key]

    def integer(self, d: dict, key: str, lo: int | None = None, default: Any = ..., at: str | None = None) -> int:
        at = at or key
        if key not in d:
            if default is ...:
                self.fail(at, "missing")
            return default
        x = d[key]
        if not isinstance(x, int) or isinstance(x, bool):
            self.fail(at, f"expected an integer, got {x!r}")
        if lo is not None and x < lo:
            self.fail(at, f"must be >= {lo}, got {x}")
        return x

    def number(self, d: dict, key: str, at: str, default: Any = ..., lo: float | None = None) -> Any:
        if key not in d or d[key] is None:
            if default is ...:
                self.fail(at, "missing")
            return default
        x = d[key]
        if not _is_num(x) or not math.isfinite(x):
            self.fail(at, f"expected a number, got {x!r}")
        if lo is not None and x < lo:
            self.fail(at, f"must be >= {lo}, got {x}")
        return float(x)

    def no_extra(self, d: dict, known: set[str], at: str) -> None:
        extra = sorted(set(d) - known)
        if extra:
            self.fail(at, f"unknown field(s) {', '.join(map(str, extra))} (known: {', '.join(sorted(known))})")
