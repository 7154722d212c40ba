"""Plan lengths learned per task (the RT-LM idea): how many tokens the next segment of a
generation will take, and how many segments and tokens are left, with an uncertainty for each.

The model writes plans of very different lengths per task (a drone's ``d(3);`` against an arm's twelve-call
stacking plan), and even a greedy plan of one task differs between runs, so one running mean per robot type
(the scheduler's ``ewma`` estimate) is wrong for most tasks. This model keys its statistics by

1. ``text``: the robot type and the task text, normalised (case, whitespace);
2. ``type``: the robot type and the task's *type*: :attr:`TaskSpec.task_type` where the caller names one,
   else the task text with its scene description dropped and its numbers masked (so "move up 50 cm" and
   "move up 80 cm" with different scenes share it);
3. ``robot``: the robot type alone;

and predicts from the most specific key that has seen enough (``min_obs``) of what is asked, falling back
along that chain to the prior (the scheduler's per-robot-type segment-token prior). Per key it keeps, for each
segment index k (indexes at or past ``max_index`` share the last slot), Welford mean/variance of

* the tokens of segment k (learned from every segment as it is produced, finished plan or not);
* the tokens and segments left from k on, given the plan reached k (learned from complete plans only: a
  cancelled or failed plan's length says nothing about where it would have ended).

Memory is bounded: at most ``max_keys`` keys (least recently used evicted first; a robot-type key is touched
by every update of its robot type, so it is the last to go), each at most 3 x ``max_index`` + 1 running
statistics of three numbers, grown only as far as the key's plans reach (a 4-segment task holds 13: ~2.5 kB
a key, measured with its text), so the default 1024 keys take ~2.5 MB with such tasks and at most ~10 MB.
Pure Python, no ROS: the planner, the simulator and the benchmark share it.
"""

from __future__ import annotations

import functools
import math
import re
from collections import OrderedDict
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from timelyllm_ros.domain.types import TaskSpec
    from timelyllm_ros.planner.generation import Generation

_WS = re.compile(r"\s+")
_SCENE = re.compile(r"scene:\s*\[[^\]]*\]", re.I)  # LRTrace drone prompts: "Scene: [objects with boxes] Task: ..."
_NUM = re.compile(r"\d+(?:\.\d+)?")


def text_key(text: str) -> str:
    """The task text as the ``text`` level keys it: lower case, whitespace collapsed."""
    return _WS.sub(" ", text.strip().lower())


def type_key(text: str) -> str:
    """A task type derived from its text: the scene dropped, numbers masked (see the module docstring)."""
    return _NUM.sub("#", text_key(_SCENE.sub(" ", text)).strip())


class Welford:
    """Running mean and variance (Welford), O(1) memory."""

    __slots__ = ("n", "mean", "m2")

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)

    @property
    def var(self) -> float:
        return self.m2 / (self.n - 1) if self.n > 1 else 0.0


@dataclass(frozen=True, slots=True)
class LengthPrediction:
    """What :meth:`PlanLengths.predict` says about a generation after ``k`` segments."""

    seg_mean: float  # tokens of the next segment (k)
    seg_std: float
    seg_level: str  # which key answered: text, type, robot or prior
    rem_segments: float  # segments left, k included (>= 1)
    rem_tokens_mean: float  # tokens left, segment k included
    rem_tokens_std: float
    rem_level: str

    def seg_quantile(self, q: float) -> float:
        """Tokens of the next segment at quantile ``q`` (normal approximation, never below the mean for q >= 0.5)."""
        return _quantile(self.seg_mean, self.seg_std, q)

    def rem_quantile(self, q: float) -> float:
        return _quantile(self.rem_tokens_mean, self.rem_tokens_std, q)


@functools.cache
def _z(q: float) -> float:
    return NormalDist().inv_cdf(min(max(q, 1e-6), 1 - 1e-6))


def _quantile(mean: float, std: float, q: float) -> float:
    if q == 0.5 or std <= 0:
        return mean
    return max(1.0, mean + _z(q) * std)


_EMPTY = Welford()  # what an index a key has not reached yet reads as (never written)


def _at(stats: list[Welford], i: int) -> Welford:
    """Slot ``i`` of a per-index list, grown to it (lists grow only as far as a key's plans reach)."""
    while len(stats) <= i:
        stats.append(Welford())
    return stats[i]


def _get(stats: list[Welford], i: int) -> Welford:
    return stats[i] if i < len(stats) else _EMPTY


