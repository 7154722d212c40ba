"""A pool of engines behind the one :class:`Engine` interface: placement, failover.

The scheduler still decides *what* runs next; the pool decides *where*. It holds N member engines (local or
remote, each built by the factory from its own config) and exposes the Engine API to the planner core:

Placement (:meth:`EnginePool.add`), deterministic, among the members that are up, the least by::

    (no free batch slot, estimated cost of this generation's next segment there, generations owned, index)

* a free slot: the pool counts the generations it placed on each member against the member's ``max_batch``;
  when every member is full the generation still goes to one (its server queues it) rather than failing;
* the cost on member ``m``: the time the generation adds there, summed over every generation on ``m``
  (itself included): all of them wait while ``m`` prefills what its prefix cache lacks of it, and the
  segment's expected tokens make each of ``m``'s decode steps longer for all of them (``m``'s own
  :class:`LatencyEstimator`, below). The expected tokens per placement are a running mean over the segments
  the pool has seen; counting only the newcomer's own time kept a pool of GPU servers on one member until
  it ran 35 generations while its urgent tasks waited behind them (bench/results/pool). What a
  member's cache holds: all of a generation it ran last (a resume goes home unless that member is
  loaded enough to cost more than a re-prefill elsewhere), else the longest prefix shared with the last
  prompt of the same key it served (``extra['robot_type']``, which the core sets; else the first
  :data:`AFFINITY_PREFIX_TOKENS` prompt ids): the shared system prompt is prefilled once per member, not
  once per request. Affinity alone (the first rule of this pool) put every generation of a robot type on one
  member of eight with 256 slots each while seven idled (bench/results/pool); weighing load against the
  prefill it saves spreads a busy pool and keeps a light one on warm caches;
* step time: each member's estimate learns from its own steps (for a streamed member,
  :attr:`EngineInfo.streamed`, the time between two collections over the tokens each generation got) and
  starts from its declared step model (a member with neither samples nor a model is priced as the most
  measured member until it has its own); ``step_time_s`` in :meth:`members` is the measured EWMA.

Latency estimate, per member: each member has its own :class:`LatencyEstimator`, fed from its own steps
(its batch, its duration as above, its prefill tokens), and the scheduler plans with
:class:`PoolLatencyEstimator` (:meth:`EnginePool.latency_estimator`, which
:meth:`LatencyEstimator.for_engine` returns): the time per token of the member placement would put a
generation on, at that member's load. A fast and a slow server behind one merged figure would make a
request on the fast one look late and one on the slow one look early.

Stepping (:meth:`EnginePool.step`): members with work step in turn; a remote member is stepped only when its
server has streamed something (:meth:`Engine.step_ready`), so a member in a long prefill does not hold back
the others' tokens. With none ready the pool waits at most ``step_wait_s`` (polling every ``poll_s``) and
returns an empty step. The merged report's duration is the larger of the pool's wall time and the longest
member-reported (modelled) duration: members run side by side (the core's estimate does not learn from it:
the members' estimators learn from their own steps).

Failover: a member fails when its ``add`` or ``step`` raises anything but a ValueError (a ValueError refuses
that one request, e.g. a context too long), or when it ends a generation with :attr:`FinishReason.ERROR` and
``engine_failed`` (a remote server that died, stopped answering or broke the stream; see remote_engine; an
error of the request itself, such as a 4xx refusal, ends that generation only). The member is marked down and every
generation it held is resubmitted elsewhere from ``prompt_token_ids + output_token_ids`` (the
:class:`EngineRequest` is carried over, with the tokens of its unfinished segment), so the output across a
failover is what one engine would have written; a generation is moved at most ``max_failovers`` times. Where
no member is up it ends with an ERROR event naming the cause; nothing is dropped silently. A new generation
that no member can take makes :meth:`add` raise :class:`NoMemberUp` (the core fails that task explicitly).

Rejoin: a down member is rebuilt with its ``rebuild`` callable (the factory with its config: the same
start-up checks as at first) after a backoff that doubles from ``probe_backoff_s`` up to
``probe_max_backoff_s``; a rebuilt member that serves another model than the pool stays down. Probes run in a
background thread (a hung server must not stall the planner loop) unless ``background_probes`` is off
(deterministic tests).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from timelyllm_ros.domain.tokens import common_prefix_len
from timelyllm_ros.engines.base import (
    Engine,
    EngineInfo,
    EngineRequest,
    EngineStats,
    FinishReason,
    RawTokens,
    SegmentEvent,
    StepReport,
)
from timelyllm_ros.engines.latency import LatencyEstimator

log = logging.getLogger(__name__)

AFFINITY_PREFIX_TOKENS = 64  # prompt ids that name a shared prefix when a request has no robot type
STEP_EWMA = 0.2  # weight of a new sample in a member's measured step time
MEMORY_LEN = 4096  # generations / affinity keys whose last member is remembered (a long-running node)
PREFIX_MEMORY_LEN = 256  # (affinity key, member) pairs whose last prompt is kept to price cache hits
SEGMENT_TOKENS_PRIOR = 16.0  # expected tokens per placement until the pool has seen segments (a skill or two)
# Tokenized by every member at construction: their tokenizers must agree (plain text, MiniSpec, unicode).
TOKENIZER_PROBE = "Scene: [cat x:0.5] Task: find the cat. Plan: ?s('cat')==True{g('cat');tc(90);} Grüße 東京"


class PoolMismatchError(ValueError):
    """The members do not serve the same model (model, context, tokenizer, capabilities)."""


class NoMemberUp(RuntimeError):
    """No member of the pool is up to take a generation."""


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
class PoolStats(EngineStats):
    """:class:`EngineStats` summed over the members that are up, plus each member."""

    members_up: int = 0
    failovers: int = 0  # generations moved to another member
    failed_unplaced: int = 0  # generations ended with an error because no member could take them
    members: tuple[MemberStats, ...] = ()


@dataclass
class _Member:
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


def _agree(members: Sequence[Engine], names: Sequence[str], probe_tokens: list[int]) -> EngineInfo:
    """The pool's info; PoolMismatchError naming the members that serve something else than the first."""
    first = members[0].info
    bad = [f"{names[i]} ({problem})" for i, m in enumerate(members[1:], 1)
           if (problem := _mismatch(first, m, names[0], probe_tokens))]
    if bad:
        raise PoolMismatchError(f"engine pool: every member must serve the same model; {', '.join(bad)}")
    return EngineInfo(name="pool", model=first.model, max_model_len=first.max_model_len,
                      needs_plan_text=first.needs_plan_text, supports_prefix_cache=first.supports_prefix_cache,
                      step_model=first.step_model, kv_block_tokens=first.kv_block_tokens,
                      token_grammar=all(m.info.token_grammar for m in members))


