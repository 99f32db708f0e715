"""The sparsity tuner's "train with these settings": a short compressed training run, its curve drawn live."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from stable_baselines3.common.callbacks import BaseCallback

from rlq.experiments.run_folders import new_run_dir, short_path, utc_stamp, write_json
from rlq.experiments.tuner_space import TunerSettings
from rlq.rl.episodes import finished_episodes
from rlq.rl.evaluate import evaluate

if TYPE_CHECKING:
    from rlq.faces.widgets import SparsityTuner

EXPERIMENT = "sparsity_tuner_train"


@dataclass(frozen=True)
class TunerTraining:
    """How the tuner's "Train with these settings" trains: ``steps`` environment steps of ``type(model)`` with
    ``hyperparams`` (give the tuned agent's, so that its learning curve ``reference_curve``, a frame with
    ``timestep`` and ``episode_return``, is a fair dense reference), into a run folder under ``runs_dir``
    (None: the default runs folder)."""

    steps: int = 20_000
    runs_dir: str | Path | None = None
    hyperparams: dict[str, Any] = field(default_factory=dict)
    reference_curve: pd.DataFrame | None = None

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be an int >= 1, got {self.steps!r}")


LAST_EPISODES = 10
"""Training episodes whose mean return is the run's ``final_train_return``."""


def training_method(settings: TunerSettings) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
    """Return ``(method, GST settings, pruning settings)`` of a training with the tuner's settings (:func:`training_callback`).

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


def training_callback(settings: TunerSettings, log_every: int) -> Any:
    """Return the compression callback that trains with the tuner's settings (dense: one that only records)."""
    from rlq.sb3 import CompressionCallback, GradualPruningCallback, GSTCallback

    method, gst, pruning = training_method(settings)
    if method == "gst":
        return GSTCallback(**gst, log_every=log_every)
    if method == "pruning":
        return GradualPruningCallback(**pruning, log_every=log_every)
    return CompressionCallback(log_every=log_every)


def training_label(settings: TunerSettings) -> str:
    """Return what "train with these settings" trains, in words, e.g. ``GST B=4, s=0.50, S_shift 1.00, fp32``.

    Training is always in fp32 (the bits only apply to the tuner's evaluations), and the sparsity is the
    target of the schedule (of the B-vectors under GST), reached over training.
    """
    method, gst, pruning = training_method(settings)
    layers = "" if settings.skip_first_last else ", all layers"
    if method == "dense":
        return "dense, fp32"
    if method == "pruning":
        return f"pruning to s={settings.sparsity:.2f}{layers}, fp32"
    if settings.method == "block_circulant":
        return f"block-circulant B={settings.block_size}{layers}, fp32"
    return f"GST B={settings.block_size}, s={settings.sparsity:.2f}, S_shift {settings.s_shift:.2f}{layers}, fp32"


