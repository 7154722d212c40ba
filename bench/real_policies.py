"""``timelyllm-bench real-policies``: the scheduling policies on the real engine, repeated, beside the simulator.

    timelyllm-bench real-policies          # 5 policies x 3 repetitions x 66 WID 2 tasks at 3x, real vLLM on this CPU
    timelyllm-bench real-policies --reps 1 --events 2 --policies pud,fcfs      # smoke run (12 tasks)
    timelyllm-bench real-policies --first-rep 3    # 3 more repetitions into the same folder, report over all
    timelyllm-bench real-policies --from-runs bench/results/real_policies      # tables again from saved runs
    timelyllm-bench real-policies --resume idle,room --out bench/results/real_policies_inplace   # before / after

``--resume``: how the vLLM engine resumes a suspended generation (VllmEngine module doc). *room* (the engine's
default): in place while the batch has room, resubmitted only when another generation needs the place; *idle*:
in place only when nothing else was in the engine (``park_busy=False``, the behaviour before). Several modes run
side by side in one invocation (each repetition and policy once per mode, the mode order rotated per
repetition), into ``<out>/<mode>/`` each with its own report, and ``<out>/comparison.md`` (+ PNG) puts their
engine work per run side by side: prefill steps, prefill tokens, prompt tokens submitted, resumes in place and
resubmitted, engine busy time.

Each repetition serves the same tasks (the first ``--events`` arrival events of the trace, at most
``--per-event`` tasks each, TUF time axis as the demo's default, demo.CPU_TUF_SCALE on a CPU) through the
real stack of the README's demo (planner node, vLLM, ROS 2, simulated fleet node), one policy after another.
The policy order is rotated per repetition, so no policy always runs first, and the fleet's seed is the
repetition number. Each run's records and engine steps are saved under ``runs/`` (gzipped JSON) as soon as it ends.

Beside every real run the simulator (step model fitted to this engine, ``--sim-engine``) serves the same
tasks twice:

- **replay**: it takes as given what the run measured and a scheduler cannot change: the plan the model
  wrote for each task (as tokens), the prompt's token ids, and each segment's execution time on the robot.
  What is left is modelled: engine step times, scheduling, admission and network hops. Per task, the
  simulated response time is compared with the real one (robot's view).
- **templates**: the simulator alone, as in every other benchmark (plans from data/plans.yaml, robot times
  from the trace). Its ranking of the policies is what the simulator would have predicted.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import ci_cell, line_fit, mean_ci
from timelyllm_ros.engines.sim_engine import SimEngineConfig
from timelyllm_ros.launch_graph import resolve_config
from timelyllm_ros.measure import bound as bounds
from timelyllm_ros.measure import metrics
from timelyllm_ros.measure.records import SegRecord, TaskRecord
from timelyllm_ros.sim.simulator import Replay, SimConfig, Simulator
from timelyllm_ros.sim.workloads import Job, Workload

DEFAULT_POLICIES = "pud-shed,pud,edf-seg,fcfs-stream,fcfs"
GROUPS = (("urgent", "all urgent"), ("normal", "all normal"), ("all", "all"))
RESUME_MODES = ("room", "idle")  # VllmEngine: in place while the batch has room / only on an idle engine
# What the engine did per run (serving_figures), mean per policy in the tables.
ENGINE_FIGURES = ("prefill_steps", "prefill_tokens", "prompt_tokens", "submissions", "resumed_in_place",
                  "resubmitted", "released_held", "busy_s", "prefill_s")
SOURCES = ("real", "replay", "templates")


def add_parser(sub: Any) -> None:
    from timelyllm_ros.demo import add_job_selection

    p = sub.add_parser("real-policies", help="policies on the real engine (repeated, mean ± 95 %% CI) beside "
                                             "the simulator: per-task response error and ranking")
    p.add_argument("--policies", default=DEFAULT_POLICIES, help="comma list (default %(default)s)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of the whole set (default 3)")
    p.add_argument("--first-rep", type=int, default=0,
                   help="number the repetitions from this one (add repetitions to a folder's saved runs)")
    p.add_argument("--workload", default="wid2", help="LRTrace workload, as for the demo (default the real WID 2)")
    add_job_selection(p, events=10, per_event=10)  # 66 tasks of the WID 2 trace
    p.add_argument("--load", type=float, default=3.0,
                   help="arrival times divided by this (after --max-gap): the same tasks, this much denser "
                        "(default 3: overload on this CPU)")
    p.add_argument("--tuf-scale", type=float, default=None, help="TUF time axis factor (default as the demo: "
                   "5 on a CPU, 1 on a GPU)")
    p.add_argument("--engine", default="engine_vllm_cpu.yaml", help="engine YAML of the real runs")
    p.add_argument("--sim-engine", default="sim_engine_fitted_cpu.yaml",
                   help="the simulator's step model (name in config/ or path; default the fit to this CPU)")
    p.add_argument("--timeout", type=float, default=900.0, help="per run (s)")
    p.add_argument("--from-runs", default="", help="build the report from a folder's saved runs/ (no engine)")
    p.add_argument("--out", default="", help="results folder (default bench/results/real_policies)")
    p.add_argument("--resume", default="room", help="comma list of vLLM resume modes, run side by side: room "
                   "(in place while the batch has room; the engine's default), idle (in place only on an idle "
                   "engine: the behaviour before); several: one sub-folder each and a comparison")
    p.set_defaults(fn=cmd_real_policies)


# -- saved runs ------------------------------------------------------------------------------------

def _rec_to_json(r: TaskRecord) -> dict[str, Any]:
    return dataclasses.asdict(r)


def _rec_from_json(d: dict[str, Any]) -> TaskRecord:
    return TaskRecord(**{**d, "segments": [SegRecord(**s) for s in d["segments"]]})


def replay_of(records: Sequence[TaskRecord], jobs: Sequence[Job], tokenize: Callable[[str], Sequence[Any]],
              decode: Callable[[list[Any]], str], prompt_ids: Callable[[Job, str], Sequence[int]]) -> Replay:
    """What a real run measured that no scheduler changes: plans (as the engine's tokens), prompts (``prompt_ids``
    of the job and its robot type), and the robot's time per segment. A segment the robot did not finish
    (preempted, refused) gives no time: the simulator samples one if it runs it."""
    by_id = {j.job_id: j for j in jobs}
    rp = Replay()
    for r in records:
        job = by_id[r.job_id]
        if r.plan:
            rp.plan_pieces[r.job_id] = [decode([i]) for i in tokenize(r.plan)]
        rp.prompt_ids[r.job_id] = list(prompt_ids(job, r.robot_type))
        for s in r.segments:
            if s.started and not s.preempted and math.isfinite(s.end):
                rp.seg_exec_s[(r.job_id, s.index)] = s.end - s.start
    return rp


def save_run(out: Path, policy: str, rep: int, admission: str, wall_s: float, steps: Sequence[Sequence[float]],
             records: Sequence[TaskRecord], replay: Replay, latency_estimate: dict[str, Any] | None = None,
             engine: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run as ``runs/rep<k>-<policy>.json.gz`` (what ``--from-runs`` reads back). ``engine``: what the engine
    counted during the run (:func:`engine_counters` differences, the resume mode)."""
    run = {"policy": policy, "rep": rep, "admission": admission, "wall_s": wall_s, "engine": engine or {},
           "latency_estimate": latency_estimate or {}, "steps": [list(x) for x in steps],
           "records": [_rec_to_json(r) for r in records], "replay": _replay_to_json(replay)}
    (out / "runs").mkdir(parents=True, exist_ok=True)
    with gzip.open(out / "runs" / f"rep{rep}-{policy}.json.gz", "wt") as f:  # prompts as token ids: ~10x smaller
        json.dump(run, f)
    return run


