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
PRIOR_PREFILL_TOKENS = 32  # weight of the prior prefill cost, in tokens: one real prompt outweighs it


class LatencyEstimator:
    """Engine step time, learned online from step reports for whichever engine runs.

    Model: ``step(b, p) = decode(b) + p * prefill_s_per_token`` with ``decode(b) = a + c * (b - 1)``.
    Decode: each batch size keeps an exponential moving average of its pure-decode steps (no
    prefill in the step), and a weighted least-squares line through them gives unseen sizes (with one
    size seen, the prior's relative slope through it).
    Prefill: a step with prefill tokens leaves ``duration - decode(b)`` as their cost; the cost per
    token is the token-weighted ratio over the last :data:`PREFILL_WINDOW` such steps, plus the
    prior as :data:`PRIOR_PREFILL_TOKENS` pseudo-tokens. Decode learns only from steps without
    prefill: a wrong prefill figure would otherwise leak into it (a 300-token CPU prefill costs
    0.6 s, thirteen decode steps). Starts from the engine's fitted step model where it has one
    (:meth:`for_engine`), else the paper's GPU figures; ``source`` says which.
    """

    def __init__(self, decode_s: float = 0.022, slope_s: float = 0.0005,
                 prefill_s_per_token: float = 0.328 / 2884, ewma: float = 0.2, max_batch: int = 256,
                 source: str = PAPER_PRIOR) -> None:
        if decode_s <= 0 or slope_s < 0 or prefill_s_per_token < 0 or not 0 < ewma <= 1:
            raise ValueError("LatencyEstimator: decode_s > 0, slope_s >= 0, prefill_s_per_token >= 0, 0 < ewma <= 1")
        self.source = source
        self.prefill_s_per_token = prefill_s_per_token
        self._prefill_prior = prefill_s_per_token
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
        self.prefill_s_per_token = self._prefill_prior = s_per_token
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
            tokens = sum(t for t, _ in self._prefill) + PRIOR_PREFILL_TOKENS
            cost = sum(c for _, c in self._prefill) + PRIOR_PREFILL_TOKENS * self._prefill_prior
            self.prefill_s_per_token = max(0.0, cost / tokens)
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
                "prefill_ms_per_token": self.prefill_s_per_token * 1e3, "decode_samples": self.decode_samples,
                "prefill_samples": len(self._prefill)}
