"""An engine pool's members and their lifecycle (see :mod:`timelyllm_ros.engines.pool`): which are up, what each
has measured of its own steps, and the rejoin of one that failed.

:class:`Roster` owns the members: the pool places and steps on them, and marks one down; a down member is rebuilt
by the roster's :class:`Rejoins` after its backoff.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from timelyllm_ros.engines.base import Engine, EngineInfo, EngineStats, StepReport
from timelyllm_ros.engines.latency import LatencyEstimator

log = logging.getLogger("timelyllm_ros.engines.pool")

STEP_EWMA = 0.2  # weight of a new sample in a member's measured step time
# Tokenized by every member at construction: their tokenizers must agree (plain text, MiniSpec, unicode).
TOKENIZER_PROBE = "Scene: [cat x:0.5] Task: find the cat. Plan: ?s('cat')==True{g('cat');tc(90);} Grüße 東京"


class PoolMismatchError(ValueError):
    """The members do not serve the same model (model, context, tokenizer, capabilities)."""


@dataclass(frozen=True)
class MemberStats:
    """One member as /engine_state would show it."""

    index: int
    name: str  # as configured (its config file, or backend and url)
    backend: str
    up: bool
    down_reason: str  # why it is down ("" while up)
    owned: int  # generations the pool placed on it that are running there
    max_batch: int
    step_time_s: float | None  # measured time per token (EWMA); None: not measured yet
    failovers: int  # generations moved away from it
    rejoins: int
    stats: EngineStats | None  # the member's own stats (None while down)
    # its latency estimator's time per token at its current batch (what the scheduler plans with)
    est_time_per_token_s: float | None = None


@dataclass
class PoolMember:
    """One member engine of a pool, with what the pool knows of it (owned by the pool's :class:`Roster`)."""

    index: int
    name: str
    engine: Engine
    rebuild: Callable[[], Engine] | None
    max_batch: int
    step_s: float | None  # measured time per token
    est: LatencyEstimator  # its own step-time estimate, fed from its own steps (the scheduler's, per member)
    up: bool = True
    down_reason: str = ""
    backoff_s: float = 0.0
    next_probe: float = 0.0
    probe: concurrent.futures.Future | None = None
    last_collect: float | None = None  # wall time of its previous step while busy
    # its steps since the core last learned (see EnginePool.learn): (batch, duration s, prefill tokens)
    unlearned: list[tuple[int, float, int]] = field(default_factory=list)
    failovers: int = 0
    rejoins: int = 0
    owned: set[str] = field(default_factory=set)

    def record_step(self, rep: StepReport) -> None:
        """Measure the step ``rep`` this member just ran: its time per token and what its estimator learns."""
        now = time.perf_counter()
        if rep.batch_size and rep.new_tokens:
            # A streamed (remote) member's step only collects what its server sent: the time since its
            # previous collection, over the tokens each generation got, is the server's time per token.
            # An in-process member's step is the step (modelled for a simulated one: deterministic).
            per_gen = max(1.0, rep.new_tokens / rep.batch_size)
            if not self.engine.info.streamed:
                sample = rep.duration_s / per_gen
            elif self.last_collect is not None:
                sample = max(rep.duration_s, now - self.last_collect) / per_gen
                # per token, so no prefill cost can be told apart in it: only decode is learned
                self.unlearned.append((rep.batch_size, sample, 0))
            else:  # the first collection after idle: its own wait says nothing of the server's pace
                sample = None
            if sample is not None:
                self.step_s = sample if self.step_s is None else self.step_s + STEP_EWMA * (sample - self.step_s)
        if not self.engine.info.streamed:  # what the core would learn from this engine alone (prefill steps too)
            self.unlearned.append((rep.batch_size, rep.duration_s, rep.prefill_tokens))
        self.last_collect = now if self.engine.has_work() else None

    def learn(self) -> None:
        """Feed its estimator the steps it ran since the last call."""
        for obs in self.unlearned:
            self.est.observe(*obs)
        self.unlearned.clear()

    def detach(self, gid: str) -> list[int]:
        """Take ``gid`` off this failed member: the tokens of its unfinished segment, if it can still say."""
        try:
            seg = self.engine.segment_so_far(gid)
        except Exception:  # noqa: BLE001 - a broken member: the segment restarts at the checker's state
            seg = []
        with contextlib.suppress(Exception):
            self.engine.abort(gid)
        return seg

    def describe(self, pricing: LatencyEstimator) -> MemberStats:
        """This member as /engine_state shows it; ``pricing``: the estimate placement prices it with."""
        st = None
        if self.up:
            with contextlib.suppress(Exception):
                st = self.engine.stats()
        return MemberStats(self.index, self.name, self.engine.info.name, self.up, self.down_reason, len(self.owned),
                           self.max_batch, self.step_s, self.failovers, self.rejoins, st,
                           pricing.step_time(len(self.owned)) if self.up else None)


def agree(members: Sequence[Engine], names: Sequence[str], probe_tokens: list[int]) -> EngineInfo:
    """The pool's info; PoolMismatchError naming the members that serve something else than the first."""
    first = members[0].info
    bad = [f"{names[i]} ({problem})" for i, m in enumerate(members[1:], 1)
           if (problem := mismatch(first, m, names[0], probe_tokens))]
    if bad:
        raise PoolMismatchError(f"engine pool: every member must serve the same model; {', '.join(bad)}")
    return EngineInfo(name="pool", model=first.model, max_model_len=first.max_model_len,
                      needs_plan_text=first.needs_plan_text, supports_prefix_cache=first.supports_prefix_cache,
                      step_model=first.step_model, kv_block_tokens=first.kv_block_tokens,
                      token_grammar=all(m.info.token_grammar for m in members))


def mismatch(ref: EngineInfo, m: Engine, ref_name: str, probe_tokens: list[int]) -> str:
    """What ``m`` serves differently from ``ref`` ("" if nothing); ``probe_tokens``: the reference's tokenization
    of :data:`TOKENIZER_PROBE`."""
    info = m.info
    for what in ("model", "max_model_len", "needs_plan_text", "supports_prefix_cache"):
        if getattr(info, what) != getattr(ref, what):
            return f"{what}={getattr(info, what)!r}, {ref_name} has {getattr(ref, what)!r}"
    if m.tokenize(TOKENIZER_PROBE) != probe_tokens:
        return f"its tokenizer disagrees with {ref_name}'s on {TOKENIZER_PROBE!r}"
    return ""


class Rejoins:
    """The pool's rejoin (:mod:`timelyllm_ros.engines.pool`): each member that is down is rebuilt after its
    backoff, in a background thread unless ``background`` is off; one rebuilt in the background joins at the next
    :meth:`run`. ``info``: what the pool serves (a rebuilt member must serve it too)."""

    def __init__(self, info: EngineInfo, probe_tokens: list[int], clock: Callable[[], float], background: bool,
                 max_backoff_s: float) -> None:
        self.info, self.probe_tokens, self.clock, self.max_backoff_s = info, probe_tokens, clock, max_backoff_s
        self.executor = concurrent.futures.ThreadPoolExecutor(1, "engine-pool-probe") if background else None

    def run(self, members: Sequence[PoolMember]) -> None:
        now = self.clock()
        for m in members:
            if m.up:
                continue
            if m.probe is not None:
                if m.probe.done():
                    self.probed(m, m.probe)
                continue
            if m.rebuild is None or now < m.next_probe:
                continue
            if self.executor is None:
                f: concurrent.futures.Future = concurrent.futures.Future()
                try:
                    f.set_result(self.rebuild(m))
                except Exception as e:  # noqa: BLE001
                    f.set_exception(e)
                self.probed(m, f)
            else:
                m.probe = self.executor.submit(self.rebuild, m)

    def rebuild(self, m: PoolMember) -> Engine:
        """Probe thread: close the failed engine, build it again, check it serves the pool's model."""
        with contextlib.suppress(Exception):
            m.engine.close()
        assert m.rebuild is not None
        eng = m.rebuild()
        problem = mismatch(self.info, eng, "the pool", self.probe_tokens)
        if problem:
            with contextlib.suppress(Exception):
                eng.close()
            raise PoolMismatchError(f"it came back serving something else: {problem}")
        return eng

    def probed(self, m: PoolMember, f: concurrent.futures.Future) -> None:
        m.probe = None
        try:
            eng = f.result()
        except Exception as e:  # noqa: BLE001
            m.down_reason = f"{m.down_reason.split(' [rejoin failed')[0]} [rejoin failed: {type(e).__name__}: {e}]"
            m.backoff_s = min(m.backoff_s * 2, self.max_backoff_s)
            m.next_probe = self.clock() + m.backoff_s
            log.info("engine pool: %s still down (%s); next try in %g s", m.name, e, m.backoff_s)
            return
        m.engine, m.up, m.down_reason, m.rejoins = eng, True, "", m.rejoins + 1
        m.max_batch = max(1, int(eng.stats().max_batch))
        m.step_s = eng.info.step_model.decode_s if eng.info.step_model else None
        m.est = LatencyEstimator.for_engine(eng)  # a rebuilt server may run elsewhere: learn it afresh
        m.unlearned.clear()
        log.warning("engine pool: %s rejoined", m.name)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)


