"""A sparsity target that rises while the training reward holds and backs off when it drops.

GST (Lee et al., arXiv 2101.09650) raises or holds its target sparsity according to the reward trend but
does not publish the rule; :class:`RewardAwareSparsity` is OUR DESIGN, chosen to show that behaviour with
every constant a documented parameter.

Its input is a stream of scores, each of one finished unit of experience: an episode's return in RL, an
epoch's validation accuracy in classification (:meth:`RewardAwareSparsity.add_scores`). Its decisions come
at its own updates (:meth:`RewardAwareSparsity.update`, every ``prune_every`` steps in
:class:`rlq.compress.GSTSchedule`). Two rules:

- ``"episodes"`` (default): a rise is judged by the scores that finished *after* it. Each rise records the
  reference, the mean of the last ``window`` scores before it; the target moves again only once
  ``min_episodes`` new scores have finished since the last change, so an update interval shorter than an
  episode cannot stack rises on a reward it has not seen. Then the mean of up to ``window`` of the new
  scores is compared with the reference: within the tolerance the target rises again (and the reference
  becomes the scores before this rise); below it the target backs off by ``backoff`` (holds when
  ``backoff`` is 0) and the reference stays, so the target only rises again once the reward has come back
  to the level it had before the harmful rise. A back-off undoes that rise and no more: it never takes
  the target below the target the reference was measured at (the one before the rise), and once there a
  drop only holds it. The reference was reached at that target, so going lower has no evidence behind it;
  without this floor a reward that never regains its reference (a lucky window before the rise, a
  non-stationary return) would strip every earlier, harmless rise as well, down to ``min_sparsity``.
- ``"windowed"``: the ablation's rule without the episodes fix (``gst_none``), kept to measure what the
  episodes rule changes. At every update the mean of the last ``input_window`` scores is one input; the mean
  of the last ``window`` inputs is compared with the best such mean so far. It cannot see a drop at the
  timescale of its own changes when several updates fall within one episode (the inputs barely move between
  updates), and its first reference may be a random warm-up policy's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from rlq.core.validation import check_fraction, check_non_negative_int, check_positive_int

RULES = ("episodes", "windowed")
"""Decision rules of :class:`RewardAwareSparsity` (see the module docstring)."""


@dataclass
class RewardAwareConfig:
    """Constants of :class:`RewardAwareSparsity` (our design)."""

    initial_sparsity: float = 0.0
    """Target before any update; must lie in [min_sparsity, max_sparsity]."""
    max_sparsity: float = 0.9
    """The target never exceeds this (0.8-0.95 are common final sparsities in deep RL)."""
    min_sparsity: float = 0.0
    """Backing off never goes below this."""
    step_size: float = 0.05
    """Increase of the target per rise (0.02-0.1)."""
    backoff: float = 0.05
    """Decrease of the target when the reward drops (0 only holds the target)."""
    rule: str = "episodes"
    """``"episodes"`` (judge each rise by the scores that finished after it) or ``"windowed"`` (the earlier
    rule, for ablations); see the module docstring."""
    window: int = 5
    """``"episodes"``: scores averaged on each side of a comparison (3-10). ``"windowed"``: inputs averaged;
    the target stays put until that many updates have had an input."""
    min_episodes: int = 3
    """``"episodes"`` only: new scores needed since the last change before the target moves again (at
    least 1; 2-5 for RL episodes, 1 for one accuracy per epoch)."""
    tolerance: float = 0.05
    """A drop counts when the new scores' mean falls below the reference by more than
    ``max(tolerance * |reference|, abs_tolerance)`` (relative part: 0.02-0.2)."""
    abs_tolerance: float = 0.0
    """Absolute part of the tolerance, for rewards near zero (in reward units)."""
    cooldown: int = 2
    """``"windowed"`` only: updates after a back-off during which the target is held whatever the reward."""
    input_window: int = 10
    """``"windowed"`` only: latest scores averaged into each update's input."""
    trend_ratio: float = 0.0
    """Trend guard (OUR DESIGN), 0 switches it off: the target also holds while the reward rises more
    slowly than ``trend_ratio`` times it rose before pruning began (0.3-0.7). Pruning that slows a
    still-rising reward never makes it drop, so the drop rule alone does not see that harm."""
    trend_window: int = 10
    """Reward levels, one per update interval (the mean of the last ``window`` scores), that a trend
    (least-squares slope) is fitted over; the reference trend is fitted over the last ``trend_window`` levels
    :meth:`RewardAwareSparsity.observe` recorded before the first update."""

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
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {self.rule!r}")
        for name in ("window", "min_episodes", "input_window"):
            check_positive_int(name, getattr(self, name))
        if check_positive_int("trend_window", self.trend_window) < 2:
            raise ValueError(f"trend_window must be >= 2 (a slope needs two points), got {self.trend_window}")
        check_non_negative_int("cooldown", self.cooldown)


