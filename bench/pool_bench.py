"""``timelyllm-bench pool``: one vLLM server vs a pool of two vs the in-process engine, and the simulator's
projection for 1, 2, 4 and 8 GPU servers.

    timelyllm-bench pool                      # both parts (the real one starts two `vllm serve`, ~6 min)
    timelyllm-bench pool --skip-real          # the projection only (~5 min)
    timelyllm-bench pool --skip-sim --events 2 --per-event 6 --repeats 1   # a shorter real part

**Real part** (this machine, CPU): the same drone tasks (the first ``--events`` arrival events of the published
WID 2 trace, at most ``--per-event`` tasks each, TUF time axis x5 as in the demo for a CPU engine) go through
the ROS planner (PlannerCore, policy pud) and the simulated fleet in real time, exactly as the fleet demo
runs them (:func:`timelyllm_ros.demo.run_policy`: robots execute segments with the project's execution-time
model), three times: (a) the in-process vLLM engine (config/engine_vllm_cpu.yaml), (b) one ``vllm serve``
(config/engine_remote.yaml), (c) a pool of two (config/engine_pool_remote.yaml). The servers are started by
devtools/vllm_server.py with the in-process config's settings (batch 8). Every server shares this machine's
cores with the others and with the planner, so (c) cannot be faster than (b) here: the part shows that the
pool works end to end and what the HTTP path and the pool cost, not a scale-out gain.

**Projection**: an :class:`EnginePool` of N :class:`SimEngine` members, each with the default
:class:`SimEngineConfig` (the paper's GPU step model, Table 1: 22 ms decode step, 0.11 ms per prefill token;
``--engine-config`` for another), in the discrete-event simulator (same core, pud, latency-guided admission)
on the WID 2 trace with every arrival time divided by each of ``--loads`` (bench/load_sweep.py's scaling), each
member's batch capacity ``--member-batch`` (8 as config/engine_pool_remote.yaml sets it, 256 as vLLM's default),
``--seeds`` repetitions (robot sampling and prompt contexts; ``--jitter-ms`` also moves each arrival event), mean
+- 95 % CI. The pool works under the virtual clock as it is: an in-process member is always ready, so no
``step_wait_s`` is spent, and the pool's step reports the longest member's modelled duration (its own wall time
is microseconds). It steps its members together, so the clock advances by one step of the slowest member: a
member with a short step waits for one in a long prefill. ``lockstep idle`` measures that share of the members'
time; the projection is conservative for N > 1 by about that much.

Results: a table per part; results.json, results.md, pool_projection.png and pool_real.png in ``--out``
(default bench/results/pool). A part that is skipped keeps its previous results in results.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    SCALE_DOC,
    SCALINGS,
    add_scale_argument,
    ci_cell,
    jitter,
    md_table,
    mean_ci,
    print_table,
    progress,
    results_root,
    truncate,
)
from timelyllm_ros.engines.base import Engine, StepReport
from timelyllm_ros.engines.pool import EnginePool
from timelyllm_ros.engines.sim_engine import SimEngine, SimEngineConfig
from timelyllm_ros.measure import metrics
from timelyllm_ros.measure.records import TaskRecord
from timelyllm_ros.sim.simulator import SimConfig, Simulator
from timelyllm_ros.sim.workloads import Workload, load_workload

DEFAULT_SERVERS = "1,2,4,8"
DEFAULT_MEMBER_BATCH = "8,256"
DEFAULT_LOADS = "3,6"
REAL_CONFIGS = ("in-process", "remote x1", "pool x2")
SERVED_NAME = "SmolLM2-135M-Instruct"
MAX_NUM_SEQS = "8"  # the servers take the in-process config's batch (engine_vllm_cpu.yaml max_num_seqs)


class _Member(SimEngine):
    """A simulated server that keeps the modelled duration of its latest step (for the lockstep figure)."""

    last_s = 0.0
    steps = 0

    def step(self) -> StepReport:
        rep = super().step()
        self.last_s, self.steps = rep.duration_s, self.steps + 1
        return rep


class SimPool(EnginePool):
    """A pool of simulated members, with the token totals the simulator reports for its one SimEngine.

    The pool steps its busy members together and its step lasts as long as the longest member's, so under
    the simulator's clock a member with a short step idles until the others finish. ``lockstep_idle_s`` sums
    that idle time, ``member_busy_s`` the members' own step time: their ratio says how much the projection
    understates N servers that would each run at their own pace."""

    def __init__(self, members: Sequence[SimEngine], **kw: Any) -> None:
        super().__init__(members, **kw)
        self.sim_members = list(members)
        self.lockstep_idle_s = self.member_busy_s = 0.0

    def step(self) -> StepReport:
        before = [getattr(m, "steps", 0) for m in self.sim_members]
        rep = super().step()
        stepped = [m.last_s for m, n in zip(self.sim_members, before, strict=True) if getattr(m, "steps", 0) > n]
        if stepped:
            self.lockstep_idle_s += sum(max(stepped) - d for d in stepped)
            self.member_busy_s += sum(stepped)
        # the modelled time only: the pool's own wall time (Python, microseconds) would advance the simulated
        # clock by however fast this machine is, and a pool of one would drift from the lone engine
        return dataclasses.replace(rep, duration_s=max(stepped, default=0.0))

    @property
    def total_prefill_tokens(self) -> int:
        return sum(m.total_prefill_tokens for m in self.sim_members)

    @property
    def total_decode_tokens(self) -> int:
        return sum(m.total_decode_tokens for m in self.sim_members)


def _row(records: Sequence[TaskRecord], group: str) -> metrics.Summary | None:
    return next((s for s in metrics.summarize(records) if s.group == group), None)


def figures(records: Sequence[TaskRecord], span_s: float, tokens: int) -> dict[str, Any]:
    """The figures compared per configuration: U/beta (all tasks, a task not done counting 0), response
    p50/p95 of served tasks, throughput over ``span_s`` (first arrival to the last result)."""
    every, urgent = _row(records, "all"), _row(records, "all urgent")
    assert every is not None
    done = every.statuses.get("done", 0)
    return {"tasks": every.n, "done": done, "not_done": every.failed, "statuses": every.statuses,
            "urgent_n": urgent.n if urgent else 0,
            "urgent_u_beta": urgent.utility_norm_all if urgent else math.nan,
            "all_u_beta": every.utility_norm_all, "response_p50_s": every.response_p50,
            "response_p95_s": every.response_p95, "span_s": span_s, "tokens": tokens,
            "tokens_per_s": tokens / span_s if span_s > 0 else math.nan,
            "tasks_per_min": 60.0 * done / span_s if span_s > 0 else math.nan}


# -- the projection ----------------------------------------------------------------------------------------
def simulate_pool(wl: Workload, n: int, seed: int, engine_cfg: SimEngineConfig, args: argparse.Namespace
                  ) -> dict[str, Any]:
    """One simulation of ``wl`` on a pool of ``n`` simulated servers; the figures and each member's share."""
    cfg = SimConfig(policy="pud", seed=seed, engine=engine_cfg, prompt_context_tokens=args.context_tokens,
                    prompt_shared_tokens=max(0, 2884 - args.context_tokens))
    cfg.core.resume_lead_s = args.resume_lead
    # The pool never waits on an in-process member (step_ready is always true), so step_wait_s is not spent.
    pool = SimPool([_Member(engine_cfg) for _ in range(n)], background_probes=False)
    sim = Simulator(wl, cfg)
    sim.engine = pool  # the simulator's prompts and token totals
    sim.core.replace_engine(pool)  # no task is open yet: the core now places every generation through the pool
    res = sim.run()
    out = figures(res.records, res.sim_time_s, res.decode_tokens)
    out.update(seed=seed, servers=n, sim_time_s=res.sim_time_s, wall_s=res.wall_time_s,
               member_decode_tokens=[m.total_decode_tokens for m in pool.sim_members],
               member_prefill_tokens=[m.total_prefill_tokens for m in pool.sim_members],
               lockstep_idle_share=pool.lockstep_idle_s / max(1e-12, pool.lockstep_idle_s + pool.member_busy_s))
    return out


