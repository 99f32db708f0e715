"""GST on image classification (``gst_classification``): ResNet-32 trained dense, with gradual pruning and with GST."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

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

    GST's reward is the validation accuracy, so the test images never steer training.
    """
    from rlq.vision import load_cifar10, load_digits_images

    data = (
        load_cifar10(cifar10_path) if cifar10_path else load_digits_images(image_size=digits_size, seed=seed)
    )
    return data.subset(max_train_images, max_test_images, seed=seed).with_validation(val_size, seed=seed)


def train_classifiers(
    data: ImageData,
    methods: Sequence[str],
    *,
    epochs: int,
    batch_size: int,
    width: int,
    seed: int,
    out: str | Path,
    schedule: dict[str, Any],
    progress: Callable[[str], Any] | None = None,
    **train: Any,
) -> dict[str, TrainedClassifier]:
    """Return one ResNet-32 trained per method, each from the same initial weights and resumable from its checkpoints.

    ``schedule`` holds :func:`rlq.vision.make_schedule`'s knobs, ``train`` :func:`rlq.vision.train_classifier`'s
    (``lr``, ``weight_decay``, ``device``, ...). Checkpoints go to ``out/checkpoints/<method>/``; ``progress``
    gets one line per trained method.
    """
    from rlq.vision import make_schedule, resnet32, train_classifier

    steps_per_epoch = data.steps_per_epoch(batch_size)
    results = {}
    for method in methods:
        torch.manual_seed(seed)  # the same initial weights for every method
        model = resnet32(num_classes=data.num_classes, width=width, in_channels=data.image_shape[0])
        results[method] = result = train_classifier(
            model,
            data,
            epochs,
            batch_size=batch_size,
            schedule=make_schedule(method, epochs * steps_per_epoch, steps_per_epoch, **schedule),
            seed=seed,
            method=method,
            checkpoint_dir=Path(out) / "checkpoints" / method,
            **train,
        )
        if progress is not None:
            last = result.history.iloc[-1]
            resumed = f", resumed from epoch {result.resumed_from}" if result.resumed_from else ""
            progress(
                f"{method:8s} test accuracy {100 * last.test_accuracy:.2f}%  compression final "
                f"{100 * last.compression_ratio:.1f}% / average {100 * last.avg_compression_ratio:.1f}%  "
                f"({result.wall_time_s:.0f} s{resumed})"
            )
    return results


def classification_tables(
    results: dict[str, TrainedClassifier], out: str | Path | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return every method's per-epoch history stacked, and one summary row per method; with ``out``, also as CSVs."""
    from rlq.vision import summarize

    history = pd.concat([r.history for r in results.values()], ignore_index=True)
    summary = summarize(history)
    if out is not None:
        history.to_csv(Path(out) / "history.csv", index=False)
        summary.to_csv(Path(out) / "summary.csv", index=False)
    return history, summary


def layer_kinds(model: torch.nn.Module) -> pd.DataFrame:
    """Return a network's layers grouped by kind (dense, block-circulant, pruned): how many, stored and dense weights."""
    from rlq.compress import layer_report

    layers = pd.DataFrame(layer_report(model))
    return layers.groupby("kind").agg(
        layers=("name", "count"), stored=("stored", "sum"), dense=("dense", "sum")
    )


def classification_numbers(
    summary: pd.DataFrame, data: ImageData, *, epochs: int, steps: int, width: int
) -> dict[str, Any]:
    """Return a classification run's headline numbers: the data, then per method accuracy and compression (in %)."""
    numbers: dict[str, Any] = {
        "dataset": data.name,
        "data_source": data.source,
        "epochs": epochs,
        "steps": steps,
        "width": width,
    }
    for row in summary.itertuples():
        numbers[f"{row.method}_test_accuracy"] = row.test_accuracy
        numbers[f"{row.method}_final_compression"] = row.final_compression
        numbers[f"{row.method}_avg_compression"] = row.avg_compression
        numbers[f"{row.method}_wall_time_s"] = row.wall_time_s
        if "accuracy_drop_vs_dense" in summary.columns:
            numbers[f"{row.method}_accuracy_drop_vs_dense"] = row.accuracy_drop_vs_dense
    return numbers
