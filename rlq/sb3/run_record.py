"""One compressed training run as plain data: its summary row and its tables, each labelled by the run's keys.

What a notebook's per-run function returns after ``model.learn``::

    return compression_record({"env_id": env_id, "seed": seed, "method": method}, gst, checkpoints, evaluation)

The result is picklable (a worker process sends it back) and has the shape a run folder's job store keeps and
a published run's tables rebuild: ``keys``, ``summary`` (one row), ``history``, ``curve``, ``events`` and
``layers``.
"""

from __future__ import annotations

from typing import Any

from rlq.rl.evaluate import EvalResult
from rlq.rl.resume import Checkpoints
from rlq.sb3.compression import CompressionCallback

LAST_EPISODES = 10
"""The training episodes whose mean return is a run's ``final_train_return``, unless told otherwise."""


def compression_summary(
    callback: CompressionCallback, checkpoints: Checkpoints, last_episodes: int = LAST_EPISODES
) -> dict[str, Any]:
    """Return a run's headline numbers: steps, average, first and last compression, coverage, returns, time.

    ``final_train_return`` is the mean return of the last ``last_episodes`` training episodes (NaN without one).
    """
    history, curve = callback.history, checkpoints.curve
    returns = curve["episode_return"].tail(last_episodes)
    return {
        "timesteps": int(checkpoints.model.num_timesteps),
        "avg_compression_ratio": callback.average_compression_ratio(),
        "start_compression_ratio": float(history["compression_ratio"].iloc[0]),
        "final_compression_ratio": float(history["compression_ratio"].iloc[-1]),
        "covered_fraction": callback.covered_fraction,
        "final_train_return": float(returns.mean()) if len(returns) else float("nan"),
        "episodes": len(curve),
        "wall_time_s": checkpoints.wall_time_s,
    }


def compression_record(
    keys: dict[str, Any],
    callback: CompressionCallback,
    checkpoints: Checkpoints,
    evaluation: EvalResult | None = None,
    last_episodes: int = LAST_EPISODES,
) -> dict[str, Any]:
    """Return one run trained with ``callback`` and ``checkpoints``: its keys, summary row and tables.

    The summary is ``keys`` followed by :func:`compression_summary`, the ``evaluation``'s mean and standard
    deviation (``eval_return``, ``eval_std``) when there is one, and ``resumed_from``; ``history`` and
    ``events`` are the callback's, ``curve`` the training episodes, ``layers`` the compressed layers, each
    with the ``keys`` as columns.
    """
    if callback.layers is None:  # nothing was left to train: attach the model for its measures
        callback.init_callback(checkpoints.model)
    keys = dict(keys)
    summary = {**keys, **compression_summary(callback, checkpoints, last_episodes)}
    if evaluation is not None:
        summary |= {"eval_return": evaluation.mean, "eval_std": evaluation.std}
    summary["resumed_from"] = checkpoints.resumed_from
    return {
        "keys": keys,
        "summary": summary,
        "history": callback.history.assign(**keys),
        "curve": checkpoints.curve.assign(**keys),
        "events": callback.events.assign(**keys),
        "layers": callback.layer_report().assign(**keys),
    }
