"""The one engine factory: an :class:`Engine` from a YAML file or a dict.

    backend: vllm          # engine_args: vLLM EngineArgs; env: vLLM environment; dtype: auto (bfloat16 where
                           # the CPU/GPU computes it natively, else float32 / float16), float32 or bfloat16
    backend: remote        # a vLLM server: url, model (served name), tokenizer (local folder), max_batch,
                           # connect_timeout_s, first_token_timeout_s, read_timeout_s, token_timeout_s,
                           # step_wait_s, metrics_interval_s
    backend: transformers  # model, dtype, threads, max_batch, max_suspended
    backend: sim           # sim_engine: SimEngineConfig fields (or a top-level mapping);
                           # time_scale: wall-clock pacing (realtime engines only)
    backend: pool          # members: [engine config file or mapping, ...] (no pools), step_wait_s,
                           # probe_backoff_s, probe_max_backoff_s, max_failovers (engines/pool.py)
    constrained: auto      # decode constrained to the skill grammar of each task (skills/grammar.py): auto (the
                           # default) = on for the backends that take a regex (vllm, remote, a pool of them),
                           # true = on or refused, false = off (see constrained_decoding)
    step_model: FILE       # real backends: the fitted step time that seeds the scheduler's latency estimate
                           # (a file with decode_s, batch_slowdown, prefill_s_per_token, as made by
                           # bench.engine_bench --fit-out; or that mapping inline)

Backends are imported lazily: a simulated or transformers engine never
imports vLLM. A config named by a bare file name is looked up in the
package's config/ folder; relative model paths resolve against the package's
share folder (or ``$TIMELYLLM_MODELS`` for ``models/...``), and a missing model
folder is reported with the command that provisions it.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import Any

from timelyllm_ros import paths
from timelyllm_ros.engines.base import Engine, StepModel
from timelyllm_ros.yamlfile import YamlFileError, load_yaml_file

BACKENDS = ("vllm", "remote", "transformers", "sim", "pool")
_POOL_KEYS = frozenset({"backend", "_path", "constrained", "members", "step_wait_s", "probe_backoff_s",
                        "probe_max_backoff_s", "max_failovers"})
_REMOTE_LIMITS = ("connect_timeout_s", "read_timeout_s", "first_token_timeout_s", "token_timeout_s", "max_batch",
                  "step_wait_s")
# the keys a remote engine's config may have (a shipped file's keys are checked against it)
REMOTE_KEYS = frozenset({"backend", "_path", "constrained", "url", "model", "tokenizer", "metrics_interval_s",
                         "step_model", *_REMOTE_LIMITS})
_STEP_MODEL_KEYS = ("decode_s", "batch_slowdown", "prefill_s_per_token")
_NOT_SIM_KEYS = ("backend", "_path", "constrained", "time_scale")  # top-level keys that are no SimEngineConfig field


class EngineConfigError(ValueError):
    pass


def find_engine_config(name: str | Path) -> Path:
    """The engine YAML ``name`` names: a path (absolute, or relative to the working directory or to the
    share folder, e.g. ``config/engine_sim.yaml``) or a file name in config/ (``engine_sim.yaml``)."""
    p = Path(name)
    if p.is_file() or p.is_absolute():
        return p
    for base in (paths.share_dir(), paths.config_dir()):
        if (base / p).is_file():
            return base / p
    return p


def load_engine_config(config: dict | str | Path) -> dict:
    if isinstance(config, dict):
        return copy.deepcopy(config)
    p = find_engine_config(config)
    if not p.is_file():
        raise EngineConfigError(f"engine config {config} not found (a path, or a file name in {paths.config_dir()})")
    try:
        raw = load_yaml_file(p) or {}
    except YamlFileError as e:  # names the file, line and column
        raise EngineConfigError(str(e)) from None
    if not isinstance(raw, dict):
        raise EngineConfigError(f"{p}: expected a mapping")
    raw.setdefault("_path", str(p))
    return raw


def resolve_model_path(model: str) -> str:
    """Local folder for ``model``; hub names are passed through unchanged."""
    p = Path(model).expanduser()
    if p.is_absolute():
        cand = p
    else:
        if os.environ.get("TIMELYLLM_MODELS") and p.parts and p.parts[0] == "models":
            cand = paths.repo_models_dir().joinpath(*p.parts[1:])
        else:
            cand = paths.share_dir() / p
        if not cand.exists() and p.exists():
            cand = p.resolve()
    looks_local = p.is_absolute() or model.startswith((".", "models/")) or cand.exists()
    if looks_local and not (cand / "config.json").is_file():
        raise EngineConfigError(
            f"model folder {cand} not found or incomplete; provision it with "
            f"`python scripts/provision_model.py` (or set TIMELYLLM_MODELS)")
    return str(cand) if looks_local else model


def load_step_model(cfg: dict) -> StepModel | None:
    """The config's ``step_model``: a fitted file (looked up beside the engine config, then as engine
    configs are) or an inline mapping. Every field is required and nothing else is accepted: a
    misspelt figure must not silently fall back to the paper's GPU prior."""
    spec = cfg.get("step_model")
    if spec is None:
        return None
    where = f"{cfg.get('_path', 'engine config')}: step_model"
    if isinstance(spec, str | Path):
        cands = [Path(cfg["_path"]).parent / spec] if cfg.get("_path") else []
        path = next((c for c in cands if c.is_file()), None) or find_engine_config(spec)
        if not path.is_file():
            raise EngineConfigError(f"{where}: file {spec} not found (beside the engine config or in "
                                    f"{paths.config_dir()})")
        try:
            data = load_yaml_file(path) or {}
        except YamlFileError as e:
            raise EngineConfigError(f"{where}: {e}") from None
        data = data.get("sim_engine", data) if isinstance(data, dict) else data
        source, fields = f"fitted: {path.name}", {k: v for k, v in data.items() if k in _STEP_MODEL_KEYS} \
            if isinstance(data, dict) else None
    elif isinstance(spec, dict):
        unknown = sorted(set(spec) - set(_STEP_MODEL_KEYS))
        if unknown:
            raise EngineConfigError(f"{where}: unknown key(s) {unknown}; known: {list(_STEP_MODEL_KEYS)}")
        source, fields = "engine config", dict(spec)
    else:
        raise EngineConfigError(f"{where}: a file name or a mapping of {list(_STEP_MODEL_KEYS)}, got {spec!r}")
    if fields is None:
        raise EngineConfigError(f"{where}: {spec} holds no mapping")
    missing = [k for k in _STEP_MODEL_KEYS if k not in fields]
    if missing:
        raise EngineConfigError(f"{where}: {missing} missing")
    bad = [k for k in _STEP_MODEL_KEYS if not isinstance(fields[k], int | float) or isinstance(fields[k], bool)]
    if bad:
        raise EngineConfigError(f"{where}: {bad} must be numbers, got {[fields[k] for k in bad]}")
    try:
        return StepModel(*(float(fields[k]) for k in _STEP_MODEL_KEYS), source=source)
    except ValueError as e:
        raise EngineConfigError(f"{where}: {e}") from e


