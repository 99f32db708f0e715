"""Training an image classifier under a compression schedule (GST or gradual pruning), with checkpoints and resume.

:func:`train_classifier` is a plain SGD loop (He et al. 2016's CIFAR recipe by default) that calls a
schedule's ``apply_(model, step, scores, optimizers)`` before every optimizer step, the same interface as
:class:`rlq.compress.GSTSchedule`. The reward GST's reward-aware controller sees is the validation accuracy
measured at the end of each epoch (higher is better), so compression rises while accuracy holds. The
baseline :class:`rlq.compress.GradualPruning` is Zhu & Gupta's cubic schedule behind the same interface.

One row of history per epoch; the average compression ratio is exact, the mean over every optimizer
step of the ratio the step trained with (GST's "average compression ratio").
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from rlq.compress import compression_ratio, load_compressed_state_dict_
from rlq.vision.datasets import ImageData
from rlq.vision.schedules import CompressionSchedule

log = logging.getLogger(__name__)

LR_SCHEDULES = ("step", "cosine", "constant")
HISTORY_COLUMNS = [
    "method",
    "epoch",
    "step",
    "lr",
    "train_loss",
    "train_accuracy",
    "val_accuracy",
    "test_accuracy",
    "compression_ratio",
    "avg_compression_ratio",
    "target_sparsity",
    "phase",
    "wall_time_s",
]


def learning_rate(step: int, total_steps: int, base_lr: float, schedule: str = "step") -> float:
    """Return the learning rate at ``step``.

    ``"step"``: He et al. 2016's CIFAR schedule, divided by 10 at 50% and 75% of training (32k and 48k of
    64k iterations); ``"cosine"``: half a cosine from ``base_lr`` to 0; ``"constant"``.
    """
    if schedule == "constant":
        return base_lr
    progress = step / max(total_steps, 1)
    if schedule == "step":
        return base_lr * 0.1 ** sum(progress >= m for m in (0.5, 0.75))
    if schedule == "cosine":
        return 0.5 * base_lr * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {schedule!r}")


@torch.no_grad()
def evaluate_accuracy(
    model: nn.Module,
    data: ImageData,
    split: str = "test",
    batch_size: int = 500,
    device: str | torch.device = "cpu",
) -> float:
    """Return ``model``'s top-1 accuracy (0-1) on ``split`` (``"test"`` or ``"val"``) in eval mode."""
    was_training = model.training
    model.eval()
    correct = total = 0
    with parametrize.cached():  # expand block-circulant weights once, not per batch
        for images, labels in data.eval_batches(split, batch_size):
            logits = model(images.to(device))
            correct += int((logits.argmax(1).cpu() == labels).sum())
            total += len(labels)
    model.train(was_training)
    return correct / total


@dataclass(frozen=True)
class SGDRecipe:
    """How :func:`train_classifier` runs SGD: He et al. 2016's CIFAR recipe by default.

    ``lr`` 0.1 under ``lr_schedule`` (:func:`learning_rate`: ``"step"`` divides it by 10 at 50% and 75% of
    training), momentum 0.9, weight decay 1e-4, batches of ``batch_size`` 128; ``augment`` overrides the
    data's own augmentation (None keeps it: :meth:`ImageData.train_batches`); accuracy is measured in
    batches of ``eval_batch_size``, which changes no result.
    """

    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    batch_size: int = 128
    lr_schedule: str = "step"
    augment: str | None = None
    eval_batch_size: int = 500

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.momentum < 0 or self.weight_decay < 0:
            raise ValueError(
                f"momentum and weight_decay must be >= 0, got {self.momentum} and {self.weight_decay}"
            )
        if self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError(f"batch sizes must be >= 1, got {self.batch_size} and {self.eval_batch_size}")
        learning_rate(0, 1, self.lr, self.lr_schedule)  # refuses an unknown schedule by name


@dataclass
class TrainedClassifier:
    """A trained classifier with its per-epoch history."""

    model: nn.Module
    history: pd.DataFrame
    """One row per epoch, columns :data:`HISTORY_COLUMNS`."""
    wall_time_s: float
    """Training seconds, earlier attempts of a resumed run included."""
    resumed_from: int | None
    """The epoch the run resumed from, or None."""
    checkpoint: Path | None
    """The newest checkpoint written or read."""


