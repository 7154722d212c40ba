"""Overload: shedding first segments that cannot earn, and degrading plans to their mandatory part.

Both judge a segment by its *best case* given the work ahead of it, so only a task that cannot earn even then
is shed, and only a plan whose rest is late is cut. The best case is learned from what the engine and the
robots have done: the fewest tokens a segment of each kind has taken, the largest prefix-cache hit
(:class:`~timelyllm_ros.planner.prefill.PrefillModel`) and the engine's chunked-prefill queue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from timelyllm_ros.domain.types import DEGRADED_PREFIX
from timelyllm_ros.engines.latency import LatencyEstimator
from timelyllm_ros.planner.generation import Generation
from timelyllm_ros.planner.policies import Policy
from timelyllm_ros.planner.prefill import PrefillModel

Ender = Callable[[Generation, str], None]  # end this generation with this reason


def drain(queue: list[list[Any]], tokens: int) -> None:
    """Take ``tokens`` of prefill off a first-come-first-served queue of [id, tokens left, ...] entries (a chunked
    prefill step)."""
    for e in queue:
        if tokens <= 0:
            return
        take = min(tokens, e[1])
        e[1] -= take
        tokens -= take


class Overload:
    """Best-case bookkeeping and the shedding and degrading decisions built on it. ``comm_s``: one network hop.
    The caller holds the core's lock and applies what is decided through the ``end`` callbacks."""

    def __init__(self, prefill: PrefillModel, comm_s: float) -> None:
        self.prefill, self.comm_s = prefill, comm_s
        # (robot type, first segment?) -> the fewest tokens such a segment has taken
        self._tok_min: dict[tuple[str, bool], int] = {}
        # The engine's chunked prefill, first come first served: first segments admitted and not yet through
        # their prompt, [task id, best-case tokens left, admitted at], drained by the steps' reports.
        self._queue: list[list[Any]] = []
        self._step_max = 0  # the most prefill tokens one step has carried (at most the engine's budget)

    # -- learning ----------------------------------------------------------------------------------------
    def observe_step(self, prefill_tokens: int) -> None:
        if prefill_tokens > 0:
            self._step_max = max(self._step_max, prefill_tokens)
            drain(self._queue, prefill_tokens)

    def observe_segment(self, robot_type: str, first: bool, tokens: int) -> None:
        """Every segment counts, a skill-less closer such as '};' too: the shortest is the best case."""
        key = (robot_type, first)
        self._tok_min[key] = min(tokens, self._tok_min.get(key, tokens))

    def admitted(self, g: Generation, now: float) -> None:
        """A new prompt joined the engine: it joins the prefill queue at its best case."""
        n = len(g.req.prompt_token_ids) - self.prefill.best_hit_of(g)
        self._queue.append([g.task_id, max(1, n), now])

    def fewest_tokens(self, robot_type: str, first: bool) -> int | None:
        """The fewest tokens a (first or later) segment of this robot type has taken; None before any."""
        return self._tok_min.get((robot_type, first))

    def tokens_best(self, g: Generation, written: int) -> int:
        """The fewest tokens ``g``'s current segment can still take: the shortest segment of its kind (first
        or later) its robot type has written, less the ``written`` ones; 1 before any was seen."""
        return max(1, self._tok_min.get((g.robot_type, g.k == 0), 1) - written)

    # -- shedding ----------------------------------------------------------------------------------------
    def shed(self, now: float, policy: Policy, est: LatencyEstimator, one_queue: bool,
             running: Sequence[Generation], ranked: Callable[[], list[Generation]],
             has_first: Callable[[], bool], end_running: Ender, end_queued: Ender) -> None:
        """Ask a shedding policy (Policy.hopeless) about every first segment, running then queued, and end the
        hopeless ones (``end_running`` aborts one in the engine first).

        ``left`` is the segment's best case given the work the engine and the policy run before it (the mean
        segment length at the batch's step time would shed urgent ``d(3);`` segments, 4 tokens, that PUD
        serves inside their cutoff):

        * tokens: the fewest a first segment of its robot type has taken, less those written (:meth:`tokens_best`);
        * prefill, in the engine's order (:meth:`prefill_view`): a prompt still being prefilled waits for the
          prompts admitted before it; a queued one for every prompt in the engine and for the first segments
          the policy ranks above it (admission takes candidates in rank order), each at its best case;
        * decode: a queued one at the batch-1 step time; one in the batch at the step time of the smallest batch
          it can be in (the generations whose own best case outlasts its), each of its steps also carrying the
          prefill of the prompts admitted after it, up to what one step has been seen to carry (chunked prefill).

        ``one_queue`` False (an engine pool prefills on each member apart): each segment counts its own prompt.
        ``ranked()``: the candidates in the policy's order, asked after the running ones are shed (ending one may
        hand its robot to a waiting task); ``has_first()``: is any first segment queued."""
        comm = self.comm_s
        running = [g for g in running if not g.pending_abort]
        rest = [self.tokens_best(g, g.seg_tokens()) for g in running]
        live = {g.task_id for g in running if g.k == 0 and g.seg_tokens() == 0}
        self._queue = [e for e in self._queue if e[0] in live]
        per_step = max(0, self._step_max - len(running)) * est.prefill_join_time(1) if one_queue else 0.0
        firsts = [(g, r, sum(1 for x in rest if x >= r)) for g, r in zip(running, rest, strict=True) if g.k == 0]

        # Every admitted prompt counts, the hopeless ones too: in the engine they are the work these steps carry.
        # (Judging each as if the other hopeless ones were gone swings between shedding most and few, and keeping
        # the few costs more: bench/results/README.md, "load_sweep/", the WID 2 trace at 3x.)
        view, total = self.prefill_view(now, set(), est)
        shed: dict[str, float] = {}
        for g, r, batch in firsts:
            before, own = view.get(g.task_id, (0.0, 0.0))
            behind = total - before - own
            if not one_queue:
                before = behind = 0.0
            steps = r - 1 if g.task_id in view else r  # the step that ends its prefill writes its first token
            left = before + own + r * est.step_time(batch) + min(behind, steps * per_step)
            if policy.hopeless(g, now, left, comm):
                shed[g.task_id] = left
        for g, _, _ in firsts:
            if g.task_id in shed:
                end_running(g, self.overdue_reason(g, now, policy.name, "running", shed[g.task_id] + comm))
        if not has_first():
            return
        ahead = self.prefill_view(now, set(shed), est)[1] if one_queue else 0.0
        step1 = est.step_time(1)
        for g in ranked():
            if g.k != 0:
                continue  # a resumed generation's prefill is what was evicted: nothing, at best
            own = self.prefill.best(g, est)
            left = ahead + own + self.tokens_best(g, 0) * step1
            if policy.hopeless(g, now, left, comm):
                end_queued(g, self.overdue_reason(g, now, policy.name, "queued", left + comm))
            elif one_queue:
                ahead += own  # admitted before the ones ranked below it: its prefill is theirs to wait for

    def reject(self, now: float, cands: Sequence[Generation], per_token_s: float, end_queued: Ender) -> None:
        """CoreConfig.overdue 'reject': end the queued first segments whose expected generation (its prefill and
        its tokens at ``per_token_s``) cannot come before their utility cutoff."""
        for g in cands:
            if g.k == 0 and g.tuf.tuf0(g.wait(now, g.gen_time(per_token_s), self.comm_s)) < 0:
                end_queued(g, f"overdue: the first segment cannot arrive before the utility cutoff "
                              f"({g.tuf.cutoff:.3f} s after arrival); waited {now - g.arrival:.3f} s")

    def prefill_view(self, now: float, drop: set[str], est: LatencyEstimator
                     ) -> tuple[dict[str, tuple[float, float]], float]:
        """The prefill queue in best-case seconds: task id -> (queued before it, its own), and the total; those in
        ``drop`` count for themselves only. An engine whose steps report no prefill tokens gets, instead of the
        reports, what the time since the oldest prompt was admitted allows at most to be done."""
        q = [[tid, left] for tid, left, _ in self._queue]
        rate = est.prefill_join_time(1)  # per token: the prompts queued share their steps
        if q and self._step_max == 0 and rate > 0:
            drain(q, int((now - self._queue[0][2]) / rate))
        view, cum = {}, 0.0
        for tid, left in q:
            view[tid] = (cum, left * rate)
            if tid not in drop:
                cum += left * rate
        return view, cum

    @staticmethod
    def overdue_reason(g: Generation, now: float, policy_name: str, where: str, best_s: float) -> str:
        return (f"overdue ({where}, shed by {policy_name}): the first segment cannot arrive before the "
                f"utility cutoff ({g.tuf.cutoff:.3f} s after arrival); waited {now - g.arrival:.3f} s, "
                f"best case {now - g.arrival + best_s:.3f} s")

    # -- degrading ---------------------------------------------------------------------------------------
    def contended(self, now: float, delay_s: float | None, cands: Iterable[Generation],
                  est: LatencyEstimator) -> bool:
        """Is a first segment left waiting that can still earn positive utility (at its best case) and that a wait
        of ``delay_s`` more would make lose some (its best-case response then past its ERT)? One that stays inside
        its ERT loses nothing by waiting (a burst's queue at normal load), and one that cannot earn is shed.
        ``delay_s`` None: any first segment waiting that can still earn (Policy.at_risk off)."""
        step1 = est.step_time(1)
        for q in cands:
            if q.k == 0:
                best = now - q.arrival + self.prefill.best(q, est) + self.tokens_best(q, 0) * step1 + self.comm_s
                if q.tuf.tuf0(best) > 0.0 and (delay_s is None or q.tuf.tuf0(best + delay_s) < q.beta):
                    return True
        return False

    def degrade(self, now: float, policy: Policy, est: LatencyEstimator, gens: list[Generation],
                contended: bool, cands: Callable[[], Iterable[Generation]], batch: Callable[[], int],
                whole_plan: Callable[[Generation], bool], end: Ender) -> list[Generation]:
        """Ask a degrading policy (Policy.degradable) about ``gens``, generations that have sent a segment and
        were left waiting at this decision (an eager policy: also those admitted ahead of a first segment that can
        still earn and was left waiting), and end the optional rest of those it names (``end``: the task ends DONE
        with what was sent, never less than its first segment, and a reason that names the segments left out).
        Returns them. ``contended``: ask :meth:`contended` about the candidates (an eager policy); ``batch()``: the
        generations running; ``whole_plan(g)``: what ``g`` sent is a whole plan (no block left open: the robot
        could end there).

        The best case, as shedding's: the fewest tokens a later segment of its robot type has taken at the batch-1
        step time (a resumed generation's prefill is what was evicted: nothing, at best), and the robot ready for
        it at the latest it can finish the segment before (its report, else the model's maximum), so a segment
        that could still earn is not cut because the robot was slower than the model's minimum."""
        step1, comm = est.step_time(1), self.comm_s
        cut = []
        for g in gens:
            last = g.segments[-1] if g.segments else None
            if last is None or last.dispatch is None:  # nothing of it reached the robot yet: no mandatory part
                continue
            if not whole_plan(g):
                continue
            ready = g.prev_end
            if last.real_end is not None:
                ready = last.real_end
            elif last.pred_start is not None:
                ready = max(ready, last.pred_start + last.max_exec_s)
            left = self.tokens_best(g, 0) * step1
            # the first segments waiting behind it lose its expected generation time (the ranking's G)
            busy = contended is not False and self.contended(
                now, g.gen_time(est.step_time(batch() + 1), prefill=False) if policy.at_risk else None, cands(), est)
            if policy.degradable(g, now, left, comm, ready, busy):
                end(g, self.degraded_reason(g, policy.name, now + left + comm - ready))
                cut.append(g)
        return cut

    @staticmethod
    def degraded_reason(g: Generation, policy_name: str, best_wait_s: float) -> str:
        n = len(g.segments)
        why = (f"could not earn utility (best-case wait {best_wait_s:.3f} s, TUF_1 <= 0 past "
               f"{-g.beta / g.alpha:.3f} s)" if g.tuf.tuf1(best_wait_s) <= 0.0 else
               f"was late (best-case wait {best_wait_s:.3f} s) while a first segment that can still earn waited")
        return (f"{DEGRADED_PREFIX} optional rest (segments {n}..) left out under overload by {policy_name}; "
                f"sent {n} segment{'s' if n != 1 else ''} (the mandatory part); segment {n} {why}")
