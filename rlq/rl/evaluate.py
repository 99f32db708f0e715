"""Deterministic, seeded evaluation of any SB3 model or policy (or a plain observation -> action callable)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlq.core.validation import check_positive_int
from rlq.rl.envs import make_vec_env

EVAL_SEED_OFFSET = 10_000
"""Evaluation episodes of a run trained with ``seed`` are seeded ``seed + EVAL_SEED_OFFSET``: apart from the
training episodes' seeds, and the same for every method, precision and rerun compared on that seed."""


@dataclass
class EvalResult:
    """Per-episode returns and lengths of one evaluation, with their summary."""

    returns: list[float]
    lengths: list[int] = field(default_factory=list)

    @property
    def mean(self) -> float:
        """Return the mean episode return."""
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        """Return the standard deviation of the episode returns."""
        return float(np.std(self.returns))


class CallablePolicy:
    """Give a function of a batch of observations the ``predict`` method SB3's evaluation expects."""

    def __init__(self, fn: Callable[[np.ndarray], Any]):
        self.fn = fn

    def predict(self, observation, state=None, episode_start=None, deterministic: bool = True):
        return np.asarray(self.fn(observation)), state


def evaluate(
    model_or_policy: Any,
    env_id: str,
    n_episodes: int = 10,
    seed: int = 0,
    deterministic: bool = True,
    n_envs: int = 1,
    **env_kwargs: Any,
) -> EvalResult:
    """Return every episode's return over ``n_episodes`` on ``env_id``, reproducible for a given ``seed``.

    ``model_or_policy`` is an SB3 algorithm or policy (anything with ``predict``) or a callable mapping a
    batch of observations to a batch of actions. Returns are the environment's real episode returns
    (for Atari: whole games, unclipped). ``n_envs`` environment copies play episodes side by side, so the
    policy acts on batches (fewer network calls); other ``n_envs`` play other episodes than 1 does.
    """
    import torch
    from stable_baselines3.common.evaluation import evaluate_policy

    n_episodes = check_positive_int("n_episodes", n_episodes)
    n_envs = check_positive_int("n_envs", n_envs)
    policy = model_or_policy if hasattr(model_or_policy, "predict") else CallablePolicy(model_or_policy)
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed, **env_kwargs)
    try:
        with torch.random.fork_rng():  # stochastic policies sample reproducibly without touching global state
            torch.manual_seed(seed)
            returns, lengths = evaluate_policy(
                policy,
                env,
                n_eval_episodes=n_episodes,
                deterministic=deterministic,
                return_episode_rewards=True,
            )
    finally:
        env.close()
    return EvalResult([float(r) for r in returns], [int(n) for n in lengths])


def random_policy(env_id: str, seed: int = 0) -> CallablePolicy:
    """Return a policy acting uniformly at random in ``env_id``'s action space (the floor a trained agent must beat)."""
    env = make_vec_env(env_id, n_envs=1, seed=seed)
    space = env.action_space
    env.close()
    space.seed(seed)
    return CallablePolicy(lambda obs: np.stack([space.sample() for _ in range(len(obs))]))
