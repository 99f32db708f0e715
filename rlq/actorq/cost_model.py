"""ActorQ's end-to-end speed predicted from measured costs: which side binds, the actors or the learner.

QuaRL reports int8 actors making training 1.5-2.5x faster end to end, but publishes no model of when. This is
**our model** (not the paper's). In steady state the rate limiter holds the learner at
``samples_per_insert / batch_size`` gradient steps per inserted transition, so a run's wall time per
transition is set by whichever side is slower:

- **actors**: one actor spends ``a`` seconds of one core per environment step: environment step, inference,
  pulling, deserializing and loading policies (amortized over the steps between loads), the rest of its loop.
  ``n_actors`` actors on their own cores insert ``n_actors / a`` transitions per second.
- **learner**: ``l = learner_seconds_per_update * samples_per_insert / batch_size`` seconds per transition, plus
  the driver's own work per transition (inserting into the buffer, encoding broadcasts). The learner is one
  process: it cannot go faster than ``1 / l`` transitions per second, however many cores there are.
- **cores**: actors and learner together need ``a + l`` core-seconds per transition; with ``cores`` cores they
  cannot insert faster than ``cores / (a + l)`` per second.

``Topology(layout="parallel")`` (Ray: actors and learner overlap) gives ``T = max(l, a / n_actors, (a + l) / cores)``;
``Topology(layout="serial")`` (the local backend: one process acts, then learns) gives ``T = a + l``. The speedup of a
quantized precision is ``T_fp32 / T_q``.

Assumptions (each a way the prediction can miss): costs are measured on an otherwise idle core and do not
change with the number of processes sharing the machine (memory bandwidth, caches and the OS scheduler are
ignored); the actors' per-step cost already includes policy loads at the run's broadcast rate; warm-up steps
before ``learning_starts`` (random actions, no updates) are left out; learning per transition is the same at
every precision, so a throughput ratio is also a time-to-return ratio.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from rlq.actorq.actor import ACTOR_TIMERS

LAYOUTS = ("parallel", "serial")
"""How actors and learner share time: overlapped on separate cores (Ray) or in turn in one process (local)."""


@dataclass(frozen=True)
class Topology:
    """How a run's actors and learner share the machine: how many actors, on how many cores, in which layout."""

    n_actors: int
    """Actor processes (or actor loops, in the serial layout)."""
    cores: float | None = None
    """Cores actors and learner share (None: one per actor plus one for the learner)."""
    layout: str = "parallel"
    """One of :data:`LAYOUTS`."""

    def __post_init__(self) -> None:
        n = self.n_actors
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n_actors={n!r}: must be an int >= 1")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r}: choose one of {', '.join(LAYOUTS)}")
        if self.cores is not None:
            _check_positive("cores", self.cores)

    @property
    def shared_cores(self) -> float:
        """Return the cores actors and learner share (one per actor plus one when ``cores`` is None)."""
        return float(self.n_actors + 1) if self.cores is None else float(self.cores)


DRIVER_KEYS = ("learner_insert", "broadcast")
"""Breakdown keys of the learner process's work per transition besides the gradient steps."""


@dataclass(frozen=True)
class StepCosts:
    """Measured costs of one run, per environment step and per learner update (seconds)."""

    actor: dict[str, float]
    """Each of :data:`ACTOR_TIMERS` in seconds per environment step of one actor (policy steps only)."""
    learner_seconds_per_update: float
    """Sampling plus one gradient step of the learner."""
    driver_seconds_per_step: float
    """The learner process's other work per inserted transition: insert into the buffer, encode broadcasts."""

    @property
    def actor_seconds_per_step(self) -> float:
        """Return one actor's seconds per environment step, all its components summed."""
        return float(sum(self.actor.values()))


