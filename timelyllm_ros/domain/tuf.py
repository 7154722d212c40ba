"""Time-utility functions (design §3).

    TUF_0(t) = min(beta, alpha * (t - ERT) + beta)     first segment, t = response time
    TUF_1(t) = min(beta, alpha * max(t, 0) + beta)     later segments (ERT = 0)

A segment's deadline (:meth:`TimeUtility.deadline`) is when it must start executing to keep
the full utility: arrival + ERT for s_0, the end of s_{k-1} after; every layer asks the TUF
for it instead of writing the rule out.

Utility is deliberately not clamped at 0: past the cutoff it is negative, so
a late answer costs something and the PUD priority of a hopeless segment is
negative (it goes last instead of being dropped).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TimeUtility:
    alpha: float  # slope after ERT (< 0), utility per second of lateness
    beta: float  # maximum utility (> 0)
    ert: float  # expected response time of the first segment, seconds (>= 0)
    level: str = "custom"

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "ert"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"TimeUtility.{name} must be a finite number, got {v!r}")
        if self.beta <= 0:
            raise ValueError(f"TimeUtility.beta must be > 0, got {self.beta}")
        if self.alpha >= 0:
            raise ValueError(f"TimeUtility.alpha must be < 0 (utility falls with lateness), got {self.alpha}")
        if self.ert < 0:
            raise ValueError(f"TimeUtility.ert must be >= 0, got {self.ert}")

    def tuf0(self, t: float) -> float:
        """Utility of the first segment with response time ``t``."""
        return min(self.beta, self.alpha * (t - self.ert) + self.beta)

    def tuf1(self, t: float) -> float:
        """Utility of a later segment with waiting time ``t``."""
        return min(self.beta, self.alpha * max(t, 0.0) + self.beta)

    def deadline(self, k: int, arrival: float, prev_end: float = math.nan) -> float:
        """When segment ``k`` must start executing to keep the full utility ``beta`` (the one deadline
        rule; design §4, L(s_k)): ``arrival + ERT`` for s_0, the (predicted or reported) execution end
        of s_{k-1} for k > 0, which is where W(s_k) starts counting."""
        return arrival + self.ert if k == 0 else prev_end

    def utility(self, k: int, wait: float) -> float:
        """Segment ``k``'s term of the objective (paper Eq. 3): TUF_0(W(s_0)) for the first segment
        (``wait`` = response time, from arrival), TUF_1(W(s_k)) after (``wait`` from the end of s_{k-1})."""
        return self.tuf0(wait) if k == 0 else self.tuf1(wait)

    @property
    def cutoff(self) -> float:
        """Response time at which TUF_0 reaches 0."""
        return self.ert - self.beta / self.alpha

    def to_trace(self) -> list[float]:
        return [self.beta, self.ert, self.cutoff]

    @classmethod
    def from_trace(cls, tuf: Sequence[float], level: str | None = None) -> TimeUtility:
        """Build from an LRTrace ``[beta, ERT, cutoff]`` triple; alpha = beta / (ERT - cutoff)."""
        if len(tuf) != 3:
            raise ValueError(f"trace TUF must be [beta, ERT, cutoff], got {tuf!r}")
        beta, ert, cutoff = (float(x) for x in tuf)
        if not (math.isfinite(cutoff) and cutoff > ert):
            raise ValueError(f"trace TUF cutoff must be finite and > ERT, got {tuf!r}")
        if level is None:
            level = next((n for n, lv in LEVELS.items()
                          if math.isclose(lv.beta, beta) and math.isclose(lv.ert, ert)
                          and math.isclose(lv.cutoff, cutoff, rel_tol=1e-3)), "custom")
        return cls(alpha=beta / (ert - cutoff), beta=beta, ert=ert, level=level)

    @classmethod
    def named(cls, level: str) -> TimeUtility:
        try:
            return LEVELS[level]
        except KeyError:
            raise ValueError(f"unknown urgency level {level!r}; known: {sorted(LEVELS)}") from None



@dataclass(frozen=True, slots=True)
class TufRequest:
    """A TimeUtility as a request gives it: a named ``level`` (fields left at 0 take the level's values) or custom
    alpha/beta/ert. Kept as given, since a retry matches its first request on these fields, not on what they
    resolve to."""

    level: str = ""
    alpha: float = 0.0
    beta: float = 0.0
    ert: float = 0.0

    def resolve(self) -> TimeUtility:
        """The TimeUtility asked for; ValueError naming the field on bad input (NaN, wrong sign, unknown level, out
        of :data:`REQUEST_RANGES`)."""
        for name in ("alpha", "beta", "ert"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"tuf.{name} must be a finite number, got {getattr(self, name)}")
        level = self.level.strip()
        if level:
            if level not in LEVELS:
                raise ValueError(f"tuf.level: unknown urgency level {level!r}; known: {sorted(LEVELS)} or '' for "
                                 "custom")
            base = LEVELS[level]
            tu = TimeUtility(alpha=self.alpha or base.alpha, beta=self.beta or base.beta, ert=self.ert or base.ert,
                             level=level)
        else:
            try:
                tu = TimeUtility(alpha=self.alpha, beta=self.beta, ert=self.ert, level="custom")
            except ValueError as e:
                raise ValueError(f"tuf: {e} (or set tuf.level to one of {sorted(LEVELS)})") from None
        for name, (lo, hi, unit) in REQUEST_RANGES.items():
            v = getattr(tu, name)
            if not lo <= v <= hi:
                raise ValueError(f"tuf.{name} must be in [{lo:g}, {hi:g}]{unit}, got {v:g}")
        return tu


# What a request may ask for, (min, max, unit) inclusive. A TUF far outside them is a mistake or an attack: beta =
# 1e308 or alpha = -1e-300 overflow the utility and priority arithmetic (a sum over tasks, a division by G * L).
# The named levels sit well inside; so do the traces' TUFs (0.2-1 s ERTs, betas of 1-2, slopes of -2 to -6.7 /s).
REQUEST_RANGES: dict[str, tuple[float, float, str]] = {
    "alpha": (-1e4, -1e-6, " utility/s"),
    "beta": (1e-3, 1e3, ""),
    "ert": (0.0, 3600.0, " s"),
}

# Named urgency levels (design §3): normal 0 at 1.5 s, urgent 0 at 0.5 s.
LEVELS: dict[str, TimeUtility] = {
    "normal": TimeUtility(alpha=-2.0, beta=1.0, ert=1.0, level="normal"),
    "urgent": TimeUtility(alpha=-2.0 / 0.3, beta=2.0, ert=0.2, level="urgent"),
}
