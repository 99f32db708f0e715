"""Deterministic, seeded evaluation of any SB3 model or policy (or a plain observation -> action callable)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from rlq.core.validation import check_positive_int
from rlq.rl.envs import make_vec_env

EVAL_SEED_OFFSET = 10_000
"""Evaluation episodes of a run trained with ``seed`` are seeded ``seed + EVAL_SEED_OFFSET``: apart from the
training episodes' seeds, and the same for every method, precision and rerun compared on that seed."""

CALIBRATION_SEED_OFFSET = 20_000
"""The rollout that calibrates a quantized policy of a run trained with ``seed`` is seeded ``seed +
CALIBRATION_SEED_OFFSET``: apart from the training and the evaluation episodes (:data:`EVAL_SEED_OFFSET`)."""

MAX_PARALLEL_EPISODES = 50
"""At most this many episodes are played side by side by :func:`evaluate_episodes` (one environment copy each)."""

STATED_THRESHOLDS: dict[str, float] = {"Pendulum-v1": -200.0}
"""Solved thresholds for environments Gymnasium gives none: ours, stated here. Pendulum-v1: a mean return of
-200 or better is a pendulum swung up and held from every start (random play scores about -1200, rl-zoo3's
tuned TD3 and SAC about -150)."""


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


def evaluate_episodes(policy: Any, env_id: str, n_episodes: int, seed: int) -> EvalResult:
    """Return the deterministic returns of ``n_episodes`` episodes played side by side (:func:`evaluate`).

    What matters here is that every precision of an agent plays the same episodes. One environment copy per
    episode (up to :data:`MAX_PARALLEL_EPISODES`) lets the policy act on a batch of observations: about ten
    times fewer network calls than one episode at a time, which is what a 20-episode bit sweep costs.
    """
    n_envs = min(check_positive_int("n_episodes", n_episodes), MAX_PARALLEL_EPISODES)
    return evaluate(policy, env_id, n_episodes, seed, deterministic=True, n_envs=n_envs)


def solved_threshold(env_id: str) -> tuple[float | None, str]:
    """Return the mean return at which an agent has solved ``env_id``, and where the number comes from.

    Gymnasium's ``reward_threshold`` where the environment declares one (CartPole-v1 475, Acrobot-v1
    -100), else :data:`STATED_THRESHOLDS`, else ``(None, "none")``: no agent counts as solved.
    """
    import gymnasium as gym

    from rlq.rl.envs import check_env_id

    check_env_id(env_id)  # registers the env's family (Atari, dm_control) so that its spec is found
    try:
        threshold = gym.spec(env_id).reward_threshold
    except gym.error.Error:
        threshold = None
    if threshold is not None:
        return float(threshold), "Gymnasium's reward_threshold"
    if env_id in STATED_THRESHOLDS:
        return STATED_THRESHOLDS[env_id], "stated by rlq (Gymnasium gives none)"
    return None, "none"


def mark_solved(table: pd.DataFrame, reference: pd.Series) -> pd.DataFrame:
    """Return ``table`` (one row per evaluation) with ``run`` and ``solved`` columns added.

    ``run`` is ``"<algorithm> <environment>"``; ``solved`` says whether the agent of that run and ``seed``
    reaches its environment's threshold (:func:`solved_threshold`) in its ``reference`` row (a boolean mask of
    ``table``: the fp32 evaluation, one per run and seed).
    """
    table = table.assign(run=table["algorithm"] + " " + table["environment"])
    fp32 = table[reference].set_index(["run", "seed"])["mean_return"]
    thresholds = {env: solved_threshold(env)[0] for env in table["environment"].unique()}
    table["solved"] = [
        thresholds[env] is not None and fp32[(run, seed)] >= thresholds[env]
        for run, seed, env in zip(table.run, table.seed, table.environment, strict=True)
    ]
    return table
