"""Warming an engine before it serves, and learning this machine on it.

Warm-up: the first tasks pay neither for a fresh engine's slow first passes nor for prefilling a shared prompt, and
the core's prefill estimates know what the prefix cache holds.

Calibration: the scheduler's step-time estimate (admission, shedding, ranking) starts from what this engine, as
configured, does on this machine, not from a step model fitted elsewhere: two machines of one kind differ by
1.5x, and a model fitted without speculation or grammar does not describe the engine that has them. It measures,
with the planner's own prompts and grammars, the decode time per generated token at each batch size up to the
engine's, the prefill of a task's own turn behind its cached examples (a fixed cost per prefilling step plus a
cost per token, from two turn lengths), and the first segment of a lone task of each robot type (an emergency
where its examples have one): the figure every result of a run can be set beside.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from timelyllm_ros.engines.base import Engine, EngineRequest, FinishReason

if TYPE_CHECKING:
    from timelyllm_ros.planner.core import PlannerCore
    from timelyllm_ros.planner.service_io import Log

# A calibration request: (robot type, probe number, scene objects, urgent) -> (prompt ids, request extras). The
# probe number makes the task's turn one the prefix cache has never seen; more scene objects, a longer turn.
ProbeMaker = Callable[[str, int, int, bool], tuple[list[int], dict[str, Any]]]

DECODE_BATCHES = (1, 2, 4, 8)  # batch sizes measured (up to the engine's max_batch)
DECODE_STEPS = 6  # pure decode steps timed per batch size
PREFILL_SIZES = (1, 6)  # scene objects of the two turn lengths the prefill fit is taken from
# Of each prefill size and of each lone first segment; the median is kept, so one sample slowed by another
# process (a busy machine) does not set every later estimate: 2 repeats let one outlier move the fit by half.
REPEATS = 3


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


@dataclass
class Calibration:
    """What :func:`calibrate` measured on one engine (seconds)."""

    decode_s: dict[int, float]  # batch size -> decode time per generated token (speculation counted)
    prefill_step_s: float  # fixed cost of a step that prefills, beyond its decode
    prefill_s_per_token: float  # each uncached prompt token behind the robot type's cached examples
    first_segment_s: dict[str, float]  # "<robot type>/<urgent|normal>" -> a lone task's first segment
    tokens_per_step: dict[int, float] = field(default_factory=dict)  # batch size -> tokens each generation kept
    decode_step_s: dict[int, float] = field(default_factory=dict)  # batch size -> a decode step, whatever it kept
    prefill_samples: list[tuple[int, float]] = field(default_factory=list)  # (uncached tokens, their cost)
    wall_s: float = 0.0

    def describe(self) -> dict[str, float]:
        """Flat figures in ms for /engine_state, /diagnostics and results files."""
        d = {f"decode_ms_b{b}": 1e3 * t for b, t in sorted(self.decode_s.items())}
        d |= {"prefill_step_ms": 1e3 * self.prefill_step_s, "prefill_ms_per_token": 1e3 * self.prefill_s_per_token}
        d |= {f"first_segment_ms_{k.replace('/', '_')}": 1e3 * v for k, v in sorted(self.first_segment_s.items())}
        d["calibration_s"] = self.wall_s
        return d


def _drain(engine: Engine) -> None:
    for gid in engine.running_ids() | engine.suspended_ids():
        engine.abort(gid)


def _request(engine: Engine, make: ProbeMaker, stop: Callable[[str], Any], rt: str, n: int, objects: int,
             urgent: bool, max_new: int, suspend: bool) -> EngineRequest:
    ids, extra = make(rt, n, objects, urgent)
    return EngineRequest(f"calibration-{rt}-{n}", list(ids), stop(rt), max_new_tokens=max_new,
                         suspend_at_boundary=suspend, extra=dict(extra))


def calibrate(engine: Engine, make: ProbeMaker, stop_checker: Callable[[str], Any], robot_types: list[str],
              urgent_types: set[str] | None = None, max_batch: int | None = None) -> Calibration:
    """Measure ``engine`` as the planner will run it (see the module doc). ``make`` renders a probe task of a
    robot type as the planner renders tasks (prompt and grammar); ``stop_checker(robot_type)`` as the core's;
    ``robot_types``: the first is measured for decode and prefill, each for a lone first segment (an urgent one
    for those in ``urgent_types``). Call on an idle, warmed engine, from the thread that steps it."""
    if engine.has_work():
        raise RuntimeError("calibrate: the engine is already serving")
    t_start = time.perf_counter()
    n = iter(range(1 << 30))
    rt0 = robot_types[0]
    limit = max_batch or max(1, int(engine.stats().max_batch))
    decode: dict[int, float] = {}
    kept: dict[int, float] = {}
    step: dict[int, float] = {}
    for b in [b for b in DECODE_BATCHES if b <= limit]:
        for _ in range(b):
            engine.add(_request(engine, make, stop_checker, rt0, next(n), 1, False, 64, False))
        per_token, per_step, whole = [], [], []
        while engine.has_work() and len(per_token) < DECODE_STEPS:
            rep = engine.step()
            if rep.prefill_tokens or rep.batch_size != b or rep.new_tokens < 1 or any(e.final for e in rep.events):
                continue  # a prefill step, or one a generation ended in
            per_token.append(rep.duration_s * b / max(b, rep.new_tokens))
            per_step.append(rep.new_tokens / b)
            whole.append(rep.duration_s)
        _drain(engine)
        if per_token:
            decode[b] = statistics.median(per_token)
            kept[b] = statistics.mean(per_step)
            step[b] = statistics.median(whole)
    if not decode:
        raise RuntimeError("calibrate: no decode step could be timed (every probe ended at once)")
    step1 = decode.get(1, min(decode.values()))
    samples: list[tuple[int, float]] = []
    points: list[tuple[float, float]] = []  # each turn length's median (tokens, cost)
    for objects in PREFILL_SIZES:
        size: list[tuple[int, float]] = []
        for _ in range(REPEATS):
            engine.add(_request(engine, make, stop_checker, rt0, next(n), objects, False, 1, True))
            rep = engine.step()
            if rep.prefill_tokens > 0:
                size.append((rep.prefill_tokens, max(0.0, rep.duration_s - step1)))
            _drain(engine)
        if size:
            points.append((statistics.median(t for t, _ in size), statistics.median(c for _, c in size)))
        samples += size
    fixed, rate = _fit(points)
    first: dict[str, float] = {}
    for rt in robot_types:
        urgent = rt in (urgent_types or set())
        times = []
        for _ in range(REPEATS):
            req = _request(engine, make, stop_checker, rt, next(n), 1, urgent, 64, True)
            t0 = time.perf_counter()
            engine.add(req)
            done = False
            while engine.has_work() and not done:
                for ev in engine.step().events:
                    if ev.gen_id == req.gen_id and ev.reason in (FinishReason.SEGMENT, FinishReason.STOP):
                        done = True
            if done:
                times.append(time.perf_counter() - t0)
            _drain(engine)
        if times:
            first[f"{rt}/{'urgent' if urgent else 'normal'}"] = statistics.median(times)
    return Calibration(decode, fixed, rate, first, kept, step, samples, time.perf_counter() - t_start)


def calibrate_core(core: PlannerCore, make: ProbeMaker, robot_types: list[str], urgent_types: set[str]
                   ) -> Calibration | None:
    """:func:`calibrate` ``core``'s engine and start the core's step-time estimate from it (kept as
    ``core.calibration``). None, measuring nothing, for an engine that keeps its own estimate (a pool: each member
    learns its own). The engine thread only, before it serves (as :func:`warm_up`)."""
    if core.engine.latency_estimator() is not None or not robot_types:
        return None
    cal = calibrate(core.engine, make, core.hooks.stop_checker, robot_types, urgent_types)
    if core.engine.has_work():  # an aborted probe the engine still holds: let it finish releasing
        _drain(core.engine)
    with core.lock:
        core.estimator.calibrate(cal.decode_s, cal.prefill_step_s, cal.prefill_s_per_token,
                                 f"measured at warm-up on this engine ({time.strftime('%Y-%m-%d %H:%M:%S')})")
        core.calibration = cal
    return cal


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(fixed, per token) through (tokens, cost) points, each a turn length's median over its repeats (one
    slowed sample stays out of the fit: a least-squares line through raw samples gave a 136 ms fixed cost,
    against 0-24 ms, in a demo run beside another process): a least-squares line where the lengths differ, else
    all of it per token."""
    if not points:
        return 0.0, 0.0
    xs = [float(t) for t, _ in points]
    ys = [c for _, c in points]
    if max(xs) >= 1.5 * min(xs):
        mx, my = statistics.mean(xs), statistics.mean(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        rate = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx)
        return max(0.0, my - rate * mx), rate
    return 0.0, sum(ys) / sum(xs)


