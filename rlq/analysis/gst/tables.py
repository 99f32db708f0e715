"""GST tables and headline numbers: methods compared over seeds, the controller's decisions, the S_shift sweep."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from rlq import stats
from rlq.claims.measure import measure_table, table_metric

METHODS = ("dense", "pruning", "gst")
"""The compression methods of the GST notebooks: dense training, Zhu & Gupta's gradual (iterative) pruning, GST."""

SUMMARY_MEANS = (
    "avg_compression_ratio",
    "final_compression_ratio",
    "covered_fraction",
    "eval_return",
    "final_train_return",
)
"""Summary columns :func:`method_means` averages over seeds (``eval_return`` only when the runs were evaluated)."""


def score_column(summary: pd.DataFrame) -> str:
    """Return the column that scores a run: ``eval_return`` when the runs were evaluated, else ``final_train_return``."""
    return "eval_return" if "eval_return" in summary.columns else "final_train_return"


def method_means(summary: pd.DataFrame, by: Sequence[str] = ("method",)) -> pd.DataFrame:
    """Return the mean over seeds of each method's :data:`SUMMARY_MEANS` columns, one row per ``by`` group (in run order)."""
    columns = [c for c in SUMMARY_MEANS if c in summary.columns]
    return summary.groupby(list(by), sort=False)[columns].mean()


def _method_mean(means: pd.DataFrame, method: str, column: str) -> float | None:
    """Return ``method``'s value of ``column`` in :func:`method_means`'s table, or None when it was not run."""
    return float(means.loc[method, column]) if method in means.index else None


def compare_methods(
    summary: pd.DataFrame, score: str | None = None, score_name: str = "final_return"
) -> dict[str, Any]:
    """Return one task's headline numbers: each method's average compression and score, GST against pruning and dense.

    ``summary`` holds the task's runs (one row per seed and method); ``score`` is the column that scores a
    run (default :func:`score_column`), recorded as ``<score_name>_<method>``; ``reward_change_gst_vs_dense_pct``
    is GST's mean score against dense's, in % of |dense's|. Whether GST keeps the reward is judged on the
    interval of :func:`seed_estimates` (``reward_drop_gst_vs_dense_pct``) by :mod:`rlq.claims` alone. A
    method that was not run gives None.
    """
    score = score or score_column(summary)
    means = method_means(summary)
    compression = {m: _method_mean(means, m, "avg_compression_ratio") for m in METHODS}
    gst, pruning = compression["gst"], compression["pruning"]
    dense, gst_score = (_method_mean(means, m, score) for m in ("dense", "gst"))
    change = (
        100 * (gst_score - dense) / abs(dense)
        if None not in (dense, gst_score) and dense != 0 and not math.isnan(dense + gst_score)
        else None
    )
    return {
        **{f"avg_compression_{m}": compression[m] for m in METHODS},
        "gap_gst_minus_pruning_pp": 100 * (gst - pruning) if None not in (gst, pruning) else None,
        **{f"{score_name}_{m}": _method_mean(means, m, score) for m in METHODS},
        "reward_change_gst_vs_dense_pct": change,
        "covered_fraction": _method_mean(means, "gst", "covered_fraction"),
    }


def _paired(summary: pd.DataFrame, column: str, a: str, b: str) -> pd.Series:
    """Return method ``a``'s ``column`` minus method ``b``'s, matched run by run on seed (and task)."""
    keys = [k for k in ("env_id", "seed") if k in summary.columns]
    left = summary[summary["method"] == a].set_index(keys)[column]
    right = summary[summary["method"] == b].set_index(keys)[column]
    return (left - right).dropna()


def seed_estimates(
    summary: pd.DataFrame, score: str | None = None, **options: Any
) -> dict[str, dict[str, Any]]:
    """Return the claims' interval estimates over seeds (IQM, 95% interval), as ``rlq.record(estimates=...)`` takes.

    ``avg_compression_gst_pct`` (GST's average compression, %), ``gap_gst_minus_pruning_pp`` (GST minus
    pruning on the seeds both ran, %p), ``gain_gst_vs_pruning_pp`` (the same, a fixed-schedule pruning paired
    with every GST seed), ``reward_drop_gst_vs_dense_pct`` (the drop of GST's score IQM below dense's, in % of
    dense's: minus :func:`rlq.experiments.stats.percent_change`), ``reward_drop_paired_gst_vs_dense_pct`` (the
    same with seeds resampled in pairs) and ``score_iqm_<method>`` per method: the metrics of
    ``data/claims.csv`` (:mod:`rlq.claims.measure`). A
    number whose runs are missing is left out. ``options`` go to the bootstrap (reps, confidence, seed).
    """
    score = score or score_column(summary)
    out: dict[str, dict[str, Any]] = {}
    of = {m: summary.loc[summary["method"] == m] for m in METHODS}
    compression = of["gst"]["avg_compression_ratio"].dropna()
    if len(compression):
        out["avg_compression_gst_pct"] = stats.estimate(100 * compression.to_numpy(), **options).as_dict("%")
    gap = _paired(summary, "avg_compression_ratio", "gst", "pruning")
    if len(gap):
        out["gap_gst_minus_pruning_pp"] = stats.estimate(100 * gap.to_numpy(), **options).as_dict("%p")
    dense, gst = (of[m][score].dropna().to_numpy() for m in ("dense", "gst"))
    change = stats.percent_change(gst, dense, **options) if len(dense) and len(gst) else None
    if change is not None and not math.isnan(change.value):  # NaN: dense's IQM is 0, no scale
        drop = stats.Estimate(-change.value, -change.upper, -change.lower, change.n)
        out["reward_drop_gst_vs_dense_pct"] = drop.as_dict("%")
    gain = measure_table(table_metric("paired_difference", "avg_compression_ratio", "gst", "pruning", 100.0),
                         summary, **options)  # fmt: skip
    if gain is not None:
        out["gain_gst_vs_pruning_pp"] = gain.estimate.as_dict("%p")
    paired = measure_table(table_metric("paired_iqm_drop", score, "gst", "dense"), summary, **options)
    if paired is not None:
        out["reward_drop_paired_gst_vs_dense_pct"] = paired.estimate.as_dict("%")
    for method, rows in of.items():
        values = rows[score].dropna().to_numpy()
        if len(values):
            out[f"score_iqm_{method}"] = stats.estimate(values, **options).as_dict(score)
    return out


