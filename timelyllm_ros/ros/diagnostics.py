"""``/diagnostics`` (diagnostic_msgs/DiagnosticArray) for fleet operators: planner and executor health.

One :class:`DiagnosticsPublisher` per node publishes, every ``diagnostics_period_s`` seconds (parameter,
default 1.0, read at start; 0 turns it off), one DiagnosticArray on the absolute topic ``/diagnostics`` (the ROS
convention; ``rqt_runtime_monitor`` and ``diagnostic_aggregator`` read it) with the statuses of its producers.
Levels are OK / WARN / ERROR; STALE where a status has no data to judge (e.g. an engine not built yet). Status
names are ``<node>: <what>`` (the node's fully qualified name without the leading ``/``), values are KeyValue
strings. Every threshold is a node parameter with a description and a range, read at each publication, so
``ros2 param set`` applies at once.

Planner (:func:`attach_planner_diagnostics`), five statuses:

``planner: engine``
    backend, model, batch (running / max_batch), waiting, tokens/s, step time, KV cache usage, restarts.
    ERROR while the engine is down (its loop crashed; goals are refused until the restart), when its stats
    cannot be read or its thread is gone; WARN when it restarted within ``diagnostics_window_s``.
``planner: queue``
    generations waiting for the engine (``queue_length``), suspended ones (waiting for their robot), running,
    active tasks, policy. WARN above ``diagnostics_queue_warn``, ERROR above ``diagnostics_queue_error``.
``planner: deadlines``
    results on ``/plan_results`` within the last ``diagnostics_window_s`` (default 60 s). A result *missed its
    deadline* when it did not end DONE (OVERDUE, FAILED, ROBOT_FAILED, ...), or ended DONE with its first
    segment later than its TUF's ERT (response time from arrival > ert, the ERT taken from its request on
    ``/plan_requests``; a task whose request this node did not see, e.g. one restored from the journal, is judged
    by its status alone). CANCELLED results are not counted (the robot's choice). A revised result (a robot failed
    after DONE) replaces the task's earlier entry. miss_rate = missed / counted: WARN above
    ``diagnostics_miss_rate_warn``, ERROR above ``diagnostics_miss_rate_error``.
``planner: journal``
    off (no ``state_dir``), open (file and size) or closed (ERROR while serving).
``planner: robot messages``
    acks, heartbeats and reports refused (for another robot's task, a segment never sent, a stamp beyond
    ``max_clock_skew_s``), per kind. WARN while any were refused within ``diagnostics_window_s``.

Executors (:func:`attach_executor_diagnostics`, called by
:class:`~timelyllm_ros.ros.executor_base.RobotExecutorNode`): one status per robot, ``hardware_id`` = robot id:
link to the robot and last contact age (ERROR when down or silent beyond ``diagnostics_link_error_s``, WARN beyond
``diagnostics_link_warn_s``), battery where the backend reports one (WARN at or below
``diagnostics_battery_warn_pct``, ERROR at or below ``diagnostics_battery_error_pct``), state (idle / executing
task and segment / waiting for the next segment), emergency stop (ERROR while active).

Memory is bounded: the rolling window is a deque with a maximum length, the ERT lookup an LRU of fixed size.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from rclpy.node import Node

from timelyllm_ros.engines.pool import PoolStats
from timelyllm_ros.ros.diagnostic_status import (
    DIAGNOSTICS_QOS,
    DIAGNOSTICS_TOPIC,
    ERROR,
    LEVEL_NAMES,
    OK,
    STALE,
    WARN,
    DiagnosticsPublisher,
    Status,
    declare_threshold,
    diagnostics_for,
    level_name,
)

WINDOW_MAX_RESULTS = 100_000  # results kept in the rolling window at most (a burst beyond: the newest ones)
ERT_CACHE_MAX = 20_000  # accepted requests whose ERT is remembered until their result arrives


def add_pool_members(st: Status, stats: PoolStats) -> Status:
    """An engine pool's members as ``member_<i>_*`` values (EngineState has one engine's fields only); WARN while
    a member is down, ERROR while none is up (every task then fails)."""
    for m in stats.members:
        pre = f"member_{m.index}"
        st.add(f"{pre}_name", m.name).add(f"{pre}_state", "up" if m.up else "down")
        if m.up:
            st.add(f"{pre}_running", m.owned).add(f"{pre}_max_batch", m.max_batch)
            st.add(f"{pre}_step_time_s", float(m.step_time_s) if m.step_time_s is not None else float("nan"))
            if m.est_time_per_token_s is not None:  # what the scheduler plans with for this member
                st.add(f"{pre}_est_time_per_token_s", float(m.est_time_per_token_s))
        else:
            st.add(f"{pre}_down_reason", m.down_reason)
        st.add(f"{pre}_failovers", m.failovers).add(f"{pre}_rejoins", m.rejoins)
    st.add("pool_failovers", stats.failovers).add("pool_failed_unplaced", stats.failed_unplaced)
    down = [m.name for m in stats.members if not m.up]
    if not stats.members_up:
        st.raise_to(ERROR, f"engine pool: no member is up ({'; '.join(down)}): tasks fail until one rejoins")
    elif down:
        st.raise_to(WARN, f"engine pool: {len(down)} of {len(stats.members)} members down ({', '.join(down)})")
    return st


# -- rolling window ------------------------------------------------------------------------------------------------

class RollingOutcomes:
    """Outcomes (kind per key) of the last ``window_s`` seconds. Bounded: at most ``maxlen`` entries (beyond, the
    oldest go first); a key seen again (a revised result) replaces its entry's kind instead of counting twice."""

    def __init__(self, maxlen: int = WINDOW_MAX_RESULTS) -> None:
        self._q: deque[list] = deque(maxlen=maxlen)  # [time, key, kind], oldest first
        self._by_key: dict[str, list] = {}
        self._lock = threading.Lock()

    def add(self, key: str, kind: str, now: float) -> None:
        with self._lock:
            entry = self._by_key.get(key)
            if entry is not None:
                entry[2] = kind
                return
            if len(self._q) == self._q.maxlen:
                old = self._q[0]
                if self._by_key.get(old[1]) is old:
                    del self._by_key[old[1]]
            entry = [now, key, kind]
            self._q.append(entry)
            self._by_key[key] = entry

    def counts(self, window_s: float, now: float) -> dict[str, int]:
        with self._lock:
            while self._q and self._q[0][0] < now - window_s:
                old = self._q.popleft()
                if self._by_key.get(old[1]) is old:
                    del self._by_key[old[1]]
            out: dict[str, int] = {}
            for _, _, kind in self._q:
                out[kind] = out.get(kind, 0) + 1
            return out

    def __len__(self) -> int:
        return len(self._q)


