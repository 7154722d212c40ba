"""Real-engine measurements of issue 4 §4 a-d (vLLM by default).

    python -m bench.engine_bench --config config/engine_vllm_cpu.yaml \
        --out bench/results/engine_cpu --fit-out config/sim_engine_fitted_cpu.yaml

a. segmentation overhead: wall time of segmented (suspend at every boundary,
   resume at once) vs unsegmented generation of the same plans, batch 1;
b. prefix-cache reuse on resume: cached / prompt tokens of every resubmission;
c. resume latency (time to the first new token) with the prefix cache vs a
   full re-prefill of the same tokens (cache reset before the resubmission);
d. decode tokens/s and step time vs batch size, prefill time vs prompt
   length; fits the simulator's step-time model
   ``decode_s * (1 + batch_slowdown * (batch - 1)) + prefill_tokens * prefill_s_per_token``.

Writes results.json, batch.csv, results.md and engine_bench.png to --out.
Timings on a shared machine are noisy: every number is a median over repeats,
and the load average is recorded with the results.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.load_sweep import line_fit
from timelyllm_ros import paths
from timelyllm_ros.engines import driver
from timelyllm_ros.engines.base import Engine, EngineRequest, FinishReason
from timelyllm_ros.engines.factory import load_engine_config, make_engine
from timelyllm_ros.engines.prompts import PromptBuilder
from timelyllm_ros.engines.vllm_engine import VllmEngine
from timelyllm_ros.skills.segmenter import StopChecker, make_stop_checker


class NeverStop(StopChecker):
    """Plain decoding: never cuts (throughput runs)."""

    def __init__(self) -> None:
        self._t: list[str] = []

    def feed(self, piece: str) -> bool:
        self._t.append(piece)
        return False

    def cut(self) -> str:
        t, self._t = "".join(self._t), []
        return t

    @property
    def pending_text(self) -> str:
        return "".join(self._t)


def log(msg: str) -> None:
    print(f"[engine_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def trace_tasks() -> dict[int, str]:
    jobs = json.loads((paths.data_dir() / "lrtrace/drone-wid2/jobs.json").read_text())
    tasks: dict[int, str] = {}
    for j in jobs:
        tasks.setdefault(int(j["trace_id"]), j["task_input"])
    return dict(sorted(tasks.items()))


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def timed_run(eng: Engine, req: EngineRequest) -> tuple[float, list]:
    t0 = time.perf_counter()
    ev = driver.run(eng, [req])[req.gen_id]
    return time.perf_counter() - t0, ev


# -- a, b --------------------------------------------------------------------------
def bench_segmentation(eng: VllmEngine, pb: PromptBuilder, repeats: int, constrained: bool,
                       in_place: bool = True) -> dict:
    """``in_place``: an idle engine resumes a suspended generation in place (vLLM's request kept); False:
    every resume is a resubmission, as when other requests need the engine (b measures those)."""
    eng.park_idle = in_place  # a-d run on the vLLM backend only (main)
    try:
        return _bench_segmentation(eng, pb, repeats, constrained) | {"in_place": in_place}
    finally:
        eng.park_idle = True


def _bench_segmentation(eng: Engine, pb: PromptBuilder, repeats: int, constrained: bool) -> dict:
    rows = []
    tasks = trace_tasks()
    for rep in range(repeats):
        for tid, task in tasks.items():
            ids = pb.token_ids(task)
            extra = {"regex": pb.regex} if constrained else {}
            out = {}
            # Alternate the order so that neither mode always runs on a warmer cache.
            order = ("seg", "whole") if (rep + tid) % 2 == 0 else ("whole", "seg")
            for mode in order:
                req = EngineRequest(f"{mode}-{tid}-{rep}-{constrained}", ids, make_stop_checker(pb.skillset),
                                    max_new_tokens=48, suspend_at_boundary=(mode == "seg"), extra=dict(extra))
                n_sub = len(eng.submissions)
                dt, ev = timed_run(eng, req)
                subs = eng.submissions[n_sub:]
                out[mode] = {"s": dt, "tokens": len(req.output_token_ids), "ids": list(req.output_token_ids),
                             "segments": sum(e.reason is FinishReason.SEGMENT for e in ev),
                             "suspensions": sum(e.suspended for e in ev),
                             "resumes": subs[1:], "plan": "".join(e.text for e in ev)}
            same = out["seg"]["ids"] == out["whole"]["ids"]
            rows.append({
                "task": tid, "repeat": rep, "seg_s": out["seg"]["s"], "whole_s": out["whole"]["s"],
                "tokens": out["whole"]["tokens"], "segments": out["seg"]["segments"], "same_tokens": same,
                "suspensions": out["seg"]["suspensions"],
                "plan": out["whole"]["plan"],
                "parses": pb.skillset.validate(out["whole"]["plan"], complete=True) is None,
                "resumes": [{"prompt": s["prompt_tokens"], "cached": s["cached_tokens"], "ttft_s": s.get("ttft_s")}
                            for s in out["seg"]["resumes"]],
            })
            r = rows[-1]
            log(f"a/b task {tid} rep {rep}: seg {r['seg_s']:.3f}s whole {r['whole_s']:.3f}s "
                f"{r['segments']} segs same={same} {r['plan']!r}")
    seg = sum(r["seg_s"] for r in rows)
    whole = sum(r["whole_s"] for r in rows)
    per_task = [r["seg_s"] - r["whole_s"] for r in rows]
    resumes = [x for r in rows for x in r["resumes"]]  # resubmissions
    resumed = sum(r["suspensions"] for r in rows)
    return {
        "constrained": constrained,
        "rows": rows,
        "total_seg_s": seg, "total_whole_s": whole,
        "overhead_pct": 100 * (seg - whole) / whole,
        "overhead_ms_per_task_median": 1000 * _med(per_task),
        # robust to CPU contention from other processes (the totals are not)
        "overhead_pct_median_of_ratios": 100 * _med([r["seg_s"] / r["whole_s"] - 1 for r in rows]),
        "suspensions": resumed,  # each resumed: in place or by a resubmission
        "overhead_ms_per_resume": 1000 * (seg - whole) / max(1, resumed),
        "tokens_identical": all(r["same_tokens"] for r in rows),
        "plans_parse": sum(r["parses"] for r in rows) / len(rows),
        "resume_count": len(resumes),
        "resume_cached_ratio_mean": statistics.mean(x["cached"] / x["prompt"] for x in resumes) if resumes else None,
        "resume_uncached_tokens_median": _med([x["prompt"] - x["cached"] for x in resumes]),
        "resume_uncached_tokens_max": max((x["prompt"] - x["cached"] for x in resumes), default=None),
    }


# -- c --------------------------------------------------------------------------------
def bench_resume_vs_reprefill(eng: Any, pb: PromptBuilder, repeats: int) -> dict:
    """Suspend after the first segment, then resubmit with a warm cache vs after a cache reset."""
    rows = []
    for rep in range(repeats):
        for tid, task in trace_tasks().items():
            ids = pb.token_ids(task)
            first = EngineRequest(f"c-{tid}-{rep}", ids, make_stop_checker(pb.skillset), max_new_tokens=48)
            eng.add(first)
            while eng.has_work():
                eng.step()
            ctx = first.all_token_ids
            res = {}
            for mode in ("warm", "cold"):
                if mode == "cold":
                    eng.reset_prefix_cache()
                req = EngineRequest(f"c-{tid}-{rep}-{mode}", ctx, NeverStop(), max_new_tokens=1)
                t0 = time.perf_counter()
                eng.add(req)
                while eng.has_work():
                    eng.step()
                res[mode] = (time.perf_counter() - t0, eng.submissions[-1]["cached_tokens"])
            rows.append({"task": tid, "context_tokens": len(ctx), "warm_s": res["warm"][0],
                         "warm_cached": res["warm"][1], "cold_s": res["cold"][0], "cold_cached": res["cold"][1]})
            r = rows[-1]
            log(f"c task {tid}: {r['context_tokens']} tok, resume {1000 * r['warm_s']:.0f} ms "
                f"(cached {r['warm_cached']}) vs re-prefill {1000 * r['cold_s']:.0f} ms (cached {r['cold_cached']})")
    return {"rows": rows, "warm_ms_median": 1000 * _med([r["warm_s"] for r in rows]),
            "cold_ms_median": 1000 * _med([r["cold_s"] for r in rows]),
            "speedup_median": _med([r["cold_s"] / r["warm_s"] for r in rows])}


# -- d --------------------------------------------------------------------------------
def bench_batch(eng: Any, pb: PromptBuilder, batches: list[int], tokens: int, repeats: int) -> dict:
    base = pb.token_ids(next(iter(trace_tasks().values())))
    rows = []
    for rep in range(repeats):
        for b in batches:
            reqs = [EngineRequest(f"d-{b}-{i}-{rep}", base + [100 + i + 7 * rep], NeverStop(), max_new_tokens=tokens,
                                  suspend_at_boundary=False, extra={"ignore_eos": True}) for i in range(b)]
            for r in reqs:
                eng.add(r)
            steps = []
            while eng.has_work():
                rep_ = eng.step()
                if rep_.prefill_tokens == 0 and rep_.batch_size == b and rep_.new_tokens == b:
                    steps.append(rep_.duration_s)
            steps = steps[2:]  # the first decode steps after a prefill are slower (allocation)
            med = _med(steps)
            rows.append({"batch": b, "repeat": rep, "step_ms": 1000 * med, "tok_s": b / med, "steps": len(steps)})
            log(f"d batch {b} rep {rep}: step {1000 * med:.1f} ms, {b / med:.1f} tok/s")
    # prefill time vs prompt length (cache reset each time: nothing shared)
    pre = []
    for n in (128, 256, 512, 1024):
        for rep in range(repeats):
            eng.reset_prefix_cache()
            ids = [(base[i % len(base)] + rep) % 40000 + 10 for i in range(n)]
            req = EngineRequest(f"p-{n}-{rep}", ids, NeverStop(), max_new_tokens=1, suspend_at_boundary=False)
            eng.add(req)
            t0 = time.perf_counter()
            while eng.has_work():
                eng.step()
            pre.append({"prompt_tokens": n, "repeat": rep, "prefill_s": time.perf_counter() - t0})
            log(f"d prefill {n} tokens: {1000 * pre[-1]['prefill_s']:.0f} ms")
    return {"rows": rows, "prefill": pre}


def fit_step_model(batch: dict) -> dict:
    by_b: dict[int, list[float]] = {}
    for r in batch["rows"]:
        by_b.setdefault(r["batch"], []).append(r["step_ms"] / 1000)
    pts = sorted((b, _med(v)) for b, v in by_b.items())
    # least squares for step = c0 + c1 * (b - 1); decode_s = c0, batch_slowdown = c1 / c0
    c0, c1 = line_fit([b - 1 for b, _ in pts], [y for _, y in pts])
    if c0 <= 0:
        c0 = pts[0][1]
    by_n: dict[int, list[float]] = {}
    for r in batch["prefill"]:
        by_n.setdefault(r["prompt_tokens"], []).append(r["prefill_s"])
    pp = sorted((k, _med(v)) for k, v in by_n.items())
    # slope of prefill time vs tokens (the intercept is one decode step)
    per_tok = line_fit([k for k, _ in pp], [v for _, v in pp])[1]
    return {"decode_s": round(c0, 5), "batch_slowdown": round(max(0.0, c1 / c0), 4),
            "prefill_s_per_token": round(max(per_tok, 1e-6), 7),
            "points": [{"batch": b, "step_s": y, "fit_s": c0 + c1 * (b - 1)} for b, y in pts],
            "prefill_points": [{"tokens": k, "s": v} for k, v in pp]}


def _overhead(a: dict) -> str:
    return (f"{a['suspensions']} resumes ({a['resume_count']} by resubmission) over {len(a['rows'])} plans; "
            f"segmented {a['total_seg_s']:.2f} s vs "
            f"unsegmented {a['total_whole_s']:.2f} s: **{a['overhead_pct']:.1f} %** "
            f"({a['overhead_ms_per_resume']:.1f} ms per resume; median of per-task ratios "
            f"**{a['overhead_pct_median_of_ratios']:.1f} %**); token-identical plans: {a['tokens_identical']}")


def write_segmentation(out: Path, res: dict, cmd: str) -> None:
    """a and b alone: the two ways a suspended generation resumes, measured side by side in one run."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "segmentation.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    a, ip = res["a_segmentation"], res["a_segmentation_in_place"]
    lines = [
        f"# Segmentation overhead ({res['meta']['backend']}, {res['meta']['model']}, batch 1, "
        f"8 LRTrace drone tasks x {len({r['repeat'] for r in a['rows']})})",
        "",
        f"Command: `{cmd}`",
        f"Machine: {res['meta']['machine']}; load average before: {res['meta']['load_before']}.",
        "",
        "| resume | overhead (total) | median of per-task ratios | ms per resume | resumes | resubmissions |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in (("resubmitted (another request needs the engine)", a),
                    ("in place (nothing else in the engine)", ip)):
        lines.append(f"| {name} | {r['overhead_pct']:.1f} % | {r['overhead_pct_median_of_ratios']:.1f} % | "
                     f"{r['overhead_ms_per_resume']:.1f} | {r['suspensions']} | {r['resume_count']} |")
    lines += [
        "",
        f"- resubmitted: {_overhead(a)}",
        f"- in place: {_overhead(ip)}",
        f"- b. cached / prompt tokens per resubmission: mean **{100 * (a['resume_cached_ratio_mean'] or 0):.1f} %**; "
        f"tokens recomputed per resubmission: median {a['resume_uncached_tokens_median']}, "
        f"max {a['resume_uncached_tokens_max']} (block size {res['meta']['block_size']})",
    ]
    (out / "segmentation.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.6))
        ax.bar(["resubmitted", "in place"], [a["overhead_pct"], ip["overhead_pct"]])
        ax.axhline(5.0, color="k", ls="--", lw=1, label="target 5 %")
        ax.set(ylabel="segmented vs whole, %", title="a. segmentation overhead (batch 1)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "segmentation.png", dpi=110)
    except Exception as e:  # the plot is a convenience; numbers are in the files above
        log(f"plot failed: {e}")
    log(f"wrote {out}/segmentation.md")
    print((out / "segmentation.md").read_text())


def write_outputs(out: Path, res: dict, fit_out: Path | None, cmd: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    with (out / "batch.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["batch", "repeat", "step_ms", "tok_s"])
        for r in res["d_batch"]["rows"]:
            w.writerow([r["batch"], r["repeat"], f"{r['step_ms']:.2f}", f"{r['tok_s']:.2f}"])
    fit = res["fit"]
    a, c = res["a_segmentation"], res["c_resume"]
    lines = [
        f"# Engine measurements ({res['meta']['backend']}, {res['meta']['model']}, {res['meta']['dtype']})",
        "",
        f"Command: `{cmd}`",
        f"Machine: {res['meta']['machine']}; load average before/after: {res['meta']['load_before']} / "
        f"{res['meta']['load_after']} (shared machine: timings are medians and noisy).",
        f"Model load: {res['meta']['load_s']:.1f} s (+ import {res['meta']['import_s']:.1f} s).",
        "",
        "## a. Segmentation overhead (batch 1, 8 LRTrace drone tasks; every resume a resubmission)",
        f"- {_overhead(a)}; plans that parse: {100 * a['plans_parse']:.0f} %",
        f"- resumed in place (idle engine, vLLM's request kept): {_overhead(res['a_segmentation_in_place'])}",
    ]
    if "a_segmentation_constrained" in res:
        ac = res["a_segmentation_constrained"]
        cost = 100 * (ac["total_whole_s"] - a["total_whole_s"]) / a["total_whole_s"]
        lines += [
            f"- constrained decoding (skill-grammar regex): overhead {ac['overhead_pct']:.1f} %, plans parse "
            f"{100 * ac['plans_parse']:.0f} %; unsegmented time {ac['total_whole_s']:.2f} s vs "
            f"{a['total_whole_s']:.2f} s unconstrained (**{cost:+.1f} %** cost of constraining)",
        ]
    lines += [
        "",
        "## b. Prefix-cache reuse on resume",
        f"- cached / prompt tokens per resume: mean **{100 * (a['resume_cached_ratio_mean'] or 0):.1f} %**; "
        f"tokens recomputed per resume: median {a['resume_uncached_tokens_median']}, "
        f"max {a['resume_uncached_tokens_max']} (block size {res['meta']['block_size']}: only full blocks are cached)",
        "",
        "## c. Resume vs full re-prefill of the same context",
        f"- time to first new token: resume **{c['warm_ms_median']:.0f} ms** vs re-prefill "
        f"**{c['cold_ms_median']:.0f} ms** (median, speed-up x{c['speedup_median']:.1f})",
        "",
        "## d. Decode throughput vs batch size",
        "",
        "| batch | step ms (median) | tokens/s |",
        "|---|---|---|",
    ]
    by_b: dict[int, list[dict]] = {}
    for r in res["d_batch"]["rows"]:
        by_b.setdefault(r["batch"], []).append(r)
    for b, rs in sorted(by_b.items()):
        lines.append(f"| {b} | {_med([r['step_ms'] for r in rs]):.1f} | {_med([r['tok_s'] for r in rs]):.1f} |")
    lines += [
        "",
        "Prefill: " + ", ".join(f"{p['tokens']} tok {1000 * p['s']:.0f} ms" for p in fit["prefill_points"]),
        "",
        f"Fitted step-time model: decode_s={fit['decode_s']}, batch_slowdown={fit['batch_slowdown']}, "
        f"prefill_s_per_token={fit['prefill_s_per_token']} (written to {fit_out})",
        "",
        "## Native resumable streaming sessions vs resubmission",
        res["sessions_note"],
    ]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(1, 3, figsize=(13, 3.8))
        bs = sorted(by_b)
        ax[0].plot(bs, [_med([r["tok_s"] for r in by_b[b]]) for b in bs], "o-")
        ax[0].set(xlabel="batch size", ylabel="decode tokens/s", title="d. throughput")
        ax[1].plot(bs, [_med([r["step_ms"] for r in by_b[b]]) for b in bs], "o", label="measured")
        ax[1].plot(bs, [1000 * p["fit_s"] for p in fit["points"]], "-", label="fitted model")
        ax[1].set(xlabel="batch size", ylabel="step ms", title="d. step time")
        ax[1].legend()
        cr = c["rows"]
        ax[2].bar(["resume (cache)", "re-prefill"], [c["warm_ms_median"], c["cold_ms_median"]])
        ax[2].set(ylabel="ms to first token", title=f"c. resume, ~{_med([r['context_tokens'] for r in cr]):.0f} tok")
        fig.tight_layout()
        fig.savefig(out / "engine_bench.png", dpi=110)
    except Exception as e:  # the plot is a convenience; numbers are in the files above
        log(f"plot failed: {e}")
    if fit_out is not None:
        meta = res["meta"]
        kv_tokens = meta.get("kv_cache_tokens") or 32768
        fit_out.write_text(
            f"# Simulator step-time model fitted to the real engine (issue 4 §4d).\n"
            f"# Made by: {cmd}\n"
            f"# Engine: {meta['backend']} {meta['vllm_version']} on {meta['machine']}, model {meta['model']} "
            f"({meta['dtype']}), {time.strftime('%Y-%m-%d')}\n"
            f"# step_s = decode_s * (1 + batch_slowdown * (batch - 1)) + prefill_tokens * prefill_s_per_token\n"
            "sim_engine:\n"
            f"  decode_s: {fit['decode_s']}\n"
            f"  batch_slowdown: {fit['batch_slowdown']}\n"
            f"  prefill_s_per_token: {fit['prefill_s_per_token']}\n"
            f"  block_size: {meta['block_size']}\n"
            f"  kv_capacity_tokens: {kv_tokens}\n"
            f"  max_batch: {meta['max_batch']}\n"
            f"  max_prefill_tokens_per_step: 2048\n"
            "  prefix_caching: true\n")


SESSIONS_NOTE = (
    "vLLM 0.32 has native resumable streaming-input sessions (StreamingInput chunks to one request with "
    "resumable=True). Measured in bench/results/vllm_sessions/ (bench.vllm_sessions): a session "
    "stopped at a segment boundary with stop_token_ids resumes about 2x faster than resubmission (~49 vs ~96 ms "
    "to the next token, 1 vs ~12 tokens recomputed), but while paused it keeps its batch slot "
    "(num_waiting_for_streaming_input counts against max_num_seqs) and pins its KV blocks: with max_num_seqs "
    "paused sessions a new request got no token at all. Suspension exists to free the engine while robots move, "
    "so we resume by resubmission.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="config/engine_vllm_cpu.yaml")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results/engine_cpu")
    ap.add_argument("--fit-out", type=Path, default=paths.config_dir() / "sim_engine_fitted_cpu.yaml")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-constrained", action="store_true", help="skip the constrained-decoding run")
    ap.add_argument("--quick", action="store_true", help="1 repeat, batches 1,4 (smoke run)")
    ap.add_argument("--segmentation-only", action="store_true",
                    help="only a and b, resubmitted and in place (no fit written)")
    args = ap.parse_args(argv)
    cmd = "python -m bench.engine_bench " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.quick:
        args.repeats, args.batches = 1, "1,4"
    batches = [int(b) for b in args.batches.split(",")]
    cfg = load_engine_config(args.config)
    if cfg.get("backend") != "vllm":
        log("a-d need the vLLM backend (prefix cache, cache reset); got " + str(cfg.get("backend")))
        return 2
    load_before = os.getloadavg()
    log(f"loading {args.config} ...")
    eng = make_engine(cfg, engine_args={"max_num_seqs": max(batches + [cfg["engine_args"].get("max_num_seqs", 8)])})
    log(f"loaded in {eng.load_s:.1f} s")
    pb = PromptBuilder(eng.tokenizer, "drone")
    # Warm-up: CPU kernels are created per shape on first use; keep that out of the numbers.
    driver.run(eng, [EngineRequest("warm", pb.token_ids("Scene: [] Task: [A] warm up"), make_stop_checker(pb.skillset),
                                   max_new_tokens=24)])
    import vllm

    res: dict[str, Any] = {"meta": {
        "backend": "vllm", "vllm_version": vllm.__version__, "model": os.path.basename(eng.info.model),
        "dtype": str(eng.engine_args.get("dtype")), "block_size": eng.block_size, "max_batch": eng.max_batch,
        "kv_cache_tokens": eng.kv_cache_tokens(), "load_s": eng.load_s, "import_s": eng.import_s,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs", "config": str(args.config),
        "load_before": [round(x, 2) for x in load_before], "prompt_tokens_example": len(pb.token_ids(CAT_TASK)),
    }}
    t0 = time.perf_counter()
    res["a_segmentation"] = bench_segmentation(eng, pb, args.repeats, constrained=False, in_place=False)
    res["a_segmentation_in_place"] = bench_segmentation(eng, pb, args.repeats, constrained=False)
    if args.segmentation_only:
        write_segmentation(args.out, res, cmd)
        eng.close()
        return 0
    if not args.no_constrained:
        res["a_segmentation_constrained"] = bench_segmentation(eng, pb, 1, constrained=True, in_place=False)
    res["c_resume"] = bench_resume_vs_reprefill(eng, pb, args.repeats)
    res["d_batch"] = bench_batch(eng, pb, batches, args.decode_tokens, args.repeats)
    res["fit"] = fit_step_model(res["d_batch"])
    res["sessions_note"] = SESSIONS_NOTE
    res["meta"]["bench_s"] = time.perf_counter() - t0
    res["meta"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    write_outputs(args.out, res, args.fit_out, cmd)
    log(f"wrote {args.out} and {args.fit_out} in {res['meta']['bench_s']:.0f} s")
    print((args.out / "results.md").read_text())
    eng.close()
    return 0


CAT_TASK = "Scene: [] Task: [A] Could you find the cat? If so, go to it."

if __name__ == "__main__":
    sys.exit(main())