class _Entry:
    __slots__ = ("seg", "seg_all", "rem_tok", "rem_seg")

    def __init__(self) -> None:
        self.seg: list[Welford] = []  # by segment index: its tokens
        self.seg_all = Welford()  # every segment, whatever its index
        self.rem_tok: list[Welford] = []  # by segment index: tokens left from it on (complete plans)
        self.rem_seg: list[Welford] = []  # by segment index: segments left from it on


class PlanLengths:
    """Online, bounded-memory model of plan lengths per (robot type, task); see the module docstring.

    ``prior``: robot type -> tokens per segment before anything is learned (the scheduler's
    ``segment_tokens_prior``); ``prior_cv``: the prior's spread as a fraction of its mean; ``prior_segments``:
    segments of a plan before any plan of the robot type has ended.
    """

    LEVELS = ("text", "type", "robot")

    def __init__(self, prior: dict[str, float] | None = None, *, default_tokens: float = 8.0, prior_cv: float = 0.5,
                 prior_segments: float = 3.0, min_obs: int = 2, max_index: int = 32, max_keys: int = 1024) -> None:
        if max_keys < 3 or max_index < 1 or min_obs < 1:
            raise ValueError("PlanLengths: max_keys >= 3, max_index >= 1, min_obs >= 1")
        self.prior = dict(prior or {})
        self.default_tokens = default_tokens
        self.prior_cv, self.prior_segments = prior_cv, prior_segments
        self.min_obs, self.max_index, self.max_keys = min_obs, max_index, max_keys
        self._keys: OrderedDict[tuple[str, str, str], _Entry] = OrderedDict()  # LRU: oldest first

    # -- keys -----------------------------------------------------------------
    @staticmethod
    def keys_of(spec: TaskSpec) -> tuple[tuple[str, str, str], ...]:
        """The spec's keys, most specific first."""
        rt = spec.robot_type
        tt = spec.task_type or type_key(spec.prompt)
        return ("text", rt, text_key(spec.prompt)), ("type", rt, tt), ("robot", rt, "")

    def __len__(self) -> int:
        return len(self._keys)

    def _entry(self, key: tuple[str, str, str]) -> _Entry:
        e = self._keys.get(key)
        if e is None:
            e = self._keys[key] = _Entry()
            while len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(key)
        return e

    def _slot(self, k: int) -> int:
        return min(max(k, 0), self.max_index - 1)

    # -- learning ---------------------------------------------------------------
    def observe_segment(self, spec: TaskSpec, k: int, tokens: int) -> None:
        """Segment ``k`` of a generation of ``spec`` took ``tokens`` tokens."""
        if tokens <= 0:
            return
        i = self._slot(k)
        for key in reversed(self.keys_of(spec)):  # the robot key touched first: LRU evicts task keys before it
            e = self._entry(key)
            _at(e.seg, i).add(float(tokens))
            e.seg_all.add(float(tokens))

    def observe_plan(self, spec: TaskSpec, seg_tokens: list[int]) -> None:
        """A complete plan of ``spec`` ended with segments of these token counts (learns what is left from each
        segment on; the segments themselves are learned by :meth:`observe_segment`)."""
        n = len(seg_tokens)
        if n == 0:
            return
        entries = [self._entry(key) for key in reversed(self.keys_of(spec))]
        left = 0
        for k in range(n - 1, -1, -1):  # suffix sums: tokens left from k on
            left += seg_tokens[k]
            if k >= self.max_index:
                continue  # the last slot keeps k = max_index - 1 only: deeper suffixes would mix lengths
            for e in entries:
                _at(e.rem_tok, k).add(float(left))
                _at(e.rem_seg, k).add(float(n - k))

    # -- prediction ---------------------------------------------------------------
    def _peek(self, key: tuple[str, str, str]) -> _Entry | None:
        return self._keys.get(key)  # no LRU touch: prediction is hot and must not reorder

    def _prior_seg(self, robot_type: str) -> float:
        return float(self.prior.get(robot_type, self.default_tokens))

    def predict(self, spec: TaskSpec, k: int = 0) -> LengthPrediction:
        """Next-segment tokens and what is left after ``k`` segments, each (mean, std), from the most
        specific key that has ``min_obs`` observations of it."""
        keys = self.keys_of(spec)
        entries = [self._peek(key) for key in keys]
        i = self._slot(k)
        seg_mean = seg_std = None
        seg_level = "prior"
        for level, e in zip(self.LEVELS, entries, strict=True):
            if e is not None and _get(e.seg, i).n >= self.min_obs:
                w = e.seg[i]
                seg_mean, seg_std, seg_level = w.mean, math.sqrt(w.var), level
                break
        if seg_mean is None:  # no key has seen segment k: any segment of the most specific key that has some
            for level, e in zip(self.LEVELS, entries, strict=True):
                if e is not None and e.seg_all.n >= self.min_obs:
                    w = e.seg_all
                    seg_mean, seg_std, seg_level = w.mean, math.sqrt(w.var), level
                    break
        if seg_mean is None:
            seg_mean = self._prior_seg(spec.robot_type)
            seg_std = self.prior_cv * seg_mean
        assert seg_std is not None
        rem = None
        for level, e in zip(self.LEVELS, entries, strict=True):
            if e is not None and k < self.max_index and _get(e.rem_tok, i).n >= self.min_obs:
                rem = (max(1.0, e.rem_seg[i].mean), e.rem_tok[i].mean, math.sqrt(e.rem_tok[i].var), level)
                break
        if rem is None:  # nothing learned about plans this long: the next segment and the prior's count
            segs = max(1.0, self.prior_segments - k)
            rem = (segs, seg_mean * segs, math.sqrt(segs) * max(seg_std, self.prior_cv * seg_mean), "prior")
        # At least the next segment is left: a long plan past every recorded suffix still writes one.
        return LengthPrediction(seg_mean, seg_std, seg_level, rem[0], max(rem[1], seg_mean), rem[2], rem[3])

    def describe(self) -> dict[str, int]:
        """How many keys of each level are held (telemetry)."""
        out = dict.fromkeys(self.LEVELS, 0)
        for level, _, _ in self._keys:
            out[level] += 1
        return out



