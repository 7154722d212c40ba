"""vLLM native resumable streaming-input sessions vs resubmission.

    python -m bench.vllm_sessions --out bench/results/vllm_sessions

vLLM 0.32 has resumable sessions: a request with ``resumable=True`` (what
``AsyncLLM.generate`` builds from an async generator of ``StreamingInput``)
does not finish when it stops; the scheduler parks it in
``WAITING_FOR_STREAMING_REQ`` until the next input chunk with the same request
id arrives, which is appended to the context (the last sampled token of the
previous chunk is dropped: it was never run through the model). We drive the
same mechanism from the synchronous in-process ``LLMEngine`` exactly as
``AsyncLLM._add_streaming_input_request`` does (``process_inputs(...,
resumable=True)`` + ``output_processor.add_request`` + ``engine_core.add_request``).

For the drone plans of data/plans.yaml (PromptBuilder "drone", greedy, 48 tokens) it compares

(a) resubmission as VllmEngine does it: at a segment boundary the request is
    aborted; resume = a new request ``prompt + generated`` (automatic prefix caching);
(b) native session: every chunk carries ``stop_token_ids`` = all vocabulary tokens
    whose text contains a MiniSpec terminator (``; } ) {``), so the session stops
    on every *candidate* boundary token; the stop checker decides; at a real
    boundary the session stays paused (the robot executes), otherwise it is
    continued at once ("false stop"). Resume = next chunk ``[last sampled token]``.

and records: time from resume to the next token, prefill tokens recomputed per
resume, what a paused generation holds (scheduler running / waiting / paused
sessions, KV blocks in use), whether the stop lands exactly on the boundary,
and a batch-slot experiment with ``max_num_seqs`` paused generations plus one
new request.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from timelyllm_ros.domain.plans import plan_templates
from timelyllm_ros.engines.base import EngineRequest
from timelyllm_ros.engines.detok import IncrementalDetokenizer
from timelyllm_ros.engines.factory import make_engine
from timelyllm_ros.engines.prompts import PromptBuilder
from timelyllm_ros.skills.segmenter import make_stop_checker

TERMINATORS = ";}){"
MAX_NEW = 48
STEP_CAP = 400  # bounded loops: a stalled request must not hang the bench


def log(msg: str) -> None:
    print(f"[vllm_sessions {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def sched_state(eng: Any, int_id: str | None = None) -> dict:
    """What vLLM's scheduler holds right now (in-process core)."""
    s = eng.scheduler
    pool = s.kv_cache_manager.block_pool
    total = pool.num_gpu_blocks - 1  # minus the null block, as get_usage()
    st = {
        "running": len(s.running),
        "waiting": len(s.waiting) + len(getattr(s, "kv_holding_waiting", ())),
        "paused_sessions": int(getattr(s, "num_waiting_for_streaming_input", 0)),
        "requests_known": len(s.requests),
        "kv_blocks_in_use": total - pool.get_num_free_blocks(),
        "kv_usage": round(float(s.kv_cache_manager.usage), 5),
    }
    if int_id is not None:
        st["request_alive"] = int_id in s.requests
        st["request_blocks"] = (sum(len(b) for b in s.kv_cache_manager.get_block_ids(int_id))
                                if int_id in s.requests else 0)
    return st


def candidate_stop_ids(tokenizer: Any) -> list[int]:
    """Vocabulary tokens whose text contains a terminator: every possible segment end."""
    out = []
    for i in range(len(tokenizer)):
        t = tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if any(c in t for c in TERMINATORS):
            out.append(i)
    return out


