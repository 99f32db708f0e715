"""Live training progress from Stable-Baselines3: steps, steps/s and the latest return, as progress events.

:class:`rlq.rl.resume.Checkpoints` adds a :class:`TrainingProgress` to every training when someone listens
(:func:`rlq.core.progress.enabled`): ``rlq run`` in a terminal, or JupyterLab. Inside a job of
:func:`rlq.rl.parallel.run_jobs` the training reports under its job, so a job is one bar.
"""

from __future__ import annotations

import re
import time
from collections import deque
from pathlib import Path
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback

from rlq.core import progress
from rlq.rl.episodes import finished_episodes

RETURN_WINDOW = 10
"""The reported return is the mean of this many last finished episodes."""

_RUN_FOLDER = re.compile(r"\d{8}T\d{6}Z-")  # a run folder's name (rlq.experiments.run_folders.new_run_dir)


class TrainingProgress(BaseCallback):
    """Report a training's progress every ``every`` seconds (default :data:`~rlq.core.progress.PROGRESS_SECONDS`).

    ``total_timesteps`` is the step count training ends at (a resumed training starts part-way); ``label``
    names the training when it runs outside a job. Events: ``train_start`` (steps, total), ``train`` (steps,
    steps/s since the last event, mean return of the last :data:`RETURN_WINDOW` episodes), ``train_end``
    (status, steps trained in this call and their seconds).
    """

    def __init__(self, total_timesteps: int, label: str, every: float | None = None):
        super().__init__()
        self.total, self.label = int(total_timesteps), label
        self.every = progress.PROGRESS_SECONDS if every is None else float(every)
        self.id = ""
        self.returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self._start = self._last_time = 0.0
        self._start_steps = self._last_steps = 0
        self._ended = False

    def _on_training_start(self) -> None:
        job = progress.current_job()
        self.id, label = job if job is not None else (progress.new_id(), self.label)
        self._start = self._last_time = time.monotonic()
        self._start_steps = self._last_steps = self.num_timesteps
        progress.emit("train_start", id=self.id, label=label, steps=self.num_timesteps, total=self.total)

    def _on_step(self) -> bool:
        for episode_return, _ in finished_episodes(self.locals.get("infos")):
            self.returns.append(episode_return)
        now = time.monotonic()
        if now - self._last_time >= self.every:
            rate = (self.num_timesteps - self._last_steps) / (now - self._last_time)
            progress.emit(
                "train",
                id=self.id,
                steps=self.num_timesteps,
                total=self.total,
                sps=round(rate, 1),
                **self._return(),
            )
            self._last_time, self._last_steps = now, self.num_timesteps
        return True

    def _on_training_end(self) -> None:
        self.finish("ok")

    def _return(self) -> dict[str, float | int]:
        if not self.returns:
            return {}
        return {"return": round(sum(self.returns) / len(self.returns), 4), "episodes": len(self.returns)}

    def finish(self, status: str, error: BaseException | None = None) -> None:
        """Report the end of training (``ok`` or ``failed``), once."""
        if self._ended or not self.id:
            return
        self._ended = True
        extra = {"error": progress.error_text(error)} if error is not None else {}
        progress.emit(
            "train_end",
            id=self.id,
            status=status,
            steps=self.num_timesteps,
            total=self.total,
            trained=self.num_timesteps - self._start_steps,
            seconds=round(time.monotonic() - self._start, 2),
            **self._return(),
            **extra,
        )


def report_already_trained(total_timesteps: int, steps: int, label: str) -> None:
    """Report a training that has nothing left to do (its checkpoint is at ``steps`` >= ``total_timesteps``)."""
    job = progress.current_job()
    job_id, label = job if job is not None else (progress.new_id(), label)
    progress.emit("train_end", id=job_id, label=label, status="skipped", steps=steps, total=total_timesteps)


def model_label(model: Any, run_dir: Path | None = None) -> str:
    """Return how a training of the SB3 ``model`` outside a job is named: :func:`training_label` of its
    algorithm, environment and seed, or the folder's name (else ``"training"``) where its environment has no id."""
    try:
        env_id = model.get_env().get_attr("spec", indices=[0])[0].id
    except AttributeError:  # an environment without a gymnasium spec
        return run_dir.name if run_dir is not None else "training"
    return training_label(type(model).__name__, env_id, model.seed, run_dir)


def training_label(algo: str, env_id: str, seed: int | None, run_dir: object = None) -> str:
    """Return how a training outside a job is named, e.g. ``"PPO CartPole-v1 seed 0 (qat8)"``.

    The folder it trains in is named unless it is a run folder itself (``<UTC timestamp>-<id>``), a name
    that says nothing of the training.
    """
    label = f"{algo} {env_id}" + (f" seed {seed}" if seed is not None else "")
    name = getattr(run_dir, "name", None) if run_dir is not None else None
    if name and not _RUN_FOLDER.match(name):
        label += f" ({name})"
    return label