def _mismatch(ref: EngineInfo, m: Engine, ref_name: str, probe_tokens: list[int]) -> str:
    """What ``m`` serves differently from ``ref`` ("" if nothing); ``probe_tokens``: the reference's tokenization
    of :data:`TOKENIZER_PROBE`."""
    info = m.info
    for what in ("model", "max_model_len", "needs_plan_text", "supports_prefix_cache"):
        if getattr(info, what) != getattr(ref, what):
            return f"{what}={getattr(info, what)!r}, {ref_name} has {getattr(ref, what)!r}"
    if m.tokenize(TOKENIZER_PROBE) != probe_tokens:
        return f"its tokenizer disagrees with {ref_name}'s on {TOKENIZER_PROBE!r}"
    return ""


def _remember(d: OrderedDict, key: Any, value: Any, bound: int = MEMORY_LEN) -> None:
    d[key] = value
    d.move_to_end(key)
    while len(d) > bound:
        d.popitem(last=False)


def _detach(m: _Member, gid: str) -> list[int]:
    """Take ``gid`` off a failed member: the tokens of its unfinished segment, if the member can still say."""
    try:
        seg = m.engine.segment_so_far(gid)
    except Exception:  # noqa: BLE001 - a broken member: the segment restarts at the checker's state
        seg = []
    with contextlib.suppress(Exception):
        m.engine.abort(gid)
    return seg


