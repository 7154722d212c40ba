"""Simulated continuous-batching engine (no weights, a latency model).

It "generates" each task's real plan text, token piece by token piece, so the
shared segmentation code in :class:`Engine` cuts a simulated generation
exactly where it would cut the real output. Step time::

    step = decode_s * (1 + batch_slowdown * (b - 1)) [+ prefill_step_s + prefill_s_per_token * prefill_tokens]

(the bracket only in a step that prefills), at most ``max_batch`` requests running, the others waiting in
order. Defaults from the paper's Table 1 (Llama3-8B fp16, RTX 4090): 22 ms/token at
batch 1, 328 ms prefill for 2884 tokens. A shared prefill is chunked (a per-step token budget) and the
prefix cache works on full ``block_size``-token blocks, as in vLLM with
automatic prefix caching: a shared system prompt is prefilled once, and a
resumed generation pays prefill only for what was evicted since it was
suspended (plus the last partial block).
"""

from __future__ import annotations

import re
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from timelyllm_ros.engines.base import (
    Engine,
    EngineInfo,
    EngineRequest,
    EngineStats,
    FinishReason,
    RawTokens,
    StepModel,
)
from timelyllm_ros.yamlfile import load_yaml_file

# BPE-like pre-tokenisation: quote-paren pairs, comparison operators and
# statement closers are single tokens in Llama-3's vocabulary; numbers split in
# groups of up to three digits; a leading space sticks to the next word.
_PIECE = re.compile(r"""\('|'\)|==|!=|>=|<=|\};|\)\{|\);|'\s*,|\s?[A-Za-z_]+|\d{1,3}|\s+|.""", re.S)
EOS_ID = 128009


def bpe_pieces(text: str, max_word: int = 7) -> list[str]:
    """Split text into realistic token pieces (concatenate back to ``text``)."""
    out: list[str] = []
    for m in _PIECE.finditer(text):
        p = m.group(0)
        if len(p) > max_word and p.strip().isalpha():
            out.extend(p[i:i + max_word] for i in range(0, len(p), max_word))
        else:
            out.append(p)
    return out


def piece_id(piece: str) -> int:
    return 1000 + zlib.crc32(piece.encode()) % 120000


@dataclass
class SimEngineConfig:
    decode_s: float = 0.022  # per step at batch 1 (Table 1)
    batch_slowdown: float = 0.025  # relative step-time increase per extra sequence in the batch
    prefill_s_per_token: float = 0.328 / 2884  # Table 1: 2884 prompt tokens in 328 ms
    prefill_step_s: float = 0.0  # fixed cost of a step that prefills, beyond its tokens (fitted on the CPU)
    max_prefill_tokens_per_step: int = 2048  # chunked-prefill token budget (vLLM max_num_batched_tokens)
    prefix_caching: bool = True  # vLLM automatic prefix caching (full blocks, LRU)
    kv_capacity_tokens: int = 32768  # ~4 GiB of KV at 128 KiB/token (Llama3-8B fp16 on a 24 GB card)
    block_size: int = 16
    max_batch: int = 256

    def __post_init__(self) -> None:
        if self.decode_s <= 0 or self.batch_slowdown < 0 or self.prefill_s_per_token < 0 or self.prefill_step_s < 0:
            raise ValueError("SimEngineConfig: decode_s > 0, batch_slowdown >= 0, prefill_s_per_token >= 0, "
                             "prefill_step_s >= 0")
        if self.block_size < 1 or self.max_batch < 1 or self.max_prefill_tokens_per_step < 1:
            raise ValueError("SimEngineConfig: block_size, max_batch, max_prefill_tokens_per_step must be >= 1")
        if self.kv_capacity_tokens < 4 * self.block_size:
            raise ValueError("SimEngineConfig: kv_capacity_tokens is too small")

    @classmethod
    def from_yaml(cls, path: str | Path) -> SimEngineConfig:
        data = load_yaml_file(path) or {}
        data = data.get("sim_engine", data)
        known = {f.name for f in fields(cls)}
        bad = set(data) - known
        if bad:
            raise ValueError(f"{path}: unknown sim_engine keys {sorted(bad)}; known: {sorted(known)}")
        return cls(**data)

    def step_model(self, source: str) -> StepModel:
        return StepModel(self.decode_s, self.batch_slowdown, self.prefill_s_per_token, source)

    def step_time(self, batch: int, prefill_tokens: int = 0) -> float:
        d = self.decode_s * (1 + self.batch_slowdown * (batch - 1)) if batch > 0 else 0.0
        return d + (prefill_tokens * self.prefill_s_per_token + self.prefill_step_s if prefill_tokens > 0 else 0.0)


