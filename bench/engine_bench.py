"""Real-engine measurements (vLLM by default): segmentation, prefix-cache reuse, decode and prefill cost, and
the simulator's step model fitted to them.

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

f. prefill behind the cached prefix (every run): a 74-token turn behind the
   real prompt's examples, per token against its compute floor (the model's
   FLOPs per token, weights plus attention over the context, at a bf16 matmul
   rate measured in the same run, before the engine loads).

e. the floor (every run): this machine's memory read bandwidth (torch, summing a
   1 GiB tensor on 2 threads, before the engine loads), the model's weight bytes
   in the dtype in use, the time one pass over them takes (a decode step reads
   every weight once), and d's step and per-token times at batch 1..8 as ratios
   to that floor.

Writes results.json, batch.csv, results.md and engine_bench.png to --out.
``--roofline-only``: e and d only (roofline.md). ``--speculative``: with and
without speculative decoding side by side in one run (speculative.md/.png, see
:func:`main_speculative`). ``--engine-arg KEY=VALUE`` overrides engine_args
(``--engine-arg enforce_eager=false`` times torch.compile).
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

import yaml

from bench.common import line_fit
from timelyllm_ros import paths
from timelyllm_ros.domain.plans import plan_templates
from timelyllm_ros.engines import driver
from timelyllm_ros.engines.base import Engine, EngineRequest, FinishReason
from timelyllm_ros.engines.factory import load_engine_config, make_engine, resolve_model_path
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
def bench_batch(eng: Any, pb: PromptBuilder, batches: list[int], tokens: int, repeats: int,
                prefill: bool = True) -> dict:
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
    for n in (128, 256, 512, 1024) if prefill else ():
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


# -- e: the floor ---------------------------------------------------------------------
BYTES_PER = {"float32": 4, "bfloat16": 2, "float16": 2}


def read_bandwidth(threads: int = 2, mib: int = 1024, repeats: int = 7) -> dict:
    """Memory read bandwidth as torch sees it: summing a tensor far larger than the caches. Run it before the
    engine loads (vLLM's CPU worker then pins torch's threads)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
        x.sum()  # page in
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            x.sum()
            times.append(time.perf_counter() - t0)
        nbytes = x.numel() * x.element_size()
        del x
    finally:
        torch.set_num_threads(old)
    return {"threads": threads, "bytes": nbytes, "best_gbs": nbytes / min(times) / 1e9,
            "median_gbs": nbytes / _med(times) / 1e9}


