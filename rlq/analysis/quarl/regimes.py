"""ActorQ's measured regimes (``quarl_actorq``): where int8 actors pay off end to end, beside the cost model.

A *regime* is a set of :class:`rlq.actorq.ActorQConfig` overrides (network sizes, replay rate, actors, backend)
with a ``description`` saying why it is there. Each regime trains the same learner with fp32 and quantized
actors on several seeds; :func:`regime_comparison` puts the measured speedup (steady environment steps per
second, and wall-clock to a return threshold) beside :func:`rlq.actorq.predict_speedup`'s prediction from the
same runs' measured costs, and :func:`paper_setting_curve` predicts the paper's setting for a learner ``N``
times faster than this CPU's.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from rlq.actorq import ActorQConfig, ActorQResult

META_KEYS = ("description",)
"""Keys of a regime that describe it rather than configure ActorQ."""

RegimeResults = dict[tuple[str, int, str], "ActorQResult"]


def regime_config(
    base: ActorQConfig, regime: Mapping[str, Any], seed: int, precision: str, folder: Path
) -> ActorQConfig:
    """Return the :class:`~rlq.actorq.ActorQConfig` of one run: ``base`` with the regime's overrides, seed and precision."""
    overrides = {k: v for k, v in regime.items() if k not in META_KEYS}
    for key in ("hidden_sizes", "critic_hidden_sizes"):
        if overrides.get(key) is not None:
            overrides[key] = tuple(overrides[key])
    return dataclasses.replace(
        base, **overrides, seed=int(seed), actor_precision=precision, checkpoint_dir=str(folder)
    )


def layout_and_cores(config: Any) -> tuple[str, float]:
    """Return the cost model's layout and core count for a run's config (local: serial; Ray: parallel)."""
    if config.backend == "local":
        return "serial", 1.0
    return "parallel", float(config.ray_num_cpus or os.cpu_count() or 1)


def regime_runs(results: RegimeResults, return_threshold: float) -> pd.DataFrame:
    """Return one row per run: steady steps/s, time to the threshold, final return and measured costs per step."""
    from rlq.actorq.cost_model import result_costs, steady_steps_per_s

    rows = []
    for (name, seed, precision), r in results.items():
        costs = result_costs(r)
        rows.append(
            dict(
                regime=name,
                seed=seed,
                precision=precision,
                steps_per_s=steady_steps_per_s(r.history),
                time_to_threshold_s=r.time_to_learned_return(return_threshold),
                final_return=float(r.history["eval_return"].iloc[-1]),
                env_steps=r.env_steps,
                wall_time_s=r.wall_time_s,
                actor_ms_per_step=1e3 * costs.actor_seconds_per_step,
                learner_ms_per_update=1e3 * costs.learner_seconds_per_update,
                driver_ms_per_step=1e3 * costs.driver_seconds_per_step,
                engine=r.actor_backend,
            )
        )
    return pd.DataFrame(rows)


ENGINE_PARTS = {
    "inference": ("actor_inference",),
    "environment": ("actor_env_step",),
    "communication": ("actor_pull", "actor_deserialize"),
    "model load": ("actor_load",),
}
"""The actors' time by what an engine changes, each as ActorQ's timers: the paper's "step" split into the
policy's inference and the environment, its pull and deserialize together as communication, and the load of
each pulled policy into the engine (for compiled actors, compiling it)."""


def regime_breakdown(results: RegimeResults) -> pd.DataFrame:
    """Return the actors' milliseconds per environment step in each :data:`ENGINE_PARTS` part, per regime and precision.

    Summed over a regime's seeds (and actors) and divided by their environment steps. Columns: regime,
    precision, engine (the runs' actor engine, e.g. ``compiled-int8``), part, ms_per_step.
    """
    groups: dict[tuple[str, str], list[Any]] = {}
    for (name, _, precision), r in results.items():
        groups.setdefault((name, precision), []).append(r)
    rows = []
    for (name, precision), runs in groups.items():
        steps = max(sum(r.env_steps for r in runs), 1)
        engines = ", ".join(sorted({r.actor_backend for r in runs}))
        for part, keys in ENGINE_PARTS.items():
            seconds = sum(r.breakdown[k] for r in runs for k in keys)
            rows.append(
                dict(
                    regime=name,
                    precision=precision,
                    engine=engines,
                    part=part,
                    ms_per_step=1e3 * seconds / steps,
                )
            )
    return pd.DataFrame(rows, columns=["regime", "precision", "engine", "part", "ms_per_step"])


