"""What a new prompt's prefill costs: how much of it the engine's prefix cache holds.

Two sources: the prompts the cache holds, warm-up's and those admitted since (a task shares its prefix with one
of them), and the hits the robot type's first segments have reported (an EWMA, and the largest as a best case
for shedding).

The prompts held are indexed by the chained hashes of their whole KV blocks (vLLM's automatic prefix caching
keys its blocks the same way), so a prompt's hit is a walk along its own blocks, whatever the number of prompts
held. A prompt counts as held from the moment it is admitted to the engine, not when its first segment comes:
vLLM caches a block when the step that computes it is scheduled, and a second request with the same prefix in
that step or a later one finds it there. Five drones reporting the same emergency in the same instant: the
first prompt's turn is prefilled once (~74 tokens on the bundled model), the others only their last, partial
block (~10 tokens; bench/results/urgent_burst/).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from timelyllm_ros.domain.types import TaskSpec
from timelyllm_ros.engines.base import Engine
from timelyllm_ros.engines.latency import LatencyEstimator
from timelyllm_ros.planner.generation import Generation

WARM_PROMPTS_KEPT = 64  # per robot type: the planner warms one prompt per set of few-shot families (21 for a drone)
# per robot type: the last prompts admitted. An admitted prompt costs the cache only its own turn's few blocks
# beyond the warmed prefix, so vLLM's CPU cache (~1,450 blocks of 32 tokens) keeps far more of them than this.
SERVED_PROMPTS_KEPT = 64


def block_hashes(ids: Sequence[int], block: int) -> list[int]:
    """Chained hashes of the whole ``block``-token blocks of ``ids``: equal prefixes of whole blocks, equal hashes."""
    out: list[int] = []
    h = 0
    for i in range(0, len(ids) // block * block, block):
        h = hash((h, *ids[i:i + block]))
        out.append(h)
    return out


class PrefixIndex:
    """The whole blocks of the prompts one prefix cache holds, counted per block (prompts share prefixes)."""

    def __init__(self) -> None:
        self._count: dict[int, int] = {}

    def add(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            self._count[h] = self._count.get(h, 0) + 1

    def remove(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            c = self._count.get(h, 0) - 1
            if c > 0:
                self._count[h] = c
            else:
                self._count.pop(h, None)

    def leading(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes``, from the first, are held."""
        n = 0
        for h in hashes:
            if h not in self._count:
                break
            n += 1
        return n

    def clear(self) -> None:
        self._count.clear()


