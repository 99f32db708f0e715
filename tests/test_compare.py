"""GST's "no reward drop" test: drop below dense beyond one pooled standard deviation over seeds."""

from __future__ import annotations

import math

import pytest

from rlq.experiments.compare import reward_drop_vs_dense


def test_drop_beyond_pooled_seed_noise_by_hand():
    # dense mean 100, std sqrt(50); gst mean 80, std sqrt(200): pooled sqrt((50 + 200) / 2) = sqrt(125)
    result = reward_drop_vs_dense([95.0, 105.0], [70.0, 90.0])
    assert result["change_pct"] == pytest.approx(-20.0)
    assert result["seed_std_pct"] == pytest.approx(math.sqrt(125.0))
    assert result["drop_beyond_noise_pct"] == pytest.approx(20.0 - math.sqrt(125.0))


def test_a_drop_within_noise_or_a_gain_counts_as_none():
    assert reward_drop_vs_dense([90.0, 110.0], [85.0, 100.0])["drop_beyond_noise_pct"] == 0.0  # 7.5% < 10.6%
    gain = reward_drop_vs_dense([10.0, 12.0], [14.0, 15.0])
    assert gain["change_pct"] > 0 and gain["drop_beyond_noise_pct"] == 0.0


def test_one_seed_has_no_noise_estimate_and_negative_scores_scale_by_magnitude():
    one = reward_drop_vs_dense([18.1], [12.15])
    assert one["seed_std_pct"] == 0.0 and one["drop_beyond_noise_pct"] == pytest.approx(100 * 5.95 / 18.1)
    negative = reward_drop_vs_dense([-200.0], [-300.0])  # Pendulum-like returns: worse is more negative
    assert negative["change_pct"] == pytest.approx(-50.0) and negative[
        "drop_beyond_noise_pct"
    ] == pytest.approx(50.0)


def test_missing_methods_and_a_zero_dense_score_give_no_number():
    for dense, gst in (([], [1.0]), ([1.0], []), ([0.0, 0.0], [1.0])):
        assert set(reward_drop_vs_dense(dense, gst).values()) == {None}
    nan = float("nan")  # a run that finished no episode
    assert set(reward_drop_vs_dense([nan], [nan]).values()) == {None}
    assert reward_drop_vs_dense([nan, 10.0], [5.0])["change_pct"] == pytest.approx(-50.0)
    with pytest.raises(ValueError, match="finite"):
        reward_drop_vs_dense([1.0, float("inf")], [1.0])
