"""Batch admission (design §6) and the online step-latency estimate it uses.

Latency-guided admission: before one more generation joins the running
batch, estimate for every running generation the worst-case time to finish
its current segment, ``(lmax - tokens_so_far) * step_time(batch + 1)`` plus
the prefill still pending, and admit only if that does not push a more urgent
generation (earlier deadline) past its deadline while the candidate could
afford to wait, and the KV cache has room (see :class:`LatencyGuided`).
``step_time`` and the prefill cost per token are fitted online from the engine's
own step reports, seeded from the engine's fitted step model where its config has
one, so they follow whichever engine runs (an engine pool keeps one per member and answers for the member
a generation would be placed on: engines/pool.py).

Fixed caps (1..16) are the comparison of paper Fig. 7.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from timelyllm_ros.engines.latency import LatencyEstimator

if TYPE_CHECKING:
    from timelyllm_ros.planner.generation import Generation


@dataclass(slots=True)
class AdmissionView:
    """What admission sees of the engine right now."""

    running: Sequence[Generation]
    now: float
    comm_s: float
    kv_usage: float  # 0..1
    estimator: LatencyEstimator
    waiting: Sequence[Generation] = ()  # the candidates not admitted yet (weighing, see LatencyGuided)


class Admission(abc.ABC):
    name = "admission"

    @abc.abstractmethod
    def admit(self, view: AdmissionView, cand: Generation) -> bool:
        """May ``cand`` join the running batch now?"""

    def max_batch(self) -> int:
        return 1 << 30


class FixedCap(Admission):
    def __init__(self, cap: int, kv_high: float = 0.95) -> None:
        if not isinstance(cap, int) or cap < 1:
            raise ValueError(f"batch cap must be an integer >= 1, got {cap!r}")
        self.cap, self.kv_high = cap, kv_high
        self.name = f"cap{cap}"

    def admit(self, view: AdmissionView, cand: Generation) -> bool:
        n = len(view.running)
        return n == 0 or (n < self.cap and view.kv_usage < self.kv_high)

    def max_batch(self) -> int:
        return self.cap


class LatencyGuided(Admission):
    """Design §6, latency-guided admission. ``lmax`` per robot type is the longest-segment budget in tokens.

    For every running generation g the finish of its current segment is estimated as
    ``now + pending prefill + remaining tokens * step(batch)``, where pending prefill
    is the prompts still being prefilled (chunked prefill shares the coming steps
    with everyone); with the candidate c it grows by c's prefill and by one more
    sequence per step. g's *deadline* is TimeUtility.deadline: ``arrival + ERT`` for s_0,
    the predicted exec end of s_{k-1} for s_k (the same deadline EDF uses). Remaining tokens: the
    expected segment length (learned per robot type) minus the tokens written, at
    least 1; ``worst_case=True`` uses design §6's ``lmax - tokens_so_far`` instead
    (same urgent utility in simulation, but it flags nearly every arm segment as
    late and defers new normal tasks for nothing: WID 3 waiting +0.06 s vs +0.03 s).
    The cutoff mode always uses lmax, as before.

    ``mode="protect"`` (default): c may not join while a running generation with an
    earlier deadline would finish its segment past that deadline with c in the
    batch — whether c pushes it past or it is late already, when every extra
    millisecond costs it utility — provided c could wait for that generation and
    still meet its own deadline. A generation with a later deadline never blocks
    c (c is the more urgent one), and a candidate that cannot afford to wait is
    admitted (refusing it only moves the loss onto it). This is what keeps a
    normal task's prefill out of the steps an urgent first segment needs.

    ``prefill_step_s`` (protect mode; None: off, the default) bounds the new prompts one step prefills: a
    candidate whose prompt would take the prompts still to prefill past it waits for the next decision when it
    can afford one more step. Why: a step cannot be cut once it runs, so an urgent goal that arrives during a
    step waits for all of it (9 normal prompts admitted 30 ms before it: its first segment at ~500 ms against
    ~170 ms alone on this CPU; with a 50 ms budget ~220 ms, bench/results/urgent_burst). It is off by default
    because under load it costs more than it saves: simulated load sweeps at 2-3x lost 0.02-0.06 all-tasks
    U/beta on the drone traces and 0.11-0.28 on the arm trace (below fcfs-stream at 3x), deferring normal
    prompts step after step. A prompt is never held back when nothing else is prefilling (a long one still
    goes through, alone).

    ``weigh=True`` (protect mode; admission ``adaptive-tuf``, opt-in) also weighs the TUFs among *peers*, first
    segments of the same TUF: a first-segment candidate c may not join when the utility the running peers at
    least as urgent as c (a tie counts) would lose by its joining exceeds what waiting for their segments costs
    c and the work waiting behind it. Each loss is a TUF's slope times the lateness added between its deadline
    and its cut-off (:func:`_lost`: past the cut-off a shedding policy drops the task, so lateness there costs
    nothing); the work behind (tasks of other TUFs, later segments; at most :data:`WEIGH_WAITING` of them) is
    delayed by c's decode, which runs alone instead of beside the peers'. Why: deadlines that tie never block
    one another, so 5 urgent goals arriving together are prefilled in one step and all come at the cut-off;
    weighed, they go in smaller groups and those that cannot earn are shed (bench/results/urgent_burst/five-weighed:
    pud-shed's five urgent tasks U/beta +0.31 against -0.05, the same run). Why peers only, and the work behind:
    weighed against every more urgent generation, or without the work behind, the simulated WID 1 trace at 2x
    the fleet lost 0.016 normal U/beta to the serial decode (pud-shed then behind pud). Why opt-in: it is only
    as good as the estimates it weighs. In the demo at the paper's TUFs (3 interleaved pairs) pud-shed's urgent
    U/beta was 0.235 / 0.304 / 0.340 with it against 0.433 / 0.371 / 0.327 without: there the step-time
    estimate (decode 16-25 ms a token, prefill 1.2-1.3 ms a prompt token, with the ROS nodes on the same 2
    cores; 7.0 and 0.77 in the burst benchmark) made a shared step look dearer than it was, so it held back
    goals that one shared step served at ~0.3 s, and shedding then dropped them
    (bench/results/demo_cpu/weigh_ab). Under a policy that does not shed, weighing against every more urgent
    generation lost in an overloaded engine (simulated WID 2 trace on this CPU's fitted step model: edf-seg
    all-tasks U/beta -0.26 against -0.12).

    Weighing also covers the one case the deadline rule lets through: a candidate that cannot afford to wait for a
    more urgent first segment it would push past that one's deadline. Its joining is weighed like a peer's (the
    urgent one's loss to its cut-off against the candidate's loss from waiting and the work behind it). Why: in a
    demo run at the paper's TUFs (a trial that gathered each burst before its first step), 5 normal prompts, each
    short of time to wait, joined the step right after 4 urgent prompts were prefilled; the 330 ms step took all 4
    urgent first segments past their cut-off (-1.7 each).

    ``mode="cutoff"`` (the previous rule, kept for comparison): refuse only when a
    running generation that can still finish before its TUF *cutoff* at the
    current batch size could not with c; already-late ones do not constrain.
    """

    MODES = ("protect", "cutoff")

    def __init__(self, lmax: dict[str, int] | None = None, default_lmax: int = 10,
                 kv_high: float = 0.95, hard_cap: int = 256, mode: str = "protect", worst_case: bool = False,
                 prefill_step_s: float | None = None, weigh: bool = False) -> None:
        if mode not in self.MODES:
            raise ValueError(f"LatencyGuided mode must be one of {self.MODES}, got {mode!r}")
        if prefill_step_s is not None and not prefill_step_s > 0:
            raise ValueError(f"LatencyGuided prefill_step_s must be > 0 (or None: off), got {prefill_step_s!r}")
        self.prefill_step_s = prefill_step_s
        self.lmax = dict(lmax or {"drone": 10, "arm": 20, "chatbot": 20})
        self.default_lmax = default_lmax
        self.kv_high, self.hard_cap = kv_high, hard_cap
        self.mode = mode
        self.worst_case = worst_case
        self.weigh = weigh
        self.name = f"adaptive-{mode}" if mode != "protect" else "adaptive-tuf" if weigh else "adaptive"

    def admit(self, view: AdmissionView, cand: Generation) -> bool:
        running = view.running
        n = len(running)
        if n == 0:
            return True  # never starve: an idle engine always takes the best candidate
        if n >= self.hard_cap or view.kv_usage >= self.kv_high:
            return False
        est = view.estimator
        t_now = est.step_time(n)
        t_more = est.step_time(n + 1)
        # The prompts still to prefill share their steps: the fixed cost of a step that prefills once
        # (LatencyEstimator.prefill_step_s), then each prompt's uncached tokens. c joining adds its tokens, and the
        # fixed cost only where no prompt is pending.
        fixed = est.prefill_step_s
        waits = [g.prefill_est_s for g in running if g.k == 0 and g.seg_tokens() == 0]
        pending = max(0.0, sum(waits) - fixed * (len(waits) - 1)) if waits else 0.0
        extra = 0.0
        if cand.k == 0:
            extra = max(0.0, cand.prefill_est_s - fixed) if waits else cand.prefill_est_s
        now, comm = view.now, view.comm_s
        lmax, dflt = self.lmax, self.default_lmax
        if self.mode == "cutoff":
            for g in running:
                left = max(1, lmax.get(g.robot_type, dflt) - g.seg_tokens())
                slack = g.deadline() - g.beta / g.alpha - comm - now
                if left * t_now + pending <= slack < left * t_more + pending + extra:
                    return False
            return True
        c_dl = cand.deadline() - comm
        # c's own generation time once it runs, after waiting: its prompt in a step of its own
        c_gen = cand.gen_time(t_more)
        budget = self.prefill_step_s
        if budget is not None and extra > 0 and pending > 0 and pending + extra > budget \
                and now + pending + t_now + c_gen <= c_dl:
            return False  # the next decision takes it, and a step in between stays short
        worst = self.worst_case
        weigh = self.weigh and cand.k == 0
        c_tuf = cand.tuf
        loss = 0.0  # utility the generations at least as urgent as c lose if it joins now (weigh)
        c_start = now + pending  # when c would start if it waited for them (weigh)
        for g in running:
            dl = g.deadline() - comm
            peer = weigh and g.k == 0 and g.tuf == c_tuf  # a first segment of the same TUF as c's
            if dl > c_dl or (dl == c_dl and not peer):
                continue  # g is not more urgent than the candidate
            if worst:
                left = max(1, lmax.get(g.robot_type, dflt) - g.seg_tokens())
            else:
                left = g.tokens_left()
            end_with = now + pending + extra + left * t_more
            end_without = now + pending + left * t_now
            if dl < c_dl and end_with > dl and end_without + c_gen <= c_dl:
                return False
            # Here g is a peer, or more urgent and c cannot afford to wait for it (else refused above): either
            # way a first segment's loss is weighed, so c does not join when that costs g more than waiting costs c
            if weigh and g.k == 0:
                loss += _lost(g, dl, end_without, end_with)
                c_start = max(c_start, end_without)
        if loss > 0.0:  # c joining now ends with them; waiting, it starts when they are through
            gain = _lost(cand, c_dl, now + pending + extra + cand.gen_time(t_more, prefill=False), c_start + c_gen)
            if loss > gain:
                # Served in series, c's segment is decoded alone, not beside theirs: the work waiting behind
                # (tasks of other TUFs, later segments) starts that much later.
                delay = cand.gen_time(t_now, prefill=False)
                after = c_start + c_gen
                for w in itertools.islice(view.waiting, WEIGH_WAITING):
                    if w is cand or (w.k == 0 and w.tuf == c_tuf):
                        continue
                    w_end = after + w.gen_time(t_now)
                    gain += _lost(w, w.deadline() - comm, w_end, w_end + delay)
                    if gain >= loss:
                        break
            if loss > gain:
                return False  # waiting costs c and the work behind it less than joining now costs them
        return True

    def max_batch(self) -> int:
        return self.hard_cap


def _lost(g: Generation, dl: float, early: float, late: float) -> float:
    """Utility ``g`` (deadline ``dl``, hop already taken off) loses when its segment ends at ``late`` instead of
    ``early``: its TUF's slope times the lateness added between its deadline and its cut-off (zero utility).
    Past the cut-off nothing more is counted: a generation that earns nothing either way is no reason to keep
    one that still can waiting, nor one to let it jump ahead."""
    cut = dl - g.beta / g.alpha
    return -g.alpha * (min(max(late, dl), cut) - min(max(early, dl), cut))


WEIGH_WAITING = 256  # waiting tasks weighing looks at per decision (bounded time on the engine's hot path)
VLLM_MAX_NUM_SEQS = 256  # vLLM's default batch limit: what a vLLM-style baseline admits (then KV memory bounds it)
ADMISSIONS = ("'auto', 'adaptive' (= 'latency', 'adaptive-ert'), 'adaptive-tuf', 'adaptive-cutoff' or a fixed batch "
              "cap such as 8")


def make_admission(spec: str | int, *, segmented: bool | None = None, prefill_step_s: float | None = None,
                   **kw: Any) -> Admission:
    """``"auto"``: latency-guided and weighing (``adaptive-tuf``) for the segmented policies, vLLM's own admission
    (a cap of :data:`VLLM_MAX_NUM_SEQS`) for the unsegmented vLLM-style baselines, so a baseline is admitted the
    same way in simulation and on the real engine (``segmented``: the policy's, required for auto).
    ``"adaptive"`` (= ``"adaptive-ert"``): deadline-protecting, without weighing (the default before, kept to
    compare); ``"adaptive-tuf"``: the same, also weighing the TUFs among simultaneous first segments (see
    :class:`LatencyGuided`); ``"adaptive-cutoff"``: the rule before that; or a fixed cap (``8`` / ``"cap8"`` /
    ``"8"``). ``prefill_step_s``: a latency-guided one's budget
    (:class:`LatencyGuided`; a cap has none)."""
    adm = _make_admission(spec, segmented, **kw)
    if isinstance(adm, LatencyGuided) and prefill_step_s is not None:
        adm.prefill_step_s = prefill_step_s
    return adm


def _make_admission(spec: str | int, segmented: bool | None, **kw: Any) -> Admission:
    if isinstance(spec, int) and not isinstance(spec, bool):
        return FixedCap(spec, **kw)
    s = str(spec).strip().lower()
    if s == "auto":
        if segmented is None:
            raise ValueError("admission 'auto' depends on the policy: say whether it is segmented")
        return LatencyGuided(weigh=True, **kw) if segmented else FixedCap(VLLM_MAX_NUM_SEQS, **kw)
    if s in ("adaptive", "adaptive-ert", "latency", "latency-guided"):
        return LatencyGuided(**kw)
    if s in ("adaptive-tuf", "tuf"):
        return LatencyGuided(weigh=True, **kw)
    if s in ("adaptive-cutoff", "cutoff"):
        return LatencyGuided(mode="cutoff", **kw)
    s = s.removeprefix("cap")
    if s.isdigit():
        return FixedCap(int(s), **kw)
    raise ValueError(f"unknown admission {spec!r}: use {ADMISSIONS}")
