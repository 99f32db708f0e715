"""RewardAwareSparsity (our design) on synthetic score streams: the episodes rule, and the earlier windowed rule."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from rlq.compress import RewardAwareConfig, RewardAwareSparsity

WINDOWED = dict(rule="windowed", input_window=1)
"""The earlier rule, fed one score per update (its input is then that score, as the earlier API took it)."""


def run(rewards, **config) -> tuple[list[float], list[str]]:
    """Feed one score per update to the windowed rule; return the targets and decisions."""
    controller = RewardAwareSparsity(RewardAwareConfig(**WINDOWED, **config))
    targets, decisions = [], []
    for reward in rewards:
        controller.add_scores([] if reward is None else [reward])
        targets.append(controller.update())
        decisions.append(controller.last_decision)
    return targets, decisions


def stream(
    episodes, updates_per_episode: int = 1, **config
) -> tuple[RewardAwareSparsity, list[tuple[int, float, str]]]:
    """Feed episode returns to a controller with ``updates_per_episode`` updates after each; return
    the controller and one ``(episode index, target, decision)`` per update."""
    controller = RewardAwareSparsity(RewardAwareConfig(**config))
    rows = []
    for i, score in enumerate(episodes):
        controller.add_scores([score])
        for _ in range(updates_per_episode):
            rows.append((i, controller.update(), controller.last_decision))
    return controller, rows


# ---- the episodes rule (default)


def test_steady_or_rising_returns_raise_the_target_once_per_min_episodes():
    for episodes in ([100.0] * 20, [10.0 * i for i in range(20)]):
        controller, rows = stream(episodes, updates_per_episode=3, min_episodes=3, step_size=0.05)
        rises = [i for i, _, d in rows if d == "rise"]
        # the first rise needs min_episodes scores; then one per min_episodes new episodes, never more
        assert rises == [2, 5, 8, 11, 14, 17]
        assert controller.target == pytest.approx(0.3)
        assert {d for _, _, d in rows} <= {"wait", "rise"}


def test_a_sustained_drop_after_a_rise_backs_off_within_a_few_episodes():
    episodes = [1000.0] * 6 + [300.0] * 12  # a collapse right after the second rise
    controller, rows = stream(episodes, updates_per_episode=3, min_episodes=2, backoff=0.05)
    first_backoff = next(i for i, _, d in rows if d == "backoff")
    assert first_backoff <= 6 + 2  # judged by the first min_episodes returns after the drop
    peak = max(t for _, t, _ in rows)
    assert controller.target < peak and not [d for i, _, d in rows if i >= 6 and d == "rise"]
    assert controller.reference == pytest.approx(1000.0)  # the level to recover to stays the pre-drop one


def test_the_earlier_windowed_rule_misses_that_drop_at_three_updates_per_episode():
    """The defect the episodes rule mends: a 10-episode mean fed three times per episode only rises."""
    # a random warm-up, a rise, then a collapse that is still better than the warm-up
    episodes = [-400.0] * 10 + [-100.0, 0.0, 100.0, -150.0, -200.0, -150.0, -100.0, -150.0]
    legacy = RewardAwareSparsity(RewardAwareConfig(rule="windowed", input_window=10, backoff=0.0))
    decisions = []
    for score in episodes:
        legacy.add_scores([score])
        for _ in range(3):
            legacy.update()
            decisions.append(legacy.last_decision)
    # its reference is the warm-up's -400 and the collapse still beats it: it rises to the cap
    assert "backoff" not in decisions and legacy.target == pytest.approx(0.9)
    controller, rows = stream(episodes[10:], updates_per_episode=3, min_episodes=2)
    # the episodes rule backs off the rise the collapse followed (0.1 to 0.05), then holds there
    decisions = [d for _, _, d in rows]
    assert decisions.count("backoff") == 1 and decisions[-1] == "hold" and controller.target == 0.05


def test_noisy_flat_returns_rise_at_most_once_per_min_episodes_and_back_off_sometimes():
    rng = random.Random(0)
    episodes = [1000.0 + rng.gauss(0.0, 80.0) for _ in range(60)]
    controller, rows = stream(
        episodes, updates_per_episode=3, min_episodes=3, tolerance=0.05, max_sparsity=0.95
    )
    decisions = [d for _, _, d in rows]
    assert decisions.count("rise") <= len(episodes) // 3
    assert decisions.count("backoff") >= 1
    changes = [i for i, _, d in rows if d in ("rise", "backoff")]
    assert all(b - a >= 3 for a, b in itertools.pairwise(changes))  # every change waits for 3 new episodes


def test_recovery_to_the_reference_lets_the_target_rise_again():
    episodes = [100.0] * 4 + [40.0] * 4 + [100.0] * 6
    controller, rows = stream(episodes, min_episodes=2, backoff=0.1, step_size=0.1)
    decisions = [d for _, _, d in rows]
    assert decisions.index("backoff") < len(decisions) - 1 - decisions[::-1].index("rise")


def test_a_back_off_undoes_the_harmful_rise_and_no_more():
    """A reward that never regains its reference: one back-off to the target before that rise, then holds."""
    episodes = [100.0] * 10 + [80.0] * 30
    controller, rows = stream(episodes, min_episodes=2, step_size=0.05, backoff=0.05)
    peak = max(t for _, t, _ in rows)
    assert peak == pytest.approx(0.25)  # a rise every 2 steady episodes
    after = [d for i, _, d in rows if i >= 10]
    assert after.count("backoff") == 1 and set(after[after.index("backoff") + 1 :]) <= {"wait", "hold"}
    assert controller.target == pytest.approx(peak - 0.05) == controller.floor
    # the controller's floor follows a target set from outside (GST's hand-over) when that is lower
    assert controller.reset_target(0.1) == pytest.approx(0.1) and controller.floor == pytest.approx(0.1)


def test_zero_backoff_holds_on_a_drop():
    controller, rows = stream([100.0] * 4 + [10.0] * 6, min_episodes=2, backoff=0.0)
    assert {d for i, _, d in rows if i >= 5} == {"hold"} and controller.target == pytest.approx(0.1)


def test_episodes_rule_resumes_exactly_and_rejects_an_earlier_state():
    episodes = [float((7 * i) % 13) for i in range(40)]
    whole, rows = stream(episodes, updates_per_episode=2, min_episodes=2, tolerance=0.1)
    first, _ = stream(episodes[:20], updates_per_episode=2, min_episodes=2, tolerance=0.1)
    resumed = RewardAwareSparsity()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    rest = []
    for score in episodes[20:]:
        resumed.add_scores([score])
        rest += [(resumed.update(), resumed.last_decision) for _ in range(2)]
    assert rest == [(t, d) for i, t, d in rows if i >= 20]
    old = first.state_dict()
    del old["since_count"], old["inputs"]
    with pytest.raises(ValueError, match="earlier rlq"):
        RewardAwareSparsity().load_state_dict(old)


def test_bad_scores_raise():
    with pytest.raises(ValueError, match="finite"):
        RewardAwareSparsity().add_scores([1.0, float("nan")])


# ---- the windowed rule of earlier rlq versions (kept for ablations)


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


def windowed(rewards, controller=None, **config) -> RewardAwareSparsity:
    controller = controller or RewardAwareSparsity(RewardAwareConfig(**WINDOWED, **config))
    for r in rewards:
        controller.add_scores([r])
        controller.update()
    return controller


def test_deterministic_and_resumable():
    rewards = [float((7 * i) % 13) for i in range(40)]
    assert run(rewards) == run(rewards)
    whole = windowed(rewards[:20])
    first = windowed(rewards[:20])
    resumed = RewardAwareSparsity()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert [windowed([r], whole).target for r in rewards[20:]] == [
        windowed([r], resumed).target for r in rewards[20:]
    ]


def test_missing_reward_holds():
    controller = RewardAwareSparsity(RewardAwareConfig(**WINDOWED, window=1, initial_sparsity=0.2))
    assert controller.update() == 0.2 and controller.last_decision == "no_reward"


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
        (dict(rule="best"), "rule"),
        (dict(min_episodes=0), "min_episodes"),
    ],
)
def test_bad_config_is_rejected(config, message):
    with pytest.raises(ValueError, match=message):
        RewardAwareConfig(**config)


def guarded(before, after, **config) -> RewardAwareSparsity:
    """A controller with the trend guard that observed ``before`` and then updated on ``after``."""
    controller = RewardAwareSparsity(
        RewardAwareConfig(**WINDOWED, window=1, trend_window=4, trend_ratio=0.5, **config)
    )
    for reward in before:
        controller.add_scores([reward])
        controller.observe()
    return windowed(after, controller)


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
    rest = [(windowed([r], resumed).target, resumed.last_decision) for r in later[3:]]
    again = guarded(rewards, later[:3])
    assert rest == [(windowed([r], again).target, again.last_decision) for r in later[3:]]
    assert whole.target == resumed.target and "hold_trend" in {d for _, d in rest}
    with pytest.raises(ValueError, match="trend_window"):
        RewardAwareConfig(trend_window=1)
