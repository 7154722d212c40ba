"""Remote backend: a vLLM server (``vllm serve``) over its OpenAI-compatible completions API.

Same :class:`Engine` semantics as the in-process vLLM backend, over HTTP:

* every (re)submission is one streamed ``POST /v1/completions`` whose ``prompt`` is a list of token ids
  (``prompt_token_ids + output_token_ids``: never re-tokenized text), so a resume continues from exactly
  the ids generated so far and the server's automatic prefix cache serves the shared prefix;
* ``return_token_ids`` (vLLM 0.32 ``CompletionRequest``) makes every streamed chunk carry the ids of
  its new tokens (``choices[0].token_ids``; the first chunk also echoes ``prompt_token_ids``, checked
  against what was sent); we detokenize them locally with the same tokenizer
  (:class:`~timelyllm_ros.engines.detok.IncrementalDetokenizer`), as the other backends do;
* our stop checker (:class:`Engine`) cuts at the skill boundary on the client side; suspending or
  aborting closes the stream, and the server aborts a request whose client disconnected
  (vLLM's ``listen_for_disconnect``);
* one background asyncio event-loop thread runs every stream over one shared ``httpx.AsyncClient``
  (no thread per request); :meth:`RemoteEngine._backend_step` hands over the tokens that arrived since
  the last step, waiting up to ``step_wait_s`` for at least one so the planner loop does not spin;
* a server that dies (the connection breaks) or stops answering (no first token within
  ``first_token_timeout_s``, or nothing for ``read_timeout_s`` between tokens) ends the generation with
  :attr:`FinishReason.ERROR` and a text that says which. Two limits because a cold prefill of a long
  prompt on a busy server legitimately takes seconds, a pause between two decode steps does not.
  Both count tokens, not lines: the first token is due ``first_token_timeout_s`` after the submission and
  each next one ``token_timeout_s`` after the one before, whatever else the server sends meanwhile
  (keep-alive comments, empty chunks, chunks without tokens keep a connection busy, not a generation);
* what the server streams is checked before it reaches the detokenizer: a token id that is no integer of
  the tokenizer's vocabulary ends that generation only (``engine_failed`` off: the others go on), naming
  the server, the request and the id.

Usage: vLLM reports a request's cached prompt tokens only in the final usage chunk of a stream
(``stream_options.include_usage`` and a server started with ``--enable-prompt-tokens-details``;
completion/serving.py). A stream we close at a segment boundary never gets there, so its cached
count is unknown (``None``); the submission that runs to the end of the plan (stop, length) reports it.
Connections of streams that ran to their end are reused; a stream closed early takes its connection
with it (HTTP/1.1 has no other way to tell the server to stop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from timelyllm_ros.engines.base import (
    Engine,
    EngineInfo,
    EngineRequest,
    EngineStats,
    FinishReason,
    RawTokens,
)
from timelyllm_ros.engines.detok import IncrementalDetokenizer
from timelyllm_ros.engines.remote_protocol import (  # noqa: F401 - the server's errors and checks re-exported
    KV_USAGE,
    NEUTRAL_SAMPLING,
    TOKENIZER_PROBE,
    RemoteServerError,
    ServerChecks,
    cache_config_info,
    eos_token_ids,
    error_message,
    prefix_caching_problem,
)
from timelyllm_ros.engines.vllm_common import finish_reason_from_vllm, structured_output

log = logging.getLogger(__name__)

TOKEN_TIMEOUT_S = 30.0  # default longest wait for the next token of a started generation (token_timeout_s)
USAGE_LOG_LEN = 1024  # per-request usage records kept for stats() (a long-running node must not grow)


@dataclass(frozen=True)
class RequestUsage:
    """What the server reported for one (re)submission."""

    gen_id: str
    prompt_tokens: int
    # Prefix-cache hits; None where the stream was closed (segment boundary) before the usage chunk.
    cached_tokens: int | None


@dataclass
class RemoteEngineStats(EngineStats):
    """:class:`EngineStats` plus the server's usage reports (bounded: the last ``USAGE_LOG_LEN``)."""

    prompt_tokens: int = 0  # all submissions so far
    cached_prompt_tokens: int = 0  # prefix-cache hits of those whose usage came back
    usage_reported: int = 0  # submissions whose usage came back
    usage: tuple[RequestUsage, ...] = ()


