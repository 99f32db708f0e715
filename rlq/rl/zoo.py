"""RL Baselines3 Zoo's tuned settings, read from the YAML files the installed ``rl_zoo3`` package ships.

rl-zoo3 (Raffin, https://github.com/DLR-RM/rl-baselines3-zoo) keeps one ``hyperparams/<algo>.yml`` per
algorithm: per environment a training budget (``n_timesteps``), a number of parallel environments
(``n_envs``), a policy and the algorithm's constructor arguments, written in the zoo's own shorthand
(``lin_0.001`` for a linear schedule, ``policy_kwargs: "dict(net_arch=[64, 64])"``, ``noise_type`` and
``noise_std`` for exploration noise). :func:`zoo_hyperparams` reads one entry and turns it into what
:func:`rlq.rl.agents.make_model` takes. The files are read directly (``rl_zoo3`` itself is never imported:
it pulls in much of the zoo's training machinery), so the values are the installed package's, not copies.

Settings rlq cannot honour raise :class:`ZooSettingError` instead of being dropped silently: observation or
reward normalisation (``normalize``, a ``VecNormalize`` wrapper rlq's training and evaluation do not
apply), environment wrappers and callbacks other than the Atari preprocessing rlq already applies, and
``policy_kwargs`` naming anything but literals, ``dict(...)``, ``nn.<activation>`` or ``RMSpropTFLike``.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlq.rl.algorithms import check_algorithm_name
from rlq.rl.envs import ATARI_FRAME_STACK, is_atari

ATARI_ENTRY = "atari"
"""The zoo's one entry for every Atari game (``env_wrapper: AtariWrapper``, ``frame_stack: 4``)."""

ATARI_WRAPPER = "stable_baselines3.common.atari_wrappers.AtariWrapper"

ACTIVATIONS = ("ReLU", "Tanh", "ELU", "GELU", "LeakyReLU", "SiLU", "Sigmoid")
"""``nn.<name>`` values a ``policy_kwargs`` string may name (``activation_fn=nn.ReLU``)."""


class ZooSettingError(ValueError):
    """A zoo entry holds a setting rlq cannot honour, or the zoo has no entry for the pair asked for."""


@dataclass(frozen=True)
class LinearSchedule:
    """The zoo's ``lin_<x>``: ``initial`` times the remaining progress (1 at the start of training, 0 at the end).

    A class rather than rl_zoo3's closure, so that a schedule pickles into worker processes and checkpoints.
    """

    initial: float

    def __call__(self, progress_remaining: float) -> float:
        return progress_remaining * self.initial


DEFAULT_NOISE_STD = 0.1
"""rl-zoo3's exploration noise standard deviation when an entry names a ``noise_type`` without ``noise_std``."""


@dataclass(frozen=True)
class ZooSettings:
    """One entry of rl-zoo3's ``hyperparams/<algo>.yml``, as :func:`rlq.rl.agents.make_model` takes it."""

    algorithm: str
    """The SB3 algorithm name, e.g. ``"DQN"``."""
    env_id: str
    """The environment asked for (the zoo entry may be its shared ``atari`` one)."""
    n_timesteps: int
    """The zoo's training budget in environment steps (over all parallel environments)."""
    n_envs: int
    """Parallel training environments (the zoo's default is 1)."""
    policy: str
    """The SB3 policy name, e.g. ``"MlpPolicy"``."""
    hyperparams: dict[str, Any] = field(default_factory=dict)
    """The algorithm's constructor arguments: schedules as :class:`LinearSchedule`, ``policy_kwargs`` as a
    dict, exploration noise as an ``action_noise`` object."""
    source: str = ""
    """The YAML file and entry read, named inside the installed package (no machine path), e.g.
    ``"rl_zoo3/hyperparams/dqn.yml: CartPole-v1"``."""
    noise_type: str | None = None
    """The entry's ``noise_type`` (``"normal"``, ``"ornstein-uhlenbeck"``), None without exploration noise."""
    noise_std: float | None = None
    """The noise's standard deviation per action dimension (the zoo's default 0.1 when the entry names a type)."""


def zoo_folder() -> Path:
    """Return the folder of the installed ``rl_zoo3``'s ``hyperparams/*.yml``, found without importing it."""
    spec = importlib.util.find_spec("rl_zoo3")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("rl_zoo3 is not installed; `pip install rl_zoo3` to read the zoo's tuned settings")
    return Path(spec.submodule_search_locations[0]) / "hyperparams"


