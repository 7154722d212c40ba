"""Two load sweeps of the same command side by side, paired by seed: what a change did to every policy at every
point (workload, load), per level (all tasks, urgent, normal).

    python -m bench.sweep_diff AFTER/results.json BEFORE/results.json [--policies pud-shed] [--out diff.md]

A point is *worse* (or *better*) when the 95 % interval of the per-seed difference (Student t) excludes 0; with
one seed, by its sign. Both sweeps must have been run with the same seeds (``--seeds``) for the pairing to mean
anything: the seeds fix the arrival jitter and the generated workloads.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

from bench.common import t95

LEVELS = ("all", "urgent", "normal")


def per_seed(path: Path) -> dict[tuple[str, float, str], list[dict[str, float]]]:
    """(workload, load, policy) -> the per-seed figures of a load sweep's results.json."""
    data = json.loads(path.read_text())
    return {(sw["workload"], pt["x"], pt["policy"]): pt["per_seed"]
            for sw in data["sweeps"].values() for pt in sw["points"]}


def paired(after: list[dict[str, float]], before: list[dict[str, float]], level: str
           ) -> tuple[float, float, str] | None:
    """Mean of after - before per seed, its half-width and 'worse' / 'better' / '='; None: no figure."""
    d = [a[level] - b[level] for a, b in zip(after, before, strict=False)
         if a.get(level) is not None and b.get(level) is not None and not math.isnan(a[level])
         and not math.isnan(b[level])]
    if not d:
        return None
    m = statistics.fmean(d)
    ci = t95(len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else 0.0
    return m, ci, "worse" if m + ci < -1e-9 else "better" if m - ci > 1e-9 else "="


def diff(after: Path, before: Path, policies: list[str] | None = None) -> list[dict[str, Any]]:
    a, b = per_seed(after), per_seed(before)
    rows = []
    for key in sorted(set(a) & set(b), key=str):
        if policies and key[2] not in policies:
            continue
        rows.append({"workload": key[0], "load": key[1], "policy": key[2],
                     **{lvl: paired(a[key], b[key], lvl) for lvl in LEVELS}})
    return rows


def markdown(rows: list[dict[str, Any]], after: Path, before: Path) -> str:
    md = [f"# Load sweep, after - before, paired by seed\n\nafter: `{after}`, before: `{before}`\n",
          "| workload | load | policy | all | urgent | normal |", "|---|---|---|---|---|---|"]
    for r in rows:
        cells = ["n/a" if r[lvl] is None else f"{r[lvl][0]:+.3f} ±{r[lvl][1]:.3f} {r[lvl][2]}" for lvl in LEVELS]
        md.append(f"| {r['workload']} | {r['load']:g} | {r['policy']} | " + " | ".join(cells) + " |")
    for p in dict.fromkeys(r["policy"] for r in rows):
        worse = [r for r in rows if r["policy"] == p and r["all"] and r["all"][2] == "worse"]
        better = [r for r in rows if r["policy"] == p and r["all"] and r["all"][2] == "better"]
        md.append(f"\n{p}: all tasks better at {len(better)} points, worse at {len(worse)}"
                  + (": " + ", ".join(f"{r['workload']} {r['load']:g}x ({r['all'][0]:+.3f} ±{r['all'][1]:.3f})"
                                      for r in worse) if worse else ""))
    return "\n".join(md) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("after", type=Path)
    ap.add_argument("before", type=Path)
    ap.add_argument("--policies", default="", help="comma list (default: every policy in both)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here (markdown)")
    args = ap.parse_args(argv)
    md = markdown(diff(args.after, args.before, [p for p in args.policies.split(",") if p] or None),
                  args.after, args.before)
    print(md)
    if args.out:
        args.out.write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
