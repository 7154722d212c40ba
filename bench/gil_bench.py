"""The engine's step time beside other Python work in its process, by the interpreter's switch interval.

    python -m bench.gil_bench [--rounds 2] [--requests 2] [--out bench/results/gil]

The planner steps its vLLM engine in its own process, on a thread of its own, while the rclpy executor's
threads take goals in, publish segments and answer services in Python. A model step gives the GIL up in every
torch call and must take it back each time; while another thread runs Python, each take waits up to the
interpreter's switch interval (``sys.setswitchinterval``, 5 ms by default). Here one process loads the planner's
engine (``planner_engine``, the CPU config, the drone prompts warmed as the planner does), then writes
``--requests`` drone plans per condition on a thread named as the planner's, and times the batch-1 steps that
write one token. Conditions, in a rotated order each round: alone, and beside ``--busy`` threads that run a pure
Python loop (a stand-in for intake under a burst), each at switch intervals of 5, 1 and 0.5 ms. Writes
``results.md``, ``results.json`` and ``gil.png``; the ratios to the alone step of the same round are what carry
over between machines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
from pathlib import Path

from bench.openmp_bench import plan_steps, warmed_engine

DEFAULT_INTERVAL = 0.005  # CPython's
CONDITIONS = [(0, 0.005), (1, 0.005), (1, 0.001), (1, 0.0005), (0, 0.0005)]  # (busy threads, switch interval s)


def _busy(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for i in range(2000):
            x += i * i


def condition(eng, r, busy: int, interval: float, requests: int, tag: str) -> dict:
    """Median one-token decode step of ``requests`` plans, beside ``busy`` busy threads at ``interval``."""
    stop = threading.Event()
    threads = [threading.Thread(target=_busy, args=(stop,), daemon=True) for _ in range(busy)]
    got: list = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        for t in threads:
            t.start()
        step = threading.Thread(target=lambda: got.append(plan_steps(eng, r, requests, tag)), name="timelyllm-engine")
        step.start()
        step.join()
    finally:
        stop.set()
        for t in threads:
            t.join()
        sys.setswitchinterval(old)
    one, _ = got[0]
    return {"busy": busy, "interval_ms": interval * 1e3, "decode_ms": 1e3 * statistics.median(one),
            "steps": len(one)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--busy", type=int, default=1, help="busy Python threads beside the engine's")
    ap.add_argument("--out", default="bench/results/gil")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.requests < 1 or args.busy < 1:
        ap.error("--rounds, --requests and --busy must be >= 1")
    from rich.progress import Progress

    conds = [(b and args.busy, i) for b, i in CONDITIONS]
    eng, r = warmed_engine()
    rows = []
    with Progress() as bar:
        task = bar.add_task("conditions", total=args.rounds * len(conds))
        for k in range(args.rounds):
            order = conds[k % len(conds):] + conds[:k % len(conds)]
            for busy, interval in order:
                rows.append(dict(condition(eng, r, busy, interval, args.requests, f"r{k}b{busy}i{interval}"),
                                 round=k))
                bar.advance(task)
    eng.close()

    def ratio(row: dict) -> float:
        alone = [x["decode_ms"] for x in rows if x["round"] == row["round"] and x["busy"] == 0
                 and x["interval_ms"] == DEFAULT_INTERVAL * 1e3]
        return row["decode_ms"] / alone[0]

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = ["# The engine's decode step beside other Python work, by switch interval", "",
          f"Command: `python -m bench.gil_bench {' '.join(argv if argv is not None else sys.argv[1:])}` "
          f"({os.cpu_count()} CPUs; {args.requests} drone plans per condition; medians of the batch-1 one-token "
          "steps; ratio: to the alone step at 5 ms in the same round)", "",
          "| round | busy threads | switch interval, ms | decode step, ms | ratio to alone |", "|---|---|---|---|---|"]
    md += [f"| {x['round'] + 1} | {x['busy']} | {x['interval_ms']:g} | {x['decode_ms']:.1f} | {ratio(x):.2f} |"
           for x in rows]
    (out / "results.md").write_text("\n".join(md) + "\n")
    (out / "results.json").write_text(json.dumps({"rows": rows, "requests": args.requests}, indent=1))
    print("\n".join(md))
    import matplotlib.pyplot as plt

    labels = [f"{'alone' if b == 0 else f'{b} busy'}\n{i * 1e3:g} ms" for b, i in conds]
    means = [statistics.mean(ratio(x) for x in rows if (x["busy"], x["interval_ms"]) == (b, i * 1e3))
             for b, i in conds]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(labels, means, color=["#888", "#c44", "#e93", "#4a4", "#8bd"])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("decode step / alone at 5 ms")
    ax.set_title("engine step beside busy Python threads, by switch interval")
    fig.tight_layout()
    fig.savefig(out / "gil.png", dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