class _Events:
    """Times of events (restarts, journal failures) of the last window: a bounded deque."""

    def __init__(self, maxlen: int = 1000) -> None:
        self.times: deque[float] = deque(maxlen=maxlen)
        self.seen = 0

    def note_count(self, count: int, now: float) -> None:
        """The counter ``count`` went up since the last call: one event per increment, at ``now``."""
        for _ in range(min(max(0, count - self.seen), self.times.maxlen)):
            self.times.append(now)
        self.seen = max(self.seen, count)

    def within(self, window_s: float, now: float) -> list[float]:
        return [t for t in self.times if t >= now - window_s]


# -- planner ---------------------------------------------------------------------------------------------------------

class PlannerDiagnostics:
    """The planner's statuses (see the module doc), from ``planner.health()`` (a ``planner.service_io.PlannerHealth``):
    the same sources as EngineState / SchedulerState; a planner still being configured (no engine or core yet)
    reports STALE."""

    def __init__(self, planner: Node) -> None:
        from timelyllm_ros.msg import PlanResult, TaskRequest
        from timelyllm_ros.ros import topics

        self.planner = planner
        self.diag = diagnostics_for(planner)
        n = planner
        declare_threshold(n, "diagnostics_window_s", 60.0,
                          "rolling window of the deadline-miss rate and of recent engine restarts, s", 1.0, 86400.0)
        declare_threshold(n, "diagnostics_queue_warn", 50,
                          "/diagnostics WARN when more generations than this wait for the engine", 0, 1_000_000)
        declare_threshold(n, "diagnostics_queue_error", 500,
                          "/diagnostics ERROR when more generations than this wait for the engine", 0, 1_000_000)
        declare_threshold(n, "diagnostics_miss_rate_warn", 0.1,
                          "/diagnostics WARN when the deadline-miss rate over the window is above this", 0.0, 1.0)
        declare_threshold(n, "diagnostics_miss_rate_error", 0.5,
                          "/diagnostics ERROR when the deadline-miss rate over the window is above this", 0.0, 1.0)
        self.outcomes = RollingOutcomes()
        self._erts: OrderedDict[str, float] = OrderedDict()  # task id -> ERT of its accepted request (LRU)
        self._ert_lock = threading.Lock()
        self._restarts = _Events()
        self._restarts.seen = planner.health().engine_restarts
        self._journal_failures = _Events()
        self._journal_failures.seen = planner.health().journal_errors
        self.host = socket.gethostname()
        self._status_codes()
        # Volatile readers of the planner's own topics: the transient-local history of /plan_results (results
        # from before this reader existed) must not count as results of the last minute.
        self._subs = [
            n.create_subscription(TaskRequest, topics.in_fleet(topics.PLAN_REQUESTS), self._on_request, topics.DEEP,
                                  callback_group=self.diag.group),
            n.create_subscription(PlanResult, topics.in_fleet(topics.PLAN_RESULTS), self._on_result, topics.DEEP,
                                  callback_group=self.diag.group),
        ]
        self._rejections = _Events()
        for what, fn in (("engine", self.engine_status), ("queue", self.queue_status),
                         ("deadlines", self.deadline_status), ("journal", self.journal_status),
                         ("robot messages", self.robot_messages_status)):
            self.diag.add(fn, what)

    def _status_codes(self) -> None:
        from timelyllm_ros.ros.convert import outcome_kind

        self._outcome_kind = outcome_kind  # the status mapping lives in convert.py, with the others

    # -- inputs (subscription callbacks) -------------------------------------------------------------------
    def _on_request(self, msg) -> None:
        if not msg.accepted or not msg.task_id:
            return
        from timelyllm_ros.ros.convert import tuf_from_msg

        try:
            ert = tuf_from_msg(msg.tuf).ert
        except ValueError:
            return
        with self._ert_lock:
            self._erts[msg.task_id] = ert
            self._erts.move_to_end(msg.task_id)
            while len(self._erts) > ERT_CACHE_MAX:
                self._erts.popitem(last=False)

    def _on_result(self, msg) -> None:
        with self._ert_lock:
            ert = self._erts.pop(msg.task_id, None)
            if ert is not None:  # a revision of this result may still come: keep the ERT (LRU-bounded)
                self._erts[msg.task_id] = ert
        self.outcomes.add(msg.task_id, self._outcome_kind(msg, ert), time.monotonic())

    # -- statuses ------------------------------------------------------------------------------------------
    def engine_status(self) -> Status:
        h, now = self.planner.health(), time.monotonic()
        window = float(self.diag.value("diagnostics_window_s"))
        st = Status(self.diag.name("engine"), self.host)
        restarts = h.engine_restarts
        self._restarts.note_count(restarts, now)
        st.add("restarts", restarts)
        lifecycle = h.lifecycle_state
        if lifecycle is not None:
            st.add("lifecycle_state", lifecycle)
        engine = h.engine
        if engine is None:
            return st.raise_to(STALE, f"no engine (planner {lifecycle or 'not configured'})")
        error = h.engine_error
        try:
            info, stats = engine.info, engine.stats()
        except Exception as e:  # noqa: BLE001 - a broken engine must show as one
            st.add("state", "down")
            return st.raise_to(ERROR, f"engine stats unavailable: {e!r}")
        st.add("backend", info.name).add("model", info.model)
        if info.dtype:  # what the engine computes in and why (a CPU without native bf16 runs float32)
            st.add("dtype", info.dtype).add("dtype_reason", info.dtype_reason)
        st.add("speculative", info.speculative or "off")
        st.add("batch", stats.running).add("max_batch", stats.max_batch).add("waiting", stats.waiting)
        st.add("tokens_per_s", float(stats.tokens_per_s)).add("step_time_s", float(stats.step_time_s))
        st.add("kv_cache_usage", float(stats.kv_cache_usage))
        if isinstance(stats, PoolStats):
            add_pool_members(st, stats)
        if h.core is not None:  # what admission believes a step costs, and where that belief started
            for k, v in h.core.estimator.describe().items():
                st.add(f"latency_{k}", v)
            cal = h.core.calibration  # what the warm-up measured on this engine (planner/warmup.py)
            for k, v in (cal.describe().items() if cal is not None else ()):
                st.add(f"measured_{k}", float(v))
        stopping = h.stopping
        if error is not None:
            st.add("state", "down").add("error", error)
            st.raise_to(ERROR, f"engine down, restarting ({error}); goals are refused meanwhile")
        elif h.engine_thread_alive is False and not stopping:
            st.add("state", "down")
            st.raise_to(ERROR, "engine thread not running")
        else:
            st.add("state", "stopping" if stopping else "serving")
        if lifecycle is not None and lifecycle != "active" and not stopping:
            st.raise_to(WARN, f"planner {lifecycle}: goals are refused")
        recent = self._restarts.within(window, now)
        if recent:
            st.raise_to(WARN, f"engine restarted {len(recent)}x in the last {window:g} s "
                              f"(latest {now - recent[-1]:.0f} s ago)")
        st.summary = (f"{info.name} serving: batch {stats.running}/{stats.max_batch}, "
                      f"{float(stats.tokens_per_s):.1f} tokens/s")
        return st

    def queue_status(self) -> Status:
        st = Status(self.diag.name("queue"), self.host)
        core = self.planner.health().core
        if core is None:
            return st.raise_to(STALE, "no scheduler core (planner not configured)")
        snap = core.snapshot()
        q = int(snap["queued"])
        st.add("queue_length", q).add("suspended", snap["suspended"]).add("running", snap["running"])
        st.add("tasks_active", snap["tasks"]).add("results_kept", snap["done"])
        st.add("policy", snap["policy"]).add("admission", snap["admission"])
        warn, err = int(self.diag.value("diagnostics_queue_warn")), int(self.diag.value("diagnostics_queue_error"))
        st.add("queue_warn", warn).add("queue_error", err)
        if q > err:
            st.raise_to(ERROR, f"{q} generations wait for the engine (> diagnostics_queue_error={err})")
        elif q > warn:
            st.raise_to(WARN, f"{q} generations wait for the engine (> diagnostics_queue_warn={warn})")
        st.summary = f"{q} waiting for the engine, {snap['running']} running, {snap['suspended']} suspended"
        return st

    def deadline_status(self) -> Status:
        window = float(self.diag.value("diagnostics_window_s"))
        c = self.outcomes.counts(window, time.monotonic())
        counted = sum(v for k, v in c.items() if k != "cancelled")
        missed = counted - c.get("on_time", 0)
        rate = missed / counted if counted else 0.0
        st = Status(self.diag.name("deadlines"), self.host)
        st.add("window_s", window).add("results", counted).add("missed", missed).add("miss_rate", rate)
        for kind in ("on_time", "late", "overdue", "failed", "robot_failed", "cancelled"):
            st.add(kind, c.get(kind, 0))
        for kind in ("rejected", "busy"):
            if c.get(kind):
                st.add(kind, c[kind])
        st.add("definition", "missed: not DONE (cancelled not counted), or DONE with the first segment later than "
                             "the TUF's ERT (response time from arrival > ert)")
        warn, err = float(self.diag.value("diagnostics_miss_rate_warn")), float(
            self.diag.value("diagnostics_miss_rate_error"))
        what = f"{missed} of {counted} results in the last {window:g} s missed their deadline ({rate:.0%})"
        if counted and rate > err:
            st.raise_to(ERROR, f"{what} > diagnostics_miss_rate_error={err:g}")
        elif counted and rate > warn:
            st.raise_to(WARN, f"{what} > diagnostics_miss_rate_warn={warn:g}")
        st.summary = what if counted else f"no results in the last {window:g} s"
        return st

    def journal_status(self) -> Status:
        h, now = self.planner.health(), time.monotonic()
        st = Status(self.diag.name("journal"), self.host)
        if h.journal_file is None and h.core is None:
            return st.raise_to(STALE, "planner not configured (the journal opens at configure)")
        if h.journal_file is None:
            st.add("state", "off")
            st.summary = "no journal (state_dir not set): unfinished tasks are lost on a restart"
            return st
        path = h.journal_file
        st.add("file", path)
        closed = not h.journal_open
        st.add("state", "closed" if closed else "open")
        size = 0
        for f in (path, f"{path}-wal"):
            try:
                size += os.path.getsize(f)
            except OSError:
                pass
        st.add("size_bytes", size)
        if closed and not h.stopping:
            st.raise_to(ERROR, "journal closed while the planner serves: nothing is recorded")
        self._journal_failures.note_count(h.journal_errors, now)
        st.add("write_failures", h.journal_errors)
        window = float(self.diag.value("diagnostics_window_s"))
        recent = self._journal_failures.within(window, now)
        if recent:
            st.raise_to(ERROR, f"{len(recent)} journal writes failed in the last {window:g} s")
        st.summary = f"open: {path} ({size} bytes)"
        return st

    def robot_messages_status(self) -> Status:
        """Acks, heartbeats and reports the planner refused (another robot's task, a segment never sent, a stamp
        far from its clock): WARN while any arrived within the window, a sign of a misconfigured or rogue node."""
        h, now = self.planner.health(), time.monotonic()
        st = Status(self.diag.name("robot messages"), self.host)
        counts = h.rejected_messages or {}
        total = sum(counts.values())
        st.add("refused", total)
        for kind, n in sorted(counts.items()):
            st.add(f"refused_{kind}", n)
        self._rejections.note_count(total, now)
        window = float(self.diag.value("diagnostics_window_s"))
        recent = self._rejections.within(window, now)
        if recent:
            st.raise_to(WARN, f"{len(recent)} robot messages refused in the last {window:g} s (see the log)")
        else:
            st.summary = f"{total} refused so far"
        return st

    def destroy(self) -> None:
        for s in self._subs:
            self.planner.destroy_subscription(s)
        self._subs = []


