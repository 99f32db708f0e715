"""Statistics over seeds with rliable (Agarwal et al., 2021): IQM, mean and median with bootstrap intervals.

A claim rests on seeds, not on one run. Every function here takes the scores of several runs (seeds) and
returns a point estimate with its 95% interval from rliable's stratified bootstrap (percentile intervals):
``scores`` of shape ``(runs,)`` or ``(runs, tasks)``; with tasks, runs are resampled within each task.

rliable draws its bootstrap indices from NumPy's global random state. Each call here seeds it with ``seed``
and restores the state it found afterwards, so results are reproducible and callers' random streams are left
alone. With one run there is nothing to resample: the interval collapses onto the point::

    from rlq.stats import estimate
    estimate([812.0, 905.0, 770.0, 1010.0, 640.0]).as_dict("return")   # IQM, lower, upper, n
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "METRICS",
    "MIN_SEEDS",
    "Estimate",
    "as_records",
    "as_score_matrix",
    "estimate",
    "estimates_by",
    "interval_estimates",
    "paired_percent_drop",
    "percent_change",
    "probability_of_improvement",
]

METRICS = ("iqm", "mean", "median")
"""Aggregate metrics rliable computes over runs (and tasks): interquartile mean, mean, median."""

MIN_SEEDS = 5
"""Fewer seeds than this make no claim hold or fail; a claim may need more (``min_seeds`` in ``data/claims.csv``)."""


@dataclass(frozen=True)
class Estimate:
    """A point estimate over ``n`` runs with its interval ``[lower, upper]``."""

    value: float
    lower: float
    upper: float
    n: int

    def as_dict(self, unit: str | None = None) -> dict[str, Any]:
        """Return the estimate as the dict notebooks record under ``results.json``'s ``estimates``."""
        out: dict[str, Any] = {"value": self.value, "lower": self.lower, "upper": self.upper, "n": self.n}
        if unit is not None:
            out["unit"] = unit
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Estimate:
        """Return the estimate recorded as ``{"value", "lower", "upper", "n"}`` (``n`` may be absent: 1)."""
        try:
            value, lower, upper = (float(data[k]) for k in ("value", "lower", "upper"))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"an estimate needs numeric value, lower and upper, got {dict(data)!r}") from err
        return cls(value, lower, upper, int(data.get("n") or 1))


def _aggregate(metric: str) -> Callable[[np.ndarray], float]:
    from rliable import metrics as rly_metrics

    functions = {
        "iqm": rly_metrics.aggregate_iqm,
        "mean": rly_metrics.aggregate_mean,
        "median": rly_metrics.aggregate_median,
    }
    if metric not in functions:
        raise ValueError(f"unknown metric {metric!r}; choose from {', '.join(functions)}")
    return functions[metric]


def as_score_matrix(scores: Sequence[float] | np.ndarray, what: str = "scores") -> np.ndarray:
    """Return ``scores`` as a finite float array of shape ``(runs, tasks)`` (a 1-D input is one task)."""
    array = np.asarray(scores, dtype=float)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(
            f"{what} must have shape (runs,) or (runs, tasks) with at least one run, got {array.shape}"
        )
    if not np.isfinite(array).all():
        raise ValueError(
            f"{what} must be finite numbers (drop runs that produced no score), got {array.tolist()}"
        )
    return array


@contextmanager
def _numpy_seed(seed: int) -> Iterator[None]:
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def _check_options(reps: int, confidence: float) -> None:
    if not isinstance(reps, (int, np.integer)) or isinstance(reps, bool) or reps < 1:
        raise ValueError(f"reps must be a positive integer, got {reps!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}")


def _bootstrap(
    arrays: tuple[np.ndarray, ...], func: Callable[..., float], reps: int, confidence: float, seed: int
) -> tuple[float, float, float]:
    """Return ``func``'s point value and rliable's percentile interval over a stratified bootstrap of ``arrays``."""
    from rliable import library as rly

    _check_options(reps, confidence)
    if all(a.shape[0] == 1 for a in arrays):  # one run each: nothing to resample
        value = float(func(*arrays))
        return value, value, value
    data: Any = arrays[0] if len(arrays) == 1 else list(arrays)
    with _numpy_seed(seed):
        points, intervals = rly.get_interval_estimates(
            {"x": data}, lambda *a: np.array([func(*a)]), reps=reps, confidence_interval_size=confidence
        )
    return float(points["x"][0]), float(intervals["x"][0, 0]), float(intervals["x"][1, 0])