def make_engine(config: dict | str | Path, *, realtime: bool = False, **overrides: Any) -> Engine:
    """Build the engine a config describes. ``overrides`` update top-level keys
    (``engine_args`` is merged key by key).

    ``realtime``: the engine serves a wall clock (the planner node, the demo): a simulated engine
    then sleeps each step's modelled time (scaled by the config's ``time_scale``) instead of
    letting the discrete-event simulator jump its clock. Real backends are the same either way.
    """
    cfg = load_engine_config(config)
    for k, v in overrides.items():
        if k == "engine_args" and isinstance(v, dict):
            cfg.setdefault("engine_args", {}).update(v)
        else:
            cfg[k] = v
    backend = cfg.get("backend")
    if backend not in BACKENDS:
        raise EngineConfigError(f"{cfg.get('_path', 'engine config')}: backend must be one of {BACKENDS}, "
                                f"got {backend!r}")
    if backend == "pool":
        return _pool_engine(cfg, realtime)
    if backend == "sim":
        if "step_model" in cfg:  # its step model is its own configuration
            raise EngineConfigError(f"{cfg.get('_path', 'engine config')}: step_model is for real backends; "
                                    f"a simulated engine's step time is its sim_engine settings")
        return _sim_engine(cfg, realtime)
    step_model = load_step_model(cfg)  # checked before a model is loaded
    engine = _real_engine(cfg, backend)
    if step_model is not None:
        engine.info = dataclasses.replace(engine.info, step_model=step_model)
    return engine


