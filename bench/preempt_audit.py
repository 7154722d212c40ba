"""Tasks a policy loses to their own robot's next task, beside the policies it is compared with.

    python -m bench.preempt_audit --workload drone-wid1 --load 2 --scale fleet --seeds 0,1,2 [--out DIR]

With the trace's own robots (fleet scaling) a robot's next task preempts the one it runs: the older task ends
CANCELLED and counts 0 in the all-tasks U/beta, though its first segment reached the robot. For each seed this
runs pud-shed, pud and edf-seg on the same jittered workload (as ``load-sweep`` makes it) and lists every task one
of them lost that way while another finished it: when its segments reached the robot, when the next task came.
Writes ``preempt_audit.md`` and ``preempt_audit.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.common import SCALINGS, jitter, md_table, results_root, run_policy
from timelyllm_ros.sim.workloads import load_workload

POLICIES = ("pud-shed", "pud", "edf-seg")


def audit(workload: str, load: float, scale: str, seed: int, jitter_ms: float = 20.0) -> dict[str, Any]:
    args = argparse.Namespace(seed=seed, engine_config=None, context_tokens=150, resume_lead=0.05)
    wl = jitter(SCALINGS[scale](load_workload(workload, seed=seed), load, seed), jitter_ms / 1e3, seed)
    runs = {p: {r.job_id: r for r in run_policy(wl, p, None, args).records} for p in POLICIES}
    n = len(wl.jobs)
    out: dict[str, Any] = {"seed": seed, "tasks": n, "u_all": {p: sum(r.utility_all() for r in rr.values()) / n
                                                              for p, rr in runs.items()}, "rows": []}
    for p, rr in runs.items():
        lost = [r for r in rr.values() if r.status == "cancelled" and r.response_time is not None]
        out[f"{p}_cancelled_served"] = len(lost)
        # what those first segments earned, had the task not been preempted (TUF_0 / beta)
        out[f"{p}_cancelled_u"] = sum((r.utility() or 0.0) / r.beta for r in lost)
    for k in sorted(runs["pud-shed"]):
        recs = {p: runs[p][k] for p in POLICIES}
        if len({r.status for r in recs.values()}) == 1:
            continue
        row = {"job": k, "level": recs["pud-shed"].level, "arrival_s": round(recs["pud-shed"].arrival, 3)}
        for p, r in recs.items():
            row[p] = {"status": r.status, "reason": r.reason[:80],
                      "segments_at_s": [round(s.recv - r.arrival, 3) for s in r.segments if s.recv == s.recv],
                      "ended_at_s": round(r.finished - r.arrival, 3)}
        out["rows"].append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="drone-wid1")
    ap.add_argument("--load", type=float, default=2.0)
    ap.add_argument("--scale", choices=sorted(SCALINGS), default="fleet")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if not a.load > 0:
        ap.error(f"--load must be > 0, got {a.load:g}")
    try:
        seeds = [int(x) for x in a.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds: a comma list of integers, got {a.seeds!r}")
    out = a.out or results_root() / "load_sweep" / "preempt-audit"
    out.mkdir(parents=True, exist_ok=True)
    res = [audit(a.workload, a.load, a.scale, s) for s in seeds]
    cmd = (f"python -m bench.preempt_audit --workload {a.workload} --load {a.load:g} --scale {a.scale} "
           f"--seeds {a.seeds}")
    head = (["seed"] + [f"{p} U/beta all" for p in POLICIES]
            + [f"{p} preempted after its first segment (their TUF_0/beta)" for p in POLICIES])
    rows = [[str(r["seed"])] + [f"{r['u_all'][p]:.4f}" for p in POLICIES]
            + [f"{r[f'{p}_cancelled_served']} ({r[f'{p}_cancelled_u']:.2f})" for p in POLICIES] for r in res]
    md = [f"# Tasks lost to their own robot's next task: {a.workload} at {a.load:g}x ({a.scale})\n\n",
          f"Command: `{cmd}`\n\n", md_table(head, rows), "\nTasks whose end differs between the policies "
          "(segments: when each reached the robot, s after the task's arrival; ended: its result):\n\n"]
    for r in res:
        for row in r["rows"]:
            md.append(f"- seed {r['seed']}, job {row['job']} ({row['level']}, arrived {row['arrival_s']} s): "
                      + "; ".join(f"{p} {row[p]['status']} at {row[p]['ended_at_s']} s, segments "
                                  f"{row[p]['segments_at_s']}" for p in POLICIES)
                      + (f" ({row['pud-shed']['reason']})" if row["pud-shed"]["reason"] else "") + "\n")
    (out / "preempt_audit.md").write_text("".join(md))
    (out / "preempt_audit.json").write_text(json.dumps({"command": cmd, "runs": res}, indent=1))
    print("".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