def save_bound(out: Path, bound: dict[int, float]) -> None:
    """Job id -> its utility under this invocation's bound (measure/bound.py), beside the runs."""
    (out / "bound.json").write_text(json.dumps({str(k): v for k, v in bound.items()}, indent=1))


def load_bound(folder: Path) -> dict[int, float] | None:
    path = folder / "bound.json"
    return {int(k): float(v) for k, v in json.loads(path.read_text()).items()} if path.exists() else None


def save_jobs(out: Path, jobs: Sequence[Job], tuf_scale: float, engine: str, load: float = 1.0) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "jobs.json").write_text(json.dumps({"tuf_scale": tuf_scale, "load": load, "engine": engine,
                                               "jobs": [j.to_json() for j in jobs]}, indent=1))


def _replay_to_json(rp: Replay) -> dict[str, Any]:
    return {"plan_pieces": {str(k): v for k, v in rp.plan_pieces.items()},
            "prompt_ids": {str(k): v for k, v in rp.prompt_ids.items()},
            "seg_exec_s": [[j, i, t] for (j, i), t in rp.seg_exec_s.items()], "warm_prompts": rp.warm_prompts}


def replay_from_json(d: dict[str, Any]) -> Replay:
    return Replay({int(k): v for k, v in d["plan_pieces"].items()}, {int(k): v for k, v in d["prompt_ids"].items()},
                  {(int(j), int(i)): float(t) for j, i, t in d["seg_exec_s"]}, dict(d.get("warm_prompts", {})))


def engine_counters(engine: Any) -> dict[str, int]:
    """The engine's running totals of (re)submissions and resumes (VllmEngine; zeros elsewhere): take differences
    around a run."""
    out = dict(engine.resume_counters())
    out["submissions"] = len(engine.submissions)
    return out


def counted_since(engine: Any, before: dict[str, int]) -> dict[str, Any]:
    """What the engine did since ``before`` (:func:`engine_counters`), with the prompt tokens it submitted."""
    now = engine_counters(engine)
    out: dict[str, Any] = {k: now[k] - before.get(k, 0) for k in now}
    recs = engine.submissions[before.get("submissions", 0):]
    out["prompt_tokens"] = sum(int(r.get("prompt_tokens", 0)) for r in recs)
    out["cached_tokens"] = sum(int(r.get("cached_tokens", 0)) for r in recs)
    return out


def serving_figures(run: dict[str, Any]) -> dict[str, float]:
    """What the engine did to serve a run: prefill steps and tokens and busy time (its steps from the first
    arrival on), (re)submissions, prompt tokens submitted and resumes in place / resubmitted (the engine's counts
    over the whole run; NaN for a run saved without them)."""
    steps = serving_steps(run)
    eng = run.get("engine") or {}
    out = {"prefill_steps": float(sum(1 for s in steps if s[1] > 0)),
           "prefill_tokens": float(sum(s[1] for s in steps)),
           "busy_s": float(sum(s[2] for s in steps)),
           "prefill_s": float(sum(s[2] for s in steps if s[1] > 0))}
    for k in ("prompt_tokens", "submissions", "resumed_in_place", "resubmitted", "released_held"):
        out[k] = float(eng[k]) if k in eng else math.nan
    return out


BUSY_GAP_S = 0.05  # a step that starts this soon after the previous one ended: the engine had work all along