def _real_engine(cfg: dict, backend: str) -> Engine:
    if backend == "vllm":
        from timelyllm_ros.engines.vllm_common import EngineOptionError, apply_default_env
        from timelyllm_ros.engines.vllm_engine import VllmEngine

        args = dict(cfg.get("engine_args") or {})
        if "model" not in args:
            raise EngineConfigError("vllm backend: engine_args.model is required")
        args["model"] = resolve_model_path(str(args["model"]))
        apply_default_env({k: str(v) for k, v in (cfg.get("env") or {}).items()})
        try:
            return VllmEngine(args, dtype=cfg.get("dtype"))
        except EngineOptionError as e:  # refused at configure: say which file
            raise EngineConfigError(f"{cfg.get('_path', 'engine config')}: {e}") from e
    if backend == "remote":
        from timelyllm_ros.engines.remote_engine import TOKEN_TIMEOUT_S, RemoteEngine

        missing = [k for k in ("url", "model") if not cfg.get(k)]
        if missing:
            raise EngineConfigError(f"remote backend: {' and '.join(missing)} required (the server's address and "
                                    f"its --served-model-name)")
        unknown = sorted(set(cfg) - REMOTE_KEYS)
        if unknown:  # a misspelt timeout would otherwise fall back to its default unnoticed
            raise EngineConfigError(f"remote backend: unknown key(s) {unknown}; known: {sorted(REMOTE_KEYS)}")
        for k in _REMOTE_LIMITS:
            if k in cfg and not (isinstance(cfg[k], int | float) and not isinstance(cfg[k], bool) and cfg[k] > 0):
                raise EngineConfigError(f"remote backend: {k} must be a number > 0, got {cfg[k]!r}")
        tok = cfg.get("tokenizer")
        return RemoteEngine(
            str(cfg["url"]), str(cfg["model"]), resolve_model_path(str(tok)) if tok else None,
            connect_timeout_s=float(cfg.get("connect_timeout_s", 3.0)),
            read_timeout_s=float(cfg.get("read_timeout_s", 10.0)),
            first_token_timeout_s=float(cfg.get("first_token_timeout_s", 60.0)),
            token_timeout_s=float(cfg.get("token_timeout_s", TOKEN_TIMEOUT_S)), max_batch=int(cfg.get("max_batch", 8)),
            step_wait_s=float(cfg.get("step_wait_s", 0.05)),
            metrics_interval_s=float(cfg.get("metrics_interval_s", 1.0)))
    if backend == "transformers":
        from timelyllm_ros.engines.hf_engine import TransformersEngine

        if "model" not in cfg:
            raise EngineConfigError("transformers backend: model is required")
        return TransformersEngine(
            resolve_model_path(str(cfg["model"])), dtype=str(cfg.get("dtype", "float32")),
            threads=int(cfg.get("threads", 0)), max_batch=int(cfg.get("max_batch", 4)),
            max_suspended=int(cfg.get("max_suspended", 64)))
    raise AssertionError(backend)


def pool_member_configs(cfg: dict) -> list[dict]:
    """The member configs of a ``backend: pool`` config, loaded and checked (no member contacted). A member
    named by a file is looked up beside the pool's config first, then as engine configs are."""
    where = cfg.get("_path", "engine config")
    unknown = sorted(set(cfg) - _POOL_KEYS)
    if unknown:
        raise EngineConfigError(f"{where}: pool: unknown key(s) {unknown}; known: {sorted(_POOL_KEYS)}")
    members = cfg.get("members")
    if not isinstance(members, list) or not members:
        raise EngineConfigError(f"{where}: pool: `members` must be a non-empty list of engine configs (a file name "
                                f"or a mapping each), got {members!r}")
    out = []
    for i, spec in enumerate(members):
        if isinstance(spec, str | Path):
            beside = Path(cfg["_path"]).parent / spec if cfg.get("_path") else None
            spec = beside if beside is not None and beside.is_file() else spec
        elif not isinstance(spec, dict):
            raise EngineConfigError(f"{where}: pool member {i}: a file name or a mapping, got {spec!r}")
        try:
            m = load_engine_config(spec)
        except EngineConfigError as e:
            raise EngineConfigError(f"{where}: pool member {i}: {e}") from None
        if m.get("backend") == "pool":
            raise EngineConfigError(f"{where}: pool member {i}: a pool cannot be a member of a pool")
        if m.get("backend") not in BACKENDS:
            raise EngineConfigError(f"{where}: pool member {i}: backend must be one of {BACKENDS[:-1]}, got "
                                    f"{m.get('backend')!r}")
        out.append(m)
    for k in ("step_wait_s", "probe_backoff_s", "probe_max_backoff_s", "max_failovers"):
        v = cfg.get(k)
        if v is not None and not (isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
                                  and (v > 0 or k == "max_failovers")):
            raise EngineConfigError(f"{where}: pool: {k} must be a number > 0 (max_failovers >= 0), got {v!r}")
    return out


