"""The ActorQ learner: an SB3 off-policy agent trained in fp32 with SB3's own ``train()`` on its replay buffer.

The learner never steps an environment: actors' transitions are written into the model's replay buffer
and ``model.train(gradient_steps, batch_size)`` does the updates exactly as ``learn()`` would. With
``policy_block_size`` the policy's hidden-to-hidden layers are block-circulant from the start
(:func:`rlq.actorq.policy.block_circulant_policy_`) and train as B-vectors in fp32. Checkpoints hold the SB3
model (:func:`rlq.sb3.checkpoint.save_compressed`, which keeps a compressed policy's structure), its replay
buffer and the run's bookkeeping, so training resumes.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from rlq.actorq.actor import ChunkResult
from rlq.actorq.config import IDENTITY_FIELDS, ActorQConfig, ActorQConfigError
from rlq.core.jsonio import read_json, write_json
from rlq.rl.agents import algorithm_class, make_model, quiet_logger
from rlq.sb3.checkpoint import load_compressed, save_compressed

log = logging.getLogger(__name__)

CONFIG_FILE, STATE_FILE = "config.json", "state.json"


def sb3_hyperparams(config: ActorQConfig) -> dict[str, Any]:
    """Return the SB3 constructor arguments of the learner's model."""
    activation = {"relu": nn.ReLU, "tanh": nn.Tanh}[config.activation]
    critic = list(config.critic_hidden_sizes or config.hidden_sizes)
    return {
        **config.hyperparams,
        "policy_kwargs": {
            "net_arch": {"pi": list(config.hidden_sizes), "qf": critic},
            "activation_fn": activation,
        },
        "batch_size": config.batch_size,
        "buffer_size": config.buffer_size,
        "gamma": config.gamma,
        "learning_rate": config.learning_rate,
        "learning_starts": 0,
        "device": config.device,
    }


def near_zero_policy_output_(model: Any, scale: float) -> None:
    """Initialise the last layer of a TD3/DDPG/D4PG policy (and its target) near zero: truncated normal weights of
    std ``sqrt(scale / fan_in)``, zero bias (Acme's ``NearZeroInitializedLinear``); 0 leaves it as it is.

    With PyTorch's default initialisation a 2048-wide policy's pre-tanh outputs reach |x| of about 4 after one
    update at lr 1e-3, where tanh's gradient has all but vanished; starting near zero keeps them in its
    linear range while the critic learns.
    """
    mu = getattr(model.actor, "mu", None)
    if not scale or not isinstance(mu, nn.Sequential) or not hasattr(model, "actor_target"):
        return  # SAC's Gaussian policy has no deterministic output layer of this kind
    last = [m for m in mu if isinstance(m, nn.Linear)][-1]
    std = math.sqrt(scale / last.in_features)
    with torch.no_grad():
        nn.init.trunc_normal_(last.weight, std=std, a=-2 * std, b=2 * std)
        last.bias.zero_()
    model.actor_target.load_state_dict(model.actor.state_dict())


def policy_saturation(model: Any, observations: np.ndarray, threshold: float = 0.99) -> tuple[float, float]:
    """Return the policy's mean |pre-tanh output| on ``observations`` and the share of actions beyond ``threshold``.

    A policy whose tanh saturates (most actions at +-1) gets almost no gradient through it: these two numbers
    in a run's history show it happening.
    """
    actor = model.actor
    layers = list(actor.mu) if isinstance(getattr(actor, "mu", None), nn.Sequential) else []
    if not layers or not isinstance(layers[-1], nn.Tanh) or len(observations) == 0:
        return float("nan"), float("nan")
    with torch.no_grad():
        obs = torch.as_tensor(np.asarray(observations), dtype=torch.float32, device=model.device)
        pre = nn.Sequential(*layers[:-1])(actor.extract_features(obs, actor.features_extractor))
    return float(pre.abs().mean()), float((pre.tanh().abs() > threshold).float().mean())


