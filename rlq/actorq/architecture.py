"""The architecture of the acting network: what an actor needs to rebuild it (NumPy only, no torch import).

Kept apart from :mod:`rlq.actorq.policy` so that an ONNX Runtime actor process never imports PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# SAC's clamp of the log standard deviation (stable_baselines3.sac.policies.LOG_STD_MIN / LOG_STD_MAX).
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


@dataclass(frozen=True)
class PolicyArchitecture:
    """What an actor needs to rebuild the acting network from broadcast weights (plain, picklable values)."""

    obs_dim: int
    """Length of the flat observation."""
    act_dim: int
    """Length of the action."""
    hidden_sizes: tuple[int, ...]
    """Widths of the hidden layers."""
    activation: str
    """Hidden activation: relu or tanh."""
    stochastic: bool
    """True for SAC's squashed Gaussian (mean and log-std heads), False for a deterministic tanh policy."""
    action_low: tuple[float, ...]
    """Lower bounds of the environment's actions."""
    action_high: tuple[float, ...]
    """Upper bounds of the environment's actions."""
    block_size: int | None = None
    """B of the block-circulant hidden-to-hidden layers (``layers.1`` on), which travel as their B-vectors;
    None for a dense policy. The first layer and the heads stay dense (GST's selective application)."""

    def unscale(self, scaled: np.ndarray) -> np.ndarray:
        """Return actions in ``[-1, 1]`` (what the policy outputs) mapped to the environment's bounds."""
        low = np.asarray(self.action_low, dtype=np.float32)
        high = np.asarray(self.action_high, dtype=np.float32)
        return low + 0.5 * (np.asarray(scaled, dtype=np.float32) + 1.0) * (high - low)

    def circulant_weights(self) -> list[str]:
        """Return the names of the block-circulant weights (``layers.1.weight`` on; none for a dense policy)."""
        if self.block_size is None:
            return []
        return [f"layers.{i}.weight" for i in range(1, len(self.hidden_sizes))]

    def weight_names(self) -> list[str]:
        """Return the names of the Linear weights, in forward order (heads last)."""
        names = [f"layers.{i}.weight" for i in range(len(self.hidden_sizes))] + ["mu.weight"]
        return names + (["log_std.weight"] if self.stochastic else [])