def service_step_times(steps: Sequence[Sequence[float]]) -> list[tuple[int, int, float]]:
    """(batch, prefill tokens, seconds) per step, a step's seconds counted as the planner lived them: from its
    start to the next step's start while the engine stays busy. That adds what the engine thread does between
    two steps (segments out, the next decision, and the wait for the interpreter lock the ROS executor's
    threads hold) to the engine's own step time. Steps logged without wall times keep their measured time."""
    out = []
    for i, st in enumerate(steps):
        b, pf, d = int(st[0]), int(st[1]), float(st[2])
        if len(st) >= 5:
            t0, t1 = float(st[3]), float(st[4])
            nxt = steps[i + 1][3] if i + 1 < len(steps) and len(steps[i + 1]) >= 5 else None
            d = (nxt - t0) if nxt is not None and 0 <= nxt - t1 < BUSY_GAP_S else t1 - t0
        out.append((b, pf, d))
    return out


def fit_service_steps(steps: Sequence[Sequence[float]], base: SimEngineConfig) -> SimEngineConfig:
    """The step model refitted to the steps the planner took in service (see :func:`service_step_times`):
    decode_s and batch_slowdown by least squares over the means per batch of the pure decode steps;
    prefill_step_s + prefill_s_per_token * tokens by least squares over what the prefill steps took beyond
    that decode time (a small prefill costs more per token than the fixed rate alone would say)."""
    # the engine reports every live request as its batch; it runs at most max_batch of them at a time
    steps = [(min(b, base.max_batch), pf, d) for b, pf, d in service_step_times(steps)]
    by_b: dict[int, list[float]] = {}
    for b, pf, d in steps:
        if pf == 0 and b > 0:
            by_b.setdefault(int(b), []).append(float(d))
    pts = sorted((b, statistics.fmean(v)) for b, v in by_b.items())  # means: queues add up every step
    if not pts:
        raise ValueError("no decode steps to fit a step model to")
    c0, c1 = line_fit([b - 1 for b, _ in pts], [y for _, y in pts])
    if c0 <= 0:
        c0, c1 = pts[0][1], 0.0
    pre = [(pf, d - (c0 + c1 * max(0, b - 1))) for b, pf, d in steps if pf > 0]
    per_tok, fixed = base.prefill_s_per_token, 0.0
    if len(pre) >= 2 and len({pf for pf, _ in pre}) > 1:  # what a prefill step costs: fixed + per token
        px, py = [pf for pf, _ in pre], [r for _, r in pre]
        fixed, per_tok = line_fit(px, py)
        if per_tok <= 0:  # no per-token cost to see: a fixed one only
            fixed, per_tok = max(0.0, statistics.fmean(py)), 0.0
        elif fixed < 0:  # no fixed cost to see: through the origin
            fixed, per_tok = 0.0, sum(x * y for x, y in pre) / sum(x * x for x in px)
    return dataclasses.replace(base, decode_s=c0, batch_slowdown=max(0.0, c1 / c0),
                               prefill_s_per_token=per_tok, prefill_step_s=fixed)


def simulate(jobs: Sequence[Job], policy: str, seed: int, step_model: SimEngineConfig,
             replay: Replay | None) -> list[TaskRecord]:
    cfg = SimConfig(policy=policy, seed=seed, engine=step_model)
    return Simulator(Workload("real-policies", list(jobs)), cfg, replay=replay).run().records


# -- the real runs ---------------------------------------------------------------------------------

def mode_dir(out: Path, mode: str, modes: Sequence[str]) -> Path:
    """Where a resume mode's runs and report go: ``out`` itself for one mode, ``out/<mode>`` for several."""
    return out if len(modes) == 1 else out / mode


def _real_runs(args: argparse.Namespace, out: Path, policies: list[str], modes: Sequence[str] = ("room",),
               ) -> list[dict[str, Any]]:
    from timelyllm_ros import demo
    from timelyllm_ros.engines.factory import planner_engine
    from timelyllm_ros.engines.prompts import WARM_UP_TASK, PromptRenderer
    from timelyllm_ros.sim.workloads import load_workload

    engine, constrained = planner_engine(args.engine)
    tuf_scale = args.tuf_scale
    if tuf_scale is None:
        tuf_scale = demo.default_tuf_scale(engine)
    jobs = demo.pick_jobs(load_workload(args.workload, 0), args.events, args.per_event, args.max_gap, tuf_scale)
    jobs = [dataclasses.replace(j, trigger_time=j.trigger_time / args.load) for j in jobs]
    renderer = PromptRenderer(engine, constrained)
    steps: list[tuple[int, int, float, float, float]] = []
    engine_step = engine.step

    def logged_step() -> Any:  # every step the planner takes: (batch, prefill tokens, measured s, call start, end)
        t0 = time.monotonic()  # the workload client's clock: steps before the first arrival are the warm-up
        rep = engine_step()
        steps.append((rep.batch_size, rep.prefill_tokens, rep.duration_s, t0, time.monotonic()))
        return rep

    engine.step = logged_step  # type: ignore[method-assign]
    ns = argparse.Namespace(admission="auto", fleet_time_scale=1.0, speed=1.0, timeout=args.timeout, record=False,
                            tuf_scale=tuf_scale, out_dir=out, seed=0, robots_in_process=False)
    if any(m != "room" for m in modes) and not engine.set_hold_in_place(True):
        engine.close()
        raise SystemExit(f"--resume {','.join(modes)}: the engine of {args.engine} has no resume modes (vLLM only)")
    for mode in modes:
        folder = mode_dir(out, mode, modes)
        earlier = folder / "jobs.json"
        if args.first_rep and earlier.exists() and \
                json.loads(earlier.read_text())["jobs"] != [j.to_json() for j in jobs]:
            engine.close()
            raise SystemExit(f"--first-rep: these tasks differ from those of the runs already in {folder}")
        if not args.first_rep:  # a new set: runs of an earlier one must not mix into its report
            for old in (folder / "runs").glob("rep*-*.json*"):
                old.unlink()
        save_jobs(folder, jobs, tuf_scale, engine.info.model, args.load)
    runs = []
    try:
        demo.console.rule("[dim]warm-up pass (not measured)")
        demo.run_policy(engine, constrained, policies[0], jobs, ns, record=False)
        bound = demo.measure_bound(engine, constrained, policies[0], jobs, ns)  # this run's bound: each task alone
        for mode in modes:
            save_bound(mode_dir(out, mode, modes), bound)
        for rep in range(args.first_rep, args.first_rep + args.reps):
            ns.seed = rep
            k = rep % len(policies)
            for policy in policies[k:] + policies[:k]:
                m = rep % len(modes)
                for mode in list(modes[m:]) + list(modes[:m]):
                    engine.set_hold_in_place(mode == "room")
                    steps.clear()
                    before = engine_counters(engine)
                    res = demo.run_policy(engine, constrained, policy, jobs, ns, record=False)
                    counted = counted_since(engine, before) | {"resume": mode}
                    rp = replay_of(res.records, jobs, engine.tokenize, engine.decode,
                                   lambda job, rt: renderer.token_ids(rt, job.task_input))
                    rp.warm_prompts = {rt: renderer.token_ids(rt, WARM_UP_TASK)
                                       for rt in {r.robot_type for r in res.records}}
                    runs.append(save_run(mode_dir(out, mode, modes), policy, rep, res.admission, res.wall_s, steps,
                                         res.records, rp, res.latency_estimate, counted))
    finally:
        engine.close()
    return runs