def attach_planner_diagnostics(planner: Node) -> PlannerDiagnostics:
    """Publish the planner's statuses on /diagnostics (module doc). Call once the planner node has its engine and
    core; a second call returns the first handle (one publisher, one timer per node)."""
    # Kept on the node itself, as its ``diagnostics``: a map from nodes to handles (which hold their node) would keep
    # every planner alive, and one that is not destroyed explicitly would stay on the graph.
    h = getattr(planner, "diagnostics", None)
    if not isinstance(h, PlannerDiagnostics):
        h = planner.diagnostics = PlannerDiagnostics(planner)
    return h


# -- executors -------------------------------------------------------------------------------------------------------

@dataclass
class RobotLink:
    """What a backend knows of its link to the robot (:meth:`RobotExecutorNode.robot_link`).

    ``connected``: True, False (down: ERROR), or None (not connected yet / not applicable: OK, ``detail`` says
    why); ``contact_age_s``: seconds since the robot was last heard (thresholded while connected), None when the
    backend cannot tell; ``battery_pct``: None where the robot reports none."""

    connected: bool | None
    detail: str = ""
    contact_age_s: float | None = None
    battery_pct: float | None = None


@dataclass
class ExecutorState:
    """The executor's own state, read under its lock."""

    estopped: bool
    task: str | None  # the task whose segments are accepted now, while it is open
    running: tuple[str, int] | None  # (task, segment) executing now
    queued: int  # released segments waiting to run
    held: int  # early segments held for their gap
    last: tuple[str, int, bool, str] | None  # the latest report: (task, segment, ok, error)
    refused_segments: int = 0  # segments written by another node than the planner it serves, so far
    refused_recent: int = 0  # ... of which in the last minute


