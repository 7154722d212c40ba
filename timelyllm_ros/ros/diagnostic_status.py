"""The ``/diagnostics`` machinery every node shares (see :mod:`timelyllm_ros.ros.diagnostics` for what the planner
and the executors report): the levels, a :class:`Status` being built, and one :class:`DiagnosticsPublisher` per
node that publishes its producers' statuses every ``diagnostics_period_s``.
"""

from __future__ import annotations

import math
import threading
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node

from timelyllm_ros.interfaces import DIAGNOSTICS as DIAGNOSTICS_TOPIC
from timelyllm_ros.ros.params import declare
from timelyllm_ros.ros.topics import DIAGNOSTICS_QOS

OK, WARN, ERROR, STALE = 0, 1, 2, 3
LEVEL_NAMES = {OK: "OK", WARN: "WARN", ERROR: "ERROR", STALE: "STALE"}


def level_name(level: int | bytes) -> str:
    """"OK", "WARN", "ERROR" or "STALE" for a level (an int, or the bytes a DiagnosticStatus message holds)."""
    n = level[0] if isinstance(level, (bytes, bytearray)) else int(level)
    return LEVEL_NAMES.get(n, str(n))


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.3f}" if math.isfinite(value) else str(value)
    return str(value)


class Status:
    """One DiagnosticStatus being built: the worst level raised wins, its reasons make the message.

    ``st.add("battery_pct", 87).raise_to(WARN, "battery 20 %")``; ``summary`` is the message while OK."""

    def __init__(self, name: str, hardware_id: str = "", summary: str = "") -> None:
        self.name, self.hardware_id, self.summary = name, hardware_id, summary
        self.level = OK
        self.reasons: list[tuple[int, str]] = []
        self.values: list[tuple[str, str]] = []

    def add(self, key: str, value: Any) -> Status:
        self.values.append((key, _fmt(value)))
        return self

    def raise_to(self, level: int, why: str) -> Status:
        """At least ``level`` (never lowers it); ``why`` joins the message when it is of the final level."""
        self.level = max(self.level, level)
        self.reasons.append((level, why))
        return self

    @property
    def message(self) -> str:
        worst = [why for lvl, why in self.reasons if lvl == self.level and why]
        return "; ".join(worst) if worst and self.level != OK else self.summary or LEVEL_NAMES[self.level]

    def to_msg(self) -> DiagnosticStatus:
        return DiagnosticStatus(level=bytes([self.level]), name=self.name, message=self.message,
                                hardware_id=self.hardware_id,
                                values=[KeyValue(key=k, value=v) for k, v in self.values])


Producer = Callable[[], "Status | Iterable[Status] | None"]


def declare_threshold(node: Node, name: str, default: float | int, description: str, lo: float | int,
                      hi: float | int, *, read_only: bool = False) -> None:
    """Declare a number parameter with its description and range (an int default: an integer range). Declaring
    again is a no-op, so two helpers on one node may ask for the same threshold."""
    if node.has_parameter(name):
        return
    declare(node, name, default, description, read_only=read_only, min=lo, max=hi)


class DiagnosticsPublisher:
    """Publishes one DiagnosticArray of its producers' statuses on ``/diagnostics`` every period. Get it with
    :func:`diagnostics_for` (one per node). A producer that raises is reported as an ERROR status of its own
    (named after the producer), never raised into the executor."""

    ATTR = "_timelyllm_diagnostics"

    def __init__(self, node: Node) -> None:
        self.node = node
        declare_threshold(node, "diagnostics_period_s", 1.0,
                          "seconds between DiagnosticArray messages on /diagnostics (read at start); 0: off",
                          0.0, 3600.0, read_only=True)
        self.period_s = float(node.get_parameter("diagnostics_period_s").value)
        self.prefix = node.get_fully_qualified_name().lstrip("/")
        self._producers: list[tuple[str, Producer]] = []
        self._lock = threading.Lock()
        self.group = MutuallyExclusiveCallbackGroup()  # its timer and the helpers' subscriptions
        self._pub = node.create_publisher(DiagnosticArray, DIAGNOSTICS_TOPIC, DIAGNOSTICS_QOS)
        self._timer = (node.create_timer(self.period_s, self.publish, callback_group=self.group)
                       if self.period_s > 0 else None)
        self.published = 0

    def name(self, what: str) -> str:
        """A status name: ``<node>: <what>``."""
        return f"{self.prefix}: {what}"

    def value(self, parameter: str) -> Any:
        """A threshold's current value (``ros2 param set`` applies at the next publication)."""
        return self.node.get_parameter(parameter).value

    def add(self, producer: Producer, what: str = "") -> None:
        with self._lock:
            self._producers.append((what or getattr(producer, "__name__", "status"), producer))

    def collect(self) -> list[DiagnosticStatus]:
        with self._lock:
            producers = list(self._producers)
        out: list[DiagnosticStatus] = []
        for what, produce in producers:
            try:
                got = produce()
                statuses = [] if got is None else [got] if isinstance(got, Status) else list(got)
                out.extend(s.to_msg() for s in statuses)
            except Exception as e:  # noqa: BLE001 - a broken producer must not hide the others
                self.node.get_logger().error(f"diagnostics producer {what} raised:\n{traceback.format_exc()}")
                out.append(Status(self.name(what)).raise_to(ERROR, f"diagnostics failed: {e!r}").to_msg())
        return out

    def publish(self) -> None:
        msg = DiagnosticArray(status=self.collect())
        msg.header.stamp = self.node.get_clock().now().to_msg()
        try:
            self._pub.publish(msg)
            self.published += 1
        except Exception as e:  # noqa: BLE001 - e.g. the context is going away: a missed array is harmless
            self.node.get_logger().debug(f"could not publish /diagnostics: {e!r}")

    def destroy(self) -> None:
        if self._timer is not None:
            self.node.destroy_timer(self._timer)
            self._timer = None
        self.node.destroy_publisher(self._pub)
        if getattr(self.node, self.ATTR, None) is self:
            delattr(self.node, self.ATTR)


def diagnostics_for(node: Node) -> DiagnosticsPublisher:
    """The node's DiagnosticsPublisher, made on first use: one publisher and one timer per node, however many
    helpers add producers to it."""
    d = getattr(node, DiagnosticsPublisher.ATTR, None)
    if d is None:
        d = DiagnosticsPublisher(node)
        setattr(node, DiagnosticsPublisher.ATTR, d)
    return d
