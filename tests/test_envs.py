"""make_env / make_vec_env: one id of each family, seeding, and the unknown-id message."""

from __future__ import annotations

import numpy as np
import pytest

from rlq.rl.envs import FAMILIES, make_env, make_vec_env


@pytest.mark.parametrize(
    "env_id, obs_shape, obs_dtype",
    [
        ("CartPole-v1", (4,), np.float32),
        ("HalfCheetah-v5", (17,), np.float64),
        ("ALE/Breakout-v5", (84, 84, 1), np.uint8),
        ("BreakoutNoFrameskip-v4", (84, 84, 1), np.uint8),
        ("dm_control/cartpole-balance-v0", (5,), np.float32),
    ],
)
def test_each_family_makes_a_seeded_env(env_id, obs_shape, obs_dtype):
    rollouts = []
    for _ in range(2):  # a fresh env each time: Atari's episodic-life reset ignores a seed mid-game
        env = make_env(env_id, seed=3)
        assert env.observation_space.shape == obs_shape
        obs, _ = env.reset(seed=3)
        assert obs.shape == obs_shape and obs.dtype == obs_dtype
        trace = [obs]
        for _ in range(20):
            obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            trace.append(obs)
            if terminated or truncated:
                obs, _ = env.reset()
        rollouts.append(np.stack(trace))
        env.close()
    np.testing.assert_array_equal(rollouts[0], rollouts[1])
    assert not np.array_equal(rollouts[0][0], rollouts[0][-1])  # the env really moved


def test_dm_control_actions_are_float32_and_observations_flat():
    env = make_env("dm_control/walker-stand-v0", seed=0)
    assert env.action_space.dtype == np.float32 and env.action_space.shape == (6,)
    obs, _ = env.reset()
    obs, *_ = env.step(env.action_space.sample())
    assert obs.ndim == 1 and obs.dtype == np.float32


def test_atari_vec_env_stacks_four_frames():
    venv = make_vec_env("ALE/Pong-v5", n_envs=2, seed=0)
    assert venv.reset().shape == (2, 84, 84, 4)
    venv.close()


def test_vec_env_reports_real_episode_returns():
    venv = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    venv.reset()
    episodes = []
    for _ in range(200):
        _, _, dones, infos = venv.step(np.array([venv.action_space.sample() for _ in range(2)]))
        episodes += [info["episode"]["r"] for info, done in zip(infos, dones, strict=True) if done]
    assert episodes and all(r == int(r) and r >= 1 for r in episodes)  # CartPole pays 1 a step


@pytest.mark.parametrize("bad", ["CartPole-v9", "NoSuchGame", "dm_control/cartpole-spin-v0", ""])
def test_unknown_id_lists_the_families(bad):
    with pytest.raises(ValueError) as info:
        make_env(bad)
    if bad:
        assert repr(bad) in str(info.value)
        for family in FAMILIES:
            assert family in str(info.value)
    if bad == "CartPole-v9":
        assert "Did you mean CartPole-v1" in str(info.value)
