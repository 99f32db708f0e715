"""rlq.experiments.claims: the one interval rule, on hand-made estimates."""

from __future__ import annotations

import pytest

from rlq.experiments.claims import CLAIMS, FAMILIES, REWARD_TOLERANCE_PCT, judge
from rlq.experiments.paper import paper_numbers


def _claim(metric: str, experiment: str = "td3_mujoco"):
    return next(c for c in CLAIMS if (c.metric, c.experiment) == (metric, experiment))


def _results(name: str, value: float, lower: float, upper: float, n: int = 3) -> dict:
    return {"estimates": {name: {"value": value, "lower": lower, "upper": upper, "n": n}}}


GAP = "avg_compression_gain_vs_iterative_pruning_min"


@pytest.mark.parametrize(
    "lower,upper,n,verdict",
    [
        (26.0, 40.0, 3, "holds"),  # the whole interval above the paper's 25
        (10.0, 24.9, 5, "does not hold"),  # the whole interval below
        (20.0, 30.0, 3, "inconclusive"),  # straddles 25
        (26.0, 40.0, 2, "inconclusive"),  # above, but on 2 seeds
    ],
)
def test_a_greater_than_claim_is_judged_by_its_interval(lower, upper, n, verdict):
    claim = _claim(GAP)
    got = judge(claim, _results(claim.estimate, (lower + upper) / 2, lower, upper, n), 25.0)
    assert got.verdict == verdict
    assert got.threshold == 25.0 and got.n == n
    assert (got.lower, got.upper) == (lower, upper)


def test_no_reward_drop_allows_the_stated_tolerance():
    claim = _claim("reward_drop")
    within = _results(claim.estimate, 2.0, -5.0, REWARD_TOLERANCE_PCT - 0.1)
    beyond = _results(claim.estimate, 30.0, REWARD_TOLERANCE_PCT + 0.1, 40.0)
    assert judge(claim, within, 0.0).verdict == "holds"
    assert judge(claim, beyond, 0.0).verdict == "does not hold"
    assert "straddles" in judge(claim, _results(claim.estimate, 8.0, 0.0, 20.0), 0.0).reason


def test_a_legacy_point_value_is_inconclusive_and_a_missing_one_is_none():
    claim = _claim(GAP)
    legacy = judge(claim, {"gap_gst_minus_pruning_pp": 40.0, "seeds": 2}, 25.0)
    assert legacy.verdict == "inconclusive" and "point value only" in legacy.reason
    assert legacy.value == legacy.lower == legacy.upper == 40.0 and legacy.n == 2
    assert judge(claim, {"unrelated": 1.0}, 25.0) is None


def test_every_claim_names_a_paper_row_a_family_and_a_direction():
    rows = {(r.paper, r.experiment, r.metric) for r in paper_numbers().itertuples()}
    for claim in CLAIMS:
        assert (claim.paper, claim.experiment, claim.metric) in rows
        assert claim.family in FAMILIES and claim.direction in (">=", "<=") and claim.unit


def test_actorq_speedup_is_judged_in_the_regime_it_was_measured_in():
    claim = _claim("end_to_end_speedup_min", "actorq")
    results = _results(claim.estimate, 1.7, 1.55, 1.9)
    results["estimates"][claim.estimate] |= {
        "regime": "actor_bound",
        "description": "one update per 80 steps",
    }
    got = judge(claim, results, 1.5)
    assert got.verdict == "holds" and got.threshold == 1.5
    assert got.setting == "measured in the actor_bound regime: one update per 80 steps"
    straddles = judge(claim, _results(claim.estimate, 1.51, 1.36, 1.67), 1.5)
    assert straddles.verdict == "inconclusive" and straddles.setting is None  # no regime recorded


def test_a_nan_estimate_is_no_measurement():
    """A NaN interval (dense's IQM 0, a run without episodes) is not judged, so a measured run can answer."""
    claim = _claim("reward_drop")
    nan = float("nan")
    assert judge(claim, _results(claim.estimate, nan, nan, nan), 0.0) is None
    assert judge(claim, {"reward_drop_beyond_seed_noise_pct": nan}, 0.0) is None
    assert judge(claim, _results(claim.estimate, 2.0, -5.0, 4.0), 0.0).verdict == "holds"