def train_with_settings(tuner: SparsityTuner, steps: int) -> Path:
    """Return the run folder of ``type(tuner.model)`` trained ``steps`` with the tuner's current settings.

    GST (or magnitude pruning, or dense: :func:`training_callback`) in one ``model.learn``, with the
    tuner's block size, S_shift, target sparsity, skipped layers and hyperparameters, on the tuner's
    environment. The folder is a normal run folder: ``params.json``, ``results.json``, ``history.csv``,
    ``curve.csv`` and checkpoints. The tuner's training figure shows the episode returns as they come,
    beside its dense reference curve. The finished policy is then evaluated as the tuner evaluates a
    point (``tuner.n_episodes`` deterministic episodes seeded ``tuner.seed``, ``tuner.seed + 1``, ...):
    that evaluation (``eval_return``) and the mean of the last training episodes
    (``final_train_return``, exploration included) are two numbers, and the status line names both.
    ``tuner.train_cancel``, once set, stops the training at its next step: the folder keeps a checkpoint
    at that step and ``results.json`` says ``cancelled``.
    """
    from rlq.rl.agents import make_model
    from rlq.sb3.checkpoint import CompressedCheckpoints
    from rlq.sb3.run_record import compression_summary

    settings = tuner.settings()
    algo = type(tuner.model).__name__
    method, _, _ = training_method(settings)
    folder = new_run_dir(tuner.runs_dir, EXPERIMENT)
    shown = short_path(folder)
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
    tuner.training_returns, tuner.training_compression, tuner.training_final = [], [], None
    tuner.training_label = training_label(settings)
    tuner.show_status(f"training {algo}: {tuner.training_label}. Folder: {shown}")
    live = LiveTraining(tuner, every=max(steps // 20, 1))
    compression = training_callback(settings, log_every=max(steps // 50, 1))
    checkpoints = CompressedCheckpoints(folder, every=max(steps // 2, 1))
    agent = make_model(algo, tuner.env_id, seed=tuner.seed, n_envs=8 if algo in ("PPO", "A2C") else 1,
                       hyperparams=tuner.hyperparams or None)  # fmt: skip
    model = checkpoints.resume(agent, [compression])
    model.learn(
        steps - model.num_timesteps, callback=[compression, live, checkpoints], reset_num_timesteps=False
    )
    compression.history.to_csv(folder / "history.csv", index=False)
    checkpoints.curve.to_csv(folder / "curve.csv", index=False)
    summary = compression_summary(compression, checkpoints, LAST_EPISODES)
    reached = int(model.num_timesteps)
    if reached < steps:  # cancelled
        live.refresh(compression, checkpoints.curve)
        _finish(folder, "cancelled", summary, method)
        tuner.show_status(
            f"training cancelled at step {reached:,} of {steps:,} (checkpoint kept). Folder: {shown}"
        )
        return folder
    returns = [
        evaluate(model, tuner.env_id, n_episodes=1, seed=tuner.seed + i).returns[0]
        for i in range(tuner.n_episodes)
    ]
    summary |= {"eval_return": sum(returns) / len(returns), "eval_episodes": len(returns)}
    tuner.training_final = (reached, summary["eval_return"], len(returns))
    live.refresh(compression, checkpoints.curve)
    _finish(folder, "ok", summary, method)
    last = min(LAST_EPISODES, len(checkpoints.curve))
    tuner.show_status(
        f"trained {reached:,} steps, average compression {summary['avg_compression_ratio']:.1%}. "
        f"Final policy evaluated on {len(returns)} seeded episodes: return {summary['eval_return']:.1f}; "
        f"last {last} training episodes (the curve): {summary['final_train_return']:.1f}. Folder: {shown}"
    )
    return folder


def _finish(folder: Path, status: str, summary: dict[str, Any], method: str) -> None:
    """Write the training run's ``results.json`` as finished with ``status`` (ok or cancelled)."""
    finished = {"status": status, "experiment": EXPERIMENT, "preset": None, "finished": utc_stamp()}
    write_json(folder / "results.json", {**finished, **summary, "method": method})


class LiveTraining(BaseCallback):
    """Update the tuner's training progress bar and learning-curve figure while SB3 trains; stop when cancelled."""

    def __init__(self, tuner: SparsityTuner, every: int):
        super().__init__()
        self.tuner, self.every = tuner, every

    def _on_step(self) -> bool:
        for episode_return, _ in finished_episodes(self.locals.get("infos")):
            self.tuner.training_returns.append((self.num_timesteps, episode_return))
        self.tuner.train_progress.value = min(self.num_timesteps, self.tuner.train_progress.max)
        if self.n_calls % self.every == 0:
            self.refresh(self._compression_callback(), None)
        return not self.tuner.train_cancel.is_set()  # False stops SB3's learn() at this step

    def _compression_callback(self) -> Any:
        # learn() gets one flat CallbackList; the compression callback is a sibling of this one
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