@dataclass(frozen=True)
class SpeedupPrediction:
    """The predicted wall time per inserted transition at fp32 and at a quantized precision."""

    seconds_per_step_fp32: float
    """Predicted wall seconds per inserted transition with fp32 actors."""
    seconds_per_step_q: float
    """Predicted wall seconds per inserted transition with quantized actors."""
    bound_fp32: str
    """What binds with fp32 actors: ``actors``, ``learner``, ``cores`` or ``serial``."""
    bound_q: str
    """What binds with quantized actors."""
    actor_seconds_per_step_fp32: float
    """One fp32 actor's seconds per environment step."""
    actor_seconds_per_step_q: float
    """One quantized actor's seconds per environment step."""
    learner_seconds_per_step: float
    """The learner process's seconds per inserted transition (the same at both precisions)."""

    @property
    def speedup(self) -> float:
        """Return the predicted end-to-end speedup of quantized actors over fp32 ones."""
        return self.seconds_per_step_fp32 / self.seconds_per_step_q

    def as_dict(self) -> dict[str, Any]:
        """Return the prediction's fields and its speedup as plain values."""
        return {**asdict(self), "speedup": self.speedup}


def _check_positive(name: str, value: Any, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r}: must be a finite number")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name}={value!r}: must be {'>= 0' if allow_zero else '> 0'}")
    return float(value)


def _actor_seconds(name: str, breakdown: StepCosts | Mapping[str, float]) -> float:
    """Return one actor's seconds per step from a :class:`StepCosts` or a per-step breakdown mapping."""
    if isinstance(breakdown, StepCosts):
        return breakdown.actor_seconds_per_step
    if not isinstance(breakdown, Mapping):
        raise TypeError(
            f"{name} must be a StepCosts or a mapping of actor timers per step, got {type(breakdown).__name__}"
        )
    unknown = set(breakdown) - set(ACTOR_TIMERS)
    if unknown:
        raise ValueError(
            f"{name} has keys that are not actor timers: {sorted(unknown)} (known: {list(ACTOR_TIMERS)})"
        )
    total = sum(_check_positive(f"{name}[{k!r}]", v, allow_zero=True) for k, v in breakdown.items())
    if total <= 0:
        raise ValueError(f"{name}: the actor timers sum to {total}; an actor step must cost some time")
    return total


def _seconds_per_step(a: float, learner: float, topology: Topology) -> tuple[float, str]:
    if topology.layout == "serial":
        return a + learner, "serial"
    sides = {
        "learner": learner,
        "actors": a / topology.n_actors,
        "cores": (a + learner) / topology.shared_cores,
    }
    bound = max(sides, key=sides.get)
    return sides[bound], bound


def predict_seconds_per_step(
    costs: StepCosts, topology: Topology, samples_per_insert: float, batch_size: int
) -> tuple[float, str]:
    """Return one run's predicted wall seconds per inserted transition and what binds, from its own costs.

    The model of :func:`predict_speedup` for a single run, learner included: for comparing runs whose learners
    differ (a block-circulant policy trains at another cost than a dense one), the ratio of two such predictions.
    """
    p = predict_speedup(
        costs, costs, topology, costs.learner_seconds_per_update, samples_per_insert, batch_size,
        driver_seconds_per_step=costs.driver_seconds_per_step,
    )  # fmt: skip
    return p.seconds_per_step_fp32, p.bound_fp32