def load_runs(folder: Path) -> list[dict[str, Any]]:
    files = sorted((folder / "runs").glob("rep*-*.json.gz"))
    if not files:
        raise SystemExit(f"--from-runs: no saved runs under {folder / 'runs'}")
    out = []
    for path in files:
        with gzip.open(path, "rt") as f:
            out.append(json.load(f))
    return out


# -- the report ------------------------------------------------------------------------------------

def _figures(records: Sequence[TaskRecord]) -> dict[str, float]:
    rows = {s.group: s for s in metrics.summarize(records)}
    out: dict[str, float] = {}
    for key, group in GROUPS:
        s = rows.get(group)
        out[f"{key}_u"] = s.utility_norm_all if s else math.nan
    out["resp_mean"] = rows["all"].response_mean
    out["not_done"] = float(sum(1 for r in records if not r.done))
    return out


def per_task_errors(real: Sequence[TaskRecord], sim: Sequence[TaskRecord]) -> dict[str, Any]:
    """Relative response-time error of the simulator per task served in both; tasks served in one only."""
    sim_by = {r.job_id: r for r in sim}
    errs, only_real, only_sim, pairs = [], 0, 0, []
    for r in real:
        s = sim_by[r.job_id]
        a, b = r.response_time, s.response_time
        if a is None and b is None:
            continue
        if b is None:
            only_real += 1
        elif a is None:
            only_sim += 1
        else:
            pairs.append((a, b))
            if a > 0:
                errs.append(abs(b - a) / a)
    return {"median_abs_err": statistics.median(errs) if errs else math.nan, "tasks_compared": len(errs),
            "served_real_only": only_real, "served_sim_only": only_sim, "pairs": pairs}


def serving_steps(run: dict[str, Any]) -> list[Sequence[float]]:
    """The run's steps from its first arrival on: the planner's warm-up (a cold prompt, a first batch) is
    not what it costs to serve."""
    first = min((r["arrival"] for r in run["records"] if math.isfinite(r["arrival"])), default=-math.inf)
    return [s for s in run["steps"] if len(s) < 5 or s[3] >= first]