_CHECKPOINT = re.compile(r"epoch_(\d+)\.pt$")


def latest_classifier_checkpoint(folder: str | Path) -> tuple[int, Path] | None:
    """Return ``(epoch, path)`` of the newest checkpoint ``epoch_<n>.pt`` in ``folder``, or None."""
    found = [
        (int(m.group(1)), p) for p in Path(folder).glob("epoch_*.pt") if (m := _CHECKPOINT.search(p.name))
    ]
    return max(found) if found else None


def _save_checkpoint(folder: Path, epoch: int, state: dict[str, Any], keep: int = 2) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"epoch_{epoch:04d}.pt"
    tmp = folder / f".tmp_epoch_{epoch:04d}.pt"
    torch.save(state, tmp)
    os.replace(tmp, path)  # a crash never leaves half a checkpoint under the real name
    older = sorted(
        (e, p)
        for p in folder.glob("epoch_*.pt")
        if (m := _CHECKPOINT.search(p.name))
        for e in [int(m.group(1))]
    )
    for _, old in older[:-keep]:
        old.unlink()
    return path


def _check_optimizer_state(optimizer: torch.optim.Optimizer, path: Path) -> None:
    for group in optimizer.param_groups:
        for p in group["params"]:
            buffer = optimizer.state.get(p, {}).get("momentum_buffer")
            if buffer is not None and buffer.shape != p.shape:
                raise RuntimeError(
                    f"checkpoint {path}: optimizer state of shape {tuple(buffer.shape)} for a parameter of "
                    f"shape {tuple(p.shape)}; resume with a freshly built (dense) model of the same architecture"
                )


def train_classifier(
    model: nn.Module,
    data: ImageData,
    epochs: int,
    *,
    recipe: SGDRecipe | None = None,
    schedule: CompressionSchedule | None = None,
    seed: int = 0,
    method: str = "dense",
    checkpoint_dir: str | Path | None = None,
) -> TrainedClassifier:
    """Return ``model`` trained ``epochs`` epochs by SGD under ``schedule``, resuming from ``checkpoint_dir``.

    SGD follows ``recipe`` (None: :class:`SGDRecipe`'s defaults, He et al. 2016's CIFAR recipe) on the
    device the model's parameters are on (move it first: ``model.to("cuda")``). ``schedule`` (None: dense;
    :class:`GradualPruning`; :class:`GSTSchedule`) is applied before every optimizer step, with the
    validation accuracy of the last epoch as its reward (the test accuracy when ``data`` has no validation
    split, with a warning); its ``total_steps`` must be ``epochs * data.steps_per_epoch(recipe.batch_size)``.
    ``method`` labels the history rows.

    With ``checkpoint_dir`` a checkpoint (model, optimizer, schedule, history, RNG) is written after every
    epoch (the newest two are kept) and a later call resumes from the newest one. Give a freshly built
    dense model each time: the compression structure is re-applied from the checkpoint, and the optimizer,
    built before any compression, must see the parameters in the dense model's order. Batch order and
    augmentation depend only on ``seed`` and the epoch, so a resumed run repeats an uninterrupted one.
    """
    recipe = SGDRecipe() if recipe is None else recipe
    batch_size, lr = recipe.batch_size, recipe.lr
    steps_per_epoch = _steps_per_epoch(data, epochs, batch_size, schedule)
    lr_at = functools.partial(
        learning_rate, total_steps=epochs * steps_per_epoch, base_lr=lr, schedule=recipe.lr_schedule
    )
    reward_split = _reward_split(data, schedule)
    device = next(model.parameters()).device
    optimizer = torch.optim.SGD(
        model.parameters(), lr=lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay
    )
    meta = {"epochs": epochs, "steps_per_epoch": steps_per_epoch, "method": method}
    folder = Path(checkpoint_dir) if checkpoint_dir is not None else None
    found = latest_classifier_checkpoint(folder) if folder is not None and folder.exists() else None
    state = _start_or_resume(found, seed, meta, model, optimizer, schedule, device)
    state.ratio = compression_ratio(model)
    started = time.perf_counter()
    checkpoint = found[1] if found is not None else None
    model.train()
    for epoch in range(state.epoch, epochs):
        generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        batches = data.train_batches(batch_size, generator, recipe.augment)
        row = _train_epoch(model, batches, optimizer, schedule, state, lr_at, device)
        val_accuracy, test_accuracy = _accuracies(model, data, reward_split, recipe.eval_batch_size, device)
        state.reward = val_accuracy if reward_split == "val" else test_accuracy
        row.update(
            method=method,
            epoch=epoch + 1,
            val_accuracy=val_accuracy,
            test_accuracy=test_accuracy,
            wall_time_s=state.wall_offset + time.perf_counter() - started,
        )
        state.rows.append(row)
        if folder is not None:
            checkpoint = _save_checkpoint(
                folder, epoch + 1, state.checkpoint(meta, model, optimizer, schedule)
            )
    history = pd.DataFrame(state.rows, columns=HISTORY_COLUMNS)
    wall = float(history["wall_time_s"].iloc[-1]) if len(history) else 0.0
    return TrainedClassifier(model, history, wall, found[0] if found is not None else None, checkpoint)