def regime_comparison(
    results: RegimeResults, return_threshold: float, precision: str = "int8"
) -> pd.DataFrame:
    """Return per regime and seed the measured speedup of ``precision`` actors over fp32 beside the predicted one.

    ``measured_speedup``: steady steps/s ratio; ``time_speedup``: ratio of wall-clock to ``return_threshold``
    (NaN when either run missed it); ``predicted_speedup``: :func:`rlq.actorq.predict_speedup` on the two
    runs' measured costs (the learner's update and driver costs averaged over the two, since the learner is
    the same); ``error_pct``: prediction over measurement, minus one.
    """
    from rlq.actorq import predict_speedup
    from rlq.actorq.cost_model import Topology, result_costs, steady_steps_per_s

    rows = []
    for (name, seed, p), r in results.items():
        if p != "fp32" or (name, seed, precision) not in results:
            continue
        q = results[(name, seed, precision)]
        c32, cq = result_costs(r), result_costs(q)
        update = (c32.learner_seconds_per_update + cq.learner_seconds_per_update) / 2
        driver = (c32.driver_seconds_per_step + cq.driver_seconds_per_step) / 2
        layout, cores = layout_and_cores(r.config)
        pred = predict_speedup(
            c32.actor, cq.actor, Topology(r.config.n_actors, cores, layout), update,
            r.config.samples_per_insert, r.config.batch_size, driver_seconds_per_step=driver,
        )  # fmt: skip
        measured = steady_steps_per_s(q.history) / steady_steps_per_s(r.history)
        t32, tq = r.time_to_learned_return(return_threshold), q.time_to_learned_return(return_threshold)
        rows.append(
            dict(
                regime=name,
                seed=seed,
                precision=precision,
                measured_speedup=measured,
                time_speedup=(t32 / tq) if t32 and tq else np.nan,
                predicted_speedup=pred.speedup,
                error_pct=100.0 * (pred.speedup / measured - 1.0),
                bound_fp32=pred.bound_fp32,
                bound_q=pred.bound_q,
                layout=layout,
            )
        )
    return pd.DataFrame(rows)


