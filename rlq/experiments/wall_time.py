"""A run's expected wall time, told before it starts: its preset's stated wall time, scaled by its training budget.

Every preset states its wall time on 2 CPU cores in words (``PRESET_WALL_TIMES``: ``"about 17 min"``,
``"113 min measured with 2 workers ..."``). The first duration those words give is taken as the preset's time
(the larger end of a range such as ``47-50 min``). A run that changes a training budget
(:data:`BUDGET_PARAMETERS`) from its preset's value is estimated at the preset's pace: the preset's budget
over its stated time is the budget trained per second, and the run's budget at that pace is its estimate.
Nothing else is scaled (more seeds, methods or workers, other tasks), and the estimate says which changed
parameters it does not account for.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from rlq.experiments.registry import Experiment

BUDGET_PARAMETERS = ("total_timesteps", "train_timesteps", "learner_steps", "epochs")
"""Parameters that set how long each training runs: a run's wall time grows in proportion to them."""
MAX_SECONDS = 30 * 86400.0
"""An estimate above this (30 days) is refused unless asked for (``rlq run --yes``)."""
IGNORED = frozenset({"preset", "seed", "checkpoint_every", "show_committed"})
"""Parameters an estimate need not account for: which preset and seed, how often it saves, what it shows."""

_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0, "min": 60.0, "minute": 60.0, "minutes": 60.0}
_UNITS.update({"h": 3600.0, "hour": 3600.0, "hours": 3600.0, "day": 86400.0, "days": 86400.0})
_DURATION = re.compile(
    r"(\d+(?:\.\d+)?)(?:\s*-\s*(\d+(?:\.\d+)?))?\s*("
    + "|".join(sorted(_UNITS, key=len, reverse=True))
    + r")(?![a-z])"
)
_SIZES = ((120.0, 1.0, "s"), (7200.0, 60.0, "min"), (172800.0, 3600.0, "h"), (3.1536e7, 86400.0, "days"))


def stated_seconds(text: str) -> float | None:
    """Return the first duration that ``text`` states (the larger end of a range), in seconds, or None."""
    match = _DURATION.search(str(text))
    if match is None:
        return None
    low, high, unit = match.groups()
    return float(high or low) * _UNITS[unit]


def human(seconds: float) -> str:
    """Return ``seconds`` as a short duration in s, min, h, days or years (two figures below ten)."""
    limit, size, unit = next((s for s in _SIZES if seconds < s[0]), (math.inf, 3.1536e7, "years"))
    value = seconds / size
    return f"{value:.2g} {unit}" if value < 10 else f"{value:,.0f} {unit}"


@dataclass(frozen=True)
class WallTime:
    """A run's expected wall time in seconds (None when its preset states none) and how it was found."""

    seconds: float | None
    text: str

    @property
    def absurd(self) -> bool:
        """Return True when the estimate is over :data:`MAX_SECONDS`."""
        return self.seconds is not None and self.seconds > MAX_SECONDS


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def estimate_wall_time(experiment: Experiment, preset: str | None, params: dict[str, Any]) -> WallTime:
    """Return the expected wall time of a run of ``experiment`` with the resolved ``params`` at ``preset``."""
    stated = experiment.wall_times.get(preset) if preset is not None else None
    seconds = stated_seconds(stated) if stated is not None else None
    if seconds is None or seconds <= 0:
        return WallTime(None, "")
    base = experiment.resolve(preset)
    budgets = [
        k for k in BUDGET_PARAMETERS if _number(params.get(k)) and _number(base.get(k)) and base[k] > 0
    ]
    changed = [k for k in budgets if params[k] != base[k]]
    others = sorted(
        k for k in params if k in base and k not in IGNORED and k not in budgets and params[k] != base[k]
    )
    unscaled = f" (not accounting for the changed {', '.join(others)})" if others else ""
    if not changed:
        return WallTime(seconds, f"preset {preset} states a wall time of {stated}{unscaled}")
    factor = math.prod(params[k] / base[k] for k in changed)
    first = changed[0]
    scaled = ", ".join(f"{k}={params[k]:,}" for k in changed)
    text = (
        f"estimated wall time {human(seconds * factor)} at preset {preset}'s pace: it states {human(seconds)} for "
        f"{first}={base[first]:,} ({base[first] / seconds:.3g} a second), scaled to {scaled}{unscaled}"
    )
    return WallTime(seconds * factor, text)
