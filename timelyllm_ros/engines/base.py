"""Engine interface shared by every backend (vLLM, transformers, simulated).

The scheduler talks to an engine only through :class:`Engine`. A backend
implements the raw iteration (:meth:`Engine._backend_step`); the segmentation
logic that every backend must share lives here, so that a simulated
generation and a real one are cut into segments by the very same code:

* after every new token its text piece is fed to the generation's
  :class:`~timelyllm_ros.skills.segmenter.StopChecker`;
* when the checker reports a complete segment and the generation is
  segmented, the generation is suspended at once: tokens the backend produced
  past the boundary in the same step (a remote server's stream, speculative
  decoding's accepted drafts) are not part of this segment and are never sent
  anywhere with it; they go to :meth:`Engine._backend_overrun`, which drops
  them (the resume generates them again) or keeps them for the resume to
  hand over first (vLLM), and the backend is told to release the request's
  batch slot (its KV blocks stay in the prefix cache);
* a resumed generation is re-submitted with ``prompt_token_ids +
  output_token_ids`` — token ids, never re-tokenized text;
* a stop checker that raises on a generation's text ends that generation
  alone with :attr:`FinishReason.ERROR` (the batch goes on): a step raises
  only for a failure of the engine itself.
"""

from __future__ import annotations

import abc
import enum
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from timelyllm_ros.skills.segmenter import StopChecker

if TYPE_CHECKING:
    from timelyllm_ros.engines.latency import LatencyEstimator


class FinishReason(enum.StrEnum):
    SEGMENT = "segment"  # suspended at a segment boundary
    STOP = "stop"  # EOS / stop string: the plan is complete
    LENGTH = "length"  # max_new_tokens reached
    SEGMENT_TOO_LONG = "segment_too_long"  # hard per-segment token cap hit
    ABORTED = "aborted"
    ERROR = "error"


@dataclass(frozen=True)
class StepModel:
    """An engine's step time: ``decode_s * (1 + batch_slowdown * (b - 1)) + prefill_tokens * prefill_s_per_token``.

    Seeds the scheduler's latency estimator, which then learns from the engine's own steps;
    ``source`` names where the figures come from (a fitted file, the simulated engine's config)."""

    decode_s: float
    batch_slowdown: float
    prefill_s_per_token: float
    source: str

    def __post_init__(self) -> None:
        bad = [f"{k}={v!r}" for k, v, ok in (("decode_s", self.decode_s, self.decode_s > 0),
                                              ("batch_slowdown", self.batch_slowdown, self.batch_slowdown >= 0),
                                              ("prefill_s_per_token", self.prefill_s_per_token,
                                               self.prefill_s_per_token >= 0)) if not ok]
        if bad:
            raise ValueError(f"step model ({self.source}): {', '.join(bad)}: need decode_s > 0, "
                             f"batch_slowdown >= 0, prefill_s_per_token >= 0")


@dataclass(frozen=True)
class EngineInfo:
    """What an engine is and what it can do, declared by its backend.

    Callers (the planner node, the demo, benchmarks) read this instead of probing
    backend attributes, so a new backend states its capabilities in one place.
    """

    name: str  # backend: "vllm", "remote", "transformers", "sim" or "pool"
    model: str  # the model as loaded (local folder or hub name); "simulated" for the simulated engine
    max_model_len: int | None = None  # context limit in tokens (prompt + output); None: no fixed limit
    # Requests must carry extra['plan_text']: the simulated engine writes a known plan, it has no prompt.
    needs_plan_text: bool = False
    # KV blocks of a prompt prefix are reused across requests (a shared system prompt is prefilled once).
    supports_prefix_cache: bool = False
    # How long a step takes on this engine, when known (fitted, or the simulated engine's own model).
    step_model: StepModel | None = None
    # A step hands over what a server streamed since the last one (remote): its duration is how long it
    # waited, not the server's step time; the time between steps is (the engine pool measures it so).
    streamed: bool = False
    # Numeric type of the weights and activations in use and why it was chosen (e.g. "auto: this CPU has
    # avx512_bf16"); "" where the backend does not say.
    dtype: str = ""
    dtype_reason: str = ""
    # Speculative decoding in use, e.g. "ngram: up to 4 draft tokens per step, prompt lookup 2-4"; "" = none.
    speculative: str = ""
    # Tokens per KV-cache block (a prefix is reused in whole blocks); None where the backend does not say.
    kv_block_tokens: int | None = None
    # Takes llguidance grammars (Lark, token ids as terminals) as extra['grammar']: vLLM's guidance backend.
    token_grammar: bool = False


SUBMISSION_LOG_LEN = 4096  # per-(re)submission records an engine keeps (a long-running node must not grow)


