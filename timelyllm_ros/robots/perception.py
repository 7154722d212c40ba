"""The stand-in detector: a scripted scene, parsed from a task's ``Scene: [...]`` text.

This is NOT a vision model. It is declared here, behind the :class:`Perception`
interface, so that a real detector (a camera + YOLO node publishing on the
robot's detection topic) replaces it without touching the executors.

Scene syntax (the prompts' format, config/prompts/*.yaml), one bracket group or
comma-separated objects::

    Scene: [cat x:0.48 y:0.55 width:0.2 height:0.3, chair_1 x:0.3 y:0.5 width:0.2 height:0.4] Task: ...
    Scene: [red_block x:0.42 y:-0.10] [blue_block x:0.35 y:0.18] Task: ...

Optional extras of ours: ``bearing:<deg>`` (clockwise from the drone's heading
at the start of the task; default 0 = in the current view) so that a scan has
to turn to find an object, and ``dis:<cm>`` (distance; default from the size).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Protocol

FOV_DEG = 82.6  # Tello camera horizontal field of view

_SCENE_RE = re.compile(r"Scene:\s*((?:\[[^\]]*\]\s*,?\s*)*)", re.IGNORECASE)
_FIELD_RE = re.compile(r"([A-Za-z_]+):\s*(-?[0-9.]+(?:[eE][-+]?\d+)?)")


@dataclass(frozen=True)
class SceneObject:
    name: str
    x: float = 0.5  # image centre, 0..1 (drone) or table x in metres (arm)
    y: float = 0.5
    width: float = 0.2
    height: float = 0.2
    bearing: float = 0.0  # degrees clockwise from the task-start heading
    distance: float | None = None  # cm


@dataclass(frozen=True)
class Detection:
    name: str
    x: float
    y: float
    width: float
    height: float
    distance: float


def parse_scene(text: str) -> list[SceneObject]:
    """Objects of a ``Scene: [...]`` text (or of bare ``[...]`` groups). ValueError on a malformed object."""
    m = _SCENE_RE.search(text)
    body = m.group(1) if m else (text if text.strip().startswith("[") else "")
    objects: list[SceneObject] = []
    for group in re.findall(r"\[([^\]]*)\]", body):
        for item in group.split(","):
            item = item.strip()
            if not item:
                continue
            name, _, rest = item.partition(" ")
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
                raise ValueError(f"scene object {item!r}: bad name {name!r}")
            fields = {k.lower(): float(v) for k, v in _FIELD_RE.findall(rest)}
            unknown = set(fields) - {"x", "y", "width", "height", "bearing", "dis"}
            if unknown:
                raise ValueError(f"scene object {name!r}: unknown field(s) {sorted(unknown)}")
            objects.append(SceneObject(name=name, x=fields.get("x", 0.5), y=fields.get("y", 0.5),
                                       width=fields.get("width", 0.2), height=fields.get("height", 0.2),
                                       bearing=fields.get("bearing", 0.0), distance=fields.get("dis")))
    return objects


def name_matches(query: str, name: str) -> bool:
    """'chair' matches 'chair_1'; case-insensitive; spaces and underscores are the same."""
    q = query.strip().lower().replace(" ", "_")
    n = name.lower()
    return n == q or re.sub(r"_\d+$", "", n) == q


class Perception(Protocol):
    """What executors ask about the world. ``heading`` is the robot's yaw (deg, clockwise) since the task began."""

    def detect(self, heading: float = 0.0) -> list[Detection]: ...

    def find(self, name: str, heading: float = 0.0) -> Detection | None: ...

    def probe(self, question: str, heading: float = 0.0) -> str | bool: ...

    def objects(self) -> list[SceneObject]: ...


class ScriptedScene:
    """Perception from a scripted scene; thread-safe (the scene topic sets it while a plan runs)."""

    def __init__(self, scene: str | list[SceneObject] = "") -> None:
        self._lock = threading.Lock()
        self._objects: list[SceneObject] = []
        self.pictures: list[float] = []  # headings where tp() took a picture
        self.set_scene(scene)

    def set_scene(self, scene: str | list[SceneObject]) -> None:
        objs = parse_scene(scene) if isinstance(scene, str) else list(scene)
        with self._lock:
            self._objects = objs

    def objects(self) -> list[SceneObject]:
        with self._lock:
            return list(self._objects)

    def detect(self, heading: float = 0.0) -> list[Detection]:
        out = []
        for o in self.objects():
            # Turning clockwise by h moves an object at bearing b to x + (b - h)/FOV in the image.
            off = (o.bearing - heading + 180.0) % 360.0 - 180.0
            x = o.x + off / FOV_DEG
            if 0.0 <= x <= 1.0:
                dist = o.distance if o.distance is not None else round(30.0 / max(o.height, 0.05), 1)
                out.append(Detection(o.name, x, o.y, o.width, o.height, dist))
        return out

    def find(self, name: str, heading: float = 0.0) -> Detection | None:
        for d in self.detect(heading):
            if name_matches(name, d.name):
                return d
        return None

    def probe(self, question: str, heading: float = 0.0) -> str | bool:
        """Stand-in VLM: names the visible objects the question mentions, else False."""
        words = set(re.findall(r"[a-z0-9]+", question.lower()))
        seen = [d.name for d in self.detect(heading)
                if re.sub(r"_\d+$", "", d.name.lower()) in words or d.name.lower() in words]
        return ", ".join(seen) if seen else False

    def position(self, name: str) -> tuple[float, float] | None:
        """Table position (arm scenes: x, y in metres) of a named object."""
        for o in self.objects():
            if name_matches(name, o.name):
                return (o.x, o.y)
        return None

    def take_picture(self, heading: float = 0.0) -> None:
        with self._lock:
            self.pictures.append(heading)


def bearing_error(det: Detection) -> float:
    """Degrees to turn clockwise to centre a detection."""
    return (det.x - 0.5) * FOV_DEG
