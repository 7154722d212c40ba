"""Every setting of the planner, declared once: name, default, range, description and where it applies.

From this one table come the planner node's ROS parameters (``ros/params.declare_setting``, read-only, each with
its range and :meth:`Setting.problem` as its check) and the core's :class:`~timelyllm_ros.planner.config.CoreConfig`
(its fields and their check). A value is judged by the same :meth:`Setting.problem` wherever it enters: at the
parameter's declaration, by :func:`check_params` before the service configures, and by ``CoreConfig``. A setting
is never declared anywhere else (``test_settings.py``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from timelyllm_ros.interfaces import robot_id_problem
from timelyllm_ros.planner.lengths import LENGTH_MODELS

Applies = Literal["core", "service", "node"]
_UNSET: Any = object()


@dataclass(frozen=True)
class Setting:
    """One setting. ``applies``: who reads it, ``"core"`` (a :class:`CoreConfig` field), ``"service"``
    (PlannerService) or ``"node"`` (the ROS nodes). ``param``: also a ROS parameter of the planner node (False:
    the core's only, set by the simulator and the benchmarks). ``core_default``: the default of a core built
    without the node (simulator, tests), where it differs from the node's. ``min``/``max``: inclusive bounds,
    ``above``/``below``: exclusive ones; ``choices``: the values allowed; ``check``: value -> why it is refused,
    for what a range cannot say. A ``None`` default also allows ``None`` (``kind``: the type of other values)."""

    name: str
    default: Any
    description: str
    applies: Applies = "service"
    min: float | None = None
    max: float | None = None
    above: float | None = None
    below: float | None = None
    choices: tuple[Any, ...] = ()
    check: Callable[[Any], str | None] | None = None
    param: bool = True
    core_default: Any = _UNSET
    kind: type | None = None

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is refused, None if it is not: the one rule for this setting."""
        if value is None and self.default is None:
            return None
        if self.choices and value not in self.choices:
            shown = value if not isinstance(value, str) or len(value) <= 60 else value[:60] + "..."
            return f"must be one of {list(self.choices)}, got {shown!r}"
        if (self.min, self.max, self.above, self.below) != (None, None, None, None):
            if isinstance(value, float) and not math.isfinite(value):
                return f"must be a finite number, got {value}"
            if self.min is not None and value < self.min:
                return f"must be >= {self.min:g}, got {value}"
            if self.above is not None and not value > self.above:
                return f"must be > {self.above:g}, got {value}"
            if self.max is not None and value > self.max:
                return f"must be <= {self.max:g}, got {value}"
            if self.below is not None and not value < self.below:
                return f"must be < {self.below:g}, got {value}"
        return self.check(value) if self.check is not None else None

    @property
    def constraints(self) -> str:
        """What :meth:`problem` wants beyond the range (``ros2 param describe``)."""
        return f"one of {list(self.choices)}" if self.choices else ""

    def fresh_default(self, *, core: bool = False) -> Any:
        """The default (a copy: lists and dicts are not shared); ``core``: a core's without the node."""
        value = self.core_default if core and self.core_default is not _UNSET else self.default
        return copy.deepcopy(value)

    @property
    def annotation(self) -> str:
        if self.default is None:
            return f"{self.kind.__name__ if self.kind else 'Any'} | None"
        return type(self.default).__name__


def _robot_ids(ids: list[str]) -> str | None:
    # a typo here would refuse that robot's every goal, so say it at start
    return next((why for r in ids if r and (why := robot_id_problem(r)) is not None), None)


_BIG = 1e9
# The planner node reads every parameter once (at construction or configure): a set at run time is refused with a
# reason instead of silently doing nothing. Where the ROS parameter and the core once disagreed, the stricter rule
# holds (e.g. slack_floor_s > 0: a floor of 0 would divide by zero in the ranking).
SETTINGS: tuple[Setting, ...] = (
    Setting("engine_config", "engine_vllm_cpu.yaml",
            "engine YAML (file name in config/ or a path); loaded at configure"),
    Setting("admission", "auto", "'auto' (latency-guided for segmented policies, vLLM's cap of 256 for the fcfs "
            "baselines), 'latency' (latency-guided), 'adaptive-tuf' (latency-guided, weighing the TUFs of "
            "simultaneous first segments: opt-in, see planner/admission.py) or a fixed batch cap"),
    Setting("prefill_step_ms", 0.0, "latency-guided admission: the prefill one step may carry, ms of estimated "
            "prefill, so a step in flight delays an urgent goal less (0 = off, the default: it costs throughput "
            "under load)", "core", min=0.0, max=10_000.0),
    Setting("overdue", "serve", "'serve' overdue tasks last (PUD puts them last), or 'reject' them", "core",
            choices=("serve", "reject")),
    Setting("comm_s", 0.008, "one network hop, s", "core", min=0.0, max=10.0),
    Setting("slack_floor_s", 0.001, "smallest slack a generation is ranked by, s", "core", above=0.0, max=10.0),
    Setting("resume_lead_s", 0.05, "resume a suspended generation this long before its robot is predicted idle, s",
            "core", min=0.0, max=60.0),
    Setting("state_period_s", 0.5, "EngineState (planner) and SchedulerState (scheduler) period, s", "node",
            min=0.01, max=3600.0),
    Setting("robot_types", ["drone", "arm", "chatbot"], "robot types served (skill sets)"),
    Setting("max_task_chars", 2000, "task text limit in characters", min=1, max=10**7),
    Setting("max_task_tokens", 1024, "task text limit in tokens of the engine's tokenizer", min=1, max=10**7),
    Setting("warm_up", True, "prefill each robot type's shared prompt at configure", "node"),
    Setting("calibrate", True, "after the warm-up, measure this engine (decode per batch size, prefill behind the "
            "cached examples, a lone first segment) and start the scheduler's step-time estimate from that "
            "(/engine_state, /diagnostics) instead of the engine config's step model"),
    # The simulator's bursts arrive in one instant: a core without the node does not wait for them.
    Setting("gather_ms", 10.0, "an idle engine waits this long after a goal for the other goals of its burst, while "
            "none of them would lose utility by it, so that they are ranked together (0 = off)", "core",
            min=0.0, max=1000.0, core_default=0.0),
    Setting("max_active_tasks", 5000, "open tasks; goals beyond are refused BUSY, never dropped", min=1, max=10**7),
    Setting("max_oneshot_calls", 8, "concurrent /plan service calls (each holds a thread); more are refused: use "
            "the PlanTask action", "node", min=1, max=1000),
    Setting("keep_results_s", 600.0, "finished results kept this long (then the id is free)", "core",
            min=0.001, max=_BIG),
    Setting("keep_results_max", 10000, "at most this many finished results kept", "core", min=1, max=10**8),
    Setting("action_result_timeout_s", 60, "rclpy keeps an action result this long, s", "node", min=1, max=10**7),
    Setting("resend_period_s", 0.2, "first re-send of an unacknowledged segment, s", "node", min=0.001, max=3600.0),
    Setting("resend_max_period_s", 1.0, "re-send backoff cap, s", "node", min=0.001, max=3600.0),
    Setting("delivery_timeout_s", 30.0, "a segment unacknowledged this long fails its task (ROBOT_FAILED), s",
            "node", min=0.001, max=_BIG),
    # The simulator trusts its predictions forever: its robots never fall silent.
    Setting("robot_timeout_s", 10.0, "a robot silent this long fails its task (ROBOT_FAILED): no heartbeat, ack or "
            "report from an executor that sends heartbeats; else past the model's longest time for the segment; "
            "0: never", "core", min=0.0, max=_BIG, core_default=0.0),
    Setting("robot_idle_release_s", 600.0, "a robot sent nothing this long, with no open task, has its segment "
            "publisher and per-robot state released (bounded memory with many robot ids), s; 0: never",
            min=0.0, max=_BIG),
    Setting("max_robots", 1000, "robots this planner serves at once (a segment writer each); a new robot beyond them "
            "frees the least recently used idle one, or is refused BUSY", min=1, max=10**6),
    Setting("robot_ids", [""], "the fleet's robot ids; a goal for any other is refused; [''] = any",
            check=_robot_ids),
    Setting("intake_goals_per_robot_s", 10.0, "goals a robot id may send per second, sustained (a token bucket: "
            "more are refused BUSY, naming the limit); 0 = no limit", min=0.0, max=_BIG),
    Setting("intake_goals_burst_per_robot", 50, "goals a robot id may send at once", min=1, max=10**7),
    Setting("intake_new_robots_per_s", 5.0, "goals per second, sustained, from robot ids that are new to this "
            "planner (all of them together: a flood of made-up ids): no link held for it, not in robot_ids, and no "
            "reader of its segments on the graph (a robot whose executor runs is not new); 0 = no limit",
            min=0.0, max=_BIG),
    Setting("intake_new_robots_burst", 20, "goals from new robot ids at once", min=1, max=10**7),
    Setting("max_clock_skew_s", 120.0, "a robot message stamped further than this from the planner's clock does "
            "not count as how far behind the planner reads, s", min=0.001, max=_BIG),
    Setting("state_dir", "", "folder of the durable task journal (SQLite WAL); '' = none"),
    Setting("fleet_key_file", "", "file holding the fleet key (at least 16 bytes) that signs every segment and checks "
            "every ack and report (HMAC-SHA256 and a counter against replays; README 'Threat model'); '' = off",
            "node"),
    Setting("journal_reset_damaged", False, "a damaged journal (lost commits, corrupt file) is moved aside and an "
            "empty one started, instead of refused at configure"),
    Setting("engine_restart_backoff_s", 0.5, "first wait before rebuilding a failed engine; doubles up to 30 s",
            min=0.001, max=3600.0),
    Setting("autostart", True, "configure and activate at start-up; false: wait for the lifecycle transitions "
            "(launch files, a lifecycle manager)", "node"),
    Setting("control_plane", "open", "'open': any node on the domain may set the scheduler's policy and drive this "
            "planner's lifecycle (/planner/change_state); 'locked': only this process may (and the parameters at "
            "start); needs autostart (README 'Threat model')", "node", choices=("open", "locked")),
    Setting("drain_timeout_s", 30.0, "deactivate lets open tasks finish this long, then ends them CANCELLED, s",
            "node", min=0.0, max=_BIG),
    # The core's own: no ROS parameter (the simulator and the benchmarks set them).
    Setting("segment_tokens_prior", {"drone": 6.0, "arm": 12.0, "chatbot": 15.0}, "tokens of a robot type's "
            "segment before any is seen (the length models' prior)", "core", param=False),
    Setting("length_model", "learned", "how many tokens the next segment takes (G = tokens x step time, in ranking, "
            "resume timing and admission): 'learned' (per task, with an uncertainty; urgent tasks plan with "
            "length_quantile_urgent) or 'ewma' (one running mean per robot type): lengths.SegmentLengths", "core",
            choices=LENGTH_MODELS, param=False),
    Setting("length_quantile_urgent", 0.9, "the learned length's quantile an urgent task plans with", "core",
            above=0.0, below=1.0, param=False),
    Setting("length_urgent_beta", 1.5, "a task with a TUF beta at least this is urgent (length_quantile_urgent)",
            "core", param=False),
    Setting("length_max_keys", 1024, "memory bound of the learned length model: keys kept (LRU), ~2.5 kB each",
            "core", min=3, param=False),
    Setting("prefill_tokens_default", 64, "prefill estimate when a prompt is not tokenized yet, tokens", "core",
            param=False),
    Setting("kv_block_tokens", None, "tokens per KV block: a resubmission recomputes what its last full block "
            "leaves; None: the engine's (EngineInfo.kv_block_tokens: 16 in the simulator, the vLLM build's block "
            "size, e.g. 32 on CPU), else 16", "core", min=1, kind=int, param=False),
    Setting("learn_exec_times", True, "feed robot reports into the exec-time model", "core", param=False),
    Setting("record_decisions", True, "keep each scheduling decision's time (PlannerCore.decision_times)", "core",
            param=False),
)
BY_NAME: dict[str, Setting] = {st.name: st for st in SETTINGS}
PARAMETERS: tuple[Setting, ...] = tuple(st for st in SETTINGS if st.param)  # the planner node's


def check_params(p: Mapping[str, Any]) -> None:
    """The planner's parameter values, each by its setting's rule, then what only two together can say;
    ValueError naming the parameter."""
    for st in PARAMETERS:
        if (why := st.problem(p[st.name])) is not None:
            raise ValueError(f"parameter {st.name}: {why}")
    if float(p["resend_max_period_s"]) < float(p["resend_period_s"]):
        raise ValueError(f"parameter resend_max_period_s: must be >= resend_period_s ({p['resend_period_s']}), "
                         f"got {p['resend_max_period_s']}")
    if p["control_plane"] == "locked" and not p["autostart"]:
        raise ValueError("parameter control_plane: 'locked' needs autostart: true (no other node may drive the "
                         "planner's lifecycle, so it must configure and activate itself)")


__all__ = ["BY_NAME", "PARAMETERS", "SETTINGS", "Setting", "check_params"]
