"""RewardAwareSparsity (our design) on synthetic reward sequences."""

from __future__ import annotations

import json

import pytest

from rlq.compress import RewardAwareConfig, RewardAwareSparsity


def run(rewards, **config) -> tuple[list[float], list[str]]:
    controller = RewardAwareSparsity(RewardAwareConfig(**config))
    targets, decisions = [], []
    for reward in rewards:
        targets.append(controller.update(reward))
        decisions.append(controller.last_decision)
    return targets, decisions


def test_target_rises_under_steady_and_improving_reward():
    for rewards in ([100.0] * 12, [10.0 * i for i in range(12)]):
        targets, decisions = run(rewards, window=3, step_size=0.1, max_sparsity=0.95)
        assert decisions[:2] == ["warmup", "warmup"] and targets[:2] == [0.0, 0.0]
        assert targets[2:] == pytest.approx([min(0.1 * k, 0.95) for k in range(1, 11)])


def test_small_noise_within_tolerance_still_rises():
    rewards = [100.0, 98.0, 101.0, 97.0, 100.0, 99.0, 102.0, 98.0]
    targets, _ = run(rewards, window=2, tolerance=0.05, step_size=0.05)
    assert targets == sorted(targets) and targets[-1] == pytest.approx(0.35)


def test_a_drop_stops_the_rise_backs_off_and_holds_during_cooldown():
    rewards = [100.0] * 6 + [50.0] * 6
    targets, decisions = run(rewards, window=2, tolerance=0.1, step_size=0.1, backoff=0.05, cooldown=2)
    peak = max(targets)
    drop_at = decisions.index("backoff")
    assert targets[drop_at] == pytest.approx(targets[drop_at - 1] - 0.05)
    assert decisions[drop_at + 1 : drop_at + 3] == ["cooldown", "cooldown"]
    assert all(t <= peak for t in targets[drop_at:])  # never rises while the reward stays low
    assert targets[-1] < peak


def test_the_target_rises_again_once_the_reward_recovers():
    rewards = [100.0] * 4 + [40.0] * 4 + [100.0] * 6
    targets, decisions = run(rewards, window=2, step_size=0.1, backoff=0.1, cooldown=1)
    assert "backoff" in decisions and decisions[-1] == "rise"
    assert targets[-1] > targets[decisions.index("backoff")]


def test_never_exceeds_max_nor_goes_below_min():
    targets, decisions = run([1.0] * 50, window=1, step_size=0.3, max_sparsity=0.8)
    assert max(targets) == pytest.approx(0.8) and decisions[-1] == "at_max"
    targets, _ = run([100.0] + [-100.0 * k for k in range(1, 40)], window=1, backoff=0.3, cooldown=0,
                     min_sparsity=0.1, initial_sparsity=0.5)  # fmt: skip
    assert min(targets) == pytest.approx(0.1)


def test_deterministic_and_resumable():
    rewards = [float((7 * i) % 13) for i in range(40)]
    assert run(rewards) == run(rewards)
    whole = RewardAwareSparsity()
    first = RewardAwareSparsity()
    for r in rewards[:20]:
        whole.update(r)
        first.update(r)
    resumed = RewardAwareSparsity()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert [whole.update(r) for r in rewards[20:]] == [resumed.update(r) for r in rewards[20:]]


def test_missing_reward_holds_and_bad_reward_raises():
    controller = RewardAwareSparsity(RewardAwareConfig(window=1, initial_sparsity=0.2))
    assert controller.update(None) == 0.2 and controller.last_decision == "no_reward"
    with pytest.raises(ValueError, match="finite"):
        controller.update(float("nan"))


def test_relative_tolerance_uses_the_magnitude_of_negative_rewards():
    # Rewards around -1000 (e.g. Pendulum): a 3% dip is within a 5% tolerance.
    targets, decisions = run([-1000.0, -1030.0, -1010.0], window=1, tolerance=0.05)
    assert decisions == ["rise", "rise", "rise"]
    _, decisions = run([-1000.0, -1100.0], window=1, tolerance=0.05)
    assert decisions == ["rise", "backoff"]


@pytest.mark.parametrize(
    "config, message",
    [
        (dict(max_sparsity=1.0), "max_sparsity"),
        (dict(initial_sparsity=0.95, max_sparsity=0.9), "initial_sparsity <= max_sparsity"),
        (dict(step_size=0.0), "step_size must be > 0"),
        (dict(backoff=-0.1), "backoff"),
        (dict(window=0), "window"),
        (dict(cooldown=-1), "cooldown"),
        (dict(tolerance=float("inf")), "tolerance"),
    ],
)
def test_bad_config_is_rejected(config, message):
    with pytest.raises(ValueError, match=message):
        RewardAwareConfig(**config)


def guarded(before, after, **config) -> RewardAwareSparsity:
    """A controller with the trend guard that observed ``before`` and then updated on ``after``."""
    controller = RewardAwareSparsity(RewardAwareConfig(window=1, trend_window=4, trend_ratio=0.5, **config))
    for reward in before:
        controller.observe(reward)
    for reward in after:
        controller.update(reward)
    return controller


def test_trend_guard_holds_while_the_reward_rises_more_slowly_than_before_pruning():
    # before pruning +1 per update; afterwards +0.2 per update: never a drop, but under half the pace
    controller = guarded([0.0, 1.0, 2.0, 3.0], [3.2, 3.4, 3.6, 3.8, 4.0])
    assert controller.reference_slope == pytest.approx(1.0)
    assert controller.trend_slope() == pytest.approx(0.2)
    assert controller.last_decision == "hold_trend"
    # the same rewards without the guard: the drop rule alone sees no harm and keeps raising the target
    assert run([3.2, 3.4, 3.6, 3.8, 4.0], window=1)[1] == ["rise"] * 5


def test_trend_guard_lets_the_target_rise_while_learning_keeps_pace():
    controller = guarded([0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0, 8.0])
    assert controller.target == pytest.approx(0.25) and controller.last_decision == "rise"


def test_trend_guard_follows_the_slope_by_hand():
    # least-squares slope of (1, 4, 2, 7) against (0, 1, 2, 3): sum((i - 1.5)(y - 3.5)) / 5 = 8 / 5
    controller = guarded([1.0, 4.0, 2.0, 7.0], [])
    assert controller.trend_slope() == pytest.approx(1.6)
    # a flat or falling reward before pruning gives no reference: the guard stays off
    flat = guarded([2.0, 2.0, 2.0, 2.0], [2.0, 2.0, 2.0])
    assert flat.reference_slope == pytest.approx(0.0) and flat.last_decision == "rise"
    # too few observations: no reference either
    assert guarded([0.0, 1.0], [1.0, 1.1, 1.2, 1.3]).reference_slope is None


def test_trend_guard_is_off_by_default_and_resumes():
    assert RewardAwareConfig().trend_ratio == 0.0
    rewards = [0.0, 1.0, 2.0, 3.0]
    later = [3.2, 3.4, 4.5, 4.6, 4.7, 4.8, 6.0]
    whole = guarded(rewards, later)
    first = guarded(rewards, later[:3])
    resumed = RewardAwareSparsity()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    rest = [(resumed.update(r), resumed.last_decision) for r in later[3:]]
    again = guarded(rewards, later[:3])
    assert rest == [(again.update(r), again.last_decision) for r in later[3:]]
    assert whole.target == resumed.target and "hold_trend" in {d for _, d in rest}
    with pytest.raises(ValueError, match="trend_window"):
        RewardAwareConfig(trend_window=1)