# -- (a) resubmission ------------------------------------------------------------------
def run_resubmission(eng: Any, pb: PromptBuilder, name: str, ids: list[int]) -> dict:
    req = EngineRequest(name, ids, make_stop_checker(pb.skillset), max_new_tokens=MAX_NEW)
    t0 = time.perf_counter()
    eng.add(req)
    segments, resumes, paused = [], [], []
    pending: float | None = None
    n_before = 0
    while eng.has_work():
        rep = eng.step()
        now = time.perf_counter()
        if pending is not None and len(req.output_token_ids) > n_before:
            sub = eng.submissions[-1]
            resumes.append({"resume_to_token_ms": 1000 * (now - pending), "context": sub["prompt_tokens"],
                            "recomputed": sub["prompt_tokens"] - sub["cached_tokens"]})
            pending = None
        for ev in rep.events:
            segments.append(ev.text)
            if ev.suspended:
                # the robot would execute now: what does vLLM still hold for this generation?
                st = sched_state(eng)
                st["request_alive"] = eng.backend_has_request(name)
                paused.append(st)
                n_before = len(req.output_token_ids)
                pending = time.perf_counter()
                eng.add(req)
    return {"mode": "resubmission", "wall_s": time.perf_counter() - t0, "tokens": list(req.output_token_ids),
            "segments": segments, "resumes": resumes, "paused": paused}


# -- (b) native sessions ---------------------------------------------------------------
@dataclass
class Session:
    ext: str
    prompt: list[int]
    checker: Any
    detok: IncrementalDetokenizer
    int_id: str = ""
    gen: list[int] = field(default_factory=list)
    seg: str = ""
    segments: list[str] = field(default_factory=list)
    paused_at_boundary: bool = False
    done: bool = False
    chunks: int = 0
    false_stops: int = 0
    missed_boundaries: int = 0  # boundaries the session did not stop at (must stay 0)
    pending: tuple[str, float] | None = None  # ("resume" | "false_stop", t)
    resumes: list[dict] = field(default_factory=list)
    false_stop_ms: list[float] = field(default_factory=list)
    paused: list[dict] = field(default_factory=list)


class NativeDriver:
    """Streaming-input sessions on the synchronous in-process LLMEngine (as AsyncLLM does it)."""

    def __init__(self, eng: Any, stop_ids: list[int]) -> None:
        self.eng, self.llm, self.stop_ids = eng, eng.llm_engine, stop_ids
        self.sessions: dict[str, Session] = {}

    def _submit(self, s: Session, ids: list[int]) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        sp = SamplingParams(temperature=0.0, max_tokens=MAX_NEW - len(s.gen), detokenize=False,
                            output_kind=RequestOutputKind.DELTA, stop_token_ids=self.stop_ids)
        req = self.llm.input_processor.process_inputs(
            s.int_id or s.ext, TokensPrompt(prompt_token_ids=list(ids)), sp,
            supported_tasks=self.llm.get_supported_tasks(), resumable=True)
        if s.int_id:
            req.external_req_id = s.ext  # a continuation chunk of the same session
        else:
            self.llm.input_processor.assign_request_id(req)
            s.int_id = req.request_id
        self.llm.output_processor.add_request(req, None, None, 0)
        # In-process, the scheduler's Request would share the prompt list with the output processor's
        # state and with ours; both extend it on a continuation chunk (the prompt grows twice and the
        # session stalls). A multiprocess core gets a serialized copy: do the same.
        core_req = copy.copy(req)
        core_req.prompt_token_ids = list(req.prompt_token_ids)
        self.llm.engine_core.add_request(core_req)
        s.chunks += 1

    def start(self, name: str, prompt: list[int], pb: PromptBuilder) -> Session:
        s = Session(name, prompt, make_stop_checker(pb.skillset),
                    IncrementalDetokenizer(self.eng.tokenizer, prompt, skip_ids=self.eng.eos_token_ids))
        self.sessions[name] = s
        self._submit(s, prompt)
        return s

    def _continue(self, s: Session, kind: str) -> None:
        # The chunk's last sampled token was never run through the model: vLLM drops it, we send it again.
        s.pending = (kind, time.perf_counter())
        self._submit(s, [s.gen[-1]])
        r = self.eng.scheduler.requests[s.int_id]
        if kind == "resume":
            s.resumes.append({"context": r.num_tokens, "recomputed": r.num_tokens - r.num_computed_tokens,
                              "context_matches": list(r.all_token_ids) == s.prompt + s.gen})

    def resume(self, name: str) -> None:
        s = self.sessions[name]
        s.paused_at_boundary = False
        self._continue(s, "resume")

    def end(self, s: Session) -> None:
        s.done = True
        self.llm.abort_request([s.int_id], internal=True)

    def step(self) -> list[str]:
        """One engine step; returns the names of sessions that paused at a boundary or finished."""
        outs = self.llm.step()
        now = time.perf_counter()
        events = []
        by_ext = {s.ext: s for s in self.sessions.values() if not s.done}
        for o in outs:
            s = by_ext.get(o.request_id)
            if s is None:
                continue
            comp = o.outputs[0]
            toks = list(comp.token_ids)
            if toks and s.pending is not None:
                kind, t = s.pending
                ms = 1000 * (now - t)
                if kind == "resume":
                    s.resumes[-1]["resume_to_token_ms"] = ms
                else:
                    s.false_stop_ms.append(ms)
                s.pending = None
            boundary_at = -1
            for k, tok in enumerate(toks):
                s.gen.append(tok)
                if s.checker.feed(s.detok.push(tok)):
                    s.segments.append(s.checker.cut())
                    boundary_at = k
            stopped = comp.finish_reason is not None
            if boundary_at >= 0 and (boundary_at < len(toks) - 1 or not stopped):
                s.missed_boundaries += 1  # the session ran on past a boundary
            if not stopped:
                continue
            last = s.gen[-1] if s.gen else None
            if last in self.eng.eos_token_ids or len(s.gen) >= MAX_NEW:
                if s.checker.pending_text:
                    s.segments.append(s.checker.pending_text)
                self.end(s)
                events.append(s.ext)
            elif boundary_at == len(toks) - 1:
                s.paused_at_boundary = True  # the robot executes; the session stays parked in vLLM
                s.paused.append(sched_state(self.eng, s.int_id))
                events.append(s.ext)
            else:
                s.false_stops += 1  # stopped on a terminator token that did not end a segment
                self._continue(s, "false_stop")
        return events