class PrefillModel:
    """Prefix-cache hits per robot type and per prompt. ``default_tokens``: a prompt not tokenized yet;
    ``kv_block_tokens``: the cache's block size where the engine's is not to be used (CoreConfig)."""

    def __init__(self, default_tokens: int = 64, kv_block_tokens: int | None = None) -> None:
        self.default_tokens, self.kv_block_tokens = default_tokens, kv_block_tokens
        self._hit: dict[str, float] = {}  # robot type -> prefix-cache hit tokens of new prompts (EWMA)
        self._hit_max: dict[str, int] = {}  # robot type -> the largest hit seen (a best case, for shedding)
        # robot type -> the prompts warm-up left in the prefix cache (one per few-shot family set: a task shares its
        # prefix with one of them only), the last WARM_PROMPTS_KEPT; and the prompts admitted since, the last
        # SERVED_PROMPTS_KEPT, apart, so that a run of new tasks never pushes a family's warmed prefix out. A task
        # sent again (the same emergency report, the same request) finds all of its prompt but the last block in
        # the cache.
        self._warm: dict[str, deque[list[int]]] = {}
        self._served: dict[str, deque[list[int]]] = {}
        self._index: dict[str, PrefixIndex] = {}  # robot type -> the blocks of both, hashed at self._block
        self._block = 0  # the block size the index was taken with (0: none yet)
        self.version = 0  # bumped whenever what the cache is known to hold changes (reprice)
        self._priced = -1  # the version the waiting prompts were last priced at

    def block_tokens(self, engine: Engine | None = None) -> int:
        """Tokens per KV block: the prefix cache holds whole blocks only (CoreConfig's, else the engine's, else
        16)."""
        return self.kv_block_tokens or (engine.info.kv_block_tokens if engine is not None else None) or 16

    def _index_for(self, robot_type: str, block: int) -> PrefixIndex:
        """The robot type's index at ``block`` tokens a block (rebuilt from the prompts kept if the size changed)."""
        if block != self._block:
            self._block = block
            self._index.clear()
            for rt in set(self._warm) | set(self._served):
                idx = self._index[rt] = PrefixIndex()
                for ids in (*self._warm.get(rt, ()), *self._served.get(rt, ())):
                    idx.add(block_hashes(ids, block))
        return self._index.setdefault(robot_type, PrefixIndex())

    def _note(self, kept: dict[str, deque[list[int]]], maxlen: int, robot_type: str, prompt_ids: Sequence[int],
              block: int) -> None:
        idx = self._index_for(robot_type, block)
        q = kept.setdefault(robot_type, deque())
        q.append(list(prompt_ids))
        idx.add(block_hashes(prompt_ids, block))
        while len(q) > maxlen:
            idx.remove(block_hashes(q.popleft(), block))
        self.version += 1

    def note_warm_prompt(self, robot_type: str, prompt_ids: list[int], engine: Engine | None = None) -> None:
        self._note(self._warm, WARM_PROMPTS_KEPT, robot_type, prompt_ids, self.block_tokens(engine))

    def note_served(self, robot_type: str, prompt_ids: list[int], engine: Engine) -> None:
        """A prompt was admitted to ``engine``: its whole blocks are in the prefix cache from its prefill step on."""
        if engine.info.supports_prefix_cache:
            self._note(self._served, SERVED_PROMPTS_KEPT, robot_type, prompt_ids, self.block_tokens(engine))

    def forget_warm(self) -> None:
        """The engine's prefix cache is gone (a replaced engine)."""
        self._warm.clear()
        self._served.clear()
        self._index.clear()
        self.version += 1

    def warm_hit(self, spec: TaskSpec, engine: Engine, hashes: Sequence[int] | None = None) -> int | None:
        """The prompt tokens the prefix cache holds for ``spec`` from a warmed or admitted prompt: the longest
        prefix of whole KV blocks it shares with one (vLLM caches full blocks only), less the last prompt token
        (always computed). None when no prompt of its robot type was warmed. ``hashes``: the prompt's
        :func:`block_hashes`, where the caller keeps them. Per prompt, not per robot type: the drone's families
        leave cached prefixes from 1.4k to 1.8k tokens, and a robot type's mean hit made a short prompt's
        uncached tail look 3x too small, so admission let several such prefills into one step."""
        ids = spec.prompt_token_ids
        if not ids or not self._warm.get(spec.robot_type):
            return None
        block = self.block_tokens(engine)
        idx = self._index_for(spec.robot_type, block)
        if hashes is None:
            hashes = block_hashes(ids, block)
        return min(idx.leading(hashes) * block, len(ids) - 1)

    def hashes_of(self, g: Generation, engine: Engine) -> list[int]:
        """``g``'s prompt blocks, taken once and kept on it."""
        block = self.block_tokens(engine)
        if g.prompt_blocks is None or g.prompt_blocks[0] != block:
            g.prompt_blocks = (block, block_hashes(g.spec.prompt_token_ids or [], block))
        return g.prompt_blocks[1]

    def price(self, g: Generation, engine: Engine, est: LatencyEstimator, n: int | None = None) -> None:
        """``g``'s new prompt (``n`` tokens where the spec has no ids yet) against what the prefix cache holds now:
        its hit, the tokens left to compute and their prefill in a step of its own."""
        spec = g.spec
        if spec.prompt_token_ids:
            g.warm_hit = self.warm_hit(spec, engine, self.hashes_of(g, engine))
        g.prefill_est_s = est.prefill_time(self.uncached(spec, n, g.warm_hit))

    def reprice(self, waiting: Iterable[Generation], engine: Engine, est: LatencyEstimator) -> None:
        """What the cache holds changed since the last call (a prompt admitted, one warmed): the new prompts
        ``waiting`` are priced again, so that one whose prefix another has just brought in ranks and is admitted
        as the cheap prompt it now is (the same emergency reported by several robots)."""
        if self._priced == self.version:
            return
        self._priced = self.version
        for g in waiting:
            if g.k == 0 and g.req is None:
                self.price(g, engine, est)

    def admitted(self, g: Generation, engine: Engine, one_cache: bool = True) -> bool:
        """A new prompt with its token ids joins ``engine``: from its prefill step on the prefix cache holds its
        blocks, for the prompts admitted after it, in the same step too (vLLM caches a block when the step that
        computes it is scheduled). Not where ``one_cache`` is False (a pool: its members cache apart). Returns
        whether it was noted."""
        ids = g.spec.prompt_token_ids
        if g.k != 0 or g.req is not None or not ids or not one_cache or not engine.info.supports_prefix_cache:
            return False
        self.note_served(g.robot_type, ids, engine)
        return True

    def rides(self, g: Generation, engine: Engine) -> bool:
        """``g`` is a new prompt of which the prefix cache holds all but its last, partial block: the same report
        as a prompt admitted before it (another robot's copy of one emergency), or one that short. Joining, it
        adds at most one block to the step's prefill, however it ranks."""
        ids = g.spec.prompt_token_ids
        if g.k != 0 or g.req is not None or not ids or g.warm_hit is None:
            return False
        return len(ids) - g.warm_hit <= self.block_tokens(engine)

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

    def uncached(self, spec: TaskSpec, n: int | None = None, hit: float | None = None) -> int:
        """Tokens of a new prompt of ``n`` tokens the engine must compute: its length minus ``hit``, the prefix
        the cache holds for it (:meth:`warm_hit`), or without one the hits this robot type's prompts have been
        getting; at least 1."""
        if n is None:
            n = self.prompt_tokens(spec)
        if hit is None:
            hit = self._hit.get(spec.robot_type)
        return int(n if hit is None else max(1.0, n - hit))

    def estimate(self, spec: TaskSpec, est: LatencyEstimator, n: int | None = None,
                 hit: float | None = None) -> float:
        """Prefill time of a new prompt (:meth:`uncached` tokens) in a step of its own."""
        return est.prefill_time(self.uncached(spec, n, hit))

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