def executor_status(node: Any, state: ExecutorState, link: RobotLink | None) -> Status:
    """An executor's status: link, battery, state, emergency stop (module doc)."""
    diag = diagnostics_for(node)
    rid = node.robot_id
    st = Status(diag.name("robot"), rid)
    if state.estopped:
        st.add("emergency_stop", "active")
        st.raise_to(ERROR, f"emergency stop active: segments are refused (call /{rid}/reset_emergency)")
    else:
        st.add("emergency_stop", "clear")
    if state.running is not None:
        st.add("state", "executing").add("task", state.running[0]).add("segment", state.running[1])
        doing = f"executing {state.running[0]}[{state.running[1]}]"
    elif state.task is not None:
        st.add("state", "waiting for the next segment").add("task", state.task)
        doing = f"waiting for the next segment of {state.task}"
    else:
        st.add("state", "idle")
        doing = "idle"
    st.add("queued_segments", state.queued).add("held_segments", state.held)
    st.add("segments_from_other_nodes", state.refused_segments)
    if state.refused_recent:
        st.raise_to(WARN, f"{state.refused_recent} segments refused in the last minute: from nodes other than the "
                          "planner, or without the fleet key's tag (a rogue or misnamed node: see the log)")
    if state.last is not None:
        t, i, ok, err = state.last
        st.add("last_segment", f"{t}[{i}] " + ("succeeded" if ok else f"failed: {err}"))
    if link is None:
        st.add("link", "unknown (the backend reports none)")
    else:
        st.add("link", "up" if link.connected else "down" if link.connected is False else "not connected")
        if link.detail:
            st.add("link_detail", link.detail)
        if link.connected is False:
            st.raise_to(ERROR, f"link down: {link.detail or 'robot unreachable'}")
        if link.contact_age_s is not None:
            age = float(link.contact_age_s)
            st.add("last_contact_age_s", age)
            warn, err = float(diag.value("diagnostics_link_warn_s")), float(diag.value("diagnostics_link_error_s"))
            if link.connected and age > err:
                st.raise_to(ERROR, f"robot silent for {age:.1f} s (> diagnostics_link_error_s={err:g})")
            elif link.connected and age > warn:
                st.raise_to(WARN, f"robot silent for {age:.1f} s (> diagnostics_link_warn_s={warn:g})")
        if link.battery_pct is not None:
            bat = float(link.battery_pct)
            st.add("battery_pct", bat)
            warn, err = (float(diag.value("diagnostics_battery_warn_pct")),
                         float(diag.value("diagnostics_battery_error_pct")))
            if bat <= err:
                st.raise_to(ERROR, f"battery {bat:g} % (<= diagnostics_battery_error_pct={err:g})")
            elif bat <= warn:
                st.raise_to(WARN, f"battery {bat:g} % (<= diagnostics_battery_warn_pct={warn:g})")
    st.summary = doing + (f", {link.detail}" if link is not None and link.detail else "")
    return st