def zoo_file(algorithm: str) -> Path:
    """Return the path of the zoo's ``<algo>.yml`` for ``algorithm``, or raise naming the algorithms it has."""
    path = zoo_folder() / f"{check_algorithm_name(algorithm).lower()}.yml"
    if not path.exists():
        have = sorted(p.stem.upper() for p in zoo_folder().glob("*.yml"))
        raise ZooSettingError(f"rl-zoo3 has no {path.name}; it tunes {', '.join(have)}")
    return path


def zoo_entries(algorithm: str) -> dict[str, dict[str, Any]]:
    """Return every entry of the zoo's ``<algo>.yml`` as the YAML holds it (environment id -> settings)."""
    import yaml

    with open(zoo_file(algorithm)) as f:
        return yaml.safe_load(f) or {}


def zoo_env_ids(algorithm: str) -> list[str]:
    """Return the environment ids (and ``atari``) the zoo tunes ``algorithm`` for, sorted."""
    return sorted(zoo_entries(algorithm))


def zoo_entry(algorithm: str, env_id: str) -> tuple[dict[str, Any], str]:
    """Return the zoo's entry for ``algorithm`` on ``env_id`` as the YAML holds it, and where it was read.

    Atari ids without an entry of their own use the zoo's ``atari`` entry. Raises :class:`ZooSettingError`
    for a pair the zoo does not tune (listing what it tunes for ``algorithm``) and for settings rlq cannot
    honour (see the module's docstring). Reads the YAML only: a quick check before a kernel starts.
    """
    algorithm = check_algorithm_name(algorithm)
    entries = zoo_entries(algorithm)
    key = (
        env_id if env_id in entries else ATARI_ENTRY if is_atari(env_id) and ATARI_ENTRY in entries else None
    )
    if key is None:
        raise ZooSettingError(
            f"rl-zoo3 has no {algorithm} settings for {env_id!r}; its {zoo_file(algorithm).name} tunes: "
            f"{', '.join(sorted(entries))}"
        )
    raw, where = dict(entries[key]), f"rl_zoo3/hyperparams/{zoo_file(algorithm).name}: {key}"
    _check_supported(dict(raw), env_id, where)
    if "n_timesteps" not in raw:
        raise ZooSettingError(f"{where} gives no n_timesteps")
    return raw, where


def zoo_hyperparams(algorithm: str, env_id: str) -> ZooSettings:
    """Return rl-zoo3's tuned settings and budget for ``algorithm`` on ``env_id``, ready for ``make_model``.

    The entry is :func:`zoo_entry`'s (which raises for unknown pairs and settings rlq cannot honour).
    """
    raw, where = zoo_entry(algorithm, env_id)
    _check_supported(raw, env_id, where)  # drops the zoo-only keys rlq honours already
    n_timesteps, n_envs = int(float(raw.pop("n_timesteps"))), int(raw.pop("n_envs", 1))
    policy = str(raw.pop("policy", "MlpPolicy"))
    noise_type, noise_std = raw.pop("noise_type", None), raw.pop("noise_std", None)
    if noise_type is not None:
        noise_std = float(noise_std if noise_std is not None else DEFAULT_NOISE_STD)
    noise = _action_noise(noise_type, noise_std, env_id, where)
    hyperparams = {name: _value(name, value, where) for name, value in raw.items()}
    if noise is not None:
        hyperparams["action_noise"] = noise
    return ZooSettings(
        check_algorithm_name(algorithm),
        env_id,
        n_timesteps,
        n_envs,
        policy,
        hyperparams,
        where,
        noise_type=noise_type,
        noise_std=noise_std,
    )


def zoo_td3_settings(env_id: str) -> tuple[int, dict[str, Any]]:
    """Return rl-zoo3's TD3 budget and hyperparameters for ``env_id``, as :func:`rlq.rl.agents.make_model` takes them.

    Read from the installed ``rl_zoo3``'s ``td3.yml`` (:func:`zoo_hyperparams`). The zoo's Gaussian
    exploration noise becomes ``action_noise_std`` (so the settings stay JSON, as a run folder records them);
    the replay buffer is capped at the budget, which it never outgrows. Raises
    :class:`rlq.rl.zoo.ZooSettingError` for a task the zoo does not tune TD3 on, or for settings one TD3
    environment with Gaussian noise cannot take (parallel environments, other noise).
    """
    settings = zoo_hyperparams("TD3", env_id)
    if settings.n_envs != 1 or settings.policy != "MlpPolicy":
        raise ZooSettingError(
            f"{settings.source} trains {settings.n_envs} environments with {settings.policy}; "
            "zoo_td3_settings trains one environment with an MlpPolicy"
        )
    hyperparams = dict(settings.hyperparams)
    if hyperparams.pop("action_noise", None) is not None:
        if settings.noise_type != "normal":
            raise ZooSettingError(
                f"{settings.source} explores with {settings.noise_type} noise; zoo_td3_settings takes Gaussian noise only"
            )
        hyperparams["action_noise_std"] = settings.noise_std
    hyperparams["buffer_size"] = min(int(hyperparams.get("buffer_size", 1_000_000)), settings.n_timesteps)
    return settings.n_timesteps, hyperparams


