"""The one engine factory: an :class:`Engine` from a YAML file or a dict.

    backend: vllm          # engine_args: vLLM EngineArgs; env: vLLM environment
    backend: remote        # a vLLM server: url, model (served name), tokenizer (local folder), max_batch,
                           # connect_timeout_s, first_token_timeout_s, read_timeout_s, step_wait_s,
                           # metrics_interval_s
    backend: transformers  # model, dtype, threads, max_batch, max_suspended
    backend: sim           # sim_engine: SimEngineConfig fields (or a top-level mapping);
                           # time_scale: wall-clock pacing (realtime engines only)
    constrained: false     # decode constrained to the skill grammar (read by the caller, see planner_engine)

Backends are imported lazily: a simulated or transformers engine never
imports vLLM. A config named by a bare file name is looked up in the
package's config/ folder; relative model paths resolve against the package's
share folder (or ``$TIMELYLLM_MODELS`` for ``models/...``), and a missing model
folder is reported with the command that provisions it.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

from timelyllm_ros import paths
from timelyllm_ros.engines.base import Engine

BACKENDS = ("vllm", "remote", "transformers", "sim")
_REMOTE_LIMITS = ("connect_timeout_s", "read_timeout_s", "first_token_timeout_s", "max_batch", "step_wait_s")
_REMOTE_KEYS = frozenset({"backend", "_path", "constrained", "url", "model", "tokenizer", "metrics_interval_s",
                          *_REMOTE_LIMITS})
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
    raw = yaml.safe_load(p.read_text()) or {}
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
    if backend == "vllm":
        from timelyllm_ros.engines.vllm_engine import VllmEngine, apply_default_env

        args = dict(cfg.get("engine_args") or {})
        if "model" not in args:
            raise EngineConfigError("vllm backend: engine_args.model is required")
        args["model"] = resolve_model_path(str(args["model"]))
        apply_default_env({k: str(v) for k, v in (cfg.get("env") or {}).items()})
        return VllmEngine(args)
    if backend == "remote":
        from timelyllm_ros.engines.remote_engine import RemoteEngine

        missing = [k for k in ("url", "model") if not cfg.get(k)]
        if missing:
            raise EngineConfigError(f"remote backend: {' and '.join(missing)} required (the server's address and "
                                    f"its --served-model-name)")
        unknown = sorted(set(cfg) - _REMOTE_KEYS)
        if unknown:  # a misspelt timeout would otherwise fall back to its default unnoticed
            raise EngineConfigError(f"remote backend: unknown key(s) {unknown}; known: {sorted(_REMOTE_KEYS)}")
        for k in _REMOTE_LIMITS:
            if k in cfg and not (isinstance(cfg[k], int | float) and not isinstance(cfg[k], bool) and cfg[k] > 0):
                raise EngineConfigError(f"remote backend: {k} must be a number > 0, got {cfg[k]!r}")
        tok = cfg.get("tokenizer")
        return RemoteEngine(
            str(cfg["url"]), str(cfg["model"]), resolve_model_path(str(tok)) if tok else None,
            connect_timeout_s=float(cfg.get("connect_timeout_s", 3.0)),
            read_timeout_s=float(cfg.get("read_timeout_s", 10.0)),
            first_token_timeout_s=float(cfg.get("first_token_timeout_s", 60.0)), max_batch=int(cfg.get("max_batch", 8)),
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
    from timelyllm_ros.engines.sim_engine import SimEngine, SimEngineConfig

    sim = cfg.get("sim_engine")
    if sim is None:
        sim = {k: v for k, v in cfg.items() if k not in _NOT_SIM_KEYS}
    sim_cfg = SimEngineConfig(**sim)
    if realtime:
        from timelyllm_ros.engines.sim_realtime import RealtimeSimEngine

        return RealtimeSimEngine(sim_cfg, time_scale=float(cfg.get("time_scale", 1.0)))
    return SimEngine(sim_cfg)


def planner_engine(config: dict | str | Path, **overrides: Any) -> tuple[Engine, bool]:
    """The engine of a planner serving robots in real time (:func:`make_engine` with ``realtime``), and
    whether its decoding is constrained to the skill grammar (the config's ``constrained``, default off;
    it only has an effect where the backend takes a regex, i.e. vLLM)."""
    cfg = load_engine_config(config)
    return make_engine(cfg, realtime=True, **overrides), bool(cfg.get("constrained", False))
