"""An urgent task's first segment alone, and when it comes with 9 normal tasks.

    python -m bench.urgent_burst [--reps 3] [--policies pud-shed,edf-seg,fcfs-stream,fcfs] [--out DIR]

The planner's core on the real engine of ``--engine`` (default the CPU config), real clock, no ROS: the
same ``PlannerCore``, prompts, grammar and warm-up as the planner node. Three arrivals per policy and
repetition, timed from the urgent goal's arrival at the core to its first segment:

* ``alone``: the urgent task on an idle engine;
* ``together``: the urgent task and 9 normal tasks in the same instant (the urgent one submitted last);
* ``after``: the 9 normal tasks, then the urgent one ``--lag-ms`` later from another thread (as a goal
  reaches the node), while the engine steps on their prompts;
* ``five`` (``--scenarios``, not run by default): 5 urgent tasks in the same instant, as the WID 2 trace's events
  bring them; each one's first segment, in the order they came (``five #1`` .. ``five #5``).

Every task's scene names an object of its own (``marker_<n>``), so no task finds another's turn in the
prefix cache. Writes ``results.md``, ``results.json`` and ``urgent_burst.png``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import threading
import time
from pathlib import Path

from timelyllm_ros.domain.clock import RealClock
from timelyllm_ros.domain.plans import plan_templates
from timelyllm_ros.domain.tuf import LEVELS
from timelyllm_ros.domain.types import TaskSpec
from timelyllm_ros.engines.factory import planner_engine
from timelyllm_ros.engines.latency import LatencyEstimator
from timelyllm_ros.engines.prompts import PromptRenderer
from timelyllm_ros.planner.admission import LatencyGuided, make_admission
from timelyllm_ros.planner.core import PlannerCore
from timelyllm_ros.planner.policies import make_policy
from timelyllm_ros.planner.warmup import warm_up

SCENARIOS = ("alone", "together", "after", "five")
DEFAULT_SCENARIOS = "alone,together,after"
FIVE = 5


def _tasks() -> tuple[list, list]:
    tpl = [t for t in plan_templates().values() if t.robot_type == "drone"]
    urgent = [t for t in tpl if t.level == "urgent"]
    normal = [t for t in tpl if t.level != "urgent"]
    return urgent, normal


def _text(task_input: str, n: int) -> str:
    """The task with a scene object of its own, so its turn is never in the prefix cache."""
    scene, sep, rest = task_input.partition("] Task:")
    objs = scene.removeprefix("Scene: [").strip()
    marker = f"marker_{n} x:0.10 y:0.10 width:0.05 height:0.05"
    return f"Scene: [{marker}{', ' + objs if objs else ''}{sep}{rest}"


class Run:
    def __init__(self, engine, renderer: PromptRenderer, policy: str, budget_s: float | str | None,
                 estimator: LatencyEstimator, admission: str = "auto") -> None:
        self.first: dict[str, float] = {}
        pol = make_policy(policy)
        # budget_s: "default" = the admission the planner uses (LatencyGuided's default budget), None = no budget
        adm: str | LatencyGuided = admission
        if budget_s != "default" and pol.segmented:
            adm = make_admission(admission, segmented=True)
            adm.prefill_step_s = budget_s
        self.core = PlannerCore(engine, pol, RealClock(), admission=adm, on_segment=self._on_segment,
                                estimator=estimator)
        self.renderer = renderer
        self.submitted: list[str] = []

    def _on_segment(self, result, seg) -> None:
        self.first.setdefault(result.task_id, time.monotonic())

    def submit(self, tid: str, robot: str, text: str, level: str) -> float:
        ids, extra = self.renderer.render("drone", text)
        now = self.core.clock.now()
        self.submitted.append(tid)
        self.core.submit(TaskSpec(robot, text, LEVELS[level], task_id=tid, prompt_token_ids=ids, extra=extra,
                                  arrival=now))
        return time.monotonic()

    def until(self, tid: str, limit_s: float = 20.0) -> None:
        end = time.monotonic() + limit_s
        while tid not in self.first and self.core.result(tid) is None and time.monotonic() < end:
            self.core.run_once()
        if tid not in self.first:
            r = self.core.result(tid)
            print(f"[urgent_burst] no first segment: {r.status.name} {r.reason}" if r else
                  "[urgent_burst] no first segment within the limit", flush=True)

    def drain(self) -> None:
        """End every task (no robot ever reports here) and let the engine finish the aborts."""
        for tid in self.submitted:
            self.core.cancel(tid, "benchmark: next arrival")
        self.submitted.clear()
        while self.core.engine.has_work():
            self.core.run_once()


def _arrive(arrived: list[float], run: Run, uid: str, robot: str, text: str) -> None:
    arrived.append(run.submit(uid, robot, text, "urgent"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="engine_vllm_cpu.yaml")
    ap.add_argument("--policies", default="pud-shed,edf-seg,fcfs-stream,fcfs")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lag-ms", type=float, default=30.0)
    ap.add_argument("--prefill-step-ms", default="default",
                    help="comma list: admission's prefill budget per step (LatencyGuided prefill_step_s; "
                         "'default' = the planner's, 'off' = none), each run side by side; only the segmented "
                         "policies use it")
    ap.add_argument("--admissions", default="auto",
                    help="comma list of admissions (make_admission: auto, adaptive-ert, adaptive-tuf, ...), each run "
                         "side by side; only the segmented policies use them")
    ap.add_argument("--scenarios", default=DEFAULT_SCENARIOS, help=f"comma list of {', '.join(SCENARIOS)}")
    ap.add_argument("--out", default="bench/results/urgent_burst")
    args = ap.parse_args()
    scenarios = [x for x in args.scenarios.split(",") if x]
    if bad := [x for x in scenarios if x not in SCENARIOS]:
        ap.error(f"--scenarios: unknown {', '.join(bad)} (choose from {', '.join(SCENARIOS)})")
    admissions = [a for a in args.admissions.split(",") if a]
    for a in admissions or [""]:
        try:
            make_admission(a, segmented=True)
        except ValueError as e:
            ap.error(f"--admissions: {e}")
    engine, constrained = planner_engine(args.engine)
    renderer = PromptRenderer(engine, constrained=constrained)
    urgent, normal = _tasks()
    policies = args.policies.split(",")
    seq = itertools.count()
    rows: list[dict] = []
    budgets = [None if b == "off" else b if b == "default" else float(b) / 1000
               for b in args.prefill_step_ms.split(",")]
    configs = [(p, b, a) for p in policies for b in budgets for a in admissions
               if (b == "default" and a == admissions[0]) or make_policy(p).segmented]
    prompts, burst = renderer.warm_up_prompts(["drone"])
    warmed = False
    # One step-time estimate for every run, learned as a long-running planner's is (a fresh one starts from
    # the engine's fitted step model); repetition -1 only teaches it and is not reported.
    estimator = LatencyEstimator.for_engine(engine)
    for rep in range(-1, args.reps):
        for pol, budget, adm in configs:
            run = Run(engine, renderer, pol, budget, estimator, adm)
            label = (pol if budget == "default" or not make_policy(pol).segmented else
                     f"{pol} no prefill budget" if budget is None else f"{pol} prefill<={budget * 1000:g}ms")
            if adm != admissions[0] and make_policy(pol).segmented:
                label += f" {adm}"
            if not warmed:  # one engine for every run: the prefix cache holds the shared prompts throughout
                warm_up(run.core, prompts, burst, extra=renderer.warm_up_extra)
                warmed = True
            else:  # what the planner's warm-up tells its core (shedding's best case counts on the cache hit)
                for rt, ids in prompts:
                    run.core.note_warm_prompt(rt, ids)
            for sc in scenarios:
                if sc == "five":
                    rows += _five(run, urgent, seq, rep, label)
                    run.drain()
                    continue
                u = urgent[rep % len(urgent)]  # the same task in each arrival of a repetition
                n0 = next(seq)
                uid = f"u{n0}"
                utext = _text(u.task_input, next(seq))
                if sc != "alone":
                    for j, t in enumerate(normal[:9]):
                        run.submit(f"n{n0}-{j}", f"drone_n{n0}_{j}", _text(t.task_input, next(seq)), "normal")
                if sc == "after":  # the urgent goal arrives on another thread, as in the node, mid-step
                    arrived: list[float] = []
                    timer = threading.Timer(args.lag_ms / 1000, _arrive,
                                            (arrived, run, uid, f"drone_u{n0}", utext))
                    timer.start()
                    while not arrived:
                        run.core.run_once()
                    t0 = arrived[0]
                else:
                    t0 = run.submit(uid, f"drone_u{n0}", utext, "urgent")
                run.until(uid)
                ms = (run.first[uid] - t0) * 1000 if uid in run.first else float("nan")
                if rep >= 0:
                    rows.append({"rep": rep, "policy": label, "scenario": sc, "task": u.name,
                                 "first_segment_ms": ms})
                print(f"[urgent_burst] rep {rep} {label:28s} {sc:9s} {u.name:20s} {ms:7.0f} ms", flush=True)
                run.drain()
    engine.close()
    _report(rows, args, estimator.describe())


def _five(run: Run, urgent: list, seq: itertools.count, rep: int, label: str) -> list[dict]:
    """``five``: FIVE urgent tasks in the same instant; their first segments in the order they came."""
    t0 = {}
    for i in range(FIVE):
        n = next(seq)
        t0[f"u{n}"] = run.submit(f"u{n}", f"drone_u{n}", _text(urgent[i % len(urgent)].task_input, next(seq)), "urgent")
    for uid in t0:
        run.until(uid)
    ms = sorted((run.first[u] - t0[u]) * 1000 if u in run.first else float("inf") for u in t0)
    print(f"[urgent_burst] rep {rep} {label:28s} five      " + " ".join(f"{x:.0f}" for x in ms), flush=True)
    if rep < 0:
        return []
    return [{"rep": rep, "policy": label, "scenario": f"five #{i + 1}", "task": "five urgent",
             "first_segment_ms": x if x != float("inf") else float("nan")} for i, x in enumerate(ms)]


def _five_utility(rows: list[dict]) -> list[str]:
    """The five urgent tasks' mean U/beta under the paper's urgent TUF, per run (a shed task earns 0)."""
    tuf = LEVELS["urgent"]
    per: dict[str, dict[int, list[float]]] = {}
    for r in rows:
        if r["scenario"].startswith("five #"):
            x = r["first_segment_ms"]
            u = 0.0 if x != x else tuf.tuf0(x / 1000) / tuf.beta
            per.setdefault(r["policy"], {}).setdefault(r["rep"], []).append(u)
    if not per:
        return []
    out = ["", "The five urgent tasks' U/beta (mean of the 5; a task with no segment earns 0), median over runs "
           "(each run's value in brackets):", "", "| policy | five U/beta |", "|---|---|"]
    for p, reps in per.items():
        means = [statistics.mean(v) for _, v in sorted(reps.items())]
        out.append(f"| {p} | {statistics.median(means):+.3f} ({', '.join(f'{m:+.3f}' for m in means)}) |")
    return out


def _report(rows: list[dict], args: argparse.Namespace, est: dict) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    cols = list(dict.fromkeys(r["scenario"] for r in rows))
    table: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        table.setdefault((r["policy"], r["scenario"]), []).append(r["first_segment_ms"])
    lines = ["# An urgent task's first segment: alone, with 9 normal tasks at once, and 9 already prefilling", "",
             f"Command: `python -m bench.urgent_burst --reps {args.reps} --policies {args.policies} "
             f"--lag-ms {args.lag_ms:g} --prefill-step-ms {args.prefill_step_ms}"
             + ("" if args.scenarios == DEFAULT_SCENARIOS else f" --scenarios {args.scenarios}")
             + ("" if args.admissions == "auto" else f" --admissions {args.admissions}")
             + f" --out {args.out}`", "",
             "Median ms from the urgent goal's arrival at the core to its first segment (each run's value in "
             "brackets; *no segment*: the policy shed the task, or none came within 20 s). The paper's urgent "
             "TUF: full utility within 200 ms, none at 500 ms.", "",
             "| policy | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for p in policies:
        cells = []
        for sc in cols:
            v = table.get((p, sc), [])
            ok = [x for x in v if x == x]
            runs = ", ".join(f"{x:.0f}" if x == x else "no segment" for x in v)
            cells.append(f"{statistics.median(ok):.0f} ({runs})" if ok else f"- ({runs})")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    lines += _five_utility(rows)
    lines += ["", f"The step-time estimate admission and shedding ran on, at the end (seeded from {est['seed']}): "
              f"decode {est['decode_ms_b1']:.1f} ms a token at batch 1, prefill {est['prefill_ms_per_token']:.3f} ms "
              f"a prompt token ({est['decode_samples']} decode and {est['prefill_samples']} prefill steps kept)."]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps({"args": vars(args), "runs": rows, "estimate": est}, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(policies)), 3.8))
    w = 0.8 / len(cols)
    for i, sc in enumerate(cols):
        ax.bar([k + i * w for k in range(len(policies))],
               [statistics.median([x for x in table.get((p, sc), []) if x == x] or [float("nan")])
                for p in policies], w, label=sc)
    ax.axhline(200, color="k", ls="--", lw=0.8, label="urgent ERT (200 ms)")
    ax.set_xticks([k + w for k in range(len(policies))], [p.replace(" ", "\n") for p in policies], fontsize=8)
    ax.set_ylabel("urgent first segment (ms, median)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "urgent_burst.png", dpi=120)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
