"""``timelyllm-bench diagnose``: why PUD and EDF end up alike, and where urgent utility is lost.

Three experiments on one workload, all with the default (adaptive) admission:

1. *Ordering vs admission*: PUD runs the workload; at every decision the same
   candidates are also ranked by EDF, and we count how often the two orders
   differ and how often the generations PUD admitted differ from the
   same number of EDF's best (and whether they differ in urgency level).
2. *Urgent-only bound*: the workload with its normal tasks removed, so no
   normal prefill or decode ever shares a step with an urgent task: an upper
   bound on what any ordering or admission can give urgent tasks under the
   same engine cost model.
3. *Loss decomposition* (PUD): the urgent utility lost (1 - U/beta, summed),
   split into the part spent queued before the generation started (capped at
   the lateness past ERT) and the rest; plus the loss of the first event
   (cold prefix cache).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from timelyllm_ros.measure import metrics
from timelyllm_ros.planner.admission import Admission, AdmissionView, make_admission
from timelyllm_ros.planner.policies import Policy, RankContext, make_policy
from timelyllm_ros.sim.simulator import SimConfig, Simulator
from timelyllm_ros.sim.workloads import Workload, load_workload


class _ShadowPolicy(Policy):
    """Delegates to ``main``; records, once per decision time, the candidates and both rankings."""

    def __init__(self, main: Policy, shadow: Policy) -> None:
        self.main, self.shadow = main, shadow
        self.name, self.segmented, self.streams = main.name, main.segmented, main.streams
        self.log: dict[float, tuple[list[str], list[str], dict[str, float]]] = {}

    def priorities(self, gens: Sequence[Any], now: float, ctx: RankContext) -> list[float]:
        pri = self.main.priorities(gens, now, ctx)
        if now not in self.log and len(gens) > 1:
            sh = self.shadow.priorities(gens, now, ctx)
            ids = [g.task_id for g in gens]
            order_main = [ids[i] for i in sorted(range(len(ids)), key=lambda i: -pri[i])]
            order_shadow = [ids[i] for i in sorted(range(len(ids)), key=lambda i: -sh[i])]
            self.log[now] = (order_main, order_shadow, {g.task_id: g.ert for g in gens})
        return pri


class _RecordingAdmission(Admission):
    def __init__(self, inner: Admission) -> None:
        self.inner, self.name = inner, inner.name
        self.admitted: dict[float, list[str]] = {}

    def admit(self, view: AdmissionView, cand: Any) -> bool:
        ok = self.inner.admit(view, cand)
        if ok:
            self.admitted.setdefault(view.now, []).append(cand.task_id)
        return ok

    def max_batch(self) -> int:
        return self.inner.max_batch()


def _cfg(args: argparse.Namespace, policy: str) -> SimConfig:
    cfg = SimConfig(policy=policy, admission="adaptive", seed=args.seed, prompt_context_tokens=args.context_tokens,
                    prompt_shared_tokens=max(0, 2884 - args.context_tokens))
    cfg.core.resume_lead_s = args.resume_lead
    return cfg


def ordering_vs_admission(wl: Workload, args: argparse.Namespace) -> dict[str, int]:
    pol = _ShadowPolicy(make_policy("pud"), make_policy("edf-seg"))
    adm = _RecordingAdmission(make_admission("adaptive"))
    Simulator(wl, _cfg(args, "pud"), policy=pol, admission=adm).run()
    out = {"decisions_with_2plus_candidates": len(pol.log), "order_differs": 0, "admitted_set_differs": 0,
           "admitted_levels_differ": 0}
    for now, (om, oe, ert) in pol.log.items():
        picked = [t for t in adm.admitted.get(now, []) if t in ert]
        out["order_differs"] += om != oe
        k = len(picked)
        if set(picked) != set(oe[:k]):
            out["admitted_set_differs"] += 1
            out["admitted_levels_differ"] += sorted(ert[t] for t in picked) != sorted(ert[t] for t in oe[:k])
    return out


def urgent_only_bound(wl: Workload, args: argparse.Namespace) -> dict[str, float]:
    only = Workload(wl.name + "-urgent-only", [j for j in wl.jobs if j.time_utility.level == "urgent"], wl.config)
    out = {}
    for p in ("edf-seg", "pud"):
        r = Simulator(only, _cfg(args, p), policy=make_policy(p)).run()
        out[p] = next(s.utility_norm for s in metrics.summarize(r.records) if s.group == "all urgent")
    return out


def loss_decomposition(wl: Workload, args: argparse.Namespace) -> dict[str, float]:
    sim = Simulator(wl, _cfg(args, "pud"), policy=make_policy("pud"))
    r = sim.run()
    urgent = [rec for rec in r.records if rec.level == "urgent" and rec.segments]
    first_event = min(rec.arrival for rec in r.records)
    total = queued = cold = 0.0
    for rec in urgent:
        loss = 1.0 - rec.utility() / rec.beta
        total += loss
        res = sim.core.result(f"j{rec.job_id}")
        q = res.segments[0].gen_start - rec.arrival if res is not None and res.segments else 0.0
        late = max(0.0, rec.segments[0].start - rec.tuf.deadline(0, rec.arrival))  # s_0 past its deadline
        queued += min(q, late) * -rec.alpha / rec.beta
        if rec.arrival - first_event < 0.05:
            cold += loss
    n = len(urgent)
    return {"urgent_tasks": n, "mean_utility_norm": 1 - total / n if n else float("nan"), "loss_total": total,
            "loss_queued_before_start": queued, "loss_first_event_cold_cache": cold}


def cmd_diagnose(args: argparse.Namespace) -> int:
    wl = load_workload(args.workload, seed=args.seed)
    a = ordering_vs_admission(wl, args)
    b = urgent_only_bound(wl, args)
    c = loss_decomposition(wl, args)
    lines = [f"# diagnose {wl.name} ({len(wl.jobs)} tasks, context tokens {args.context_tokens})", "",
             f"Command: `timelyllm-bench diagnose --workload {args.workload}`", "",
             "## 1. PUD vs EDF: ordering vs admission (PUD run, EDF ranking of the same candidates)", "",
             "| decisions with >= 2 candidates | order differs | admitted set differs | "
             "admitted urgency levels differ |", "|---|---|---|---|",
             f"| {a['decisions_with_2plus_candidates']} | {a['order_differs']} | {a['admitted_set_differs']} | "
             f"{a['admitted_levels_differ']} |", "",
             "## 2. Urgent-only bound (normal tasks removed; same engine cost model)", "",
             "| policy | urgent U/beta |", "|---|---|", *(f"| {p} | {u:.3f} |" for p, u in b.items()), "",
             "## 3. PUD urgent loss (sum of 1 - U/beta over urgent tasks)", "",
             "| urgent tasks | mean U/beta | loss total | queued before start | first event (cold cache) |",
             "|---|---|---|---|---|",
             f"| {c['urgent_tasks']} | {c['mean_utility_norm']:.3f} | {c['loss_total']:.1f} | "
             f"{c['loss_queued_before_start']:.1f} | {c['loss_first_event_cold_cache']:.1f} |", ""]
    text = "\n".join(lines)
    print(text)
    out = Path(args.out) if args.out else Path(__file__).resolve().parents[1] / "bench" / "results" / (
        f"diagnose-{args.workload}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text(text)
    print(f"results in {out}")
    return 0
