"""GST on image classification (``gst_classification``): its data, and the tables and numbers of its runs.

The notebook trains ResNet-32 dense, with gradual pruning and with GST, every method for every seed on the same
data (:func:`load_classification_data`, split by the first seed). The tables stack the seeds (a ``seed``
column); the headline numbers are per-method means over seeds and IQM interval estimates of GST's
compression and accuracy drop.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from rlq import stats

if TYPE_CHECKING:
    from rlq.vision import ImageData, TrainedClassifier


def load_classification_data(
    cifar10_path: str,
    *,
    digits_size: int,
    max_train_images: int,
    max_test_images: int,
    val_size: float,
    seed: int,
) -> ImageData:
    """Return CIFAR-10 from ``cifar10_path`` (sklearn's digits offline when it is empty), subsampled, with a validation split.

    GST's reward is the validation accuracy, so the test images never steer training. ``seed`` draws the
    splits and subsets: the notebook passes its first training seed, so every seed trains on the same data.
    """
    from rlq.vision import load_cifar10, load_digits_images

    data = (
        load_cifar10(cifar10_path) if cifar10_path else load_digits_images(image_size=digits_size, seed=seed)
    )
    return data.subset(max_train_images, max_test_images, seed=seed).with_validation(val_size, seed=seed)


def classification_tables(
    results: dict[int, dict[str, TrainedClassifier]], out: str | Path | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return every seed's and method's per-epoch history stacked, and one summary row per seed and method.

    Both tables start with a ``seed`` column; the summary's ``accuracy_drop_vs_dense`` is paired within each
    seed. With ``out``, also written as ``out/history.csv`` and ``out/summary.csv``.
    """
    from rlq.vision import summarize

    histories, summaries = [], []
    for seed, by_method in results.items():
        history = pd.concat([r.history for r in by_method.values()], ignore_index=True)
        histories.append(history.assign(seed=seed))
        summaries.append(summarize(history).assign(seed=seed))
    history = with_seed_column(pd.concat(histories, ignore_index=True))
    summary = with_seed_column(pd.concat(summaries, ignore_index=True))
    if out is not None:
        history.to_csv(Path(out) / "history.csv", index=False)
        summary.to_csv(Path(out) / "summary.csv", index=False)
    return history, summary


def with_seed_column(table: pd.DataFrame) -> pd.DataFrame:
    """Return ``table`` with ``seed`` as its first column; a legacy table without one (a single run) is seed 0."""
    seed = table["seed"].astype(int) if "seed" in table.columns else 0
    rest = table.drop(columns=["seed"], errors="ignore")
    return rest.assign(seed=seed)[["seed", *rest.columns]]


def mean_over_seeds(table: pd.DataFrame) -> pd.DataFrame:
    """Return a summary's or history's numeric columns averaged over seeds, per method (and epoch), in run order."""
    keys = [k for k in ("method", "epoch") if k in table.columns]
    columns = [
        c for c in table.columns if c not in (*keys, "seed") and pd.api.types.is_numeric_dtype(table[c])
    ]
    return table.groupby(keys, sort=False)[columns].mean().reset_index()


def classification_estimates(summary: pd.DataFrame, **options: Any) -> dict[str, dict[str, Any]]:
    """Return the claims' IQM estimates over seeds with 95% intervals, as ``rlq.record(estimates=...)`` takes.

    ``gst_final_compression_pct`` (GST's final compression, %) and ``gst_accuracy_drop_pp`` (dense's test
    accuracy minus GST's, paired per seed, %p); ``n`` is the number of seeds. A number whose runs are
    missing is left out. ``options`` go to the bootstrap (reps, confidence, seed).
    """
    summary = with_seed_column(summary)
    of = {m: summary[summary["method"] == m].set_index("seed") for m in ("dense", "gst")}
    out: dict[str, dict[str, Any]] = {}
    compression = of["gst"]["final_compression"].dropna()
    if len(compression):
        out["gst_final_compression_pct"] = stats.estimate(compression.to_numpy(), **options).as_dict("%")
    drop = (of["dense"]["test_accuracy"] - of["gst"]["test_accuracy"]).dropna()
    if len(drop):
        out["gst_accuracy_drop_pp"] = stats.estimate(drop.to_numpy(), **options).as_dict("%p")
    return out


def classification_numbers(
    summary: pd.DataFrame, data: ImageData, *, epochs: int, steps: int, width: int, **options: Any
) -> dict[str, Any]:
    """Return a classification run's headline numbers: the data, per method means over seeds (in %), the estimates.

    ``<method>_test_accuracy``, ``_final_compression``, ``_avg_compression``, ``_wall_time_s`` and
    ``_accuracy_drop_vs_dense`` are means over seeds; ``estimates`` holds :func:`classification_estimates`
    (``options`` go to its bootstrap). A legacy summary without a ``seed`` column is one run, seed 0.
    """
    summary = with_seed_column(summary)
    seeds = sorted(int(s) for s in summary["seed"].unique())
    numbers: dict[str, Any] = {
        "dataset": data.name,
        "data_source": data.source,
        "epochs": epochs,
        "steps": steps,
        "width": width,
        "seeds": seeds,
        "n_seeds": len(seeds),
    }
    means = mean_over_seeds(summary)
    for row in means.itertuples():
        numbers[f"{row.method}_test_accuracy"] = row.test_accuracy
        numbers[f"{row.method}_final_compression"] = row.final_compression
        numbers[f"{row.method}_avg_compression"] = row.avg_compression
        numbers[f"{row.method}_wall_time_s"] = row.wall_time_s
        if "accuracy_drop_vs_dense" in means.columns:
            numbers[f"{row.method}_accuracy_drop_vs_dense"] = row.accuracy_drop_vs_dense
    numbers["estimates"] = classification_estimates(summary, **options)
    return numbers
