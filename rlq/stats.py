"""Interval estimates over seeds: rliable's IQM with its stratified-bootstrap 95% interval (``rlq.stats``).

The implementation is :mod:`rlq.experiments.seed_statistics`; this module is its public name::

    from rlq.stats import estimate
    estimate([812.0, 905.0, 770.0, 1010.0, 640.0]).as_dict("return")   # IQM, lower, upper, n
"""

from rlq.experiments.seed_statistics import (
    METRICS,
    MIN_SEEDS,
    Estimate,
    as_records,
    estimate,
    estimates_by,
    interval_estimates,
    percent_change,
    probability_of_improvement,
)

__all__ = [
    "METRICS",
    "MIN_SEEDS",
    "Estimate",
    "as_records",
    "estimate",
    "estimates_by",
    "interval_estimates",
    "percent_change",
    "probability_of_improvement",
]