SIM_KEYS = ("urgent_u_beta", "all_u_beta", "response_p50_s", "response_p95_s", "tokens_per_s", "tasks_per_min",
            "not_done", "lockstep_idle_share")


def projection(args: argparse.Namespace) -> dict[str, Any]:
    servers = [int(x) for x in args.servers.split(",") if x]
    batches = [int(x) for x in args.member_batch.split(",") if x]
    loads = [float(x) for x in args.loads.split(",") if x]
    seeds = list(range(args.seed, args.seed + args.seeds))
    engine_cfg = SimEngineConfig.from_yaml(args.engine_config) if args.engine_config else SimEngineConfig()
    base = truncate(load_workload(args.workload, seed=args.seed), args.max_jobs)
    runs: dict[tuple[float, int, int], list[dict[str, Any]]] = {
        (f, b, n): [] for f in loads for b in batches for n in servers}
    for s in progress(seeds, "seeds"):
        moved = jitter(base, args.jitter_ms / 1e3, s)
        for f, b, n in progress(list(runs), f"load x batch x servers (seed {s})"):
            runs[(f, b, n)].append(simulate_pool(SCALINGS[args.scale](moved, f, s), n, s,
                                                 dataclasses.replace(engine_cfg, max_batch=b), args))
    points = []
    for (f, b, n), rs in runs.items():
        pt: dict[str, Any] = {"load": f, "member_batch": b, "servers": n, "seeds": len(rs), "tasks": rs[0]["tasks"]}
        for k in SIM_KEYS:
            pt[k], pt[f"{k}_ci"] = mean_ci([r[k] for r in rs])
        pt["per_seed"] = rs
        points.append(pt)
    return {"workload": base.name, "jobs": len(base.jobs), "loads": loads, "seeds": seeds,
            "jitter_ms": args.jitter_ms, "load_scaling": f"{args.scale}: {SCALE_DOC[args.scale]}",
            "step_model": dataclasses.asdict(engine_cfg) | {
                "source": args.engine_config or "SimEngineConfig() defaults: the paper's GPU (Table 1)"},
            "points": points}