def run_native(drv: NativeDriver, pb: PromptBuilder, name: str, ids: list[int]) -> dict:
    t0 = time.perf_counter()
    s = drv.start(name, ids, pb)
    while not s.done:
        for ext in drv.step():
            if ext == name and s.paused_at_boundary:
                drv.resume(name)  # the robot's segment takes no time here, as in (a)
    return {"mode": "native", "wall_s": time.perf_counter() - t0, "tokens": list(s.gen), "segments": s.segments,
            "resumes": s.resumes, "paused": s.paused, "chunks": s.chunks, "false_stops": s.false_stops,
            "false_stop_continue_ms": s.false_stop_ms, "missed_boundaries": s.missed_boundaries}


# -- batch slots ------------------------------------------------------------------------
def slot_experiment(eng: Any, drv: NativeDriver, pb: PromptBuilder, prompts: list[list[int]], probe: list[int]) -> dict:
    """max_num_seqs generations paused at their first boundary, then one new request: does it run?"""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    n = eng.max_batch
    out: dict[str, Any] = {"max_num_seqs": n}

    def probe_tokens(rid: str, steps: int) -> tuple[int, list[dict]]:
        eng.llm_engine.add_request(rid, {"prompt_token_ids": probe},
                             SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, detokenize=False,
                                            output_kind=RequestOutputKind.DELTA))
        got, states = 0, []
        for _ in range(steps):
            for o in eng.llm_engine.step():
                if o.request_id == rid:
                    got += len(o.outputs[0].token_ids)
            states.append(sched_state(eng))
            if got:
                break
        return got, states

    # (a) resubmission: suspend n generations and do not resume them
    eng.reset_prefix_cache()
    reqs = [EngineRequest(f"slot-a{i}", prompts[i % len(prompts)], make_stop_checker(pb.skillset),
                          max_new_tokens=MAX_NEW) for i in range(n)]
    for r in reqs:
        eng.add(r)
    for _ in range(STEP_CAP):
        if not eng.has_work():
            break
        eng.step()
    log("slots: resubmission generations suspended")
    a = {"suspended": sum(1 for r in reqs if r.output_token_ids), "paused_state": sched_state(eng)}
    got, st = probe_tokens("slot-a-probe", 4)
    a["probe_tokens_in_4_steps"], a["probe_states"] = got, st
    for _ in range(STEP_CAP):
        if not eng.llm_engine.has_unfinished_requests():
            break
        eng.llm_engine.step()
    # resume one: its blocks are still in the prefix cache (evictable, not pinned)
    r0 = reqs[0]
    eng.add(r0)
    for _ in range(STEP_CAP):
        if not eng.has_work() or eng.step().new_tokens:
            break
    a["resume_after_probe"] = {"context": eng.submissions[-1]["prompt_tokens"],
                               "cached": eng.submissions[-1]["cached_tokens"]}
    for r in reqs:
        eng.abort(r.gen_id)
    out["resubmission"] = a

    # (b) native sessions
    eng.reset_prefix_cache()
    sess = [drv.start(f"slot-b{i}", prompts[i % len(prompts)], pb) for i in range(n)]
    for _ in range(STEP_CAP):
        if all(s.paused_at_boundary or s.done for s in sess):
            break
        drv.step()
    log("slots: native sessions paused")
    b = {"paused": sum(s.paused_at_boundary for s in sess), "paused_state": sched_state(eng),
         "blocks_per_paused_session": [s.paused[-1]["request_blocks"] for s in sess if s.paused]}
    got, st = probe_tokens("slot-b-probe", 4)
    b["probe_tokens_in_4_steps"], b["probe_states"] = got, st
    drv.end(sess[0])  # release one session: the probe gets the slot
    got2, st2 = 0, []
    for _ in range(4):
        for o in eng.llm_engine.step():
            if o.request_id == "slot-b-probe":
                got2 += len(o.outputs[0].token_ids)
        st2.append(sched_state(eng))
        if got2:
            break
    b["probe_tokens_after_ending_one_session"], b["states_after_end"] = got2, st2
    for _ in range(STEP_CAP):
        if not eng.llm_engine.has_unfinished_requests():
            break
        eng.llm_engine.step()
    for s in sess[1:]:
        drv.end(s)
    b["after_ending_all"] = sched_state(eng)
    out["native"] = b
    return out