@dataclass
class _Stream:
    """One HTTP request = one (re)submission of a generation."""

    gen_id: str
    ext_id: str
    prompt_ids: list[int]
    max_tokens: int
    detok: IncrementalDetokenizer
    submitted: float
    future: concurrent.futures.Future | None = None
    # Written by the event-loop thread, read by the engine thread, both under RemoteEngine._cond:
    tokens: list[int] = field(default_factory=list)  # arrived, not yet handed to a step
    n_out: int = 0  # tokens received in all
    first_token_at: float | None = None
    finish: str | None = None  # vLLM's finish_reason
    stop_reason: Any = None
    usage: dict | None = None
    error: str = ""
    server_failed: bool = False  # with error: the server failed (down, hung, broke the stream), not the request
    done: bool = False  # the stream ended (normally or not); nothing more will arrive
    # Engine thread only:
    record: dict | None = None  # this submission's entry in Engine.submissions


class RemoteEngine(Engine):
    """:class:`Engine` over a vLLM server's ``/v1/completions``, streamed.

    ``url``: the server's base address (``http://host:port``). ``model``: its ``--served-model-name``
    (checked against ``/v1/models``). ``tokenizer``: a local folder with the same tokenizer (prompts
    are rendered and outputs detokenized here; checked against the server's ``/tokenize``).
    ``EngineRequest.extra`` understands what :class:`~timelyllm_ros.engines.vllm_engine.VllmEngine`
    does: ``temperature`` (default 0: greedy), ``top_p``, ``seed``, ``regex`` / ``grammar``,
    ``constrained``, ``ignore_eos``.
    """

    def __init__(self, url: str, model: str, tokenizer: str | None = None, *, connect_timeout_s: float = 3.0,
                 read_timeout_s: float = 10.0, first_token_timeout_s: float = 60.0,
                 token_timeout_s: float = TOKEN_TIMEOUT_S, max_batch: int = 8, step_wait_s: float = 0.05,
                 metrics_interval_s: float = 1.0, default_regex: str | None = None,
                 usage_log_len: int = USAGE_LOG_LEN) -> None:
        super().__init__()
        self.url = url.rstrip("/")
        self.model = model
        self.connect_timeout_s = float(connect_timeout_s)
        self.read_timeout_s = float(read_timeout_s)
        self.first_token_timeout_s = float(first_token_timeout_s)
        self.token_timeout_s = float(token_timeout_s)
        bad = [f"{k}={v!r}" for k, v in (("connect_timeout_s", self.connect_timeout_s),
                                         ("read_timeout_s", self.read_timeout_s),
                                         ("first_token_timeout_s", self.first_token_timeout_s),
                                         ("token_timeout_s", self.token_timeout_s)) if not v > 0]
        if bad:
            raise ValueError(f"remote engine {url}: {', '.join(bad)}: timeouts must be > 0")
        self.max_batch = int(max_batch)
        self.step_wait_s = float(step_wait_s)
        self.metrics_interval_s = float(metrics_interval_s)
        self.default_regex = default_regex
        self._seq = itertools.count()
        self._subs: dict[str, _Stream] = {}  # gen_id -> current submission (engine thread only)
        self._cond = threading.Condition()
        self._usage: deque[RequestUsage] = deque(maxlen=usage_log_len)
        self._prompt_tokens = 0
        self._cached_tokens = 0
        self._usage_reported = 0
        self._kv_usage = 0.0  # the server's vllm:kv_cache_usage_perc, polled
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="remote-engine-io", daemon=True)
        self._thread.start()
        self._client: Any = None
        self._poller: concurrent.futures.Future | None = None
        self._client = self._call(self._make_client(), timeout=10.0)
        try:
            t0 = time.perf_counter()
            self._start_up(tokenizer)
            self.load_s = time.perf_counter() - t0
        except BaseException:
            self.close()
            raise
        if self.metrics_interval_s > 0:
            self._poller = asyncio.run_coroutine_threadsafe(self._poll_metrics(), self._loop)
        log.info("remote engine: %s at %s (max_model_len=%s, block_size=%d), checked in %.2f s",
                 self.model, self.url, self.info.max_model_len, self.block_size, self.load_s)

    # -- the event loop -------------------------------------------------------------------------------------
    async def _make_client(self) -> Any:
        import httpx

        timeout = httpx.Timeout(connect=self.connect_timeout_s, read=self.read_timeout_s,
                                write=self.read_timeout_s, pool=self.connect_timeout_s)
        # No cap on connections: requests beyond the server's batch wait in its queue, not in ours.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=max(1, self.max_batch))
        return httpx.AsyncClient(base_url=self.url, timeout=timeout, limits=limits, trust_env=False)

    def _call(self, coro: Coroutine, timeout: float) -> Any:
        """Run ``coro`` on the event loop and wait for its result (start-up checks, close)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _start_up(self, tokenizer: str | None) -> None:
        """The server's checks (:class:`ServerChecks`) and what they tell: tokenizer, block size, the info."""
        checks = ServerChecks(self.url, self.model, self._client, self._call,
                              self.connect_timeout_s + self.read_timeout_s + 5.0)
        root, max_len = checks.served_model()
        self.block_size = checks.block_size()

        self.tokenizer, self.tokenizer_path = checks.load_tokenizer(tokenizer, root)
        self.vocab_size = len(self.tokenizer)  # ids the server may send (vLLM refuses others as a prompt, too)
        self.eos_token_ids = eos_token_ids(self.tokenizer, self.tokenizer_path)
        checks.check_tokenizer(self.tokenize(TOKENIZER_PROBE), self.tokenizer_path, root)

        self.reports_cached_tokens = checks.probe_usage(self.tokenize(TOKENIZER_PROBE))
        if not self.reports_cached_tokens:
            log.warning("the server at %s does not report cached prompt tokens (start it with "
                        "--enable-prompt-tokens-details): prefix-cache hits will read as unknown", self.url)
        self.info = EngineInfo(name="remote", model=self.model,
                               max_model_len=int(max_len) if isinstance(max_len, int) else None,
                               needs_plan_text=False, supports_prefix_cache=True, streamed=True,
                               kv_block_tokens=self.block_size or None)

    # -- streams ----------------------------------------------------------------------------------------------
    def request_body(self, req: EngineRequest, ids: list[int], remaining: int) -> dict:
        """The /v1/completions body of a (re)submission of ``req``: the prompt ``ids`` (the plan so far included),
        at most ``remaining`` tokens, its sampling, seed for this point and grammar; streamed, with token ids."""
        ex = req.extra
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": ids,  # token ids, never re-tokenized text
            "max_tokens": remaining,
            "temperature": float(ex.get("temperature", 0.0)),  # greedy by default, as VllmEngine
            "top_p": float(ex.get("top_p", 1.0)),
            **NEUTRAL_SAMPLING,
            "ignore_eos": bool(ex.get("ignore_eos", False)),
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        if req.sampling_seed is not None:
            body["seed"] = req.sampling_seed
        so = structured_output(ex, self.default_regex, lambda: self.decode(req.output_token_ids))
        if so:
            body["structured_outputs"] = so
        return body

    async def _stream(self, s: _Stream, body: dict) -> None:
        import httpx

        usage = None
        # No read timeout of httpx's here: the silence allowed depends on whether a token came yet (below).
        timeout = httpx.Timeout(connect=self.connect_timeout_s, read=None, write=self.read_timeout_s,
                                pool=self.connect_timeout_s)
        last_token = s.submitted  # the latest token's arrival (perf_counter); the submission before the first
        idle = 0  # lines since then that brought no token (keep-alive comments, empty chunks, chunks without ids)
        try:
            async with contextlib.AsyncExitStack() as stack:
                async with asyncio.timeout(self.first_token_timeout_s):  # the response's headers
                    resp = await stack.enter_async_context(
                        self._client.stream("POST", "/v1/completions", json=body, timeout=timeout))
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    self._end(s, error=f"the server at {self.url} refused the request: HTTP {resp.status_code}: "
                                       f"{error_message(text)}", server_failed=resp.status_code >= 500)
                    return
                lines = resp.aiter_lines()
                while True:
                    wait, what = self._next_token_wait(s, last_token)
                    try:
                        async with asyncio.timeout(max(0.0, wait)):
                            line = await anext(lines, None)
                    except TimeoutError:
                        self._end(s, error=self._no_token_error(s, what, idle))
                        return
                    if line is None:
                        break
                    data = line[5:].strip() if line.startswith("data:") else ""
                    if not data:  # an SSE comment (": ping"), a blank separator or an empty chunk: no token
                        idle += bool(line.strip())
                        continue
                    if data == "[DONE]":
                        break
                    obj = json.loads(data)
                    if "error" in obj:  # vLLM's mid-stream error event (GenerationError, engine failure)
                        self._end(s, error=f"the server at {self.url} failed the request: "
                                           f"{error_message(obj)}")
                        return
                    if obj.get("usage"):
                        usage = obj["usage"]
                    for ch in obj.get("choices") or ():
                        echoed = ch.get("prompt_token_ids")
                        if echoed is not None and echoed != s.prompt_ids:
                            self._end(s, error=f"the server at {self.url} changed the prompt: sent "
                                               f"{len(s.prompt_ids)} token ids, it ran {len(echoed)}")
                            return
                        toks = ch.get("token_ids")
                        toks = [] if toks is None else toks
                        bad = self._bad_token(toks)
                        if bad is not None:  # this request's output is garbage; the server may serve others well
                            self._end(s, error=f"the server at {self.url} sent {bad} for request {s.ext_id} "
                                               f"after {s.n_out} tokens", server_failed=False)
                            return
                        self._push(s, toks, ch.get("finish_reason"), ch.get("stop_reason"))
                        if toks:
                            last_token, idle = time.perf_counter(), 0
                        else:
                            idle += 1
            self._end(s, usage=usage)
        except asyncio.CancelledError:
            raise  # suspended or aborted by the engine: closing the stream makes the server abort it
        except (httpx.ConnectTimeout, httpx.PoolTimeout) as e:
            self._end(s, error=f"could not connect to the server at {self.url} within {self.connect_timeout_s:g} s "
                               f"({type(e).__name__})")
        except httpx.ConnectError as e:
            self._end(s, error=f"cannot connect to the server at {self.url} ({e or 'no detail'}): it is down")
        except (httpx.TimeoutException, TimeoutError) as e:
            limit, what = ((self.read_timeout_s, "read_timeout_s") if s.n_out else
                           (self.first_token_timeout_s, "first_token_timeout_s"))
            self._end(s, error=f"the server at {self.url} stopped answering: nothing for {limit:g} s ({what}) "
                               f"after {s.n_out} tokens ({type(e).__name__})")
        except httpx.HTTPError as e:
            self._end(s, error=f"the connection to the server at {self.url} broke after {s.n_out} tokens "
                               f"({type(e).__name__}: {e or 'no detail'}): the server died or dropped the request")
        except Exception as e:  # noqa: BLE001 - a malformed stream must end the generation, not the loop
            self._end(s, error=f"unreadable stream from the server at {self.url}: {type(e).__name__}: {e}")

    def _next_token_wait(self, s: _Stream, last_token: float) -> tuple[float, str]:
        """How long the next line may take, and the limit that sets it: the first token is due
        ``first_token_timeout_s`` after the submission, a later one ``token_timeout_s`` after the one before
        (lines without tokens do not move either deadline); between lines at most ``read_timeout_s``."""
        now = time.perf_counter()
        if not s.n_out:
            return s.submitted + self.first_token_timeout_s - now, "first_token_timeout_s"
        left = last_token + self.token_timeout_s - now
        return (left, "token_timeout_s") if left <= self.read_timeout_s else (self.read_timeout_s, "read_timeout_s")

    def _no_token_error(self, s: _Stream, what: str, idle: int) -> str:
        limit = getattr(self, what)
        if idle:  # the connection is busy, the generation is not
            return (f"the server at {self.url} sent no {'new ' if s.n_out else ''}token for {limit:g} s ({what}) "
                    f"for request {s.ext_id} after {s.n_out} tokens, only {idle} line(s) without tokens "
                    f"(keep-alives, empty chunks)")
        return (f"the server at {self.url} stopped answering: nothing for {limit:g} s ({what}) after {s.n_out} "
                f"tokens (TimeoutError)")

    def _bad_token(self, toks: Any) -> str | None:
        """What is wrong with a chunk's ``token_ids`` (e.g. "token id -1 (not in the vocabulary 0..49151)"),
        None if they are token ids of the tokenizer. Checked before the detokenizer, which raises on them."""
        if not isinstance(toks, list):
            return f"token_ids {str(toks)[:40]!r} (not a list of token ids)"
        for t in toks:
            if not isinstance(t, int) or isinstance(t, bool):
                return f"token id {str(t)[:40]!r} (not an integer)"
            if not 0 <= t < self.vocab_size:
                return f"token id {t} (not in the vocabulary 0..{self.vocab_size - 1})"
        return None

    def _push(self, s: _Stream, toks: list[int], finish: str | None, stop_reason: Any) -> None:
        with self._cond:
            if toks:
                if s.first_token_at is None:
                    s.first_token_at = time.perf_counter()
                s.tokens.extend(toks)
                s.n_out += len(toks)
            if finish is not None:
                s.finish, s.stop_reason = finish, stop_reason
            self._cond.notify_all()

    def _end(self, s: _Stream, *, error: str = "", usage: dict | None = None, server_failed: bool = True) -> None:
        """The stream is over; ``error``: how it failed, by default a failure of the server (a 4xx refusal is
        the request's own)."""
        with self._cond:
            s.error, s.usage, s.done = error, usage, True
            s.server_failed = bool(error) and server_failed
            self._cond.notify_all()

    async def _poll_metrics(self) -> None:
        """Keep the server's KV-cache use (``vllm:kv_cache_usage_perc``) for stats(): admission reads it."""
        while True:
            try:
                resp = await self._client.get("/metrics")
                vals = [float(v) for v in KV_USAGE.findall(resp.text)] if resp.status_code == 200 else []
                if vals:
                    self._kv_usage = max(vals)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a failing server shows in the streams; keep the last value
                pass
            await asyncio.sleep(self.metrics_interval_s)

    # -- hooks ------------------------------------------------------------------------------------------------
    def _backend_add(self, req: EngineRequest) -> None:
        if self._closed:
            raise RuntimeError("remote engine is closed")
        ids = req.all_token_ids
        limit = self.info.max_model_len
        if limit is not None and len(ids) >= limit:
            raise ValueError(f"{req.gen_id}: context of {len(ids)} tokens >= max_model_len={limit}")
        remaining = req.max_new_tokens - len(req.output_token_ids)
        if remaining <= 0:
            raise ValueError(f"{req.gen_id}: no tokens left (max_new_tokens={req.max_new_tokens})")
        body = self.request_body(req, ids, remaining)
        s = _Stream(req.gen_id, f"{req.gen_id}#{next(self._seq)}", ids, remaining,
                    IncrementalDetokenizer(self.tokenizer, ids, skip_ids=self.eos_token_ids), time.perf_counter())
        with self._cond:
            self._subs[req.gen_id] = s
        s.future = asyncio.run_coroutine_threadsafe(self._stream(s, body), self._loop)

    def step_ready(self) -> bool:
        with self._cond:
            return any(s.tokens or s.done for s in self._subs.values())

    def _backend_step(self) -> tuple[Sequence[RawTokens], float | None, int]:
        def ready() -> bool:
            return any(s.tokens or s.done for s in self._subs.values())

        with self._cond:
            if self._subs:
                self._cond.wait_for(ready, timeout=self.step_wait_s)
            taken = []
            for s in list(self._subs.values()):
                if s.tokens or s.done:
                    taken.append((s, s.tokens, s.done))
                    s.tokens = []
                    if s.done:  # nothing more will come: this submission is over
                        del self._subs[s.gen_id]
        raw: list[RawTokens] = []
        prefill = 0
        for s, toks, done in taken:
            cached = 0
            if s.record is None and (toks or done):
                s.record = {"gen_id": s.gen_id, "prompt_tokens": len(s.prompt_ids), "cached_tokens": None,
                            "ttft_s": (s.first_token_at - s.submitted) if s.first_token_at is not None else None}
                self.submissions.append(s.record)
                self._prompt_tokens += len(s.prompt_ids)
            finished, error, failed = None, "", False
            if done:
                cached = self._take_usage(s)
                finished, error = self._finish_of(s)
                # a stream that ended without a finish reason was cut: the server's failure as well
                failed = finished is FinishReason.ERROR and (s.server_failed or not s.error)
                if error:
                    log.warning("%s: %s", s.gen_id, error)
                if cached is not None:
                    prefill += len(s.prompt_ids) - cached
            try:
                pieces = s.detok.push_many(toks)
            except Exception as e:  # noqa: BLE001 - ids the tokenizer cannot decode end this generation only
                error = (f"the server at {self.url} sent token ids {toks[:8]} for request {s.ext_id} that the "
                         f"tokenizer {self.tokenizer_path} cannot decode ({type(e).__name__}: {e})")
                log.warning("%s: %s", s.gen_id, error)
                toks, pieces, finished, failed = [], [], FinishReason.ERROR, False  # the base aborts the stream
            raw.append(RawTokens(s.gen_id, toks, pieces, finished, cached or 0, error, engine_failed=failed))
        return raw, None, prefill

    def _take_usage(self, s: _Stream) -> int | None:
        details = (s.usage or {}).get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        if not isinstance(cached, int):
            return None
        assert s.record is not None
        s.record["cached_tokens"] = cached
        self._cached_tokens += cached
        self._usage_reported += 1
        with self._cond:
            self._usage.append(RequestUsage(s.gen_id, int(s.usage.get("prompt_tokens", len(s.prompt_ids))), cached))
        return cached

    def _finish_of(self, s: _Stream) -> tuple[FinishReason, str]:
        if s.error:
            return FinishReason.ERROR, s.error
        detail = s.stop_reason
        if s.finish == "length":
            if s.n_out >= s.max_tokens:
                return FinishReason.LENGTH, ""  # our own max_new_tokens budget ran out: the scheduler names that
            detail = f"context {len(s.prompt_ids) + s.n_out} tokens, max_model_len={self.info.max_model_len}"
        if s.finish is None:
            return FinishReason.ERROR, (f"the stream from the server at {self.url} ended without a finish "
                                        f"reason after {s.n_out} tokens")
        return finish_reason_from_vllm(s.finish, detail)

    def _cancel(self, gen_id: str) -> None:
        with self._cond:
            s = self._subs.pop(gen_id, None)
        if s is None:
            return
        if s.record is None:
            # Closed before its first token: still a submission the server saw (or was about to).
            s.record = {"gen_id": gen_id, "prompt_tokens": len(s.prompt_ids), "cached_tokens": None, "ttft_s": None}
            self.submissions.append(s.record)
            self._prompt_tokens += len(s.prompt_ids)
        with self._cond:
            self._usage.append(RequestUsage(gen_id, len(s.prompt_ids), None))
        if s.future is not None:
            s.future.cancel()  # closes the stream on the loop; the server aborts the request

    def _backend_suspend(self, gen_id: str) -> None:
        self._cancel(gen_id)

    def _backend_abort(self, gen_id: str) -> None:
        self._cancel(gen_id)

    # -- introspection ------------------------------------------------------------------------------------------
    def backend_has_request(self, gen_id: str) -> bool:
        """True while a stream of this generation is open (the server holds its request)."""
        s = self._subs.get(gen_id)
        return s is not None and not (s.future is not None and s.future.done())

    def stats(self) -> RemoteEngineStats:
        """Safe from any thread (diagnostics read it beside the planner loop)."""
        with self._cond:
            started = sum(1 for s in self._subs.values() if s.first_token_at is not None)
            open_ = len(self._subs)
            usage = tuple(self._usage)
        return RemoteEngineStats(
            running=started, waiting=open_ - started, kv_cache_usage=self._kv_usage,
            tokens_per_s=self.recent_tokens_per_s(), step_time_s=self.recent_step_time_s(),
            max_batch=self.max_batch, prompt_tokens=self._prompt_tokens, cached_prompt_tokens=self._cached_tokens,
            usage_reported=self._usage_reported, usage=usage)

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._cond:
            subs, self._subs = list(self._subs.values()), {}
        for s in subs:
            if s.future is not None:
                s.future.cancel()
        self._live.clear()
        if self._poller is not None:
            self._poller.cancel()
        if self._loop.is_running():
            if self._client is not None:
                try:
                    self._call(self._client.aclose(), timeout=5.0)
                except Exception as e:  # noqa: BLE001 - closing must not fail
                    log.debug("closing the HTTP client: %r", e)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            self._loop.close()
