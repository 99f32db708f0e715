"""Stable-Baselines3 agents: build one with a proper logger, train it with checkpoints, resume it.

Every SB3 model made here writes its logs into the run folder (or nowhere), never into an
``SB3-<timestamp>`` folder in the system's temporary directory.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.logger import CSVOutputFormat, Logger, TensorBoardOutputFormat

from rlq.core.jsonio import read_json
from rlq.rl.algorithms import check_algorithm_name
from rlq.rl.checkpoints import (
    load_newest_checkpoint,
)
from rlq.rl.envs import is_atari, make_vec_env
from rlq.rl.episodes import finished_episodes
from rlq.rl.seeding import seed_everything

if TYPE_CHECKING:
    from rlq.rl.resume import Checkpoints

#: Tuned settings from RL Baselines3 Zoo (hyperparams/*.yml) for the pairs rlq's presets use, with
#: learning-rate schedules replaced by their constants. Anything else starts from SB3's defaults.
TUNED_HYPERPARAMS: dict[tuple[str, str], dict[str, Any]] = {
    ("PPO", "CartPole-v1"): dict(
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=1e-3,
        clip_range=0.2,
    ),
    ("DQN", "CartPole-v1"): dict(
        learning_rate=2.3e-3,
        batch_size=64,
        buffer_size=100_000,
        learning_starts=1000,
        gamma=0.99,
        target_update_interval=10,
        train_freq=256,
        gradient_steps=128,
        exploration_fraction=0.16,
        exploration_final_eps=0.04,
        policy_kwargs=dict(net_arch=[256, 256]),
    ),
    ("A2C", "CartPole-v1"): dict(ent_coef=0.0),
    ("TD3", "Pendulum-v1"): dict(
        gamma=0.98,
        buffer_size=200_000,
        learning_starts=10_000,
        action_noise_std=0.1,
        learning_rate=1e-3,
        policy_kwargs=dict(net_arch=[400, 300]),
    ),
    ("SAC", "Pendulum-v1"): dict(learning_rate=1e-3),
    ("TD3", "HalfCheetah-v5"): dict(learning_starts=10_000, action_noise_std=0.1),
    ("SAC", "HalfCheetah-v5"): dict(learning_starts=10_000),
}


def algorithm_class(name: str) -> type:
    """Return the SB3 algorithm class called ``name`` (case-insensitive), or raise naming the choices."""
    import stable_baselines3 as sb3

    return getattr(sb3, check_algorithm_name(name))


def quiet_logger(
    folder: str | Path | None = None, filename: str = "progress.csv", tensorboard: bool = False
) -> Logger:
    """Return an SB3 logger writing CSV (and with ``tensorboard`` TensorBoard events) into ``folder``.

    None writes nothing at all. An existing ``filename`` is kept: the log goes to ``<stem>.2.csv`` (then
    ``.3``, ...) instead; each logger writes its own events file, so a resumed run adds one beside the first.
    """
    if folder is None:
        return Logger(folder=None, output_formats=[])
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path, stem, n = folder / filename, Path(filename).stem, 2
    while path.exists():  # a later attempt resuming from the same step never overwrites an earlier log
        path, n = folder / f"{stem}.{n}{Path(filename).suffix}", n + 1
    formats = [CSVOutputFormat(str(path))] + ([TensorBoardOutputFormat(str(folder))] if tensorboard else [])
    return Logger(folder=str(folder), output_formats=formats)


def _build_kwargs(algo: str, env, hyperparams: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(hyperparams)
    noise_std = kwargs.pop("action_noise_std", None)
    if noise_std is not None:
        from stable_baselines3.common.noise import NormalActionNoise

        n = env.action_space.shape[0]
        kwargs["action_noise"] = NormalActionNoise(np.zeros(n), noise_std * np.ones(n))
    return kwargs


def make_model(
    algo: str,
    env_id: str,
    seed: int = 0,
    n_envs: int = 1,
    hyperparams: dict[str, Any] | None = None,
    policy: str | None = None,
    log_dir: str | Path | None = None,
    env_kwargs: dict[str, Any] | None = None,
):
    """Return a new SB3 model on ``n_envs`` seeded copies of ``env_id`` (tuned defaults, then ``hyperparams``).

    ``policy`` defaults to ``CnnPolicy`` for Atari and ``MlpPolicy`` otherwise; ``hyperparams`` may hold
    ``action_noise_std`` (Gaussian exploration noise for TD3/DDPG/SAC) besides the algorithm's own arguments.
    ``env_kwargs`` go to :func:`rlq.rl.envs.make_vec_env` (e.g. a football ``representation``).
    """
    cls = algorithm_class(algo)
    seed_everything(seed)
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed, **(env_kwargs or {}))
    # deep copy: SB3 edits policy_kwargs in place (SAC adds use_sde), which must not leak into the caller's dict
    params = copy.deepcopy({**TUNED_HYPERPARAMS.get((algo.upper(), env_id), {}), **(hyperparams or {})})
    policy = policy or ("CnnPolicy" if is_atari(env_id) else "MlpPolicy")
    try:
        model = cls(policy, env, seed=seed, verbose=0, **_build_kwargs(algo, env, params))
    except TypeError as e:
        raise ValueError(f"bad hyperparameter for {algo}: {e}") from e
    model.set_logger(quiet_logger(log_dir))
    return model


class EpisodeRecorder(BaseCallback):
    """Collect every finished episode's return and length with the timestep and wall time it ended at."""

    def __init__(self, rows: list[dict[str, float]] | None = None, wall_offset: float = 0.0):
        super().__init__()
        self.rows = rows if rows is not None else []
        self.wall_offset = wall_offset
        self._start = time.perf_counter()

    def _on_training_start(self) -> None:
        self._start = time.perf_counter()

    def wall_time(self) -> float:
        """Return the seconds of training so far, including earlier attempts of a resumed run."""
        return self.wall_offset + time.perf_counter() - self._start

    def _on_step(self) -> bool:
        for episode_return, episode_length in finished_episodes(self.locals.get("infos")):
            self.rows.append(
                dict(
                    timestep=self.num_timesteps,
                    episode_return=episode_return,
                    episode_length=episode_length,
                    wall_time_s=self.wall_time(),
                )
            )
        return True

    def frame(self) -> pd.DataFrame:
        """Return the learning curve as a DataFrame (one row per finished episode)."""
        return pd.DataFrame(
            self.rows, columns=["timestep", "episode_return", "episode_length", "wall_time_s"]
        )


