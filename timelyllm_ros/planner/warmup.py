"""Warming an engine before it serves: the first tasks pay neither for a fresh engine's slow first passes nor
for prefilling a shared prompt, and the core's prefill estimates know what the prefix cache holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from timelyllm_ros.engines.base import EngineRequest

if TYPE_CHECKING:
    from timelyllm_ros.planner.core import PlannerCore


def warm_up(core: PlannerCore, prompts: list[tuple[str, list[int]]],
            burst: list[tuple[str, list[int]]] | None = None, extra: Callable[[str], dict] | None = None) -> int:
    """Throw-away generations on ``core``'s engine: each of ``prompts`` (robot type, prompt ids) alone for one
    token, then ``burst`` together for a few (the backend's first multi-request batch is slow to set up).
    ``extra``: each robot type's request extras (its grammar: the engine's structured-output backend is set up
    here, not in the first task). The engine thread only, before :meth:`PlannerCore.serve_forever` (it steps
    the engine itself); the steps are not fed to the latency estimator. Each prompt is then noted as cached
    (:meth:`PlannerCore.note_warm_prompt`). Returns the engine steps taken."""
    with core.lock:  # one look at the core and its engine
        if core.running_ids() or core.engine.has_work():
            raise RuntimeError("warm_up: the engine is already serving")
    steps = 0
    waves = [[(f"warmup-{rt}-{i}", rt, ids, 1, True)] for i, (rt, ids) in enumerate(prompts)]
    waves.append([(f"warmup-burst-{i}", rt, ids, 4, False) for i, (rt, ids) in enumerate(burst or [])])
    for engine in core.engine.warm_up_targets():  # a pool: each member (each has its own prefix cache)
        for wave in waves:
            for gid, rt, ids, n, suspend in wave:
                engine.add(EngineRequest(gid, list(ids), core.hooks.stop_checker(rt), max_new_tokens=n,
                                         suspend_at_boundary=suspend, extra=dict(extra(rt)) if extra else {}))
            while engine.has_work():
                engine.step()
                steps += 1
    for rt, ids in prompts:
        core.note_warm_prompt(rt, ids)
    return steps