class Roster:
    """The pool's members in order, and their rejoins: which are up, which are ready to be stepped."""

    def __init__(self, members: list[PoolMember], rejoins: Rejoins) -> None:
        self.members, self.rejoins = members, rejoins

    def __getitem__(self, index: int) -> PoolMember:
        return self.members[index]

    def up(self) -> list[PoolMember]:
        """The members serving now (placement, pricing and the pool's latency estimate choose among these)."""
        return [m for m in self.members if m.up]

    def any_up(self) -> Engine:
        """A member serving now (the first member's engine if none is): for tokenizing and decoding."""
        return next((m.engine for m in self.members if m.up), self.members[0].engine)

    def why_down(self) -> str:
        """Each member and why it is down ("up" for one serving)."""
        return "; ".join(f"{m.name}: {m.down_reason or 'up'}" for m in self.members)

    def rejoin(self) -> None:
        """Rebuild the members whose backoff is over; let in those rebuilt in the background."""
        self.rejoins.run(self.members)

    def learn(self) -> None:
        for m in self.members:
            m.learn()

    def wait_ready(self, busy: list[PoolMember], end: float, poll_s: float,
                   down: Callable[[int, str], None]) -> list[PoolMember]:
        """The members of ``busy`` whose engines have something to collect, waiting until ``end`` (perf_counter)
        for one; a member that cannot say is passed to ``down`` (its index, why)."""
        while True:
            ready = [m for m in busy if self.ready(m, down)]
            if ready or not busy or time.perf_counter() >= end:
                return ready
            time.sleep(poll_s)

    @staticmethod
    def ready(m: PoolMember, down: Callable[[int, str], None]) -> bool:
        try:
            return m.engine.step_ready()
        except Exception as e:  # noqa: BLE001 - a member that cannot say is a failed member
            down(m.index, f"step_ready raised {type(e).__name__}: {e}")
            return False

    def close(self) -> None:
        self.rejoins.close()
        for m in self.members:
            if m.probe is not None and m.probe.done() and m.probe.exception() is None:
                with contextlib.suppress(Exception):
                    m.probe.result().close()
            with contextlib.suppress(Exception):
                m.engine.close()
