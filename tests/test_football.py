"""Google Research Football through rlq.rl.envs: creation, engine seeding, truncation, errors.

Football is optional (``make football``); these tests skip without it, except in CI, where ``.ci/run``
builds it first and sets RLQ_REQUIRE_FOOTBALL=1 so that a missing install fails instead of skipping.
"""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest

from rlq.rl.envs import make_env, make_vec_env
from rlq.rl.football import FootballEnv, football_available, game_seed

if not football_available():
    if os.environ.get("RLQ_REQUIRE_FOOTBALL") == "1":
        raise RuntimeError("RLQ_REQUIRE_FOOTBALL=1 but gfootball does not import: did `make football` run?")
    pytest.skip("Google Research Football is not installed (make football)", allow_module_level=True)

SCENARIO = "gfootball/academy_empty_goal_close"
OPPONENTS = "gfootball/academy_3_vs_1_with_keeper"


def rollout(env, seed: int, actions: list[int]) -> tuple[np.ndarray, list[float]]:
    """Return the stacked observations and rewards of playing ``actions`` after ``reset(seed=seed)``."""
    obs, _ = env.reset(seed=seed)
    observations, rewards = [obs], []
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        observations.append(obs)
        rewards.append(float(reward))
        if terminated or truncated:
            break
    return np.stack(observations), rewards


def test_make_env_is_a_gymnasium_env_with_simple115v2_observations():
    env = make_env(SCENARIO, seed=0)
    try:
        obs, info = env.reset(seed=0)
        assert obs.shape == (115,) and env.observation_space.shape == (115,)
        assert env.observation_space.contains(obs.astype(env.observation_space.dtype))
        assert env.action_space.n == 19  # gfootball's default action set
        obs, reward, terminated, truncated, info = env.step(0)
        assert isinstance(terminated, bool) and isinstance(truncated, bool)
    finally:
        env.close()


def test_same_seed_same_game_and_the_seed_reaches_the_engine():
    rng = np.random.default_rng(0)
    actions = [int(a) for a in rng.integers(0, 19, size=120)]
    env = make_env(SCENARIO)
    try:
        obs_a, rew_a = rollout(env, 7, actions)
        obs_b, rew_b = rollout(env, 7, actions)  # the same env, reset with the same seed
        obs_other, _ = rollout(env, 8, actions)  # another seed: the engine plays another game
    finally:
        env.close()
    other = make_env(SCENARIO)
    try:
        obs_c, rew_c = rollout(other, 7, actions)  # a second env, same seed
        engine_seed = other.engine_seed()
    finally:
        other.close()
    assert np.array_equal(obs_a, obs_b) and rew_a == rew_b
    assert np.array_equal(obs_a, obs_c) and rew_a == rew_c
    assert engine_seed == 7  # what the game engine was given at the last reset
    assert obs_other.shape != obs_a.shape or not np.array_equal(obs_other, obs_a)


def play(env, actions: list[int]) -> np.ndarray:
    """Return the observations of playing ``actions`` from the current game's start until it ends."""
    observations = []
    for action in actions:
        obs, _, terminated, truncated, _ = env.step(action)
        observations.append(obs)
        if terminated or truncated:
            break
    return np.stack(observations)


def test_every_game_after_a_seeded_reset_gets_its_own_engine_seed():
    """A seeded env must not replay one game: the same actions meet a new game each episode, reproducibly."""
    actions = [int(a) for a in np.random.default_rng(1).integers(0, 19, size=200)]
    games, seeds = [], []
    for _ in range(2):
        env = make_env(
            OPPONENTS
        )  # without opponents the engine's randomness leaves fixed actions' games alike
        try:
            env.reset(seed=7)
            played = [play(env, actions)]
            engine = [env.engine_seed()]
            for _ in range(2):
                env.reset()  # what a vector env does when a game ends
                played.append(play(env, actions))
                engine.append(env.engine_seed())
        finally:
            env.close()
        games.append(played)
        seeds.append(engine)
    first, second = games
    assert seeds[0] == seeds[1] == [game_seed(7, k) for k in range(3)] and len(set(seeds[0])) == 3
    assert seeds[0][0] == 7  # the first game keeps the seed it was given
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))  # the same games, in order
    for k in (1, 2):  # later games are other games than the first
        assert first[k].shape != first[0].shape or not np.array_equal(first[k], first[0])
    assert game_seed(7, 1) != game_seed(8, 1) and 0 <= game_seed(2**40, 3) < 2**32


class _StubCore:
    """Stands for gfootball's engine core: only the raw observation's ``steps_left`` matters here."""

    def __init__(self):
        self._observation = {"steps_left": 5}
        self._config = {}


class _StubGame(gym.Env):
    """A game that ends after 3 steps, either by running out of time or by a goal."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, core, timeout):
        self.core, self.timeout, self.t = core, timeout, 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t == 3
        self.core._observation = {"steps_left": 0 if (done and self.timeout) else 10 - self.t}
        return np.zeros(2, np.float32), float(done and not self.timeout), done, False, {}


@pytest.mark.parametrize("timeout", [True, False])
def test_time_out_is_truncation_and_other_ends_stay_terminal(timeout):
    core = _StubCore()
    env = FootballEnv(_StubGame(core, timeout), core)
    env.reset()
    outcomes = [env.step(0)[2:4] for _ in range(3)]
    assert outcomes[:2] == [(False, False), (False, False)]
    assert outcomes[2] == ((False, True) if timeout else (True, False))


def test_real_game_that_ends_early_is_terminal():
    env = make_env(SCENARIO, seed=1)
    try:
        env.reset(seed=1)
        terminated = truncated = False
        while not (terminated or truncated):
            _, _, terminated, truncated, _ = env.step(0)  # idle: the ball rolls out, the episode ends
        assert terminated and not truncated and env.steps_left() > 0
    finally:
        env.close()


def test_vec_env_for_sb3_reports_episodes():
    venv = make_vec_env(SCENARIO, n_envs=2, seed=0)
    try:
        obs = venv.reset()
        assert obs.shape == (2, 115)
        obs, rewards, dones, infos = venv.step(np.zeros(2, dtype=np.int64))
        assert rewards.shape == (2,) and len(infos) == 2
    finally:
        venv.close()


def test_bad_input_names_the_problem():
    with pytest.raises(
        ValueError, match="unknown football scenario 'academy_empty_goal_clos'.*academy_empty_goal_close"
    ):
        make_env("gfootball/academy_empty_goal_clos")
    with pytest.raises(ValueError, match="representation must be one of"):
        make_env(SCENARIO, representation="pixels")
    with pytest.raises(ValueError, match="rewards must be"):
        make_env(SCENARIO, rewards="goals")
