"""A sparsity target that rises while the training reward holds and backs off when it drops.

GST (Lee et al., arXiv 2101.09650) raises or holds its target sparsity according to the reward trend but
does not publish the rule; :class:`RewardAwareSparsity` is OUR DESIGN, chosen to show that behaviour with
every constant a documented parameter.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from rlq.core.validation import check_fraction, check_non_negative_int, check_positive_int


@dataclass
class RewardAwareConfig:
    """Constants of :class:`RewardAwareSparsity` (our design; defaults suit an update per ~1% of training)."""

    initial_sparsity: float = 0.0
    """Target before any update; must lie in [min_sparsity, max_sparsity]."""
    max_sparsity: float = 0.9
    """The target never exceeds this (0.8-0.95 are common final sparsities in deep RL)."""
    min_sparsity: float = 0.0
    """Backing off never goes below this."""
    step_size: float = 0.05
    """Increase of the target per update while the reward holds (0.02-0.1)."""
    backoff: float = 0.05
    """Decrease of the target when the reward drops (0 only holds the target)."""
    window: int = 5
    """Number of most recent rewards averaged; the target stays put until the window is full."""
    tolerance: float = 0.05
    """A drop counts when the windowed reward falls below the reference by more than
    ``max(tolerance * |reference|, abs_tolerance)`` (relative part: 0.02-0.2)."""
    abs_tolerance: float = 0.0
    """Absolute part of the tolerance, for rewards near zero (in reward units)."""
    cooldown: int = 2
    """Updates after a back-off during which the target is held whatever the reward."""
    trend_ratio: float = 0.0
    """Trend guard (OUR DESIGN, issue 14), 0 switches it off: the target also holds while the reward rises
    more slowly than ``trend_ratio`` times it rose before pruning began (0.3-0.7). Pruning that slows a
    still-rising reward never makes it drop, so the drop rule alone does not see that harm."""
    trend_window: int = 10
    """Rewards, one per update interval, that a trend (least-squares slope) is fitted over; the reference
    trend is fitted over the last ``trend_window`` rewards :meth:`RewardAwareSparsity.observe` saw before
    the first update."""

    def __post_init__(self) -> None:
        for name in ("initial_sparsity", "max_sparsity", "min_sparsity"):
            check_fraction(name, getattr(self, name), high_open=True)
        if not self.min_sparsity <= self.initial_sparsity <= self.max_sparsity:
            raise ValueError(
                f"need min_sparsity <= initial_sparsity <= max_sparsity, got {self.min_sparsity}, "
                f"{self.initial_sparsity}, {self.max_sparsity}"
            )
        for name in ("step_size", "backoff", "tolerance", "abs_tolerance", "trend_ratio"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.step_size == 0:
            raise ValueError("step_size must be > 0, else the target never rises")
        check_positive_int("window", self.window)
        if check_positive_int("trend_window", self.trend_window) < 2:
            raise ValueError(f"trend_window must be >= 2 (a slope needs two points), got {self.trend_window}")
        check_non_negative_int("cooldown", self.cooldown)


class RewardAwareSparsity:
    """Target sparsity driven by the reward trend (OUR DESIGN: GST's rule is unpublished).

    Each :meth:`update` takes the latest training reward (e.g. the mean return of recent episodes) and
    returns the new target:

    1. The reward joins a window of the last ``window`` rewards; until the window is full the target holds.
    2. The windowed mean ``m`` is compared with the reference ``best``, the highest windowed mean so far.
    3. During a cooldown (``cooldown`` updates after a back-off) the target holds.
    4. If ``m >= best - max(tolerance * |best|, abs_tolerance)`` the reward holds: the target rises by
       ``step_size`` (capped at ``max_sparsity``).
    5. Otherwise the reward dropped: the target falls by ``backoff`` (not below ``min_sparsity``) and a
       cooldown starts. The reference stays the best level, so the target only rises again once the
       reward has recovered to within the tolerance of it.
    6. Trend guard (``trend_ratio > 0``): before pruning begins the caller feeds rewards to
       :meth:`observe` at the update interval. At the first update the least-squares slope of the last
       ``trend_window`` of them is frozen as the reference trend. Afterwards, when the reward holds (step
       4) but the slope of the last ``trend_window`` rewards is below ``trend_ratio`` times a positive
       reference, the target holds instead of rising (decision ``hold_trend``). Without a positive
       reference (too few observations, or a reward that was not rising) the guard stays off.

    Step 6 comes from the A2C Breakout ablation (issue 14): at 1.6M frames the reward-aware target went
    from 0.5 to its 0.9 cap within 60k steps of the hand-over while the score kept rising, only more slowly
    than dense's; the drop rule never fired. The guard lets the target rise only while learning keeps pace.

    It is deterministic (no randomness) and its state can be saved with :meth:`state_dict`.
    """

    def __init__(self, config: RewardAwareConfig | None = None):
        self.config = config or RewardAwareConfig()
        self.target = float(self.config.initial_sparsity)
        self.best: float | None = None
        self.rewards: deque[float] = deque(maxlen=self.config.window)
        self.cooldown_left = 0
        self.updates = 0
        self.history: deque[float] = deque(maxlen=self.config.trend_window)
        self.reference_slope: float | None = None
        self.last_decision = "none"
        """Last decision: ``warmup``, ``rise``, ``at_max``, ``hold_trend``, ``cooldown``, ``backoff`` or
        ``no_reward``."""

    def observe(self, reward: float | None) -> None:
        """Record a reward seen before pruning begins (the trend guard's reference); the target is unchanged."""
        if reward is None:
            return
        reward = float(reward)
        if not math.isfinite(reward):
            raise ValueError(f"reward must be finite, got {reward}")
        if self.updates == 0:
            self.history.append(reward)

    def trend_slope(self) -> float | None:
        """Return the least-squares slope (reward per update) of the last ``trend_window`` rewards, or None."""
        return _slope(self.history) if len(self.history) == self.config.trend_window else None

    def _too_slow(self) -> bool:
        config = self.config
        if config.trend_ratio <= 0 or self.reference_slope is None or self.reference_slope <= 0:
            return False
        slope = self.trend_slope()
        return slope is not None and slope < config.trend_ratio * self.reference_slope

    def windowed_reward(self) -> float | None:
        """Return the mean of the rewards in the window, or None while it is empty."""
        return sum(self.rewards) / len(self.rewards) if self.rewards else None

    def update(self, reward: float | None) -> float:
        """Return the new target sparsity after seeing ``reward`` (None: no new reward, the target holds)."""
        if reward is None:
            self.last_decision = "no_reward"
            return self.target
        reward = float(reward)
        if not math.isfinite(reward):
            raise ValueError(f"reward must be finite, got {reward}")
        config = self.config
        if self.updates == 0:  # the reference trend: what the reward did before pruning began
            self.reference_slope = self.trend_slope()
        self.updates += 1
        self.rewards.append(reward)
        self.history.append(reward)
        if len(self.rewards) < config.window:
            self.last_decision = "warmup"
            return self.target
        mean = self.windowed_reward()
        if self.best is None:
            self.best = mean
        if self.cooldown_left > 0:
            self.cooldown_left -= 1
            self.best = max(self.best, mean)
            self.last_decision = "cooldown"
            return self.target
        threshold = max(config.tolerance * abs(self.best), config.abs_tolerance)
        if mean >= self.best - threshold:
            self.best = max(self.best, mean)
            if self._too_slow():
                self.last_decision = "hold_trend"
                return self.target
            rising = self.target < config.max_sparsity
            self.target = min(config.max_sparsity, self.target + config.step_size)
            self.last_decision = "rise" if rising else "at_max"
        else:
            self.target = max(config.min_sparsity, self.target - config.backoff)
            self.cooldown_left = config.cooldown
            self.last_decision = "backoff"
        return self.target

    def reset_target(self, target: float) -> float:
        """Return the target after setting it to ``target`` clipped to [min_sparsity, max_sparsity]."""
        self.target = min(self.config.max_sparsity, max(self.config.min_sparsity, float(target)))
        return self.target

    def state_dict(self) -> dict[str, Any]:
        """Return the controller's config and state as plain Python values (JSON-serialisable)."""
        return {
            "config": asdict(self.config),
            "target": self.target,
            "best": self.best,
            "rewards": list(self.rewards),
            "cooldown_left": self.cooldown_left,
            "updates": self.updates,
            "last_decision": self.last_decision,
            "history": list(self.history),
            "reference_slope": self.reference_slope,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the config and state saved by :meth:`state_dict`."""
        self.config = RewardAwareConfig(**state["config"])
        self.target = float(state["target"])
        self.best = state["best"]
        self.rewards = deque(state["rewards"], maxlen=self.config.window)
        self.cooldown_left = int(state["cooldown_left"])
        self.updates = int(state["updates"])
        self.last_decision = state["last_decision"]
        # states saved before the trend guard existed have neither: the guard then stays off
        self.history = deque(state.get("history", []), maxlen=self.config.trend_window)
        self.reference_slope = state.get("reference_slope")


def _slope(values: deque[float] | list[float]) -> float:
    """Return the least-squares slope of ``values`` against their index (0, 1, ...)."""
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    return sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values)) / sum(
        (i - mean_x) ** 2 for i in range(n)
    )
