"""The planner's parameters as plain data: name, default, description and range of each, and the checks a range
cannot say. ``ros/planner_node.py`` declares them (``ros/params.declare``); ``planner/service.py`` reads their values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from timelyllm_ros.interfaces import robot_id_problem


class Setting(NamedTuple):
    """One of the planner's parameters: the node declares each, read-only (``ros/params.declare``), with its range
    where one applies; :func:`check_params` adds what a range cannot say."""

    name: str
    default: Any
    description: str
    min: float | None = None
    max: float | None = None


_BIG = 1e9
# Every parameter is read once (at construction or configure): a set at run time is refused with a reason instead
# of silently doing nothing.
SETTINGS: tuple[Setting, ...] = (
    Setting("engine_config", "engine_vllm_cpu.yaml",
            "engine YAML (file name in config/ or a path); loaded at configure"),
    Setting("admission", "auto", "'auto' (latency-guided for segmented policies, vLLM's cap of 256 for the fcfs "
            "baselines), 'latency' (latency-guided), 'adaptive-tuf' (latency-guided, weighing the TUFs of "
            "simultaneous first segments: opt-in, see planner/admission.py) or a fixed batch cap"),
    Setting("prefill_step_ms", 0.0, "latency-guided admission: the prefill one step may carry, ms of estimated "
            "prefill, so a step in flight delays an urgent goal less (0 = off, the default: it costs throughput "
            "under load)", 0.0, 10_000.0),
    Setting("overdue", "serve", "'serve' overdue tasks last, or 'reject' them"),
    Setting("comm_s", 0.008, "one network hop, s", 0.0, 10.0),
    Setting("slack_floor_s", 0.001, "smallest slack a generation is ranked by, s", 0.0, 10.0),
    Setting("resume_lead_s", 0.05, "resume a suspended generation this long before its robot is predicted idle, s",
            0.0, 60.0),
    Setting("state_period_s", 0.5, "EngineState period, s", 0.01, 3600.0),
    Setting("robot_types", ["drone", "arm", "chatbot"], "robot types served (skill sets)"),
    Setting("max_task_chars", 2000, "task text limit in characters", 1, 10**7),
    Setting("max_task_tokens", 1024, "task text limit in tokens of the engine's tokenizer", 1, 10**7),
    Setting("warm_up", True, "prefill each robot type's shared prompt at configure"),
    Setting("calibrate", True, "after the warm-up, measure this engine (decode per batch size, prefill behind the "
            "cached examples, a lone first segment) and start the scheduler's step-time estimate from that "
            "(/engine_state, /diagnostics) instead of the engine config's step model"),
    Setting("gather_ms", 10.0, "an idle engine waits this long after a goal for the other goals of its burst, while "
            "none of them would lose utility by it, so that they are ranked together (0 = off)", 0.0, 1000.0),
    Setting("max_active_tasks", 5000, "open tasks; goals beyond are refused BUSY, never dropped", 1, 10**7),
    Setting("max_oneshot_calls", 8, "concurrent /plan service calls (each holds a thread); more are refused: use "
            "the PlanTask action", 1, 1000),
    Setting("keep_results_s", 600.0, "finished results kept this long (then the id is free)", 0.001, _BIG),
    Setting("keep_results_max", 10000, "at most this many finished results kept", 1, 10**8),
    Setting("action_result_timeout_s", 60, "rclpy keeps an action result this long, s", 1, 10**7),
    Setting("resend_period_s", 0.2, "first re-send of an unacknowledged segment, s", 0.001, 3600.0),
    Setting("resend_max_period_s", 1.0, "re-send backoff cap, s", 0.001, 3600.0),
    Setting("delivery_timeout_s", 30.0, "a segment unacknowledged this long fails its task (ROBOT_FAILED), s",
            0.001, _BIG),
    Setting("robot_timeout_s", 10.0, "a robot silent this long fails its task (ROBOT_FAILED): no heartbeat, ack or "
            "report from an executor that sends heartbeats; else past the model's longest time for the segment; "
            "0: never", 0.0, _BIG),
    Setting("robot_idle_release_s", 600.0, "a robot sent nothing this long, with no open task, has its segment "
            "publisher and per-robot state released (bounded memory with many robot ids), s; 0: never", 0.0, _BIG),
    Setting("max_robots", 1000, "robots this planner serves at once (a segment writer each); a new robot beyond them "
            "frees the least recently used idle one, or is refused BUSY", 1, 10**6),
    Setting("robot_ids", [""], "the fleet's robot ids; a goal for any other is refused; [''] = any"),
    Setting("intake_goals_per_robot_s", 10.0, "goals a robot id may send per second, sustained (a token bucket: "
            "more are refused BUSY, naming the limit); 0 = no limit", 0.0, _BIG),
    Setting("intake_goals_burst_per_robot", 50, "goals a robot id may send at once", 1, 10**7),
    Setting("intake_new_robots_per_s", 5.0, "goals per second, sustained, from robot ids that are new to this "
            "planner (all of them together: a flood of made-up ids): no link held for it, not in robot_ids, and no "
            "reader of its segments on the graph (a robot whose executor runs is not new); 0 = no limit", 0.0, _BIG),
    Setting("intake_new_robots_burst", 20, "goals from new robot ids at once", 1, 10**7),
    Setting("max_clock_skew_s", 120.0, "a robot message stamped further than this from the planner's clock does "
            "not count as how far behind the planner reads, s", 0.001, _BIG),
    Setting("state_dir", "", "folder of the durable task journal (SQLite WAL); '' = none"),
    Setting("fleet_key_file", "", "file holding the fleet key (at least 16 bytes) that signs every segment and checks "
            "every ack and report (HMAC-SHA256 and a counter against replays; README 'Threat model'); '' = off"),
    Setting("journal_reset_damaged", False, "a damaged journal (lost commits, corrupt file) is moved aside and an "
            "empty one started, instead of refused at configure"),
    Setting("engine_restart_backoff_s", 0.5, "first wait before rebuilding a failed engine; doubles up to 30 s",
            0.001, 3600.0),
    Setting("autostart", True, "configure and activate at start-up; false: wait for the lifecycle transitions "
            "(launch files, a lifecycle manager)"),
    Setting("control_plane", "open", "'open': any node on the domain may set the scheduler's policy and drive this "
            "planner's lifecycle (/planner/change_state); 'locked': only this process may (and the parameters at "
            "start); needs autostart (README 'Threat model')"),
    Setting("drain_timeout_s", 30.0, "deactivate lets open tasks finish this long, then ends them CANCELLED, s",
            0.0, _BIG),
)


def check_params(p: Mapping[str, Any]) -> None:
    """What the parameters' descriptors cannot say; ValueError naming the parameter."""
    for name in ("max_active_tasks", "max_oneshot_calls", "keep_results_max", "max_task_tokens",
                 "max_task_chars", "action_result_timeout_s"):
        if int(p[name]) < 1:
            raise ValueError(f"parameter {name}: must be >= 1, got {p[name]}")
    for name in ("resend_period_s", "delivery_timeout_s", "keep_results_s", "engine_restart_backoff_s"):
        if not float(p[name]) > 0:
            raise ValueError(f"parameter {name}: must be > 0, got {p[name]}")
    if float(p["robot_timeout_s"]) < 0:
        raise ValueError(f"parameter robot_timeout_s: must be >= 0 (0 = never), got {p['robot_timeout_s']}")
    if float(p["resend_max_period_s"]) < float(p["resend_period_s"]):
        raise ValueError(f"parameter resend_max_period_s: must be >= resend_period_s ({p['resend_period_s']}), "
                         f"got {p['resend_max_period_s']}")
    if p["control_plane"] not in ("open", "locked"):
        raise ValueError(f"parameter control_plane: must be 'open' or 'locked', got {p['control_plane']!r}")
    if p["control_plane"] == "locked" and not p["autostart"]:
        raise ValueError("parameter control_plane: 'locked' needs autostart: true (no other node may drive the "
                         "planner's lifecycle, so it must configure and activate itself)")
    for robot_id in p["robot_ids"]:  # a typo here would refuse that robot's every goal, so say it at start
        if robot_id and (why := robot_id_problem(robot_id)) is not None:
            raise ValueError(f"parameter robot_ids: {why}")
    if p["overdue"] not in ("serve", "reject"):
        raise ValueError(f"parameter overdue: must be 'serve' or 'reject', got {p['overdue']!r}")


__all__ = ["SETTINGS", "Setting", "check_params"]
