"""Where an engine pool places a generation (the rule in :mod:`timelyllm_ros.engines.pool`), and the scheduler's
latency estimate that follows it (:class:`PoolLatencyEstimator`).

:class:`Placement` owns what placement remembers: the member each generation last ran on, the last prompt of each
affinity key each member prefilled, and the running mean of tokens per placement.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from timelyllm_ros.domain.tokens import common_prefix_len
from timelyllm_ros.engines.base import Engine, EngineRequest, SegmentEvent
from timelyllm_ros.engines.latency import LatencyEstimator
from timelyllm_ros.engines.pool_members import STEP_EWMA, PoolMember, Roster

AFFINITY_PREFIX_TOKENS = 64  # prompt ids that name a shared prefix when a request has no robot type
MEMORY_LEN = 4096  # generations / affinity keys whose last member is remembered (a long-running node)
PREFIX_MEMORY_LEN = 256  # (affinity key, member) pairs whose last prompt is kept to price cache hits
SEGMENT_TOKENS_PRIOR = 16.0  # expected tokens per placement until the pool has seen segments (a skill or two)


def remember(d: OrderedDict, key: Any, value: Any, bound: int = MEMORY_LEN) -> None:
    d[key] = value
    d.move_to_end(key)
    while len(d) > bound:
        d.popitem(last=False)


class Placement:
    """The pool's placement rule over the members of ``roster`` that are up, and what it remembers."""

    def __init__(self, roster: Roster) -> None:
        self.roster = roster
        self._last: OrderedDict[str, int] = OrderedDict()  # gen_id -> member it last ran on (suspended too)
        # (affinity key, member) -> the last prompt of that key the member prefilled (what its cache shares)
        self._prompts: OrderedDict[tuple[Any, int], list[int]] = OrderedDict()
        self._placed_tokens: dict[str, int] = {}  # gen_id -> tokens generated since it was placed
        self.segment_tokens = SEGMENT_TOKENS_PRIOR  # running mean of tokens per placement

    @staticmethod
    def affinity_key(req: EngineRequest) -> Any:
        """What shares a prompt prefix: the robot type (one system prompt each), else the first prompt ids."""
        rt = req.extra.get("robot_type")
        return ("robot_type", rt) if rt else ("prefix", tuple(req.prompt_token_ids[:AFFINITY_PREFIX_TOKENS]))

    def order(self, req: EngineRequest, exclude: frozenset[int] = frozenset()) -> list[int]:
        """The members that are up, best first for ``req`` (the rule of the pool's module docstring)."""
        key, last = self.affinity_key(req), self._last.get(req.gen_id)
        context = len(req.prompt_token_ids) + len(req.output_token_ids)

        def uncached(m: PoolMember) -> int:
            if m.index == last:
                return 0
            seen = self._prompts.get((key, m.index))
            return context - (common_prefix_len(seen, req.prompt_token_ids) if seen else 0)

        return [m.index for m in sorted((m for m in self.roster.members if m.up and m.index not in exclude),
                                        key=lambda m: self.rank(m, len(m.owned), uncached(m)))]

    def rank(self, m: PoolMember, load: int, uncached_tokens: int = 0) -> tuple:
        """Placement's key for ``m`` carrying ``load`` generations (least first), for a generation of which
        ``uncached_tokens`` are not in ``m``'s prefix cache."""
        est = self.pricing(m)
        # the time it adds on that member, to every generation there: all wait for its prefill, and each
        # decode step of the segment's expected length gets longer for all of them
        decode = (load + 1) * est.step_time(load + 1) - load * est.step_time(load)
        cost = (load + 1) * est.prefill_time(uncached_tokens) + self.segment_tokens * decode
        return (load >= m.max_batch, cost, load, m.index)

    def pricing(self, m: PoolMember) -> LatencyEstimator:
        """The estimate ``m`` is priced with: its own once it has measured a step or declares a step model;
        before that the most measured member's (the same model served elsewhere), not the default prior, whose
        GPU figures would make an unmeasured CPU server look ten times faster than a measured one."""
        if m.est.decode_samples or m.engine.info.step_model is not None:
            return m.est
        best = max(self.roster.up(), key=lambda x: x.est.decode_samples, default=m)
        return best.est if best.est.decode_samples else m.est

    def last(self, gen_id: str) -> int | None:
        """The member ``gen_id`` last ran on (None: none remembered)."""
        return self._last.get(gen_id)

    def placed(self, req: EngineRequest, index: int) -> None:
        """``req`` now runs on member ``index``: its home, and the prompt that member's cache now shares."""
        remember(self._last, req.gen_id, index)
        remember(self._prompts, (self.affinity_key(req), index), req.prompt_token_ids, PREFIX_MEMORY_LEN)

    def counted(self, m: PoolMember, ev: SegmentEvent) -> None:
        """Count the tokens of ``ev`` (from member ``m``); a segment that ends feeds the mean per placement, and a
        suspended generation's home is ``m``."""
        self._placed_tokens[ev.gen_id] = self._placed_tokens.get(ev.gen_id, 0) + len(ev.token_ids)
        if ev.final or ev.suspended:
            n = self._placed_tokens.pop(ev.gen_id)
            self.segment_tokens += STEP_EWMA * (max(1, n) - self.segment_tokens)

    def suspended_on(self, gen_id: str, index: int) -> None:
        remember(self._last, gen_id, index)

    def forget_home(self, gen_id: str) -> int | None:
        """Forget where ``gen_id`` last ran (it ended, or moves); that member, if one was remembered."""
        return self._last.pop(gen_id, None)

    def forget_tokens(self, gen_id: str) -> None:
        self._placed_tokens.pop(gen_id, None)


