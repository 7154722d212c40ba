"""What a new prompt's prefill costs: how much of it the engine's prefix cache holds.

Two sources: the prompts the cache holds, warm-up's and those served since (a task shares its prefix with one of
them), and the hits the robot type's first segments have reported (an EWMA, and the largest as a best case for
shedding).
"""

from __future__ import annotations

import itertools
from collections import deque

from timelyllm_ros.domain.tokens import common_prefix_len
from timelyllm_ros.domain.types import Generation, TaskSpec
from timelyllm_ros.engines.base import Engine
from timelyllm_ros.engines.latency import LatencyEstimator

WARM_PROMPTS_KEPT = 64  # per robot type: the planner warms one prompt per set of few-shot families (21 for a drone)
# per robot type: the last prompts served. A served prompt costs the cache only its own turn's few blocks beyond the
# warmed prefix, so vLLM's CPU cache (~1,450 blocks of 32 tokens) keeps far more of them than this.
SERVED_PROMPTS_KEPT = 64


class PrefillModel:
    """Prefix-cache hits per robot type and per prompt. ``default_tokens``: a prompt not tokenized yet;
    ``kv_block_tokens``: the cache's block size where the engine's is not to be used (CoreConfig)."""

    def __init__(self, default_tokens: int = 64, kv_block_tokens: int | None = None) -> None:
        self.default_tokens, self.kv_block_tokens = default_tokens, kv_block_tokens
        self._hit: dict[str, float] = {}  # robot type -> prefix-cache hit tokens of new prompts (EWMA)
        self._hit_max: dict[str, int] = {}  # robot type -> the largest hit seen (a best case, for shedding)
        # robot type -> the prompts warm-up left in the prefix cache (one per few-shot family set: a task
        # shares its prefix with one of them only), the last WARM_PROMPTS_KEPT
        self._warm: dict[str, deque[list[int]]] = {}
        # robot type -> prompts served since, the last SERVED_PROMPTS_KEPT: a task sent again (the same emergency
        # report, the same request) finds all of its prompt but the last block in the cache. Apart from the warm
        # prompts, so that a run of new tasks never pushes a family's warmed prefix out.
        self._served: dict[str, deque[list[int]]] = {}

    def block_tokens(self, engine: Engine) -> int:
        """Tokens per KV block: the prefix cache holds whole blocks only (the engine's, else 16)."""
        return self.kv_block_tokens or engine.info.kv_block_tokens or 16

    def note_warm_prompt(self, robot_type: str, prompt_ids: list[int]) -> None:
        self._warm.setdefault(robot_type, deque(maxlen=WARM_PROMPTS_KEPT)).append(list(prompt_ids))

    def note_served(self, robot_type: str, prompt_ids: list[int], engine: Engine) -> None:
        """A prompt was prefilled (its first segment came): its whole blocks are in ``engine``'s prefix cache now."""
        if engine.info.supports_prefix_cache:
            self._served.setdefault(robot_type, deque(maxlen=SERVED_PROMPTS_KEPT)).append(list(prompt_ids))

    def forget_warm(self) -> None:
        """The engine's prefix cache is gone (a replaced engine)."""
        self._warm.clear()
        self._served.clear()

    def warm_hit(self, spec: TaskSpec, engine: Engine) -> int | None:
        """The prompt tokens the prefix cache holds for ``spec`` from a warmed or served prompt (:meth:`note_served`):
        the longest prefix it shares with one, in whole KV blocks (vLLM caches full blocks only), less the last
        prompt token (always computed). None when no prompt of its robot type was warmed. Per prompt, not per
        robot type: the drone's families leave cached prefixes from 1.4k to 1.8k tokens, and a robot type's mean
        hit made a short prompt's uncached tail look 3x too small, so admission let several such prefills into
        one step."""
        ids = spec.prompt_token_ids
        warm = self._warm.get(spec.robot_type)
        if not ids or not warm:
            return None
        block = self.block_tokens(engine)
        held = itertools.chain(warm, self._served.get(spec.robot_type, ()))
        n = max(common_prefix_len(w, ids) for w in held) // block * block
        return min(n, len(ids) - 1)

    def seed(self, robot_type: str, hit: int | None) -> None:
        """A robot type's first task: its warm hit stands for the learned one until a hit is measured."""
        if hit is None or robot_type in self._hit:
            return
        self._hit[robot_type] = float(hit)
        self._hit_max[robot_type] = max(self._hit_max.get(robot_type, 0), hit)

    def observe(self, robot_type: str, cached_tokens: int) -> None:
        """A first segment reported how much of its prompt the cache held."""
        old = self._hit.get(robot_type)
        self._hit[robot_type] = float(cached_tokens) if old is None else 0.8 * old + 0.2 * cached_tokens
        self._hit_max[robot_type] = max(self._hit_max.get(robot_type, 0), cached_tokens)

    def hit(self, robot_type: str) -> float | None:
        """The hits this robot type's prompts have been getting (EWMA), None before any."""
        return self._hit.get(robot_type)

    def best_hit(self, robot_type: str) -> int:
        return self._hit_max.get(robot_type, 0)

    def prompt_tokens(self, spec: TaskSpec) -> int:
        return len(spec.prompt_token_ids) if spec.prompt_token_ids else self.default_tokens

    def estimate(self, spec: TaskSpec, est: LatencyEstimator, n: int | None = None,
                 hit: float | None = None) -> float:
        """Prefill time of a new prompt of ``n`` tokens: its length minus ``hit``, the prefix its warmed prompt
        leaves in the cache (:meth:`warm_hit`), or without one the hits this robot type's prompts have been
        getting."""
        if n is None:
            n = self.prompt_tokens(spec)
        if hit is None:
            hit = self._hit.get(spec.robot_type)
        uncached = n if hit is None else max(1.0, n - hit)
        return est.prefill_time(int(uncached))

    def best_hit_of(self, g: Generation) -> int:
        """The most of this prompt the cache can hold: the largest hit its robot type has had, or the prefix it
        shares with a warmed prompt (:meth:`warm_hit`) where that is more. The robot type's hit alone is no
        best case for a prompt longer than those seen: an emergency's two evasion families make a ~1.9k-token
        prompt whose warmed prefix leaves ~95 tokens to compute, where the largest hit of the shorter prompts
        before it left ~445 (~0.26 s on a CPU), and pud-shed shed every urgent task the trace's events bring."""
        return max(self.best_hit(g.robot_type), g.warm_hit or 0)

    def best(self, g: Generation, est: LatencyEstimator) -> float:
        """The least a new prompt's prefill can take: less the most of it the cache can hold (:meth:`best_hit_of`)."""
        return est.prefill_time(max(1, self.prompt_tokens(g.spec) - self.best_hit_of(g)))
