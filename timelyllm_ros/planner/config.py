"""The planner core's settings (:class:`CoreConfig`), validated where they are made."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from timelyllm_ros.planner.lengths import LENGTH_MODELS


@dataclass
class CoreConfig:
    """The core's settings, read when a PlannerCore is built (its parts keep what they need): set them before."""

    comm_s: float = 0.008  # one network hop (paper's LAN)
    slack_floor_s: float = 0.001
    resume_lead_s: float = 0.05
    overdue: str = "serve"  # "serve": keep serving (PUD puts it last) | "reject": answer with a rejection
    segment_tokens_prior: dict[str, float] = field(
        default_factory=lambda: {"drone": 6.0, "arm": 12.0, "chatbot": 15.0})
    # How many tokens the next segment takes (G = tokens x step time, in ranking, resume timing and admission):
    # "learned" (per task, with an uncertainty; urgent tasks plan with length_quantile_urgent) or "ewma" (one
    # running mean per robot type): lengths.SegmentLengths.
    length_model: str = "learned"
    length_quantile_urgent: float = 0.9
    length_urgent_beta: float = 1.5
    length_max_keys: int = 1024  # memory bound of the learned model: keys kept (LRU), ~2.5 kB each
    prefill_tokens_default: int = 64  # prefill estimate when a prompt is not tokenized yet
    # Tokens per KV block: a resubmission recomputes what its last full block leaves. None: the engine's own
    # (EngineInfo.kv_block_tokens: 16 in the simulator, the vLLM build's block size, e.g. 32 on CPU), else 16.
    kv_block_tokens: int | None = None
    learn_exec_times: bool = True  # feed robot reports into the exec-time model
    record_decisions: bool = True
    # Finished results are kept this long / at most this many (then the task id can be used again).
    keep_results_s: float = 600.0
    keep_results_max: int = 10_000
    # A robot that has not reported a dispatched segment by its predicted end + this margin has failed
    # (None: trust predictions forever, as the simulator does).
    robot_timeout_s: float | None = None
    # Latency-guided admission's prefill budget per step (LatencyGuided.prefill_step_s), for an admission the core
    # builds from a name ('auto', 'latency'). None: off (the default, as it costs under load; see admission.py).
    prefill_step_s: float | None = None
    # An idle engine waits up to this long after a goal arrives for the other goals of its burst (robots that saw
    # the same event send within milliseconds of each other), but only while no goal waiting would lose utility by
    # it: ranked together, the urgent ones go first instead of behind the prefill of whichever came first (on a
    # CPU a normal prompt's prefill step holds the engine ~150 ms). 0: off, here (the simulator's bursts arrive in
    # one instant); the planner node's ``gather_ms`` parameter sets it (10 ms by default).
    gather_s: float = 0.0

    def __post_init__(self) -> None:
        if self.overdue not in ("serve", "reject"):
            raise ValueError(f"CoreConfig.overdue must be 'serve' or 'reject', got {self.overdue!r}")
        for name in ("comm_s", "resume_lead_s", "gather_s"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"CoreConfig.{name} must be a finite number >= 0")
        if not (self.slack_floor_s > 0 and math.isfinite(self.slack_floor_s)):
            raise ValueError("CoreConfig.slack_floor_s must be > 0")
        if self.length_model not in LENGTH_MODELS:
            raise ValueError(f"CoreConfig.length_model must be one of {LENGTH_MODELS}, got {self.length_model!r}")
        if not 0.0 < self.length_quantile_urgent < 1.0:
            raise ValueError("CoreConfig.length_quantile_urgent must be in (0, 1)")
        if self.length_max_keys < 3:
            raise ValueError("CoreConfig.length_max_keys must be >= 3")
        if self.kv_block_tokens is not None and self.kv_block_tokens < 1:
            raise ValueError("CoreConfig.kv_block_tokens must be >= 1 (or None: the engine's)")
        if self.prefill_step_s is not None and not (math.isfinite(self.prefill_step_s) and self.prefill_step_s > 0):
            raise ValueError(f"CoreConfig.prefill_step_s must be a finite number > 0 (or None: off), "
                             f"got {self.prefill_step_s!r}")