# -- report -----------------------------------------------------------------------------
def summarize(rows: list[dict]) -> dict:
    def agg(mode: str) -> dict:
        rs = [r[mode] for r in rows]
        res = [x for r in rs for x in r["resumes"] if "resume_to_token_ms" in x]
        paused = [p for r in rs for p in r["paused"]]
        d = {
            "plans": len(rs), "resumes": len(res),
            "resume_to_token_ms_median": _med([x["resume_to_token_ms"] for x in res]),
            "resume_to_token_ms_p90": (sorted(x["resume_to_token_ms"] for x in res)[int(0.9 * (len(res) - 1))]
                                       if res else None),
            "recomputed_tokens_median": _med([x["recomputed"] for x in res]),
            "recomputed_tokens_mean": statistics.mean(x["recomputed"] for x in res) if res else None,
            "recomputed_tokens_max": max((x["recomputed"] for x in res), default=None),
            "context_tokens_median": _med([x["context"] for x in res]),
            "wall_s_total": sum(r["wall_s"] for r in rs),
            "paused_running_max": max((p["running"] for p in paused), default=None),
            "paused_sessions_max": max((p["paused_sessions"] for p in paused), default=None),
            "paused_kv_blocks_in_use_median": _med([p["kv_blocks_in_use"] for p in paused]),
            "paused_request_alive": sum(bool(p.get("request_alive")) for p in paused),
            "paused_count": len(paused),
        }
        if mode == "native":
            d["chunks"] = sum(r["chunks"] for r in rs)
            d["false_stops"] = sum(r["false_stops"] for r in rs)
            d["false_stop_continue_ms_median"] = _med([x for r in rs for x in r["false_stop_continue_ms"]])
            d["missed_boundaries"] = sum(r["missed_boundaries"] for r in rs)
            d["context_matches"] = all(x.get("context_matches", True) for r in rs for x in r["resumes"])
        return d

    return {"resubmission": agg("resubmission"), "native": agg("native"),
            "same_tokens": sum(r["resubmission"]["tokens"] == r["native"]["tokens"] for r in rows),
            "same_segments": sum([x for x in r["resubmission"]["segments"] if x]
                                 == [x for x in r["native"]["segments"] if x] for r in rows),
            "runs": len(rows)}


