"""Our number for a claim, computed from a run's own table exactly as the claims specification says.

:func:`measure` reads the table a spec row names (``summary.csv``, ``convergence_runs.csv``) from a run folder
or a published result, keeps its ``rows``, and estimates the spec's metric over seeds with the spec's
estimator. A notebook records the same number under the spec's ``estimate`` name (:func:`spec_estimates`), and
a test holds every published run's recorded estimate to this computation.

Estimators (``scale`` multiplies the column first; ``m`` is the claim's method, ``r`` its reference):

- ``iqm``: IQM over seeds of ``m``'s column.
- ``paired_difference``: IQM of ``m - r`` per seed; a reference that is the same on every seed it ran (a fixed
  schedule) pairs with every seed of ``m``.
- ``paired_difference_common``: IQM of ``m - r`` over the seeds both ran; ``paired_difference_neg``: of ``r - m``.
- ``paired_iqm_drop``: 100 (IQM(r) - IQM(m)) / |IQM(r)| with seeds resampled in pairs
  (:func:`rlq.experiments.stats.paired_percent_drop`); ``unpaired_iqm_drop``: the same, each method
  resampled on its own (minus :func:`rlq.experiments.stats.percent_change`).
- ``paired_change_pct``: IQM over pairs of 100 (m - r) / |r|; ``paired_ratio``: IQM over pairs of r / m.
- ``recorded``: the estimate the notebook recorded (tables too involved to restate here: PTQ, QAT, speedups).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlq import stats
from rlq.claims.spec import ClaimSpec, claim_specs
from rlq.experiments.results import normalize_method_names
from rlq.stats import Estimate

PAIR_KEYS = ("env_id", "task", "seed")
"""Columns that pair two runs: the same task and seed."""


@dataclass(frozen=True)
class Measurement:
    """A claim's estimate over seeds, and what the seeds' values say about it."""

    estimate: Estimate
    by_design: bool
    """Every seed gave the same value: a fixed schedule, not a quantity that varies over seeds."""
    at_ceiling: bool
    """Method and reference sit at the task's maximum score on every seed (the claim cannot fail)."""


def _rows(spec: ClaimSpec, table: pd.DataFrame) -> pd.DataFrame:
    for key, value in spec.rows:
        if key not in table.columns:
            raise ValueError(f"claim {spec.key}: its table has no column {key!r} to keep rows {key}={value}")
        table = table[table[key].astype(str) == value]
    return table


def _arm(spec: ClaimSpec, table: pd.DataFrame, name: str) -> pd.Series:
    """Return the ``spec.column`` of arm ``name`` (method or precision) indexed by the pairing keys, scaled."""
    if spec.by not in table.columns or spec.column not in table.columns:
        raise ValueError(f"claim {spec.key}: its table needs the columns {spec.by!r} and {spec.column!r}")
    keys = [k for k in PAIR_KEYS if k in table.columns]
    rows = table[table[spec.by].astype(str) == name]
    values = pd.to_numeric(rows.set_index(keys)[spec.column], errors="coerce") * spec.scale
    return values[np.isfinite(values.to_numpy(dtype=float))]


def _same(values: np.ndarray) -> bool:
    return len(values) >= 2 and bool(np.all(values == values[0]))


def _paired(m: pd.Series, r: pd.Series, broadcast: bool) -> tuple[np.ndarray, np.ndarray]:
    if broadcast and len(r) and _same(r.to_numpy()):  # a fixed schedule: its value on every seed of m
        return m.to_numpy(dtype=float), np.full(len(m), float(r.iloc[0]))
    both = pd.concat([m.rename("m"), r.rename("r")], axis=1, join="inner").dropna()
    return both["m"].to_numpy(dtype=float), both["r"].to_numpy(dtype=float)


_PER_PAIR = {
    "paired_difference": lambda x, y: x - y,
    "paired_difference_common": lambda x, y: x - y,
    "paired_difference_neg": lambda x, y: y - x,
    "paired_change_pct": lambda x, y: 100.0 * (x - y) / np.abs(y),
    "paired_ratio": lambda x, y: y / x,
}
"""The per-pair value each paired estimator summarizes, from the method's ``x`` and the reference's ``y``."""
_DROPS = ("paired_iqm_drop", "unpaired_iqm_drop")


def _drop(estimator: str, x: np.ndarray, y: np.ndarray, options: dict[str, Any]) -> Estimate:
    """Return the drop of ``x``'s IQM below ``y``'s, in % of ``y``'s (seeds resampled in pairs or apart)."""
    if estimator == "paired_iqm_drop":
        return stats.paired_percent_drop(x, y, **options)
    change = stats.percent_change(x, y, **options)
    return Estimate(-change.value, -change.upper, -change.lower, change.n)


