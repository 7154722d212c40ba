"""``timelyllm-bench plan-lengths``: plan lengths learned per task against today's estimate.

    timelyllm-bench plan-lengths                       # recorded plans + simulator, ~2 min
    timelyllm-bench plan-lengths --loads 1 --seeds 1   # quicker

Two parts, one run:

1. **Prediction error on recorded plans.** Every plan a real engine wrote that the repository keeps, in the
   order it was written: the complete plans of ``bench/results/real_policies*/runs`` (the engine's own tokens)
   and the valid plans of ``bench/results/plan_quality/results.json`` (greedy and sampled at temperature 0.7,
   counted in the simulated engine's token pieces: the file keeps texts only). Each plan is cut into segments
   by the planner's own stop checker. Before each segment both estimators predict its tokens, then learn from
   it, as the planner does online: ``ewma`` (today: one running mean per robot type, PlannerCore before issue
   27) and ``learned`` (:class:`~timelyllm_ros.planner.lengths.PlanLengths`, mean and 10/90 % quantiles).
2. **Utility in the simulator.** The same workloads with ``CoreConfig.length_model`` ``ewma`` and ``learned``
   side by side: the real-policies replay (the real engine's plans and robot times, step model fitted to the
   other repetitions' steps, as ``real-policies`` does), and the WID 2 trace at fleet load factors with the
   template plans and with each job's plan drawn from the recorded plans of its task (lengths then vary within
   a task, as the real model's do). Reported as U/beta over all tasks (0 for a task not done).

No real-engine run: the learned estimate on the real engine is for a machine that has one.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from timelyllm_ros.domain.plans import plan_templates
from timelyllm_ros.domain.tuf import LEVELS
from timelyllm_ros.domain.types import TaskSpec
from timelyllm_ros.engines.sim_engine import SimEngineConfig, bpe_pieces
from timelyllm_ros.measure import metrics
from timelyllm_ros.planner.config import CoreConfig
from timelyllm_ros.planner.hooks import SkillHooks
from timelyllm_ros.planner.lengths import PlanLengths
from timelyllm_ros.sim.simulator import Replay, SimConfig, Simulator
from timelyllm_ros.sim.workloads import Job, Workload, load_workload

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("ewma", "learned")
# The simulator's variants: CoreConfig fields. "learned-mean": the learned model's mean for urgent tasks too (what
# the 90 % quantile urgent tasks plan with by default is worth).
VARIANTS: dict[str, dict[str, Any]] = {"ewma": {"length_model": "ewma"}, "learned": {"length_model": "learned"},
                                       "learned-mean": {"length_model": "learned", "length_quantile_urgent": 0.5}}
Q_LO, Q_HI = 0.1, 0.9


@dataclass
class Plan:
    """One recorded plan, cut into segments as the planner cuts it."""

    source: str
    robot_type: str
    task_type: str
    task_input: str
    level: str
    seg_tokens: list[int]
    seg_calls: list[bool]  # the segment has a skill call (today's estimate learns only from those)
    pieces: list[str]

    def spec(self) -> TaskSpec:
        return TaskSpec(robot_id="r", prompt=self.task_input, tuf=LEVELS[self.level], robot_type=self.robot_type,
                        task_type=self.task_type)


def segment(hooks: SkillHooks, robot_type: str, pieces: Sequence[str]) -> tuple[list[int], list[bool]]:
    """Token count and has-a-call of each segment, cut by the robot type's stop checker piece by piece."""
    chk = hooks.stop_checker(robot_type)
    toks, calls, n = [], [], 0
    for p in pieces:
        n += 1
        if chk.feed(p):
            text = chk.cut()
            toks.append(n)
            calls.append(bool(hooks.parse(robot_type, text)))
            n = 0
    rest = chk.pending_text
    if rest.strip():
        toks.append(n)
        calls.append(bool(hooks.parse(robot_type, rest)))
    return toks, calls


