"""The online estimate of an engine's step time (decode per batch size, prefill per token).

It belongs to the engine it measures: the scheduler's admission and ranking plan with it
(planner/admission.py), and an engine pool keeps one per member (engines/pool.py).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from timelyllm_ros.engines.base import Engine, StepModel


PAPER_PRIOR = "paper prior (Table 1, Llama-3-8B on an A100)"
PREFILL_WINDOW = 64  # prefill samples kept (bounded; old ones age out, so a changed engine is followed)
# The prior prefill cost as two pseudo-samples at these prompt sizes (uncached tokens), each of this weight against
# one per real step: one real prompt outweighs the prior (~36 tokens' worth, where the sizes are too alike to fit)
PRIOR_PREFILL_SIZES = (16.0, 128.0)
PRIOR_PREFILL_WEIGHT = 0.25
CALIBRATION_WEIGHT = 3  # decode samples a calibrated batch size counts as (step_time answers its level from 3 on)


class LatencyEstimator:
    """Engine step time, learned online from step reports for whichever engine runs.

    Model: ``step(b, p) = decode(b) + [p > 0] * prefill_step_s + p * prefill_s_per_token`` with
    ``decode(b) = a + c * (b - 1)`` per generated token.
    Decode: each batch size keeps an exponential moving average of its pure-decode steps (no
    prefill in the step), and a weighted least-squares line through them gives unseen sizes (with one
    size seen, the prior's relative slope through it).
    Prefill: a step with prefill tokens leaves ``duration - decode(b)`` as their cost. Its two terms are a
    fixed cost of a step that prefills at all (``prefill_step_s``) and a cost per uncached prompt token
    (``prefill_s_per_token``), fitted by least squares over the last :data:`PREFILL_WINDOW` such steps with
    the prior as pseudo-samples (:data:`PRIOR_PREFILL_WEIGHT` each, at :data:`PRIOR_PREFILL_SIZES`); with too
    little spread in the sizes seen the prior's fixed cost stays and the rest is per token. Why two terms: on a
    CPU a step that prefills a few tokens behind a cached prefix costs ~30 ms more than a decode step, and
    each further token ~1.5 ms (bench/results/engine_cpu), so a prompt that joins a step already prefilling
    costs its tokens only (:meth:`prefill_join_time`), one that turns a decode step into a prefill step
    also the fixed cost (:meth:`prefill_time`). Decode learns only from steps without
    prefill: a wrong prefill figure would otherwise leak into it (a 300-token CPU prefill costs
    0.6 s, thirteen decode steps). Starts from the engine's fitted step model where it has one
    (:meth:`for_engine`), else the paper's GPU figures; ``source`` says which. :meth:`calibrate` replaces the
    start with what the planner's warm-up measured on this machine.
    """

    def __init__(self, decode_s: float = 0.022, slope_s: float = 0.0005,
                 prefill_s_per_token: float = 0.328 / 2884, ewma: float = 0.2, max_batch: int = 256,
                 source: str = PAPER_PRIOR, prefill_step_s: float = 0.0) -> None:
        if decode_s <= 0 or slope_s < 0 or prefill_s_per_token < 0 or prefill_step_s < 0 or not 0 < ewma <= 1:
            raise ValueError("LatencyEstimator: decode_s > 0, slope_s >= 0, prefill_s_per_token >= 0, "
                             "prefill_step_s >= 0, 0 < ewma <= 1")
        self.source = source
        self.prefill_s_per_token = prefill_s_per_token
        self.prefill_step_s = prefill_step_s
        self._prefill_prior = (prefill_step_s, prefill_s_per_token)
        self._prefill: deque[tuple[int, float]] = deque(maxlen=PREFILL_WINDOW)  # (tokens, their cost s)
        self._ewma = ewma
        self._avg = [0.0] * (max_batch + 2)
        self._n = [0] * (max_batch + 2)
        self._samples = 0  # sum(self._n): placement asks for it per member and candidate
        self._a, self._c = decode_s, slope_s
        self._prior = (decode_s, slope_s)
        self._dirty = 0

    def restart_prefill(self, s_per_token: float) -> None:
        """Start the prefill estimate over from this prior, forgetting what was learned (a test's wrong start;
        an operator who knows the engine changed)."""
        if not s_per_token >= 0:
            raise ValueError(f"prefill s_per_token must be >= 0, got {s_per_token!r}")
        self.prefill_s_per_token, self.prefill_step_s = s_per_token, 0.0
        self._prefill_prior = (0.0, s_per_token)
        self._prefill.clear()

    @classmethod
    def from_step_model(cls, model: StepModel, **kw: Any) -> LatencyEstimator:
        return cls(decode_s=model.decode_s, slope_s=model.decode_s * model.batch_slowdown,
                   prefill_s_per_token=model.prefill_s_per_token, source=model.source, **kw)

    @classmethod
    def for_engine(cls, engine: Engine, **kw: Any) -> LatencyEstimator:
        """The engine's own estimate where it keeps one (an engine pool: one per member, see
        :meth:`Engine.latency_estimator`), else one seeded from its declared step model
        (``EngineInfo.step_model``) if it has one."""
        own = engine.latency_estimator()
        if own is not None:
            return own
        model = engine.info.step_model
        return cls.from_step_model(model, **kw) if model is not None else cls(**kw)

    def for_replaced_engine(self, engine: Engine) -> LatencyEstimator:
        """The estimate to keep when the core's engine is replaced (rebuilt after a crash): this one (the same
        model: what it learned still holds), unless the new engine keeps its own."""
        own = engine.latency_estimator()
        return own if own is not None else self

    def observe(self, batch: int, duration_s: float, prefill_tokens: int = 0) -> None:
        if batch <= 0 or batch >= len(self._avg) or duration_s <= 0:
            return
        if prefill_tokens > 0:
            self._prefill.append((prefill_tokens, duration_s - self.step_time(batch)))
            self._refit_prefill()
            return
        if self._n[batch] == 0:
            self._avg[batch] = duration_s
        else:
            self._avg[batch] += self._ewma * (duration_s - self._avg[batch])
        self._n[batch] += 1
        self._samples += 1
        self._dirty += 1
        if self._dirty >= 8:
            self._refit()

    def _refit_prefill(self) -> None:
        """Weighted least squares of cost = step + tokens * per_token over the window and the prior's two
        pseudo-samples."""
        f0, r0 = self._prefill_prior
        w0 = PRIOR_PREFILL_WEIGHT
        pts = [(float(t), c, 1.0) for t, c in self._prefill]
        pts += [(x, f0 + r0 * x, w0) for x in PRIOR_PREFILL_SIZES]
        sw = sum(w for *_, w in pts)
        mx = sum(x * w for x, _, w in pts) / sw
        my = sum(y * w for _, y, w in pts) / sw
        sxx = sum(w * (x - mx) ** 2 for x, _, w in pts)
        seen = [t for t, _ in self._prefill]
        if len(seen) >= 4 and max(seen) >= 2 * min(seen) and sxx > 0:
            rate = sum(w * (x - mx) * (y - my) for x, y, w in pts) / sxx
            rate = max(0.0, rate)
            step = max(0.0, my - rate * mx)
        else:  # too little spread to tell the two terms apart: the prior's fixed cost, the rest per token
            step = f0
            tokens = sum(x * w for x, _, w in pts)
            rate = max(0.0, sum((y - step) * w for _, y, w in pts) / tokens) if tokens > 0 else r0
        self.prefill_step_s, self.prefill_s_per_token = step, rate

    def calibrate(self, decode_s: dict[int, float], prefill_step_s: float, prefill_s_per_token: float,
                  source: str) -> None:
        """Start again from figures measured on this engine (the planner's warm-up, planner/warmup.py): decode
        time per token at each batch size measured (at least one), and the two prefill terms. What was
        learned before is forgotten; these count as a few samples, so the engine's own steps take over."""
        if not decode_s or any(b < 1 or not t > 0 for b, t in decode_s.items()):
            raise ValueError(f"calibrate: decode times per batch size must be > 0, got {decode_s!r}")
        if not prefill_step_s >= 0 or not prefill_s_per_token >= 0:
            raise ValueError("calibrate: prefill_step_s and prefill_s_per_token must be >= 0")
        self.source = source
        self.prefill_step_s, self.prefill_s_per_token = prefill_step_s, prefill_s_per_token
        self._prefill_prior = (prefill_step_s, prefill_s_per_token)
        self._prefill.clear()
        self._avg = [0.0] * len(self._avg)
        self._n = [0] * len(self._n)
        self._samples = 0
        sizes = sorted(b for b in decode_s if b < len(self._avg))
        for b in sizes:
            self._avg[b], self._n[b] = decode_s[b], CALIBRATION_WEIGHT
        self._samples = CALIBRATION_WEIGHT * len(sizes)
        if len(sizes) == 1:  # one size: its level with the slope the prior had, relative to its level
            a0, c0 = self._prior
            b = sizes[0]
            self._prior = (decode_s[b], c0 * decode_s[b] / (a0 + c0 * (b - 1)))
        self._refit()
        self._prior = (self._a, self._c)

    def _refit(self) -> None:
        self._dirty = 0
        pts = [(b, self._avg[b], min(self._n[b], 50)) for b in range(1, len(self._n)) if self._n[b]]
        a0, c0 = self._prior
        if len(pts) < 2:  # one batch size seen: its level, the prior's slope (relative to the prior's level)
            b, y, _ = pts[0]
            self._c = c0 * y / (a0 + c0 * (b - 1))
            self._a = max(1e-6, y - self._c * (b - 1))
            return
        sw = sum(w for *_, w in pts)
        mx = sum(b * w for b, _, w in pts) / sw
        my = sum(y * w for _, y, w in pts) / sw
        sxx = sum(w * (b - mx) ** 2 for b, _, w in pts)
        c = sum(w * (b - mx) * (y - my) for b, y, w in pts) / sxx if sxx > 0 else c0
        c = max(0.0, c)
        self._c = c
        self._a = max(1e-6, my - c * (mx - 1))

    def step_time(self, batch: int) -> float:
        """Estimated decode time per token for each generation in a batch of ``batch``."""
        b = max(1, batch)
        if b < len(self._n) and self._n[b] >= 3:
            return self._avg[b]
        return self._a + self._c * (b - 1)

    def prefill_time(self, tokens: int) -> float:
        """A new prompt of ``tokens`` uncached tokens prefilled in a step that would otherwise only decode."""
        return self.prefill_step_s + tokens * self.prefill_s_per_token if tokens > 0 else 0.0

    def prefill_join_time(self, tokens: int) -> float:
        """The same prompt joining a step that prefills anyway: its tokens only."""
        return tokens * self.prefill_s_per_token

    @property
    def decode_samples(self) -> int:
        """Decode steps learned from so far (0: still the seed)."""
        return self._samples

    def samples_at(self, batch: int) -> int:
        """Decode steps of batch size ``batch`` learned from (from 3 on, :meth:`step_time` answers their average)."""
        return self._n[batch] if 0 <= batch < len(self._n) else 0

    def describe(self) -> dict[str, Any]:
        """What the estimate is now and where it started (results files and /engine_state state it)."""
        return {"seed": self.source, "decode_ms_b1": self.step_time(1) * 1e3, "decode_slope_ms": self._c * 1e3,
                "prefill_ms_per_token": self.prefill_s_per_token * 1e3, "prefill_step_ms": self.prefill_step_s * 1e3,
                "decode_samples": self.decode_samples, "prefill_samples": len(self._prefill)}
