"""One factory for every environment family rlq's experiments use, single and vectorised.

Families: Gymnasium classic control and MuJoCo (``CartPole-v1``, ``HalfCheetah-v5``), Atari through
ale-py with the standard DeepMind preprocessing (``ALE/Breakout-v5``, ``BreakoutNoFrameskip-v4``), and
DeepMind Control through shimmy (``dm_control/cartpole-balance-v0``) with flattened float32 observations
and float32 actions, and Google Research Football (``gfootball/academy_empty_goal_close``; optional,
installed by ``make football``) through shimmy's Gym 0.21 compatibility wrapper.
"""

from __future__ import annotations

import difflib
import os
from typing import Any

import gymnasium as gym
import numpy as np

FAMILIES = (
    "Gymnasium classic control / toy text / Box2D (e.g. CartPole-v1, Pendulum-v1, MountainCar-v0)",
    "MuJoCo (e.g. HalfCheetah-v5, Humanoid-v5, Hopper-v5)",
    "Atari via ale-py (ALE/<Game>-v5 or <Game>NoFrameskip-v4, e.g. ALE/Breakout-v5, PongNoFrameskip-v4)",
    "DeepMind Control via shimmy (dm_control/<domain>-<task>-v0, e.g. dm_control/cartpole-balance-v0)",
    "Google Research Football, optional (gfootball/<scenario>, e.g. gfootball/academy_empty_goal_close)",
)
ATARI_FRAME_STACK = 4


def _register_families(env_id: str) -> None:
    """Register the env families that need a plugin import, only when the id asks for one."""
    if is_atari(env_id):
        import ale_py

        gym.register_envs(ale_py)
    elif is_dm_control(env_id):
        # Without a display, dm_control's automatic OpenGL probe warns; rendering is unavailable anyway.
        if "DISPLAY" not in os.environ:
            os.environ.setdefault("MUJOCO_GL", "disable")
        import shimmy

        gym.register_envs(shimmy)


def is_atari(env_id: str) -> bool:
    """Return True for Atari ids (``ALE/...`` or ``...NoFrameskip-v4``)."""
    return env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4")


FOOTBALL_PREFIX = "gfootball/"


def is_football(env_id: str) -> bool:
    """Return True for Google Research Football ids (``gfootball/<scenario>``)."""
    return env_id.startswith(FOOTBALL_PREFIX)


def is_dm_control(env_id: str) -> bool:
    """Return True for DeepMind Control ids (``dm_control/<domain>-<task>-v0``)."""
    return env_id.startswith("dm_control/")


def check_env_id(env_id: str) -> None:
    """Raise ValueError naming the families rlq knows when ``env_id`` is not a registered environment."""
    if not isinstance(env_id, str) or not env_id:
        raise ValueError(f"env id must be a non-empty string, got {env_id!r}")
    if is_football(env_id):
        from rlq.rl.football import check_scenario

        check_scenario(env_id.removeprefix(FOOTBALL_PREFIX))
        return
    _register_families(env_id)
    if env_id in gym.envs.registry:
        return
    if not (is_atari(env_id) or is_dm_control(env_id)):
        # an Atari or dm_control id may be close to the one asked for: make them part of the suggestions
        _register_families("ALE/Pong-v5")
    close = difflib.get_close_matches(env_id, list(gym.envs.registry), n=3, cutoff=0.7)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise ValueError(
        f"unknown environment id {env_id!r}.{hint} rlq knows these families:\n  - " + "\n  - ".join(FAMILIES)
    )


