"""evaluate(): reproducible for a seed, and equal to an independent hand-written rollout."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlq.rl.evaluate import evaluate, random_policy


def balance(obs: np.ndarray) -> np.ndarray:
    """A fixed CartPole controller: push towards the side the pole is falling to."""
    return (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)


def hand_rollout(seed: int, n_episodes: int) -> list[float]:
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    returns, total = [], 0.0
    while len(returns) < n_episodes:
        obs, reward, terminated, truncated, _ = env.step(int(balance(obs[None])[0]))
        total += reward
        if terminated or truncated:
            returns.append(total)
            total = 0.0
            obs, _ = env.reset()
    return returns


def test_evaluate_matches_an_independent_rollout():
    result = evaluate(balance, "CartPole-v1", n_episodes=4, seed=11)
    expected = hand_rollout(11, 4)
    assert sorted(result.returns) == pytest.approx(sorted(expected))
    assert result.mean == pytest.approx(np.mean(expected)) and result.std == pytest.approx(np.std(expected))
    assert result.mean > 100  # the controller really balances: well above a random policy


def test_evaluate_is_reproducible_for_a_seed_and_varies_across_seeds():
    policy = random_policy("CartPole-v1", seed=0)
    a = evaluate(random_policy("CartPole-v1", seed=0), "CartPole-v1", n_episodes=5, seed=1)
    b = evaluate(random_policy("CartPole-v1", seed=0), "CartPole-v1", n_episodes=5, seed=1)
    c = evaluate(policy, "CartPole-v1", n_episodes=5, seed=2)
    assert a.returns == b.returns and a.lengths == b.lengths
    assert a.returns != c.returns
    assert 8 < a.mean < 60  # a random CartPole policy lasts about 22 steps


def test_evaluate_rejects_zero_episodes():
    with pytest.raises(ValueError, match="n_episodes"):
        evaluate(balance, "CartPole-v1", n_episodes=0)


@pytest.mark.parametrize("bad", [2.5, 2.0, "3", True])
def test_evaluate_rejects_episode_counts_that_are_not_integers(bad):
    with pytest.raises(ValueError, match="n_episodes must be a positive int"):
        evaluate(balance, "CartPole-v1", n_episodes=bad)