def _compared(spec: ClaimSpec, x: np.ndarray, y: np.ndarray, options: dict[str, Any]) -> Measurement | None:
    """Return the method's values ``x`` measured against the reference's ``y`` by ``spec``'s estimator."""
    ceiling = spec.ceiling is not None and bool(np.all(x == spec.ceiling) and np.all(y == spec.ceiling))
    if spec.estimator in _DROPS:
        est = _drop(spec.estimator, x, y, options)
        if not math.isfinite(est.value):
            return None  # the reference's IQM is 0: no scale to measure a drop in
        return Measurement(est, _same(x) and _same(y), ceiling)
    per_pair = _PER_PAIR[spec.estimator](x, y)
    per_pair = per_pair[np.isfinite(per_pair)]
    if not len(per_pair):
        return None
    return Measurement(stats.estimate(per_pair, **options), _same(per_pair), ceiling)


def measure_table(
    spec: ClaimSpec, table: pd.DataFrame, reps: int = 2000, confidence: float = 0.95, seed: int = 0
) -> Measurement | None:
    """Return ``spec``'s estimate computed from ``table`` (one row per run), or None when its runs are missing."""
    if spec.estimator in ("recorded", "joint"):
        raise ValueError(f"claim {spec.key}: a {spec.estimator} estimate is not computed from a table")
    table = _rows(spec, table)
    options = {"reps": reps, "confidence": confidence, "seed": seed}
    m = _arm(spec, table, spec.method)
    if spec.estimator == "iqm":
        values = m.to_numpy(dtype=float)
        return Measurement(stats.estimate(values, **options), _same(values), False) if len(values) else None
    r = _arm(spec, table, spec.reference)
    if spec.estimator == "unpaired_iqm_drop":
        x, y = m.to_numpy(dtype=float), r.to_numpy(dtype=float)
    else:
        x, y = _paired(m, r, broadcast=spec.estimator == "paired_difference")
    if not len(x) or not len(y):
        return None
    return _compared(spec, x, y, options)


def table_metric(
    estimator: str, column: str, method: str, reference: str = "", scale: float = 1.0, by: str = "method"
) -> ClaimSpec:
    """Return a spec row that only says how to compute a number from a table (for a notebook's own tables)."""
    return ClaimSpec(
        id=f"{estimator}:{column}", label="", version=1, status="current", family="", paper="",
        paper_experiment="", paper_metric="", experiment="", presets=("",), table="", rows=(), by=by,
        estimator=estimator, column=column, method=method, reference=reference, scale=scale, unit="",
        estimate="", window="", direction=">=", threshold="paper", min_seeds=1, ceiling=None, requires=(),
        paper_setting="", parts=(),
    )  # fmt: skip


def recorded_estimate(spec: ClaimSpec, results: dict[str, Any]) -> Estimate | None:
    """Return the estimate a run recorded under ``spec.estimate``, or None (absent, or NaN: nothing measured)."""
    found = (normalize_method_names(results).get("estimates") or {}).get(spec.estimate)
    if not isinstance(found, dict):
        return None
    est = Estimate.from_dict(found)
    return est if all(math.isfinite(v) for v in (est.value, est.lower, est.upper)) else None


def measure(spec: ClaimSpec, folder: str | Path | None, results: dict[str, Any]) -> Measurement | None:
    """Return ``spec``'s number for the run in ``folder`` (its table, else what it recorded), or None.

    A table that lacks the claim's columns (a run without evaluation episodes, say) measures nothing, and the
    run's recorded estimate, if any, stands.
    """
    if spec.estimator != "recorded" and folder is not None and (Path(folder) / spec.table).is_file():
        try:
            return measure_table(spec, pd.read_csv(Path(folder) / spec.table))
        except ValueError:
            pass
    est = recorded_estimate(spec, results)
    if est is None:
        return None
    return Measurement(est, est.n >= 2 and est.lower == est.upper, False)


def spec_estimates(
    experiment: str, table: pd.DataFrame, table_name: str = "summary.csv", **options: Any
) -> dict[str, dict[str, Any]]:
    """Return every claim's estimate of ``experiment`` computable from ``table``, under its recorded name.

    This is what a notebook records with ``rlq.record(estimates=...)``, so that a run holds the numbers the
    report judges; each claim's metric version (current and superseded) is recorded under its own name.
    """
    out: dict[str, dict[str, Any]] = {}
    for spec in claim_specs():
        if (
            spec.experiment != experiment
            or spec.table != table_name
            or spec.estimator in ("recorded", "joint")
        ):
            continue
        try:
            found = measure_table(spec, table, **options)
        except ValueError:
            continue  # this run's table lacks the claim's columns (another task, no evaluation)
        if found is not None:
            out[spec.estimate] = found.estimate.as_dict(spec.unit)
    return out