PROJ_COLS = (("urgent U/beta", "urgent_u_beta", "{:+.3f}"), ("all U/beta", "all_u_beta", "{:+.3f}"),
             ("resp p50 s", "response_p50_s", "{:.3f}"), ("resp p95 s", "response_p95_s", "{:.3f}"),
             ("tokens/s", "tokens_per_s", "{:.0f}"), ("tasks/min", "tasks_per_min", "{:.1f}"),
             ("not done", "not_done", "{:.1f}"), ("lockstep idle", "lockstep_idle_share", "{:.2f}"))


def projection_table(proj: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["load", "member batch", "servers", *(c[0] for c in PROJ_COLS), "decode tokens per member (first seed)"]
    rows = [[f"{p['load']:g}", str(p["member_batch"]), str(p["servers"]),
             *(ci_cell(p[k], p[f"{k}_ci"], f) for _, k, f in PROJ_COLS),
             "/".join(str(x) for x in p["per_seed"][0]["member_decode_tokens"])] for p in proj["points"]]
    return header, rows


# -- the real part -----------------------------------------------------------------------------------------
def _server_counters(url: str) -> dict[str, float]:
    """The server's cumulative token counters from its Prometheus /metrics (what each member really served)."""
    want = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:prefix_cache_hits_total",
            "vllm:request_success_total")
    out: dict[str, float] = dict.fromkeys(want, 0.0)
    with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in out:
                out[name] += float(line.rsplit(" ", 1)[1])
    return out


