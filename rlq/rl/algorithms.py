"""The SB3 algorithms rlq trains, by name, and which of them wrote a model file: both without importing
Stable-Baselines3 (3.5 s here)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

ALGORITHM_NAMES = ("A2C", "PPO", "DQN", "TD3", "SAC", "DDPG")


def check_algorithm_name(name: Any) -> str:
    """Return ``name`` as SB3 spells it (case-insensitive), or raise ValueError naming the choices."""
    key = name.upper() if isinstance(name, str) else None
    if key not in ALGORITHM_NAMES:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHM_NAMES)}")
    return key


SIGNATURES = (
    ("PPO", ("n_epochs", "clip_range")),
    ("A2C", ("vf_coef", "gae_lambda")),
    ("DQN", ("exploration_schedule", "target_update_interval")),
    ("SAC", ("target_entropy", "ent_coef")),
    ("TD3", ("policy_delay", "target_policy_noise", "target_noise_clip")),
)
"""Hyperparameters only one family of SB3 algorithms stores in a model file's ``data``, checked in this order
(PPO stores A2C's too). TD3 and DDPG store the same ones: DDPG is TD3 with one policy update per critic update
and no target noise clipping."""


def algorithm_of_model_data(data: dict[str, Any], where: str = "the model file") -> str:
    """Return the SB3 algorithm that wrote ``data``, the JSON of a model file's ``data`` entry.

    SB3 saves every hyperparameter of the algorithm in it (``n_epochs``, ``policy_delay``, ...) and the policy
    class's module; the algorithm is read from these, never by unpickling them. A file written by another
    library (``sb3_contrib``, say) raises ValueError naming ``where`` and the policy's module.
    """
    policy = data.get("policy_class")
    module = str(policy.get("__module__", "")) if isinstance(policy, dict) else ""
    if not module.startswith("stable_baselines3."):
        raise ValueError(
            f"{where}: its policy class comes from {module or 'no module'!r}, not from Stable-Baselines3; "
            f"rlq reads models of {', '.join(ALGORITHM_NAMES)}"
        )
    for name, keys in SIGNATURES:
        if all(key in data for key in keys):
            if name == "TD3" and data.get("policy_delay") == 1 and data.get("target_noise_clip") == 0.0:
                return "DDPG"
            return name
    raise ValueError(f"{where}: its hyperparameters match none of {', '.join(ALGORITHM_NAMES)}")


def algorithm_of_model_file(path: str | Path) -> str:
    """Return the SB3 algorithm that saved the model file ``path`` (:func:`algorithm_of_model_data`).

    A file that is not an SB3 model file (not a zip, no ``data`` entry, damaged JSON) raises ValueError
    naming it and what is wrong, in one line.
    """
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            data = json.loads(archive.read("data"))
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError, UnicodeDecodeError, EOFError) as e:
        raise ValueError(f"{path} is not a Stable-Baselines3 model file ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a Stable-Baselines3 model file (its data entry is not an object)")
    return algorithm_of_model_data(data, str(path))
