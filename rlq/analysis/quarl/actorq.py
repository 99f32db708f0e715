"""QuaRL's ActorQ (``quarl_actorq``): the same learner with actors at each precision, runtime breakdowns, speedups."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from rlq.actorq import ActorQResult

ACTOR_PARTS = {
    "step": ("actor_env_step", "actor_inference"),
    "pull": ("actor_pull",),
    "deserialize": ("actor_deserialize",),
    "load": ("actor_load",),
}
"""The paper's categories of actor time (step = environment + inference), each as ActorQ's timers."""

LEARNER_PARTS = ("learner_update", "learner_sample", "learner_insert", "broadcast", "learner_wait")
"""Where the learner's process spends its time."""


def task_name(env_id: str) -> str:
    """Return a DeepMind Control task's short name: ``"dm_control/cartpole-balance-v0"`` gives ``"cartpole-balance"``."""
    return env_id.split("/")[-1].removesuffix("-v0")


ActorQResults = dict[tuple[str, str], "ActorQResult"]


def actor_breakdown(results: ActorQResults) -> pd.DataFrame:
    """Return the actors' seconds per 1000 steps in each of :data:`ACTOR_PARTS`, summed over tasks, per precision."""
    rows = []
    for precision in dict.fromkeys(p for _, p in results):
        runs = [r for (_, p), r in results.items() if p == precision]
        steps = sum(r.env_steps for r in runs)
        for part, keys in ACTOR_PARTS.items():
            seconds = sum(r.breakdown[k] for r in runs for k in keys)
            rows.append(
                dict(precision=precision, part=part, seconds_per_1000_steps=1000 * seconds / max(steps, 1))
            )
    return pd.DataFrame(rows)


def learner_breakdown(results: ActorQResults, backend: str) -> pd.DataFrame:
    """Return the learner process's seconds in each of :data:`LEARNER_PARTS` per precision (and, local, its actors')."""
    precisions = list(dict.fromkeys(p for _, p in results))
    rows = [
        dict(precision=p, part=k, seconds=sum(r.breakdown[k] for (_, q), r in results.items() if q == p))
        for p in precisions
        for k in LEARNER_PARTS
    ]
    if backend == "local":  # the actors ran in the learner's process, between its updates
        rows += [
            dict(
                precision=p,
                part="actors (in process)",
                seconds=sum(
                    v
                    for (_, q), r in results.items()
                    if q == p
                    for k, v in r.breakdown.items()
                    if k.startswith("actor_")
                ),
            )
            for p in precisions
        ]
    return pd.DataFrame(rows)


def actorq_summary(results: ActorQResults, return_threshold: float) -> pd.DataFrame:
    """Return one row per task and precision: bytes per broadcast, actor steps/s, engine, time to the threshold, final return."""
    return pd.DataFrame(
        [
            dict(
                task=task_name(e),
                precision=p,
                bytes_per_broadcast=r.bytes_per_broadcast,
                actor_steps_per_s=r.actor_steps_per_s,
                engine=r.actor_backend,
                time_to_threshold_s=r.time_to_learned_return(return_threshold),
                wall_time_s=r.wall_time_s,
                final_return=float(r.history["eval_return"].iloc[-1]),
            )
            for (e, p), r in results.items()
        ]
    )


def speedup(results: ActorQResults, precision: str, return_threshold: float) -> float | None:
    """Return the wall-clock speedup to ``return_threshold`` of ``precision`` actors over fp32 actors.

    The geometric mean over the tasks where both reached the threshold; None where none did, or where
    either precision was not run.
    """
    ratios = []
    for env_id in dict.fromkeys(e for e, _ in results):
        if (env_id, "fp32") not in results or (env_id, precision) not in results:
            continue
        t_ref = results[(env_id, "fp32")].time_to_learned_return(return_threshold)
        t_other = results[(env_id, precision)].time_to_learned_return(return_threshold)
        if t_ref is not None and t_other is not None and t_other > 0:
            ratios.append(t_ref / t_other)
    return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None


def actor_breakdown_shares(results: ActorQResults) -> dict[str, dict[str, float]]:
    """Return each :data:`ACTOR_PARTS` part's share of the actors' time, summed over tasks, per precision."""
    shares = {}
    for precision in dict.fromkeys(p for _, p in results):
        runs = [r for (_, p), r in results.items() if p == precision]
        totals = {part: sum(r.breakdown[k] for r in runs for k in keys) for part, keys in ACTOR_PARTS.items()}
        all_actor = sum(totals.values())
        shares[precision] = {part: (v / all_actor if all_actor else 0.0) for part, v in totals.items()}
    return shares


def actorq_numbers(results: ActorQResults, summary: pd.DataFrame, return_threshold: float) -> dict[str, Any]:
    """Return an ActorQ run's headline numbers: speedups over fp32 actors, actor throughput, broadcast bytes, shares, returns."""
    precisions = list(dict.fromkeys(p for _, p in results))
    first_task = summary["task"].iloc[0]
    first = summary[summary["task"] == first_task]
    return {
        "speedup_int8_vs_fp32": speedup(results, "int8", return_threshold)
        if {"int8", "fp32"} <= set(precisions)
        else None,
        "speedup_fp16_vs_fp32": speedup(results, "fp16", return_threshold)
        if {"fp16", "fp32"} <= set(precisions)
        else None,
        "actor_steps_per_s": {
            p: float(summary[summary["precision"] == p]["actor_steps_per_s"].mean()) for p in precisions
        },
        "bytes_per_broadcast": {
            p: int(first[first["precision"] == p]["bytes_per_broadcast"].iloc[0]) for p in precisions
        },
        "actor_breakdown_shares": actor_breakdown_shares(results),
        "final_return": {
            f"{task_name(e)}/{p}": float(r.history["eval_return"].iloc[-1]) for (e, p), r in results.items()
        },
        "time_to_threshold_s": {
            f"{task_name(e)}/{p}": r.time_to_learned_return(return_threshold) for (e, p), r in results.items()
        },
        "actor_engine": {p: r.actor_backend for (e, p), r in results.items() if task_name(e) == first_task},
    }
