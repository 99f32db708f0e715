"""One compressed training run (dense, pruning or GST) with checkpoints, as the sparsity tuner trains it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from stable_baselines3.common.callbacks import BaseCallback

from rlq.sb3.compression import CompressionCallback
from rlq.sb3.gst_callback import GSTCallback
from rlq.sb3.pruning_callback import GradualPruningCallback

METHODS = ("dense", "pruning", "gst")
"""The compression methods of the GST notebooks: dense training, Zhu & Gupta's gradual (iterative) pruning, GST."""


@dataclass
class CompressedRun:
    """One training run with a compression method, as the GST notebooks use it."""

    method: str
    model: Any
    callback: CompressionCallback
    curve: pd.DataFrame
    wall_time_s: float
    resumed_from: int | None

    @property
    def history(self) -> pd.DataFrame:
        """Return the callback's history (see :data:`HISTORY_COLUMNS`)."""
        return self.callback.history

    @property
    def average_compression_ratio(self) -> float:
        """Return the compression ratio averaged over the training updates."""
        return self.callback.average_compression_ratio()

    def summary(self, last_episodes: int = 10) -> dict[str, Any]:
        """Return the run's headline numbers as one table row.

        ``final_train_return`` is the mean return of the last ``last_episodes`` training episodes.
        """
        history = self.history
        returns = self.curve["episode_return"].tail(last_episodes)
        return {
            "method": self.method,
            "timesteps": int(self.model.num_timesteps),
            "avg_compression_ratio": self.average_compression_ratio,
            "start_compression_ratio": float(history["compression_ratio"].iloc[0]),
            "final_compression_ratio": float(history["compression_ratio"].iloc[-1]),
            "covered_fraction": self.callback.covered_fraction,
            "final_train_return": float(returns.mean()) if len(returns) else float("nan"),
            "episodes": len(self.curve),
            "wall_time_s": self.wall_time_s,
        }


def make_callback(
    method: str,
    gst: dict[str, Any] | None = None,
    pruning: dict[str, Any] | None = None,
    reward_window: int = 10,
    log_every: int = 1000,
) -> CompressionCallback:
    """Return the callback of ``method``: ``"dense"`` (records only), ``"pruning"`` or ``"gst"``.

    ``gst`` holds :class:`GSTCallback`'s settings (GSTConfig fields), ``pruning`` those of
    :class:`GradualPruningCallback` (``final_sparsity`` required).
    """
    common = dict(reward_window=reward_window, log_every=log_every)
    if method == "dense":
        return CompressionCallback(**common)
    if method == "gst":
        return GSTCallback(**common, **(gst or {}))
    if method == "pruning":
        settings = dict(pruning or {})
        if "final_sparsity" not in settings:
            raise ValueError("the pruning method needs pruning={'final_sparsity': ...}")
        return GradualPruningCallback(**settings, **common)
    raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")


def train_compressed(  # noqa: PLR0913
    method: str,
    algo: str,
    env_id: str,
    total_timesteps: int,
    *,
    seed: int = 0,
    n_envs: int = 1,
    hyperparams: dict[str, Any] | None = None,
    policy: str | None = None,
    run_dir: str | Path | None = None,
    checkpoint_every: int = 0,
    gst: dict[str, Any] | None = None,
    pruning: dict[str, Any] | None = None,
    reward_window: int = 10,
    log_every: int = 1000,
    callbacks: list[BaseCallback] | None = None,
    env_kwargs: dict[str, Any] | None = None,
    callback: CompressionCallback | None = None,
) -> CompressedRun:
    """Return a run of ``algo`` on ``env_id`` trained with compression ``method`` (see :func:`make_callback`).

    ``callback``, when given, is the compression callback itself (a fresh one, built by the caller) and
    ``method`` only names it; ``gst``, ``pruning``, ``reward_window`` and ``log_every`` are then unused.

    Training goes through :func:`rlq.rl.agents.train_agent` with compressed checkpoints
    (:func:`rlq.sb3.checkpoint.save_compressed`) every ``checkpoint_every`` steps into ``run_dir``; calling
    it again with the same ``run_dir`` resumes from the newest checkpoint, schedule state included.
    ``callbacks`` run after the compression callback (e.g. live progress in :mod:`rlq.faces.widgets`);
    ``env_kwargs`` go to every env made (:func:`rlq.rl.envs.make_vec_env`).
    """
    from rlq.rl.agents import train_agent
    from rlq.sb3.checkpoint import load_compressed, save_compressed

    if callback is None:
        callback = make_callback(method, gst, pruning, reward_window, log_every)
    result = train_agent(
        algo,
        env_id,
        total_timesteps,
        seed=seed,
        n_envs=n_envs,
        hyperparams=hyperparams,
        run_dir=run_dir,
        checkpoint_every=checkpoint_every,
        callback=[callback, *(callbacks or [])],
        policy=policy,
        save_model=save_compressed,
        load_model=load_compressed,
        env_kwargs=env_kwargs,
    )
    if callback.layers is None:  # a finished run resumed: learn() did not run, attach the model for measures
        callback.init_callback(result.model)
    return CompressedRun(
        method, result.model, callback, result.curve, result.wall_time_s, result.resumed_from
    )