class SubmissionLog(Sequence):
    """Append-only log that keeps only its last ``maxlen`` records.

    Indices are absolute (since the engine started) and ``len()`` counts every
    record ever appended, so ``log[len_before:]`` still gives the records added
    since ``len_before`` and ``log[-1]`` the latest. Iterating yields the kept
    records; indexing a dropped one raises IndexError; a slice leaves dropped
    ones out.
    """

    def __init__(self, maxlen: int = SUBMISSION_LOG_LEN) -> None:
        self._items: deque[dict] = deque(maxlen=maxlen)
        self._total = 0

    def append(self, rec: dict) -> None:
        self._items.append(rec)
        self._total += 1

    @property
    def dropped(self) -> int:
        return self._total - len(self._items)

    def __len__(self) -> int:
        return self._total

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self._items[k - self.dropped] for k in range(*i.indices(self._total)) if k >= self.dropped]
        k = i + self._total if i < 0 else i
        if not 0 <= k < self._total:
            raise IndexError("submission index out of range")
        if k < self.dropped:
            raise IndexError(f"submission {k} was dropped (only the last {self._items.maxlen} are kept)")
        return self._items[k - self.dropped]

    def __iter__(self) -> Iterator[dict]:
        return iter(list(self._items))

    def __reversed__(self) -> Iterator[dict]:
        return reversed(list(self._items))

    def __repr__(self) -> str:
        return f"SubmissionLog({len(self._items)} kept of {self._total})"


@dataclass
class EngineRequest:
    """One generation as handed to an engine (new or resumed)."""

    gen_id: str
    prompt_token_ids: list[int]
    stop_checker: StopChecker
    # Tokens generated before this (re)submission; empty for a new generation.
    output_token_ids: list[int] = field(default_factory=list)
    max_new_tokens: int = 256  # over the whole generation
    max_segment_tokens: int = 64  # hard cap against runaway segments
    # False: generate the whole plan without suspending (fcfs / fcfs-stream);
    # segments are still detected and reported as they appear.
    suspend_at_boundary: bool = True
    # Backend-specific extras (e.g. a recorded plan for the simulated engine,
    # a structured-output regex for vLLM).
    extra: dict = field(default_factory=dict)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def sampling_seed(self) -> int | None:
        """``extra['seed']`` for this (re)submission: offset by the tokens already generated. The same seed on
        every resubmission would replay the random draws that opened the plan after each segment (a sampled
        plan degenerated into ``p(50);p(50);...``); the offset keeps a seeded generation reproducible."""
        seed = self.extra.get("seed")
        return None if seed is None else (int(seed) + len(self.output_token_ids)) % 2**63


@dataclass
class SegmentEvent:
    """A segment completed (or the generation ended) during a step."""

    gen_id: str
    text: str
    token_ids: list[int]  # token ids of this segment only
    reason: FinishReason  # SEGMENT: suspended or streaming on; else final
    suspended: bool  # True: the generation left the batch and waits for resume
    cached_prompt_tokens: int = 0  # prefix-cache hits of the latest (re)submission
    error: str = ""
    # With ERROR: the engine failed (its server died or stopped answering), not this request; a pool moves
    # the generation to another member instead of ending it.
    engine_failed: bool = False

    @property
    def final(self) -> bool:
        return self.reason is not FinishReason.SEGMENT


@dataclass
class StepReport:
    """What one engine iteration did."""

    duration_s: float  # measured (real engines) or modelled (simulated)
    batch_size: int  # generations decoded in this step
    new_tokens: int  # tokens kept (after cutting at boundaries)
    events: list[SegmentEvent] = field(default_factory=list)
    prefill_tokens: int = 0


@dataclass
class EngineStats:
    running: int  # generations holding a batch slot
    waiting: int  # submitted but not yet scheduled by the backend
    kv_cache_usage: float  # 0..1
    tokens_per_s: float  # recent decode throughput, all generations together
    step_time_s: float  # recent mean step time
    max_batch: int


@dataclass
class RawTokens:
    """A backend's raw output for one generation in one step."""

    gen_id: str
    token_ids: list[int]
    pieces: list[str]  # decoded text of each token (incremental detokenizer)
    finished: FinishReason | None = None  # backend-side end (EOS, length, ...)
    cached_prompt_tokens: int = 0
    error: str = ""  # with ``finished``: what went wrong (e.g. the connection to a remote server broke)
    engine_failed: bool = False  # with ERROR: the engine itself failed, not this request (SegmentEvent's)


@dataclass
class _Live:
    req: EngineRequest
    seg_token_ids: list[int] = field(default_factory=list)
    seg_text: str = ""
    cached_prompt_tokens: int = 0