def _steps_per_epoch(
    data: ImageData, epochs: int, batch_size: int, schedule: CompressionSchedule | None
) -> int:
    """Return the optimizer steps of one epoch, after checking that the schedule plans as many in all."""
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    steps_per_epoch = data.steps_per_epoch(batch_size)
    total_steps = epochs * steps_per_epoch
    planned = getattr(getattr(schedule, "config", None), "total_steps", total_steps)
    if planned != total_steps:
        raise ValueError(
            f"the schedule plans {planned} steps but training runs {total_steps} "
            f"({epochs} epochs of {steps_per_epoch} steps at batch {batch_size})"
        )
    return steps_per_epoch


@dataclass
class _TrainingState:
    """What :func:`train_classifier` carries from epoch to epoch, and a checkpoint keeps."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    epoch: int = 0
    """Epochs done."""
    step: int = 0
    """Optimizer steps done."""
    compression_sum: float = 0.0
    """Sum over the steps done of the compression ratio each trained with."""
    wall_offset: float = 0.0
    """Training seconds of earlier attempts."""
    reward: float | None = None
    """The newest accuracy, until the schedule has seen it."""
    ratio: float = 0.0
    """The model's compression ratio now."""

    def checkpoint(
        self, meta: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer, schedule: Any
    ) -> dict[str, Any]:
        """Return what a checkpoint written now holds."""
        return {
            "meta": meta,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "schedule": schedule.state_dict() if schedule is not None else None,
            "history": self.rows,
            "step": self.step,
            "compression_sum": self.compression_sum,
            "wall_time_s": self.rows[-1]["wall_time_s"],
            "reward": self.reward,
            "torch_rng": torch.get_rng_state(),
        }


def _reward_split(data: ImageData, schedule: CompressionSchedule | None) -> str:
    """Return the split whose accuracy the schedule reads: ``"val"``, else ``"test"`` (with a warning)."""
    if data.val_images is not None:
        return "val"
    if schedule is not None:
        log.warning(
            "no validation split: the schedule's reward is the test accuracy (use data.with_validation)"
        )
    return "test"


def _accuracies(
    model: nn.Module, data: ImageData, reward_split: str, batch_size: int, device: torch.device
) -> tuple[float | None, float]:
    """Return ``(validation accuracy or None when the reward is the test accuracy, test accuracy)``."""
    val_accuracy = None
    if reward_split == "val":
        val_accuracy = evaluate_accuracy(model, data, "val", batch_size, device)
    return val_accuracy, evaluate_accuracy(model, data, "test", batch_size, device)