log = logging.getLogger(__name__)


def stateful_callbacks(callbacks: list[BaseCallback]) -> dict[str, Any]:
    """Return ``{checkpoint_key: callback}`` for the callbacks whose state checkpoints keep.

    A callback takes part when it has a ``checkpoint_key`` attribute and ``state_dict()`` /
    ``load_state_dict()`` methods (e.g. rlq's GST and gradual-pruning callbacks); ``CallbackList``s are
    searched too.
    """
    found: dict[str, Any] = {}
    stack = list(callbacks)
    while stack:
        callback = stack.pop(0)
        if isinstance(callback, CallbackList):
            stack[:0] = list(callback.callbacks)
            continue
        key = getattr(callback, "checkpoint_key", None)
        if key is not None and hasattr(callback, "state_dict") and hasattr(callback, "load_state_dict"):
            if key in found:
                raise ValueError(f"two callbacks share the checkpoint_key {key!r}")
            found[key] = callback
    return found


@dataclass
class TrainedAgent:
    """A trained model with its learning curve."""

    model: Any
    curve: pd.DataFrame
    wall_time_s: float
    resumed_from: int | None
    checkpoint: Path | None


def train_agent(
    model: Any,
    total_timesteps: int,
    checkpoints: Checkpoints | None = None,
    callback: BaseCallback | list[BaseCallback] | None = None,
) -> TrainedAgent:
    """Return ``model`` trained to ``total_timesteps`` steps in all, resuming from ``checkpoints``' newest.

    ``model`` is the fresh model the training starts from (:func:`make_model`); ``checkpoints`` a
    :class:`rlq.rl.resume.Checkpoints` (None: one without a folder, which keeps no checkpoint and only
    records the curve) whose newest checkpoint, when its folder has one, replaces it with its callbacks'
    states restored. Then one ``model.learn`` with ``callback`` followed by ``checkpoints``: the loop a
    notebook writes itself, as one call. With a folder, checkpoints go to ``folder/checkpoints`` and SB3's
    log to ``folder/sb3`` (CSV and TensorBoard events: SB3's ``rollout/``, ``train/`` and ``time/`` keys and
    what callbacks record, such as ``compression/ratio``), so ``tensorboard --logdir runs/`` shows every run's
    curves; a compressed policy needs :class:`rlq.sb3.checkpoint.CompressedCheckpoints`.
    """
    from rlq.rl.resume import Checkpoints  # it builds on this module's recorder and logger

    if total_timesteps < 1:
        raise ValueError(f"total_timesteps must be >= 1, got {total_timesteps}")
    checkpoints = Checkpoints(None) if checkpoints is None else checkpoints
    user_callbacks = [] if callback is None else callback if isinstance(callback, list) else [callback]
    model = checkpoints.resume(model, user_callbacks)
    model.learn(
        total_timesteps - model.num_timesteps,
        callback=[*user_callbacks, checkpoints],
        reset_num_timesteps=False,
    )
    return TrainedAgent(
        model,
        checkpoints.curve,
        checkpoints.wall_time_s,
        checkpoints.resumed_from,
        checkpoints.last_checkpoint,
    )


def restore_callback_states(stateful: dict[str, Any], saved_state: dict[str, Any], path: Path) -> None:
    """Load each stateful callback's state from a checkpoint's state file, or raise naming what is missing."""
    if not stateful:
        return
    saved = saved_state.get("callbacks", {})
    missing = sorted(set(stateful) - set(saved))
    if missing:
        raise RuntimeError(
            f"checkpoint {path} holds no state for the callbacks {missing}; resume with the callbacks "
            "it was trained with, or start a new run folder"
        )
    for key, callback in stateful.items():
        callback.load_state_dict(saved[key])


def load_agent(run_folder: str | Path, env_id: str | None = None):
    """Return the agent of a run folder (its newest checkpoint that loads), on ``env_id`` or the run's own env.

    A damaged newest checkpoint is passed over, with a warning, for the one before it
    (:func:`rlq.rl.checkpoints.load_newest_checkpoint`).
    """
    run_folder = Path(run_folder)
    params = read_json(run_folder / "params.json")
    if not params:
        raise FileNotFoundError(f"{run_folder} is not a run folder (no params.json)")
    if "algorithm" not in params or "env_id" not in params:
        raise ValueError(f"{run_folder}: params.json names no algorithm and env_id; not an agent's run")
    env = make_vec_env(env_id or params["env_id"], n_envs=1, seed=params.get("seed", 0))
    cls = algorithm_class(params["algorithm"])
    _, model = load_newest_checkpoint(run_folder / "checkpoints", lambda path: cls.load(path, env=env))
    model.set_logger(quiet_logger(None))
    return model
