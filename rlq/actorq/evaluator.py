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
        self.engine.load(decode_policy(blob))
        returns = []
        for k in range(self.config.eval_episodes):
            obs, _ = self.env.reset(seed=self.config.seed + EVAL_SEED_OFFSET + k)
            total, done = 0.0, False
            while not done:
                out = self.engine(np.asarray(obs, dtype=np.float32).reshape(1, -1))
                action = np.tanh(out[0][0]) if self.arch.stochastic else out[0][0]
                obs, reward, terminated, truncated, _ = self.env.step(self.arch.unscale(action))
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
        return float(np.mean(returns)), float(np.std(returns))

    def close(self) -> None:
        """Close the evaluation environment."""
        self.env.close()
