"""rlq.stats: IQM and intervals against hand computation and against rliable called directly."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from rliable import library as rly
from rliable import metrics as rly_metrics

from rlq import stats


def _rliable_direct(scores: np.ndarray, func, seed: int, reps: int = 500):
    """rliable's own call, seeded through NumPy's global state as rliable draws from it."""
    np.random.seed(seed)
    points, intervals = rly.get_interval_estimates(
        {"m": scores}, lambda x: np.array([func(x)]), reps=reps, confidence_interval_size=0.95
    )
    return float(points["m"][0]), float(intervals["m"][0, 0]), float(intervals["m"][1, 0])


def test_iqm_matches_a_hand_computed_interquartile_mean():
    # 8 runs: the IQM drops the 2 lowest and 2 highest and averages the middle 4
    scores = np.array([100.0, -5.0, 3.0, 7.0, 4.0, 6.0, 50.0, 5.0])
    middle = np.sort(scores)[2:6]
    assert stats.estimate(scores, reps=50).value == pytest.approx(middle.mean())
    # (runs, tasks): the IQM pools every run of every task
    matrix = np.arange(12.0).reshape(4, 3)
    assert stats.estimate(matrix, reps=50).value == pytest.approx(np.sort(matrix.ravel())[3:9].mean())


@pytest.mark.parametrize(
    "metric,func", [("iqm", rly_metrics.aggregate_iqm), ("mean", rly_metrics.aggregate_mean)]
)
def test_intervals_equal_rliable_called_directly(metric, func):
    rng = np.random.default_rng(1)
    scores = rng.normal(100, 20, size=(6, 2))
    ours = stats.estimate(scores, metric=metric, reps=500, seed=7)
    assert (ours.value, ours.lower, ours.upper) == pytest.approx(_rliable_direct(scores, func, seed=7))
    assert ours.lower < ours.value < ours.upper
    assert ours.n == 6


def test_interval_estimates_table_per_method_and_metric():
    table = stats.interval_estimates({"dense": [1.0, 2.0, 3.0], "gst": [[1.0, 2.0], [2.0, 3.0]]}, reps=100)
    assert list(table.columns) == ["method", "metric", "value", "lower", "upper", "n"]
    assert list(zip(table["method"], table["metric"], strict=True)) == [
        (m, k) for m in ("dense", "gst") for k in ("iqm", "mean", "median")
    ]
    dense_mean = table[(table["method"] == "dense") & (table["metric"] == "mean")].iloc[0]
    assert dense_mean["value"] == pytest.approx(2.0) and dense_mean["n"] == 3
    assert (table["lower"] <= table["value"]).all() and (table["value"] <= table["upper"]).all()


def test_the_bootstrap_is_seeded_and_leaves_numpy_global_state_alone():
    np.random.seed(123)
    expected_next = np.random.random()
    np.random.seed(123)
    scores = np.random.default_rng(0).normal(size=10)
    a = stats.estimate(scores, reps=200, seed=3)
    assert np.random.random() == expected_next  # the caller's stream continues as if nothing happened
    assert stats.estimate(scores, reps=200, seed=3) == a
    assert stats.estimate(scores, reps=200, seed=4) != a


def test_one_run_gives_a_collapsed_interval():
    assert stats.estimate([5.0]) == stats.Estimate(5.0, 5.0, 5.0, 1)


def test_probability_of_improvement_against_rliable():
    x, y = np.array([3.0, 4.0, 5.0, 6.0]), np.array([1.0, 2.0, 3.5, 4.5])
    value, lower, upper = stats.probability_of_improvement(x, y, reps=300, seed=2)
    # hand count: pairs with x > y over 16, ties none
    assert value == pytest.approx(sum(a > b for a in x for b in y) / 16)
    np.random.seed(2)
    _, intervals = rly.get_interval_estimates(
        {"xy": [x[:, None], y[:, None]]},
        lambda a, b: np.array([rly_metrics.probability_of_improvement(a, b)]),
        reps=300,
    )
    assert (lower, upper) == pytest.approx(tuple(intervals["xy"][:, 0]))


def test_percent_change_is_a_percentage_of_the_reference():
    dense = np.array([100.0, 110.0, 90.0, 100.0])
    compressed = dense * 0.8
    change = stats.percent_change(compressed, dense, reps=300)
    assert change.value == pytest.approx(-20.0)
    assert change.lower <= -20.0 <= change.upper


@pytest.mark.parametrize(
    "bad,match",
    [([], "at least one run"), ([1.0, float("nan")], "finite"), (np.zeros((2, 2, 2)), "shape")],
)
def test_bad_scores_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        stats.estimate(bad)


def test_bad_metric_and_options_are_named():
    with pytest.raises(ValueError, match="unknown metric 'best'"):
        stats.estimate([1.0, 2.0], metric="best")
    with pytest.raises(ValueError, match="confidence"):
        stats.estimate([1.0, 2.0], confidence=95)
    with pytest.raises(ValueError, match="reps"):
        stats.estimate([1.0, 2.0], reps=0)


def test_estimates_by_groups_a_runs_table():
    frame = pd.DataFrame({"method": ["dense", "dense", "gst", "gst"], "ret": [1.0, 3.0, 2.0, 2.0]})
    table = stats.estimates_by(frame, "ret", reps=50)
    assert list(table["method"]) == ["dense", "gst"]
    assert table["value"].tolist() == pytest.approx([2.0, 2.0])
    with pytest.raises(ValueError, match="no column"):
        stats.estimates_by(frame, "eval_return")


def test_estimate_round_trips_through_its_recorded_dict():
    e = stats.Estimate(1.5, 1.0, 2.0, 3)
    assert stats.Estimate.from_dict(e.as_dict(unit="%")) == e
    with pytest.raises(ValueError, match="value, lower and upper"):
        stats.Estimate.from_dict({"value": 1.0})


def test_as_records_keys_each_method_with_its_prefix():
    table = stats.interval_estimates({"a": [1.0, 2.0, 3.0]}, metrics=("iqm",), reps=50)
    records = stats.as_records(table, prefix="ret ", unit="return")
    assert list(records) == ["ret a"]
    assert records["ret a"] == {
        **table.iloc[0][["value", "lower", "upper"]].to_dict(),
        "n": 3,
        "unit": "return",
    }
