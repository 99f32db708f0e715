"""Image classification data held in memory (:class:`ImageData`), and the training augmentation.

An :class:`ImageData` holds uint8 images of shape ``(N, C, H, W)`` with int64 labels per split, and yields
them shuffled, augmented (:func:`random_shift`) and normalised per batch when training.
:mod:`rlq.vision.sources` makes one from CIFAR-10 files, sklearn's offline digits or ImageNet folders.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

AUGMENTATIONS = ("none", "crop", "crop_flip")


@dataclass
class ImageData:
    """A classification data set in memory: uint8 images ``(N, C, H, W)`` and int64 labels per split.

    ``val_*`` is a validation split carved out of the training images (:meth:`with_validation`); GST's
    reward-aware controller reads its accuracy, so the test images never steer training.
    """

    train_images: Tensor
    train_labels: Tensor
    test_images: Tensor
    test_labels: Tensor
    classes: tuple[str, ...]
    name: str
    """Short name of the data set, e.g. ``"cifar10"`` or ``"digits"``."""
    source: str
    """Where the images came from, in words (a path, or "sklearn's load_digits, offline")."""
    augment: str = "crop_flip"
    """Default training augmentation: ``"none"``, ``"crop"`` (random shifts) or ``"crop_flip"``."""
    val_images: Tensor | None = None
    val_labels: Tensor | None = None
    mean: tuple[float, ...] | None = None
    """Per-channel mean of the training images on a 0-1 scale (computed when None)."""
    std: tuple[float, ...] | None = None
    """Per-channel standard deviation of the training images on a 0-1 scale (computed when None)."""

    def __post_init__(self) -> None:
        for split in ("train", "test", "val"):
            images, labels = getattr(self, f"{split}_images"), getattr(self, f"{split}_labels")
            if images is None and labels is None and split == "val":
                continue
            if images.dtype != torch.uint8 or images.dim() != 4:
                raise ValueError(
                    f"{split}_images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}"
                )
            if labels.dtype != torch.int64 or labels.shape != (images.shape[0],):
                raise ValueError(
                    f"{split}_labels must be int64 of shape ({images.shape[0]},), got {labels.dtype} {tuple(labels.shape)}"
                )
        if self.augment not in AUGMENTATIONS:
            raise ValueError(f"augment must be one of {AUGMENTATIONS}, got {self.augment!r}")
        if self.mean is None or self.std is None:
            self.mean, self.std = channel_statistics(self.train_images)

    @property
    def num_classes(self) -> int:
        """Return the number of classes."""
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """Return ``(C, H, W)`` of one image."""
        return tuple(self.train_images.shape[1:])

    def __repr__(self) -> str:
        val = 0 if self.val_images is None else len(self.val_images)
        return (
            f"ImageData({self.name}: {len(self.train_images)} train, {val} validation, {len(self.test_images)} "
            f"test images of {self.image_shape}, {self.num_classes} classes; {self.source})"
        )

    def subset(self, max_train: int = 0, max_test: int = 0, seed: int = 0) -> ImageData:
        """Return a copy with at most ``max_train`` training and ``max_test`` test images (0: all), drawn at random."""
        generator = torch.Generator().manual_seed(seed)

        def pick(images: Tensor, labels: Tensor, limit: int) -> tuple[Tensor, Tensor]:
            if limit <= 0 or limit >= len(images):
                return images, labels
            index = torch.randperm(len(images), generator=generator)[:limit].sort().values
            return images[index], labels[index]

        train = pick(self.train_images, self.train_labels, max_train)
        test = pick(self.test_images, self.test_labels, max_test)
        return replace(
            self,
            train_images=train[0],
            train_labels=train[1],
            test_images=test[0],
            test_labels=test[1],
            mean=None,
            std=None,
        )

    def with_validation(self, size: int | float, seed: int = 0) -> ImageData:
        """Return a copy whose validation split is ``size`` training images (a fraction if below 1), taken at random.

        The validation images leave the training set. Normalisation statistics are recomputed from what remains.
        """
        if self.val_images is not None:
            raise ValueError("this data already has a validation split")
        n = len(self.train_images)
        count = int(round(size * n)) if isinstance(size, float) and size < 1 else int(size)
        if not 0 < count < n:
            raise ValueError(f"validation size must leave images on both sides, got {size!r} of {n}")
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        val, train = order[:count].sort().values, order[count:].sort().values
        return replace(
            self,
            train_images=self.train_images[train],
            train_labels=self.train_labels[train],
            val_images=self.train_images[val],
            val_labels=self.train_labels[val],
            mean=None,
            std=None,
        )

    def normalize(self, images: Tensor) -> Tensor:
        """Return uint8 images as float32, scaled to 0-1 and standardised with the training statistics."""
        mean = torch.tensor(self.mean, device=images.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, device=images.device).view(1, -1, 1, 1)
        return (images.float() / 255.0 - mean) / std

    def steps_per_epoch(self, batch_size: int) -> int:
        """Return the optimizer steps of one epoch (the last incomplete batch is dropped)."""
        return max(1, len(self.train_images) // batch_size)

    def train_batches(
        self, batch_size: int, generator: torch.Generator, augment: str | None = None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """Yield one epoch of shuffled, augmented, normalised ``(images, labels)`` batches.

        The last incomplete batch is dropped (batch norm needs more than one image, and every step then has
        the same size). ``augment`` defaults to the data's own (``self.augment``).
        """
        augment = self.augment if augment is None else augment
        if augment not in AUGMENTATIONS:
            raise ValueError(f"augment must be one of {AUGMENTATIONS}, got {augment!r}")
        n = len(self.train_images)
        order = torch.randperm(n, generator=generator)
        steps = self.steps_per_epoch(batch_size)
        size = min(batch_size, n)
        for step in range(steps):
            index = order[step * size : (step + 1) * size]
            images = self.train_images[index]
            if augment != "none":
                images = random_shift(images, generator, flip=augment == "crop_flip")
            yield self.normalize(images), self.train_labels[index]

    def eval_batches(self, split: str = "test", batch_size: int = 500) -> Iterator[tuple[Tensor, Tensor]]:
        """Yield normalised ``(images, labels)`` batches of ``split`` (``"test"`` or ``"val"``) in order."""
        if split not in ("test", "val"):
            raise ValueError(f"split must be 'test' or 'val', got {split!r}")
        images, labels = getattr(self, f"{split}_images"), getattr(self, f"{split}_labels")
        if images is None:
            raise ValueError(f"this data has no {split} split (make one with with_validation)")
        for start in range(0, len(images), batch_size):
            yield self.normalize(images[start : start + batch_size]), labels[start : start + batch_size]


def channel_statistics(images: Tensor, chunk: int = 4096) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Return per-channel mean and standard deviation of uint8 images on a 0-1 scale (in chunks, in float64)."""
    channels = images.shape[1]
    total = torch.zeros(channels, dtype=torch.float64)
    squares = torch.zeros(channels, dtype=torch.float64)
    for start in range(0, len(images), chunk):
        x = images[start : start + chunk].to(torch.float64) / 255.0
        total += x.sum(dim=(0, 2, 3))
        squares += (x * x).sum(dim=(0, 2, 3))
    count = images.shape[0] * images.shape[2] * images.shape[3]
    mean = total / count
    std = (squares / count - mean * mean).clamp_min(1e-12).sqrt()
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def random_shift(
    images: Tensor, generator: torch.Generator, flip: bool = False, padding: int | None = None
) -> Tensor:
    """Return uint8 images randomly shifted (zero-padded by ``padding``, then cropped back) and optionally flipped.

    He et al. 2016's CIFAR augmentation: pad 4 pixels, take a random 32x32 crop, flip half the images
    horizontally. ``padding`` defaults to an eighth of the image size (4 for 32x32, 1 for 8x8).
    """
    n, _, height, width = images.shape
    pad = max(1, height // 8) if padding is None else padding
    padded = F.pad(images, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    rows = (dy[:, None] + torch.arange(height))[:, :, None]  # (N, H, 1)
    cols = (dx[:, None] + torch.arange(width))[:, None, :]  # (N, 1, W)
    if flip:
        mirrored = torch.rand(n, generator=generator) < 0.5
        cols = torch.where(mirrored[:, None, None], cols.flip(-1), cols)
    # advanced indices around a slice put their dimensions first: (N, H, W, C)
    out = padded[torch.arange(n)[:, None, None], :, rows, cols]
    return out.permute(0, 3, 1, 2).contiguous()
