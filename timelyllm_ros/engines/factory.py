"""make_engine(): an :class:`Engine` from a YAML file or a dict.

    backend: vllm          # engine_args: vLLM EngineArgs; env: vLLM environment
    backend: transformers  # model, dtype, threads, max_batch, max_suspended
    backend: sim           # sim_engine: SimEngineConfig fields (or a top-level mapping)

Backends are imported lazily: a simulated or transformers engine never
imports vLLM. Relative model paths resolve against the repository root (or
``$TIMELYLLM_MODELS`` for ``models/...``), and a missing model folder is
reported with the command that provisions it.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

from timelyllm_ros.engines.base import Engine

BACKENDS = ("vllm", "transformers", "sim")
_REPO = Path(__file__).resolve().parents[2]


class EngineConfigError(ValueError):
    pass


def load_engine_config(config: dict | str | Path) -> dict:
    if isinstance(config, dict):
        return copy.deepcopy(config)
    p = Path(config)
    if not p.is_file() and not p.is_absolute() and (_REPO / p).is_file():
        p = _REPO / p
    if not p.is_file():
        raise EngineConfigError(f"engine config {config} not found")
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
        env = os.environ.get("TIMELYLLM_MODELS")
        if env and p.parts and p.parts[0] == "models":
            cand = Path(env).joinpath(*p.parts[1:])
        else:
            cand = _REPO / p
        if not cand.exists() and p.exists():
            cand = p.resolve()
    looks_local = p.is_absolute() or model.startswith((".", "models/")) or cand.exists()
    if looks_local and not (cand / "config.json").is_file():
        raise EngineConfigError(
            f"model folder {cand} not found or incomplete; provision it with "
            f"`python scripts/provision_model.py` (or set TIMELYLLM_MODELS)")
    return str(cand) if looks_local else model


def make_engine(config: dict | str | Path, **overrides: Any) -> Engine:
    """Build the engine a config describes. ``overrides`` update top-level keys
    (``engine_args`` is merged key by key)."""
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
        sim = {k: v for k, v in cfg.items() if k not in ("backend", "_path", "constrained")}
    return SimEngine(SimEngineConfig(**sim))
