"""QuaRL evaluations: many deterministic episodes at once, and when an fp32 agent counts as having solved its task."""

from __future__ import annotations

from typing import Any

from rlq.core.validation import check_positive_int
from rlq.rl.evaluate import EvalResult, evaluate

MAX_PARALLEL_EPISODES = 50
"""At most this many episodes are played side by side (one environment copy each)."""

STATED_THRESHOLDS: dict[str, float] = {"Pendulum-v1": -200.0}
"""Solved thresholds for environments Gymnasium gives none: ours, stated here. Pendulum-v1: a mean return of
-200 or better is a pendulum swung up and held from every start (random play scores about -1200, rl-zoo3's
tuned TD3 and SAC about -150)."""


def evaluate_episodes(policy: Any, env_id: str, n_episodes: int, seed: int) -> EvalResult:
    """Return the deterministic returns of ``n_episodes`` episodes played side by side (:func:`rlq.rl.evaluate.evaluate`).

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
