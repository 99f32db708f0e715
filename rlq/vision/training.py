"""Training an image classifier under a compression schedule (GST or gradual pruning), with checkpoints and resume.

:func:`train_classifier` is a plain SGD loop (He et al. 2016's CIFAR recipe by default) that calls a
schedule's ``apply_(model, step, reward, optimizers)`` before every optimizer step, the same interface as
:class:`rlq.compress.GSTSchedule`. The reward GST's reward-aware controller sees is the validation accuracy
measured at the end of each epoch (higher is better), so compression rises while accuracy holds. The
baseline :class:`rlq.compress.GradualPruning` is Zhu & Gupta's cubic schedule behind the same interface.

One row of history per epoch; the average compression ratio is exact, the mean over every optimizer
step of the ratio the step trained with (GST's "average compression ratio").
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from rlq.compress import (
    GradualPruning,
    GradualPruningConfig,
    GSTAction,
    GSTConfig,
    GSTSchedule,
    RewardAwareConfig,
    compression_ratio,
    load_compressed_state_dict_,
)
from rlq.vision.datasets import ImageData

log = logging.getLogger(__name__)

LR_SCHEDULES = ("step", "cosine", "constant")
METHODS = ("dense", "gradual", "gst")
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


class CompressionSchedule(Protocol):
    """What :func:`train_classifier` needs of a schedule (:class:`GSTSchedule` and :class:`GradualPruning` fit)."""

    def apply_(
        self, module: nn.Module, step: int, reward: float | None = None, optimizers: Any = ()
    ) -> list[GSTAction]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def make_schedule(
    method: str,
    total_steps: int,
    steps_per_epoch: int,
    *,
    block_size: int = 4,
    late_block_size: int = 0,
    transition_at: float = 0.25,
    bc_end: float = 0.5,
    s_shift: float = 1.0,
    max_sparsity: float = 0.8,
    step_size: float = 0.05,
    tolerance: float = 0.01,
    window: int = 2,
    final_sparsity: float = 0.8,
    prune_start: float = 0.2,
    prune_end: float = 0.8,
) -> CompressionSchedule | None:
    """Return the schedule of ``method`` for a classifier trained ``total_steps`` steps (None for ``"dense"``).

    ``"gst"``: block-circulant with ``block_size`` from step 0 (optionally re-projected to
    ``late_block_size`` at ``transition_at``; the exact, permutation-based transition does not apply to
    residual networks, whose channels are tied by the shortcuts), handed over to pruning at ``bc_end``,
    with S_shift = ``s_shift``; the reward-aware target (validation accuracy, read once per epoch) rises by
    ``step_size`` while the windowed accuracy stays within ``tolerance`` (absolute, 0.01 = 1 %p) of its best,
    up to ``max_sparsity``. ``"gradual"``: Zhu & Gupta from ``prune_start`` to ``prune_end`` to
    ``final_sparsity``, updated once per epoch. Both keep the first and last layer dense (``networks="whole"``).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "dense":
        return None
    if method == "gradual":
        return GradualPruning(
            GradualPruningConfig(
                total_steps=total_steps,
                final_sparsity=final_sparsity,
                start_fraction=prune_start,
                end_fraction=prune_end,
                prune_every=steps_per_epoch,
            )
        )
    blocks: tuple[tuple[float, int], ...] = ((0.0, block_size),)
    if late_block_size and late_block_size != block_size:
        blocks += ((transition_at, late_block_size),)
    sparsity = RewardAwareConfig(
        max_sparsity=max_sparsity,
        step_size=step_size,
        backoff=step_size,
        window=window,
        tolerance=0.0,
        abs_tolerance=tolerance,
        cooldown=1,
    )
    config = GSTConfig(
        total_steps=total_steps,
        block_schedule=blocks,
        transition_method="projection",
        bc_end=bc_end,
        s_shift=s_shift,
        prune_every=steps_per_epoch,
        sparsity=sparsity,
        networks="whole",
    )
    return GSTSchedule(config)


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
    lr: float = 0.1,
    momentum: float = 0.9,
    weight_decay: float = 1e-4,
    batch_size: int = 128,
    lr_schedule: str = "step",
    schedule: CompressionSchedule | None = None,
    augment: str | None = None,
    seed: int = 0,
    method: str = "dense",
    checkpoint_dir: str | Path | None = None,
    device: str | torch.device = "cpu",
    eval_batch_size: int = 500,
    progress: bool = False,
) -> TrainedClassifier:
    """Return ``model`` trained ``epochs`` epochs by SGD under ``schedule``, resuming from ``checkpoint_dir``.

    Defaults are He et al. 2016's CIFAR recipe (lr 0.1 divided by 10 at 50% and 75%, momentum 0.9, weight
    decay 1e-4, batch 128). ``schedule`` (None: dense; :class:`GradualPruning`; :class:`GSTSchedule`) is
    applied before every optimizer step, with the validation accuracy of the last epoch as its reward
    (the test accuracy when ``data`` has no validation split, with a warning); its ``total_steps`` must be
    ``epochs * data.steps_per_epoch(batch_size)``. ``method`` labels the history rows.

    With ``checkpoint_dir`` a checkpoint (model, optimizer, schedule, history, RNG) is written after every
    epoch (the newest two are kept) and a later call resumes from the newest one. Give a freshly built
    dense model each time: the compression structure is re-applied from the checkpoint, and the optimizer,
    built before any compression, must see the parameters in the dense model's order. Batch order and
    augmentation depend only on ``seed`` and the epoch, so a resumed run repeats an uninterrupted one.
    """
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
    learning_rate(0, total_steps, lr, lr_schedule)  # validates the schedule's name
    reward_split = "val" if data.val_images is not None else "test"
    if schedule is not None and reward_split == "test":
        log.warning(
            "no validation split: the schedule's reward is the test accuracy (use data.with_validation)"
        )
    device = torch.device(device)
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)

    folder = Path(checkpoint_dir) if checkpoint_dir is not None else None
    found = latest_classifier_checkpoint(folder) if folder is not None and folder.exists() else None
    rows: list[dict[str, Any]] = []
    start_epoch, step, compression_sum, wall_offset, reward = 0, 0, 0.0, 0.0, None
    if found is None:
        torch.manual_seed(seed)
    else:
        epoch_found, path = found
        state = torch.load(path, map_location=device, weights_only=False)
        meta = state["meta"]
        if (meta["epochs"], meta["steps_per_epoch"], meta["method"]) != (epochs, steps_per_epoch, method):
            raise ValueError(
                f"checkpoint {path} is of a run with {meta['epochs']} epochs of {meta['steps_per_epoch']} steps "
                f"({meta['method']}); this call asks for {epochs} of {steps_per_epoch} ({method})"
            )
        load_compressed_state_dict_(model, state["model"])
        optimizer.load_state_dict(state["optimizer"])
        _check_optimizer_state(optimizer, path)
        if schedule is not None:
            schedule.load_state_dict(state["schedule"])
        rows = state["history"]
        start_epoch, step = epoch_found, state["step"]
        compression_sum, wall_offset, reward = state["compression_sum"], state["wall_time_s"], state["reward"]
        torch.set_rng_state(state["torch_rng"])
        log.info("resuming %s from epoch %d (%s)", method, epoch_found, path)

    ratio = compression_ratio(model)
    started = time.perf_counter()
    epoch_range = range(start_epoch, epochs)
    if progress:
        from tqdm.auto import tqdm

        epoch_range = tqdm(epoch_range, desc=method, initial=start_epoch, total=epochs)
    checkpoint = found[1] if found is not None else None
    model.train()
    for epoch in epoch_range:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        loss_sum, correct, seen = 0.0, 0, 0
        for images, labels in data.train_batches(batch_size, generator, augment):
            if schedule is not None and schedule.apply_(model, step, reward, [optimizer]):
                ratio = compression_ratio(model)
            reward = None  # each new accuracy reaches the schedule once
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, total_steps, lr, lr_schedule)
            images, labels = images.to(device), labels.to(device)
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += float(loss.detach()) * len(labels)
            correct += int((logits.argmax(1) == labels).sum())
            seen += len(labels)
            compression_sum += ratio
            step += 1
        val_accuracy = (
            evaluate_accuracy(model, data, "val", eval_batch_size, device) if reward_split == "val" else None
        )
        test_accuracy = evaluate_accuracy(model, data, "test", eval_batch_size, device)
        reward = val_accuracy if reward_split == "val" else test_accuracy
        rows.append(
            {
                "method": method,
                "epoch": epoch + 1,
                "step": step,
                "lr": optimizer.param_groups[0]["lr"],
                "train_loss": loss_sum / seen,
                "train_accuracy": correct / seen,
                "val_accuracy": val_accuracy,
                "test_accuracy": test_accuracy,
                "compression_ratio": ratio,
                "avg_compression_ratio": compression_sum / step,
                "target_sparsity": getattr(schedule, "applied_sparsity", 0.0),
                "phase": schedule.phase(step - 1) if hasattr(schedule, "phase") else "dense",
                "wall_time_s": wall_offset + time.perf_counter() - started,
            }
        )
        if folder is not None:
            checkpoint = _save_checkpoint(
                folder,
                epoch + 1,
                {
                    "meta": {"epochs": epochs, "steps_per_epoch": steps_per_epoch, "method": method},
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "schedule": schedule.state_dict() if schedule is not None else None,
                    "history": rows,
                    "step": step,
                    "compression_sum": compression_sum,
                    "wall_time_s": rows[-1]["wall_time_s"],
                    "reward": reward,
                    "torch_rng": torch.get_rng_state(),
                },
            )
    history = pd.DataFrame(rows, columns=HISTORY_COLUMNS)
    wall = float(history["wall_time_s"].iloc[-1]) if len(history) else 0.0
    return TrainedClassifier(model, history, wall, found[0] if found is not None else None, checkpoint)


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
