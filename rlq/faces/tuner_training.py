"""The sparsity tuner's "train with these settings": a short compressed training run, its curve drawn live."""

from __future__ import annotations

import html
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from stable_baselines3.common.callbacks import BaseCallback

from rlq.experiments.run_folders import new_run_dir, utc_stamp, write_json
from rlq.experiments.tuner_space import TunerSettings
from rlq.rl.episodes import finished_episodes

if TYPE_CHECKING:
    from rlq.faces.widgets import SparsityTuner

EXPERIMENT = "sparsity_tuner_train"


def training_method(settings: TunerSettings) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
    """Return ``(method, gst settings, pruning settings)`` of ``train_compressed`` for the tuner's settings.

    The tuner's GST sparsity is that of the stored B-vectors (as :func:`rlq.faces.widgets.compress_policy`
    prunes them), so a training run caps each layer's compression at what the tuner showed:
    ``1 - (1 - sparsity) / B``.
    """
    if settings.method == "none":
        return "dense", None, None
    if settings.method == "pruning":
        return (
            "pruning",
            None,
            {"final_sparsity": settings.sparsity, "skip_first_last": settings.skip_first_last},
        )
    gst = {
        "block_schedule": ((0.0, settings.block_size),),
        "s_shift": settings.s_shift,
        "skip_first_last": settings.skip_first_last,
    }
    if settings.method == "block_circulant":
        gst["bc_end"] = 1.0  # never handed over to pruning, and the pruning target never rises
        gst["s_shift"] = 1.0
    else:  # train to the compression the tuner evaluated: its sparsity prunes the B-vectors
        gst["sparsity"] = {"max_sparsity": 1.0 - (1.0 - settings.sparsity) / settings.block_size}
    return "gst", gst, None


def train_with_settings(tuner: SparsityTuner, steps: int) -> Path:
    """Return the run folder of ``type(tuner.model)`` trained ``steps`` with the tuner's current settings.

    GST (or magnitude pruning, or dense) through :func:`rlq.experiments.gst.train_compressed`, with the
    tuner's block size, S_shift, target sparsity, skipped layers and hyperparameters, on the tuner's
    environment. The folder is a normal run folder: ``params.json``, ``results.json``, ``history.csv``,
    ``curve.csv`` and checkpoints. The tuner's training figure shows the episode returns as they come,
    beside its dense reference curve.
    """
    from rlq.experiments.gst import train_compressed

    settings = tuner.settings()
    algo = type(tuner.model).__name__
    method, gst, pruning = training_method(settings)
    folder = new_run_dir(tuner.runs_dir, EXPERIMENT)
    hyperparams = json.loads(json.dumps(tuner.hyperparams, default=repr))  # schedules and noise as text
    params = {
        "algorithm": algo,
        "env_id": tuner.env_id,
        "timesteps": steps,
        "seed": tuner.seed,
        "method": method,
    }
    write_json(folder / "params.json", {**params, **asdict(settings), "hyperparams": hyperparams})
    started = {"status": "running", "experiment": EXPERIMENT, "preset": None, "started": utc_stamp()}
    write_json(folder / "results.json", started)
    tuner.train_progress.max, tuner.train_progress.value = steps, 0
    tuner.training_returns, tuner.training_compression = [], []
    tuner.training_label = f"{method}, {settings.label()}"
    tuner.status.value = html.escape(f"training {algo} with {method} into {folder}")
    live = LiveTraining(tuner, every=max(steps // 20, 1))
    run = train_compressed(
        method,
        algo,
        tuner.env_id,
        steps,
        seed=tuner.seed,
        n_envs=8 if algo in ("PPO", "A2C") else 1,
        hyperparams=tuner.hyperparams or None,
        run_dir=folder,
        checkpoint_every=max(steps // 2, 1),
        gst=gst,
        pruning=pruning,
        log_every=max(steps // 50, 1),
        callbacks=[live],
    )
    live.refresh(run.callback, run.curve)
    run.history.to_csv(folder / "history.csv", index=False)
    run.curve.to_csv(folder / "curve.csv", index=False)
    summary = run.summary()
    finished = {"status": "ok", "experiment": EXPERIMENT, "preset": None, "finished": utc_stamp()}
    write_json(
        folder / "results.json",
        {**finished, **{k: v for k, v in summary.items() if k != "method"}, "method": method},
    )
    tuner.status.value = html.escape(
        f"trained: average compression {summary['avg_compression_ratio']:.1%}, "
        f"return {summary['final_train_return']:.1f}; saved in {folder}"
    )
    return folder


class LiveTraining(BaseCallback):
    """Update the tuner's training progress bar and learning-curve figure while SB3 trains."""

    def __init__(self, tuner: SparsityTuner, every: int):
        super().__init__()
        self.tuner, self.every = tuner, every

    def _on_step(self) -> bool:
        for episode_return, _ in finished_episodes(self.locals.get("infos")):
            self.tuner.training_returns.append((self.num_timesteps, episode_return))
        self.tuner.train_progress.value = min(self.num_timesteps, self.tuner.train_progress.max)
        if self.n_calls % self.every == 0:
            self.refresh(self._compression_callback(), None)
        return True

    def _compression_callback(self) -> Any:
        # train_agent hands learn() one flat CallbackList; the compression callback is a sibling of this one
        group = self.locals.get("callback")
        return next((c for c in getattr(group, "callbacks", []) if hasattr(c, "compression_ratio")), None)

    def refresh(self, compression: Any, curve: pd.DataFrame | None) -> None:
        """Redraw the tuner's learning curve from the episode returns and the compression history so far."""
        if curve is not None and len(curve):
            self.tuner.training_returns = list(zip(curve["timestep"], curve["episode_return"], strict=True))
        if compression is not None and len(compression.history):
            history = compression.history
            self.tuner.training_compression = list(
                zip(history["step"], history["compression_ratio"], strict=True)
            )
        self.tuner.redraw_training()
