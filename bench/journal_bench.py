"""What the journal's durability costs per accepted task, on this machine's disk.

    python -m bench.journal_bench [--dir /path/on/the/state_dir/disk] [--tasks 300] [--open-tasks 10000]

One task's life as the planner journals it: accepted, 4 segments sent, 4 acknowledged, 4 reported, finished
(14 commits). Compared: an older journal.py (--before FILE, e.g. from ``git show
<rev>:timelyllm_ros/planner/journal.py > /tmp/old_journal.py``), synchronous=NORMAL and the default
synchronous=FULL (fsync per commit, sidecar update per commit). Also the time
to open (integrity check included) a journal holding --open-tasks finished tasks, the planner's default bound.
Prints a table; timings on a shared machine are noisy (medians of --repeats runs).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

SPEC = {"task": "take off, fly to the kitchen window and look for the red cup", "k": 0,
        "tuf": {"level": "normal", "alpha": -0.5, "beta": 0.1, "ert": 20.0}, "send_stamp": 1.0}


def _load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("old_journal", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _life(j: Any, tid: str, k: int) -> float:
    """One task's 14 commits; returns the task_accepted latency (what a goal waits for)."""
    t0 = time.perf_counter()
    j.task_accepted(tid, "drone_0", "drone", dict(SPEC, k=k), float(k))
    accept = time.perf_counter() - t0
    for i in range(4):
        j.segment_sent(tid, i, f"segment {i} of {tid}", list(range(20)), i == 3, k + 0.1 * i, 1.5)
    for i in range(4):
        j.segment_acked(tid, i)
    for i in range(4):
        j.segment_reported(tid, i, True, k + 0.1 * i, k + 0.1 * i + 1.0, "")
    j.task_finished(tid, "done", {"status": "done", "plan": "..."}, k + 5.0)
    return accept


def run(make: Any, root: Path, tasks: int) -> dict[str, float]:
    j = make(root)
    try:
        accepts = []
        t0 = time.perf_counter()
        for k in range(tasks):
            accepts.append(_life(j, f"t{k}", k))
        dt = time.perf_counter() - t0
    finally:
        j.close()
    accepts.sort()
    return {"task_ms": dt / tasks * 1e3, "commits_per_s": 14 * tasks / dt,
            "accept_p50_ms": accepts[len(accepts) // 2] * 1e3, "accept_p99_ms": accepts[int(len(accepts) * 0.99)] * 1e3}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="folder on the disk to measure (default: a temp folder)")
    ap.add_argument("--tasks", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--open-tasks", type=int, default=10000)
    ap.add_argument("--before", default=None, help="an older journal.py to time beside this one")
    a = ap.parse_args(argv)
    from timelyllm_ros.planner.journal import Journal

    variants: dict[str, Any] = {}
    if a.before:
        old = _load(a.before)
        variants["before (its default)"] = lambda d: old.Journal(d)
        variants["before, synchronous=FULL"] = lambda d: old.Journal(d, synchronous="FULL")
    variants["now, synchronous=NORMAL"] = lambda d: Journal(d, synchronous="NORMAL")
    variants["now, synchronous=FULL (default)"] = lambda d: Journal(d)
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        print(f"{a.tasks} tasks x 14 commits each, in {tmp}, median of {a.repeats}")
        print(f"{'journal':34} {'ms/task':>8} {'commits/s':>10} {'accept p50 ms':>14} {'accept p99 ms':>14}")
        for name, make in variants.items():
            runs = [run(make, Path(tmp) / f"{name[:3]}{r}", a.tasks) for r in range(a.repeats)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"{name:34} {med['task_ms']:8.2f} {med['commits_per_s']:10.0f} {med['accept_p50_ms']:14.3f} "
                  f"{med['accept_p99_ms']:14.3f}")
        big = Path(tmp) / "big"
        with Journal(big, synchronous="NORMAL") as j:  # fill fast; the open below is what is timed
            for k in range(a.open_tasks):
                _life(j, f"t{k}", k)
        size = sum(p.stat().st_size for p in big.iterdir()) / 1e6
        t0 = time.perf_counter()
        Journal(big).close()
        print(f"open (integrity check, counter check, checkpoint) of {a.open_tasks} finished tasks "
              f"({size:.1f} MB): {time.perf_counter() - t0:.3f} s")


if __name__ == "__main__":
    main()