class _Rejoins:
    """The pool's rejoin (module doc): each member that is down is rebuilt after its backoff, in a background
    thread unless ``background`` is off; one rebuilt in the background joins at the next :meth:`run`."""

    def __init__(self, pool: EnginePool, probe_tokens: list[int], clock: Callable[[], float],
                 background: bool) -> None:
        self.pool, self.probe_tokens, self.clock = pool, probe_tokens, clock
        self.executor = concurrent.futures.ThreadPoolExecutor(1, "engine-pool-probe") if background else None

    def run(self, members: Sequence[_Member]) -> None:
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

    def rebuild(self, m: _Member) -> Engine:
        """Probe thread: close the failed engine, build it again, check it serves the pool's model."""
        with contextlib.suppress(Exception):
            m.engine.close()
        assert m.rebuild is not None
        eng = m.rebuild()
        problem = _mismatch(self.pool.info, eng, "the pool", self.probe_tokens)
        if problem:
            with contextlib.suppress(Exception):
                eng.close()
            raise PoolMismatchError(f"it came back serving something else: {problem}")
        return eng

    def probed(self, m: _Member, f: concurrent.futures.Future) -> None:
        m.probe = None
        try:
            eng = f.result()
        except Exception as e:  # noqa: BLE001
            m.down_reason = f"{m.down_reason.split(' [rejoin failed')[0]} [rejoin failed: {type(e).__name__}: {e}]"
            m.backoff_s = min(m.backoff_s * 2, self.pool.probe_max_backoff_s)
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