def recorded_plans(results: Path = RESULTS) -> dict[str, list[Plan]]:
    """The recorded plans by source, each in the order it was written."""
    hooks = SkillHooks(learn=False)
    by_name = {t.name: t for t in plan_templates().values()}
    out: dict[str, list[Plan]] = {"real engine (real_policies runs)": [], "sampled (plan_quality)": []}
    for folder in sorted(results.glob("real_policies*")):
        for f in sorted((folder / "runs").glob("rep*-*.json.gz")):
            with gzip.open(f, "rt") as fh:
                run = json.load(fh)
            pieces = run["replay"]["plan_pieces"]
            for r in sorted(run["records"], key=lambda r: r["arrival"]):
                tpl = by_name.get(r["task_type"])
                pcs = pieces.get(str(r["job_id"]))
                if r["status"] != "done" or tpl is None or not pcs:
                    continue
                toks, calls = segment(hooks, tpl.robot_type, pcs)
                if toks:
                    out["real engine (real_policies runs)"].append(
                        Plan(folder.name, tpl.robot_type, tpl.name, tpl.task_input, r["level"], toks, calls, pcs))
    pq = results / "plan_quality" / "results.json"
    if pq.exists():
        for run in json.loads(pq.read_text())["runs"].values():
            for row in run["rows"]:
                tpl = by_name.get(row["template"])
                if tpl is None:
                    continue
                for p in row["plans"]:
                    if not p["valid"]:
                        continue  # an invalid plan fails at its first bad segment: no length to learn
                    pcs = bpe_pieces(p["plan"])
                    toks, calls = segment(hooks, tpl.robot_type, pcs)
                    if toks:
                        out["sampled (plan_quality)"].append(Plan(f"plan_quality/{run['label']}", tpl.robot_type,
                                                                  tpl.name, tpl.task_input, row["level"], toks,
                                                                  calls, pcs))
    return out


def prediction_error(plans: Sequence[Plan], prior: dict[str, float]) -> dict[str, Any]:
    """Online: predict each segment (and, at segment 0, the whole plan) before learning it."""
    ewma = dict(prior)
    ewma_segs: dict[str, tuple[int, float]] = {}  # robot type -> (plans, mean segments): today's has none
    model = PlanLengths(prior)
    err: dict[str, list[float]] = {m: [] for m in MODELS}
    first: dict[str, list[float]] = {m: [] for m in MODELS}
    total: dict[str, list[float]] = {m: [] for m in MODELS}
    inside = above = urgent_under = urgent_n = 0
    ewma_under = 0
    for p in plans:
        spec = p.spec()
        rt = p.robot_type
        n_plans, mean_segs = ewma_segs.get(rt, (0, model.prior_segments))
        pred0 = model.predict(spec, 0)
        total["learned"].append(abs(pred0.rem_tokens_mean - sum(p.seg_tokens)))
        total["ewma"].append(abs(ewma.get(rt, 8.0) * mean_segs - sum(p.seg_tokens)))
        for k, (n, has_calls) in enumerate(zip(p.seg_tokens, p.seg_calls, strict=True)):
            pr = model.predict(spec, k)
            e_l, e_e = abs(pr.seg_mean - n), abs(ewma.get(rt, 8.0) - n)
            err["learned"].append(e_l)
            err["ewma"].append(e_e)
            if k == 0:
                first["learned"].append(e_l)
                first["ewma"].append(e_e)
            inside += pr.seg_quantile(Q_LO) <= n <= pr.seg_quantile(Q_HI)
            above += n > pr.seg_quantile(Q_HI)
            ewma_under += n > ewma.get(rt, 8.0)
            if p.level == "urgent":
                urgent_n += 1
                urgent_under += n > pr.seg_quantile(Q_HI)
            model.observe_segment(spec, k, n)
            if has_calls:
                ewma[rt] = 0.9 * ewma.get(rt, n) + 0.1 * n
        model.observe_plan(spec, p.seg_tokens)
        ewma_segs[rt] = (n_plans + 1, mean_segs + (len(p.seg_tokens) - mean_segs) / (n_plans + 1))
    segs = len(err["ewma"])
    return {"plans": len(plans), "segments": segs,
            "task_types": len({(p.robot_type, p.task_type) for p in plans}),
            "mae": {m: statistics.fmean(err[m]) for m in MODELS},
            "mae_first": {m: statistics.fmean(first[m]) for m in MODELS},
            "mae_total": {m: statistics.fmean(total[m]) for m in MODELS},
            "coverage_10_90": inside / segs, "above_q90": above / segs, "above_ewma": ewma_under / segs,
            "urgent_above_q90": urgent_under / urgent_n if urgent_n else math.nan,
            "seg_tokens_mean": statistics.fmean(n for p in plans for n in p.seg_tokens),
            "seg_tokens_sd": statistics.pstdev([n for p in plans for n in p.seg_tokens])}


