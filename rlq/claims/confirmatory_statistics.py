"""The confirmatory test of a claim: a one-sided t bound on one number per seed, its power and its seed count.

Each seed (or seed pair) gives one value: a paired difference, a paired percent change or one arm's own
value. With ``n`` values of mean ``m`` and standard deviation ``s`` the one-sided 95% bounds are
``m -/+ t(0.95, n - 1) s / sqrt(n)``: the Student t interval, whose coverage on normal data is exact at every
``n`` (a percentile bootstrap of 5 values covers about 90%, see docs/claims.md). A claim "value >= threshold"
**holds** when the lower bound clears the threshold, **does not hold** when the upper bound lies below it
and is **inconclusive** otherwise; a claim "value <= threshold" mirrors it. "No reward drop" is a
non-inferiority test: the threshold is minus the registered margin.

Power (:func:`power`) is the probability that the bound clears the threshold when the true mean lies
``distance`` beyond it on the claim's side, from the noncentral t distribution; :func:`seeds_for_power` is
the least ``n`` reaching a target power.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
"""Each one-sided bound's confidence."""
TARGET_POWER = 0.8
"""The power a registered seed count must reach."""


@dataclass(frozen=True)
class OneSidedBounds:
    """The mean of ``n`` per-seed values with its one-sided lower and upper 95% bounds."""

    mean: float
    lower: float
    upper: float
    n: int
    sd: float


def t_bounds(values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> OneSidedBounds:
    """Return the mean of ``values`` and its one-sided t bounds; equal values give bounds on the mean."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or len(x) < 2:
        raise ValueError(f"a t bound needs 2 or more values, got {len(x) if x.ndim == 1 else x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"a t bound needs finite values, got {x.tolist()}")
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    half = float(stats.t.ppf(confidence, len(x) - 1)) * sd / math.sqrt(len(x))
    return OneSidedBounds(mean, mean - half, mean + half, len(x), sd)


def outcome(bounds: OneSidedBounds, direction: str, threshold: float) -> str:
    """Return ``holds``, ``does not hold`` or ``inconclusive`` for the claim ``value <direction> threshold``."""
    if direction == ">=":
        clear, against = bounds.lower >= threshold, bounds.upper < threshold
    elif direction == "<=":
        clear, against = bounds.upper <= threshold, bounds.lower > threshold
    else:
        raise ValueError(f"direction must be '>=' or '<=', got {direction!r}")
    return "holds" if clear else "does not hold" if against else "inconclusive"


def power(n: int, sd: float, distance: float, confidence: float = CONFIDENCE) -> float:
    """Return the probability that ``n`` values of spread ``sd`` whose true mean lies ``distance`` on the
    claim's side of the threshold give a bound that clears it (noncentral t)."""
    if n < 2:
        raise ValueError(f"power needs n >= 2, got {n}")
    if sd <= 0:
        return 1.0 if distance > 0 else 0.0
    critical = stats.t.ppf(confidence, n - 1)
    return float(stats.nct.sf(critical, n - 1, distance * math.sqrt(n) / sd))


def seeds_for_power(
    sd: float, distance: float, target: float = TARGET_POWER, max_n: int = 20, min_n: int = 5
) -> int | None:
    """Return the least ``n`` from ``min_n`` to ``max_n`` whose :func:`power` reaches ``target``, else None."""
    for n in range(min_n, max_n + 1):
        if power(n, sd, distance) >= target:
            return n
    return None


def coverage(n: int, draws: int = 20_000, seed: int = 0, confidence: float = CONFIDENCE) -> float:
    """Return how often the one-sided lower bound of ``n`` standard normal values lies below their true mean,
    over ``draws`` simulated data sets (the procedure's coverage at ``n``)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((draws, n))
    half = stats.t.ppf(confidence, n - 1) * x.std(axis=1, ddof=1) / math.sqrt(n)
    return float(np.mean(x.mean(axis=1) - half <= 0.0))