class Float32Action(gym.ActionWrapper):
    """Expose a float64 Box action space as float32 (what SB3 policies emit) and convert back."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.action_space
        self.action_space = gym.spaces.Box(
            space.low.astype(np.float32), space.high.astype(np.float32), space.shape, np.float32
        )

    def action(self, action: np.ndarray) -> np.ndarray:
        return np.asarray(action, dtype=self.env.action_space.dtype)


def _atari_wrapper(env: gym.Env, env_id: str, **kwargs: Any) -> gym.Env:
    from stable_baselines3.common.atari_wrappers import AtariWrapper

    # ALE/...-v5 skips 4 frames itself (made with frameskip=1 below); NoFrameskip-v4 gets the wrapper's skip.
    return AtariWrapper(env, frame_skip=4, **kwargs)


def _make_raw(env_id: str, render_mode: str | None = None, **kwargs: Any) -> gym.Env:
    """Return the environment of ``env_id`` with its family's standard wrappers, unseeded."""
    check_env_id(env_id)
    atari_kwargs = kwargs.pop("atari_wrapper_kwargs", {})
    if is_football(env_id):
        from rlq.rl.football import make_football

        if render_mode is not None:
            raise ValueError("football environments are made without rendering (0.76 s a frame off-screen)")
        return make_football(env_id.removeprefix(FOOTBALL_PREFIX), **kwargs)
    if is_atari(env_id):
        if env_id.startswith("ALE/"):
            kwargs.setdefault("frameskip", 1)
        env = gym.make(env_id, render_mode=render_mode, **kwargs)
        return _atari_wrapper(env, env_id, **atari_kwargs)
    env = gym.make(env_id, render_mode=render_mode, **kwargs)
    if is_dm_control(env_id):
        env = gym.wrappers.FlattenObservation(env)
        space = env.observation_space
        env = gym.wrappers.TransformObservation(
            env,
            lambda obs: obs.astype(np.float32),
            gym.spaces.Box(
                space.low.astype(np.float32), space.high.astype(np.float32), space.shape, np.float32
            ),
        )
        env = Float32Action(env)
    return env


def make_env(env_id: str, seed: int | None = None, render_mode: str | None = None, **kwargs: Any) -> gym.Env:
    """Return a single Gymnasium env of any known family, seeded (first reset and action space) when asked.

    Atari envs get SB3's ``AtariWrapper`` (no-op reset, frame skip 4, episodic life, fire reset, 84x84
    grey frames, clipped reward); frame stacking is done by :func:`make_vec_env`. Extra ``kwargs`` go to
    ``gymnasium.make`` (``atari_wrapper_kwargs`` to the Atari wrapper).
    """
    env = _make_raw(env_id, render_mode=render_mode, **kwargs)
    if seed is not None:
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env


def make_vec_env(
    env_id: str, n_envs: int = 1, seed: int | None = None, vec_env: str = "dummy", **kwargs: Any
):
    """Return an SB3 ``VecEnv`` of ``n_envs`` monitored copies (episode returns in ``info['episode']``).

    Atari: the Monitor sits under the Atari wrapper, so reported returns are the game's real returns,
    and 4 frames are stacked. ``vec_env`` is ``"dummy"`` (one process) or ``"subproc"``.
    """
    from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack

    if n_envs < 1:
        raise ValueError(f"n_envs must be >= 1, got {n_envs}")
    if vec_env not in ("dummy", "subproc"):
        raise ValueError(f"vec_env must be 'dummy' or 'subproc', got {vec_env!r}")
    check_env_id(env_id)
    atari_kwargs = kwargs.pop("atari_wrapper_kwargs", {})
    if is_atari(env_id):
        if env_id.startswith("ALE/"):
            kwargs.setdefault("frameskip", 1)
        venv = sb3_make_vec_env(
            env_id,
            n_envs=n_envs,
            seed=seed,
            env_kwargs=kwargs,
            wrapper_class=lambda e: _atari_wrapper(e, env_id, **atari_kwargs),
            vec_env_cls=SubprocVecEnv if vec_env == "subproc" else DummyVecEnv,
        )
        return VecFrameStack(venv, n_stack=ATARI_FRAME_STACK)
    return sb3_make_vec_env(
        lambda **kw: _make_raw(env_id, **kwargs),
        n_envs=n_envs,
        seed=seed,
        vec_env_cls=SubprocVecEnv if vec_env == "subproc" else DummyVecEnv,
    )