def gst_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Return the rows of ``table`` of method ``gst``, or without any those of GST's variants (``gst_*``: an ablation's arms)."""
    methods = table["method"].astype(str)
    plain = table[methods == "gst"]
    return plain if len(plain) else table[methods.str.startswith("gst_")]


def gst_start_compression(summary: pd.DataFrame) -> float | None:
    """Return the lowest compression ratio GST runs start training with (block-circulant from step 0), or None."""
    start = gst_rows(summary)["start_compression_ratio"]
    return float(start.min()) if len(start) else None


def controller_decisions(history: pd.DataFrame) -> dict[str, int]:
    """Return how often GST's reward-aware controller took each decision (rise, backoff, ...) at its pruning updates."""
    gst = gst_rows(history)
    updates = gst[gst["decision"].notna() & (gst["event"] != "log")]
    return {str(k): int(v) for k, v in updates["decision"].value_counts().items()}


def sweep_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Return the GST runs of a sweep averaged over seeds, one row per (transition, S_shift)."""
    gst = summary[summary["method"] == "gst"]
    return gst.groupby(["transition", "s_shift"])[
        ["avg_compression_ratio", "final_compression_ratio", "eval_return", "final_train_return"]
    ].mean()


def transition_shifts(events: pd.DataFrame) -> pd.Series:
    """Return the mean relative weight shift at the block-size transitions, per transition method."""
    return events[events["kind"] == "transition"].groupby("transition")["mean_shift"].mean()


def sweep_numbers(table: pd.DataFrame, summary: pd.DataFrame, events: pd.DataFrame) -> dict[str, Any]:
    """Return a sweep's headline numbers: average compression and return per configuration, the best, the dense return."""
    dense = summary.loc[summary["method"] == "dense", "eval_return"]
    best = table["avg_compression_ratio"].idxmax()
    return {
        "avg_compression": {
            sweep_label(t, s): float(v) for (t, s), v in table["avg_compression_ratio"].items()
        },
        "eval_return": {sweep_label(t, s): float(v) for (t, s), v in table["eval_return"].items()},
        "dense_eval_return": float(dense.mean()) if len(dense) else None,
        "best_config": sweep_label(*best),
        "best_avg_compression": float(table["avg_compression_ratio"].max()),
        "transition_shift": {str(k): float(v) for k, v in transition_shifts(events).items()},
    }


def phase_returns(
    curve: pd.DataFrame, total_timesteps: int, edges: Sequence[float] = (0.0, 0.5, 0.8, 1.0)
) -> pd.DataFrame:
    """Return the mean training-episode return per method, seed and phase of training (one column per phase).

    ``curve`` has columns timestep, episode_return, seed, method (a run's ``curve.csv``, several stacked);
    ``edges`` are fractions of ``total_timesteps`` (GST's defaults: 0.5 ends the block-circulant phase, 0.8
    ends pruning). A phase column is named by its percent range, e.g. ``"0-50%"``; an episode belongs to the
    phase its final step falls in, the last edge included.
    """
    if len(edges) < 2 or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise ValueError(f"edges={list(edges)}: need at least two increasing fractions")
    missing = {"timestep", "episode_return", "seed", "method"} - set(curve.columns)
    if missing:
        raise ValueError(f"curve lacks columns {sorted(missing)}")
    labels = [f"{100 * a:g}-{100 * b:g}%" for a, b in zip(edges, edges[1:], strict=False)]
    bins = [e * total_timesteps for e in edges]
    phase = pd.cut(curve["timestep"], bins=bins, labels=labels, include_lowest=True, right=True)
    table = (
        curve.assign(phase=phase)
        .dropna(subset=["phase"])
        .groupby(["method", "seed", "phase"], observed=True)["episode_return"]
        .mean()
        .unstack("phase")
    )
    return table.reindex(columns=labels).reset_index()


def sweep_label(transition: str, s_shift: float) -> str:
    """Return the name of one swept GST configuration, e.g. ``"exact, S_shift 0.25"``."""
    return f"{transition}, S_shift {s_shift:g}"