def _member_name(i: int, m: dict) -> str:
    what = m.get("url") or m.get("_path") or m.get("backend")
    return f"member {i} ({m.get('backend')}: {what})"


def _pool_engine(cfg: dict, realtime: bool) -> Engine:
    from timelyllm_ros.engines.pool import EnginePool, PoolMismatchError

    where = cfg.get("_path", "engine config")
    mcfgs = pool_member_configs(cfg)
    names = [_member_name(i, m) for i, m in enumerate(mcfgs)]
    engines: list[Engine] = []
    try:
        for i, m in enumerate(mcfgs):
            try:
                engines.append(make_engine(m, realtime=realtime))
            except Exception as e:  # an unreachable server, another model, no prefix caching: say which member
                raise EngineConfigError(f"{where}: pool {names[i]}: {type(e).__name__}: {e}") from e
        kw = {k: cfg[k] for k in ("step_wait_s", "probe_backoff_s", "probe_max_backoff_s", "max_failovers")
              if cfg.get(k) is not None}
        return EnginePool(engines, names=names, rebuild=[_rebuilder(m, realtime) for m in mcfgs], **kw)
    except BaseException as e:
        for eng in engines:
            eng.close()
        if isinstance(e, PoolMismatchError):
            raise EngineConfigError(f"{where}: {e}") from e
        raise


def _rebuilder(member: dict, realtime: bool) -> Any:
    return lambda: make_engine(member, realtime=realtime)


def _sim_engine(cfg: dict, realtime: bool) -> Engine:
    from timelyllm_ros.engines.sim_engine import SimEngine, SimEngineConfig

    sim = cfg.get("sim_engine")
    if sim is None:
        sim = {k: v for k, v in cfg.items() if k not in _NOT_SIM_KEYS}
    sim_cfg = SimEngineConfig(**sim)
    if realtime:
        from timelyllm_ros.engines.sim_realtime import RealtimeSimEngine

        return RealtimeSimEngine(sim_cfg, time_scale=float(cfg.get("time_scale", 1.0)))
    return SimEngine(sim_cfg)


REGEX_BACKENDS = ("vllm", "remote")  # backends that decode under a structured-output regex


def constrained_decoding(cfg: dict) -> bool:
    """Whether plans decode constrained to the skill grammar: the config's ``constrained`` (auto, true or
    false; auto when absent): auto is on wherever the backend takes a regex (vLLM in process, a vLLM server,
    a pool whose members all do); true where it does not is refused, naming the backend."""
    want = cfg.get("constrained", "auto")
    if want not in ("auto", True, False):
        raise EngineConfigError(f"{cfg.get('_path', 'engine config')}: constrained must be auto, true or false, "
                                f"got {want!r}")
    backend = cfg.get("backend")
    members = [m.get("backend") for m in pool_member_configs(cfg)] if backend == "pool" else [backend]
    supported = all(b in REGEX_BACKENDS for b in members)
    if want is True and not supported:
        raise EngineConfigError(f"{cfg.get('_path', 'engine config')}: constrained: true, but backend "
                                f"{'/'.join(map(str, members))} takes no grammar (only {REGEX_BACKENDS} and pools "
                                f"of them do); set constrained: false or auto")
    return supported if want == "auto" else bool(want)


def planner_engine(config: dict | str | Path, **overrides: Any) -> tuple[Engine, bool]:
    """The engine of a planner serving robots in real time (:func:`make_engine` with ``realtime``), and
    whether its decoding is constrained to the skill grammar (:func:`constrained_decoding`)."""
    cfg = load_engine_config(config)
    constrained = constrained_decoding(cfg)
    return make_engine(cfg, realtime=True, **overrides), constrained