def regime_estimates(comparison: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Return per regime the IQM and 95% interval over seeds of the measured and predicted speedups.

    Columns: regime, measure (measured_speedup, time_speedup, predicted_speedup), value, lower, upper, n. A
    measure with no finite value in a regime (no run reached the threshold) is left out.
    """
    from rlq.stats import interval_estimates

    rows = []
    for name, group in comparison.groupby("regime", sort=False):
        scores = {}
        for measure in ("measured_speedup", "time_speedup", "predicted_speedup"):
            values = group[measure].to_numpy(dtype=float)
            values = values[np.isfinite(values)]
            if len(values):
                scores[measure] = values
        table = interval_estimates(scores, metrics=("iqm",), seed=seed)
        for row in table.itertuples():
            rows.append(dict(regime=name, measure=row.method, value=row.value, lower=row.lower, upper=row.upper,
                             n=len(scores[row.method])))  # fmt: skip
    return pd.DataFrame(rows, columns=["regime", "measure", "value", "lower", "upper", "n"])


def paper_setting_curve(
    results: RegimeResults,
    actor_regime: str,
    learner_regime: str,
    learner_factors: Sequence[float],
    n_actors: int = 4,
    samples_per_insert: float = 32.0,
    batch_size: int = 256,
    precision: str = "int8",
) -> pd.DataFrame:
    """Return the predicted speedup at the paper's setting for a learner ``N`` times faster than measured here.

    The actors' per-step costs come from ``actor_regime`` (an actor with a core of its own), the learner's
    update time from ``learner_regime``'s fp32 runs (the paper's networks and batch), each averaged over
    seeds; the paper's setting gives every actor its own core. Both regimes must act with the same policy.
    """
    from rlq.actorq import speedup_curve
    from rlq.actorq.cost_model import StepCosts, Topology, result_costs

    def runs(regime: str, p: str) -> list[Any]:
        found = [r for (name, _, q), r in results.items() if name == regime and q == p]
        if not found:
            raise ValueError(f"no {p} run of regime {regime!r} (have {sorted({k[0] for k in results})})")
        return found

    def mean_actor(p: str) -> dict[str, float]:
        costs = [result_costs(r).actor for r in runs(actor_regime, p)]
        return {k: float(np.mean([c[k] for c in costs])) for k in costs[0]}

    actor_sizes = {r.config.hidden_sizes for r in runs(actor_regime, "fp32") + runs(learner_regime, "fp32")}
    if len(actor_sizes) != 1:
        raise ValueError(
            f"{actor_regime!r} and {learner_regime!r} act with different policies: {sorted(actor_sizes)}"
        )
    learner = [result_costs(r) for r in runs(learner_regime, "fp32")]
    update = float(np.mean([c.learner_seconds_per_update for c in learner]))
    driver = float(np.mean([c.driver_seconds_per_step for c in learner]))
    curve = speedup_curve(
        StepCosts(mean_actor("fp32"), update, driver), StepCosts(mean_actor(precision), update, driver),
        learner_factors, Topology(n_actors), samples_per_insert=samples_per_insert, batch_size=batch_size,
    )  # fmt: skip
    return curve.assign(precision=precision)


def first_factor_reaching(curve: pd.DataFrame, target: float = 1.5) -> float | None:
    """Return the smallest learner speed-up factor on ``curve`` whose predicted speedup reaches ``target``, or None."""
    reached = curve[curve["speedup"] >= target]
    return None if reached.empty else float(reached["learner_factor"].min())


def regime_numbers(
    estimates: pd.DataFrame,
    comparison: pd.DataFrame,
    regimes: Mapping[str, Mapping[str, Any]],
    actor_regime: str,
    curve: pd.DataFrame,
) -> dict[str, Any]:
    """Return the regimes' headline numbers for ``rlq.record``: the actor regime's speedup as the claim's estimate.

    ``estimates["speedup_int8_vs_fp32"]`` is the IQM and 95% interval over seeds of the steady steps/s speedup
    in ``actor_regime``, with the regime's name and description (the report shows which regime it is);
    ``regime_speedups`` holds every regime's measured and predicted IQMs, ``prediction_error_pct`` the
    median error per regime, ``learner_factor_for_1_5x`` the paper curve's first N reaching 1.5x.
    """
    if actor_regime not in regimes:
        raise ValueError(f"actor_regime={actor_regime!r} is not one of the regimes {sorted(regimes)}")
    by = {(r.regime, r.measure): r for r in estimates.itertuples()}
    out: dict[str, Any] = {"regime_speedups": {}, "prediction_error_pct": {}}
    for name in regimes:
        out["regime_speedups"][name] = {
            m: {"value": by[(name, m)].value, "lower": by[(name, m)].lower, "upper": by[(name, m)].upper}
            for m in ("measured_speedup", "time_speedup", "predicted_speedup")
            if (name, m) in by
        }
        errors = comparison[comparison["regime"] == name]["error_pct"]
        out["prediction_error_pct"][name] = float(errors.median()) if len(errors) else None
    head = by.get((actor_regime, "measured_speedup"))
    if head is not None:
        out["estimates"] = {
            "speedup_int8_vs_fp32": {
                "value": head.value, "lower": head.lower, "upper": head.upper, "n": int(head.n), "unit": "x",
                "regime": actor_regime, "description": str(regimes[actor_regime].get("description", "")),
            }
        }  # fmt: skip
    out["learner_factor_for_1_5x"] = first_factor_reaching(curve, 1.5)
    return out