class PoolLatencyEstimator(LatencyEstimator):
    """The scheduler's latency estimate over an engine pool: each member's own :class:`LatencyEstimator`
    (fed by the pool from that member's steps), answered for the member placement would put a generation on.

    ``step_time(n)``: ``n`` generations placed one by one on the members that are up by placement's rule
    (capacity, cost with nothing cached, load: the scheduler does not say which generation it asks
    about); the time per token of the member the n-th one lands on, at its load there. ``prefill_time(k)``:
    that of the member a new generation would go to now (its current load). With no member up, the pool's
    declared step model (this estimator's own state). The merged step reports the core observes are not
    needed: the members learn from their own.
    """

    def __init__(self, *, placement: Placement, **kw: Any) -> None:
        super().__init__(**kw)  # the fallback: the pool's declared model (see EnginePool.__init__)
        self._placement = placement

    def observe(self, batch: int, duration_s: float, prefill_tokens: int = 0) -> None:
        """The merged step itself is not learned (it mixes members of different speeds): each member learns
        its own steps of it now (:meth:`EnginePool.learn`)."""
        self._placement.roster.learn()

    def _placed(self, batch: int) -> tuple[PoolMember, int] | None:
        """The member the ``batch``-th generation would be placed on and its load there; None: none is up."""
        up = self._placement.roster.up()
        if not up:
            return None
        rank = self._placement.rank
        load = dict.fromkeys((m.index for m in up), 0)
        for _ in range(max(1, batch)):
            m = min(up, key=lambda m: rank(m, load[m.index]))
            load[m.index] += 1
        return m, load[m.index]

    def _next(self) -> PoolMember | None:
        """The member a new generation would be placed on now (its current load, no affinity)."""
        up = self._placement.roster.up()
        return min(up, key=lambda m: self._placement.rank(m, len(m.owned))) if up else None

    def step_time(self, batch: int) -> float:
        placed = self._placed(batch)
        if placed is None:
            return super().step_time(batch)
        m, load = placed
        return self._placement.pricing(m).step_time(load)

    def prefill_time(self, tokens: int) -> float:
        m = self._next()
        return self._placement.pricing(m).prefill_time(tokens) if m is not None else super().prefill_time(tokens)

    def prefill_join_time(self, tokens: int) -> float:
        m = self._next()
        pricing = self._placement.pricing
        return pricing(m).prefill_join_time(tokens) if m is not None else super().prefill_join_time(tokens)

    def describe(self) -> dict[str, Any]:
        """The estimate of the member a new generation would go to now; samples summed over the members."""
        m = self._next()
        if m is None:
            return {**super().describe(), "seed": f"{self.source} (no pool member up)"}
        d = self._placement.pricing(m).describe()
        ests = [x.est.describe() for x in self._placement.roster.up()]
        d["seed"] = f"per pool member ({m.name}: {d['seed']})"
        d["decode_samples"] = sum(e["decode_samples"] for e in ests)
        d["prefill_samples"] = sum(e["prefill_samples"] for e in ests)
        return d

    def for_replaced_engine(self, engine: Engine) -> LatencyEstimator:
        # this pool's members are gone: the new engine's own estimate, or one seeded from its model
        return LatencyEstimator.for_engine(engine)
