"""One place to seed every random number generator an experiment touches."""

from __future__ import annotations


def seed_everything(seed: int, deterministic_torch: bool = False) -> int:
    """Return ``seed`` after seeding Python's ``random``, NumPy and PyTorch (via SB3's ``set_random_seed``)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    from stable_baselines3.common.utils import set_random_seed

    set_random_seed(seed)
    if deterministic_torch:
        import torch

        torch.use_deterministic_algorithms(True)
    return seed