class Engine(abc.ABC):
    """Continuous-batching engine with segment-level suspend and resume.

    Subclasses implement the four ``_backend_*`` methods and ``stats``; the
    public methods below hold the shared segmentation semantics. Every backend
    sets :attr:`info` in its constructor (after loading: the context limit
    comes from the model).
    """

    info: EngineInfo
    # Per (re)submission record of real backends: gen_id, prompt_tokens, cached_tokens (, ttft_s); bounded.
    submissions: SubmissionLog

    def __init__(self) -> None:
        self._live: dict[str, _Live] = {}
        self._recent: list[tuple[float, int, float]] = []  # (t, tokens, step_s)
        self.submissions = SubmissionLog()

    # -- public API used by the scheduler --------------------------------
    def add(self, req: EngineRequest, segment_so_far: Sequence[int] = ()) -> None:
        """Start a new generation or resume a suspended one.

        ``segment_so_far``: token ids of the current segment that another engine already wrote (they are the
        tail of ``req.output_token_ids``; the stop checker has seen them). A generation moved mid-segment from
        a failed engine (:class:`~timelyllm_ros.engines.pool.EnginePool`) keeps its segment whole: its event
        carries every token of the segment and ``max_segment_tokens`` counts them all."""
        if req.gen_id in self._live:
            raise ValueError(f"gen_id {req.gen_id!r} is already running in the engine")
        self._live[req.gen_id] = _Live(req, list(segment_so_far), req.stop_checker.pending_text if segment_so_far
                                       else "")
        self._backend_add(req)

    def segment_so_far(self, gen_id: str) -> list[int]:
        """Token ids of the running generation's current, unfinished segment ([] if it is not running)."""
        live = self._live.get(gen_id)
        return list(live.seg_token_ids) if live is not None else []

    def warm_up_targets(self) -> list[Engine]:
        """The engines a warm-up must reach (:func:`planner.warmup.warm_up`): this one; a pool, each member."""
        return [self]

    def latency_estimator(self) -> LatencyEstimator | None:
        """The step-time estimate the scheduler should use, where the engine keeps its own (an engine pool:
        one per member, answering for the member a generation would be placed on); None: the scheduler
        learns one from this engine's step reports (:meth:`LatencyEstimator.for_engine`)."""
        return None

    def step_ready(self) -> bool:
        """Whether :meth:`step` would return output without waiting. An in-process engine computes its step
        (always ready); a remote one hands over what its server streamed, and waits for it otherwise. A pool
        of engines steps only the ready ones, so one slow member does not hold back the others' tokens."""
        return True

    def suspended_ids(self) -> set[str]:
        """Suspended generations whose state the backend still keeps (a parked vLLM request, a kept cache);
        :meth:`abort` releases one. Most backends keep nothing of a suspended generation."""
        return set()

    def abort(self, gen_id: str) -> None:
        """Stop a generation and free its batch slot (no-op if not running)."""
        if self._live.pop(gen_id, None) is not None:
            self._backend_abort(gen_id)

    def running_ids(self) -> set[str]:
        return set(self._live)

    def has_work(self) -> bool:
        return bool(self._live)

    def step(self) -> StepReport:
        """Run one iteration over the running batch and segment its output."""
        if not self._live:
            return StepReport(duration_s=0.0, batch_size=0, new_tokens=0)
        t0 = time.perf_counter()
        raw, modelled_s, prefill = self._backend_step()
        duration = modelled_s if modelled_s is not None else time.perf_counter() - t0
        batch = len(self._live)
        report = StepReport(duration_s=duration, batch_size=batch, new_tokens=0, prefill_tokens=prefill)
        for out in raw:
            live = self._live.get(out.gen_id)
            if live is None:  # aborted meanwhile
                continue
            if out.cached_prompt_tokens:
                live.cached_prompt_tokens = out.cached_prompt_tokens
            report.new_tokens += self._consume(live, out, report.events)
        self._recent.append((time.monotonic(), report.new_tokens, duration))
        del self._recent[:-32]
        return report

    # -- shared segmentation --------------------------------------------
    def _consume(self, live: _Live, out: RawTokens, events: list[SegmentEvent]) -> int:
        req = live.req
        kept = 0
        for tok, piece in zip(out.token_ids, out.pieces, strict=True):
            kept += 1
            req.output_token_ids.append(tok)
            live.seg_token_ids.append(tok)
            live.seg_text += piece
            try:
                complete = req.stop_checker.feed(piece)
                text = req.stop_checker.cut() if complete else ""
            except Exception as e:  # noqa: BLE001 - this generation's output, not the engine, is at fault
                self._finish(live, FinishReason.ERROR, events,
                             f"the stop checker ({type(req.stop_checker).__name__}) failed on segment text "
                             f"{live.seg_text[-80:]!r}: {type(e).__name__}: {e}")
                return kept
            if complete:
                last = len(req.output_token_ids) >= req.max_new_tokens
                ev = SegmentEvent(
                    req.gen_id, text, live.seg_token_ids, FinishReason.SEGMENT,
                    # not suspended when the token budget ends here: a LENGTH event follows
                    suspended=req.suspend_at_boundary and not last,
                    cached_prompt_tokens=live.cached_prompt_tokens,
                )
                live.seg_token_ids, live.seg_text = [], ""
                if req.suspend_at_boundary and not last:
                    # Cut here: whatever the backend wrote past the boundary belongs to the next segment.
                    events.append(ev)
                    self._live.pop(req.gen_id)
                    if kept < len(out.token_ids) or out.finished is not None:
                        self._backend_overrun(req, RawTokens(
                            req.gen_id, list(out.token_ids[kept:]), list(out.pieces[kept:]), out.finished,
                            error=out.error, engine_failed=out.engine_failed))
                    self._backend_suspend(req.gen_id)
                    return kept
                events.append(ev)
            if len(live.seg_token_ids) >= req.max_segment_tokens:
                self._finish(live, FinishReason.SEGMENT_TOO_LONG, events,
                             f"segment exceeded max_segment_tokens={req.max_segment_tokens} "
                             f"without a complete skill: {live.seg_text[:80]!r}")
                return kept
            if len(req.output_token_ids) >= req.max_new_tokens:
                self._finish(live, FinishReason.LENGTH, events)
                return kept
        if out.finished is not None:
            self._finish(live, out.finished, events, out.error, out.engine_failed)
        return kept

    def _finish(self, live: _Live, reason: FinishReason, events: list[SegmentEvent], error: str = "",
                engine_failed: bool = False) -> None:
        req = live.req
        try:
            text = req.stop_checker.pending_text
        except Exception:  # noqa: BLE001 - a broken checker: the raw text (the core validates it before sending)
            text = live.seg_text
        events.append(SegmentEvent(req.gen_id, text, live.seg_token_ids, reason, suspended=False,
                                   cached_prompt_tokens=live.cached_prompt_tokens, error=error,
                                   engine_failed=engine_failed and reason is FinishReason.ERROR))
        self._live.pop(req.gen_id, None)
        self._backend_abort(req.gen_id)

    def recent_tokens_per_s(self) -> float:
        busy = sum(d for _, _, d in self._recent)
        return sum(n for _, n, _ in self._recent) / busy if busy > 0 else 0.0

    def recent_step_time_s(self) -> float:
        return sum(d for _, _, d in self._recent) / len(self._recent) if self._recent else 0.0

    # -- backend hooks ------------------------------------------------------
    @abc.abstractmethod
    def _backend_add(self, req: EngineRequest) -> None:
        """Submit ``req.all_token_ids`` as the prompt of a fresh backend request."""

    @abc.abstractmethod
    def _backend_step(self) -> tuple[Sequence[RawTokens], float | None, int]:
        """One iteration. Returns (raw outputs, modelled duration or None for
        wall-clock, prefill tokens processed in this step)."""

    def _backend_overrun(self, req: EngineRequest, rest: RawTokens) -> None:  # noqa: B027 - optional hook
        """What the backend wrote past the boundary a generation was just cut at (tokens not yet in
        ``req.output_token_ids``, and its end if the backend ended it there), before :meth:`_backend_suspend`.
        By default dropped: the resume generates the same tokens again. A backend that keeps them must hand
        them over, in order and before anything new, in the first step after the resume."""

    @abc.abstractmethod
    def _backend_suspend(self, gen_id: str) -> None:
        """Release the batch slot; keep KV blocks cached if the backend can."""

    @abc.abstractmethod
    def _backend_abort(self, gen_id: str) -> None:
        """Release the request and everything it holds."""

    @abc.abstractmethod
    def stats(self) -> EngineStats:
        ...

    @abc.abstractmethod
    def tokenize(self, text: str) -> list[int]:
        ...

    def reset_prefix_cache(self) -> bool:
        """Drop cached KV blocks so the next run starts cold; False where the backend has nothing to drop."""
        return False

    def resume_counters(self) -> dict[str, int]:
        """Running totals of how suspended generations came back: ``resumed_in_place`` (the backend kept the
        request), ``resubmitted``, ``released_held`` (held in place, then given up for a waiting generation);
        zeros where the backend does not tell them apart. Take differences around a run."""
        return {"resumed_in_place": 0, "resubmitted": 0, "released_held": 0}

    def set_hold_in_place(self, on: bool) -> bool:
        """Hold suspended generations in place while the batch has room (on) or only on an idle engine (off),
        for side-by-side measurements; False where the backend has no such choice."""
        return False

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free backend resources."""


def concat_segments(events: Iterable[SegmentEvent]) -> str:
    return "".join(e.text for e in events)