# -- simulator ---------------------------------------------------------------------------------------

def _utility(records: Sequence[Any]) -> dict[str, float]:
    rows = {r.group: r for r in metrics.summarize(records)}
    out = {"all": rows["all"].utility_norm_all, "not_done": rows["all"].failed}
    for lvl in ("urgent", "normal"):
        r = rows.get(f"all {lvl}")
        out[lvl] = r.utility_norm_all if r is not None else math.nan
    return out


def _sim(wl: Workload, policy: str, seed: int, variant: str, engine: SimEngineConfig | None = None,
         replay: Replay | None = None) -> dict[str, float]:
    cfg = SimConfig(policy=policy, seed=seed, core=CoreConfig(**VARIANTS[variant]),
                    engine=engine or SimEngineConfig())
    return _utility(Simulator(wl, cfg, replay=replay).run().records)


def varied_replay(wl: Workload, pool: dict[str, list[list[str]]], seed: int) -> Replay:
    """Each job's plan drawn (seeded) from the recorded plans of its task; the template where none is."""
    rng = random.Random(f"plans-{seed}")
    rp = Replay()
    for j in wl.jobs:
        plans = pool.get(j.template.name)
        if plans:
            rp.plan_pieces[j.job_id] = list(rng.choice(plans))
    return rp


def real_replay_points(policies: Sequence[str], results: Path = RESULTS) -> list[dict[str, Any]]:
    """The real-policies runs replayed (their plans and robot times), each with both length models."""
    from bench.real_policies import fit_service_steps, load_runs, replay_from_json, serving_steps
    from timelyllm_ros.launch_graph import resolve_config

    src = results / "real_policies"
    runs = [r for r in load_runs(src) if r["policy"] in policies]
    jobs = [Job.from_json(d) for d in json.loads((src / "jobs.json").read_text())["jobs"]]
    base = SimEngineConfig.from_yaml(resolve_config("sim_engine_fitted_cpu.yaml"))
    reps = sorted({r["rep"] for r in runs})
    fits = {rep: fit_service_steps([s for r in runs if r["rep"] != rep or len(reps) == 1
                                    for s in serving_steps(r)], base) for rep in reps}
    wl = Workload("real-policies", jobs)
    out = []
    for run in runs:
        rp = replay_from_json(run["replay"])
        out.append({"scenario": "real replay", "policy": run["policy"], "x": run["rep"],
                    **{m: _sim(wl, run["policy"], run["rep"], m, fits[run["rep"]], rp) for m in VARIANTS}})
    return out


def wid2_points(policies: Sequence[str], loads: Sequence[float], seeds: Sequence[int],
                pool: dict[str, list[list[str]]]) -> list[dict[str, Any]]:
    from bench.common import jitter, scale_fleet

    base = load_workload("wid2")
    out = []
    for load in loads:
        for seed in seeds:
            wl = jitter(scale_fleet(base, load, seed), 0.02, seed)
            rp = varied_replay(wl, pool, seed)
            for pol in policies:
                for scen, replay in (("wid2 templates", None), ("wid2 recorded plans", rp)):
                    out.append({"scenario": scen, "policy": pol, "x": load, "seed": seed,
                                **{m: _sim(wl, pol, seed, m, None, replay) for m in VARIANTS}})
    return out


