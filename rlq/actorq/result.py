"""What an ActorQ run reports: the time breakdown's keys, its progress for callbacks, and its result."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from rlq.actorq.actor import ACTOR_TIMERS
from rlq.actorq.config import ActorQConfig

LEARNER_TIMERS = (
    "learner_insert",
    "learner_sample",
    "learner_update",
    "broadcast",
    "learner_wait",
    "evaluate",
    "checkpoint",
    "setup",
    "shutdown",
    "driver_other",
)
"""Breakdown keys of the driver's time (learner, broadcaster, evaluation, start-up), in seconds."""
BREAKDOWN_KEYS = ACTOR_TIMERS + LEARNER_TIMERS
"""Every key of :attr:`ActorQResult.breakdown`."""
HISTORY_COLUMNS = [
    "wall_time_s",
    "env_steps",
    "learner_steps",
    "eval_return",
    "eval_return_std",
    "policy_version",
    "actor_mean_abs_pre_tanh",
    "actor_saturated_share",
]
EPISODE_COLUMNS = ["env_steps", "actor_id", "episode_return"]
PER_ACTOR_COLUMNS = ["actor_id", "env_steps", "env_step_share", "episodes", "restarts", "lost"]


@dataclass
class TrainingProgress:
    """What a ``train`` callback sees after each round of learner updates."""

    learner_steps: int
    """Gradient steps done so far."""
    env_steps: int
    """Transitions inserted into the replay buffer so far."""
    wall_time_s: float
    """Training wall-clock so far (evaluation and checkpoints excluded)."""
    eval_return: float | None
    """Latest evaluation return, None before the first."""
    actors: list[Any]
    """The actors: Ray actor handles (``backend="ray"``) or the in-process ``ActorWorker`` objects."""
    backend: str
    """``local`` or ``ray``."""


@dataclass
class ActorQResult:
    """The outcome of :func:`train`: learning curve, time breakdown and communication cost."""

    config: ActorQConfig
    """The configuration it ran with."""
    history: pd.DataFrame
    """One row per evaluation: wall_time_s (training wall-clock), env_steps, learner_steps, eval_return(_std), policy_version."""
    breakdown: dict[str, float]
    """Seconds per component (:data:`BREAKDOWN_KEYS`). Actor keys are summed over actors; with the local backend all
    keys add up to ``elapsed_s``, with Ray the learner keys do and the actors ran beside them."""
    bytes_per_broadcast: int
    """Size of one broadcast blob in bytes."""
    elapsed_s: float
    """Seconds of this run, start-up, evaluation and earlier attempts of a resumed run included."""
    wall_time_s: float
    """Training wall-clock: ``elapsed_s`` less start-up, evaluation and checkpoints."""
    env_steps: int
    """Transitions collected by the actors."""
    learner_steps: int
    """Gradient steps of the learner."""
    broadcasts: int
    """Policies published."""
    actor_backend: str
    """Inference engine the actors used, e.g. ``onnx-int8``."""
    backend_timings: dict[str, dict[str, float]]
    """Measured batch-1 latency and load time per candidate engine (when ``actor_backend="auto"``)."""
    actor_steps_per_s: float
    """Environment steps per second of one busy actor (steps / actor seconds, pulls and loads included)."""
    actor_restarts: int
    """Times a Ray actor died and was restarted, each death once: those the driver saw, and at the end of the run
    those it did not (an actor that died after it last heard from it), from Ray's own count."""
    actors_lost: int
    """Actors that died for good (out of restarts)."""
    episodes: pd.DataFrame
    """Training episodes the actors finished: env_steps, actor_id, episode_return."""
    per_actor: pd.DataFrame
    """One row per actor: env_steps it sent, env_step_share (of all), episodes it finished, restarts, lost. A restarted
    actor loses the chunks it was running and a lost one stops sending: their shares show what that cost."""
    resumed_from: int | None
    """Learner step this run resumed from, or None."""
    checkpoint: Path | None
    """Newest checkpoint's model file, or None."""
    model: Any = field(repr=False, default=None)
    """The learner's SB3 model (fp32)."""

    def time_to_learned_return(self, threshold: float) -> float | None:
        """Return the training wall-clock at which the evaluation return first reached ``threshold``; None where
        none did or where the untrained policy's evaluation already did (:func:`time_to_learned_return`)."""
        return time_to_learned_return(self.history, threshold)

    def breakdown_shares(self, keys: tuple[str, ...] = ACTOR_TIMERS) -> dict[str, float]:
        """Return each of ``keys``' share of their summed time."""
        total = sum(self.breakdown[k] for k in keys)
        return {k: (self.breakdown[k] / total if total > 0 else 0.0) for k in keys}


def time_to_return(history: pd.DataFrame, threshold: float, column: str = "wall_time_s") -> float | None:
    """Return the first ``column`` (wall_time_s or env_steps) with ``eval_return`` >= ``threshold``, or None."""
    reached = history[history["eval_return"] >= threshold]
    return None if reached.empty else float(reached[column].iloc[0])


def time_to_learned_return(
    history: pd.DataFrame, threshold: float, column: str = "wall_time_s"
) -> float | None:
    """Return :func:`time_to_return` where the run's first evaluation, its untrained policy's, scored below
    ``threshold``; else None: a threshold the untrained policy already meets times no learning (on
    cartpole-balance an untrained policy can score over 600 of 1000)."""
    if len(history) and history["eval_return"].iloc[0] >= threshold:
        return None
    return time_to_return(history, threshold, column)
