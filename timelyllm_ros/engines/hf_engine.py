"""transformers backend: the CPU fallback (e.g. on a robot's own computer).

Each generation owns its KV cache (``past_key_values``). One :meth:`step`
decodes one token for up to ``max_batch`` active generations, round-robin
(generations of different lengths would need padding and cache merging to
share one forward pass; on a small CPU the sequential forwards cost about the
same). On a segment boundary the generation leaves the active set and its
cache is kept, keyed by the token ids it covers; a resume whose prompt starts
with those ids feeds only the tokens the cache lacks (normally just the
boundary token), so resuming costs no re-prefill. Kept caches are dropped
least-recently-used beyond ``max_suspended`` (the resume then re-prefills).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from timelyllm_ros.engines.base import Engine, EngineInfo, EngineRequest, EngineStats, FinishReason, RawTokens
from timelyllm_ros.engines.detok import IncrementalDetokenizer


@dataclass
class _Gen:
    req: EngineRequest
    cache: Any  # transformers Cache (or None before the first forward)
    cached_ids: list[int]  # token ids whose KV is in `cache`
    pending: list[int]  # ids to feed in the next forward
    detok: IncrementalDetokenizer
    reused: int  # tokens taken from a kept cache at (re)submission
    remaining: int


def _context_limit(config: Any) -> int | None:
    """The model's positional limit (max_position_embeddings), where its config states one."""
    n = getattr(config, "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


class TransformersEngine(Engine):
    """:class:`Engine` over a transformers causal LM, greedy by default."""

    def __init__(self, model: str, *, dtype: str = "float32", threads: int = 0, max_batch: int = 4,
                 max_suspended: int = 64) -> None:
        super().__init__()
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads > 0:
            torch.set_num_threads(threads)
        t0 = time.perf_counter()
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        # `lm`, not `model`: the model's name lives in info.model, as for every backend.
        self.lm = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype))
        self.lm.eval()
        self.load_s = time.perf_counter() - t0
        # No prefix cache across requests: only a suspended generation's own KV cache is kept for its resume.
        self.info = EngineInfo(name="transformers", model=str(model),
                               max_model_len=_context_limit(self.lm.config),
                               needs_plan_text=False, supports_prefix_cache=False)
        self.max_batch = max_batch
        self.max_suspended = max_suspended
        eos = self.lm.generation_config.eos_token_id
        self.eos_token_ids: set[int] = set(eos if isinstance(eos, list) else [eos]) - {None}
        self._active: OrderedDict[str, _Gen] = OrderedDict()  # round-robin order
        self._kept: OrderedDict[str, tuple[Any, list[int]]] = OrderedDict()  # suspended caches, LRU

    # -- hooks -------------------------------------------------------------
    def _backend_add(self, req: EngineRequest) -> None:
        ids = req.all_token_ids
        cache, cached = None, []
        kept = self._kept.pop(req.gen_id, None)
        if kept is not None and len(kept[1]) < len(ids) and ids[:len(kept[1])] == kept[1]:
            cache, cached = kept
        remaining = req.max_new_tokens - len(req.output_token_ids)
        if remaining <= 0:
            raise ValueError(f"{req.gen_id}: no tokens left (max_new_tokens={req.max_new_tokens})")
        self._active[req.gen_id] = _Gen(
            req, cache, list(cached), ids[len(cached):],
            IncrementalDetokenizer(self.tokenizer, ids, skip_ids=self.eos_token_ids), len(cached), remaining)
        self.submissions.append({"gen_id": req.gen_id, "prompt_tokens": len(ids), "cached_tokens": len(cached)})

    def _forward(self, g: _Gen) -> int:
        torch = self._torch
        from transformers import DynamicCache

        if g.cache is None:
            g.cache = DynamicCache()
        inp = torch.tensor([g.pending], dtype=torch.long)
        with torch.inference_mode():
            out = self.lm(input_ids=inp, past_key_values=g.cache, use_cache=True)
        g.cache = out.past_key_values
        g.cached_ids.extend(g.pending)
        logits = out.logits[0, -1]
        temp = float(g.req.extra.get("temperature", 0.0))
        if temp > 0:
            probs = torch.softmax(logits.float() / temp, dim=-1)
            return int(torch.multinomial(probs, 1))
        return int(torch.argmax(logits))

    def _backend_step(self) -> tuple[Sequence[RawTokens], float | None, int]:
        raw: list[RawTokens] = []
        prefill = 0
        for gid in list(self._active)[:self.max_batch]:
            g = self._active[gid]
            first = len(g.pending) > 1 or g.reused or not g.req.output_token_ids
            if len(g.pending) > 1:
                prefill += len(g.pending)
            tok = self._forward(g)
            g.pending = [tok]
            g.remaining -= 1
            finished = None
            if tok in self.eos_token_ids:
                finished = FinishReason.STOP
            elif g.remaining <= 0:
                finished = FinishReason.LENGTH
            raw.append(RawTokens(gid, [tok], [g.detok.push(tok)], finished, g.reused if first else 0))
            g.reused = 0
            self._active.move_to_end(gid)  # round-robin when more than max_batch are active
            if finished is not None:
                self._active.pop(gid, None)
        return raw, None, prefill

    def _backend_suspend(self, gen_id: str) -> None:
        g = self._active.pop(gen_id, None)
        if g is None or g.cache is None:
            return
        self._kept[gen_id] = (g.cache, g.cached_ids)
        while len(self._kept) > self.max_suspended:
            self._kept.popitem(last=False)

    def _backend_abort(self, gen_id: str) -> None:
        self._active.pop(gen_id, None)
        self._kept.pop(gen_id, None)

    def abort(self, gen_id: str) -> None:
        """Also frees the kept cache of a suspended generation (Engine.abort only stops running ones)."""
        super().abort(gen_id)
        self._kept.pop(gen_id, None)

    # -- introspection -------------------------------------------------------
    def suspended_ids(self) -> set[str]:
        return set(self._kept)

    def stats(self) -> EngineStats:
        return EngineStats(running=min(len(self._active), self.max_batch),
                           waiting=max(0, len(self._active) - self.max_batch),
                           kv_cache_usage=0.0,  # host memory; no fixed pool
                           tokens_per_s=self.recent_tokens_per_s(), step_time_s=self.recent_step_time_s(),
                           max_batch=self.max_batch)

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def close(self) -> None:
        self._active.clear()
        self._kept.clear()
        self._live.clear()