def summarize(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (scenario, policy, x): mean U/beta of each model over seeds, the ratio and the paired difference."""
    groups: dict[tuple[str, str, Any], list[dict[str, Any]]] = {}
    for p in points:
        x = "all reps" if p["scenario"] == "real replay" else p["x"]
        groups.setdefault((p["scenario"], p["policy"], x), []).append(p)
    rows = []
    for (scen, pol, x), ps in groups.items():
        row: dict[str, Any] = {"scenario": scen, "policy": pol, "x": x, "runs": len(ps)}
        for lvl in ("all", "urgent", "normal"):
            for v in VARIANTS:
                row[f"{v}_{lvl}"] = statistics.fmean(p[v][lvl] for p in ps)
            e, learned = row[f"ewma_{lvl}"], row[f"learned_{lvl}"]
            row[f"diff_{lvl}"] = learned - e
            row[f"ratio_{lvl}"] = learned / e if e > 0 else math.nan
            # paired per run: the learned model never worse than ewma in how many of the runs
            row[f"not_worse_{lvl}"] = sum(p["learned"][lvl] >= p["ewma"][lvl] - 1e-12 for p in ps)
        for v in VARIANTS:
            row[f"{v}_not_done"] = statistics.fmean(p[v]["not_done"] for p in ps)
        rows.append(row)
    return rows


# -- report --------------------------------------------------------------------------------------------

def _f(x: float, d: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def markdown(rep: dict[str, Any], command: str) -> str:
    lines = ["# Plan lengths learned per task", "", f"Command: `{command}`  ", f"git: {rep['git']}, "
             f"wall {rep['wall_s']:.0f} s. Simulator only: no real-engine run in this report.", "",
             "## Prediction error on recorded plans (online: predict, then learn)", "",
             "Tokens of the next segment: mean absolute error of `ewma` (today: one running mean per robot type) "
             "and `learned` (its mean); coverage of the learned 10-90 % interval; share of segments longer than "
             "the estimate planned with (`ewma`, and the learned 90 % quantile urgent tasks plan with). "
             "Whole plan at segment 0: `ewma` x the robot type's mean segment count against the learned "
             "remaining-token mean.", "",
             "| recorded plans | plans | segments | task types | MAE ewma | MAE learned | MAE seg 0 ewma / learned "
             "| MAE plan ewma / learned | 10-90 % coverage | > ewma | > q90 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, e in rep["prediction"].items():
        if not e.get("plans"):
            continue
        lines.append(f"| {name} | {e['plans']} | {e['segments']} | {e['task_types']} | {_f(e['mae']['ewma'], 2)} | "
                     f"{_f(e['mae']['learned'], 2)} | {_f(e['mae_first']['ewma'], 2)} / "
                     f"{_f(e['mae_first']['learned'], 2)} | {_f(e['mae_total']['ewma'], 1)} / "
                     f"{_f(e['mae_total']['learned'], 1)} | {_f(e['coverage_10_90'], 2)} | "
                     f"{_f(e['above_ewma'], 2)} | {_f(e['above_q90'], 2)} |")
    lines += ["", "## Utility in the simulator (U/beta, all tasks; 0 for a task not done)", "",
              "x: the repetition set (real replay) or the fleet load factor (WID 2); ratio = learned / ewma, "
              "diff = learned - ewma, averaged over runs.", "",
              "`learned-mean`: the learned model with the mean for urgent tasks too (no 90 % quantile). "
              "`runs >=`: runs where learned was not worse than ewma (all tasks).", "",
              "| scenario | policy | x | runs | all ewma | all learned | ratio | diff | runs >= | all learned-mean "
              "| urgent ewma -> learned | normal ewma -> learned | not done ewma -> learned |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rep["utility"]:
        lines.append(f"| {r['scenario']} | {r['policy']} | {r['x']} | {r['runs']} | {_f(r['ewma_all'])} | "
                     f"{_f(r['learned_all'])} | {_f(r['ratio_all'])} | {r['diff_all']:+.3f} | {r['not_worse_all']} | "
                     f"{_f(r['learned-mean_all'])} | "
                     f"{_f(r['ewma_urgent'])} -> {_f(r['learned_urgent'])} | {_f(r['ewma_normal'])} -> "
                     f"{_f(r['learned_normal'])} | {r['ewma_not_done']:.1f} -> {r['learned_not_done']:.1f} |")
    return "\n".join(lines) + "\n"


def plot(path: Path, rep: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [1, 2]})
    names = [n for n, e in rep["prediction"].items() if e.get("plans")]
    xs = range(len(names))
    for i, m in enumerate(MODELS):
        a1.bar([x + (i - 0.5) * 0.38 for x in xs], [rep["prediction"][n]["mae"][m] for n in names], 0.38, label=m)
    a1.set_xticks(list(xs), [n.split(" (")[0] for n in names])
    a1.set_ylabel("next-segment tokens, MAE")
    a1.set_title("prediction error on recorded plans")
    a1.legend()
    rows = rep["utility"]
    labels = [f"{r['scenario']}\n{r['policy']} x{r['x']}" for r in rows]
    xs = range(len(rows))
    for i, m in enumerate(("learned", "learned-mean")):
        a2.bar([x + (i - 0.5) * 0.38 for x in xs], [r[f"{m}_all"] - r["ewma_all"] for r in rows], 0.38,
               label=f"{m} - ewma")
    a2.axhline(0.0, color="k", lw=0.8)
    a2.set_xticks(list(xs), labels, rotation=60, ha="right", fontsize=7)
    a2.set_ylabel("U/beta (all tasks), difference to ewma")
    a2.set_title("simulator: utility with the learned lengths, against today's estimate")
    a2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _git() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10).stdout.strip() + " (+ working tree)"
    except (OSError, subprocess.SubprocessError):
        return "?"


def cmd_plan_lengths(args: argparse.Namespace) -> int:
    from bench.common import print_table

    t0 = time.perf_counter()
    out = Path(args.out) if args.out else RESULTS / "plan_lengths"
    out.mkdir(parents=True, exist_ok=True)
    policies = [p for p in args.policies.split(",") if p]
    loads = [float(x) for x in args.loads.split(",") if x]
    seeds = list(range(args.seeds))
    plans = recorded_plans()
    prior = CoreConfig().segment_tokens_prior
    prediction = {name: prediction_error(ps, prior) if ps else {"plans": 0} for name, ps in plans.items()}
    pool: dict[str, list[list[str]]] = {}
    for ps in plans.values():
        for p in ps:
            pool.setdefault(p.task_type, []).append(p.pieces)
    points = [] if args.no_replay else real_replay_points(policies)
    points += wid2_points(policies, loads, seeds, pool)
    rep = {"git": _git(), "command": "timelyllm-bench " + " ".join(sys.argv[1:]), "prediction": prediction,
           "utility": summarize(points), "points": points, "policies": policies, "loads": loads, "seeds": seeds}
    rep["wall_s"] = time.perf_counter() - t0
    print_table("next-segment tokens: prediction error on recorded plans",
                ["plans", "segments", "MAE ewma", "MAE learned", "10-90% cov", "> ewma", "> q90"],
                [[n, str(e["segments"]), _f(e["mae"]["ewma"], 2), _f(e["mae"]["learned"], 2),
                  _f(e["coverage_10_90"], 2), _f(e["above_ewma"], 2), _f(e["above_q90"], 2)]
                 for n, e in prediction.items() if e.get("plans")])
    print_table("simulator: U/beta all tasks, ewma vs learned",
                ["scenario", "policy", "x", "ewma", "learned", "ratio", "diff", "runs >=", "learned-mean"],
                [[r["scenario"], r["policy"], str(r["x"]), _f(r["ewma_all"]), _f(r["learned_all"]),
                  _f(r["ratio_all"]), f"{r['diff_all']:+.3f}", f"{r['not_worse_all']}/{r['runs']}",
                  _f(r["learned-mean_all"])] for r in rep["utility"]])
    (out / "results.json").write_text(json.dumps(rep, indent=1, default=str))
    (out / "results.md").write_text(markdown(rep, rep["command"]))
    plot(out / "plan_lengths.png", rep)
    print(f"results: {out / 'results.md'}, plot: {out / 'plan_lengths.png'}")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan-lengths", help="plan lengths learned per task vs today's per-robot-type estimate: "
                                            "prediction error on recorded plans, utility in the simulator")
    p.add_argument("--policies", default="pud-shed,pud", help="comma list (default %(default)s)")
    p.add_argument("--loads", default="1,2,3", help="WID 2 fleet load factors (default %(default)s)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per WID 2 load (default %(default)s)")
    p.add_argument("--no-replay", action="store_true", help="skip the real-policies replay")
    p.add_argument("--out", default="", help="results folder (default bench/results/plan_lengths)")
    p.set_defaults(fn=cmd_plan_lengths)