def weight_bytes(model_dir: str, dtype: str) -> dict:
    """Parameters in the model's safetensors files (headers only) and their bytes in ``dtype``. Tied
    embeddings are stored once and read once per decode step (by the LM head)."""
    n = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with f.open("rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
        for k, v in header.items():
            if k != "__metadata__":
                numel = 1
                for d in v["shape"]:
                    numel *= int(d)
                n += numel
    return {"params": n, "dtype": dtype, "bytes": n * BYTES_PER[dtype]}


def roofline(bw: dict, weights: dict, batch: dict) -> dict:
    """d's decode steps against the floor: one read of every weight at ``bw['best_gbs']`` (KV-cache and
    activation traffic are small beside 135M parameters and are left out, so the floor is a lower bound)."""
    floor_s = weights["bytes"] / (bw["best_gbs"] * 1e9)
    by_b: dict[int, list[float]] = {}
    for r in batch["rows"]:
        by_b.setdefault(r["batch"], []).append(r["step_ms"] / 1000)
    # Each repeat's median step; the best repeat counts (other processes on a shared machine only add time).
    rows = [{"batch": b, "step_ms": 1000 * min(v), "step_x_floor": min(v) / floor_s,
             "token_ms": 1000 * min(v) / b, "token_x_floor": min(v) / b / floor_s} for b, v in sorted(by_b.items())]
    return {"bandwidth": bw, "weights": weights, "floor_ms": 1000 * floor_s, "rows": rows}


def roofline_lines(rf: dict) -> list[str]:
    bw, w = rf["bandwidth"], rf["weights"]
    lines = [
        f"- read bandwidth (torch, {bw['threads']} threads, {bw['bytes'] / 2**30:.0f} GiB summed): best "
        f"**{bw['best_gbs']:.1f} GB/s** (median {bw['median_gbs']:.1f})",
        f"- weights: {w['params'] / 1e6:.1f} M parameters x {BYTES_PER[w['dtype']]} B ({w['dtype']}) = "
        f"**{w['bytes'] / 1e6:.0f} MB** read per decode step",
        f"- floor per decode step (weights / bandwidth): **{rf['floor_ms']:.2f} ms**",
        "",
        "| batch | step ms | step / floor | ms per token | per token / floor |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r['batch']} | {r['step_ms']:.1f} | {r['step_x_floor']:.2f}x | {r['token_ms']:.1f} | "
              f"{r['token_x_floor']:.2f}x |" for r in rf["rows"]]
    return lines


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
        "## e. Decode step vs the floor (one read of every weight)",
        *roofline_lines(res["e_roofline"]),
        "",
        "## f. Prefill behind the cached prefix vs its compute floor",
        *prefill_floor_lines(res["f_prefill_floor"]),
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
            f"# Simulator step-time model fitted to the real engine.\n"
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


def _engine_overrides(args: argparse.Namespace, cfg: dict, batches: list[int]) -> dict:
    """make_engine overrides of the command line: --engine-arg KEY=VALUE (a YAML value), --dtype."""
    ea: dict[str, Any] = {"max_num_seqs": max(batches + [cfg["engine_args"].get("max_num_seqs", 8)])}
    for kv in args.engine_arg:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise SystemExit(f"--engine-arg {kv!r}: expected KEY=VALUE")
        ea[k] = yaml.safe_load(v)
    return {"engine_args": ea} | ({"dtype": args.dtype} if args.dtype else {})


def _meta(eng: VllmEngine, args: argparse.Namespace, load_before: tuple[float, ...], pb: PromptBuilder) -> dict:
    import torch
    import vllm

    return {
        "backend": "vllm", "vllm_version": vllm.__version__, "model": os.path.basename(eng.info.model),
        "dtype": eng.info.dtype, "dtype_reason": eng.info.dtype_reason, "speculative": eng.info.speculative or "off",
        "enforce_eager": bool(eng.engine_args.get("enforce_eager", False)), "torch_threads": torch.get_num_threads(),
        "block_size": eng.block_size, "max_batch": eng.max_batch,
        "kv_cache_tokens": eng.kv_cache_tokens(), "load_s": eng.load_s, "import_s": eng.import_s,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs", "config": str(args.config),
        "load_before": [round(x, 2) for x in load_before], "prompt_tokens_example": len(pb.token_ids(CAT_TASK)),
    }


def _warm(eng: Engine, pb: PromptBuilder) -> None:
    """CPU kernels are created per shape on first use; keep that out of the numbers."""
    driver.run(eng, [EngineRequest("warm", pb.token_ids("Scene: [] Task: [A] warm up"), make_stop_checker(pb.skillset),
                                   max_new_tokens=24)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="config/engine_vllm_cpu.yaml")
    ap.add_argument("--out", type=Path, default=None,
                    help="results folder (default bench/results/engine_cpu; --speculative: results/speculative)")
    ap.add_argument("--fit-out", type=Path, default=paths.config_dir() / "sim_engine_fitted_cpu.yaml")
    ap.add_argument("--batches", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-constrained", action="store_true", help="skip the constrained-decoding run")
    ap.add_argument("--quick", action="store_true", help="1 repeat, batches 1,2,4,8 (smoke run)")
    ap.add_argument("--segmentation-only", action="store_true",
                    help="only a and b, resubmitted and in place (no fit written)")
    ap.add_argument("--roofline-only", action="store_true", help="only d and e: step times against the floor")
    ap.add_argument("--roofline-dtypes", metavar="D1,D2",
                    help="with --roofline-only: these dtypes side by side (e.g. bfloat16,float32)")
    ap.add_argument("--roofline-compile", action="store_true",
                    help="with --roofline-only: torch.compile (enforce_eager false) beside eager")
    ap.add_argument("--speculative", action="store_true",
                    help="with and without speculative decoding, side by side (drone and arm task types)")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], help="override the config's dtype")
    ap.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                    help="override an engine_args field (value parsed as YAML), e.g. enforce_eager=false")
    args = ap.parse_args(argv)
    cmd = "python -m bench.engine_bench " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.quick:
        args.repeats, args.batches = 1, "1,2,4,8"
    if args.out is None:
        args.out = Path(__file__).resolve().parent / ("results/speculative" if args.speculative else
                                                      "results/engine_cpu")
    batches = [int(b) for b in args.batches.split(",")]
    cfg = load_engine_config(args.config)
    if cfg.get("backend") != "vllm":
        log("a-e need the vLLM backend (prefix cache, cache reset); got " + str(cfg.get("backend")))
        return 2
    load_before = os.getloadavg()
    overrides = _engine_overrides(args, cfg, batches)
    if args.speculative:
        return main_speculative(args, cfg, overrides, load_before, cmd)
    bw = read_bandwidth()  # before vLLM pins torch's threads
    log(f"read bandwidth {bw['best_gbs']:.1f} GB/s (best of 7, median {bw['median_gbs']:.1f})")
    # a-e measure plain decoding (one token per step); --speculative compares speculation side by side.
    overrides["engine_args"].setdefault("speculative_config", None)
    mm = matmul_rate(model_dims(resolve_model_path(str(cfg["engine_args"]["model"]))),
                     "bfloat16" if cfg.get("dtype", "auto") != "float32" else "float32")
    log(f"matmul {mm['best_gflops']:.0f} GFLOP/s ({mm['dtype']}, best of {TURN_TOKENS} and 512 rows)")
    if args.roofline_only:
        return main_roofline(args, cfg, overrides, load_before, cmd, batches, bw, mm)
    log(f"loading {args.config} ...")
    eng = make_engine(cfg, **overrides)
    log(f"loaded in {eng.load_s:.1f} s: dtype {eng.info.dtype} ({eng.info.dtype_reason})")
    pb = PromptBuilder(eng.tokenizer, "drone")
    _warm(eng, pb)
    res: dict[str, Any] = {"meta": _meta(eng, args, load_before, pb)}
    weights = weight_bytes(eng.engine_args["model"], eng.info.dtype)
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
    res["e_roofline"] = roofline(bw, weights, res["d_batch"])
    res["f_prefill_floor"] = bench_prefill_floor(eng, pb, mm)
    res["fit"] = fit_step_model(res["d_batch"])
    res["sessions_note"] = SESSIONS_NOTE
    res["meta"]["bench_s"] = time.perf_counter() - t0
    res["meta"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    write_outputs(args.out, res, args.fit_out, cmd)
    log(f"wrote {args.out} and {args.fit_out} in {res['meta']['bench_s']:.0f} s")
    print((args.out / "results.md").read_text())
    eng.close()
    return 0


def main_roofline(args: argparse.Namespace, cfg: dict, overrides: dict, load_before: tuple[float, ...], cmd: str,
                  batches: list[int], bw: dict, mm: dict[str, Any]) -> int:
    """d and e only, for each dtype of --roofline-dtypes (default: the config's), the engines loaded side by
    side and measured in turn at each batch size, so that the machine's load hits them alike."""
    engines: dict[str, tuple[VllmEngine, PromptBuilder]] = {}
    variants_wanted: list[tuple[str | None, bool | None]] = [
        (d, None) for d in (args.roofline_dtypes.split(",") if args.roofline_dtypes else [None])]
    if args.roofline_compile:  # torch.compile (vLLM's default) beside eager, same dtype(s)
        variants_wanted = [(d, e) for d, _ in variants_wanted for e in (True, False)]
    for d, eager in variants_wanted:
        ov = overrides | ({"dtype": d} if d else {})
        if eager is not None:
            ov = ov | {"engine_args": {**ov["engine_args"], "enforce_eager": eager}}
        log(f"loading {args.config} (dtype {d or cfg.get('dtype', 'auto')}, enforce_eager {eager}) ...")
        eng = make_engine(cfg, **ov)
        log(f"loaded in {eng.load_s:.1f} s: dtype {eng.info.dtype} ({eng.info.dtype_reason})")
        pb = PromptBuilder(eng.tokenizer, "drone")
        _warm(eng, pb)
        label = eng.info.dtype + ("" if eager is None else ", eager" if eager else ", torch.compile")
        engines[label] = (eng, pb)
    rows: dict[str, list[dict]] = {k: [] for k in engines}
    t0 = time.perf_counter()
    for rep in range(args.repeats):
        for b in batches:
            for k, (eng, pb) in engines.items():
                got = bench_batch(eng, pb, [b], args.decode_tokens, 1, prefill=False)["rows"]
                rows[k] += [r | {"repeat": rep, "dtype": k} for r in got]
    variants = {}
    for k, (eng, pb) in engines.items():
        variants[k] = {"meta": _meta(eng, args, load_before, pb), "d_batch": {"rows": rows[k], "prefill": []},
                       "e_roofline": roofline(bw, weight_bytes(eng.engine_args["model"], eng.info.dtype),
                                              {"rows": rows[k]}),
                       "f_prefill_floor": bench_prefill_floor(eng, pb, mm)}
        eng.close()
    res = {"bench_s": time.perf_counter() - t0, "load_after": [round(x, 2) for x in os.getloadavg()],
           "variants": variants}
    write_roofline(args.out, res, cmd)
    return 0


def write_roofline(out: Path, res: dict, cmd: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "roofline.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    vs = res["variants"]
    m = next(iter(vs.values()))["meta"]
    lines = [f"# Decode step vs the floor ({m['backend']} {m['vllm_version']}, {m['model']}, speculation off)", "",
             f"Command: `{cmd}`",
             f"Machine: {m['machine']}; load average before/after: {m['load_before']} / {res['load_after']} (shared "
             f"machine: each batch size's best repeat; compare within this run only).", ""]
    for k, v in vs.items():
        vm = v["meta"]
        lines += [f"## {k} ({vm['dtype_reason']}; enforce_eager={vm['enforce_eager']}; engine start "
                  f"{vm['load_s']:.1f} s)", "",
                  *roofline_lines(v["e_roofline"]), "",
                  "### Prefill behind the cached prefix vs its compute floor", "",
                  *prefill_floor_lines(v["f_prefill_floor"]), ""]
    if len(vs) == 2:
        (ka, a), (kb, b) = vs.items()
        lines += [f"## {ka} / {kb}, same run", "", "| batch | step ratio |", "|---|---|"]
        lines += [f"| {ra['batch']} | {ra['step_ms'] / rb['step_ms']:.2f}x |"
                  for ra, rb in zip(a["e_roofline"]["rows"], b["e_roofline"]["rows"], strict=True)]
    (out / "roofline.md").write_text("\n".join(lines) + "\n")
    log(f"wrote {out}/roofline.md")
    print((out / "roofline.md").read_text())


# -- f: prefill behind the cached prefix vs its compute floor -----------------------------------------------------
TURN_TOKENS = 74  # an emergency's own turn behind the examples (prompts aligned to the KV blocks)


def model_dims(model_dir: str) -> dict[str, int]:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    heads = int(cfg["num_attention_heads"])
    return {"hidden": int(cfg["hidden_size"]), "layers": int(cfg["num_hidden_layers"]), "heads": heads,
            "kv_heads": int(cfg.get("num_key_value_heads", heads)),
            "head_dim": int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            "intermediate": int(cfg["intermediate_size"])}


def prefill_flops(dims: dict[str, int], context: float) -> dict[str, float]:
    """FLOPs one prompt token costs in a prefill: 2 per weight of the decoder layers (the LM head runs for the last
    token only) plus attention over ``context`` earlier tokens (QK^T and PV: 4 * heads * head_dim per token per
    layer)."""
    h, hd, L = dims["hidden"], dims["head_dim"], dims["layers"]
    per_layer = h * dims["heads"] * hd * 2 + h * dims["kv_heads"] * hd * 2 + 3 * h * dims["intermediate"]
    return {"weights": 2.0 * L * per_layer, "attention": 4.0 * L * dims["heads"] * hd * context}


def matmul_rate(dims: dict[str, int], dtype: str, threads: int = 2, repeats: int = 7) -> dict[str, Any]:
    """GFLOP/s of a matmul of a prefill's MLP shape (rows x hidden x intermediate) in ``dtype`` on ``threads``
    threads, for a turn's rows and for 512 (the better, the floor's rate). Run it before the engine loads."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    out: dict[str, Any] = {"threads": threads, "dtype": dtype}
    try:
        for rows in (TURN_TOKENS, 512):
            a = torch.randn(rows, dims["hidden"], dtype=getattr(torch, dtype))
            b = torch.randn(dims["hidden"], dims["intermediate"], dtype=getattr(torch, dtype))
            a @ b
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                for _ in range(20):
                    a @ b
                times.append((time.perf_counter() - t0) / 20)
            out[f"gflops_{rows}"] = 2 * rows * dims["hidden"] * dims["intermediate"] / min(times) / 1e9
    finally:
        torch.set_num_threads(old)
    out["best_gflops"] = max(out[f"gflops_{r}"] for r in (TURN_TOKENS, 512))
    return out


def bench_prefill_floor(eng: Any, pb: PromptBuilder, mm: dict[str, Any], repeats: int = 5) -> dict[str, Any]:
    """A turn of TURN_TOKENS new tokens behind a cached prefix of the real prompt's length (the examples of an
    emergency's prompt), timed as the step that computes it; per token against the floor ``prefill_flops`` /
    ``mm['best_gflops']``, and the same turn with nothing before it."""
    import random

    rng = random.Random(0)
    task = next(t.task_input for t in plan_templates().values() if t.robot_type == "drone" and "[E]" in t.task_input)
    prefix = pb.token_ids(task)[:-TURN_TOKENS]  # the examples and the system text, as the planner sends them
    vocab = range(1000, min(40000, len(eng.tokenizer)))
    checker = make_stop_checker(pb.skillset)

    def turn_s(ids: list[int]) -> float:
        eng.add(EngineRequest(f"pf{rng.random()}", ids, checker, max_new_tokens=1, extra={"constrained": False}))
        t0 = time.perf_counter()
        eng.step()
        dt = time.perf_counter() - t0
        while eng.has_work():
            eng.step()
        return dt

    dims = model_dims(eng.engine_args["model"])
    rows = {}
    for name, pre in (("behind the prefix", prefix), ("alone", [])):
        eng.reset_prefix_cache()
        if pre:
            turn_s(pre + [rng.choice(vocab)])  # the prefix cached, as the warm-up leaves it
        times = [turn_s(pre + [rng.choice(vocab) for _ in range(TURN_TOKENS)]) for _ in range(repeats)]
        fl = prefill_flops(dims, len(pre) + (TURN_TOKENS + 1) / 2)
        floor_s = (fl["weights"] + fl["attention"]) / (mm["best_gflops"] * 1e9)
        per_tok = _med(times) / TURN_TOKENS
        rows[name] = {"prefix_tokens": len(pre), "turn_tokens": TURN_TOKENS, "step_ms": 1000 * _med(times),
                      "ms_per_token": 1000 * per_tok, "floor_ms_per_token": 1000 * floor_s,
                      "attention_share_of_floor": fl["attention"] / (fl["weights"] + fl["attention"]),
                      "x_floor": per_tok / floor_s}
        log(f"f prefill {TURN_TOKENS} tokens {name} ({len(pre)} cached): {1000 * per_tok:.2f} ms/token, "
            f"floor {1000 * floor_s:.2f} ({per_tok / floor_s:.1f}x)")
    return {"matmul": mm, "dims": dims, "rows": rows}


def prefill_floor_lines(pf: dict[str, Any]) -> list[str]:
    mm = pf["matmul"]
    lines = [f"- matmul rate ({mm['dtype']}, {mm['threads']} threads, {pf['dims']['hidden']}x"
             f"{pf['dims']['intermediate']}): {mm[f'gflops_{TURN_TOKENS}']:.0f} GFLOP/s at {TURN_TOKENS} rows, "
             f"{mm['gflops_512']:.0f} at 512; the floor takes **{mm['best_gflops']:.0f} GFLOP/s**",
             "- floor per prompt token = (2 x decoder weights + 4 x layers x heads x head_dim x context) / that rate",
             "", "| turn | cached prefix | step ms | ms per token | floor ms per token | x floor | attention share "
             "of the floor |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['turn_tokens']} tokens {name} | {r['prefix_tokens']} | {r['step_ms']:.1f} | "
              f"{r['ms_per_token']:.2f} | {r['floor_ms_per_token']:.3f} | {r['x_floor']:.1f}x | "
              f"{100 * r['attention_share_of_floor']:.0f} % |" for name, r in pf["rows"].items()]
    return lines


# -- speculative decoding, on and off side by side --------------------------------------------------------------
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def _spec_plan(eng: VllmEngine, pb: PromptBuilder, task: str, gid: str) -> dict:
    """One greedy segmented plan alone on the engine, each suspension resumed at once (in place)."""
    req = EngineRequest(gid, pb.token_ids(task), make_stop_checker(pb.skillset), max_new_tokens=128)
    c0, kept0 = eng.speculation_counters(), eng.kept_past_boundary
    events: list = []
    steps, ttft, ttfs = 0, None, None
    decode_steps: list[float] = []  # durations of the steps after the first token that wrote some
    t0 = time.perf_counter()
    eng.add(req)
    while not (events and events[-1].final):
        if not eng.has_work():
            eng.add(req)
        had = len(req.output_token_ids)
        rep = eng.step()
        steps += 1
        now = time.perf_counter() - t0
        if had and rep.new_tokens and not rep.prefill_tokens:
            decode_steps.append(rep.duration_s)
        if ttft is None and req.output_token_ids:
            ttft = now
        events += rep.events
        if ttfs is None and any(e.reason is FinishReason.SEGMENT for e in rep.events):
            ttfs = now
    total = time.perf_counter() - t0
    c1 = eng.speculation_counters()
    n = len(req.output_token_ids)
    return {"ids": list(req.output_token_ids), "segments": [(e.reason.value, e.text) for e in events],
            "tokens": n, "steps": steps, "total_s": total, "ttft_s": ttft,
            "ttfs_s": ttfs if ttfs is not None else total,
            "ms_per_token": 1000 * total / n, "decode_ms_per_token": 1000 * (total - ttft) / max(1, n - 1),
            "decode_tokens_per_step": (n - 1) / max(1, steps - 1), "decode_step_ms": 1000 * _med(decode_steps),
            "draft_tokens": c1.get("draft_tokens", 0) - c0.get("draft_tokens", 0),
            "accepted_tokens": c1.get("accepted_tokens", 0) - c0.get("accepted_tokens", 0),
            "kept_past_boundary": eng.kept_past_boundary - kept0}


def _spec_batch(eng: VllmEngine, pbs: dict[str, PromptBuilder], tpls: list, tag: str) -> dict:
    """All ``tpls`` at once (suspended ones resumed at once: resubmissions, the engine is busy)."""
    reqs = [EngineRequest(f"{tag}-{t.name}", pbs[t.robot_type].token_ids(t.task_input),
                          make_stop_checker(pbs[t.robot_type].skillset), max_new_tokens=128) for t in tpls]
    first: dict[str, float] = {}
    c0, steps = eng.speculation_counters(), [0]
    t0 = time.perf_counter()

    def on_event(ev) -> None:
        first.setdefault(ev.gen_id, time.perf_counter() - t0)

    driver.run(eng, reqs, on_event=on_event, on_step=lambda n: steps.__setitem__(0, n))
    total = time.perf_counter() - t0
    c1 = eng.speculation_counters()
    n = sum(len(r.output_token_ids) for r in reqs)
    return {"plans": len(reqs), "tokens": n, "steps": steps[0], "total_s": total, "tokens_per_s": n / total,
            "ttfs_median_s": _med(list(first.values())), "ids": {r.gen_id.split("-", 1)[1]: r.output_token_ids
                                                                 for r in reqs},
            "draft_tokens": c1.get("draft_tokens", 0) - c0.get("draft_tokens", 0),
            "accepted_tokens": c1.get("accepted_tokens", 0) - c0.get("accepted_tokens", 0)}


def main_speculative(args: argparse.Namespace, cfg: dict, overrides: dict, load_before: tuple[float, ...],
                     cmd: str) -> int:
    """The config's speculative_config (n-gram prompt lookup if it has none) against none, in one process,
    plan by plan in alternating order: drone and arm task types (data/plans.yaml) alone at batch 1, then
    the drone ones all at once."""
    spec = overrides["engine_args"].get("speculative_config") or cfg["engine_args"].get("speculative_config") or NGRAM
    engines: dict[str, VllmEngine] = {}
    pbs: dict[str, dict[str, PromptBuilder]] = {}
    for mode, sc in (("off", None), ("on", spec)):
        ov = {**overrides, "engine_args": {**overrides["engine_args"], "speculative_config": sc}}
        log(f"loading {args.config} with speculative decoding {mode} ...")
        eng = make_engine(cfg, **ov)
        engines[mode] = eng
        pbs[mode] = {rt: PromptBuilder(eng.tokenizer, rt) for rt in ("drone", "arm")}
        _warm(eng, pbs[mode]["drone"])
    tpls = [t for t in plan_templates().values() if t.robot_type in ("drone", "arm")]
    res: dict[str, Any] = {"meta": _meta(engines["on"], args, load_before, pbs["on"]["drone"]) | {
        "speculative_config": spec}, "plans": [], "batch": []}
    t0 = time.perf_counter()
    for rep in range(args.repeats):
        for i, tpl in enumerate(tpls):
            order = ("off", "on") if (rep + i) % 2 == 0 else ("on", "off")  # neither always on a warmer machine
            out = {m: _spec_plan(engines[m], pbs[m][tpl.robot_type], tpl.task_input, f"{m}-{tpl.name}-{rep}")
                   for m in order}
            row = {"task": tpl.name, "robot_type": tpl.robot_type, "repeat": rep,
                   "same_tokens": out["on"]["ids"] == out["off"]["ids"],
                   "same_segments": out["on"]["segments"] == out["off"]["segments"]}
            for m, o in out.items():
                row |= {f"{m}_{k}": v for k, v in o.items() if k not in ("ids", "segments")}
            res["plans"].append(row)
            log(f"{tpl.name} rep {rep}: first segment {1000 * out['off']['ttfs_s']:.0f} -> "
                f"{1000 * out['on']['ttfs_s']:.0f} ms, {out['off']['ms_per_token']:.1f} -> "
                f"{out['on']['ms_per_token']:.1f} ms/token, {out['on']['decode_tokens_per_step']:.2f} tok/step, "
                f"same={row['same_tokens']}")
    drones = [t for t in tpls if t.robot_type == "drone"]
    for rep in range(args.repeats):
        order = ("off", "on") if rep % 2 == 0 else ("on", "off")
        out = {m: _spec_batch(engines[m], pbs[m], drones, f"b{rep}{m}") for m in order}
        res["batch"].append({"repeat": rep, "same_tokens": out["on"].pop("ids") == out["off"].pop("ids"),
                             **{f"{m}_{k}": v for m, o in out.items() for k, v in o.items()}})
        log(f"batch of {len(drones)} rep {rep}: {out['off']['tokens_per_s']:.1f} -> {out['on']['tokens_per_s']:.1f} "
            f"tokens/s")
    res["meta"]["bench_s"] = time.perf_counter() - t0
    res["meta"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    write_speculative(args.out, res, cmd)
    for eng in engines.values():
        eng.close()
    return 0


def _best_per_task(rows: list[dict], key: str) -> list[float]:
    """Each task's best (lowest) value over its repeats: on a shared machine other processes only add time."""
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(r["task"], []).append(r[key])
    return [min(v) for v in by.values()]


def summarize_speculative(res: dict) -> list[dict]:
    """Per robot type and mode: times as the median over tasks of each task's best repeat; tokens per step
    and acceptance over all plans; decode step time as the median of the plans' median steps."""
    out = []
    for rt in ("drone", "arm"):
        rows = [r for r in res["plans"] if r["robot_type"] == rt]
        for m in ("off", "on"):
            drafts = sum(r[f"{m}_draft_tokens"] for r in rows)
            steps = sum(r[f"{m}_steps"] - 1 for r in rows)
            tps = sum(r[f"{m}_tokens"] - 1 for r in rows) / max(1, steps)
            step_ms = _med([r[f"{m}_decode_step_ms"] for r in rows])
            out.append({
                "robot_type": rt, "mode": m, "plans": len(rows), "tokens": sum(r[f"{m}_tokens"] for r in rows),
                "ttfs_ms": 1000 * _med(_best_per_task(rows, f"{m}_ttfs_s")),
                "ms_per_token": _med(_best_per_task(rows, f"{m}_ms_per_token")),
                "decode_ms_per_token": _med(_best_per_task(rows, f"{m}_decode_ms_per_token")),
                "decode_step_ms": step_ms, "step_ms_per_token": step_ms / tps,
                "decode_tokens_per_step": tps,
                "acceptance": sum(r[f"{m}_accepted_tokens"] for r in rows) / drafts if drafts else None,
                "kept_past_boundary": sum(r[f"{m}_kept_past_boundary"] for r in rows),
                "same_tokens": sum(r["same_tokens"] for r in rows),
            })
    return out


def write_speculative(out: Path, res: dict, cmd: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    res["summary"] = summary = summarize_speculative(res)
    (out / "speculative.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    m = res["meta"]
    n_rep = len({r["repeat"] for r in res["plans"]})
    lines = [
        f"# Speculative decoding on and off ({m['backend']} {m['vllm_version']}, {m['model']}, {m['dtype']}: "
        f"{m['dtype_reason']})", "",
        f"Command: `{cmd}`",
        f"Machine: {m['machine']}; load average before/after: {m['load_before']} / {m['load_after']} (shared "
        f"machine: compare on/off within this run only).",
        f"Speculation: {m['speculative']} (`{json.dumps(m['speculative_config'])}`). Greedy, segmented; every "
        f"suspension resumed at once. Each plan alone on its engine (batch 1), on and off alternating, "
        f"{n_rep} repeat(s).", "",
        "| robot | speculation | plans | first segment ms | ms per token (whole plan) | decode ms per "
        "token | decode step ms (median) | decode tokens per step | step ms / tokens per step | acceptance | "
        "tokens kept past a boundary | token-identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary:
        acc = f"{100 * r['acceptance']:.0f} %" if r["acceptance"] is not None else "-"
        lines.append(f"| {r['robot_type']} | {r['mode']} | {r['plans']} | {r['ttfs_ms']:.0f} | "
                     f"{r['ms_per_token']:.1f} | {r['decode_ms_per_token']:.1f} | {r['decode_step_ms']:.1f} | "
                     f"{r['decode_tokens_per_step']:.2f} | {r['step_ms_per_token']:.1f} | "
                     f"{acc} | {r['kept_past_boundary']} | {r['same_tokens']}/{r['plans']} |")
    lines += ["", "Times: each task's best repeat (other processes only add time), median over the tasks. "
              "Ratios on / off: " + "; ".join(
                  f"{rt}: first segment {on['ttfs_ms'] / off['ttfs_ms']:.2f}x, ms per token "
                  f"{on['ms_per_token'] / off['ms_per_token']:.2f}x, step ms / tokens per step "
                  f"{on['step_ms_per_token'] / off['step_ms_per_token']:.2f}x"
                  for rt in ("drone", "arm")
                  for off, on in [[r for r in summary if r["robot_type"] == rt]])]
    if res["batch"]:
        b = res["batch"]
        lines += ["", f"All {b[0]['off_plans']} drone task types at once (resumes are resubmissions; best of "
                  f"{len(b)} runs):", "",
                  "| speculation | tokens/s | first segment ms (median of the plans) | acceptance | "
                  "token-identical runs |",
                  "|---|---|---|---|---|"]
        for md in ("off", "on"):
            drafts = sum(r[f"{md}_draft_tokens"] for r in b)
            acc = f"{100 * sum(r[f'{md}_accepted_tokens'] for r in b) / drafts:.0f} %" if drafts else "-"
            lines.append(f"| {md} | {max(r[f'{md}_tokens_per_s'] for r in b):.1f} | "
                         f"{1000 * min(r[f'{md}_ttfs_median_s'] for r in b):.0f} | {acc} | "
                         f"{sum(r['same_tokens'] for r in b)}/{len(b)} |")
    lines += ["", "Acceptance: accepted / proposed draft tokens (vLLM's counters). Decode tokens per step: tokens "
              "after the first over the steps after the first. First segment: from submission to the first "
              "segment, prefill included (the shared system prompt is in the prefix cache)."]
    (out / "speculative.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(1, 3, figsize=(13, 3.8))
        for i, (key, label) in enumerate((("ttfs_ms", "first segment, ms"), ("ms_per_token", "ms per token"),
                                          ("decode_tokens_per_step", "decode tokens per step"))):
            for j, md in enumerate(("off", "on")):
                rs = [r for r in summary if r["mode"] == md]
                ax[i].bar([k + 0.4 * j for k in range(len(rs))], [r[key] for r in rs], width=0.4,
                          label=f"speculation {md}")
            ax[i].set_xticks([0.2, 1.2], ["drone", "arm"])
            ax[i].set(ylabel=label, title=label)
        ax[0].legend()
        fig.suptitle(f"n-gram speculative decoding, {m['model']} {m['dtype']}, batch 1")
        fig.tight_layout()
        fig.savefig(out / "speculative.png", dpi=110)
    except Exception as e:  # the plot is a convenience; numbers are in the files above
        log(f"plot failed: {e}")
    log(f"wrote {out}/speculative.md")
    print((out / "speculative.md").read_text())


CAT_TASK = "Scene: [] Task: [A] Could you find the cat? If so, go to it."

if __name__ == "__main__":
    sys.exit(main())
