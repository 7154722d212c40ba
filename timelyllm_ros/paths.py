"""Where the package's data (skills/, config/, data/) lives.

In a source checkout it is the repository root; after ``colcon build`` or
``cmake --install`` it is ``<prefix>/share/timelyllm_ros``; after a pip
install it is ``<site-packages>/timelyllm_ros/share``. ``TIMELYLLM_SHARE``
overrides all of them.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

_PKG = Path(__file__).resolve().parent  # .../timelyllm_ros


@cache
def share_dir() -> Path:
    env = os.environ.get("TIMELYLLM_SHARE")
    candidates = [Path(env)] if env else []
    candidates += [
        _PKG.parent,  # source checkout: repo root holds skills/
        _PKG / "share",  # pip install (setup.py package data)
    ]
    # installed by ament: <prefix>/lib/python3.X/site-packages/timelyllm_ros
    # -> <prefix>/share/timelyllm_ros
    if len(_PKG.parents) > 3:
        candidates.append(_PKG.parents[3] / "share" / "timelyllm_ros")
    for c in candidates:
        if (c / "skills").is_dir():
            return c
    raise FileNotFoundError(
        "timelyllm_ros data (skills/, config/) not found; looked in "
        + ", ".join(str(c) for c in candidates)
        + ". Set TIMELYLLM_SHARE to the folder that holds skills/."
    )


def skills_dir() -> Path:
    return share_dir() / "skills"


def config_dir() -> Path:
    return share_dir() / "config"


def data_dir() -> Path:
    return share_dir() / "data"


def repo_models_dir() -> Path:
    """Default folder of converted models (git-ignored ``models/``)."""
    env = os.environ.get("TIMELYLLM_MODELS")
    return Path(env) if env else share_dir() / "models"