def estimate(
    scores: Sequence[float] | np.ndarray,
    metric: str = "iqm",
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """Return ``metric`` (iqm, mean or median) of ``scores`` over runs with its bootstrap interval."""
    array = as_score_matrix(scores)
    value, lower, upper = _bootstrap((array,), _aggregate(metric), reps, confidence, seed)
    return Estimate(value, lower, upper, array.shape[0])


def interval_estimates(
    scores: Mapping[str, Sequence[float] | np.ndarray],
    metrics: Sequence[str] = METRICS,
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Return one row per method and metric: ``method, metric, value, lower, upper, n`` (n: runs).

    ``scores`` maps a method name to its scores, shape ``(runs,)`` or ``(runs, tasks)``; every method and
    metric is bootstrapped from the same ``seed``.
    """
    if not scores:
        raise ValueError("scores holds no method")
    rows = []
    for method, values in scores.items():
        array = as_score_matrix(values, f"scores of {method!r}")
        for metric in metrics:
            value, lower, upper = _bootstrap((array,), _aggregate(metric), reps, confidence, seed)
            rows.append(
                {
                    "method": method,
                    "metric": metric,
                    "value": value,
                    "lower": lower,
                    "upper": upper,
                    "n": array.shape[0],
                }
            )
    return pd.DataFrame(rows, columns=["method", "metric", "value", "lower", "upper", "n"])


def probability_of_improvement(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Return P(X > Y) (ties count half, averaged over tasks) with its interval, X and Y resampled independently."""
    from rliable import metrics as rly_metrics

    a, b = as_score_matrix(x, "x"), as_score_matrix(y, "y")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"x and y must cover the same tasks, got {a.shape[1]} and {b.shape[1]}")
    return _bootstrap((a, b), rly_metrics.probability_of_improvement, reps, confidence, seed)


def percent_change(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    metric: str = "iqm",
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """Return 100 * (m(x) - m(y)) / |m(y)| in %, m the ``metric``, with its interval (x, y resampled independently).

    ``n`` is the smaller run count of the two. A resample where m(y) is 0 has no scale: NaN, and a NaN interval
    bound when such resamples reach the percentile.
    """
    a, b = as_score_matrix(x, "x"), as_score_matrix(y, "y")
    aggregate = _aggregate(metric)

    def change(xs: np.ndarray, ys: np.ndarray) -> float:
        base = aggregate(ys)
        return math.nan if base == 0 else 100.0 * (aggregate(xs) - base) / abs(base)

    value, lower, upper = _bootstrap((a, b), change, reps, confidence, seed)
    return Estimate(value, lower, upper, min(a.shape[0], b.shape[0]))


def estimates_by(
    frame: pd.DataFrame, column: str, by: str = "method", metric: str = "iqm", **options: Any
) -> pd.DataFrame:
    """Return :func:`interval_estimates` of ``frame[column]`` per ``by`` group (one row per run), in group order."""
    missing = [c for c in (column, by) if c not in frame.columns]
    if missing:
        raise ValueError(f"no column {missing} in the table; it has {list(frame.columns)}")
    scores = {str(k): g[column].dropna().to_numpy() for k, g in frame.groupby(by, sort=False)}
    scores = {k: v for k, v in scores.items() if len(v)}
    return (
        interval_estimates(scores, metrics=(metric,), **options)
        if scores
        else pd.DataFrame(columns=["method", "metric", "value", "lower", "upper", "n"])
    )


def as_records(table: pd.DataFrame, prefix: str = "", unit: str | None = None) -> dict[str, dict[str, Any]]:
    """Return :func:`interval_estimates`' rows as ``{prefix + method: estimate dict}``, what ``rlq.record(estimates=...)`` takes."""
    return {
        f"{prefix}{row.method}": Estimate(
            float(row.value), float(row.lower), float(row.upper), int(row.n)
        ).as_dict(unit)
        for row in table.itertuples()
    }


def paired_percent_drop(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    metric: str = "iqm",
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """Return 100 * (m(y) - m(x)) / |m(y)|, the drop of ``x`` below ``y`` in %, with a paired bootstrap interval.

    ``x[i]`` and ``y[i]`` are runs of the same seed (GST and dense, int8 and fp32): each resample draws seed
    indices once and takes both runs of every seed drawn, so what the seeds share (a hard seed is hard for
    both) stays out of the interval. Percentile interval, ``reps`` resamples from NumPy's generator seeded with
    ``seed``. A resample where m(y) is 0 has no scale and counts as NaN. ``n`` is the number of pairs.
    """
    a, b = (np.asarray(v, dtype=float).ravel() for v in (x, y))
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"x and y must be paired runs of equal, non-zero length, got {a.size} and {b.size}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("x and y must be finite numbers (drop the pairs that produced no score)")
    _check_options(reps, confidence)
    _aggregate(metric)  # an unknown metric is refused by name
    from scipy.stats import trim_mean

    rows = {  # rliable's aggregates, one per row of resamples
        "iqm": lambda m: trim_mean(m, proportiontocut=0.25, axis=1),
        "mean": lambda m: np.mean(m, axis=1),
        "median": lambda m: np.median(m, axis=1),
    }[metric]

    def drop(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
        base = rows(ys)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(base == 0, np.nan, 100.0 * (base - rows(xs)) / np.abs(base))

    value = float(drop(a[None, :], b[None, :])[0])
    if a.size == 1:
        return Estimate(value, value, value, 1)
    indices = np.random.default_rng(seed).integers(0, a.size, size=(reps, a.size))
    draws = drop(a[indices], b[indices])
    tail = 100.0 * (1.0 - confidence) / 2.0
    lower, upper = (
        np.nanpercentile(draws, [tail, 100.0 - tail]) if np.isfinite(draws).any() else (np.nan,) * 2
    )
    return Estimate(float(value), float(lower), float(upper), int(a.size))