class EnginePool(Engine):
    """:class:`Engine` over several member engines; see the module docstring for placement and failover.

    ``names``: one per member, for errors and stats (default ``member i``). ``rebuild``: per member, how to
    build it again after a failure (None: a failed member stays down). ``clock``: monotonic seconds (backoff).
    """

    def __init__(self, members: Sequence[Engine], *, names: Sequence[str] | None = None,
                 rebuild: Sequence[Callable[[], Engine] | None] | None = None, step_wait_s: float = 0.05,
                 poll_s: float = 0.002, probe_backoff_s: float = 1.0, probe_max_backoff_s: float = 30.0,
                 max_failovers: int | None = None, background_probes: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        if not members:
            raise ValueError("an engine pool needs at least one member")
        names = list(names) if names is not None else [f"member {i}" for i in range(len(members))]
        rebuild = list(rebuild) if rebuild is not None else [None] * len(members)
        if len(names) != len(members) or len(rebuild) != len(members):
            raise ValueError("names and rebuild must have one entry per member")
        for i, m in enumerate(members):
            if isinstance(m, EnginePool):
                raise ValueError(f"{names[i]}: a pool cannot be a member of a pool")
        if not (step_wait_s > 0 and poll_s > 0 and 0 < probe_backoff_s <= probe_max_backoff_s):
            raise ValueError("step_wait_s, poll_s > 0 and 0 < probe_backoff_s <= probe_max_backoff_s")
        probe_tokens = members[0].tokenize(TOKENIZER_PROBE)
        self.info = _agree(members, names, probe_tokens)
        self.tokenizer: Any = getattr(members[0], "tokenizer", None)  # what PromptRenderer builds prompts with
        self.step_wait_s, self.poll_s = float(step_wait_s), float(poll_s)
        self.probe_backoff_s, self.probe_max_backoff_s = float(probe_backoff_s), float(probe_max_backoff_s)
        self.max_failovers = len(members) if max_failovers is None else int(max_failovers)
        self._clock = clock
        self._members = [
            _Member(i, names[i], m, rebuild[i], max(1, int(m.stats().max_batch)),
                    m.info.step_model.decode_s if m.info.step_model else None, LatencyEstimator.for_engine(m))
            for i, m in enumerate(members)]
        model = self.info.step_model
        self._estimate = (PoolLatencyEstimator.from_step_model(model, pool=self) if model is not None
                          else PoolLatencyEstimator(pool=self))
        self._owner: dict[str, int] = {}  # gen_id -> member running it
        self._reqs: dict[str, EngineRequest] = {}
        self._last: OrderedDict[str, int] = OrderedDict()  # gen_id -> member it last ran on (suspended too)
        # (affinity key, member) -> the last prompt of that key the member prefilled (what its cache shares)
        self._prompts: OrderedDict[tuple[Any, int], list[int]] = OrderedDict()
        self._placed_tokens: dict[str, int] = {}  # gen_id -> tokens generated since it was placed
        self.segment_tokens = SEGMENT_TOKENS_PRIOR  # running mean of tokens per placement
        self._moves: dict[str, int] = {}  # gen_id -> failovers so far
        self._pending: list[SegmentEvent] = []  # ERROR finishes of generations no member could take
        self.failovers = 0
        self.failed_unplaced = 0
        self._rejoins = _Rejoins(self, probe_tokens, clock, background_probes)

    # -- the Engine API ------------------------------------------------------------------------------------
    def add(self, req: EngineRequest, segment_so_far: Sequence[int] = ()) -> None:
        if req.gen_id in self._owner:
            raise ValueError(f"gen_id {req.gen_id!r} is already running in the engine pool")
        self._rejoins.run(self._members)
        self._place(req, list(segment_so_far))

    def abort(self, gen_id: str) -> None:
        last = self._last.pop(gen_id, None)
        self._moves.pop(gen_id, None)
        self._placed_tokens.pop(gen_id, None)
        self._pending = [e for e in self._pending if e.gen_id != gen_id]
        i = self._owner.pop(gen_id, None)
        self._reqs.pop(gen_id, None)
        if i is None:  # suspended: the member it last ran on may still keep it (Engine.suspended_ids)
            if last is not None and self._members[last].up:
                self._members[last].engine.abort(gen_id)
            return
        m = self._members[i]
        m.owned.discard(gen_id)
        if m.up:
            m.engine.abort(gen_id)

    def running_ids(self) -> set[str]:
        return set(self._owner) | {e.gen_id for e in self._pending}

    def suspended_ids(self) -> set[str]:
        return set().union(*(m.engine.suspended_ids() for m in self.members_up()))

    def has_work(self) -> bool:
        return bool(self._owner or self._pending)

    def learn(self) -> None:
        """Feed each member's estimator the steps it ran since the last call. The core calls this through
        :meth:`PoolLatencyEstimator.observe` when it handles a step, as it feeds a lone engine's estimator then:
        an estimate that moved while the step was still being handled would make a pool of one plan
        differently from its member alone. A step also learns whatever the core did not (bounded)."""
        for m in self._members:
            for obs in m.unlearned:
                m.est.observe(*obs)
            m.unlearned.clear()

    def step(self) -> StepReport:
        self.learn()
        t0 = time.perf_counter()
        self._rejoins.run(self._members)
        events, self._pending = self._pending, []
        batch = new = prefill = 0
        longest = 0.0
        busy = [m for m in self._members if m.up and m.owned]
        ready = self._wait_ready(busy, t0)
        for m in ready:
            if not m.up:  # went down while another member's generations moved onto it
                continue
            rep = self._step_member(m)
            if rep is None:
                continue
            batch += rep.batch_size
            new += rep.new_tokens
            prefill += rep.prefill_tokens
            longest = max(longest, rep.duration_s)
            events.extend(self._route(m, rep.events))
        events.extend(self._pending)  # generations that failed over to nowhere in this step
        self._pending = []
        wall = time.perf_counter() - t0
        return StepReport(duration_s=max(wall, longest) if batch else wall, batch_size=batch, new_tokens=new,
                          events=events, prefill_tokens=prefill)

    def _wait_ready(self, busy: list[_Member], t0: float) -> list[_Member]:
        end = t0 + self.step_wait_s
        while True:
            ready = [m for m in busy if self._ready(m)]
            if ready or not busy or time.perf_counter() >= end:
                return ready
            time.sleep(self.poll_s)

    def _ready(self, m: _Member) -> bool:
        try:
            return m.engine.step_ready()
        except Exception as e:  # noqa: BLE001 - a member that cannot say is a failed member
            self._down(m, f"step_ready raised {type(e).__name__}: {e}")
            return False

    def _step_member(self, m: _Member) -> StepReport | None:
        try:
            rep = m.engine.step()
        except Exception as e:  # noqa: BLE001 - any failure of one member is the pool's to handle
            self._down(m, f"its step raised {type(e).__name__}: {e}")
            return None
        now = time.perf_counter()
        if rep.batch_size and rep.new_tokens:
            # A streamed (remote) member's step only collects what its server sent: the time since its
            # previous collection, over the tokens each generation got, is the server's time per token.
            # An in-process member's step is the step (modelled for a simulated one: deterministic).
            per_gen = max(1.0, rep.new_tokens / rep.batch_size)
            if not m.engine.info.streamed:
                sample = rep.duration_s / per_gen
            elif m.last_collect is not None:
                sample = max(rep.duration_s, now - m.last_collect) / per_gen
                # per token, so no prefill cost can be told apart in it: only decode is learned
                m.unlearned.append((rep.batch_size, sample, 0))
            else:  # the first collection after idle: its own wait says nothing of the server's pace
                sample = None
            if sample is not None:
                m.step_s = sample if m.step_s is None else m.step_s + STEP_EWMA * (sample - m.step_s)
        if not m.engine.info.streamed:  # what the core would learn from this engine alone (prefill steps too)
            m.unlearned.append((rep.batch_size, rep.duration_s, rep.prefill_tokens))
        m.last_collect = now if m.engine.has_work() else None
        return rep

    def _route(self, m: _Member, events: list[SegmentEvent]) -> list[SegmentEvent]:
        """The member's events as the core sees them: errors become failovers, the rest pass through."""
        out: list[SegmentEvent] = []
        failed: dict[str, list[int]] = {}
        cause = ""
        for ev in events:
            if ev.gen_id not in m.owned:
                continue  # aborted meanwhile
            if ev.engine_failed:
                failed[ev.gen_id] = list(ev.token_ids)
                cause = cause or ev.error
                continue
            out.append(ev)
            self._placed_tokens[ev.gen_id] = self._placed_tokens.get(ev.gen_id, 0) + len(ev.token_ids)
            if ev.final or ev.suspended:
                n = self._placed_tokens.pop(ev.gen_id)
                self.segment_tokens += STEP_EWMA * (max(1, n) - self.segment_tokens)
                m.owned.discard(ev.gen_id)
                self._owner.pop(ev.gen_id, None)
                req = self._reqs.pop(ev.gen_id, None)
                if ev.final:
                    self._last.pop(ev.gen_id, None)
                    self._moves.pop(ev.gen_id, None)
                elif req is not None:
                    _remember(self._last, ev.gen_id, m.index)
        if failed:
            self._down(m, cause or "it ended a generation with an error", failed)
        return out

    # -- placement -------------------------------------------------------------------------------------------
    @staticmethod
    def affinity_key(req: EngineRequest) -> Any:
        """What shares a prompt prefix: the robot type (one system prompt each), else the first prompt ids."""
        rt = req.extra.get("robot_type")
        return ("robot_type", rt) if rt else ("prefix", tuple(req.prompt_token_ids[:AFFINITY_PREFIX_TOKENS]))

    def placement_order(self, req: EngineRequest, exclude: frozenset[int] = frozenset()) -> list[int]:
        """The members that are up, best first for ``req`` (the rule of the module docstring)."""
        key, last = self.affinity_key(req), self._last.get(req.gen_id)
        context = len(req.prompt_token_ids) + len(req.output_token_ids)

        def uncached(m: _Member) -> int:
            if m.index == last:
                return 0
            seen = self._prompts.get((key, m.index))
            return context - (common_prefix_len(seen, req.prompt_token_ids) if seen else 0)

        return [m.index for m in sorted((m for m in self._members if m.up and m.index not in exclude),
                                        key=lambda m: self.placement_rank(m, len(m.owned), uncached(m)))]

    def placement_rank(self, m: _Member, load: int, uncached_tokens: int = 0) -> tuple:
        """Placement's key for ``m`` carrying ``load`` generations (least first), for a generation of which
        ``uncached_tokens`` are not in ``m``'s prefix cache."""
        est = self.pricing(m)
        # the time it adds on that member, to every generation there: all wait for its prefill, and each
        # decode step of the segment's expected length gets longer for all of them
        decode = (load + 1) * est.step_time(load + 1) - load * est.step_time(load)
        cost = (load + 1) * est.prefill_time(uncached_tokens) + self.segment_tokens * decode
        return (load >= m.max_batch, cost, load, m.index)

    def pricing(self, m: _Member) -> LatencyEstimator:
        """The estimate ``m`` is priced with: its own once it has measured a step or declares a step model;
        before that the most measured member's (the same model served elsewhere), not the default prior, whose
        GPU figures would make an unmeasured CPU server look ten times faster than a measured one."""
        if m.est.decode_samples or m.engine.info.step_model is not None:
            return m.est
        best = max(self.members_up(), key=lambda x: x.est.decode_samples, default=m)
        return best.est if best.est.decode_samples else m.est

    def _place(self, req: EngineRequest, seg: list[int], exclude: frozenset[int] = frozenset()) -> None:
        """Submit ``req`` to the best member that takes it; NoMemberUp if none does. A member that fails on
        ``add`` is marked down (its other generations move too) and the next one is tried."""
        tried = set(exclude)
        prev = self._last.get(req.gen_id)
        while True:
            order = self.placement_order(req, frozenset(tried))
            if not order:
                raise NoMemberUp(f"{req.gen_id}: no member of the engine pool is up to take it ({self.why_down()})")
            m = self._members[order[0]]
            try:
                m.engine.add(req, seg)
            except ValueError:
                with contextlib.suppress(Exception):
                    m.engine.abort(req.gen_id)
                raise  # this request's problem (e.g. its context), not the member's
            except Exception as e:  # noqa: BLE001
                with contextlib.suppress(Exception):
                    m.engine.abort(req.gen_id)
                self._down(m, f"it refused a generation: {type(e).__name__}: {e}")
                tried.add(m.index)
                continue
            if prev is not None and prev != m.index and self._members[prev].up:
                with contextlib.suppress(Exception):  # resumed elsewhere: what the old member kept is released
                    self._members[prev].engine.abort(req.gen_id)
            m.owned.add(req.gen_id)
            self._owner[req.gen_id] = m.index
            self._reqs[req.gen_id] = req
            _remember(self._last, req.gen_id, m.index)
            key = self.affinity_key(req)
            _remember(self._prompts, (key, m.index), req.prompt_token_ids, PREFIX_MEMORY_LEN)
            return

    def why_down(self) -> str:
        """Each member and why it is down ("up" for one serving): what a generation no member takes is told."""
        return "; ".join(f"{m.name}: {m.down_reason or 'up'}" for m in self._members)

    # -- failover -------------------------------------------------------------------------------------------
    def _down(self, m: _Member, reason: str, ended: dict[str, list[int]] | None = None) -> None:
        """Mark ``m`` down and move every generation it held. ``ended``: those the member already ended with
        an error, with the tokens of their unfinished segment."""
        ended = ended or {}
        if m.up:
            log.warning("engine pool: %s is down: %s", m.name, reason)
            m.up, m.down_reason = False, reason
            m.backoff_s = self.probe_backoff_s
            m.next_probe = self._clock() + m.backoff_s
            m.last_collect = None
        moved = []
        for gid in sorted(m.owned):  # sorted: a deterministic order of resubmission
            seg = ended[gid] if gid in ended else _detach(m, gid)
            moved.append((gid, seg))
        m.owned.clear()
        for gid, seg in moved:
            self._owner.pop(gid, None)
            req = self._reqs.pop(gid)
            self._last.pop(gid, None)
            self._failover(req, seg, m, reason)

    def mark_down(self, index: int, reason: str) -> None:
        """Take member ``index`` out of service as a failure would (its generations move to the others; it is
        rebuilt after the backoff where it can be): for an operator, and tests of what follows a failure."""
        self._down(self._members[index], reason)

    def _failover(self, req: EngineRequest, seg: list[int], src: _Member, reason: str) -> None:
        n = self._moves.get(req.gen_id, 0) + 1
        self._moves[req.gen_id] = n
        src.failovers += 1
        if n > self.max_failovers:
            self._fail(req, seg, f"{src.name} failed ({reason}) and the generation was moved {n - 1} times "
                                 f"already (max_failovers={self.max_failovers})")
            return
        try:
            self._place(req, seg, frozenset({src.index}))
        except NoMemberUp:
            self._fail(req, seg, f"{src.name} failed ({reason}) and no other member of the engine pool is up "
                                 f"to resume it ({self.why_down()})")
        except ValueError as e:
            self._fail(req, seg, f"{src.name} failed ({reason}); moving it was refused: {e}")
        else:
            self.failovers += 1
            log.warning("engine pool: %s moved from %s to %s after %d tokens", req.gen_id, src.name,
                        self._members[self._owner[req.gen_id]].name, len(req.output_token_ids))

    def _fail(self, req: EngineRequest, seg: list[int], error: str) -> None:
        self.failed_unplaced += 1
        self._moves.pop(req.gen_id, None)
        self._placed_tokens.pop(req.gen_id, None)
        log.error("engine pool: %s ends: %s", req.gen_id, error)
        self._pending.append(SegmentEvent(req.gen_id, req.stop_checker.pending_text, seg, FinishReason.ERROR,
                                          suspended=False, error=error))

    # -- introspection ---------------------------------------------------------------------------------------
    def members(self) -> list[MemberStats]:
        out = []
        for m in self._members:
            st = None
            if m.up:
                with contextlib.suppress(Exception):
                    st = m.engine.stats()
            out.append(MemberStats(m.index, m.name, m.engine.info.name, m.up, m.down_reason, len(m.owned),
                                   m.max_batch, m.step_s, m.failovers, m.rejoins, st,
                                   self.pricing(m).step_time(len(m.owned)) if m.up else None))
        return out

    def latency_estimator(self) -> PoolLatencyEstimator:
        return self._estimate

    def member_estimator(self, index: int) -> LatencyEstimator:
        """Member ``index``'s own step-time estimate (learned from its steps in this pool)."""
        return self._members[index].est

    def members_up(self) -> list[_Member]:
        """The members serving now (placement, pricing and the pool's latency estimate choose among these)."""
        return [m for m in self._members if m.up]

    def warm_up_targets(self) -> list[Engine]:
        """Every member that is up: each has its own prefix cache to fill (placement would warm one)."""
        return [m.engine for m in self._members if m.up]

    def member_engine(self, index: int) -> Engine:
        return self._members[index].engine

    def rejoin_probe(self, index: int) -> concurrent.futures.Future | None:
        """The background rebuild of member ``index`` in flight, if any: tests wait on it instead of sleeping."""
        return self._members[index].probe

    def stats(self) -> PoolStats:
        ms = self.members()
        up = [s.stats for s in ms if s.stats is not None]
        steps = [s.step_time_s for s in ms if s.up and s.step_time_s is not None]
        return PoolStats(
            running=sum(s.running for s in up), waiting=sum(s.waiting for s in up),
            # the mean: admission asks whether one more fits, and placement spreads over the members
            kv_cache_usage=sum(s.kv_cache_usage for s in up) / len(up) if up else 1.0,
            tokens_per_s=sum(s.tokens_per_s for s in up), step_time_s=sum(steps) / len(steps) if steps else 0.0,
            max_batch=sum(s.max_batch for s in ms if s.up), members_up=len(up), failovers=self.failovers,
            failed_unplaced=self.failed_unplaced, members=tuple(ms))

    def _any_up(self) -> Engine:
        return next((m.engine for m in self._members if m.up), self._members[0].engine)

    def tokenize(self, text: str) -> list[int]:
        return self._any_up().tokenize(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._any_up().decode(ids)  # type: ignore[attr-defined]

    def reset_prefix_cache(self) -> bool:
        done = False
        for m in self._members:
            if m.up:
                done = m.engine.reset_prefix_cache() or done
        return done

    def close(self) -> None:
        self._rejoins.close()
        for m in self._members:
            if m.probe is not None and m.probe.done() and m.probe.exception() is None:
                with contextlib.suppress(Exception):
                    m.probe.result().close()
            with contextlib.suppress(Exception):
                m.engine.close()

    # -- unused: the pool overrides the public methods; its members segment their own output ------------------
    def _backend_add(self, req: EngineRequest) -> None:
        raise AssertionError("EnginePool places requests on its members")

    def _backend_step(self) -> tuple[Sequence[RawTokens], float | None, int]:
        raise AssertionError("EnginePool steps its members")

    def _backend_suspend(self, gen_id: str) -> None:
        raise AssertionError("EnginePool's members suspend their own generations")

    def _backend_abort(self, gen_id: str) -> None:
        raise AssertionError("EnginePool aborts on its members")


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

    def __init__(self, *, pool: EnginePool, **kw: Any) -> None:
        super().__init__(**kw)  # the fallback: the pool's declared model (see EnginePool.__init__)
        self._pool = pool

    def observe(self, batch: int, duration_s: float, prefill_tokens: int = 0) -> None:
        """The merged step itself is not learned (it mixes members of different speeds): each member learns
        its own steps of it now (:meth:`EnginePool.learn`)."""
        self._pool.learn()

    def _placed(self, batch: int) -> tuple[_Member, int] | None:
        """The member the ``batch``-th generation would be placed on and its load there; None: none is up."""
        up = self._pool.members_up()
        if not up:
            return None
        rank = self._pool.placement_rank
        load = dict.fromkeys((m.index for m in up), 0)
        for _ in range(max(1, batch)):
            m = min(up, key=lambda m: rank(m, load[m.index]))
            load[m.index] += 1
        return m, load[m.index]

    def _next(self) -> _Member | None:
        """The member a new generation would be placed on now (its current load, no affinity)."""
        up = self._pool.members_up()
        return min(up, key=lambda m: self._pool.placement_rank(m, len(m.owned))) if up else None

    def step_time(self, batch: int) -> float:
        placed = self._placed(batch)
        if placed is None:
            return super().step_time(batch)
        m, load = placed
        return self._pool.pricing(m).step_time(load)

    def prefill_time(self, tokens: int) -> float:
        m = self._next()
        return self._pool.pricing(m).prefill_time(tokens) if m is not None else super().prefill_time(tokens)

    def prefill_join_time(self, tokens: int) -> float:
        m = self._next()
        return self._pool.pricing(m).prefill_join_time(tokens) if m is not None else super().prefill_join_time(tokens)

    def describe(self) -> dict[str, Any]:
        """The estimate of the member a new generation would go to now; samples summed over the members."""
        m = self._next()
        if m is None:
            return {**super().describe(), "seed": f"{self.source} (no pool member up)"}
        d = self._pool.pricing(m).describe()
        ests = [x.est.describe() for x in self._pool.members_up()]
        d["seed"] = f"per pool member ({m.name}: {d['seed']})"
        d["decode_samples"] = sum(e["decode_samples"] for e in ests)
        d["prefill_samples"] = sum(e["prefill_samples"] for e in ests)
        return d

    def for_replaced_engine(self, engine: Engine) -> LatencyEstimator:
        # this pool's members are gone: the new engine's own estimate, or one seeded from its model
        return LatencyEstimator.for_engine(engine)
