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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from timelyllm_ros.engines.base import (
    Engine,
    EngineRequest,
    EngineStats,
    FinishReason,
    RawTokens,
    SegmentEvent,
    StepReport,
)
from timelyllm_ros.engines.latency import LatencyEstimator
from timelyllm_ros.engines.pool_members import (
    TOKENIZER_PROBE,
    MemberStats,
    PoolMember,
    PoolMismatchError,
    Rejoins,
    Roster,
    agree,
)
from timelyllm_ros.engines.pool_placement import Placement, PoolLatencyEstimator

log = logging.getLogger(__name__)

# What the pool's users import from here, whichever module of the pool defines it.
__all__ = ["EnginePool", "MemberStats", "NoMemberUp", "PoolLatencyEstimator", "PoolMismatchError", "PoolStats"]


class NoMemberUp(RuntimeError):
    """No member of the pool is up to take a generation."""


@dataclass
class PoolStats(EngineStats):
    """:class:`EngineStats` summed over the members that are up, plus each member."""

    members_up: int = 0
    failovers: int = 0  # generations moved to another member
    failed_unplaced: int = 0  # generations ended with an error because no member could take them
    members: tuple[MemberStats, ...] = ()


class EnginePool(Engine):
    """:class:`Engine` over several member engines; see the module docstring for placement and failover.

    ``names``: one per member, for errors and stats (default ``member i``). ``rebuild``: per member, how to
    build it again after a failure (None: a failed member stays down). ``clock``: monotonic seconds (backoff).
    The members and their rejoins are its :class:`Roster`'s, where it places them its :class:`Placement`'s.
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
        self.info = agree(members, names, probe_tokens)
        self.tokenizer: Any = getattr(members[0], "tokenizer", None)  # what PromptRenderer builds prompts with
        self.step_wait_s, self.poll_s = float(step_wait_s), float(poll_s)
        self.probe_backoff_s, self.probe_max_backoff_s = float(probe_backoff_s), float(probe_max_backoff_s)
        self.max_failovers = len(members) if max_failovers is None else int(max_failovers)
        self._clock = clock
        self._roster = Roster(
            [PoolMember(i, names[i], m, rebuild[i], max(1, int(m.stats().max_batch)),
                        m.info.step_model.decode_s if m.info.step_model else None, LatencyEstimator.for_engine(m))
             for i, m in enumerate(members)],
            Rejoins(self.info, probe_tokens, clock, background_probes, self.probe_max_backoff_s))
        self._placement = Placement(self._roster)
        model = self.info.step_model
        self._estimate = (PoolLatencyEstimator.from_step_model(model, placement=self._placement)
                          if model is not None else PoolLatencyEstimator(placement=self._placement))
        self._owner: dict[str, int] = {}  # gen_id -> member running it
        self._reqs: dict[str, EngineRequest] = {}
        self._moves: dict[str, int] = {}  # gen_id -> failovers so far
        self._pending: list[SegmentEvent] = []  # ERROR finishes of generations no member could take
        self.failovers = 0
        self.failed_unplaced = 0

    # -- the Engine API ------------------------------------------------------------------------------------
    def add(self, req: EngineRequest, segment_so_far: Sequence[int] = ()) -> None:
        if req.gen_id in self._owner:
            raise ValueError(f"gen_id {req.gen_id!r} is already running in the engine pool")
        self._roster.rejoin()
        self._place(req, list(segment_so_far))

    def abort(self, gen_id: str) -> None:
        last = self._placement.forget_home(gen_id)
        self._moves.pop(gen_id, None)
        self._placement.forget_tokens(gen_id)
        self._pending = [e for e in self._pending if e.gen_id != gen_id]
        i = self._owner.pop(gen_id, None)
        self._reqs.pop(gen_id, None)
        if i is None:  # suspended: the member it last ran on may still keep it (Engine.suspended_ids)
            if last is not None and self._roster[last].up:
                self._roster[last].engine.abort(gen_id)
            return
        m = self._roster[i]
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
        self._roster.learn()

    def step(self) -> StepReport:
        self.learn()
        t0 = time.perf_counter()
        self._roster.rejoin()
        events, self._pending = self._pending, []
        batch = new = prefill = 0
        longest = 0.0
        busy = [m for m in self._roster.members if m.up and m.owned]
        ready = self._roster.wait_ready(busy, t0 + self.step_wait_s, self.poll_s, self.mark_down)
        for m in ready:
            if not m.up:  # went down while another member's generations moved onto it
                continue
            try:
                rep = m.engine.step()
            except Exception as e:  # noqa: BLE001 - any failure of one member is the pool's to handle
                self.mark_down(m.index, f"its step raised {type(e).__name__}: {e}")
                continue
            m.record_step(rep)
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

    def _route(self, m: PoolMember, events: list[SegmentEvent]) -> list[SegmentEvent]:
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
            self._placement.counted(m, ev)
            if ev.final or ev.suspended:
                m.owned.discard(ev.gen_id)
                self._owner.pop(ev.gen_id, None)
                req = self._reqs.pop(ev.gen_id, None)
                if ev.final:
                    self._placement.forget_home(ev.gen_id)
                    self._moves.pop(ev.gen_id, None)
                elif req is not None:
                    self._placement.suspended_on(ev.gen_id, m.index)
        if failed:
            self.mark_down(m.index, cause or "it ended a generation with an error", failed)
        return out

    # -- placement -------------------------------------------------------------------------------------------
    def _place(self, req: EngineRequest, seg: list[int], exclude: frozenset[int] = frozenset()) -> None:
        """Submit ``req`` to the best member that takes it; NoMemberUp if none does. A member that fails on
        ``add`` is marked down (its other generations move too) and the next one is tried."""
        tried = set(exclude)
        prev = self._placement.last(req.gen_id)
        while True:
            order = self._placement.order(req, frozenset(tried))
            if not order:
                raise NoMemberUp(f"{req.gen_id}: no member of the engine pool is up to take it ({self.why_down()})")
            m = self._roster[order[0]]
            try:
                m.engine.add(req, seg)
            except ValueError:
                with contextlib.suppress(Exception):
                    m.engine.abort(req.gen_id)
                raise  # this request's problem (e.g. its context), not the member's
            except Exception as e:  # noqa: BLE001
                with contextlib.suppress(Exception):
                    m.engine.abort(req.gen_id)
                self.mark_down(m.index, f"it refused a generation: {type(e).__name__}: {e}")
                tried.add(m.index)
                continue
            if prev is not None and prev != m.index and self._roster[prev].up:
                with contextlib.suppress(Exception):  # resumed elsewhere: what the old member kept is released
                    self._roster[prev].engine.abort(req.gen_id)
            m.owned.add(req.gen_id)
            self._owner[req.gen_id] = m.index
            self._reqs[req.gen_id] = req
            self._placement.placed(req, m.index)
            return

    def why_down(self) -> str:
        """Each member and why it is down ("up" for one serving): what a generation no member takes is told."""
        return self._roster.why_down()

    # -- failover -------------------------------------------------------------------------------------------
    def mark_down(self, index: int, reason: str, ended: dict[str, list[int]] | None = None) -> None:
        """Take member ``index`` out of service and move every generation it held to the others; it is rebuilt
        after the backoff where it can be. The pool calls this on a failure; an operator, and tests of what
        follows a failure, too. ``ended``: the generations the member already ended with an error, with the
        tokens of their unfinished segment."""
        m = self._roster[index]
        ended = ended or {}
        if m.up:
            log.warning("engine pool: %s is down: %s", m.name, reason)
            m.up, m.down_reason = False, reason
            m.backoff_s = self.probe_backoff_s
            m.next_probe = self._clock() + m.backoff_s
            m.last_collect = None
        moved = []
        for gid in sorted(m.owned):  # sorted: a deterministic order of resubmission
            seg = ended[gid] if gid in ended else m.detach(gid)
            moved.append((gid, seg))
        m.owned.clear()
        for gid, seg in moved:
            self._owner.pop(gid, None)
            req = self._reqs.pop(gid)
            self._placement.forget_home(gid)
            self._failover(req, seg, m, reason)

    def _failover(self, req: EngineRequest, seg: list[int], src: PoolMember, reason: str) -> None:
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
                        self._roster[self._owner[req.gen_id]].name, len(req.output_token_ids))

    def _fail(self, req: EngineRequest, seg: list[int], error: str) -> None:
        self.failed_unplaced += 1
        self._moves.pop(req.gen_id, None)
        self._placement.forget_tokens(req.gen_id)
        log.error("engine pool: %s ends: %s", req.gen_id, error)
        self._pending.append(SegmentEvent(req.gen_id, req.stop_checker.pending_text, seg, FinishReason.ERROR,
                                          suspended=False, error=error))

    # -- introspection ---------------------------------------------------------------------------------------
    def members(self) -> list[MemberStats]:
        return [m.describe(self._placement.pricing(m) if m.up else m.est) for m in self._roster.members]

    def latency_estimator(self) -> PoolLatencyEstimator:
        return self._estimate

    def member_estimator(self, index: int) -> LatencyEstimator:
        """Member ``index``'s own step-time estimate (learned from its steps in this pool)."""
        return self._roster[index].est

    def members_up(self) -> list[PoolMember]:
        """The members serving now (placement, pricing and the pool's latency estimate choose among these)."""
        return self._roster.up()

    def warm_up_targets(self) -> list[Engine]:
        """Every member that is up: each has its own prefix cache to fill (placement would warm one)."""
        return [m.engine for m in self._roster.members if m.up]

    def member_engine(self, index: int) -> Engine:
        return self._roster[index].engine

    def rejoin_probe(self, index: int) -> concurrent.futures.Future | None:
        """The background rebuild of member ``index`` in flight, if any: tests wait on it instead of sleeping."""
        return self._roster[index].probe

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

    def tokenize(self, text: str) -> list[int]:
        return self._roster.any_up().tokenize(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._roster.any_up().decode(ids)  # type: ignore[attr-defined]

    def reset_prefix_cache(self) -> bool:
        done = False
        for m in self._roster.members:
            if m.up:
                done = m.engine.reset_prefix_cache() or done
        return done

    def close(self) -> None:
        self._roster.close()

    # -- unused: the pool overrides the public methods; its members segment their own output ------------------
    def _backend_add(self, req: EngineRequest) -> None:
        raise AssertionError("EnginePool places requests on its members")

    def _backend_step(self) -> tuple[Sequence[RawTokens], float | None, int]:
        raise AssertionError("EnginePool steps its members")

    def _backend_suspend(self, gen_id: str) -> None:
        raise AssertionError("EnginePool's members suspend their own generations")

    def _backend_abort(self, gen_id: str) -> None:
        raise AssertionError("EnginePool aborts on its members")
