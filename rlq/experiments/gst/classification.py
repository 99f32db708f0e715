"""GST on image classification (``gst_classification``): ResNet-32 trained dense, with gradual pruning and with GST.

Several seeds: every seed trains every method on the same data (split by the first seed), each seed with its
own initial weights (shared by its methods) and batch order, under its own folder ``out/seed_<s>/``. The
tables stack the seeds (a ``seed`` column); the headline numbers are per-method means over seeds and IQM
interval estimates of GST's compression and accuracy drop.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from rlq.core.validation import check_positive_int
from rlq.experiments import seed_statistics

if TYPE_CHECKING:
    from rlq.vision import ImageData, TrainedClassifier
    from rlq.vision.schedules import CompressionSchedule


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


def seed_folder(out: str | Path, seed: int) -> Path:
    """Return the folder one seed's runs write under: ``out/seed_<seed>``."""
    return Path(out) / f"seed_{seed}"


def train_classifiers(  # noqa: PLR0913
    data: ImageData,
    schedules: Mapping[str, CompressionSchedule | None],
    *,
    epochs: int,
    batch_size: int,
    width: int,
    seeds: Sequence[int],
    out: str | Path,
    progress: Callable[[str], Any] | None = None,
    workers: int = 1,
    torch_threads: int | None = None,
    **train: Any,
) -> dict[int, dict[str, TrainedClassifier]]:
    """Return one ResNet-32 trained per seed and method (``results[seed][method]``), each resumable from its checkpoints.

    ``schedules`` maps each method to the compression schedule the caller built (:class:`rlq.compress.GSTSchedule`,
    :class:`rlq.compress.GradualPruning`, None for dense); every (seed, method) trains under a fresh copy of
    it. Within a seed every method starts from the same initial weights; the seed also orders the batches.
    ``train`` holds :func:`rlq.vision.train_classifier`'s options (``lr``, ``weight_decay``, ``device``, ...).
    Checkpoints go to ``out/seed_<s>/checkpoints/<method>/``, so a seed resumes on its own; ``progress`` gets
    one line per trained method.

    ``workers > 1`` trains the (seed, method) pairs that many at a time in fresh processes
    (:func:`rlq.rl.parallel.run_jobs`), each with ``torch_threads`` threads; the models are then read back
    here from their final checkpoints, so the results are those of ``workers=1`` (the same batches, initial
    weights and checkpoints), only sooner.
    """
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and at least one, got {seeds}")
    if not schedules:
        raise ValueError("schedules is empty: give at least one method, e.g. {'dense': None}")
    check_positive_int("workers", workers)
    total_steps = epochs * data.steps_per_epoch(batch_size)
    for method, schedule in schedules.items():
        steps = getattr(getattr(schedule, "config", None), "total_steps", total_steps)
        if steps != total_steps:
            raise ValueError(
                f"schedules[{method!r}] has total_steps={steps}, but {epochs} epochs of "
                f"{data.steps_per_epoch(batch_size)} steps are {total_steps}"
            )
    run = dict(epochs=epochs, batch_size=batch_size, width=width, out=out, train=train)
    if workers > 1:
        from rlq.experiments.gst.training_runs import keys_label
        from rlq.rl.parallel import run_jobs

        pairs = [(seed, method) for seed in seeds for method in schedules]
        jobs = [
            dict(data=data, schedules={m: schedules[m]}, seed=s, torch_threads=torch_threads, **run)
            for s, m in pairs
        ]
        labels = [keys_label({"seed": s, "method": m}) for s, m in pairs]
        run_jobs(_train_job, jobs, workers=workers, labels=labels)
    return {seed: _train_seed(data, schedules, seed=seed, progress=progress, **run) for seed in seeds}


def _train_job(
    data: ImageData,
    schedules: Mapping[str, CompressionSchedule | None],
    seed: int,
    torch_threads: int | None,
    **run: Any,
) -> int:
    """Return the epochs a worker trained ``schedules``' methods of ``seed`` to (their final checkpoints hold the models)."""
    if torch_threads is not None:
        torch.set_num_threads(check_positive_int("torch_threads", torch_threads))
    trained = _train_seed(data, schedules, seed=seed, progress=None, **run)
    return min(int(r.history["epoch"].max()) for r in trained.values())


def _train_seed(  # noqa: PLR0913
    data: ImageData,
    schedules: Mapping[str, CompressionSchedule | None],
    epochs: int,
    batch_size: int,
    width: int,
    seed: int,
    out: str | Path,
    progress: Callable[[str], Any] | None,
    train: dict[str, Any],
) -> dict[str, TrainedClassifier]:
    """Return one seed's classifiers, one per method, trained under ``out/seed_<seed>/checkpoints/``."""
    from rlq.vision import resnet32, train_classifier

    results = {}
    for method, schedule in schedules.items():
        torch.manual_seed(seed)  # the same initial weights for every method of this seed
        model = resnet32(num_classes=data.num_classes, width=width, in_channels=data.image_shape[0])
        results[method] = result = train_classifier(
            model,
            data,
            epochs,
            batch_size=batch_size,
            schedule=copy.deepcopy(schedule),
            seed=seed,
            method=method,
            checkpoint_dir=seed_folder(out, seed) / "checkpoints" / method,
            **train,
        )
        if progress is not None:
            last = result.history.iloc[-1]
            resumed = (
                ", read from its final checkpoint" if result.resumed_from == epochs
                else f", resumed from epoch {result.resumed_from}" if result.resumed_from else ""
            )  # fmt: skip
            progress(
                f"seed {seed} {method:8s} test accuracy {100 * last.test_accuracy:.2f}%  compression final "
                f"{100 * last.compression_ratio:.1f}% / average {100 * last.avg_compression_ratio:.1f}%  "
                f"({result.wall_time_s:.0f} s{resumed})"
            )
    return results


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
        out["gst_final_compression_pct"] = seed_statistics.estimate(
            compression.to_numpy(), **options
        ).as_dict("%")
    drop = (of["dense"]["test_accuracy"] - of["gst"]["test_accuracy"]).dropna()
    if len(drop):
        out["gst_accuracy_drop_pp"] = seed_statistics.estimate(drop.to_numpy(), **options).as_dict("%p")
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
