"""``combo_sparse_quant`` tables: methods over seeds, the Pareto front, the best method within dense's interval.

:func:`method_summary` gives per task and method the return's IQM with its 95% interval over seeds, the mean
bits per weight (the compression factor ``32 / bits``) and the mean latency ratio against dense fp32.
:func:`pareto_front` marks the non-dominated methods (return up, bits or latency down); :func:`best_within_dense`
picks the method with the fewest bits whose return IQM is not below dense's interval (inside it, or above);
:func:`combo_estimates` and :func:`combo_numbers` are what the notebook records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from rlq import stats
from rlq.sb3.deployed import METHODS, method_label

DENSE_BITS = 32.0
"""Bits per weight of the dense fp32 actor: the compression factor of a method is ``32 / bits_per_weight``."""

BEST_NUMBERS = (
    "best_bits_per_weight",
    "best_compression_factor",
    "best_latency_ratio",
    "best_return",
    "dense_return",
    "min_bits_per_weight",
)
"""The numeric headlines :func:`combo_numbers` records for the first task (beside ``best_method`` and ``pareto_bits``)."""


def method_summary(rows: pd.DataFrame, qat_bits: int = 4, reps: int = 2000) -> pd.DataFrame:
    """Return one row per task and method: return IQM with 95% interval over seeds, mean bits, compression, latency ratio.

    Columns: ``env_id``, ``method``, ``label``, ``return_iqm``, ``return_lower``, ``return_upper``, ``n`` (seeds),
    ``bits_per_weight`` (mean over seeds), ``compression_factor`` (32 / that), ``packed_bytes`` (mean),
    ``latency_us`` and ``latency_ratio`` (mean over seeds of each seed's ratio to dense fp32 measured beside it),
    ``within_dense_interval`` (return IQM at or above the lower end of dense's interval; NaN without dense),
    ``solved`` (seeds whose deployed return reaches the task's solved threshold,
    :func:`rlq.rl.evaluate.solved_threshold`; NaN for a task without one).
    """
    from rlq.rl.evaluate import solved_threshold

    out = []
    for env_id, env_rows in rows.groupby("env_id", sort=False):
        threshold, _ = solved_threshold(str(env_id))
        for method in [m for m in METHODS if m in set(env_rows["method"])]:
            group = env_rows[env_rows["method"] == method]
            est = stats.estimate(group["eval_return"].to_numpy(dtype=float), reps=reps)
            bits = float(group["bits_per_weight"].mean())
            out.append(dict(
                env_id=env_id, method=method, label=method_label(method, qat_bits), return_iqm=est.value,
                return_lower=est.lower, return_upper=est.upper, n=est.n, bits_per_weight=bits,
                compression_factor=DENSE_BITS / bits, packed_bytes=float(group["packed_bytes"].mean()),
                latency_us=float(group["latency_us"].mean()), latency_ratio=float(group["latency_ratio"].mean()),
                solved=np.nan if threshold is None else int((group["eval_return"] >= threshold).sum()),
            ))  # fmt: skip
    table = pd.DataFrame(out)
    if table.empty:
        return table
    within = []
    for row in table.itertuples():
        dense = table[(table["env_id"] == row.env_id) & (table["method"] == "dense")]
        within.append(bool(row.return_iqm >= dense["return_lower"].iloc[0]) if len(dense) else np.nan)
    return table.assign(within_dense_interval=within)


def pareto_front(table: pd.DataFrame, cost: str, value: str = "return_iqm") -> pd.Series:
    """Return a boolean Series: whether each row is non-dominated (no other row has lower-or-equal ``cost`` and
    higher-or-equal ``value`` with one of them strictly better). Rows with a NaN in either are never on the front.
    """
    costs, values = table[cost].to_numpy(dtype=float), table[value].to_numpy(dtype=float)
    valid = ~(np.isnan(costs) | np.isnan(values))
    front = []
    for i in range(len(table)):
        if not valid[i]:
            front.append(False)
            continue
        others = (
            valid & (costs <= costs[i]) & (values >= values[i]) & ((costs < costs[i]) | (values > values[i]))
        )
        front.append(not others.any())
    return pd.Series(front, index=table.index, name=f"pareto_{cost}")


def with_fronts(summary: pd.DataFrame) -> pd.DataFrame:
    """Return ``summary`` with ``pareto_bits`` and ``pareto_latency`` columns, fronts computed per task."""
    parts = []
    for _, table in summary.groupby("env_id", sort=False):
        parts.append(table.assign(pareto_bits=pareto_front(table, "bits_per_weight"),
                                  pareto_latency=pareto_front(table, "latency_ratio")))  # fmt: skip
    return pd.concat(parts) if parts else summary


def best_within_dense(summary: pd.DataFrame, env_id: str) -> pd.Series | None:
    """Return the summary row of ``env_id``'s method with the fewest bits per weight within dense's interval (dense itself if none other is); None without dense."""
    table = summary[summary["env_id"] == env_id]
    candidates = (
        table[table["within_dense_interval"].astype(bool)] if "dense" in set(table["method"]) else None
    )
    if candidates is None or candidates.empty:
        return None
    return candidates.sort_values(["bits_per_weight", "return_iqm"], ascending=[True, False]).iloc[0]


def combo_estimates(rows: pd.DataFrame, summary: pd.DataFrame, reps: int = 2000) -> dict[str, dict[str, Any]]:
    """Return interval estimates over seeds of the first task, as ``rlq.record(estimates=...)`` takes them.

    ``return_<method>`` (IQM return), ``bits_per_weight_<method>``, ``latency_ratio_<method>`` (vs dense fp32),
    and for the best method within dense's interval (:func:`best_within_dense`)
    ``combo_bits_per_weight_best_within_dense_interval`` and ``combo_compression_factor_best_within_dense_interval``
    (``32 / bits`` per seed).
    """
    if summary.empty:
        return {}
    env_id = summary["env_id"].iloc[0]
    env_rows = rows[rows["env_id"] == env_id]
    out: dict[str, dict[str, Any]] = {}

    def add(name: str, values: Sequence[float], unit: str) -> None:
        values = np.asarray(values, dtype=float)
        values = values[~np.isnan(values)]
        if len(values):
            out[name] = stats.estimate(values, reps=reps).as_dict(unit)

    for method, group in env_rows.groupby("method", sort=False):
        add(f"return_{method}", group["eval_return"], "return")
        add(f"bits_per_weight_{method}", group["bits_per_weight"], "bits")
        add(f"latency_ratio_{method}", group["latency_ratio"], "x")
    best = best_within_dense(summary, env_id)
    if best is not None:
        bits = env_rows.loc[env_rows["method"] == best["method"], "bits_per_weight"].to_numpy(dtype=float)
        add("combo_bits_per_weight_best_within_dense_interval", bits, "bits")
        add("combo_compression_factor_best_within_dense_interval", DENSE_BITS / bits, "x")
    return out


def combo_numbers(summary: pd.DataFrame, trainings: pd.DataFrame) -> dict[str, Any]:
    """Return the headline numbers: per task and method (return IQM, bits, latency ratio) and the best method's.

    Top-level numbers are the first task's: ``best_method`` (within dense's interval, fewest bits),
    ``best_bits_per_weight``, ``best_compression_factor``, ``best_latency_ratio``, ``dense_return``,
    ``best_return``, ``min_bits_per_weight`` (of any method) and ``pareto_bits`` (methods on the bits front).
    """
    if summary.empty:
        return {}
    fronts = with_fronts(summary)
    per_env: dict[str, Any] = {}
    for env_id, table in fronts.groupby("env_id", sort=False):
        best = best_within_dense(summary, env_id)
        dense = table[table["method"] == "dense"]
        per_env[env_id] = {
            "return_iqm": dict(zip(table["method"], table["return_iqm"].astype(float), strict=True)),
            "bits_per_weight": dict(
                zip(table["method"], table["bits_per_weight"].astype(float), strict=True)
            ),
            "latency_ratio": dict(zip(table["method"], table["latency_ratio"].astype(float), strict=True)),
            "solved_seeds": {
                m: (None if np.isnan(v) else int(v))
                for m, v in zip(table["method"], table["solved"].astype(float), strict=True)
            },
            "pareto_bits": table.loc[table["pareto_bits"], "method"].tolist(),
            "pareto_latency": table.loc[table["pareto_latency"], "method"].tolist(),
            "best_method": None if best is None else str(best["method"]),
            "best_bits_per_weight": None if best is None else float(best["bits_per_weight"]),
            "best_compression_factor": None if best is None else float(best["compression_factor"]),
            "best_latency_ratio": None if best is None else float(best["latency_ratio"]),
            "best_return": None if best is None else float(best["return_iqm"]),
            "dense_return": float(dense["return_iqm"].iloc[0]) if len(dense) else None,
            "min_bits_per_weight": float(table["bits_per_weight"].min()),
        }
    first = next(iter(per_env.values()))
    return {
        **{k: first[k] for k in ("best_method", *BEST_NUMBERS, "pareto_bits")},
        "per_env": per_env,
        "train_wall_time_s": float(trainings["train_wall_time_s"].sum()) if len(trainings) else None,
        "seeds": int(summary["n"].max()),
    }


def paper_comparison(
    summary: pd.DataFrame, trainings: pd.DataFrame, gst_avg_compression_pct: float, quarl_int8_drop_pct: float
) -> pd.DataFrame:
    """Return the papers' numbers beside ours, per task: GST's compression and QuaRL's int8 reward change.

    GST (TD3, Humanoid) reports an average compression ratio over training (share of weights not stored);
    as storage, fp32 values alone at that ratio are ``32 * (1 - ratio)`` bits per weight, with no index
    counted. Ours: GST's average compression over training (online networks) and the deployed GST actor's
    bits per weight, index included. QuaRL reports int8 PTQ losing no reward; ours is the change of PTQ int8's
    return IQM against dense fp32's, in %.
    """
    rows = []
    for env_id, table in summary.groupby("env_id", sort=False):
        of = table.set_index("method")
        gst_runs = trainings[(trainings["env_id"] == env_id) & (trainings["training"] == "gst")]
        if "gst" in of.index:
            ours = 100 * float(gst_runs["avg_compression_ratio"].mean()) if len(gst_runs) else float("nan")
            rows.append(dict(env_id=env_id, measure="GST: average compression over training (%)",
                             paper=gst_avg_compression_pct, ours=ours))  # fmt: skip
            rows.append(dict(env_id=env_id, measure="GST: bits per weight (paper: fp32 values alone, no index)",
                             paper=DENSE_BITS * (1 - gst_avg_compression_pct / 100),
                             ours=float(of.loc["gst", "bits_per_weight"])))  # fmt: skip
        if {"dense", "ptq_int8"} <= set(of.index):
            dense = float(of.loc["dense", "return_iqm"])
            change = (
                100 * (float(of.loc["ptq_int8", "return_iqm"]) - dense) / abs(dense)
                if dense
                else float("nan")
            )
            rows.append(dict(env_id=env_id, measure="QuaRL: PTQ int8 return change vs fp32 (%)",
                             paper=-quarl_int8_drop_pct, ours=change))  # fmt: skip
    return pd.DataFrame(rows, columns=["env_id", "measure", "paper", "ours"])