class Learner:
    """Holds the SB3 model; inserts actors' transitions, runs gradient steps, saves and loads checkpoints."""

    def __init__(self, model, batch_size: int):
        self.model = model
        self.batch_size = batch_size
        self.sample_seconds = 0.0
        self._time_sampling()

    @classmethod
    def create(cls, config: ActorQConfig) -> Learner:
        """Return a learner with a new SB3 model for ``config`` (seeded with ``config.seed``)."""
        if config.algorithm != "D4PG":
            model = make_model(
                config.algorithm, config.env_id, seed=config.seed, hyperparams=sb3_hyperparams(config)
            )
            near_zero_policy_output_(model, config.policy_output_init)
            return cls._structured(model, config)
        from rlq.actorq.d4pg import D4PG
        from rlq.rl.envs import make_vec_env
        from rlq.rl.seeding import seed_everything

        seed_everything(config.seed)
        env = make_vec_env(config.env_id, n_envs=1, seed=config.seed)
        try:
            model = D4PG(
                "MlpPolicy",
                env,
                seed=config.seed,
                verbose=0,
                max_grad_norm=config.max_grad_norm,
                **sb3_hyperparams(config),
            )
        except TypeError as e:
            raise ActorQConfigError(f"bad hyperparameter for D4PG: {e}") from e
        near_zero_policy_output_(model, config.policy_output_init)
        model.set_logger(quiet_logger(None))
        return cls._structured(model, config)

    @classmethod
    def _structured(cls, model, config: ActorQConfig) -> Learner:
        """Return the learner of ``model`` with its policy made block-circulant when ``policy_block_size`` is set."""
        if config.policy_block_size is not None:
            from rlq.actorq.policy import block_circulant_policy_

            block_circulant_policy_(model, config.policy_block_size)
        return cls(model, config.batch_size)

    def _time_sampling(self) -> None:
        # SB3's train() samples and updates in one loop: time the sampling to split the two.
        buffer = self.model.replay_buffer
        original = type(buffer).sample

        def timed_sample(batch_size: int, env=None):
            start = time.perf_counter()
            out = original(buffer, batch_size, env=env)
            self.sample_seconds += time.perf_counter() - start
            return out

        buffer.sample = timed_sample

    @property
    def buffer_size(self) -> int:
        """Return the number of transitions in the replay buffer."""
        return self.model.replay_buffer.size()

    def saturation(self, n: int = 256) -> tuple[float, float]:
        """Return :func:`policy_saturation` on the ``n`` observations inserted last (no sampling: no RNG drawn)."""
        buffer = self.model.replay_buffer
        size = buffer.size()
        if size == 0:
            return float("nan"), float("nan")
        idx = (buffer.pos - 1 - np.arange(min(n, size))) % buffer.buffer_size
        return policy_saturation(self.model, buffer.observations[idx, 0])

    def insert(self, chunk: ChunkResult) -> None:
        """Write one chunk of transitions into the replay buffer (time limits marked as timeouts)."""
        from stable_baselines3.common.buffers import NStepReplayBuffer, ReplayBuffer

        buffer = self.model.replay_buffer
        done = chunk.terminated | chunk.truncated
        timeouts = chunk.truncated & ~chunk.terminated
        n = chunk.steps
        if isinstance(buffer, NStepReplayBuffer) and n and not chunk.terminated[-1]:
            # The next transition in the buffer is another actor's: an n-step return must stop here and
            # bootstrap from this chunk's last next observation, as at a time limit.
            timeouts = timeouts.copy()
            timeouts[-1] = True
        if (
            type(buffer) not in (ReplayBuffer, NStepReplayBuffer)
            or buffer.optimize_memory_usage
            or buffer.n_envs != 1
            or n >= buffer.buffer_size
        ):
            for t in range(n):
                buffer.add(
                    chunk.obs[t : t + 1], chunk.next_obs[t : t + 1], chunk.actions[t : t + 1],
                    chunk.rewards[t : t + 1], done[t : t + 1], [{"TimeLimit.truncated": bool(timeouts[t])}],
                )  # fmt: skip
            return
        idx = (buffer.pos + np.arange(n)) % buffer.buffer_size
        buffer.observations[idx, 0] = chunk.obs.reshape(n, *buffer.obs_shape)
        buffer.next_observations[idx, 0] = chunk.next_obs.reshape(n, *buffer.obs_shape)
        buffer.actions[idx, 0] = chunk.actions.reshape(n, buffer.action_dim)
        buffer.rewards[idx, 0] = chunk.rewards
        buffer.dones[idx, 0] = done
        if buffer.handle_timeout_termination:
            buffer.timeouts[idx, 0] = timeouts
        buffer.full = buffer.full or buffer.pos + n >= buffer.buffer_size
        buffer.pos = (buffer.pos + n) % buffer.buffer_size

    def update(self, gradient_steps: int) -> tuple[float, float]:
        """Return ``(sample seconds, update seconds)`` of ``gradient_steps`` SB3 gradient steps."""
        sampled = self.sample_seconds
        start = time.perf_counter()
        self.model.train(gradient_steps=gradient_steps, batch_size=self.batch_size)
        total = time.perf_counter() - start
        sample = self.sample_seconds - sampled
        return sample, total - sample

    # --- checkpoints ---------------------------------------------------------------------------------

    def save(self, folder: Path, learner_steps: int, state: dict[str, Any]) -> Path:
        """Return the path of a checkpoint of model, replay buffer and ``state`` written atomically now."""
        folder.mkdir(parents=True, exist_ok=True)
        model_path = folder / f"learner_{learner_steps}.zip"
        replay_path = folder / f"replay_{learner_steps}.pkl"
        tmp_model, tmp_replay = folder / ".tmp_learner.zip", folder / ".tmp_replay.pkl"
        save_compressed(self.model, tmp_model)
        buffer = self.model.replay_buffer
        del buffer.sample  # the timing wrapper is a closure: pickle the plain buffer
        try:
            self.model.save_replay_buffer(tmp_replay)
        finally:
            self._time_sampling()
        os.replace(tmp_model, model_path)
        os.replace(tmp_replay, replay_path)
        write_json(
            folder / STATE_FILE,
            {**state, "learner_steps": learner_steps, "model": model_path.name, "replay": replay_path.name},
        )  # written last: its presence marks a complete checkpoint
        for old in [*folder.glob("learner_*.zip"), *folder.glob("replay_*.pkl")]:
            if old.name not in (model_path.name, replay_path.name):
                old.unlink()
        return model_path

    @classmethod
    def load(cls, config: ActorQConfig, folder: Path) -> tuple[Learner, dict[str, Any]]:
        """Return the learner and saved state of the checkpoint in ``folder``."""
        state = read_json(folder / STATE_FILE)
        model_path, replay_path = folder / state["model"], folder / state["replay"]
        try:
            if config.algorithm == "D4PG":
                from rlq.actorq.d4pg import D4PG as algorithm
            else:
                algorithm = algorithm_class(config.algorithm)
            model = load_compressed(algorithm, model_path, device=config.device)
            model.load_replay_buffer(replay_path)
        except Exception as e:  # a truncated or foreign file: say which one
            raise RuntimeError(
                f"ActorQ checkpoint {model_path} (or its replay buffer) cannot be loaded: {type(e).__name__}: {e}. "
                "Move the checkpoint folder away to start afresh."
            ) from e
        model.set_logger(quiet_logger(None))
        return cls(model, config.batch_size), state


def has_checkpoint(folder: str | os.PathLike | None) -> bool:
    """Return whether ``folder`` holds a complete ActorQ checkpoint."""
    return folder is not None and (Path(folder) / STATE_FILE).is_file()


def check_resumable(config: ActorQConfig) -> None:
    """Raise ActorQConfigError when the checkpoint folder belongs to a run with another identity."""
    if config.checkpoint_dir is None:
        return
    folder = Path(config.checkpoint_dir)
    saved = read_json(folder / CONFIG_FILE) if (folder / CONFIG_FILE).is_file() else None
    if saved is None:
        return
    mine = config.to_dict()
    differ = [
        f"{k}: {saved.get(k)!r} there, {mine[k]!r} here" for k in IDENTITY_FIELDS if saved.get(k) != mine[k]
    ]
    if differ:
        raise ActorQConfigError(
            f"checkpoint_dir {folder} holds a run with another configuration ({'; '.join(differ)}); "
            "use a new folder or the same settings"
        )


def write_config(config: ActorQConfig) -> None:
    """Write ``config`` into its checkpoint folder (once, at the start of a run)."""
    if config.checkpoint_dir is None:
        return
    folder = Path(config.checkpoint_dir)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / CONFIG_FILE, config.to_dict())