def _real_run(name: str, engine: Engine, jobs: list[Any], args: argparse.Namespace, urls: Sequence[str]
              ) -> dict[str, Any]:
    from timelyllm_ros.demo import CPU_TUF_SCALE, run_policy

    demo_args = argparse.Namespace(admission="auto", fleet_time_scale=1.0, seed=args.seed, speed=1.0,
                                   timeout=args.timeout, record=False, out_dir=Path(args.out),
                                   tuf_scale=CPU_TUF_SCALE)
    if args.warmup_pass:  # not measured: the engine's first bursts
        run_policy(engine, False, "pud", jobs, demo_args, record=False)
    before = [_server_counters(u) for u in urls]
    res = run_policy(engine, False, "pud", jobs, demo_args, record=False)
    after = [_server_counters(u) for u in urls]
    recs = res.records
    finished = [r.finished for r in recs if r.finished == r.finished]
    span = max(finished) - min(r.arrival for r in recs) if finished else math.nan
    tokens = sum(len(engine.tokenize(r.plan)) for r in recs if r.plan)  # plan tokens delivered
    out = figures(recs, span, tokens)
    out.update(config=name, wall_s=res.wall_s, admission=res.admission, decision_ms=res.decision_ms,
               members=[{k: a[k] - b[k] for k in a} | {"url": u} for u, a, b in zip(urls, after, before, strict=True)])
    if isinstance(engine, EnginePool):
        st = engine.stats()
        out.update(failovers=st.failovers, failed_unplaced=st.failed_unplaced,
                   member_step_time_s=[m.step_time_s for m in st.members])
    return out


def real_part(args: argparse.Namespace) -> dict[str, Any]:
    from devtools.vllm_server import CPU_ARGS, VllmServer
    from timelyllm_ros.demo import CPU_TUF_SCALE, pick_jobs
    from timelyllm_ros.engines.factory import load_engine_config, make_engine, resolve_model_path

    jobs = pick_jobs(load_workload("wid2", args.seed), args.events, args.per_event, args.max_gap, CPU_TUF_SCALE)
    model = resolve_model_path(f"models/{SERVED_NAME}")
    srv_args = list(CPU_ARGS)
    srv_args[srv_args.index("--max-num-seqs") + 1] = MAX_NUM_SEQS
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        servers = [stack.enter_context(VllmServer(model, SERVED_NAME, log_path=Path(tmp) / f"serve{i}.log",
                                                  args=srv_args)) for i in range(2)]
        t0 = time.monotonic()
        for s in servers:
            s.wait_ready(900)
        print(f"pool: two vLLM servers ready in {time.monotonic() - t0:.0f} s", file=sys.stderr)
        pool_cfg = load_engine_config("config/engine_pool_remote.yaml")
        members = [dict(m, url=s.url) for m, s in zip(pool_cfg["members"], servers, strict=True)]
        builds: list[tuple[str, Callable[[], Engine], list[str]]] = [
            ("in-process", lambda: make_engine("config/engine_vllm_cpu.yaml"), []),
            ("remote x1", lambda: make_engine("config/engine_remote.yaml", url=servers[0].url), [servers[0].url]),
            ("pool x2", lambda: make_engine(pool_cfg, members=members), [s.url for s in servers])]
        engines: dict[str, tuple[Engine, list[str]]] = {}
        stack.callback(lambda: [e.close() for e, _ in engines.values()])
        for name, build, urls in builds:
            engines[name] = (build(), urls)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
        names = list(engines)
        for rep in progress(range(args.repeats), "repetitions"):
            # The order reversed every repetition: a noisy neighbour's load falls on every engine alike.
            for name in names if rep % 2 == 0 else names[::-1]:
                engine, urls = engines[name]
                runs[name].append(_real_run(name, engine, jobs, args, urls))
    return {"jobs": len(jobs), "urgent": sum(1 for j in jobs if j.tuf[0] > 1), "tuf_scale": CPU_TUF_SCALE,
            "events": args.events, "per_event": args.per_event, "max_gap_s": args.max_gap, "repeats": args.repeats,
            "server_args": srv_args,
            "host": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end",
            "runs": [_aggregate(name, rs) for name, rs in runs.items()]}