def build_report(runs: list[dict[str, Any]], jobs: list[Job], bench_fit: SimEngineConfig,
                 bound: dict[int, float] | None = None) -> dict[str, Any]:
    """Each run beside the simulator. The replay's step model is fitted to the steps the planner took in
    the *other* repetitions (all runs when there is one), so no run is predicted from its own steps;
    the bench fit (engine bench on a bare engine) is replayed too, for comparison. With ``bound`` (the same
    invocation's lone pass), each run's utility as a share of it."""
    policies = list(dict.fromkeys(r["policy"] for r in runs))
    reps = sorted({r["rep"] for r in runs})
    fits = {}
    for rep in reps:
        train = [s for r in runs if r["rep"] != rep or len(reps) == 1 for s in serving_steps(r)]
        fits[rep] = fit_service_steps(train, bench_fit)
    per_run = []
    for run in runs:
        real = [_rec_from_json(d) for d in run["records"]]
        # Each task's own plan, also where the run cut it short (a cancelled task): the same task's plan
        # differs between runs (greedy decoding in a batch is not bit-stable), and the robot times replayed
        # are those of this plan's segments.
        rp = replay_from_json(run["replay"])
        replayed = simulate(jobs, run["policy"], run["rep"], fits[run["rep"]], rp)
        bench_replayed = simulate(jobs, run["policy"], run["rep"], bench_fit, rp)
        templated = simulate(jobs, run["policy"], run["rep"], fits[run["rep"]], None)
        per_run.append({"policy": run["policy"], "rep": run["rep"], "admission": run["admission"],
                        "wall_s": run["wall_s"], "steps": len(run["steps"]), "real": _figures(real),
                        "engine": serving_figures(run), "resume": (run.get("engine") or {}).get("resume", ""),
                        "replay": _figures(replayed), "templates": _figures(templated),
                        "error": per_task_errors(real, replayed),
                        "error_bench_fit": per_task_errors(real, bench_replayed),
                        "share": {b.level: b.share for b in bounds.shares(real, bound)} if bound else {}})
    table = []
    for p in policies:
        rs = [x for x in per_run if x["policy"] == p]
        row: dict[str, Any] = {"policy": p, "reps": len(rs), "admission": rs[0]["admission"]}
        for src in SOURCES:
            for k in rs[0][src]:
                row[f"{src}_{k}"], row[f"{src}_{k}_ci"] = mean_ci([x[src][k] for x in rs])
        pooled = _abs_errors(rs, "error")
        for k in ENGINE_FIGURES:
            row[f"engine_{k}"], row[f"engine_{k}_ci"] = mean_ci([x["engine"][k] for x in rs])
        for level in ("urgent", "all"):
            row[f"share_{level}"], row[f"share_{level}_ci"] = mean_ci([x["share"].get(level, math.nan) for x in rs])
        row["median_abs_err"] = statistics.median(pooled) if pooled else math.nan
        row["tasks_compared"] = len(pooled)
        row["served_one_side_only"] = sum(x["error"]["served_real_only"] + x["error"]["served_sim_only"] for x in rs)
        table.append(row)
    everything, bench_errs = _abs_errors(per_run, "error"), _abs_errors(per_run, "error_bench_fit")
    pairs = pair_orders(per_run, policies)
    ranking = {src: sorted(policies, key=lambda p, s=src: -_row(table, p)[f"{s}_all_u"]) for src in SOURCES}
    return {"policies": policies, "reps": len(reps), "tasks": len(jobs),
            "urgent_tasks": sum(1 for j in jobs if j.tuf[0] > 1), "robots": len({j.agent_id for j in jobs}),
            "table": table, "per_run": per_run, "ranking": ranking, "pairs": pairs,
            "step_models": {"bench_fit": dataclasses.asdict(bench_fit),
                            "service_fit_per_rep": {str(k): dataclasses.asdict(v) for k, v in fits.items()}},
            "median_abs_err_all": statistics.median(everything) if everything else math.nan,
            "median_abs_err_bench_fit": statistics.median(bench_errs) if bench_errs else math.nan,
            "tasks_compared_all": len(everything), "bound": bool(bound)}