def _check_supported(raw: dict[str, Any], env_id: str, where: str) -> None:
    """Drop the zoo-only keys rlq already honours from ``raw``; raise for those it cannot."""
    normalize = raw.pop("normalize", False)
    if normalize not in (False, None, "false", "False"):
        raise ZooSettingError(
            f"{where} trains with normalize: {normalize} (VecNormalize); rlq trains and evaluates without "
            "observation/reward normalisation, so these settings would not reproduce the zoo's agent"
        )
    wrappers = raw.pop("env_wrapper", None)
    frame_stack = raw.pop("frame_stack", None)
    atari_ok = is_atari(env_id) and wrappers in (ATARI_WRAPPER, [ATARI_WRAPPER])
    if wrappers is not None and not atari_ok:
        raise ZooSettingError(f"{where} wraps the environment in {wrappers}; rlq cannot apply that wrapper")
    if frame_stack is not None and not (is_atari(env_id) and int(frame_stack) == ATARI_FRAME_STACK):
        raise ZooSettingError(
            f"{where} stacks {frame_stack} frames; rlq stacks {ATARI_FRAME_STACK} for Atari only"
        )
    for key in ("callback", "vec_env_wrapper", "env_kwargs", "normalize_kwargs", "frame_skip"):
        if key in raw:
            raise ZooSettingError(f"{where} sets {key}: {raw[key]!r}, which rlq's training cannot apply")


def _value(name: str, value: Any, where: str) -> Any:
    """Return one constructor argument in SB3's terms: ``lin_<x>`` a schedule, ``policy_kwargs`` a dict."""
    if isinstance(value, str) and value.startswith("lin_"):
        return LinearSchedule(float(value[len("lin_") :]))
    if name == "policy_kwargs" and isinstance(value, str):
        return parse_policy_kwargs(value, where)
    if name == "train_freq" and isinstance(value, list):
        return tuple(value)  # the zoo writes [1, "episode"]; SB3 reads a tuple
    return value


def _action_noise(noise_type: str | None, noise_std: float | None, env_id: str, where: str) -> Any:
    """Return the zoo's exploration noise (``noise_std`` per action dimension) for ``env_id`` as SB3 action noise, or None."""
    if noise_type is None:
        return None
    import numpy as np
    from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise

    from rlq.rl.envs import make_env

    env = make_env(env_id)
    n = int(np.prod(env.action_space.shape))
    env.close()
    if noise_type == "normal":
        return NormalActionNoise(mean=np.zeros(n), sigma=noise_std * np.ones(n))
    if noise_type == "ornstein-uhlenbeck":
        return OrnsteinUhlenbeckActionNoise(mean=np.zeros(n), sigma=noise_std * np.ones(n))
    raise ZooSettingError(f"{where}: unknown noise_type {noise_type!r}")


def parse_policy_kwargs(text: str, where: str = "policy_kwargs") -> dict[str, Any]:
    """Return the zoo's ``policy_kwargs`` string (``"dict(net_arch=[64, 64])"``) as a dict, parsed without ``eval``."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ZooSettingError(f"{where}: policy_kwargs {text!r} is not a Python expression: {e}") from None
    value = _literal(tree, text, where)
    if not isinstance(value, dict):
        raise ZooSettingError(f"{where}: policy_kwargs {text!r} is not a dict")
    return value


def _literal(node: ast.expr, text: str, where: str) -> Any:
    """Return the value of a literal, ``dict(...)`` call, ``nn.<activation>`` or ``RMSpropTFLike`` node."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "dict"
        and not node.args
    ):
        return {k.arg: _literal(k.value, text, where) for k in node.keywords if k.arg is not None}
    if isinstance(node, ast.Dict) and None not in node.keys:  # a None key is a ** unpacking
        pairs = zip(node.keys, node.values, strict=True)
        return {_literal(k, text, where): _literal(v, text, where) for k, v in pairs}
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_literal(e, text, where) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("nn", "th"):
        if node.attr in ACTIVATIONS:
            import torch.nn as nn

            return getattr(nn, node.attr)
    if isinstance(node, ast.Name) and node.id == "RMSpropTFLike":
        from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike

        return RMSpropTFLike
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise ZooSettingError(
            f"{where}: policy_kwargs {text!r} names {ast.unparse(node)!r}, which rlq does not know how to build"
        ) from None
