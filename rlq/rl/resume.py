"""Checkpoints, resume and live progress of one SB3 training, as one callback the training's own loop adds.

    checkpoints = Checkpoints(run_folder, every=10_000)
    model = checkpoints.resume(make_model("TD3", env_id, seed=seed), [gst])  # the newest checkpoint's, or this one
    model.learn(total_timesteps - model.num_timesteps, callback=[gst, checkpoints], reset_num_timesteps=False)
    checkpoints.curve  # every finished episode, the earlier attempts' included

``run_folder`` holds ``checkpoints/`` (written every ``every`` steps and at the end of training, the newest
few kept: :mod:`rlq.rl.checkpoints`) and SB3's log under ``sb3/`` (CSV and TensorBoard events, one file per
attempt). :meth:`Checkpoints.resume` hands back the newest complete checkpoint's model, with its replay buffer
and on the fresh model's environments re-seeded past the first attempt's episodes, and gives the callbacks
listed with it (rlq's compression and QAT schedules: a ``checkpoint_key`` and ``state_dict``) the state they
had; without a checkpoint it hands back the fresh model. Training then goes on for what is left of the
steps (``reset_num_timesteps=False``): a finished run trains nothing. Placed after the schedules in
``callback``, the checkpoint at a step holds what they did at that step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from stable_baselines3.common.callbacks import BaseCallback, CallbackList

from rlq.core import progress
from rlq.core.jsonio import read_json
from rlq.core.validation import check_positive_int
from rlq.rl.agents import EpisodeRecorder, quiet_logger, restore_callback_states, stateful_callbacks
from rlq.rl.checkpoints import KEEP_CHECKPOINTS, Checkpointer, latest_checkpoint, move_away_advice
from rlq.rl.training_progress import TrainingProgress, model_label, report_already_trained

SaveModel = Callable[[Any, Path], Any]
LoadModel = Callable[[type, Path, Any], Any]


class Checkpoints(CallbackList):
    """Checkpoints of one training in ``folder`` every ``every`` steps (0: at the end only), and its resume.

    ``folder`` None keeps no checkpoints and no log: the callback then only records the curve and shows progress.

    ``keep``: how many of the newest checkpoints stay. ``save_model(model, path)`` and ``load_model(cls,
    path, env)`` replace SB3's ``model.save(path)`` and ``cls.load(path, env=env)`` (a compressed policy needs
    :class:`rlq.sb3.checkpoint.CompressedCheckpoints`'). ``label`` names the training's progress bar outside
    a job of :func:`rlq.rl.parallel.run_jobs` (default: the model's algorithm, environment and seed, and the
    folder's name unless it is a run folder: :func:`rlq.rl.training_progress.model_label`). After training,
    ``curve`` holds every finished episode, ``wall_time_s`` the seconds trained over every attempt,
    ``resumed_from`` the step this attempt started at (None for a fresh run) and ``last_checkpoint`` the
    newest checkpoint's model file.
    """

    def __init__(
        self,
        folder: str | Path | None,
        every: int = 0,
        *,
        keep: int = KEEP_CHECKPOINTS,
        save_model: SaveModel | None = None,
        load_model: LoadModel | None = None,
        label: str | None = None,
    ):
        super().__init__([])
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ValueError(f"every must be an int >= 0 (0: a checkpoint at the end only), got {every!r}")
        self.folder = Path(folder) if folder is not None else None
        self.every, self.keep = every, check_positive_int("keep", keep)
        self.save_model, self.load_model = save_model, load_model
        self.label = label or (self.folder.name if self.folder is not None else "training")
        self._named = label is not None  # else resume names the training after its model (model_label)
        self.resumed_from: int | None = None
        self.last_checkpoint: Path | None = None
        self.wall_time_s = 0.0
        self._recorder = EpisodeRecorder()
        self._stateful: dict[str, Any] = {}
        self._checkpointer: Checkpointer | None = None
        self._resumed = False
        self._start_steps = 0

    @property
    def checkpoint_dir(self) -> Path | None:
        """Return the folder the checkpoints are in (None without a ``folder``)."""
        return self.folder / "checkpoints" if self.folder is not None else None

    @property
    def curve(self) -> pd.DataFrame:
        """Return the learning curve: one row per finished episode (timestep, return, length, wall time)."""
        return self._recorder.frame()

    def resume(self, model: Any, callbacks: Sequence[BaseCallback] = ()) -> Any:
        """Return the model to train: the newest checkpoint's (its ``callbacks`` restored), else ``model``.

        ``model`` is the fresh model the training would start from; a checkpoint loads as its class, on its
        environments (re-seeded with its seed plus the checkpoint's steps: fresh episodes, not the first
        attempt's again). ``callbacks`` are the schedules the training adds; the state of those with a
        ``checkpoint_key`` is kept in every checkpoint and restored here.
        """
        self._stateful = stateful_callbacks(list(callbacks))
        if not self._named:
            self.label = model_label(model, self.folder)
        checkpoint_dir = self.checkpoint_dir
        found = (
            latest_checkpoint(checkpoint_dir)
            if checkpoint_dir is not None and checkpoint_dir.is_dir()
            else None
        )
        rows: list[dict[str, Any]] = []
        wall_time = 0.0
        if found is not None:
            steps, path = found
            model = self._load(model, steps, path)
            curve = pd.read_csv(checkpoint_dir / f"curve_{steps}_steps.csv", float_precision="round_trip")
            rows = curve.to_dict("records")
            state = read_json(
                checkpoint_dir / f"state_{steps}_steps.json",
                what_to_do=move_away_advice(checkpoint_dir, steps),
            )
            wall_time = float(state.get("wall_time_s", 0.0))
            restore_callback_states(self._stateful, state, path)
            self.resumed_from, self.last_checkpoint = steps, path
        log_folder = self.folder / "sb3" if self.folder is not None else None
        model.set_logger(
            quiet_logger(log_folder, f"progress_from_{model.num_timesteps}.csv", tensorboard=True)
        )
        self._recorder = EpisodeRecorder(rows, wall_time)
        self._resumed = True
        return model

    def _load(self, fresh: Any, steps: int, path: Path) -> Any:
        env = fresh.get_env()
        env.seed(int(fresh.seed or 0) + steps)
        replay = path.parent / f"replay_{steps}_steps.pkl"
        try:
            model = (
                type(fresh).load(path, env=env)
                if self.load_model is None
                else self.load_model(type(fresh), path, env)
            )
            if replay.exists():
                model.load_replay_buffer(replay)
        except Exception as e:  # a truncated or foreign file: say which one, and how to go on
            raise RuntimeError(
                f"checkpoint {path} (or its replay buffer) cannot be loaded: {type(e).__name__}: {e}. "
                + move_away_advice(path.parent, steps)
            ) from e
        return model

    def _init_callback(self) -> None:
        checkpoint_dir = self.checkpoint_dir
        if not self._resumed:
            if checkpoint_dir is not None and latest_checkpoint(checkpoint_dir) is not None:
                raise RuntimeError(
                    f"{self.checkpoint_dir} holds checkpoints: call checkpoints.resume(model, callbacks) "
                    "before learn, so that training continues from the newest one"
                )
            self.resume(self.model)
        self._checkpointer = (
            Checkpointer(
                checkpoint_dir, self.every, self._recorder, self.save_model, self._stateful, keep=self.keep
            )
            if checkpoint_dir is not None
            else None
        )
        total = int(self.model._total_timesteps)
        shown = progress.enabled() and self.model.num_timesteps < total
        self.callbacks = [
            self._recorder,
            *([self._checkpointer] if self._checkpointer is not None else []),
            *([TrainingProgress(total, self.label)] if shown else []),
        ]
        super()._init_callback()

    def _on_training_start(self) -> None:
        self._start_steps = self.num_timesteps
        total = int(self.model._total_timesteps)
        if self.num_timesteps >= total and progress.enabled():
            report_already_trained(total, self.num_timesteps, self.label)
        super()._on_training_start()

    def _on_training_end(self) -> None:
        super()._on_training_end()
        self.wall_time_s = self._recorder.wall_time()
        trained = self.num_timesteps > self._start_steps
        if self._checkpointer is not None and (trained or self.last_checkpoint is None):
            self.last_checkpoint = self._checkpointer.save()
        if trained:  # SB3 writes its log every few episodes or rollouts: write the last ones' too
            self.model.dump_logs()
