"""One place to seed every random number generator an experiment touches."""

from __future__ import annotations

from rlq.core.validation import check_non_negative_int


def seed_everything(seed: int, deterministic_torch: bool = False) -> int:
    """Return ``seed`` after seeding Python's ``random``, NumPy and PyTorch (via SB3's ``set_random_seed``)."""
    check_non_negative_int("seed", seed)
    from stable_baselines3.common.utils import set_random_seed

    set_random_seed(seed)
    if deterministic_torch:
        import torch

        torch.use_deterministic_algorithms(True)
    return seed
