"""Time to first token and time per resume: the in-process vLLM engine vs the remote one.

    python -m bench.remote_vs_inprocess [--tasks 6] [--out bench/results/remote_vs_inprocess]

Runs the same drone tasks (PromptBuilder "drone", greedy, 48 tokens, suspended at every skill boundary
and resumed at once) through ``config/engine_vllm_cpu.yaml`` in this process and through
``config/engine_remote.yaml`` against a ``vllm serve`` this script starts (devtools/vllm_server.py,
the same CPU settings) and stops, task by task in turn. Both are timed the same way, from the caller's side: from
``engine.add()`` to the step that hands over the request's first new token. The first task of each
engine runs cold (nothing cached); the later ones find the shared few-shot prefix in the prefix cache.
Prints a table; writes results.json (every figure and plan), results.md and remote_vs_inprocess.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from timelyllm_ros.engines.base import Engine, EngineRequest
from timelyllm_ros.engines.factory import make_engine, resolve_model_path
from timelyllm_ros.engines.prompts import PromptBuilder
from timelyllm_ros.skills.segmenter import make_stop_checker

TASKS = [
    "Scene: [] Task: [A] Could you find the cat? If so, go to it.",
    "Scene: [chair x:0.3 y:0.5] Task: [A] Turn around and look for a bottle.",
    "Scene: [] Task: [A] Fly forward 50 cm, then turn right 90 degrees.",
    "Scene: [person x:0.6 y:0.4] Task: [A] Is there a person? Go to them.",
    "Scene: [] Task: [A] Go up 30 cm and scan for an apple.",
    "Scene: [table x:0.5 y:0.5] Task: [A] Find the laptop on the table.",
    "Scene: [] Task: [A] Move left 40 cm and take a look around.",
    "Scene: [dog x:0.2 y:0.7] Task: [A] Follow the dog.",
]


def _first_token_s(engine: Engine, req: EngineRequest) -> tuple[float, list]:
    """Seconds from add() to the step that delivers a new token of ``req``; the events of those steps."""
    n0 = len(req.output_token_ids)
    t0 = time.perf_counter()
    engine.add(req)
    events = []
    while len(req.output_token_ids) == n0:
        rep = engine.step()
        events += [e for e in rep.events if e.gen_id == req.gen_id]
        if any(e.final for e in events):
            break
    return time.perf_counter() - t0, events


def run_task(engine: Engine, pb: PromptBuilder, gid: str, task: str) -> tuple[float, list[float], str]:
    """One task through ``engine``: time to its first token, the time of each resume, the plan."""
    req = EngineRequest(gid, pb.token_ids(task), make_stop_checker(pb.skillset), max_new_tokens=48)
    first, events = _first_token_s(engine, req)
    resumes = []
    while True:
        while engine.has_work():
            events += [e for e in engine.step().events if e.gen_id == req.gen_id]
        if events and events[-1].final:
            break
        s, ev = _first_token_s(engine, req)  # resume: prompt + generated ids
        resumes.append(s)
        events += ev
    return first, resumes, "".join(e.text for e in events)


def summary(ttft: list[float], resumes: list[float], plans: list[str], prompt_tokens: int) -> dict:
    return {"ttft_cold_s": round(ttft[0], 4),
            "ttft_warm_median_s": round(statistics.median(ttft[1:]), 4) if len(ttft) > 1 else None,
            "ttft_warm_s": [round(x, 4) for x in ttft[1:]],
            "resume_median_s": round(statistics.median(resumes), 4),
            "resume_p90_s": round(sorted(resumes)[int(0.9 * (len(resumes) - 1))], 4), "resumes": len(resumes),
            "prompt_tokens": prompt_tokens, "plans": plans}


ROWS = (("time to first token, cold (task 1)", "ttft_cold_s"),
        ("time to first token, prefix cached (median)", "ttft_warm_median_s"),
        ("time per resume (median)", "resume_median_s"),
        ("time per resume (p90)", "resume_p90_s"))


def _cell(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f} s"


def report(out: dict, path: Path) -> None:
    """Table on the console and in results.md, a bar chart as PNG, every figure in results.json."""
    import matplotlib.pyplot as plt
    from rich.console import Console
    from rich.table import Table

    path.mkdir(parents=True, exist_ok=True)
    (path / "results.json").write_text(json.dumps(out, indent=1))
    table = Table(title="in-process vLLM vs remote vLLM server (same model, same CPU)")
    for c in ("", "in-process", "remote", "remote / in-process"):
        table.add_column(c)
    md = ["| | in-process | remote | remote / in-process |", "|---|---|---|---|"]
    for label, key in ROWS:
        a, b = out["inprocess"][key], out["remote"][key]
        ratio = "—" if not a or b is None else f"{b / a:.2f}"
        table.add_row(label, _cell(a), _cell(b), ratio)
        md.append(f"| {label} | {_cell(a)} | {_cell(b)} | {ratio} |")
    md.append(f"\nplans identical on both engines: {out['same_plans']}; prompt {out['inprocess']['prompt_tokens']} "
              f"tokens; {out['inprocess']['resumes']} resumes each; {out['host']}")
    Console().print(table)
    (path / "results.md").write_text("\n".join(md) + "\n")
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(ROWS))
    for k, (name, dx) in enumerate((("inprocess", -0.2), ("remote", 0.2))):
        ax.bar([x + dx for x in xs], [out[name][key] or 0.0 for _, key in ROWS], width=0.4,
               label=name.replace("inprocess", "in-process"), color=f"C{k}")
    ax.set_xticks(list(xs), [label.replace(" (", "\n(") for label, _ in ROWS], fontsize=8)
    ax.set_ylabel("seconds")
    ax.set_title("Resumable segmented generation: in-process engine vs remote vLLM server")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path / "remote_vs_inprocess.png", dpi=120)
    print(f"wrote {path}/results.json, results.md, remote_vs_inprocess.png")


def main(argv: list[str] | None = None) -> None:
    import os

    from devtools.vllm_server import VllmServer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=6)
    ap.add_argument("--out", type=Path, default=Path("bench/results/remote_vs_inprocess"))
    args = ap.parse_args(argv)
    model = resolve_model_path("models/SmolLM2-135M-Instruct")
    names = ("inprocess", "remote")
    res: dict = {n: ([], [], []) for n in names}
    with tempfile.TemporaryDirectory() as tmp, VllmServer(model, "SmolLM2-135M-Instruct",
                                                          log_path=Path(tmp) / "serve.log") as srv:
        srv.wait_ready(600)
        engines = {"inprocess": make_engine("config/engine_vllm_cpu.yaml"),
                   "remote": make_engine("config/engine_remote.yaml", url=srv.url)}
        try:
            pbs = {n: PromptBuilder(e.tokenizer, "drone") for n, e in engines.items()}
            # Interleaved, the order swapped every task: a noisy neighbour's load falls on both alike.
            for i, task in enumerate(TASKS[:args.tasks]):
                for n in (names if i % 2 == 0 else names[::-1]):
                    first, resumes, plan = run_task(engines[n], pbs[n], f"t{i}", task)
                    res[n][0].append(first)
                    res[n][1].extend(resumes)
                    res[n][2].append(plan)
        finally:
            for e in engines.values():
                e.close()
    out = {n: summary(*res[n], len(pbs[n].token_ids(TASKS[0]))) for n in names}
    out["same_plans"] = out["inprocess"]["plans"] == out["remote"]["plans"]
    out["host"] = f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end"
    report(out, args.out)


if __name__ == "__main__":
    main()