def pair_orders(per_run: Sequence[dict[str, Any]], policies: list[str]) -> list[dict[str, Any]]:
    """Every pair of policies: the real all-tasks U/beta difference paired by repetition (mean ± 95 % CI), whether
    the real runs separate them (the interval excludes 0), and whether the replay orders them the same way."""
    by = {(x["policy"], x["rep"]): x for x in per_run}
    reps = sorted({x["rep"] for x in per_run})
    out = []
    for i, a in enumerate(policies):
        for b in policies[i + 1:]:
            common = [r for r in reps if (a, r) in by and (b, r) in by]
            if not common:
                continue
            d, ci = mean_ci([by[(a, r)]["real"]["all_u"] - by[(b, r)]["real"]["all_u"] for r in common])
            dr = statistics.fmean(by[(a, r)]["replay"]["all_u"] - by[(b, r)]["replay"]["all_u"] for r in common)
            separated = not math.isnan(ci) and abs(d) > ci
            out.append({"a": a, "b": b, "real_diff": d, "real_diff_ci": ci, "replay_diff": dr,
                        "separated": separated, "same_order": _sign(d) == _sign(dr)})
    return out


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _abs_errors(per_run: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [abs(b - a) / a for x in per_run for a, b in x[key]["pairs"] if a > 0]


def _row(table: list[dict[str, Any]], policy: str) -> dict[str, Any]:
    return next(r for r in table if r["policy"] == policy)


def markdown(rep: dict[str, Any], command: str, tuf_scale: float, load: float, step_model_name: str) -> str:
    md = [f"# Policies on the real engine, beside the simulator ({time.strftime('%Y-%m-%d %H:%M')})", "",
          f"Command: `{command}`", "",
          f"{rep['tasks']} tasks ({rep['urgent_tasks']} urgent) on {rep['robots']} robots, each policy "
          f"{rep['reps']} times; TUF time axis x{tuf_scale:g}; arrivals x{load:g} as dense as the trace's (idle gaps "
          "shortened to --max-gap first). Real: vLLM on this CPU through the ROS 2 stack, "
          "times from the robots' side. U/beta counts every task (0 for a task not done). Mean ± half-width of "
          "the 95 % interval over the repetitions (Student t).", "",
          "Simulator: *replay* = the simulator given each real run's plans, prompts and robot segment times; "
          "*templates* = the simulator alone (template plans, trace robot times). Both step with the model "
          "`decode_s * (1 + batch_slowdown * (batch - 1)) + prefill_step_s + prefill_tokens * prefill_s_per_token` "
          "(prefill terms in steps that prefill) fitted to the "
          "engine steps the planner took in the other repetitions (all runs when there is one):", "",
          *(f"- fit for repetition {k}: decode {1e3 * v['decode_s']:.1f} ms at batch 1, slowdown "
            f"{v['batch_slowdown']:.3f} per extra sequence, prefill {1e3 * v['prefill_step_s']:.1f} ms per step + "
            f"{1e3 * v['prefill_s_per_token']:.3f} ms/token"
            for k, v in rep["step_models"]["service_fit_per_rep"].items()),
          f"- `{step_model_name}` (engine bench, bare engine), for comparison: decode "
          f"{1e3 * rep['step_models']['bench_fit']['decode_s']:.1f} ms, slowdown "
          f"{rep['step_models']['bench_fit']['batch_slowdown']:.3f}, prefill "
          f"{1e3 * rep['step_models']['bench_fit']['prefill_s_per_token']:.3f} ms/token; the replay with it has a "
          f"median absolute response error of {100 * rep['median_abs_err_bench_fit']:.1f} %.", "",
          "| policy | admission | real urgent U/β | real normal U/β | real all U/β | real resp mean s | real not done "
          "| replay urgent U/β | replay all U/β | replay resp mean s | median abs resp error | templates all U/β "
          "| prefill steps | prefill tokens | resumes in place / resubmitted | engine busy s "
          "| real urgent share of bound | real all share of bound |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rep["table"]:
        md.append(f"| {r['policy']} | {r['admission']} | {ci_cell(r['real_urgent_u'], r['real_urgent_u_ci'])} | "
                  f"{ci_cell(r['real_normal_u'], r['real_normal_u_ci'])} | "
                  f"{ci_cell(r['real_all_u'], r['real_all_u_ci'])} | "
                  f"{ci_cell(r['real_resp_mean'], r['real_resp_mean_ci'], '{:.2f}')} | "
                  f"{ci_cell(r['real_not_done'], r['real_not_done_ci'], '{:.1f}')} | "
                  f"{ci_cell(r['replay_urgent_u'], r['replay_urgent_u_ci'])} | "
                  f"{ci_cell(r['replay_all_u'], r['replay_all_u_ci'])} | "
                  f"{ci_cell(r['replay_resp_mean'], r['replay_resp_mean_ci'], '{:.2f}')} | "
                  f"{metrics.fmt(100 * r['median_abs_err'], '.1f', ' %')} ({r['tasks_compared']} tasks) | "
                  f"{ci_cell(r['templates_all_u'], r['templates_all_u_ci'])} | "
                  f"{ci_cell(r['engine_prefill_steps'], r['engine_prefill_steps_ci'], '{:.0f}')} | "
                  f"{ci_cell(r['engine_prefill_tokens'], r['engine_prefill_tokens_ci'], '{:.0f}')} | "
                  f"{metrics.fmt(r['engine_resumed_in_place'], '.0f')} / "
                  f"{metrics.fmt(r['engine_resubmitted'], '.0f')} | "
                  f"{ci_cell(r['engine_busy_s'], r['engine_busy_s_ci'], '{:.1f}')} | "
                  f"{ci_cell(r['share_urgent'], r['share_urgent_ci'])} | "
                  f"{ci_cell(r['share_all'], r['share_all_ci'])} |")
    rk = rep["ranking"]
    md += ["", "Ranking by all-tasks U/β (best first):", "",
           *(f"- {src}: {_ranked(rep['table'], rk[src], src)}" for src in SOURCES), "",
           f"Same ranking, real vs replay: {'yes' if rk['real'] == rk['replay'] else 'no'}; real vs templates: "
           f"{'yes' if rk['real'] == rk['templates'] else 'no'}.", "",
           "Pairs (all-tasks U/β, a - b, paired by repetition; *separated*: the real runs' 95 % interval "
           "excludes 0, so the real order is known):", "",
           "| a | b | real a - b | replay a - b | separated | replay orders them the same |",
           "|---|---|---|---|---|---|",
           *(f"| {x['a']} | {x['b']} | {ci_cell(x['real_diff'], x['real_diff_ci'])} | {x['replay_diff']:+.3f} | "
             f"{'yes' if x['separated'] else 'no'} | {'yes' if x['same_order'] else 'no'} |" for x in rep["pairs"]),
           "", f"The replay orders {sum(1 for x in rep['pairs'] if x['separated'] and x['same_order'])} of the "
           f"{sum(1 for x in rep['pairs'] if x['separated'])} pairs the real runs separate as they do.", "",
           f"Median absolute response-time error of the replay over all runs: "
           f"{100 * rep['median_abs_err_all']:.1f} % ({rep['tasks_compared_all']} task responses compared).", "",
           "## Per run", "", "Engine figures from the run's first arrival on (the warm-up left out): *prefill steps* "
           "(steps that computed prompt tokens), *prefill tokens* (prompt tokens computed, not from the prefix "
           "cache), *busy s* (sum of the engine's step times); counted by the engine over the whole run, the "
           "planner's prompt warm-up included: *prompt tokens* (the prompts of every submission and "
           "resubmission, cached or not), *in place / resubmitted* (resumes that continued vLLM's request / "
           "submitted it again).", "",
           "| rep | policy | wall s | real all U/β | replay all U/β | real resp mean s | "
           "replay resp mean s | median abs err | served in one only | prefill steps | prefill tokens | "
           "prompt tokens | in place / resubmitted | busy s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in sorted(rep["per_run"], key=lambda x: (x["rep"], x["policy"])):
        e = x["error"]
        md.append(f"| {x['rep']} | {x['policy']} | {x['wall_s']:.1f} | {metrics.fmt(x['real']['all_u'], '+.3f')} | "
                  f"{metrics.fmt(x['replay']['all_u'], '+.3f')} | {metrics.fmt(x['real']['resp_mean'], '.2f')} | "
                  f"{metrics.fmt(x['replay']['resp_mean'], '.2f')} | "
                  f"{metrics.fmt(100 * e['median_abs_err'], '.1f', ' %')} | "
                  f"{e['served_real_only'] + e['served_sim_only']} | {_engine_cells(x['engine'])} |")
    return "\n".join(md) + "\n"


def _engine_cells(g: dict[str, float]) -> str:
    f = metrics.fmt
    return (f"{f(g['prefill_steps'], '.0f')} | {f(g['prefill_tokens'], '.0f')} | {f(g['prompt_tokens'], '.0f')} | "
            f"{f(g['resumed_in_place'], '.0f')} / {f(g['resubmitted'], '.0f')} | {f(g['busy_s'], '.1f')}")


def _ranked(table: list[dict[str, Any]], order: list[str], src: str) -> str:
    out = order[0]
    for a, b in zip(order, order[1:], strict=False):
        tie = abs(_row(table, a)[f"{src}_all_u"] - _row(table, b)[f"{src}_all_u"]) < 1e-9
        out += (" = " if tie else " > ") + b
    return out


def plot(path: Path, rep: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    pols = rep["policies"]
    width = 0.8 / len(GROUPS)
    for gi, (key, _) in enumerate(GROUPS):
        xs = [i + (gi - 1) * width for i in range(len(pols))]
        rows = [_row(rep["table"], p) for p in pols]
        ax.bar(xs, [r[f"real_{key}_u"] for r in rows], width,
               yerr=[0 if math.isnan(r[f"real_{key}_u_ci"]) else r[f"real_{key}_u_ci"] for r in rows],
               capsize=3, label=f"real, {key}")
        ax.plot(xs, [r[f"replay_{key}_u"] for r in rows], "k_", ms=14, mew=2,
                label="simulator (replay)" if gi == 0 else None)
    ax.set_xticks(range(len(pols)))
    ax.set_xticklabels(pols)
    ax.axhline(0, color="black", lw=0.6)
    ax.axhline(1, color="gray", lw=0.6, ls="--")
    ax.set_ylabel("utility / beta, all tasks (mean ± 95 % CI)")
    ax.set_title(f"Real vLLM (CPU), {rep['tasks']} tasks x {rep['reps']} repetitions", fontsize=10)
    ax.legend(fontsize=8)
    hi = 0.0
    for p in pols:
        pairs = [pr for x in rep["per_run"] if x["policy"] == p for pr in x["error"]["pairs"]]
        if pairs:
            ax2.scatter([a for a, _ in pairs], [b for _, b in pairs], s=10, alpha=0.6, label=p)
            hi = max(hi, *(max(a, b) for a, b in pairs))
    ax2.plot([0, hi], [0, hi], color="gray", lw=0.8, ls="--")
    ax2.set_xlabel("real response time (s)")
    ax2.set_ylabel("simulated response time, replay (s)")
    ax2.set_title(f"Per task: median abs error {100 * rep['median_abs_err_all']:.1f} %", fontsize=10)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_real_policies(args: argparse.Namespace) -> int:
    import sys

    policies = [p for p in args.policies.split(",") if p]
    from timelyllm_ros.planner.policies import POLICIES

    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        raise SystemExit(f"--policies: unknown {bad}; known: {', '.join(POLICIES)}")
    if args.reps < 1 or args.first_rep < 0:
        raise SystemExit("--reps must be >= 1 and --first-rep >= 0")
    if not args.load > 0:
        raise SystemExit(f"--load must be > 0, got {args.load}")
    modes = list(dict.fromkeys(m for m in args.resume.split(",") if m))
    if not modes or any(m not in RESUME_MODES for m in modes):
        raise SystemExit(f"--resume: a comma list of {', '.join(RESUME_MODES)}, got {args.resume!r}")
    out = Path(args.out or args.from_runs or Path(__file__).resolve().parent / "results" / "real_policies")
    if args.from_runs:
        src = Path(args.from_runs)
        found = [m for m in RESUME_MODES if (src / m / "runs").is_dir()]
        if not (src / "runs").is_dir() and found:  # saved side by side: one folder per resume mode
            modes = found
        elif len(modes) > 1:
            raise SystemExit(f"--from-runs {src}: no runs per resume mode ({', '.join(m + '/' for m in modes)})")
    else:
        src = out
        out.mkdir(parents=True, exist_ok=True)
        _real_runs(args, out, policies, modes)
    command = "timelyllm-bench " + " ".join(sys.argv[1:]) if sys.argv[0].endswith("bench") else \
        "python -m bench " + " ".join(sys.argv[1:])
    reports = {}
    for mode in modes:
        folder, dest = mode_dir(src, mode, modes), mode_dir(out, mode, modes)
        runs = load_runs(folder)
        saved = json.loads((folder / "jobs.json").read_text())
        dest.mkdir(parents=True, exist_ok=True)
        jobs = [Job.from_json(d) for d in saved["jobs"]]
        rep = build_report(runs, jobs, SimEngineConfig.from_yaml(resolve_config(args.sim_engine)), load_bound(folder))
        md = markdown(rep, command, saved["tuf_scale"], saved.get("load", 1.0), args.sim_engine)
        (dest / "results.md").write_text(md)
        (dest / "results.json").write_text(json.dumps(_no_nan(rep), indent=1))
        plot(dest / "real_policies.png", rep)
        demo_console().print(md)
        demo_console().print(f"results: {dest / 'results.md'}, plot: {dest / 'real_policies.png'}")
        reports[mode] = rep
    if len(reports) > 1:
        cmp = compare_modes(reports)
        (out / "comparison.md").write_text(comparison_markdown(cmp, command))
        (out / "comparison.json").write_text(json.dumps(_no_nan(cmp), indent=1))
        plot_comparison(out / "comparison.png", cmp)
        demo_console().print(comparison_markdown(cmp, command))
        demo_console().print(f"comparison: {out / 'comparison.md'}, plot: {out / 'comparison.png'}")
    return 0


# -- resume modes side by side -----------------------------------------------------------------------

CMP_FIGURES = (("prefill_steps", "prefill steps", ".0f"), ("prefill_tokens", "prefill tokens", ".0f"),
               ("prompt_tokens", "prompt tokens", ".0f"), ("resubmitted", "resubmitted", ".0f"),
               ("resumed_in_place", "resumed in place", ".0f"), ("busy_s", "engine busy s", ".1f"),
               ("prefill_s", "prefill steps' s", ".1f"))


def compare_modes(reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per policy and figure, each resume mode's mean over its runs and, against *idle* (else the first mode), the
    ratio of the means and the ratios of the runs paired by repetition (same tasks, same fleet seed); real U/β and
    response means beside."""
    modes = sorted(reports, key=lambda m: m != "idle")  # the behaviour before first: the ratios are to it
    base = modes[0]
    policies = [p for p in reports[base]["policies"] if all(p in r["policies"] for r in reports.values())]
    rows = []
    for p in policies:
        runs = {m: {x["rep"]: x for x in reports[m]["per_run"] if x["policy"] == p} for m in modes}
        row: dict[str, Any] = {"policy": p, "reps": sorted(set.intersection(*(set(r) for r in runs.values())))}
        for key, _, _ in CMP_FIGURES:
            for m in modes:
                row[f"{m}_{key}"] = _mean([runs[m][k]["engine"][key] for k in row["reps"]])
            for m in modes[1:]:
                row[f"{m}_{key}_ratio"] = _ratio(row[f"{m}_{key}"], row[f"{base}_{key}"])
                row[f"{m}_{key}_paired"] = [_ratio(runs[m][k]["engine"][key], runs[base][k]["engine"][key])
                                            for k in row["reps"]]
        for key in ("all_u", "resp_mean"):
            for m in modes:
                row[f"{m}_{key}"] = _mean([runs[m][k]["real"][key] for k in row["reps"]])
        rows.append(row)
    return {"modes": modes, "policies": policies, "rows": rows,
            "tasks": reports[base]["tasks"], "reps": reports[base]["reps"]}


def _mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.fmean(xs) if xs else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def comparison_markdown(cmp: dict[str, Any], command: str) -> str:
    modes, base = cmp["modes"], cmp["modes"][0]
    md = [f"# Resume modes side by side ({time.strftime('%Y-%m-%d %H:%M')})", "", f"Command: `{command}`", "",
          f"{cmp['tasks']} tasks, each policy {cmp['reps']} times per mode; the modes ran interleaved on one engine "
          "(same tasks, same fleet seed per repetition, mode order rotated per repetition). Resume modes "
          "(VllmEngine): *room*: a suspended generation stays in place while the batch has room and is resubmitted "
          "only when another needs the place; *idle*: in place only when nothing else is in the engine, "
          "resubmitted otherwise (the behaviour before). Prefill steps and tokens and busy time from the first "
          "arrival on; prompt tokens (every submission's prompt, cached or not) and resumes over the whole run; "
          f"means over the runs, and the ratio to *{base}* (of the means; per repetition in brackets).", ""]
    head = ["policy", "figure", *modes, *(f"{m} / {base}" for m in modes[1:])]
    md += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in cmp["rows"]:
        for key, name, spec in CMP_FIGURES:
            ratios = [f"{metrics.fmt(r[f'{m}_{key}_ratio'], '.2f')} "
                      f"({', '.join(metrics.fmt(x, '.2f') for x in r[f'{m}_{key}_paired'])})" for m in modes[1:]]
            cells = [metrics.fmt(r[f"{m}_{key}"], spec) for m in modes] + ratios
            md.append(f"| {r['policy']} | {name} | " + " | ".join(cells) + " |")
        md.append(f"| {r['policy']} | real all U/β | " + " | ".join(metrics.fmt(r[f'{m}_all_u'], '+.3f') for m in modes)
                  + " |" + " |" * (len(modes) - 1))
        md.append(f"| {r['policy']} | real resp mean s | "
                  + " | ".join(metrics.fmt(r[f'{m}_resp_mean'], '.2f') for m in modes) + " |" + " |" * (len(modes) - 1))
    return "\n".join(md) + "\n"


def plot_comparison(path: Path, cmp: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = (("prefill_steps", "prefill steps per run"), ("prefill_tokens", "prefill tokens per run"),
            ("busy_s", "engine busy s per run"))
    fig, axes = plt.subplots(1, len(figs), figsize=(4.3 * len(figs), 4))
    pols, modes = cmp["policies"], cmp["modes"]
    width = 0.8 / len(modes)
    for ax, (key, title) in zip(axes, figs, strict=True):
        for mi, m in enumerate(modes):
            xs = [i + (mi - (len(modes) - 1) / 2) * width for i in range(len(pols))]
            ax.bar(xs, [r[f"{m}_{key}"] for r in cmp["rows"]], width, label=f"resume: {m}")
        ax.set_xticks(range(len(pols)))
        ax.set_xticklabels(pols, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(f"vLLM on this CPU, {cmp['tasks']} tasks x {cmp['reps']} repetitions per mode", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _no_nan(x: Any) -> Any:
    """Strict JSON: NaN (no value, e.g. an interval from one repetition) as null."""
    if isinstance(x, float):
        return None if math.isnan(x) else x
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_no_nan(v) for v in x]
    return x


def demo_console() -> Any:
    from rich.console import Console

    return Console(highlight=False)