class RewardAwareSparsity:
    """Target sparsity driven by the reward (OUR DESIGN: GST's rule is unpublished).

    Feed finished episodes' returns (or other scores) with :meth:`add_scores` as they come, and call
    :meth:`update` at each pruning update; it returns the new target. The two rules are described in
    :mod:`rlq.compress.reward_aware`. With either, a trend guard (``trend_ratio > 0``) can also hold the
    target: before pruning begins the caller calls :meth:`observe` at the update interval, recording the
    reward level; at the first update the least-squares slope of the last ``trend_window`` levels is
    frozen as the reference trend, and afterwards a rise becomes a hold (decision ``hold_trend``) while the
    slope of the last ``trend_window`` levels is below ``trend_ratio`` times a positive reference. It came
    from an A2C Breakout ablation where the score kept rising after the hand-over, only more slowly than
    dense training's, and the drop rule never fired.

    Decisions (:attr:`last_decision`): ``wait`` (too few new scores), ``rise``, ``at_max``, ``hold`` (a drop
    with nothing to back off, or the target at its floor), ``backoff``, ``hold_trend``; the windowed rule also ``warmup``,
    ``cooldown`` and ``no_reward``. It is deterministic and its state can be saved with :meth:`state_dict`.
    """

    def __init__(self, config: RewardAwareConfig | None = None):
        self.config = config or RewardAwareConfig()
        config = self.config
        self.target = float(config.initial_sparsity)
        self.updates = 0
        self.last_decision = "none"
        self.recent: deque[float] = deque(maxlen=config.window)
        """The last ``window`` scores."""
        self.since: deque[float] = deque(maxlen=config.window)
        """The last ``window`` scores that finished after the last change of the target."""
        self.since_count = 0
        """How many scores finished after the last change of the target."""
        self.reference: float | None = None
        """Episodes rule: the mean of the ``window`` scores before the last rise (None before the first)."""
        self.floor: float | None = None
        """Episodes rule: the target before the last rise, the lowest a back-off goes (None before the first)."""
        self.inputs: deque[float] = deque(maxlen=config.input_window)
        self.levels: deque[float] = deque(maxlen=config.window)
        self.best: float | None = None
        self.cooldown_left = 0
        self.history: deque[float] = deque(maxlen=config.trend_window)
        self.reference_slope: float | None = None

    # ---- input

    def add_scores(self, scores: Iterable[float]) -> None:
        """Record scores (episode returns, accuracies) that finished since the last call, oldest first."""
        for score in scores:
            score = float(score)
            if not math.isfinite(score):
                raise ValueError(f"scores must be finite, got {score}")
            self.recent.append(score)
            self.since.append(score)
            self.since_count += 1
            self.inputs.append(score)

    def level(self) -> float | None:
        """Return the mean of the last ``window`` scores, or None before the first."""
        return _mean(self.recent)

    def observe(self) -> None:
        """Record the reward level before pruning begins (the trend guard's reference); the target is unchanged."""
        level = _mean(self.inputs) if self.config.rule == "windowed" else self.level()
        if level is not None and self.updates == 0:
            self.history.append(level)

    def trend_slope(self) -> float | None:
        """Return the least-squares slope (reward per update) of the last ``trend_window`` levels, or None."""
        return _slope(self.history) if len(self.history) == self.config.trend_window else None

    # ---- decisions

    def update(self) -> float:
        """Return the new target sparsity after a pruning update on the scores added so far."""
        if self.config.rule == "windowed":
            return self._update_windowed()
        self._count_update()
        level = self.level()
        if level is not None:
            self.history.append(level)
        config = self.config
        if self.since_count < config.min_episodes:
            return self._decide("wait")
        if self.reference is None:  # pruning begins: the scores so far are the level to keep
            return self._rise()
        threshold = max(config.tolerance * abs(self.reference), config.abs_tolerance)
        if _mean(self.since) >= self.reference - threshold:
            return self._reward_kept()
        return self._reward_dropped()

    def _reward_kept(self) -> float:
        """Episodes rule, the scores since the last change within tolerance of the reference: rise or hold."""
        if self._too_slow():
            return self._decide("hold_trend")
        return self._rise() if self.target < self.config.max_sparsity else self._decide("at_max")

    def _reward_dropped(self) -> float:
        """Episodes rule, the scores since the last change below the reference: back off to the floor, or hold."""
        config = self.config
        floor = max(config.min_sparsity, self.floor or 0.0)  # no floor before the first rise
        if config.backoff > 0 and self.target > floor:
            self.target = round(max(floor, self.target - config.backoff), 12)
            self._new_scores_from_here()
            return self._decide("backoff")
        return self._decide("hold")

    def _count_update(self) -> None:
        if self.updates == 0:  # the reference trend: what the reward did before pruning began
            self.reference_slope = self.trend_slope()
        self.updates += 1

    def _rise(self) -> float:
        self.reference, self.floor = self.level(), self.target
        # rounded: 0.6 + 0.1 + 0.1 + 0.1 is 0.8999999999999999, one more rise would "move" it to the cap
        self.target = round(min(self.config.max_sparsity, self.target + self.config.step_size), 12)
        self._new_scores_from_here()
        return self._decide("rise")

    def _new_scores_from_here(self) -> None:
        self.since.clear()
        self.since_count = 0

    def _decide(self, decision: str) -> float:
        self.last_decision = decision
        return self.target

    def _too_slow(self) -> bool:
        config = self.config
        if config.trend_ratio <= 0 or self.reference_slope is None or self.reference_slope <= 0:
            return False
        slope = self.trend_slope()
        return slope is not None and slope < config.trend_ratio * self.reference_slope

    def _update_windowed(self) -> float:
        """The ``"windowed"`` rule: the windowed mean of per-update inputs against its best so far."""
        reward = _mean(self.inputs)
        if reward is None:
            return self._decide("no_reward")
        self._count_update()
        config = self.config
        self.levels.append(reward)
        self.history.append(reward)
        if len(self.levels) < config.window:
            return self._decide("warmup")
        mean = _mean(self.levels)
        if self.best is None:
            self.best = mean
        if self.cooldown_left > 0:
            self.cooldown_left -= 1
            self.best = max(self.best, mean)
            return self._decide("cooldown")
        threshold = max(config.tolerance * abs(self.best), config.abs_tolerance)
        if mean >= self.best - threshold:
            self.best = max(self.best, mean)
            if self._too_slow():
                return self._decide("hold_trend")
            rising = self.target < config.max_sparsity
            self.target = min(config.max_sparsity, self.target + config.step_size)
            return self._decide("rise" if rising else "at_max")
        self.target = max(config.min_sparsity, self.target - config.backoff)
        self.cooldown_left = config.cooldown
        return self._decide("backoff")

    def reset_target(self, target: float) -> float:
        """Return the target after setting it to ``target`` clipped to [min_sparsity, max_sparsity]."""
        self.target = min(self.config.max_sparsity, max(self.config.min_sparsity, float(target)))
        if self.floor is not None:  # a back-off never has to climb: the floor is at most the target
            self.floor = min(self.floor, self.target)
        return self.target

    # ---- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Return the controller's config and state as plain Python values (JSON-serialisable)."""
        return {
            "config": asdict(self.config),
            "target": self.target,
            "updates": self.updates,
            "last_decision": self.last_decision,
            "recent": list(self.recent),
            "since": list(self.since),
            "since_count": self.since_count,
            "reference": self.reference,
            "floor": self.floor,
            "inputs": list(self.inputs),
            "levels": list(self.levels),
            "best": self.best,
            "cooldown_left": self.cooldown_left,
            "history": list(self.history),
            "reference_slope": self.reference_slope,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the config and state saved by :meth:`state_dict`."""
        missing = {"since_count", "inputs"} - set(state)
        if missing:
            raise ValueError(
                f"the reward-aware state lacks {sorted(missing)}: it was saved by an earlier rlq whose "
                "controller read windowed means, not scores; start the run again"
            )
        self.__init__(RewardAwareConfig(**state["config"]))
        self.target = float(state["target"])
        self.updates = int(state["updates"])
        self.last_decision = state["last_decision"]
        self.recent.extend(state["recent"])
        self.since.extend(state["since"])
        self.since_count = int(state["since_count"])
        self.reference = state["reference"]
        self.floor = state.get("floor")  # a state saved before the floor existed resumes without one
        self.inputs.extend(state["inputs"])
        self.levels.extend(state["levels"])
        self.best = state["best"]
        self.cooldown_left = int(state["cooldown_left"])
        self.history.extend(state["history"])
        self.reference_slope = state["reference_slope"]


def _mean(values: deque[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _slope(values: deque[float] | list[float]) -> float:
    """Return the least-squares slope of ``values`` against their index (0, 1, ...)."""
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    return sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values)) / sum(
        (i - mean_x) ** 2 for i in range(n)
    )