LENGTH_MODELS = ("learned", "ewma")


class SegmentLengths:
    """The scheduler's length estimate of a generation's next segment and of the plan left (``tok_est``,
    ``rem_tok_est``) under one of :data:`LENGTH_MODELS`:

    * ``learned``: per task, from :class:`PlanLengths` (``self.learned``); urgent tasks (beta >= ``urgent_beta``)
      plan with its ``quantile_urgent``, not its mean, so their next segment is started early enough for a
      longer than usual one and admission protects them for it;
    * ``ewma``: one running mean per robot type of the skill-bearing segments, seeded by the prior (cheaper,
      blind to the task).

    Both learn under either model, so a run-time switch keeps what was learned."""

    def __init__(self, model: str, prior: dict[str, float], *, quantile_urgent: float, urgent_beta: float,
                 max_keys: int) -> None:  # no defaults: the core's settings (planner/settings.py) give them
        self.model, self.quantile_urgent, self.urgent_beta = model, quantile_urgent, urgent_beta
        self._mean = dict(prior)  # robot type -> tokens of a skill-bearing segment (EWMA)
        self.learned = PlanLengths(prior, max_keys=max_keys)

    def mean(self, robot_type: str) -> float:
        """The running mean (the ``ewma`` model's estimate) of this robot type's skill-bearing segments."""
        return self._mean.get(robot_type, 8.0)

    def estimate(self, g: Generation) -> None:
        """Set ``g``'s next-segment and remaining token estimates for the segment it writes next."""
        if self.model == "ewma":
            g.tok_est = g.rem_tok_est = self.mean(g.robot_type)
            return
        p = self.learned.predict(g.spec, len(g.segments))
        q = self.quantile_urgent if g.tuf.beta >= self.urgent_beta else 0.5
        g.tok_est, g.rem_tok_est = p.seg_quantile(q), p.rem_quantile(q)

    def observe_segment(self, g: Generation, index: int, tokens: int, has_calls: bool) -> None:
        """``g`` wrote segment ``index`` of ``tokens`` tokens (with skill calls or not); its estimates follow."""
        if not tokens:
            return
        rt = g.robot_type
        if has_calls:
            self._mean[rt] = 0.9 * self._mean.get(rt, tokens) + 0.1 * tokens
            if self.model == "ewma":
                g.tok_est = g.rem_tok_est = self._mean[rt]
        # the learned model counts every segment (a closer such as '};' takes its steps too), by its index
        self.learned.observe_segment(g.spec, index, tokens)
        if self.model == "learned":
            self.estimate(g)

    def observe_plan(self, spec: TaskSpec, seg_tokens: list[int]) -> None:
        """A complete plan: how long plans of its task are."""
        self.learned.observe_plan(spec, seg_tokens)