def _start_or_resume(
    found: tuple[int, Path] | None,
    seed: int,
    meta: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: CompressionSchedule | None,
    device: torch.device,
) -> _TrainingState:
    """Return a fresh training state (seeding torch), or checkpoint ``found``'s after loading everything it holds.

    Model, optimizer, schedule and torch's RNG are loaded from the checkpoint.
    """
    if found is None:
        torch.manual_seed(seed)
        return _TrainingState()
    epoch, path = found
    saved = torch.load(path, map_location=device, weights_only=False)
    old = saved["meta"]
    if {key: old[key] for key in meta} != meta:
        raise ValueError(
            f"checkpoint {path} is of a run with {old['epochs']} epochs of {old['steps_per_epoch']} steps "
            f"({old['method']}); this call asks for {meta['epochs']} of {meta['steps_per_epoch']} ({meta['method']})"
        )
    load_compressed_state_dict_(model, saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    _check_optimizer_state(optimizer, path)
    if schedule is not None:
        schedule.load_state_dict(saved["schedule"])
    torch.set_rng_state(saved["torch_rng"])
    log.info("resuming %s from epoch %d (%s)", meta["method"], epoch, path)
    return _TrainingState(
        rows=saved["history"],
        epoch=epoch,
        step=saved["step"],
        compression_sum=saved["compression_sum"],
        wall_offset=saved["wall_time_s"],
        reward=saved["reward"],
    )


def _train_epoch(
    model: nn.Module,
    batches: Iterable[tuple[Tensor, Tensor]],
    optimizer: torch.optim.Optimizer,
    schedule: CompressionSchedule | None,
    state: _TrainingState,
    lr_at: Callable[[int], float],
    device: torch.device,
) -> dict[str, Any]:
    """Return the training columns of one epoch's history row after training on ``batches``."""
    loss_sum, correct, seen = 0.0, 0, 0
    for images, labels in batches:
        scores = () if state.reward is None else (state.reward,)
        if schedule is not None and schedule.apply_(model, state.step, scores, [optimizer]):
            state.ratio = compression_ratio(model)
        state.reward = None  # each new accuracy reaches the schedule once
        for group in optimizer.param_groups:
            group["lr"] = lr_at(state.step)
        images, labels = images.to(device), labels.to(device)
        logits = model(images)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_sum += float(loss.detach()) * len(labels)
        correct += int((logits.argmax(1) == labels).sum())
        seen += len(labels)
        state.compression_sum += state.ratio
        state.step += 1
    return {
        "step": state.step,
        "lr": optimizer.param_groups[0]["lr"],
        "train_loss": loss_sum / seen,
        "train_accuracy": correct / seen,
        "compression_ratio": state.ratio,
        "avg_compression_ratio": state.compression_sum / state.step,
        "target_sparsity": getattr(schedule, "applied_sparsity", 0.0),
        "phase": schedule.phase(state.step - 1) if hasattr(schedule, "phase") else "dense",
    }


def summarize(history: pd.DataFrame, reference: str = "dense") -> pd.DataFrame:
    """Return one row per method: final test accuracy, its drop against ``reference``, final and average compression.

    Accuracies and ratios in percent (the papers' unit); ``wall_time_s`` is the method's training time.
    """
    last = history.sort_values("epoch").groupby("method", sort=False).tail(1).set_index("method")
    table = pd.DataFrame(
        {
            "test_accuracy": 100 * last["test_accuracy"],
            "best_test_accuracy": 100 * history.groupby("method", sort=False)["test_accuracy"].max(),
            "final_compression": 100 * last["compression_ratio"],
            "avg_compression": 100 * last["avg_compression_ratio"],
            "epochs": last["epoch"],
            "wall_time_s": last["wall_time_s"],
        }
    )
    if reference in table.index:
        table.insert(
            1, "accuracy_drop_vs_dense", table.loc[reference, "test_accuracy"] - table["test_accuracy"]
        )
    return table.reset_index()


def paper_comparison(summary: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Return the paper's ResNet-32 CIFAR-10 numbers beside ours, one row per metric.

    ``paper`` holds the rows of ``rlq.experiments.paper.paper_numbers("gst", experiment="cifar10")`` (metric, value).
    The paper does not say whether its 68.2% is the final or the average compression: both of ours are shown.
    """
    value = dict(zip(paper["metric"], paper["value"], strict=True))
    ours = summary.set_index("method")
    rows = [
        ("accuracy (%)", value.get("accuracy"), "test_accuracy"),
        ("accuracy drop vs dense (%p)", value.get("accuracy_drop_vs_dense"), "accuracy_drop_vs_dense"),
        ("compression, final (%)", value.get("compression_ratio"), "final_compression"),
        ("compression, average over training (%)", value.get("compression_ratio"), "avg_compression"),
    ]
    table = []
    for label, paper_value, column in rows:
        entry = {"metric": label, "paper GST": paper_value}
        for method in ours.index:
            entry[f"ours {method}"] = ours.loc[method, column] if column in ours.columns else None
        table.append(entry)
    return pd.DataFrame(table)
