"""Evaluation of a broadcast ActorQ policy, acting as the actors act (same engine and precision), without noise."""

from __future__ import annotations

import numpy as np

from rlq.actorq.broadcast import decode_policy
from rlq.actorq.config import ActorQConfig
from rlq.actorq.inference import make_engine
from rlq.actorq.policy import PolicyArchitecture
from rlq.rl.evaluate import EVAL_SEED_OFFSET


class Evaluator:
    """Evaluates a broadcast policy as the actors act with it (same engine and precision), without noise.

    Every evaluation plays ``eval_episodes`` episodes on one environment kept open, episode ``k`` reset
    with seed ``seed + EVAL_SEED_OFFSET + k``, so that all evaluations of a run (and of runs with the same seed)
    face the same episodes.
    """

    def __init__(self, config: ActorQConfig, arch: PolicyArchitecture, backend: str):
        from rlq.rl.envs import make_env

        self.config, self.arch = config, arch
        self.engine = make_engine(arch, config.actor_precision, backend)
        self.env = make_env(config.env_id)

    def __call__(self, blob: bytes) -> tuple[float, float]:
        returns, _, _ = self.play(blob)
        return float(np.mean(returns)), float(np.std(returns))

    def play(self, blob: bytes) -> tuple[list[float], np.ndarray, np.ndarray]:
        """Return each evaluation episode's return, every observation the policy acted on (float32, stacked) and
        the noise-free action in [-1, 1] it took on each."""
        self.engine.load(decode_policy(blob))
        returns, seen, taken = [], [], []
        for k in range(self.config.eval_episodes):
            obs, _ = self.env.reset(seed=self.config.seed + EVAL_SEED_OFFSET + k)
            total, done = 0.0, False
            while not done:
                obs = np.asarray(obs, dtype=np.float32).reshape(1, -1)
                seen.append(obs)
                out = self.engine(obs)
                action = np.tanh(out[0][0]) if self.arch.stochastic else out[0][0]
                taken.append(action)
                obs, reward, terminated, truncated, _ = self.env.step(self.arch.unscale(action))
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
        return returns, np.concatenate(seen), np.stack(taken)

    def actions(self, obs: np.ndarray) -> np.ndarray:
        """Return the loaded policy's noise-free actions in [-1, 1], one observation a call as an actor acts.

        One call each, not one batch: an engine that quantizes its inputs per call (PyTorch's dynamic int8
        takes one scale per batch) acts on a batch otherwise than on its rows.
        """
        rows = [self.engine(row.reshape(1, -1))[0][0] for row in np.asarray(obs, dtype=np.float32)]
        out = np.stack(rows)
        return np.tanh(out) if self.arch.stochastic else out

    def close(self) -> None:
        """Close the evaluation environment."""
        self.env.close()


def engine_agreement(config: ActorQConfig, model, reference: str = "torch") -> dict[str, object]:
    """Return how the run's actor engine and ``reference`` act with the same final policy, on the same episodes.

    ``model`` is the learner's (an :class:`~rlq.actorq.ActorQResult`'s ``model``); its policy is broadcast at
    ``config.broadcast_precision`` and loaded into both engines at ``config.actor_precision``, and each plays
    ``config.eval_episodes`` evaluation episodes from the same seeds. Keys: ``engine`` and ``reference`` (the
    backends), ``returns`` and ``reference_returns`` (per episode), ``max_abs_action_difference`` (the largest
    difference of the two engines' actions on every observation the reference acted on; actions in [-1, 1])
    and ``observations`` (how many).
    """
    from rlq.actorq.broadcast import encode_policy
    from rlq.actorq.policy import architecture_of, policy_weights

    if config.actor_backend == "auto":
        raise ValueError(
            "engine_agreement compares a named actor_backend with the reference; this run chose auto"
        )
    arch = architecture_of(model)
    blob = encode_policy(policy_weights(model), config.broadcast_precision, 0)
    engine, other = Evaluator(config, arch, config.actor_backend), Evaluator(config, arch, reference)
    try:
        returns, _, _ = engine.play(blob)
        reference_returns, seen, reference_actions = other.play(blob)  # the reference's own actions on them
        difference = np.abs(engine.actions(seen) - reference_actions).max()
    finally:
        engine.close()
        other.close()
    return dict(
        engine=config.actor_backend,
        reference=reference,
        returns=returns,
        reference_returns=reference_returns,
        max_abs_action_difference=float(difference),
        observations=len(seen),
    )
