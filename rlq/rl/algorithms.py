"""The SB3 algorithms rlq trains, by name: checked without importing Stable-Baselines3 (3.5 s here)."""

from __future__ import annotations

from typing import Any

ALGORITHM_NAMES = ("A2C", "PPO", "DQN", "TD3", "SAC", "DDPG")


def check_algorithm_name(name: Any) -> str:
    """Return ``name`` as SB3 spells it (case-insensitive), or raise ValueError naming the choices."""
    key = name.upper() if isinstance(name, str) else None
    if key not in ALGORITHM_NAMES:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHM_NAMES)}")
    return key