def probe_maker(prompts: Any) -> ProbeMaker:
    """Calibration tasks rendered as a goal's would be, by ``prompts`` (an engines.prompts.PromptRenderer)."""
    def make(robot_type: str, n: int, objects: int, urgent: bool) -> tuple[list[int], dict[str, Any]]:
        text = probe_task(prompts.builder(robot_type).library.examples, n, objects, urgent)
        if text is None:
            raise ValueError(f"calibration: the {robot_type} examples have no {'urgent' if urgent else 'normal'} task")
        return prompts.render(robot_type, text)
    return make


def lone_first_s(cal: Calibration | None) -> float:
    """The warm-up's lone first segment on this engine, urgent where measured (s); 0: not measured."""
    if cal is None or not cal.first_segment_s:
        return 0.0
    urgent = [v for k, v in cal.first_segment_s.items() if k.endswith("/urgent")]
    return (urgent or list(cal.first_segment_s.values()))[0]


def probe_task(examples: list[dict[str, str]], n: int, objects: int, urgent: bool) -> str | None:
    """A calibration task like a robot type's own (one of its few-shot example inputs: an emergency's, marked
    ``[E]``, where ``urgent``), with ``objects`` scene objects named after probe ``n`` put first, so that its turn
    is one the prefix cache has never seen. None where the examples have no such task."""
    ex = next((e["input"] for e in examples if ("[E]" in e["input"]) == urgent), None)
    if ex is None:
        return None
    marks = ", ".join(f"probe{n}_{i} x:0.{i % 10}0 y:0.50 width:0.10 height:0.10" for i in range(objects))
    if "Scene: [" not in ex:
        return f"Scene: [{marks}] {ex}"
    head, rest = ex.split("Scene: [", 1)
    return f"{head}Scene: [{marks}{'' if rest.startswith(']') else ', '}{rest}"


