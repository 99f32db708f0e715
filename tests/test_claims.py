"""rlq.claims.verdicts: the rule on hand-made measurements, joint claims, the rule across presets."""

from __future__ import annotations

import math

import pytest

from rlq.claims.measure import Measurement
from rlq.claims.spec import spec_by_id
from rlq.claims.verdicts import BY_DESIGN, CEILING, TOO_FEW, Verdict, judge, judge_joint, overall
from rlq.stats import Estimate

GAIN, REWARD, JOINT = spec_by_id("gst_td3_gain"), spec_by_id("gst_td3_reward"), spec_by_id("gst_td3_joint")


def _m(value, lower, upper, n, by_design=False, at_ceiling=False):
    return Measurement(Estimate(value, lower, upper, n), by_design, at_ceiling)


@pytest.mark.parametrize(
    "lower,upper,n,verdict",
    [
        (26.0, 40.0, 5, "holds"),  # the whole interval above the paper's 25
        (10.0, 24.9, 5, "does not hold"),  # the whole interval below
        (20.0, 30.0, 5, "inconclusive"),  # straddles 25
        (26.0, 40.0, 4, TOO_FEW),  # above, but on 4 of the 5 seeds the claim needs
    ],
)
def test_a_greater_than_claim_is_judged_by_its_interval(lower, upper, n, verdict):
    got = judge(GAIN, _m((lower + upper) / 2, lower, upper, n), 25.0, {})
    assert got.verdict == verdict
    assert got.threshold == 25.0 and got.n == n and (got.lower, got.upper) == (lower, upper)


def test_no_reward_drop_allows_the_specified_tolerance_and_needs_ten_seeds():
    assert (
        REWARD.threshold == "paper + 10" and REWARD.min_seeds == 10 and REWARD.estimator == "paired_iqm_drop"
    )
    assert judge(REWARD, _m(2.0, -5.0, 9.9, 10), 0.0, {}).verdict == "holds"
    assert judge(REWARD, _m(30.0, 10.1, 40.0, 10), 0.0, {}).verdict == "does not hold"
    assert "straddles 10" in judge(REWARD, _m(8.0, 0.0, 20.0, 10), 0.0, {}).reason
    few = judge(REWARD, _m(2.0, -5.0, 9.9, 9), 0.0, {})
    assert few.verdict == TOO_FEW and few.reason == "9 of the 10 seeds the claim needs" and few.value == 2.0


def test_a_quantity_the_same_on_every_seed_is_by_design_and_a_saturated_reward_is_uninformative():
    design = judge(GAIN, _m(26.7, 26.7, 26.7, 10, by_design=True), 25.0, {})
    assert design.verdict == BY_DESIGN and design.reaches and "reaches 25" in design.reason
    short = judge(GAIN, _m(20.0, 20.0, 20.0, 3, by_design=True), 25.0, {})
    assert short.verdict == BY_DESIGN and not short.reaches and "falls short of 25" in short.reason
    football = spec_by_id("gst_football_reward")
    ceiling = judge(football, _m(0.0, 0.0, 0.0, 5, by_design=True, at_ceiling=True), 0.0, {})
    assert ceiling.verdict == CEILING and "maximum, 1," in ceiling.reason


def test_a_claim_that_needs_the_papers_setting_is_inconclusive_on_another():
    cifar = spec_by_id("gst_cifar10_accuracy")
    holds = _m(0.5, 0.1, 1.0, 5)
    assert judge(cifar, holds, 0.8, {"dataset": "cifar10"}).verdict == "holds"
    other = judge(cifar, holds, 0.8, {"dataset": "digits"})
    assert other.verdict == "inconclusive"
    assert (
        other.reason
        == "not the paper's setting (dataset is digits, not cifar10); on this run the rule says holds"
    )


def _v(verdict: str, reaches: bool | None = None, n: int = 10) -> Verdict:
    return Verdict(1.0, 0.0, 2.0, n, verdict, "", 0.0, reaches)


@pytest.mark.parametrize(
    "gain,reward,expected",
    [
        (_v("holds"), _v("holds"), "holds"),
        (_v(BY_DESIGN, reaches=True), _v("holds"), "holds"),
        (_v(BY_DESIGN, reaches=False), _v("holds"), "does not hold"),
        (_v("holds"), _v("does not hold"), "does not hold"),
        (_v("holds"), _v("inconclusive"), "inconclusive"),
        (_v("holds"), _v(TOO_FEW, n=5), TOO_FEW),
        (_v(BY_DESIGN, reaches=True), _v(CEILING), CEILING),
    ],
)
def test_a_joint_claim_needs_every_part_on_the_same_preset(gain, reward, expected):
    got = judge_joint(JOINT, {"gain": gain, "reward": reward})
    assert got is not None and got.verdict == expected and math.isnan(got.value)
    assert judge_joint(JOINT, {"gain": gain, "reward": None}) is None  # a half not measured: no joint verdict


def test_across_presets_the_longest_with_enough_seeds_decides_and_a_contradiction_is_named():
    assert REWARD.presets == ("medium", "long")
    verdict, reason, decider = overall(REWARD, {"medium": _v("does not hold"), "long": _v("holds")})
    assert (verdict, decider) == ("holds", "long")
    assert reason == "decided on long; contradicted by medium (does not hold)"
    verdict, reason, decider = overall(REWARD, {"medium": _v("inconclusive"), "long": _v(TOO_FEW, n=5)})
    assert (verdict, decider) == ("inconclusive", "medium") and "long has too few seeds yet" in reason
    assert overall(REWARD, {"medium": _v(TOO_FEW), "long": None})[0] == TOO_FEW
    assert overall(REWARD, {"medium": None, "long": None})[0] == "not measured"
