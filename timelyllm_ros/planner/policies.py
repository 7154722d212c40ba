"""Scheduling policies behind one interface (design §4).

A policy ranks the queued generations (new tasks and resumable suspended
ones) at every decision; it also says whether generations are suspended at
segment boundaries and whether segments are streamed to the robot as soon as
they are detected. Priorities are recomputed from scratch at each decision
(they depend on the current time), so the hot loops below are written flat:
the decision-time target is <= 0.1 ms with 8 queued generations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from timelyllm_ros.domain.tuf import TimeUtility
    from timelyllm_ros.planner.generation import Generation


@dataclass(slots=True)
class RankContext:
    """What a policy needs besides the generations themselves."""

    comm_s: float  # one network hop planner -> robot
    per_token_s: float  # estimated decode time per token at the batch size the generation would join
    slack_floor_s: float  # L(s_k) is clamped to this (design §4; CoreConfig.slack_floor_s)


class GenView(Protocol):  # documentation of the fields policies read
    tuf: TimeUtility  # deadline() and utility() of its segments
    arrival: float
    alpha: float
    beta: float
    ert: float
    k: int  # index of the segment to generate next
    prev_end: float  # predicted (or reported) exec end of s_{k-1}; unused for k == 0
    enqueued_at: float  # when this segment request entered the queue
    tok_est: float  # estimated tokens of the next segment
    prefill_est_s: float  # estimated prefill of the prompt (k == 0 only)

    def deadline(self) -> float: ...  # tuf.deadline of segment k
    def gen_time(self, step_s: float, prefill: bool = True) -> float: ...  # G(s_k)
    def wait(self, now: float, G: float, comm_s: float) -> float: ...  # W(s_k; now)
    def slack(self, now: float, G: float) -> float: ...  # L(s_k), unclamped


class Policy:
    name: str = "base"
    segmented: bool = True  # suspend at segment boundaries
    streams: bool = True  # send each segment as soon as it is detected
    sheds: bool = False  # the scheduler asks :meth:`hopeless` about first segments (queued and running)
    degrades: bool = False  # the scheduler asks :meth:`degradable` about later segments left waiting
    # ... and, for an eager one, about later segments admitted ahead of a first segment left waiting
    eager: bool = False
    # (eager) only where that first segment would lose utility by waiting for the later one (pushed past its ERT)
    at_risk: bool = True
    # (segmented) suspend at a boundary only when it pays, else write on in place (SegmentOrStream.decide)
    adaptive: bool = False

    def priority(self, g: Generation, now: float, ctx: RankContext) -> float:
        raise NotImplementedError

    def priorities(self, gens: Sequence[Generation], now: float, ctx: RankContext) -> list[float]:
        """Higher first. Subclasses may override with a flat loop for speed."""
        p = self.priority
        return [p(g, now, ctx) for g in gens]

    def hopeless(self, g: Generation, now: float, left_s: float, comm_s: float) -> bool:
        """Should the scheduler end ``g`` now (OVERDUE, an explicit result), given ``left_s``, the
        scheduler's estimate of the generation time its next segment still needs? Asked only when
        :attr:`sheds` is set."""
        return False

    def degradable(self, g: Generation, now: float, left_s: float, comm_s: float, ready: float,
                   contended: bool) -> bool:
        """Should the scheduler end ``g``'s optional rest now (the task ends DONE with the segments already sent,
        its reason saying what was left out)? Asked only when :attr:`degrades` is set, and only about a generation
        that has sent at least one segment and was left waiting at a decision (the engine could not take it), or,
        with :attr:`eager`, was admitted while a first segment was left waiting.
        ``left_s``: the best case of its next segment's generation time; ``ready``: the latest the robot can
        finish the segment before it (its report, else the model's maximum); ``contended``: (eager) a first
        segment that can still earn positive utility was left waiting at the same decision, and (with
        :attr:`at_risk`) waiting for this generation's next segment would push it past its ERT."""
        return False

    def describe(self) -> str:
        return (f"{self.name} (segmented={self.segmented}, streams={self.streams}, sheds={self.sheds}, "
                f"degrades={self.degrades}, adaptive={self.adaptive})")


class PUD(Policy):
    """Potential utility density, paper Eq. 4."""

    name = "pud"

    def priority(self, g: Generation, now: float, ctx: RankContext) -> float:
        return self.priorities((g,), now, ctx)[0]

    def priorities(self, gens: Sequence[Generation], now: float, ctx: RankContext) -> list[float]:
        tpt, comm, floor = ctx.per_token_s, ctx.comm_s, ctx.slack_floor_s
        out = []
        append = out.append
        for g in gens:
            G = g.gen_time(tpt)
            u = g.tuf.utility(g.k, g.wait(now, G, comm))
            L = g.slack(now, G)
            if L < floor:
                L = floor
            append(u / (G * L))
        return out


class PUDShed(PUD):
    """Feasibility-aware utility accrual: PUD's order (Eq. 4) plus shedding of first segments that can
    no longer earn positive utility.

    At every decision the scheduler estimates, for each first segment s_0 queued or in the batch, its best
    case given the work the policy runs before it (``Overload.shed``): the fewest tokens a first segment
    of its robot type has taken, its prompt's prefill less the largest prefix-cache hit seen, and for a
    queued one the prefill still ahead of it in admission order (the running prompts and the first segments
    ranked above it). If even then TUF_0(now - arrival + left + comm) <= 0, the task is ended OVERDUE (the
    robot gets that result at once, not a late plan): serving it could only add negative utility, and under
    overload it takes batch slots and step time from tasks that can still make their deadlines, which is
    how EDF (and PUD, which still serves such tasks, last) collapse. The estimate is a best case, not an
    average, so a task that could still earn is not shed (a mean segment length would shed urgent 4-token
    segments that PUD serves inside their cutoff). Later segments are never shed: the robot is
    mid-plan, and the answer it already got counts. With no overload nothing is hopeless and this is PUD's
    order exactly.

    Segment when it pays, stream when it does not: a generation suspends at a boundary only when a
    waiting generation gains more from its place than the resume costs, and otherwise writes on in place, each
    segment still sent as it is written (``SegmentOrStream.decide``). Resumes come back alone, a step per
    token: suspending at every boundary halved the engine's batching on the 12-step arm trace under overload and
    lost to streaming whole plans there (bench/results/load_sweep/segment-or-stream). ``pud-shed-seg`` suspends at
    every boundary, to compare.
    """

    name = "pud-shed"
    sheds = True
    adaptive = True

    def hopeless(self, g: Generation, now: float, left_s: float, comm_s: float) -> bool:
        return g.k == 0 and g.tuf.tuf0(now - g.arrival + left_s + comm_s) <= 0.0


class PUDShedSeg(PUDShed):
    """pud-shed suspending at every boundary, as PUD does; kept to compare with the adaptive default."""

    name = "pud-shed-seg"
    adaptive = False


class PUDDegrade(PUDShed):
    """pud-shed plus degrading (imprecise computation, as in RTDeepIoT): under overload a task keeps
    its mandatory part, the segments already sent (at least its first: an urgent task's evasive first move),
    and its optional rest is ended explicitly instead of being served late.

    Overload, precisely: at a decision, a generation that has sent a segment was left waiting (the batch had no
    room for it or admission refused it), and its next segment cannot earn positive utility even at best, i.e.
    TUF_1(now + left + comm - ready) <= 0 with ``left`` the fewest tokens a later segment of its robot type has
    taken at the batch-1 step time and ``ready`` the latest the robot can finish the segment before it. PUD puts
    such a segment last, so it is served only when nothing else waits, late (a negative term of Eq. 3) and in
    batch slots and step time that first segments need. The task then ends DONE at once with the reason
    ``degraded: ...`` (TaskResult.degraded): the robot runs what it got, then the end of plan. A first segment is
    never degraded (nothing was sent: it is shed, or served, as under pud-shed), and with no overload nothing is
    degraded and this is pud-shed-seg exactly (it suspends at every boundary: degrading acts on the later segments
    suspension leaves waiting, which a plan streamed in place never is).
    """

    name = "pud-degrade"
    degrades = True
    adaptive = False

    def degradable(self, g: Generation, now: float, left_s: float, comm_s: float, ready: float,
                   contended: bool) -> bool:
        if g.k == 0:
            return False  # nothing sent: no mandatory part to keep
        wait = now + left_s + comm_s - ready  # W(s_k) at best: the robot ready as late as it can be, G at its least
        if self.eager and contended:
            return wait > 0.0  # already below full utility while a first segment that can earn waits
        return g.tuf.tuf1(wait) <= 0.0


class PUDDegradeEager(PUDDegrade):
    """pud-degrade with a wider overload rule, decided at admission: a later segment admitted ahead of a first
    segment that is left waiting, that can still earn, and that waiting for it would push past its ERT (best case
    + the later segment's estimated generation time), gives up its optional rest when it is itself late (best-case
    wait > 0, below full utility), and its place in the batch goes to the waiting ones. PUD ranks an overdue later
    segment that still earns above almost any first segment (its slack at the floor), so under overload those
    take the batch first; this trades them (Eq. 3 terms of tasks already answered) for first segments (the
    response of tasks not answered yet)."""

    name = "pud-degrade-eager"
    eager = True


class PUDDegradeWide(PUDDegradeEager):
    """pud-degrade-eager without the at-risk test: any first segment that can still earn and is left waiting
    counts, one well inside its ERT too (a burst's queue at normal load). Kept to measure the trade: it cuts more
    plans, for more first-segment utility and less Eq. 3 (bench/results/degrade)."""

    name = "pud-degrade-wide"
    at_risk = False


class PortExp(Policy):
    """The public port's formula: (alpha*max(0,D) + beta) * exp(min(0,D)),
    D = now + G + comm - exec_end_pred (for s_0 the 'exec end' is arrival + ERT)."""

    name = "port-exp"

    def priority(self, g: Generation, now: float, ctx: RankContext) -> float:
        G = g.gen_time(ctx.per_token_s)
        D = now + G + ctx.comm_s - g.deadline()
        return (g.alpha * max(0.0, D) + g.beta) * math.exp(min(0.0, D))


class FCFS(Policy):
    """vLLM default: whole plan generated, then sent at once."""

    name = "fcfs"
    segmented = False
    streams = False

    def priority(self, g: Generation, now: float, ctx: RankContext) -> float:
        return -g.enqueued_at


class FCFSStream(FCFS):
    name = "fcfs-stream"
    streams = True


class FCFSSeg(FCFS):
    """Segmented FCFS: segment requests served in the order they entered the
    queue (a resumed generation enters when it becomes eligible)."""

    name = "fcfs-seg"
    segmented = True
    streams = True


class EDFSeg(Policy):
    """Segmented EDF: earliest deadline first (TimeUtility.deadline: arrival + ERT for s_0, exec_end(s_{k-1})
    for s_k)."""

    name = "edf-seg"

    def priority(self, g: Generation, now: float, ctx: RankContext) -> float:
        return -g.deadline()


class StaticPriority(Policy):
    """vLLM's native priority scheduling: a fixed priority per urgency level
    (tighter ERT first), FCFS within a level; whole plan, no suspension.
    Unlike vLLM it does not preempt running requests (admission order only)."""

    name = "static-priority"
    segmented = False
    streams = False

    def __init__(self, streams: bool = False) -> None:
        self.streams = streams

    def priority(self, g: Generation, now: float, ctx: RankContext) -> float:
        # ERT differences (>= 0.1 s) x 1e8 dominate any arrival time.
        return -(g.ert * 1e8) - g.arrival


POLICIES: dict[str, Callable[[], Policy]] = {
    "pud": PUD,
    "pud-shed": PUDShed,
    "pud-shed-seg": PUDShedSeg,
    "pud-degrade": PUDDegrade,
    "pud-degrade-eager": PUDDegradeEager,
    "pud-degrade-wide": PUDDegradeWide,
    "port-exp": PortExp,
    "fcfs": FCFS,
    "fcfs-stream": FCFSStream,
    "fcfs-seg": FCFSSeg,
    "edf-seg": EDFSeg,
    "static-priority": StaticPriority,
}

# What the planner node, its launch configuration and the demo run unless told otherwise: PUD's order plus
# shedding of first segments that can no longer earn utility (bench/results/README.md: load sweep, real engine).
DEFAULT_POLICY = "pud-shed"


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