def warm_up_planner(core: PlannerCore, prompts: Any, robot_types: list[str], calibrate: bool, log: Log) -> None:
    """The planner's warm-up before it serves: each robot type's shared prompt (skill catalogue, few-shot examples)
    prefilled once (``prompts``: its PromptRenderer), so even the first request of a burst pays only for its own
    scene and instruction, and a fresh engine's slow first forward passes are out of the way; then, with
    ``calibrate``, this engine measured (:func:`calibrate_core`). Runs in the engine's stead (its thread not
    started yet)."""
    warm, burst = prompts.warm_up_prompts(robot_types)
    if not warm:
        return  # the simulated engine has no prompt to warm (and its estimate is its own model)
    t0 = time.monotonic()
    warm_up(core, warm, burst, extra=prompts.warm_up_extra)
    log.info(f"warmed the prompts of {robot_types} in {time.monotonic() - t0:.2f} s")
    if calibrate:
        def has(rt: str, urgent: bool) -> bool:
            return probe_task(prompts.builder(rt).library.examples, 0, 1, urgent) is not None

        try:  # robot types whose examples give a task to measure with (a chatbot's have no scene)
            cal = calibrate_core(core, probe_maker(prompts), [rt for rt in robot_types if has(rt, False)],
                                 {rt for rt in robot_types if has(rt, True)})
        except Exception as e:  # noqa: BLE001 - the engine still serves, on the step model it was seeded with
            log.warning(f"calibration failed, keeping the seeded step-time estimate: {e!r}")
            return
        if cal is not None:
            log.info("measured this engine in {:.2f} s: {}".format(cal.wall_s, ", ".join(
                f"{k} {v:.1f}" for k, v in cal.describe().items() if k != "calibration_s")))