def _f(x: Any, nd: int = 1) -> str:
    return "-" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def write_md(out: Path, res: dict) -> None:
    s, m = res["summary"], res["meta"]
    a, b = s["resubmission"], s["native"]
    sl = res["slots"]
    lines = [
        "# vLLM native resumable sessions vs resubmission", "",
        f"Command: `{m['cmd']}`  ",
        f"vLLM {m['vllm_version']} (CPU build), {m['model']}, {m['dtype']}, block_size {m['block_size']}, "
        f"max_num_seqs {m['max_batch']}, KV capacity {m['kv_cache_tokens']} tokens; {m['machine']}; "
        f"load average before {m['load_before']}, after {m['load_after']}.  ",
        f"{s['runs']} runs = {m['plans']} drone plans (data/plans.yaml) x {m['repeats']} repeats, greedy, "
        f"{MAX_NEW} tokens max, batch 1, resume at once after each boundary; native chunks stop on "
        f"{m['stop_candidates']} candidate terminator tokens.", "",
        "| | (a) resubmission (VllmEngine) | (b) native session |",
        "|---|---|---|",
        f"| resumes measured | {a['resumes']} | {b['resumes']} |",
        f"| resume -> next token, median (p90) | {_f(a['resume_to_token_ms_median'])} ms "
        f"({_f(a['resume_to_token_ms_p90'])}) | {_f(b['resume_to_token_ms_median'])} ms "
        f"({_f(b['resume_to_token_ms_p90'])}) |",
        f"| prefill tokens recomputed per resume, median / mean / max | {_f(a['recomputed_tokens_median'])} / "
        f"{_f(a['recomputed_tokens_mean'])} / {_f(a['recomputed_tokens_max'])} | "
        f"{_f(b['recomputed_tokens_median'])} / {_f(b['recomputed_tokens_mean'])} / "
        f"{_f(b['recomputed_tokens_max'])} |",
        f"| context at resume, median tokens | {_f(a['context_tokens_median'])} | {_f(b['context_tokens_median'])} |",
        f"| while paused: request alive in vLLM | {a['paused_request_alive']}/{a['paused_count']} | "
        f"{b['paused_request_alive']}/{b['paused_count']} |",
        f"| while paused: KV blocks in use (not evictable), median | {_f(a['paused_kv_blocks_in_use_median'])} | "
        f"{_f(b['paused_kv_blocks_in_use_median'])} |",
        f"| while paused: counted as running / paused sessions (max) | {a['paused_running_max']} / "
        f"{a['paused_sessions_max']} | {b['paused_running_max']} / {b['paused_sessions_max']} |",
        f"| stops exactly at the boundary | yes (sync step loop, abort) | missed boundaries: "
        f"{b['missed_boundaries']} |",
        f"| extra stops (candidate token, no boundary) | - | {b['false_stops']} in {b['chunks']} chunks, "
        f"continue -> token median {_f(b['false_stop_continue_ms_median'])} ms |",
        f"| wall time, all runs | {a['wall_s_total']:.2f} s | {b['wall_s_total']:.2f} s |",
        f"| same tokens / same segments as the other mode | {s['same_tokens']}/{s['runs']} | "
        f"{s['same_segments']}/{s['runs']} |", "",
        f"## Batch slots: {sl['max_num_seqs']} generations paused at their first boundary, then one new request", "",
        "| | resubmission | native |", "|---|---|---|",
        f"| paused state: running / waiting / paused sessions | {sl['resubmission']['paused_state']['running']} / "
        f"{sl['resubmission']['paused_state']['waiting']} / {sl['resubmission']['paused_state']['paused_sessions']} | "
        f"{sl['native']['paused_state']['running']} / {sl['native']['paused_state']['waiting']} / "
        f"{sl['native']['paused_state']['paused_sessions']} |",
        f"| paused state: KV blocks in use | {sl['resubmission']['paused_state']['kv_blocks_in_use']} | "
        f"{sl['native']['paused_state']['kv_blocks_in_use']} |",
        f"| new request: tokens within 4 steps | {sl['resubmission']['probe_tokens_in_4_steps']} | "
        f"{sl['native']['probe_tokens_in_4_steps']} (after ending one session: "
        f"{sl['native']['probe_tokens_after_ending_one_session']}) |",
        f"| resume after the new request ran: cached / context | "
        f"{sl['resubmission']['resume_after_probe']['cached']} / {sl['resubmission']['resume_after_probe']['context']} "
        "| (blocks pinned) |",
    ]
    (out / "results.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="config/engine_vllm_cpu.yaml")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results/vllm_sessions")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    cmd = "python -m bench.vllm_sessions " + " ".join(argv if argv is not None else sys.argv[1:])
    load_before = [round(x, 2) for x in os.getloadavg()]
    eng = make_engine(args.config)
    eng.park_idle = False  # measured here: resubmission and native sessions, never the in-place resume
    pb = PromptBuilder(eng.tokenizer, "drone")
    plans = {t.trace_id: pb.token_ids(t.task_input) for t in plan_templates().values() if t.robot_type == "drone"}
    stop_ids = candidate_stop_ids(eng.tokenizer)
    drv = NativeDriver(eng, stop_ids)
    log(f"loaded in {eng.load_s:.1f} s; {len(plans)} drone plans; {len(stop_ids)} candidate stop tokens")
    run_resubmission(eng, pb, "warm", plans[min(plans)])  # CPU kernels per shape: keep out of the numbers
    run_native(drv, pb, "warm-n", plans[min(plans)])
    rows = []
    for rep in range(args.repeats):
        for tid, ids in plans.items():
            row: dict[str, Any] = {"task": tid, "repeat": rep}
            # Alternate the order; reset the cache so that neither finds the other's blocks.
            for mode in (("resubmission", "native") if (tid + rep) % 2 == 0 else ("native", "resubmission")):
                eng.reset_prefix_cache()
                name = f"{mode[:3]}-{tid}-{rep}"
                row[mode] = (run_resubmission(eng, pb, name, ids) if mode == "resubmission"
                             else run_native(drv, pb, name, ids))
            rows.append(row)
            a, b = row["resubmission"], row["native"]
            b_ms = _med([x.get("resume_to_token_ms", 0) for x in b["resumes"]])
            log(f"task {tid} rep {rep}: resub {len(a['resumes'])} resumes "
                f"{_f(_med([x['resume_to_token_ms'] for x in a['resumes']]))} ms, recompute "
                f"{[x['recomputed'] for x in a['resumes']]} | native {_f(b_ms)} ms, "
                f"recompute {[x['recomputed'] for x in b['resumes']]}, false stops {b['false_stops']}, "
                f"missed {b['missed_boundaries']} | same={a['tokens'] == b['tokens']}")
    slots = slot_experiment(eng, drv, pb, list(plans.values()), plans[min(plans)])
    log(f"slots: {json.dumps({k: v.get('probe_tokens_in_4_steps') for k, v in slots.items() if isinstance(v, dict)})}")
    import vllm

    res = {
        "meta": {"cmd": cmd, "vllm_version": vllm.__version__, "model": os.path.basename(eng.info.model),
                 "dtype": str(eng.engine_args.get("dtype")), "block_size": eng.block_size, "max_batch": eng.max_batch,
                 "kv_cache_tokens": eng.kv_cache_tokens(), "machine": f"{os.cpu_count()} CPUs",
                 "load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()],
                 "plans": len(plans), "repeats": args.repeats, "stop_candidates": len(stop_ids)},
        "summary": summarize(rows), "slots": slots, "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    write_md(args.out, res)
    print((args.out / "results.md").read_text())
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