@dataclass
class _SimReq:
    req: EngineRequest
    pieces: list[str]
    ids: list[int]
    hashes: list[int]  # chained hashes of the full blocks of prompt + output
    blocks: int  # KV blocks this request pins while running
    prefill: int  # tokens still to prefill before its next token
    cached: int  # prefix-cache hit of this submission (tokens)


class SimEngine(Engine):
    """Engine backend with modelled time. Needs ``req.extra['plan_text']`` (or ``'plan_pieces'``).

    KV memory is counted in blocks: running requests pin theirs; blocks of
    finished prefixes stay in an LRU prefix cache (keyed by chained block
    hashes, as vLLM's automatic prefix caching) until the space is needed.
    """

    def __init__(self, config: SimEngineConfig | None = None) -> None:
        super().__init__()
        self.cfg = config or SimEngineConfig()
        # The KV capacity bounds the context (a request that does not fit is refused in add), not a model.
        self.info = EngineInfo(name="sim", model="simulated", max_model_len=None, needs_plan_text=True,
                               supports_prefix_cache=self.cfg.prefix_caching,
                               step_model=self.cfg.step_model("the simulated engine's own step model"),
                               kv_block_tokens=self.cfg.block_size)
        self._run: dict[str, _SimReq] = {}
        self._wait: list[_SimReq] = []  # no batch slot or KV room yet (FIFO)
        self._cache: OrderedDict[int, None] = OrderedDict()  # unpinned cached blocks, LRU first
        self._pinned: dict[int, int] = {}  # block hash -> running requests using it
        self._capacity = self.cfg.kv_capacity_tokens // self.cfg.block_size
        self._used = 0  # pinned blocks (shared prefixes counted once)
        self._last_step = 0.0
        self.total_prefill_tokens = 0
        self.total_decode_tokens = 0
        self.cache_hit_tokens = 0

    # -- backend hooks --------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        return [piece_id(p) for p in bpe_pieces(text)]

    def _block_hashes(self, req: EngineRequest) -> list[int]:
        bs = self.cfg.block_size
        toks = req.all_token_ids
        prev = req.extra.get("_sim_hashes") or []
        h = prev[-1] if prev else 0
        out = list(prev)
        for i in range(len(prev) * bs, (len(toks) // bs) * bs, bs):
            h = hash((h, *toks[i:i + bs]))
            out.append(h)
        req.extra["_sim_hashes"] = out
        return out

    def warm_prefix(self, token_ids: Sequence[int]) -> int:
        """Put the full blocks of ``token_ids`` in the prefix cache, as the planner's warm-up generation
        does before it serves (``planner.warmup.warm_up``); takes no modelled time. Returns the blocks added."""
        if not self.cfg.prefix_caching:
            return 0
        hashes = self._block_hashes(EngineRequest("warm-prefix", list(token_ids), None))
        room = max(0, self._capacity - self._used - len(self._cache))
        added = [h for h in hashes if h not in self._pinned and h not in self._cache][:room]
        for h in added:
            self._cache[h] = None
        return len(added)

    def _backend_add(self, req: EngineRequest) -> None:
        pieces = req.extra.get("plan_pieces") or bpe_pieces(req.extra.get("plan_text", ""))
        if not pieces:
            raise ValueError(f"SimEngine needs a non-empty extra['plan_text'] for {req.gen_id!r}")
        hashes = self._block_hashes(req)
        n_all = len(req.prompt_token_ids) + len(req.output_token_ids)
        sr = _SimReq(req, list(pieces), [piece_id(p) for p in pieces], hashes, 0, n_all, 0)
        if len(hashes) + self._extra_blocks(sr) > self._capacity:
            raise ValueError(f"{req.gen_id}: {n_all} tokens do not fit in the KV cache "
                             f"({self.cfg.kv_capacity_tokens} tokens)")
        # vLLM runs at most max_num_seqs requests; the others wait, first come first served
        self._wait.append(sr)
        self._admit()

    def _admit(self) -> None:
        """Start waiting requests in order while there are batch slots and KV room; each one's prefix-cache
        hit is what the cache holds when it starts, not when it was added."""
        while self._wait and len(self._run) < self.cfg.max_batch:
            sr = self._wait[0]
            n_all = len(sr.req.prompt_token_ids) + len(sr.req.output_token_ids)
            cached_blocks = 0
            if self.cfg.prefix_caching:
                for h in sr.hashes:
                    if h in self._pinned or h in self._cache:
                        cached_blocks += 1
                    else:
                        break
            if not self._pin(sr):
                return
            sr.cached = min(cached_blocks * self.cfg.block_size, n_all - 1)  # the last token is always recomputed
            sr.prefill = n_all - sr.cached
            self._run[self._wait.pop(0).req.gen_id] = sr

    def _extra_blocks(self, sr: _SimReq) -> int:
        return 2 + (len(sr.pieces) + self.cfg.block_size - 1) // self.cfg.block_size  # partial + output

    def _pin(self, sr: _SimReq) -> bool:
        """Pin the request's blocks (evicting LRU cached ones); False if there is no room."""
        new = [h for h in sr.hashes if h not in self._pinned]
        extra = self._extra_blocks(sr)
        if self._used + len(new) + extra > self._capacity:
            return False
        for h in new:
            self._cache.pop(h, None)  # reused from the cache: now pinned
        self._used += len(new) + extra
        while self._cache and self._used + len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
        for h in sr.hashes:
            self._pinned[h] = self._pinned.get(h, 0) + 1
        sr.blocks = extra
        return True

    def _release(self, gen_id: str, keep_cache: bool) -> None:
        sr = self._run.pop(gen_id, None)
        if sr is None:
            self._wait = [w for w in self._wait if w.req.gen_id != gen_id]
            self._admit()  # the head may have been what blocked the others
            return
        hashes = self._block_hashes(sr.req) if keep_cache else sr.hashes
        self._used -= sr.blocks
        for h in sr.hashes:
            c = self._pinned[h] - 1
            if c:
                self._pinned[h] = c
            else:
                del self._pinned[h]
                self._used -= 1
                if keep_cache and self.cfg.prefix_caching:
                    self._cache[h] = None
        if keep_cache and self.cfg.prefix_caching:  # blocks filled by the output
            for h in hashes[len(sr.hashes):]:
                if h not in self._pinned:
                    self._cache[h] = None
                    self._cache.move_to_end(h)
        while len(self._cache) > max(0, self._capacity - self._used):
            self._cache.popitem(last=False)
        self._admit()

    def _backend_suspend(self, gen_id: str) -> None:
        self._release(gen_id, keep_cache=True)

    def _backend_abort(self, gen_id: str) -> None:
        self._release(gen_id, keep_cache=True)  # like vLLM: computed blocks stay reusable

    def _backend_step(self) -> tuple[Sequence[RawTokens], float | None, int]:
        outs: list[RawTokens] = []
        budget = self.cfg.max_prefill_tokens_per_step
        prefill = 0
        decoding = 0
        for gid, sr in self._run.items():
            if sr.prefill:  # chunked prefill in admission order; no token until it is done
                take = min(sr.prefill, budget - prefill)
                if take <= 0:
                    continue
                sr.prefill -= take
                prefill += take
                if sr.prefill:
                    continue
                cached = sr.cached
                self.cache_hit_tokens += sr.cached
            else:
                cached = 0
            decoding += 1
            pos = len(sr.req.output_token_ids)
            if pos < len(sr.pieces):
                outs.append(RawTokens(gid, [sr.ids[pos]], [sr.pieces[pos]], cached_prompt_tokens=cached))
            else:  # the plan is written out: the model emits EOS
                outs.append(RawTokens(gid, [], [], finished=FinishReason.STOP, cached_prompt_tokens=cached))
        dur = self.cfg.step_time(decoding, prefill)
        self.total_prefill_tokens += prefill
        self.total_decode_tokens += decoding
        self._last_step = dur
        return outs, dur, prefill

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self._run), waiting=len(self._wait),
                           kv_cache_usage=min(1.0, self._used / self._capacity),
                           tokens_per_s=self.recent_tokens_per_s(), step_time_s=self._last_step,
                           max_batch=self.cfg.max_batch)