def predict_speedup(
    breakdown_fp32: StepCosts | Mapping[str, float],
    breakdown_q: StepCosts | Mapping[str, float],
    topology: Topology,
    learner_seconds_per_update: float,
    samples_per_insert: float,
    batch_size: int,
    driver_seconds_per_step: float = 0.0,
) -> SpeedupPrediction:
    """Return the predicted wall time per transition with fp32 and quantized actors, and which side binds.

    ``breakdown_*`` give one actor's costs per environment step (a :class:`StepCosts`, or a mapping of
    :data:`ACTOR_TIMERS` in seconds per step, e.g. from :func:`step_costs`). ``topology`` says how many actors
    run, on how many cores, in which layout. ``driver_seconds_per_step`` is
    the learner process's other work per transition. See the module docstring for the model.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: must be an int >= 1")
    u = _check_positive("learner_seconds_per_update", learner_seconds_per_update, allow_zero=True)
    spi = _check_positive("samples_per_insert", samples_per_insert)
    driver = _check_positive("driver_seconds_per_step", driver_seconds_per_step, allow_zero=True)
    a32, aq = _actor_seconds("breakdown_fp32", breakdown_fp32), _actor_seconds("breakdown_q", breakdown_q)
    learner = u * spi / batch_size + driver
    t32, bound32 = _seconds_per_step(a32, learner, topology)
    tq, boundq = _seconds_per_step(aq, learner, topology)
    return SpeedupPrediction(t32, tq, bound32, boundq, a32, aq, learner)


def step_costs(
    breakdown: Mapping[str, float], env_steps: int, learner_steps: int, warmup_steps: int = 0
) -> StepCosts:
    """Return a run's costs per step from its breakdown totals (:attr:`ActorQResult.breakdown`).

    Inference, pulls, loads and the actors' other time are divided over the policy steps
    (``env_steps - warmup_steps``: warm-up steps act at random and load nothing); the environment step over
    every step; sampling and updates over ``learner_steps``; insert and broadcast over ``env_steps``.
    """
    missing = [
        k for k in (*ACTOR_TIMERS, "learner_sample", "learner_update", *DRIVER_KEYS) if k not in breakdown
    ]
    if missing:
        raise ValueError(f"breakdown lacks {missing}: pass ActorQResult.breakdown or a breakdown.csv's rows")
    if env_steps <= warmup_steps or learner_steps < 1:
        raise ValueError(
            f"env_steps={env_steps}, warmup_steps={warmup_steps}, learner_steps={learner_steps}: "
            "a run with policy steps and learner updates is needed to measure costs"
        )
    policy_steps = env_steps - warmup_steps
    actor = {k: float(breakdown[k]) / policy_steps for k in ACTOR_TIMERS}
    actor["actor_env_step"] = float(breakdown["actor_env_step"]) / env_steps
    update = (float(breakdown["learner_sample"]) + float(breakdown["learner_update"])) / learner_steps
    driver = sum(float(breakdown[k]) for k in DRIVER_KEYS) / env_steps
    return StepCosts(actor, update, driver)


def result_costs(result: Any) -> StepCosts:
    """Return the per-step costs of an :class:`~rlq.actorq.ActorQResult`."""
    c = result.config
    return step_costs(
        result.breakdown, result.env_steps, result.learner_steps, min(c.learning_starts, result.env_steps - 1)
    )


def speedup_curve(
    costs_fp32: StepCosts,
    costs_q: StepCosts,
    learner_factors: Sequence[float],
    topology: Topology,
    samples_per_insert: float,
    batch_size: int,
) -> pd.DataFrame:
    """Return the predicted speedup for a learner ``N`` times faster than measured, one row per ``N``.

    Columns: learner_factor, learner_seconds_per_update, speedup, bound_fp32, bound_q, seconds_per_step_fp32,
    seconds_per_step_q. The driver's own per-step work speeds up with the learner.
    """
    rows = []
    for factor in learner_factors:
        n = _check_positive("learner_factors[i]", factor)
        p = predict_speedup(
            costs_fp32, costs_q, topology, costs_fp32.learner_seconds_per_update / n, samples_per_insert,
            batch_size, driver_seconds_per_step=costs_fp32.driver_seconds_per_step / n,
        )  # fmt: skip
        rows.append(
            dict(
                learner_factor=n,
                learner_seconds_per_update=costs_fp32.learner_seconds_per_update / n,
                speedup=p.speedup,
                bound_fp32=p.bound_fp32,
                bound_q=p.bound_q,
                seconds_per_step_fp32=p.seconds_per_step_fp32,
                seconds_per_step_q=p.seconds_per_step_q,
            )
        )
    return pd.DataFrame(rows)


def steady_steps_per_s(history: pd.DataFrame) -> float:
    """Return environment steps per training second between the first and last evaluation after learning began.

    Leaves out the warm-up (random actions, no updates), which costs the same at every precision.
    """
    learning = history[history["learner_steps"] > 0]
    if len(learning) < 2:
        raise ValueError("the history needs two evaluations after learning began to measure a steady rate")
    first, last = learning.iloc[0], learning.iloc[-1]
    seconds = float(last["wall_time_s"] - first["wall_time_s"])
    if seconds <= 0:
        raise ValueError("the evaluations after learning began span no training time")
    return float(last["env_steps"] - first["env_steps"]) / seconds