REAL_COLS = (("tokens/s", "tokens_per_s", "{:.1f}"), ("tasks/min", "tasks_per_min", "{:.1f}"),
             ("urgent U/beta", "urgent_u_beta", "{:+.3f}"), ("all U/beta", "all_u_beta", "{:+.3f}"),
             ("resp p50 s", "response_p50_s", "{:.2f}"), ("resp p95 s", "response_p95_s", "{:.2f}"),
             ("not done", "not_done", "{:.1f}"))


def _aggregate(name: str, rs: list[dict[str, Any]]) -> dict[str, Any]:
    """One engine's repetitions: mean and 95 % CI of every figure, the tokens each server generated (mean)."""
    out: dict[str, Any] = {"config": name, "repeats": len(rs), "tasks": rs[0]["tasks"]}
    for _, k, _ in REAL_COLS:
        out[k], out[f"{k}_ci"] = mean_ci([r[k] for r in rs])
    out["server_generation_tokens"] = [statistics.fmean(r["members"][i]["vllm:generation_tokens_total"] for r in rs)
                                       for i in range(len(rs[0]["members"]))]
    out["per_repeat"] = rs
    return out


def real_table(real: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["engine", *(c[0] for c in REAL_COLS), "tokens generated per server (mean)"]
    rows = [[r["config"], *(ci_cell(r[k], r[f"{k}_ci"], f) for _, k, f in REAL_COLS),
             "/".join(f"{x:.0f}" for x in r["server_generation_tokens"]) or "-"] for r in real["runs"]]
    return header, rows


# -- output ------------------------------------------------------------------------------------------------
LABELS = {"urgent_u_beta": "urgent", "all_u_beta": "all", "response_p50_s": "p50", "response_p95_s": "p95",
          "tokens_per_s": "tokens/s"}


def plot_projection(path: Path, proj: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = proj["loads"]
    panels = ((("urgent_u_beta", "all_u_beta"), "mean U/beta (not done = 0)", False),
              (("response_p50_s", "response_p95_s"), "response time, s", True),
              (("tokens_per_s",), "decode tokens / s over the run", False))
    fig, axes = plt.subplots(len(loads), len(panels), figsize=(13, 3.6 * len(loads)), squeeze=False)
    for row, f in zip(axes, loads, strict=True):
        for ax, (keys, ylabel, logy) in zip(row, panels, strict=True):
            for bi, b in enumerate(sorted({p["member_batch"] for p in proj["points"]})):
                pts = sorted((p for p in proj["points"] if p["load"] == f and p["member_batch"] == b),
                             key=lambda p: p["servers"])
                xs = [p["servers"] for p in pts]
                for k, style in zip(keys, ("-", "--"), strict=False):
                    ax.errorbar(xs, [p[k] for p in pts], yerr=[0.0 if p[f"{k}_ci"] != p[f"{k}_ci"] else p[f"{k}_ci"]
                                                               for p in pts],
                                marker="o", ms=4, capsize=3, ls=style, color=f"C{bi}",
                                label=f"batch {b}: {LABELS.get(k, k)}")
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            if logy:
                ax.set_yscale("log")
            ax.set_xlabel("simulated GPU servers in the pool")
            ax.set_ylabel(ylabel)
            ax.set_title(f"load x{f:g}", fontsize=9)
            ax.grid(lw=0.3)
            ax.legend(fontsize=6)
    fig.suptitle(f"Projection: {proj['workload']}, pud, {len(proj['seeds'])} seed(s), 95 % CI; member batch = each "
                 f"server's max_batch (simulated GPU step model)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_real(path: Path, real: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = real["runs"]
    names = [r["config"] for r in runs]
    panels = (("tokens_per_s", "plan tokens / s"), ("tasks_per_min", "tasks done / min"),
              (("urgent_u_beta", "all_u_beta"), "U/beta (urgent | all)"), (("response_p50_s", "response_p95_s"),
                                                                           "response s (p50 | p95)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(14, 3.6))
    for ax, (keys, label) in zip(axes, panels, strict=True):
        keys = (keys,) if isinstance(keys, str) else keys
        w = 0.8 / len(keys)
        for j, k in enumerate(keys):
            xs = [i + (j - (len(keys) - 1) / 2) * w for i in range(len(runs))]
            ax.bar(xs, [r[k] for r in runs], width=w, color=[f"C{i}" for i in range(len(runs))],
                   yerr=[0.0 if r[f"{k}_ci"] != r[f"{k}_ci"] else r[f"{k}_ci"] for r in runs], capsize=3,
                   alpha=1.0 if j == 0 else 0.55, edgecolor="black", lw=0.5)
        ax.set_xticks(range(len(runs)), names, fontsize=8)
        ax.set_title(label, fontsize=9)
        ax.grid(axis="y", lw=0.3)
    fig.suptitle(f"Real, this machine ({real['host']}): {real['jobs']} WID 2 drone tasks ({real['urgent']} urgent), "
                 f"SmolLM2-135M on CPU, {real['repeats']} repetition(s), 95 % CI; the two servers share the same "
                 f"cores", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


NOTE_REAL = ("Real part, what it can and cannot show: both servers, the planner and the simulated fleet share "
             "this machine's CPU cores, so a pool of two cannot generate faster than one server here; the "
             "figures show that the pool runs the planner's workload end to end (every task accounted for, the "
             "tokens each server generated, failovers) and what the HTTP path and the pool cost against the "
             "in-process engine. The engines run in turn (order reversed every repetition) on a machine shared "
             "with other work; mean ± 95 % CI over the repetitions. Throughput: plan tokens (the tokenized plans) "
             "and tasks done over the span from the first arrival to the last result; tokens generated per server: "
             "the server's own counter (/metrics) over the run, the planner's warm-up at configure included.")
NOTE_SIM = ("Projection: each member is a SimEngine with the step model given below (Table 1 of the paper, a GPU "
            "server); `member batch` is each member's max_batch (8: config/engine_pool_remote.yaml's setting; 256: "
            "vLLM's default max_num_seqs). The pool steps all busy members together and its step lasts as long as "
            "the longest member's, so a member's short step waits for another's long prefill: `lockstep idle` is "
            "the share of the members' time spent so waiting, and the gains for N > 1 are understated by about "
            "that much, not overstated. Members do not share a prefix cache: each prefills the shared prompt once. "
            "Throughput: decode tokens and tasks done over the simulated span (first arrival to last result): "
            "every task ends within the trace either way, so it follows the arrivals, not the capacity.")


def write_outputs(out: Path, res: dict[str, Any]) -> None:
    md = ["# timelyllm-bench pool\n"]
    if "projection" in res:
        p = res["projection"]
        h, rows = projection_table(p)
        md += [f"\n## Projection: pool of N simulated GPU servers\n\nCommand: `{p['command']}`\n\n"
               f"{p['workload']} ({p['jobs']} tasks), load x{'/'.join(f'{f:g}' for f in p['loads'])} "
               f"({p.get('load_scaling', 'rate: every arrival time divided by the factor')}), "
               f"policy pud, seeds {p['seeds']}"
               f" (jitter {p['jitter_ms']:g} ms); mean ± 95 % CI. {NOTE_SIM}\n\nStep model: "
               + ", ".join(f"{k}={v}" for k, v in p["step_model"].items()) + "\n\n", md_table(h, rows),
               "\n![projection](pool_projection.png)\n"]
        plot_projection(out / "pool_projection.png", p)
    if "real" in res:
        r = res["real"]
        h, rows = real_table(r)
        md += [f"\n## Real: in-process vLLM vs one server vs a pool of two (CPU)\n\nCommand: `{r['command']}`\n\n"
               f"{r['jobs']} WID 2 drone tasks ({r['urgent']} urgent; first {r['events']} events, at most "
               f"{r['per_event']} tasks each; TUF time axis x{r['tuf_scale']:g}), planner core with pud, simulated "
               f"robots in real time (timelyllm_ros.demo.run_policy). Servers: `{' '.join(r['server_args'])}`. "
               f"{r['host']}.\n\n{NOTE_REAL}\n\n", md_table(h, rows), "\n![real](pool_real.png)\n"]
        for run in (x for agg in r["runs"] for x in agg["per_repeat"] if "failovers" in x):
            md.append(f"\n{run['config']}: failovers {run['failovers']}, unplaced {run['failed_unplaced']}, "
                      f"measured time per token per member at the end "
                      + ", ".join("-" if x is None else f"{x * 1e3:.1f} ms" for x in run["member_step_time_s"])
                      + "\n")
        plot_real(out / "pool_real.png", r)
    (out / "results.md").write_text("".join(md))
    (out / "results.json").write_text(json.dumps(res, indent=1, default=lambda x: None if x != x else str(x)))


def cmd_pool(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else results_root() / "pool"
    args.out = str(out)
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["timelyllm-bench", *sys.argv[1:]]) if args.command is None else args.command
    prev = out / "results.json"
    res: dict[str, Any] = json.loads(prev.read_text()) if prev.is_file() else {}
    if not args.skip_sim:
        res["projection"] = projection(args) | {"command": command}
        h, rows = projection_table(res["projection"])
        print_table(f"projection: pool of N simulated GPU servers, {res['projection']['workload']}", h, rows)
    if not args.skip_real:
        res["real"] = real_part(args) | {"command": command}
        h, rows = real_table(res["real"])
        print_table("real (CPU): in-process vLLM vs one vLLM server vs a pool of two", h, rows)
    write_outputs(out, res)
    print(f"results in {out}")
    return 0


def add_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("pool", help="one vLLM server vs a pool of two vs in-process (real, CPU), and the "
                                    "projection for 1-8 simulated GPU servers")
    p.add_argument("--skip-real", action="store_true", help="no real servers: the projection only")
    p.add_argument("--skip-sim", action="store_true", help="the real part only")
    p.add_argument("--events", type=int, default=4, help="real part: WID 2 trace arrival events served")
    p.add_argument("--per-event", type=int, default=8, help="real part: at most this many tasks per event")
    p.add_argument("--max-gap", type=float, default=2.0,
                   help="real part: idle gaps between events shortened to this (s)")
    p.add_argument("--timeout", type=float, default=600.0, help="real part: seconds per engine before giving up")
    p.add_argument("--warmup-pass", action="store_true", help="real part: an unmeasured pass first, per engine")
    p.add_argument("--repeats", type=int, default=3, help="real part: runs per engine (interleaved)")
    p.add_argument("--servers", default=DEFAULT_SERVERS, help="projection: pool sizes")
    p.add_argument("--member-batch", default=DEFAULT_MEMBER_BATCH,
                   help="projection: each member's batch capacity (max_batch), a comma list: 8 as in "
                        "config/engine_pool_remote.yaml, 256 as vLLM's default max_num_seqs")
    p.add_argument("--workload", default="wid2", help="projection: workload (default the WID 2 trace)")
    p.add_argument("--loads", default=DEFAULT_LOADS,
                   help="projection: arrival-rate factors (x the workload's), a comma list (see --scale)")
    add_scale_argument(p)
    p.add_argument("--seeds", type=int, default=3, help="projection: repetitions (seeds --seed, --seed+1, ...)")
    p.add_argument("--jitter-ms", type=float, default=200.0, help="projection: move each arrival event by "
                                                                  "U(0, this) ms per seed")
    p.add_argument("--max-jobs", type=int, default=None, help="projection: only the workload's first N tasks")
    common(p)  # --seed, --out (default bench/results/pool), --engine-config (the members' step model), ...
    p.set_defaults(fn=cmd_pool, command=None)


__all__ = ["SimPool", "add_parser", "cmd_pool", "figures", "projection", "real_part", "simulate_pool"
           ]