def attach_executor_diagnostics(node: Any) -> DiagnosticsPublisher:
    """Publish ``node.diagnostic_status()`` on /diagnostics (a RobotExecutorNode; its subclasses extend the
    method or :meth:`RobotExecutorNode.robot_link`). Declares the link and battery thresholds."""
    declare_threshold(node, "diagnostics_link_warn_s", 2.0,
                      "/diagnostics WARN when the connected robot was silent longer than this, s", 0.0, 3600.0)
    declare_threshold(node, "diagnostics_link_error_s", 5.0,
                      "/diagnostics ERROR when the connected robot was silent longer than this, s", 0.0, 3600.0)
    declare_threshold(node, "diagnostics_battery_warn_pct", 30.0,
                      "/diagnostics WARN at or below this battery level, % (robots that report one)", 0.0, 100.0)
    declare_threshold(node, "diagnostics_battery_error_pct", 15.0,
                      "/diagnostics ERROR at or below this battery level, % (robots that report one)", 0.0, 100.0)
    diag = diagnostics_for(node)
    diag.add(node.diagnostic_status, "robot")
    return diag


__all__ = [
    "DIAGNOSTICS_QOS",
    "DIAGNOSTICS_TOPIC",
    "ERROR",
    "LEVEL_NAMES",
    "OK",
    "STALE",
    "WARN",
    "DiagnosticsPublisher",
    "ExecutorState",
    "PlannerDiagnostics",
    "RobotLink",
    "RollingOutcomes",
    "Status",
    "attach_executor_diagnostics",
    "attach_planner_diagnostics",
    "declare_threshold",
    "diagnostics_for",
    "executor_status",
    "level_name",
]
