"""Read-only views of a running PlannerCore for telemetry (SchedulerState, diagnostics, the demo), each taken
under the core's lock so that the engine thread's changes never show half done."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from timelyllm_ros.planner.core import PlannerCore


def queue_view(core: PlannerCore, now: float | None = None) -> list[dict]:
    """Queued generations, best first, with their current priority, slack and projected wait."""
    with core.lock:
        now = core.clock.now() if now is None else now
        q, comm = core.queue, core.cfg.comm_s
        per_token = q.context(core.estimator).per_token_s
        cands, pri = q.priorities(core.policy, now, core.estimator)
        out = []
        for p, g in sorted(zip(pri, cands, strict=True), key=lambda x: -x[0]):
            G = g.gen_time(per_token)
            wait = g.wait(now, G, comm) if g.k == 0 else max(0.0, g.wait(now, G, comm))
            out.append({"task_id": g.task_id, "robot_id": g.robot_id, "k": g.k, "priority": p,
                        "slack_s": g.slack(now, G), "waiting_s": wait,
                        "prefill_est_s": g.prefill_est_s if g.k == 0 else 0.0,
                        "next_tokens_est": g.tok_est, "plan_tokens_left_est": g.rem_tok_est})
        return out


def decision_log(core: PlannerCore) -> list[float]:
    """The kept decision times (s), a copy (the engine thread appends)."""
    with core.lock:
        return list(core.decision_times)
