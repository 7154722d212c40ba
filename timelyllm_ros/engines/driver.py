"""Drive generations through an :class:`Engine` to completion (tests, benches, demos).

Suspended generations are resumed at once (or after ``resume_after`` steps),
like a scheduler with one robot per generation whose segments take no time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from timelyllm_ros.engines.base import Engine, EngineRequest, SegmentEvent


def run(engine: Engine, reqs: Iterable[EngineRequest], *, resume_after: int = 0,
        on_step: Callable[[int], None] | None = None, max_steps: int = 100_000,
        on_event: Callable[[SegmentEvent], None] | None = None) -> dict[str, list[SegmentEvent]]:
    """Run all requests to their final event; returns the events per gen_id (``on_event`` sees each as it
    comes, e.g. for a progress bar)."""
    reqs = list(reqs)
    by_id = {r.gen_id: r for r in reqs}
    events: dict[str, list[SegmentEvent]] = {r.gen_id: [] for r in reqs}
    for r in reqs:
        engine.add(r)
    parked: dict[str, int] = {}  # gen_id -> steps left before resume
    steps = 0
    while engine.has_work() or parked:
        for gid in [g for g, n in parked.items() if n <= 0]:
            del parked[gid]
            engine.add(by_id[gid])
        if not engine.has_work():
            parked = {g: n - 1 for g, n in parked.items()}
            continue
        rep = engine.step()
        steps += 1
        if on_step:
            on_step(steps)
        for ev in rep.events:
            events[ev.gen_id].append(ev)
            if on_event:
                on_event(ev)
            if ev.suspended and not ev.final:
                parked[ev.gen_id] = resume_after
            elif ev.final:
                parked.pop(ev.gen_id, None)
        parked = {g: n - 1 for g, n in parked.items()}
        if steps >= max_steps:
            raise RuntimeError(f"run(): no completion after {max_steps} steps")
    return events
